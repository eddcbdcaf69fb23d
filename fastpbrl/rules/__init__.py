"""Population rules: the contract (``base``), the registry, and one module
per rule (host-side; the array work inside a rule may be jitted).

* ``base``: ``Rule``, ``Observation``, ``Decision``, ``Population``: what a
  rule is and may do (read it first);
* ``registry``: ``register`` (a class decorator), ``get(ref)``;
* ``seeds``, ``pbt``, ``cemrl``, ``dvd``, ``hypertrick``: the built-in
  rules, each all in its module (settings, presets, bookkeeping, decisions),
  the pure array functions it calls in ``fastpbrl.population``;
* ``common``: what several rules share (search spaces, config checks).

The rules sit below the run loop: they import the settings
(``fastpbrl.config``), the learner and the pure rules, never
``fastpbrl.run`` or ``fastpbrl.loop``, which import them. A rule of your
own is one file: ``examples/halving.py``.
"""

from fastpbrl.rules.base import (Decision, Observation, Population, Rule,
                                 RuleState, hparam_rows, mask, split_key)
from fastpbrl.rules.registry import get, known, register

__all__ = ['Decision', 'Observation', 'Population', 'Rule', 'RuleState',
           'get', 'hparam_rows', 'known', 'mask', 'register', 'split_key']
