"""Population Based Training (Jaderberg et al. 2017): the rule and its pure
math, one job per module.

* ``rule``: ``PBTRunConfig`` (the flags), ``PRESETS``, ``PBT`` (readiness,
  fitness, the decision) and ``Schedule`` (``--rerun-lineage``);
  host-side;
* ``exploit``: exploit-and-explore over the stacked state, pure and
  jittable (the paper, its equations and every departure are in its
  docstring);
* ``pb2``: PB2's explore, a time-varying GP bandit (numpy and scipy);
* ``lineage``: the ``lineage.jsonl`` events and their readers
  (``read_lineage``, ``schedule``, ``founders``); host-side.

The names below are imported from their module on first use (PEP 562), so
that reading a lineage file does not import the rule.
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'PBTRunConfig': 'rule', 'PRESETS': 'rule', 'PBTState': 'rule',
          'PBT': 'rule', 'Schedule': 'rule', 'ScheduleState': 'rule',
          'PBTConfig': 'exploit', 'PBTResult': 'exploit',
          'CompiledExploitExplore': 'exploit', 'exploit_explore': 'exploit',
          'copy_and_explore': 'exploit', 'replace_diverged': 'exploit',
          'diverged_parents': 'exploit', 'select_parents': 'exploit',
          'copy_members': 'exploit', 'ready_mask': 'exploit',
          'num_truncated': 'exploit', 'welch_p_value': 'exploit',
          'LINEAGE': 'lineage', 'init_events': 'lineage',
          'exploit_events': 'lineage', 'read_lineage': 'lineage',
          'founders': 'lineage', 'schedule': 'lineage'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
