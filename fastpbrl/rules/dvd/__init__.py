"""DvD-TD3 (Parker-Holder et al. 2020): the rule and its math.

* ``rule``: ``DvDRunConfig`` (the flags), ``PRESETS``, ``DvD`` (the probe
  states, lambda's schedule or bandit per round); host-side;
* ``diversity``: the diversity loss and its plug-in for the shared-critic
  learner (jittable);
* ``bandit``: lambda's Thompson bandit and schedule (host-side, numpy).

The rule's names are imported on first use (PEP 562).
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'DvDRunConfig': 'rule', 'PRESETS': 'rule', 'DvDState': 'rule',
          'DvD': 'rule'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
