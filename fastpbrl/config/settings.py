"""Run settings and their checks (host-side; not jittable).

``RunConfig`` holds the settings every rule shares (each rule's config
subclasses it); ``validate`` checks them before any process starts or any
folder is made, with one line naming the flag and the allowed range;
``check_resume`` refuses a ``--resume`` that would continue another kind of
run. ``ConfigError`` is what the user did wrong, ``StorageError`` what the
disk did.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import difflib
import json
import math
import os
import shlex
import types
import typing
from typing import (Any, ClassVar, Literal, Mapping, NamedTuple, Optional,
                    TypeVar)

from fastpbrl import agents as agents_lib
from fastpbrl.agents.networks import NETWORK_INITS
from fastpbrl.core import settings_file
from fastpbrl.devices import sharding
from fastpbrl.envs.jax_envs import is_jax_env
from fastpbrl.learner.collect import Plan
from fastpbrl.logs import tracking
from fastpbrl.replay.device import LOCATIONS as REPLAY_LOCATIONS

C = TypeVar('C', bound='RunConfig')


class Derived(NamedTuple):
  """How a setting left unset (None) follows the budget: ``min(value,
  budget // divisor)``, at least ``least`` (``resolved``); at budgets of
  ``value x divisor`` and more it is ``value``."""

  value: int
  divisor: int
  least: int = 1


BOUNDS = 'fastpbrl.bounds'  # the key of a field's ``Bounds`` in its metadata


class Bounds(NamedTuple):
  """A setting's allowed range, declared once on its field (``bounded``)
  and checked by ``check_bounds``, as ``search_space.HParamDomain`` declares
  a hyperparameter's. ``None`` (a setting ``resolved`` derives, or one left
  to a rule) is always allowed; a number must be finite."""

  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False  # True: > low; False: >= low
  high_open: bool = False  # True: < high; False: <= high
  unit: str = ''  # after the range in the message: ' env steps', ' seconds'
  note: str = ''  # after that: ' (0: all rounds)'

  def allows(self, value: float) -> bool:
    return math.isfinite(value) and not (
        self.low is not None and (value <= self.low if self.low_open
                                  else value < self.low)) and not (
        self.high is not None and (value >= self.high if self.high_open
                                   else value > self.high))

  def describe(self) -> str:
    """The range as the messages state it: '>= 1', '> 0', 'in (0, 64]'."""
    if self.low is not None and self.high is not None:
      return (f'in {"(" if self.low_open else "["}{self.low!r}, '
              f'{self.high!r}{")" if self.high_open else "]"}')
    if self.low is not None:
      return f'{">" if self.low_open else ">="} {self.low!r}'
    return f'{"<" if self.high_open else "<="} {self.high!r}'

  def message(self, name: str, value) -> str:
    """``ConfigError``'s line for ``value`` of the setting ``name``."""
    return (f'--{name.replace("_", "-")} must be {self.describe()}'
            f'{self.unit}{self.note}, got {value}')


def bounded(default, *, ge=None, gt=None, le=None, lt=None, unit: str = '',
            note: str = ''):
  """A config field whose values must be ``>= ge`` (or ``> gt``) and ``<=
  le`` (or ``< lt``): ``eval_episodes: int = bounded(5, ge=1)``. Its
  docstring stays the field's help."""
  if ge is not None and gt is not None or le is not None and lt is not None:
    raise ValueError('bounded: give ge or gt, and le or lt, not both')
  if ge is None and gt is None and le is None and lt is None:
    raise ValueError('bounded: give at least one bound')
  bounds = Bounds(low=gt if ge is None else ge, high=lt if le is None else le,
                  low_open=gt is not None, high_open=lt is not None,
                  unit=unit, note=note)
  return dataclasses.field(default=default, metadata={BOUNDS: bounds})


def declared_bounds(config_class: type) -> dict[str, Bounds]:
  """``{field: Bounds}`` of a config class, in field order: a subclass that
  redeclares a field without bounds (a new default or docstring) keeps its
  base class's; one that declares bounds replaces them."""
  if not dataclasses.is_dataclass(config_class):
    return {}  # an object with RunConfig's fields: nothing declared
  found = {}
  for cls in reversed(config_class.__mro__):
    for field in getattr(cls, '__dataclass_fields__', {}).values():
      if BOUNDS in field.metadata:
        found[field.name] = field.metadata[BOUNDS]
  order = [f.name for f in dataclasses.fields(config_class)]
  return {name: found[name] for name in order if name in found}


def rule_fields(config) -> tuple[str, ...]:
  """The fields a rule's config adds to ``RunConfig``'s (those its rule
  checks; ``validate`` checks the rest)."""
  shared = {f.name for f in dataclasses.fields(RunConfig)}
  return tuple(f.name for f in dataclasses.fields(config)
               if f.name not in shared)


def check_bounds(config, names: Optional[tuple[str, ...]] = None) -> None:
  """Raises ``ConfigError`` (one line: the flag, its range, the value) for
  the first setting outside its declared ``Bounds`` (of ``names``: every
  declared one by default). A value that is not a number is left to
  ``check_types``."""
  for name, bounds in declared_bounds(type(config)).items():
    value = getattr(config, name)
    if names is not None and name not in names or value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    check(bounds.allows(value), bounds.message(name, value))


@dataclasses.dataclass
class RunConfig:
  """Settings shared by every experiment."""

  env: str = 'Pendulum-v1'
  """gymnasium environment id (MuJoCo v5 envs, classic control, ...), or a
  JAX env stepped on the device inside the learner call: gymnax:NAME
  (gymnax:Pendulum-v1; pip install 'fastpbrl[gymnax]') or brax:NAME
  (brax:hopper; pip install 'fastpbrl[brax]')."""
  agent: str = 'td3'
  """Agent: td3, sac, dqn (dqn needs a Discrete action space), ppo (on-policy:
  learns from its own rollouts), or an agent of your own as
  module:attribute (e.g. examples.ddpg:DDPG, examples.a2c:A2C; see
  fastpbrl/agents/base.py)."""
  population_size: int = 4
  """Number of members trained together."""
  seed: int = 0
  """Fixes initial parameters, hyperparameters, env resets, action noise,
  replay sampling and every rule decision."""
  env_steps: int = bounded(30_000, gt=0)
  """Budget: environment steps per member (training episodes only)."""
  warmup_steps: Optional[int] = bounded(None, ge=0)
  """Random-action steps per member before learning starts (default:
  1,000, or half of --env-steps below 2,000)."""
  update_to_data_ratio: float = bounded(1.0, gt=0, le=64)
  """Target update steps per env step (per member); the learner waits above it."""
  warmup_counts_as_data: bool = True
  """True: the warm-up's env steps count toward the ratio, so right after the
  warm-up the learner takes ratio x warm-up update steps at once, on the
  random-action data. False: only env steps after the warm-up count, as in
  TD3's and Stable-Baselines3's reference loops (one update per env step
  from the warm-up's end: ratio x (env steps - warm-up) in all)."""
  num_actors: Optional[int] = bounded(None, ge=1)
  """Actor processes (default: CPU cores minus one, at least 1; every core
  for on-policy agents such as PPO, whose learner waits while the actors
  step, and whose results the split of members over processes leaves
  unchanged)."""
  vector_envs: bool = True
  """Each actor steps its members' envs as one numpy batch where fastpbrl
  has one for the env (MuJoCo HalfCheetah, Hopper, Walker2d v5;
  Pendulum-v1); gymnasium's own step gives the same results, one env
  after another (--no-vector-envs, and every other env)."""
  envs_per_member: int = bounded(1, ge=1)
  """JAX envs (gymnax:, brax:) only: envs each member acts in at once, on
  the device; a learner call's env steps per member are rounded up to a
  multiple of it."""
  interleave: int = bounded(1, ge=1)
  """JAX envs only: times per learner call the members alternate between
  acting and updating (1: act for the call's env steps, then update; up to
  --steps-per-call: an update after each env step). It must divide the
  call's update steps and env-step batches."""
  hparams: tuple[str, ...] = ()
  """The agent's hyperparameters as NAME=VALUE (e.g. policy_lr=1e-3
  discount=0.98): every member's defaults. Seeds trains with them; PBT and
  HyperTrick start from them and keep those outside the search space
  fixed. fastpbrl info AGENT lists the names."""
  hidden_sizes: Optional[tuple[int, ...]] = None
  """MLP widths of policies and critics (TD3/SAC) or of the Q-MLP (DQN): the
  config field the agent registered as its hidden sizes (default: the
  agent's own, 256 256 for TD3, SAC and DQN, 64 64 for PPO)."""
  agent_settings: tuple[str, ...] = ()
  """Fields of the agent's static config as NAME=VALUE, each parsed to its
  field's type (a sequence as 64,64), e.g. rollout_length=128 num_envs=8
  epochs=4 for PPO; changing one recompiles. fastpbrl info AGENT lists
  them."""
  network_init: Literal['haiku', 'torch'] = 'haiku'
  """How MLP weights start (TD3, SAC): 'haiku' (haiku's default, as in
  Acme: truncated normal of scale 1/sqrt(fan-in), zero biases) or 'torch'
  (PyTorch's, as in Stable-Baselines3 and the TD3/SAC reference code:
  weights and biases uniform in +-1/sqrt(fan-in))."""
  batch_size: Optional[int] = bounded(None, ge=1)
  """Transitions per member per update step (default: the agent's, 256 / 32;
  an on-policy agent's minibatch size)."""
  steps_per_call: Optional[int] = bounded(None, ge=1)
  """Update steps compiled into one learner call (default 50, DQN 10; an
  on-policy agent's are env steps per member, a multiple of its
  rollout_length x num_envs, one iteration by default)."""
  replay_capacity: int = bounded(1_000_000, ge=1)
  """Transitions per replay buffer."""
  shared_replay: bool = False
  """One replay for all members: each member's batches are drawn from every
  member's transitions, so each learns from N times the data at the same
  env steps. Off: each member learns from its own, as in the PBT papers
  (the 2022 paper keeps one replay per agent when tuning hyperparameters).
  CEM-RL and DvD always share one; HyperTrick cannot (it restarts a slot
  with an empty replay of its own). One process only."""
  eval_every: Optional[int] = bounded(None, ge=1)
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); every run also evaluates each member's final
  policy at the end of its budget (default: 5,000, or half of --env-steps
  below 10,000)."""
  eval_episodes: int = bounded(5, ge=1)
  """Episodes per evaluation, played at once (one evaluation env each per
  member); their mean is one point of the return curve."""
  checkpoint_every: int = bounded(5_000, ge=0)
  """Env steps per member between checkpoints, rounded to whole learner
  calls (0: only at the end and on SIGINT/SIGTERM)."""
  checkpoint_replay: bool = False
  """Also store the replay in each checkpoint, so a resume continues with
  the data the run had (off by default: up to GBs per checkpoint; its size
  is logged at each save)."""
  actor_timeout: float = bounded(120.0, gt=0, unit=' seconds')
  """Seconds without a heartbeat after which an actor process counts as
  hung and is killed and restarted."""
  replay_location: Literal['auto', 'host', 'device'] = 'auto'
  """Where the replay lives: host (numpy; batches sampled by a thread and
  copied to the device), device (sampled inside the compiled learner call)
  or auto (device on a GPU/TPU when the replay fits in half its memory,
  host otherwise and on CPU); the choice and its reason are logged."""
  run_dir: Optional[str] = None
  """Where logs and checkpoints go (default: runs/<rule>-<agent>-<env>-<time>)."""
  resume: Optional[str] = None
  """A run directory to continue from its last checkpoint."""
  progress: bool = True
  """Show the progress bar."""
  devices: str = 'auto'
  """Devices to split the population over (one program, members sharded
  along the population axis): auto (every visible device if the population
  divides evenly by their count, else 1) or a count k (the first k; it must
  divide --population-size)."""
  track: Literal['tensorboard', 'wandb', 'mlflow', 'none'] = 'tensorboard'
  """Where scalars go besides the CSVs: tensorboard (event files in the run
  directory), wandb or mlflow (each with the TensorBoard files too; pip
  install 'fastpbrl[wandb]' / 'fastpbrl[mlflow]'), or none."""

  # Interval settings whose unit was not env steps per member before
  # fastpbrl 0.2: {field: (its name then, 'calls' or 'update_steps')}. A
  # run's config.json saved then is read in today's unit (``saved_config``).
  legacy_intervals: ClassVar[Mapping[str, tuple[str, str]]] = {
      'checkpoint_every': ('checkpoint_every', 'calls')}
  # Settings that, left unset (None), follow the budget (``resolved``).
  follows_budget: ClassVar[Mapping[str, Derived]] = {
      'warmup_steps': Derived(1_000, 2, least=0),
      'eval_every': Derived(5_000, 2)}

  def member_budget(self) -> Optional[int]:
    """The env steps per member that ``follows_budget`` settings follow."""
    return self.env_steps


def resolved(config: C) -> C:
  """``config`` with each unset setting of ``follows_budget`` derived from
  the budget (``Derived``), so that any budget runs with the defaults; what
  a run uses, writes to config.json and ``--print-config`` shows. An
  invalid budget leaves them at their full-budget values (``validate``
  names the budget). Idempotent; a set value is kept, and checked as given."""
  if not isinstance(config, RunConfig):
    return config  # an object with RunConfig's fields: already resolved
  budget = config.member_budget()
  usable = (isinstance(budget, int) and not isinstance(budget, bool)
            and budget > 0)
  values = {}
  for name, derived in type(config).follows_budget.items():
    if name == 'warmup_steps' and _learns_from_rollouts(config):
      if config.warmup_steps is None:  # no random warm-up: config.json says 0
        values[name] = 0
    elif getattr(config, name) is None:
      values[name] = (max(derived.least,
                          min(derived.value, budget // derived.divisor))
                      if usable else derived.value)
  return dataclasses.replace(config, **values) if values else config


def _learns_from_rollouts(config) -> bool:
  """Whether ``config.agent`` learns from its own rollouts (False for an
  agent it cannot find: ``validate`` names the flag)."""
  try:
    return agent_spec(config.agent).learns_from == 'rollout'
  except ConfigError:
    return False


class StorageError(RuntimeError):
  """The run could not write its logs or checkpoints (a full disk); every
  process is stopped and the last whole checkpoint is usable."""


class ConfigError(ValueError):
  """An invalid setting, found before any process starts; the message names
  the flag and what it may be."""


class SettingTypeError(ConfigError, TypeError):
  """A setting given in Python (``fastpbrl.train``) of the wrong type; the
  message names it and the type its field declares."""


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


def steps_per_call_of(config: RunConfig) -> int:
  """Update steps per learner call: ``--steps-per-call``, or the agent's
  (with ``--agent-settings``; a rollout agent's ``T x E`` by default)."""
  return config.steps_per_call or agent_config(config).steps_per_call


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
  if kind is None and default is not None and default is not dataclasses.MISSING:
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


def as_update_steps(env_steps: float, config: RunConfig) -> int:
  """An interval in env steps per member (every interval flag's unit) as
  update steps per member: x ``--update-to-data-ratio``, the pace the
  learner keeps; at least 1 unless the interval is 0."""
  if env_steps == 0:
    return 0
  return max(1, round(env_steps * config.update_to_data_ratio))


def as_learner_calls(env_steps: float, config: RunConfig) -> int:
  """An interval in env steps per member as whole learner calls (update
  steps / steps per call); at least 1 unless the interval is 0."""
  if env_steps == 0:
    return 0
  return max(1, round(env_steps * config.update_to_data_ratio
                      / steps_per_call_of(config)))


def check(ok: bool, message: str) -> None:
  """Raises ``ConfigError(message)`` unless ``ok``."""
  if not ok:
    raise ConfigError(message)


def as_flag_error(error: ValueError, config) -> ConfigError:
  """Rewrites ``'fraction must be ...'`` from a rule's own config check into
  ``'--fraction must be ...'`` when the first word is a field of ``config``."""
  message = str(error)
  first = message.split(' ', 1)[0]
  if first in {f.name for f in dataclasses.fields(config)}:
    message = '--' + first.replace('_', '-') + message[len(first):]
  return ConfigError(message)


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
  rollout = agent_spec(config.agent).learns_from == 'rollout'
  if rollout:
    check_on_policy_settings(config)
  else:
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
  something else, for an agent that learns from its own rollouts
  (``AgentSpec.learns_from == 'rollout'``): its update steps are the env
  steps it learned from, so ``--update-to-data-ratio`` stays 1; its envs
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


# Settings that fix the shapes of a checkpoint: a resume cannot change them.
# ``hidden_sizes`` compares the widths the agent gets (``hidden_sizes_of``),
# so a config.json that wrote the old default [256, 256] resumes unset.
SHAPE_SETTINGS = ('env', 'agent', 'population_size', 'hidden_sizes',
                  'agent_settings')


def hidden_sizes_of(config: RunConfig) -> Optional[tuple[int, ...]]:
  """The MLP widths the run's agent gets: ``--hidden-sizes`` or
  ``--agent-settings`` where given, else the agent's own default
  (``config.hidden_sizes`` as given for an agent without such a field)."""
  field = agent_spec(config.agent).hidden_sizes_field
  if field is None:
    return config.hidden_sizes
  return tuple(getattr(agent_config(config), field))


def check_resume(config: RunConfig, rule_ref: str) -> None:
  """Raises ``ConfigError`` if ``--resume`` would continue another kind of
  run (another rule, env, agent, population or network size), or one that
  cannot be resumed."""
  saved = saved_settings(config.resume)
  saved_ref = saved.get('rule')
  check(saved_ref is not None,
        f'--resume {config.resume!r}: its config.json names no rule (a run '
        'of an earlier fastpbrl, which kept its rules\' state another '
        'way); start a new run')
  check(not saved.get('not_resumable'),
        f'--resume {config.resume!r}: {saved.get("not_resumable")}')
  check(saved_ref == rule_ref,
        f'--resume {config.resume!r} is a {saved_ref!r} run; '
        f'continue it with: {resume_command(saved_ref, config.resume)}')
  before_config = saved_config(config.resume, config)
  for name in SHAPE_SETTINGS:
    now, before = getattr(config, name), saved.get(name)
    if name == 'hidden_sizes':
      now, before = hidden_sizes_of(config), hidden_sizes_of(before_config)
    elif isinstance(now, tuple):
      before = tuple(before or ())
    check(now == before,
          f'--{name.replace("_", "-")} {now} differs from the resumed run\'s '
          f'{before}; a resume cannot change it')


def saved_settings(run_dir: str, flag: str = '--resume') -> dict:
  """The settings a run saved in ``run_dir/config.json`` (its rule's ref
  under ``rule``)."""
  path = os.path.join(run_dir, 'config.json')
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise ConfigError(f'{flag} {run_dir!r}: no config.json there (is it a '
                      'fastpbrl run folder?)') from None


def saved_config(run_dir: str, like: C) -> C:
  """``like`` (a ``RunConfig`` of the run's rule) with the settings saved
  in ``run_dir``; saved names that are not ``like``'s fields (the rule's
  ref) are left out."""
  names = {f.name for f in dataclasses.fields(like)}
  saved = in_todays_units(saved_settings(run_dir), type(like))
  values = {k: tuple(v) if isinstance(v, list) else v
            for k, v in saved.items() if k in names}
  return dataclasses.replace(like, **values)


# What a run's config.json holds besides the settings.
RUN_RECORD_KEYS = ('rule', 'not_resumable', 'interval_unit')
# ``interval_unit`` of a config.json whose intervals are env steps per member.
INTERVAL_UNIT = 'env steps per member'


def in_todays_units(saved: dict, config_class: type) -> dict:
  """A run's saved settings with the intervals of a config.json written
  before they were all env steps per member (no ``interval_unit`` in it)
  converted: learner calls x steps per call / ratio, update steps / ratio
  (``config_class.legacy_intervals`` names them)."""
  if saved.get('interval_unit') == INTERVAL_UNIT or 'rule' not in saved:
    return saved
  saved = dict(saved)
  ratio = float(saved.get('update_to_data_ratio') or 1.0)
  steps_per_call = saved.get('steps_per_call') or (
      agent_spec(saved.get('agent', 'td3')).config.steps_per_call)
  for name, (old_name, unit) in config_class.legacy_intervals.items():
    if old_name not in saved:
      continue
    value = saved.pop(old_name)
    per = steps_per_call if unit == 'calls' else 1
    saved[name] = int(round(value * per / ratio))
  saved['interval_unit'] = INTERVAL_UNIT
  return saved


def file_config(path: str, like: C) -> C:
  """``like`` with the settings of a JSON or YAML file (``--config``): a
  mapping of setting names (as the flags, ``-`` or ``_``) to values; a
  run's ``config.json`` is one. A name ``like`` has not is refused."""
  try:
    values = settings_file.read(path)
  except ValueError as e:
    raise ConfigError(f'--config {path}: {e}') from None
  check(isinstance(values, dict),
        f'--config {path}: expected a mapping of settings to values, got '
        f'{type(values).__name__}')
  values = in_todays_units(values, type(like))  # an older run's config.json
  types = {f.name: f.type for f in dataclasses.fields(like)}
  names = list(types)
  settings = {}
  for key, value in values.items():
    name = str(key).lstrip('-').replace('-', '_')
    if name in RUN_RECORD_KEYS or name in ('run_dir', 'resume'):
      continue  # a run's record, or its folder: not carried to a new run
    if name not in names:
      near = difflib.get_close_matches(name, names, n=1)
      raise ConfigError(f'--config {path}: no setting {key!r}'
                        + (f'; did you mean {near[0]}?' if near else ''))
    value = tuple(value) if isinstance(value, list) else value
    check(fits(types[name], value),
          f'--config {path}: {key} must be {types[name]}, got {value!r}')
    settings[name] = value
  return dataclasses.replace(like, **settings)


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


def resume_command(rule_ref: str, run_dir: str) -> str:
  """The command line that continues the run in ``run_dir``."""
  return f'fastpbrl {rule_ref} --resume {shlex.quote(run_dir)}'


def agent_spec(agent: str):
  """The registered agent ``--agent`` names (``fastpbrl.agents.registry``)."""
  try:
    return agents_lib.get(agent)
  except ValueError as e:
    message = str(e)
    if not message.startswith(repr(agent)):
      message = f'{agent!r}: {message}'
    raise ConfigError(f'--agent {message}') from None

