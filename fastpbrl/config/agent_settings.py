"""The agent a run names and its static config, as the settings make it.

``agent_spec`` finds the registered agent ``--agent`` names;
``agent_config`` builds its static config from ``--agent-settings
NAME=VALUE ...`` (each parsed to its field's type) and the size flags
(``--batch-size``, ``--steps-per-call``, ``--hidden-sizes``,
``--network-init``). Host-side; not jittable.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Optional

from fastpbrl import agents as agents_lib
from fastpbrl.config.errors import ConfigError, check
from fastpbrl.config.fields import RunConfig


def agent_spec(agent: str):
  """The registered agent ``--agent`` names (``fastpbrl.agents.registry``)."""
  try:
    return agents_lib.get(agent)
  except ValueError as e:
    message = str(e)
    if not message.startswith(repr(agent)):
      message = f'{agent!r}: {message}'
    raise ConfigError(f'--agent {message}') from None


def agent_config(config: RunConfig):
  """The agent's static config (a dataclass) as the run's settings make it:
  ``--batch-size``, ``--steps-per-call``, ``--hidden-sizes`` and
  ``--network-init`` where given, then ``--agent-settings``, the other
  fields at their declared defaults: a rollout agent's config (PPO's)
  declares ``steps_per_call=None`` and derives ``T x E`` from the
  ``rollout_length`` and ``num_envs`` it gets.

  Raises:
    ConfigError: one line naming the flag (an unknown or badly typed
      setting, one set twice, a value the agent's config refuses).
  """
  return _agent_config(config.agent, tuple(config.agent_settings),
                       config.batch_size, config.steps_per_call,
                       None if config.hidden_sizes is None
                       else tuple(config.hidden_sizes), config.network_init)


def _agent_config(agent: str, settings: tuple, batch_size, steps_per_call,
                  hidden_sizes, network_init: str):
  spec = agent_spec(agent)
  given = parse_agent_settings(settings, agent)
  fields = {f.name for f in dataclasses.fields(spec.config)}
  overrides = {}
  for flag, name, value in (
      ('--batch-size', 'batch_size', batch_size),
      ('--steps-per-call', 'steps_per_call', steps_per_call),
      ('--hidden-sizes', spec.hidden_sizes_field, hidden_sizes)):
    if name is None or value is None:
      continue
    check(name not in given,
          f'{flag} and --agent-settings {name}=... both set {name}; give one')
    overrides[name] = value
  if 'network_init' in fields:
    overrides['network_init'] = network_init
  else:
    check(network_init == 'haiku',
          f'--network-init {network_init}: --agent {agent} has no '
          'network_init setting (TD3 and SAC have)')
  # Built from the class, not replaced in an instance: a field left out
  # keeps its declared default, so a rollout agent's steps_per_call=None
  # stays None for its config to derive T x E from the settings given.
  overrides.update(given)
  where = (f'--agent {agent}' + (f' --agent-settings {" ".join(settings)}'
                                 if settings else ''))
  try:
    made = spec.config(**overrides)
  except (TypeError, ValueError) as e:
    raise ConfigError(f'{where}: {e}') from None
  check(isinstance(made.steps_per_call, int) and made.steps_per_call >= 1,
        f'{where}: its config has steps_per_call {made.steps_per_call!r}; '
        'a rollout agent\'s config derives it (T x E) in __post_init__')
  return made


def steps_per_call_of(config: RunConfig) -> int:
  """Update steps per learner call: ``--steps-per-call``, or the agent's
  (with ``--agent-settings``; a rollout agent's ``T x E`` by default)."""
  return config.steps_per_call or agent_config(config).steps_per_call


def parse_agent_settings(items, agent: str) -> dict[str, Any]:
  """``--agent-settings NAME=VALUE ...`` as ``{field: value}`` of the agent's
  config, each value parsed to its field's type (``parse_setting``).

  Raises:
    ConfigError: one line: a malformed item, a name set twice, a name that
      is not a field (with the nearest ones), a value of the wrong type.
  """
  config_class = agent_spec(agent).config
  names = [f.name for f in dataclasses.fields(config_class)]
  try:
    hints = typing.get_type_hints(config_class)
  except Exception:  # noqa: BLE001 (a user's annotation we cannot resolve)
    hints = {}
  defaults = {f.name: f.default for f in dataclasses.fields(config_class)}
  values = {}
  for item in items:
    name, sep, text = str(item).partition('=')
    name = name.strip()
    check(sep == '=' and name != '',
          f'--agent-settings {item!r}: expected NAME=VALUE, e.g. num_envs=8')
    if name not in names:
      near = difflib.get_close_matches(name, names, n=2)
      raise ConfigError(
          f'--agent-settings {item}: --agent {agent} has no setting '
          f'{name!r}; ' + (f'did you mean {" or ".join(near)}? '
                           if near else '') + f'its settings: '
          f'{", ".join(names)}')
    check(name not in values, f'--agent-settings sets {name} twice')
    try:
      values[name] = parse_setting(text.strip(), hints.get(name),
                                   defaults[name])
    except ValueError as e:
      raise ConfigError(f'--agent-settings {item}: {e}') from None
  return values


def parse_setting(text: str, kind: Any, default: Any = None) -> Any:
  """``text`` as a value of the type ``kind`` (a config field's annotation;
  when unknown, the type of ``default``): ``None`` for an ``Optional``,
  ``int``, ``float``, ``bool`` (true/false), ``str``, a ``Literal``'s
  choice, or a sequence of those as ``64,64`` (a tuple).

  Raises:
    ValueError: why ``text`` is not one.
  """
  if typing.get_origin(kind) in (typing.Union, types.UnionType):
    if text == 'None':
      return None
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    kind = inner[0] if len(inner) == 1 else None
  if (kind is None and default is not None
      and default is not dataclasses.MISSING):
    kind = (tuple[type(default[0]), ...] if isinstance(default, (tuple, list))
            and default else type(default))
  origin = typing.get_origin(kind)
  if origin in (tuple, list, collections.abc.Sequence) or kind in (tuple,
                                                                   list):
    args = [a for a in typing.get_args(kind) if a is not Ellipsis]
    parts = [p.strip() for p in text.strip('()[]').split(',') if p.strip()]
    if not parts:
      raise ValueError(f'{text!r} is not a comma-separated list')
    return tuple(parse_setting(p, args[0] if args else int) for p in parts)
  if origin is typing.Literal:
    allowed = typing.get_args(kind)
    for choice in allowed:
      if str(choice) == text:
        return choice
    raise ValueError(f'{text!r} is not one of '
                     f'{", ".join(str(a) for a in allowed)}')
  if kind is bool:
    if text.lower() in ('true', '1', 'yes'):
      return True
    if text.lower() in ('false', '0', 'no'):
      return False
    raise ValueError(f'{text!r} is not true or false')
  if kind is int:
    try:
      return int(text)
    except ValueError:
      raise ValueError(f'{text!r} is not an integer') from None
  if kind is float:
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    if not math.isfinite(value):
      raise ValueError(f'{text!r} is not a finite number')
    return value
  if kind is str:
    return text
  try:  # a type of a user's config: a Python literal, else the text
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def hidden_sizes_of(config: RunConfig) -> Optional[tuple[int, ...]]:
  """The MLP widths the run's agent gets: ``--hidden-sizes`` or
  ``--agent-settings`` where given, else the agent's own default
  (``config.hidden_sizes`` as given for an agent without such a field)."""
  field = agent_spec(config.agent).hidden_sizes_field
  if field is None:
    return config.hidden_sizes
  return tuple(getattr(agent_config(config), field))
