"""The rule registry: ``register`` adds a rule, from the package or from
user code (host-side; imports modules, nothing here is jittable).

``@register`` on a ``fastpbrl.rules.base.Rule`` subclass records it under
its ``name``; ``get(ref)`` finds one, where a *ref* is what the command
line takes (``fastpbrl <ref> [flags]``) and ``fastpbrl.train(ref, ...)``:

* a registered name: ``pbt``, ``cemrl``, ``dvd``, ``hypertrick``, ``seeds``,
  ``random`` (their modules are imported on first use), or any name registered
  earlier in this process;
* ``module:attribute``, e.g. ``examples.halving:Halving``: the module is
  imported (it must be on ``sys.path``), and the attribute is the rule
  class (or the name it registered); ``path/to/halving.py:Halving``
  imports the file by putting its folder on ``sys.path``.

A run saves the ref it was started with (``config.json``), so that its
resume, ``fastpbrl.load_policy`` and the readers of its folder
(``run_outputs``) find the rule again.
"""

from __future__ import annotations

import importlib
import logging
from typing import Mapping

from fastpbrl.core.imports import find, known_names
from fastpbrl.rules.base import Rule, RuleOutputs
from fastpbrl.rules.builtin import BUILTIN

_REGISTRY: dict[str, type] = {}


def register(rule_cls: type) -> type:
  """Registers ``rule_cls`` (a ``Rule`` subclass) under its ``name``;
  returns it, so it works as a class decorator.

  Call it at a module's top level: a resumed run, ``load_policy`` and
  spawned processes import the module again and must find the rule.

  Raises:
    ValueError: not a ``Rule`` subclass, a bad name, no config class, or
      the name already registered by another class.
  """
  if not isinstance(rule_cls, type) or not issubclass(rule_cls, Rule):
    raise ValueError(f'register takes a subclass of fastpbrl.rules.Rule, '
                     f'got {rule_cls!r}')
  name = rule_cls.name
  if not name or ':' in name or name != name.strip() or ' ' in name:
    raise ValueError(f'rule {rule_cls.__qualname__}: name must be non-empty, '
                     f'without ":" or spaces, got {name!r}')
  if name in _COMMANDS_TAKEN:
    raise ValueError(f'rule name {name!r} is a fastpbrl command; choose '
                     'another')
  config_class = rule_cls.config_class
  try:
    default = config_class()
  except TypeError as e:
    raise ValueError(f'rule {name!r}: config_class {config_class!r} must be '
                     f'a dataclass whose fields all have defaults ({e})'
                     ) from None
  if not rule_cls.presets:
    rule_cls.presets = {'small': default}
  old = _REGISTRY.get(name)
  # The same class registering again (a reload, or one file imported under
  # two module names) replaces its own entry.
  if old is not None and _identity(old) != _identity(rule_cls):
    raise ValueError(f'rule {name!r} is already registered by '
                     f'{old.__module__}.{old.__qualname__}; choose another '
                     'name')
  _REGISTRY[name] = rule_cls
  return rule_cls


# Commands of ``fastpbrl`` that are not rules.
_COMMANDS_TAKEN = ('evaluate', 'bench')


def _identity(rule_cls: type) -> tuple[str, str]:
  module = importlib.import_module(rule_cls.__module__)
  return getattr(module, '__file__', '') or '', rule_cls.__qualname__


def known() -> tuple[str, ...]:
  """Names accepted without a module: built-ins, then the others
  registered in this process."""
  return known_names(_REGISTRY, BUILTIN)


def get(ref: str) -> type:
  """The rule class ``ref`` names (see the module docstring), importing
  what it needs.

  Raises:
    ValueError: one line saying why ``ref`` names no rule.
  """
  rule_cls, found = find(ref, _REGISTRY, BUILTIN, 'a rule',
                         'fastpbrl.rules.register')
  if rule_cls is not None:
    return rule_cls
  module, attr = found
  value = getattr(module, attr, None)
  if isinstance(value, type) and issubclass(value, Rule):
    if _REGISTRY.get(value.name) is not value:
      raise ValueError(f'{ref!r}: {attr} is a Rule but not registered; '
                       'decorate it with @fastpbrl.rules.register')
    return value
  if value is None and attr in _REGISTRY:
    return _REGISTRY[attr]
  raise ValueError(f'{ref!r}: module {module.__name__} has no Rule class '
                   f'{attr!r} and registers no rule of that name')


def ref_of(rule_cls: type) -> str:
  """The ref that finds ``rule_cls`` again in a new process: its name for
  a built-in, else ``module:Class``."""
  if rule_cls.command:  # built by another rule's command (PBT's re-run)
    return rule_cls.command
  if rule_cls.name in BUILTIN or rule_cls.__module__ == '__main__':
    return rule_cls.name  # a script's rule: found by name once it runs
  return f'{rule_cls.__module__}:{rule_cls.__qualname__}'


def builtins() -> list[type]:
  """Every built-in rule class (imports their modules)."""
  return [get(name) for name in BUILTIN]


def run_outputs(config: Mapping) -> RuleOutputs:
  """What the rule of a run folder declares it left there
  (``Rule.outputs``), from the folder's saved settings (``config.json``;
  its ``rule`` key holds the ref). ``RuleOutputs()`` where the settings
  name no rule, or one this process cannot import (a user rule's module
  not on ``sys.path``: a warning says so)."""
  ref = config.get('rule')
  if not ref:
    return RuleOutputs()
  try:
    return get(ref).outputs()
  except (ValueError, ImportError) as e:
    logging.getLogger('fastpbrl').warning(
        'rule %r of the run folder not found (%s): reading it without the '
        "rule's own outputs", ref, e)
    return RuleOutputs()
