"""DvD-TD3 (Parker-Holder et al. 2020): the rule and its math.

* ``rule``: ``DvDRunConfig`` (the flags), ``PRESETS``, ``DvD`` (the probe
  states, lambda's schedule or bandit per round); host-side;
* ``diversity``: the diversity loss and its plug-in for the shared-critic
  learner (jittable), and the host-side lambda schedule and bandit.

The rule's names are imported on first use (PEP 562).
"""

import importlib

# name -> the module of this package that defines it.
_NAMES = {'DvDRunConfig': 'rule', 'PRESETS': 'rule', 'DvDState': 'rule',
          'DvD': 'rule'}

__all__ = sorted(_NAMES)


def __getattr__(name):
  if name in _NAMES:
    return getattr(importlib.import_module(f'{__name__}.{_NAMES[name]}'),
                   name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
