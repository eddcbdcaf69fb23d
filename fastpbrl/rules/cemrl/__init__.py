"""CEM-RL (Pourchot & Sigaud 2019): the rule and its pure math.

* ``rule``: ``CEMRLRunConfig`` (the flags), ``PRESETS``, ``CEMRL`` (the
  generations, the evaluations, the mean policy's log); host-side;
* ``cem``: the diagonal cross-entropy method and the shared-critic update
  restricted to the RL half, pure and jittable.

The rule's names are imported on first use (PEP 562).
"""

from fastpbrl.core.imports import lazy_names

# name -> the module of this package that defines it.
_NAMES = {'CEMRLRunConfig': 'rule', 'PRESETS': 'rule', 'CEMRLState': 'rule',
          'CEMRL': 'rule', 'MEAN_POLICY': 'rule'}

__all__ = sorted(_NAMES)

__getattr__ = lazy_names(__name__, _NAMES)
