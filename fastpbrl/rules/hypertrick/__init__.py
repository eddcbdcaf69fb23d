"""HyperTrick (Heinrich & Frosio): the rule and its scheduler.

* ``rule``: ``HyperTrickRunConfig`` (the flags), ``PRESETS``,
  ``HyperTrick`` (reports, evictions, restarts); host-side;
* ``scheduler``: the asynchronous early-stopping scheduler (host-side,
  numpy) and the pure slot reset.

The rule's names are imported on first use (PEP 562).
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'HyperTrickRunConfig': 'rule', 'PRESETS': 'rule',
          'HyperTrickState': 'rule', 'HyperTrick': 'rule',
          'RETURNS_WINDOW': 'rule'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
