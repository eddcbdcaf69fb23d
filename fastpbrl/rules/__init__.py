"""Population rules: the contract (``base``), the registry, and one module
per rule (host-side; the array work inside a rule may be jitted).

* ``base``: ``Rule``, ``RuleOutputs``, ``Observation``, ``Decision``,
  ``Population``: what a rule is and may do (read it first);
* ``registry``: ``register`` (a class decorator), ``get(ref)``;
* ``pbt/``, ``cemrl/``, ``dvd/``, ``hypertrick/``: the built-in rules, one
  folder each: the rule (``rule.py``: settings, presets, bookkeeping,
  decisions) beside the pure math it calls (``pbt/exploit.py``,
  ``pbt/pb2.py``, ``cemrl/cem.py``, ``dvd/diversity.py``, ``dvd/bandit.py``,
  ``hypertrick/scheduler.py``); ``seeds`` and ``random_search`` (``random``),
  rules without math of their own, are one module each;
* ``common``: what several rules share (search spaces, config checks).

The rules sit below the run loop: they import the settings
(``fastpbrl.config``), the learner and the pure rules, never
``fastpbrl.run.main`` or ``fastpbrl.run.loop``, which import them. A rule of your
own is one file: ``examples/halving.py``.

Its names are imported on first use (PEP 562): importing
``fastpbrl.rules.builtin``, the built-in rules' names and help lines that
``fastpbrl --help`` lists, then does not import JAX through ``base``.
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'Decision': 'base', 'Observation': 'base', 'Population': 'base',
          'Rule': 'base', 'RuleOutputs': 'base', 'RuleState': 'base',
          'hparam_rows': 'base',
          'mask': 'base', 'split_key': 'base', 'get': 'registry',
          'known': 'registry', 'register': 'registry'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
