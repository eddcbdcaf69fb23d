"""The checks a run's settings pass before any process starts.

``validate`` checks a config before any process starts or any folder is
made, with one line naming the flag and the allowed range; among its
checks, the refusals of settings an agent that learns from its own
rollouts has no use for (``check_on_policy_settings``). ``check_types``
checks the types of settings given in Python. Host-side; not jittable.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import os

from fastpbrl.agents.networks import NETWORK_INITS
from fastpbrl.config.agent_settings import (agent_config, agent_spec,
                                            steps_per_call_of)
from fastpbrl.config.bounds import check_bounds
from fastpbrl.config.derived import path_kind, resolved
from fastpbrl.config.errors import ConfigError, SettingTypeError, check
from fastpbrl.config.fields import RunConfig
from fastpbrl.devices import sharding
from fastpbrl.envs.jax_envs import is_jax_env
from fastpbrl.learner.collect import Plan
from fastpbrl.logs import tracking
from fastpbrl.replay.device import LOCATIONS as REPLAY_LOCATIONS


def validate(config: RunConfig, min_population: int = 1) -> None:
  """Raises ``ConfigError`` naming the flag and the allowed range (of
  ``config`` as ``resolved`` completes it)."""
  config = resolved(config)
  try:  # each value in the agent's declared domain (or a renamed field)
    agent_spec(config.agent).check_hparams(parse_hparams(config.hparams))
  except ConfigError:
    raise
  except ValueError as e:
    raise ConfigError(f'--hparams {e}') from None
  check(config.population_size >= min_population,
        f'--population-size must be >= {min_population} for this rule, got '
        f'{config.population_size}')
  check_bounds(config)  # each setting in its declared range (``bounded``)
  kind = path_kind(config)  # what the run's data path makes of its settings
  if not kind.has_replay:
    check_on_policy_settings(config)
  if kind.random_warmup:
    check(config.warmup_steps < config.env_steps,
          f'--warmup-steps ({config.warmup_steps}) must be below --env-steps '
          f'({config.env_steps}), or nothing is ever learned')
  if is_jax_env(config.env):
    try:
      Plan.of(steps_per_call_of(config), config.update_to_data_ratio,
              config.envs_per_member, config.interleave)
    except ValueError as e:
      raise ConfigError(str(e)) from None
  check(config.hidden_sizes is None or (
      all(h >= 1 for h in config.hidden_sizes) and config.hidden_sizes),
        f'--hidden-sizes must be positive widths, got {config.hidden_sizes}')
  check(config.network_init in NETWORK_INITS,
        f'--network-init must be one of {", ".join(NETWORK_INITS)}, got '
        f'{config.network_init!r}')
  agent_config(config)  # --agent-settings and the size flags fit the agent
  check(config.replay_location in REPLAY_LOCATIONS,
        f'--replay-location must be one of {", ".join(REPLAY_LOCATIONS)}, '
        f'got {config.replay_location!r}')
  try:
    sharding.parse_devices(config.devices, config.population_size)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  problem = tracking.check(config.track)
  check(problem is None, problem or '')
  if config.resume is not None:
    check(os.path.isdir(os.path.join(config.resume, 'checkpoints')),
          f'--resume {config.resume!r}: no checkpoints/ folder there')
    check_writable(config.resume, '--resume')
  elif config.run_dir is not None:
    check(not os.path.exists(config.run_dir) or os.path.isdir(config.run_dir),
          f'--run-dir {config.run_dir!r} is a file, not a folder: choose a '
          'new directory')
    if os.path.isdir(config.run_dir):
      check(not os.listdir(config.run_dir),
            f'--run-dir {config.run_dir!r} is not empty: pass --resume '
            f'{config.run_dir} to continue that run, or choose a new directory')
    check_writable(config.run_dir, '--run-dir')
  else:
    check_writable('runs', '--run-dir (default runs/...)')


# Settings an agent that learns from its own rollouts has no use for: each
# must keep RunConfig's default. {field: why}
REPLAY_ONLY_SETTINGS = {
    'replay_capacity': 'and keeps no replay',
    'checkpoint_replay': 'and keeps no replay',
    'interleave': ('and acts, then updates, once per iteration '
                   '(rollout_length x num_envs env steps)')}


def check_on_policy_settings(config: RunConfig) -> None:
  """Refuses (one line naming the flag) the settings that mean nothing, or
  something else, on a data path without a replay (``PathKind.has_replay``
  False: an agent that learns from its own rollouts): its update steps
  are the env steps it learned from, so ``--update-to-data-ratio`` stays
  1; its envs
  per member are its config's ``num_envs``; it keeps no replay. A
  ``--warmup-steps`` is not refused (``resolved`` fills it from the
  budget, presets set it): the run ignores it, with a warning
  (``build.make_agent``)."""
  agent = f'--agent {config.agent} learns from its own rollouts'
  check(config.update_to_data_ratio == 1,
        f'--update-to-data-ratio {config.update_to_data_ratio}: {agent}, '
        'one update step per env step it learned from; leave it at 1')
  check(config.envs_per_member == 1,
        f'--envs-per-member {config.envs_per_member}: {agent}; set its '
        f'envs per member with --agent-settings '
        f'num_envs={config.envs_per_member}')
  check(not config.shared_replay,
        f'--shared-replay: {agent} and keeps no replay; drop the flag')
  defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
  for name, why in REPLAY_ONLY_SETTINGS.items():
    value = getattr(config, name)
    flag = '--' + name.replace('_', '-')
    check(value == defaults[name],
          f'{flag}{"" if isinstance(value, bool) else f" {value}"}: {agent} '
          f'{why}; drop the flag')


def check_writable(path: str, flag: str) -> None:
  """Raises ``ConfigError`` unless the folder ``path`` is, or can be made,
  writable: its nearest existing ancestor must be a folder this user may
  write to (``os.access``; root passes it, so ``run`` also turns an
  ``OSError`` of the folder's creation into a ``ConfigError``)."""
  ancestor = os.path.abspath(path)
  while not os.path.exists(ancestor):
    ancestor = os.path.dirname(ancestor)
  check(os.path.isdir(ancestor),
        f'{flag} {path!r}: {ancestor} is a file, not a folder; choose '
        'another directory')
  check(os.access(ancestor, os.W_OK | os.X_OK),
        f'{flag} {path!r}: {ancestor} is not writable; choose a directory '
        'you can write to')


def parse_hparams(items) -> dict[str, float]:
  """``--hparams NAME=VALUE ...`` as ``{name: value}``; which names the
  agent has is checked once it is built (``build.make_agent``)."""
  values = {}
  for item in items:
    name, sep, text = str(item).partition('=')
    check(sep == '=' and name.strip() != '',
          f'--hparams {item!r}: expected NAME=VALUE, e.g. policy_lr=1e-3')
    try:
      value = float(text)
    except ValueError:
      value = math.nan
    check(math.isfinite(value),
          f'--hparams {item}: {text!r} is not a finite number')
    check(name.strip() not in values,
          f'--hparams sets {name.strip()} twice')
    values[name.strip()] = value
  return values


def check_types(config: RunConfig) -> None:
  """Raises ``SettingTypeError`` naming the first setting whose value is
  not of its field's declared type (``fits``): what ``fastpbrl.train``'s
  keyword arguments and ``config`` get checked by, as the flags are by
  their parser. A ``Literal`` is left to the rules' checks, which name the
  choices."""
  if not isinstance(config.env, str):
    raise SettingTypeError(
        f'env must be an env id string such as \'Pendulum-v1\', got a '
        f'{type(config.env).__name__} object: each actor process makes the '
        'env from its id; register an env of your own with '
        'gymnasium.register in a module and pass \'module:EnvId\' '
        '(docs/guides/own-env.md)')
  for field in dataclasses.fields(config):
    annotation, value = str(field.type), getattr(config, field.name)
    if 'Literal[' not in annotation and not fits(annotation, value):
      raise SettingTypeError(f'{field.name} must be {annotation}, got '
                             f'{value!r} (a {type(value).__name__})')


# A setting's type (as the config classes annotate it) -> the Python types
# its value may have (an int is a float; a bool is not an int).
_SCALARS = {'int': (int,), 'float': (int, float), 'str': (str,),
            'bool': (bool,)}


def fits(annotation: str, value) -> bool:
  """Whether ``value`` (from a settings file) is of a config field's
  annotated type: a scalar, a ``Literal``, ``Optional[...]`` of one, or
  ``tuple[X, ...]``."""
  annotation = str(annotation)
  if annotation.startswith('Optional['):
    return value is None or fits(annotation[9:-1], value)
  if annotation.startswith('Literal['):
    return value in ast.literal_eval(f'({annotation[8:-1]},)')
  if annotation.startswith('tuple['):
    inner = annotation[6:].split(',')[0]
    return isinstance(value, tuple) and all(fits(inner, v) for v in value)
  kinds = _SCALARS.get(annotation)
  if kinds is None:
    return True  # a type of a user's config: left to the rule's checks
  return isinstance(value, kinds) and (annotation == 'bool'
                                       or not isinstance(value, bool))
