"""The run loop every experiment shares (host-side; not jittable).

``run(config, driver)`` wires the parts together:

    actors --transitions--> replay --prefetch--> learner call --params--> actors
                                                      |
                                              driver.after_call  (PBT, CEM-RL,
                                                                  DvD, HyperTrick)

A *driver* is the population rule's host-side half: it picks the learner
mode (independent members or a shared critic), the initial hyperparameters,
and what happens between learner calls; the rule's arithmetic itself lives
in ``fastpbrl.population`` as pure array functions. Experiment scripts are
thin: a config dataclass, a driver, and ``run``.

Everything that can be checked is checked before any process starts
(``validate``), with a message naming the flag and the allowed range.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import logging as std_logging
import math
import os
import shlex
import signal
import time
from typing import Any, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl import agents as agents_lib
from fastpbrl.actors.pool import exit_if_spawned_import
from fastpbrl.agents.networks import NETWORK_INITS
from fastpbrl.checkpoint import CheckpointError, Checkpointer
from fastpbrl.learner import PopulationLearner, SharedCriticLearner
from fastpbrl import plots
from fastpbrl.logging import (FINAL_RETURNS, HPARAMS_CSV, RULE_CSV, HParamsLog,
                              RuleLog, RunLogger, plot_returns, summary_table,
                              write_json_atomic)
from fastpbrl.replay.buffers import format_bytes, transition_fields
from fastpbrl.replay.device import LOCATIONS as REPLAY_LOCATIONS
from fastpbrl.replay.buffers import state_template as replay_state_template
from fastpbrl.signals import ForcedExit, RunInterrupted, StopRequest

log = std_logging.getLogger('fastpbrl')


@dataclasses.dataclass
class RunConfig:
  """Settings shared by every experiment."""

  env: str = 'Pendulum-v1'
  """gymnasium environment id (MuJoCo v5 envs, classic control, ...)."""
  agent: str = 'td3'
  """Agent: td3, sac, dqn (dqn needs a Discrete action space), or an agent of
  your own as module:attribute (e.g. examples.ddpg:DDPG; see
  fastpbrl/agents/base.py)."""
  population_size: int = 4
  """Number of members trained together."""
  seed: int = 0
  """Fixes initial parameters, hyperparameters, env resets, action noise,
  replay sampling and every rule decision."""
  env_steps: int = 30_000
  """Budget: environment steps per member (training episodes only)."""
  warmup_steps: int = 1_000
  """Random-action steps per member before learning starts."""
  update_to_data_ratio: float = 1.0
  """Target update steps per env step (per member); the learner waits above it."""
  warmup_counts_as_data: bool = True
  """True: the warm-up's env steps count toward the ratio, so right after the
  warm-up the learner takes ratio x warm-up update steps at once, on the
  random-action data. False: only env steps after the warm-up count, as in
  TD3's and Stable-Baselines3's reference loops (one update per env step
  from the warm-up's end: ratio x (env steps - warm-up) in all)."""
  num_actors: Optional[int] = None
  """Actor processes (default: CPU cores minus one, at least 1)."""
  hidden_sizes: tuple[int, ...] = (256, 256)
  """MLP widths of policies and critics (TD3/SAC) or of the Q-MLP (DQN): the
  config field the agent registered as its hidden sizes."""
  network_init: str = 'haiku'
  """How MLP weights start (TD3, SAC): 'haiku' (haiku's default, as in
  Acme: truncated normal of scale 1/sqrt(fan-in), zero biases) or 'torch'
  (PyTorch's, as in Stable-Baselines3 and the TD3/SAC reference code:
  weights and biases uniform in +-1/sqrt(fan-in))."""
  batch_size: Optional[int] = None
  """Transitions per member per update step (default: the agent's, 256 / 32)."""
  steps_per_call: Optional[int] = None
  """Update steps compiled into one learner call (default 50, DQN 10)."""
  replay_capacity: int = 1_000_000
  """Transitions per replay buffer."""
  eval_every: int = 5_000
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); every run also evaluates each member's final
  policy at the end of its budget."""
  eval_episodes: int = 5
  """Episodes per evaluation, played at once (one evaluation env each per
  member); their mean is one point of the return curve."""
  checkpoint_every: int = 100
  """Learner calls between checkpoints (0: only at the end and on
  SIGINT/SIGTERM)."""
  checkpoint_replay: bool = False
  """Also store the replay in each checkpoint, so a resume continues with
  the data the run had (off by default: up to GBs per checkpoint; its size
  is logged at each save)."""
  actor_timeout: float = 120.0
  """Seconds without a heartbeat after which an actor process counts as
  hung and is killed and restarted."""
  replay_location: str = 'auto'
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
  track: str = 'tensorboard'
  """Where scalars go besides the CSVs: tensorboard (event files in the run
  directory), wandb or mlflow (each with the TensorBoard files too; pip
  install 'fastpbrl[wandb]' / 'fastpbrl[mlflow]'), or none."""


class StorageError(RuntimeError):
  """The run could not write its logs or checkpoints (a full disk); every
  process is stopped and the last whole checkpoint is usable."""


class ConfigError(ValueError):
  """An invalid setting, found before any process starts; the message names
  the flag and what it may be."""


def _check(ok: bool, message: str) -> None:
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
  """Raises ``ValueError`` naming the flag and the allowed range."""
  agent_spec(config.agent)
  _check(config.population_size >= min_population,
         f'--population-size must be >= {min_population} for this rule, got '
         f'{config.population_size}')
  _check(config.env_steps > 0, f'--env-steps must be > 0, got {config.env_steps}')
  _check(config.warmup_steps >= 0,
         f'--warmup-steps must be >= 0, got {config.warmup_steps}')
  _check(config.warmup_steps < config.env_steps,
         f'--warmup-steps ({config.warmup_steps}) must be below --env-steps '
         f'({config.env_steps}), or nothing is ever learned')
  _check(0 < config.update_to_data_ratio <= 64,
         f'--update-to-data-ratio must be in (0, 64], got '
         f'{config.update_to_data_ratio}')
  _check(config.num_actors is None or config.num_actors >= 1,
         f'--num-actors must be >= 1, got {config.num_actors}')
  _check(all(h >= 1 for h in config.hidden_sizes) and config.hidden_sizes,
         f'--hidden-sizes must be positive widths, got {config.hidden_sizes}')
  _check(config.network_init in NETWORK_INITS,
         f'--network-init must be one of {", ".join(NETWORK_INITS)}, got '
         f'{config.network_init!r}')
  _check(config.batch_size is None or config.batch_size >= 1,
         f'--batch-size must be >= 1, got {config.batch_size}')
  _check(config.steps_per_call is None or config.steps_per_call >= 1,
         f'--steps-per-call must be >= 1, got {config.steps_per_call}')
  _check(config.replay_capacity >= 1,
         f'--replay-capacity must be >= 1, got {config.replay_capacity}')
  _check(config.eval_every >= 1, f'--eval-every must be >= 1, got {config.eval_every}')
  _check(config.eval_episodes >= 1,
         f'--eval-episodes must be >= 1, got {config.eval_episodes}')
  _check(config.checkpoint_every >= 0,
         f'--checkpoint-every must be >= 0, got {config.checkpoint_every}')
  _check(config.replay_location in REPLAY_LOCATIONS,
         f'--replay-location must be one of {", ".join(REPLAY_LOCATIONS)}, '
         f'got {config.replay_location!r}')
  _check(math.isfinite(config.actor_timeout) and config.actor_timeout > 0,
         f'--actor-timeout must be > 0 seconds, got {config.actor_timeout}')
  from fastpbrl import sharding  # noqa: PLC0415
  try:
    sharding.parse_devices(config.devices, config.population_size)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  from fastpbrl import tracking  # noqa: PLC0415
  problem = tracking.check(config.track)
  _check(problem is None, problem or '')
  if config.resume is not None:
    _check(os.path.isdir(os.path.join(config.resume, 'checkpoints')),
           f'--resume {config.resume!r}: no checkpoints/ folder there')
  elif config.run_dir is not None and os.path.isdir(config.run_dir):
    _check(not os.listdir(config.run_dir),
           f'--run-dir {config.run_dir!r} is not empty: pass --resume '
           f'{config.run_dir} to continue that run, or choose a new directory')


def pipeline_seed(seed: int, calls: int, process: int = 0) -> int:
  """The pipeline's seed: the run's own, or for a run resumed after
  ``calls`` learner calls, fresh streams derived from both (never another
  run seed's streams, as ``seed + calls`` would be); process ``p > 0`` of
  a multi-process run (whose pipeline numbers its members from 0 too)
  gets streams of its own the same way."""
  if calls == 0 and process == 0:
    return seed
  entropy = [seed, calls] + ([process] if process else [])
  return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def log_sizes(run_dir: str) -> dict:
  """Byte sizes of the run's append-only logs (member CSVs, lineage, CEM
  means), stored in each checkpoint."""
  names = [os.path.join('members', f) for f in sorted(
      os.listdir(os.path.join(run_dir, 'members')))] if os.path.isdir(
          os.path.join(run_dir, 'members')) else []
  names += ['lineage.jsonl', 'mean_policy.csv', HPARAMS_CSV, RULE_CSV]
  return {name: os.path.getsize(os.path.join(run_dir, name)) for name in names
          if os.path.exists(os.path.join(run_dir, name))}


def truncate_logs(run_dir: str, sizes: dict) -> None:
  """Cuts the logs back to their sizes at the checkpoint being resumed: what
  a killed run wrote after it is redone by the resumed run, not kept twice."""
  for name, size in sizes.items():
    path = os.path.join(run_dir, name)
    if os.path.exists(path) and os.path.getsize(path) > size:
      with open(path, 'r+b') as f:
        f.truncate(size)


# Settings that fix the shapes of a checkpoint: a resume cannot change them.
SHAPE_SETTINGS = ('env', 'agent', 'population_size', 'hidden_sizes')


def check_resume(config: RunConfig, driver_name: str) -> None:
  """Raises ``ConfigError`` if ``--resume`` would continue another kind of
  run (another driver, env, agent, population or network size)."""
  path = os.path.join(config.resume, 'config.json')
  _check(os.path.exists(path), f'--resume {config.resume!r}: no config.json')
  with open(path) as f:
    saved = json.load(f)
  _check(saved.get('driver') != 'pbt-rerun',
         f'--resume {config.resume!r}: a re-run of one member\'s schedule '
         'cannot be resumed; start the re-run again (--rerun-lineage)')
  _check(saved.get('driver') == driver_name,
         f'--resume {config.resume!r} is a {saved.get("driver")!r} run; '
         f'continue it with: {resume_command(saved.get("driver"), config.resume)}')
  for name in SHAPE_SETTINGS:
    now, before = getattr(config, name), saved.get(name)
    if isinstance(now, tuple):
      before = tuple(before or ())
    _check(now == before,
           f'--{name.replace("_", "-")} {now} differs from the resumed run\'s '
           f'{before}; a resume cannot change it')


def resume_command(driver_name: str, run_dir: str) -> str:
  """The command line that continues the run in ``run_dir``."""
  return f'fastpbrl {driver_name} --resume {shlex.quote(run_dir)}'


def make_env_spec(env_id: str):
  """Env spec for ``env_id``, with a clear error for an unknown id."""
  import gymnasium as gym  # noqa: PLC0415

  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.types import make_env_spec as spec_of  # noqa: PLC0415

  try:
    env = make_env(env_id)
  except gym.error.Error as e:
    raise ConfigError(f'--env {env_id!r} cannot be made: {e}') from None
  except ImportError as e:  # 'mymod:Point-v0' whose module does not import
    module = env_id.split(':', 1)[0]
    raise ConfigError(f'--env {env_id!r}: module {module!r} cannot be '
                      f'imported ({e.__class__.__name__}: '
                      f'{str(e).splitlines()[0] if str(e) else e!r}); put it '
                      'on PYTHONPATH or install it') from None
  try:
    return spec_of(env)
  finally:
    env.close()


def agent_spec(agent: str):
  """The registered agent ``--agent`` names (``fastpbrl.agents.registry``)."""
  try:
    return agents_lib.get(agent)
  except ValueError as e:
    message = str(e)
    if not message.startswith(repr(agent)):
      message = f'{agent!r}: {message}'
    raise ConfigError(f'--agent {message}') from None


def make_agent(config: RunConfig, env_spec):
  """The agent ``config.agent`` names, with the config's size overrides."""
  spec = agent_spec(config.agent)
  overrides = {}
  if config.batch_size is not None:
    overrides['batch_size'] = config.batch_size
  if config.steps_per_call is not None:
    overrides['steps_per_call'] = config.steps_per_call
  if spec.hidden_sizes_field is not None:
    overrides[spec.hidden_sizes_field] = tuple(config.hidden_sizes)
  if any(f.name == 'network_init' for f in dataclasses.fields(spec.config)):
    overrides['network_init'] = config.network_init
  else:
    _check(config.network_init == 'haiku',
           f'--network-init {config.network_init}: --agent {config.agent} '
           'has no network_init setting (TD3 and SAC have)')
  try:
    agent = agents_lib.make_agent(
        config.agent, env_spec, dataclasses.replace(spec.config(), **overrides))
  except ValueError as e:
    raise ConfigError(f'--agent {config.agent} on --env {config.env}: {e}') from None
  if spec.name == 'dqn' and len(env_spec.observations.shape) == 3:
    from fastpbrl.agents.dqn import NATURE_ATARI_RUN  # noqa: PLC0415

    def differs(name, ours, nature):
      name = name.replace('_', '-')
      if isinstance(nature, bool):  # a flag pair: --name / --no-name
        return (f'--{"" if ours else "no-"}{name} (Nature DQN: '
                f'--{"" if nature else "no-"}{name})')
      return f'--{name} {ours} (Nature DQN: {nature})'

    differ = [differs(k, getattr(config, k), v)
              for k, v in NATURE_ATARI_RUN.items() if getattr(config, k) != v]
    if differ:
      log.warning('DQN on Atari frames with %s; see NATURE_ATARI_RUN in '
                  'fastpbrl/agents/dqn.py, or fastpbrl pbt --preset atari',
                  ', '.join(differ))
  return agent


@dataclasses.dataclass
class Loop:
  """What a driver sees and may change between learner calls."""

  config: RunConfig
  run_dir: str
  agent: Any
  learner: Any
  pipeline: Any
  state: Any  # stacked training state (device)
  hparams: Any  # stacked hyperparameters (device)
  key: jax.Array  # the run's rule key; split it, never reuse it
  calls: int = 0  # learner calls done
  update_steps: int = 0  # update steps per member done (the population's)
  # [N] update steps each member kept: less than update_steps for members
  # restarted as new experiments (``Pipeline.restart_members``).
  member_update_steps: Any = None
  env_steps: int = 0  # env steps per member collected (least over members)
  episodes: list = dataclasses.field(default_factory=list)  # this call's
  diverged: int = 0  # member divergences (NaN/Inf) replaced so far

  def next_key(self) -> jax.Array:
    self.key, sub = jax.random.split(self.key)
    return sub


class Finished(NamedTuple):
  """A learner call whose results the host reads once the next is queued."""

  calls: int  # the call's number
  metrics: Any  # its metrics (device arrays)
  env_steps: int  # env steps per member when it was dispatched
  scalars: dict | None  # host scalars to log with its metrics (every 10th)


class Driver:
  """Base population rule driver: independent members, nothing between calls.

  Subclasses override what they need. Every array a driver keeps must be
  returned by ``checkpoint_arrays`` and every host-side value by
  ``checkpoint_meta``, so that a resumed run continues exactly.
  """

  name = 'independent'
  shared_critic = False  # use the agent's shared-critic population update
  shared_replay = False  # one replay buffer for all members
  min_population = 1

  def __init__(self, config: RunConfig):
    exit_if_spawned_import(f'a {self.name} driver was created')
    validate(config, self.min_population)
    self.config = config

  def initial_hparams(self, key: jax.Array, agent, population_size: int):
    del key
    from fastpbrl.learner import population_hparams  # noqa: PLC0415
    return population_hparams(agent, population_size)

  def make_learner(self, agent, num_steps: int, mesh=None,
                   batch_size: int | None = None):
    """The learner; ``mesh`` (``fastpbrl.sharding``, None: one device)
    splits the population over devices; ``batch_size`` (default: the
    agent's) is what a call samples from a device replay."""
    if self.shared_critic:
      if agent.shared_critic is None:
        raise ConfigError(f'{self.name} needs an agent with a shared-critic '
                         f'update (td3); --agent {agent.name} has none')
      return SharedCriticLearner(self.shared_critic_update(agent), num_steps,
                                 batch_size or agent.config.batch_size,
                                 mesh=mesh)
    return PopulationLearner(agent, num_steps, batch_size, mesh=mesh)

  def shared_critic_update(self, agent):
    return agent.shared_critic

  def initialize(self, key: jax.Array, state: Any, agent) -> Any:
    """Called once on the freshly initialised population (also before a
    resume, so that ``checkpoint_arrays`` has its shapes); may change it."""
    del key, agent
    return state

  def after_call(self, loop: Loop) -> None:
    """Called after every learner call, with this call's finished episodes;
    may replace ``loop.state`` and ``loop.hparams`` (published right after)."""

  def emit(self, events: Sequence[dict]) -> None:
    """Reports rule decisions made in ``after_call`` (each a dict with at
    least ``'event'``), for ``Callback.after_rule_decision``."""
    self.__dict__.setdefault('_events', []).extend(events)

  def take_events(self) -> list[dict]:
    """The decisions emitted since the last call, oldest first."""
    return self.__dict__.pop('_events', [])

  def finished(self, loop: Loop) -> bool:
    return loop.env_steps >= loop.config.env_steps

  def replace_diverged(self, loop: Loop, diverged: np.ndarray) -> str:
    """Called after a learner call in which the members flagged in
    ``diverged`` (``[N]`` bool) got NaN or infinite losses or parameters
    (the learner kept their previous state). Must replace them in
    ``loop.state`` / ``loop.hparams``; returns how, for the log. This
    default re-initialises them (fresh parameters and optimizer states,
    same hyperparameters): a reset."""
    loop.state = loop.learner.reinit_members(loop.next_key(), loop.state,
                                             loop.hparams, diverged)
    return 're-initialised'

  def scalars(self) -> dict:
    return {}

  def checkpoint_arrays(self) -> Any:
    return {}

  def checkpoint_meta(self) -> dict:
    return {}

  def restore(self, arrays: Any, meta: dict) -> None:
    del arrays, meta

  def actor_hparams(self, hparams):
    """The agent hyperparameters actors act with (exploration noise)."""
    return hparams

  def hparam_rows(self, hparams) -> list[dict]:
    """Per-member hyperparameters as dicts, for summaries."""
    return hparam_rows(hparams)

  def summary(self, loop: Loop) -> str:
    del loop
    return ''


class Callback:
  """User code the run loop calls (host-side): subclass it, override what
  you need, and pass instances as ``run(config, driver, callbacks=[...])``
  (or ``fastpbrl.train(..., callbacks=[...])``).

  Both hooks run in the learner's process, between learner calls: keep them
  short, since the learner waits for them (the actors do not).
  """

  def after_call(self, loop: Loop) -> None:
    """After every learner call and the rule's ``after_call``, before the
    new policies go to the actors. ``loop`` holds the counters
    (``calls``, ``update_steps``, ``env_steps`` per member), this call's
    finished ``episodes``, and the stacked ``state`` and ``hparams``;
    replacing ``loop.state`` or ``loop.hparams`` changes what is trained,
    as a rule would."""

  def after_rule_decision(self, loop: Loop, event: dict) -> None:
    """Once per decision the rule made in this call, before
    ``after_call``: PBT ``{'event': 'exploit', 'member', 'parent',
    'new_hparams', ...}`` (the lineage line), HyperTrick ``{'event':
    'reset', 'member', 'hparams'}``, CEM-RL ``{'event': 'generation',
    'generation', 'mean_policy_return'}``, DvD ``{'event': 'lambda',
    'value'}``; each also has ``step`` (update steps) and ``env_steps``
    (per member)."""


def hparam_rows(hparams) -> list[dict]:
  from fastpbrl.distributed import whole_value  # noqa: PLC0415
  arrays = {k: whole_value(v) for k, v in hparams._asdict().items()}
  n = len(next(iter(arrays.values())))
  return [{k: float(v[i]) for k, v in arrays.items()} for i in range(n)]


@dataclasses.dataclass
class RunResult:
  run_dir: str
  best_return: float  # best evaluation mean of any member during the run
  env_steps: int
  update_steps: int
  calls: int
  hparams: list  # final per-member hyperparameters (dicts)
  wall_time: float
  # Per member: mean return of --eval-episodes noise-free episodes of its
  # final policy, played after the budget (``final_evaluation``).
  final_returns: list = dataclasses.field(default_factory=list)
  rule_scalars: dict = dataclasses.field(default_factory=dict)  # at the end
  diverged: int = 0  # member divergences (NaN/Inf) replaced during the run


def default_run_dir(rule: str, agent: str, env: str,
                    root: str = 'runs') -> str:
  """Creates and returns a new ``runs/<rule>-<agent>-<env>-<time>``; the
  env id's ``/`` and ``:`` (``ALE/Pong-v5``, ``mymod:Point-v0``) become
  ``_``. Two runs started in the same second from one folder (a job
  array, two terminals) get ``-2``, ``-3``, ... rather than one folder:
  the folder is claimed with an exclusive ``mkdir``."""
  stamp = time.strftime('%Y%m%d-%H%M%S')
  env = env.replace('/', '_').replace(':', '_')
  base = os.path.join(root, f'{rule}-{agent}-{env}-{stamp}')
  os.makedirs(root, exist_ok=True)
  for k in itertools.count(1):
    path = base if k == 1 else f'{base}-{k}'
    try:
      os.mkdir(path)
      return path
    except FileExistsError:
      continue


def run(config: RunConfig, driver: Driver,
        callbacks: Sequence[Callback] = ()) -> RunResult:
  """Trains a population with ``driver``'s rule; returns the outcome.

  ``callbacks`` (``Callback`` instances) see the loop after every learner
  call and every rule decision. Besides the logs, the run writes
  ``final_returns.json`` (each member's final evaluation) and, at the end,
  the pictures of ``fastpbrl.plots``.

  With ``config.resume`` set, the run continues from the last checkpoint in
  that directory: the training state, the hyperparameters (as PBT left
  them, not the initial ones), the counters, the RNG keys, the driver's
  state and, if it was checkpointed (``--checkpoint-replay``), the replay.
  The actors act with the restored policies from the first step; without a
  restored replay the learner waits until ``warmup_steps`` new steps per
  member refilled it.

  SIGINT and SIGTERM (``fastpbrl.signals``) finish the call under way,
  write a checkpoint and raise ``RunInterrupted``; a second one raises
  ``ForcedExit`` at once. Either way every process is stopped and every
  shared-memory segment released.
  """
  exit_if_spawned_import('fastpbrl.run was called')
  if config.resume:
    check_resume(config, driver.name)
  validate(config, driver.min_population)
  env_spec = make_env_spec(config.env)
  agent = make_agent(config, env_spec)
  n = config.population_size
  mesh = population_mesh(config)
  processes = check_processes(config, driver, mesh)
  # Process 0 names the folder (claiming a new default one); the others
  # wait here, so they have all validated --run-dir before it is written.
  run_dir = processes.broadcast_text(
      (config.resume or config.run_dir or default_run_dir(
          driver.name, config.agent, config.env)) if processes.main else '')
  os.makedirs(run_dir, exist_ok=True)
  learner = driver.make_learner(agent, agent.config.steps_per_call,
                                **({} if mesh is None else {'mesh': mesh}))

  key = jax.random.PRNGKey(config.seed)
  k_hparams, k_init, k_rule = jax.random.split(key, 3)
  try:
    hparams = driver.initial_hparams(k_hparams, agent, n)
  except ConfigError:
    raise  # already names its flag
  except ValueError as e:  # e.g. a search space that does not fit the agent
    raise ConfigError(f'initial hyperparameters: {e}') from None
  k_init, k_driver = jax.random.split(k_init)
  state = driver.initialize(k_driver, learner.init(k_init, hparams), agent)
  state, hparams = shard_state(learner, state, hparams)
  try:
    return _run(config, driver, agent, env_spec, run_dir, learner, hparams,
                state, k_rule, callbacks, processes)
  except ForcedExit as e:  # everything is closed by now
    raise ForcedExit(e.signum, (
        f'the earlier checkpoints in {run_dir}/checkpoints are intact; '
        f'resume with: {resume_command(driver.name, run_dir)}')) from None
  except CheckpointError as e:
    raise StorageError(f'{e}; free space, then resume with: '
                       f'{resume_command(driver.name, run_dir)}') from e
  except OSError as e:
    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
      raise
    raise StorageError(
        f'writing {e.filename or "a log"} failed ({e.strerror}); the '
        f'checkpoints in {run_dir}/checkpoints are intact; free space, then '
        f'resume with: {resume_command(driver.name, run_dir)}') from e


def population_mesh(config: RunConfig):
  """The mesh ``--devices`` asks for, logged; None for one device (the
  unsharded program, exactly as without sharding). Over several processes
  (``fastpbrl.distributed``) the mesh is always every process's devices."""
  from fastpbrl import sharding  # noqa: PLC0415
  if jax.process_count() > 1:
    total = len(jax.devices())
    _check(str(config.devices).strip().lower() in ('auto', str(total)),
           f'--devices {config.devices}: a run over {jax.process_count()} '
           f'processes uses all their {total} devices; use auto')
    _check(config.population_size % total == 0,
           f'--population-size {config.population_size} does not split '
           f'evenly over the {total} devices of {jax.process_count()} '
           f'processes; use a multiple of {total}')
  try:
    devices = sharding.choose_devices(config.devices, config.population_size)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  mesh = sharding.make_mesh(devices) if len(devices) > 1 else None
  log.info('%s', sharding.describe(mesh, config.population_size))
  return mesh


# The rules whose run loop works over several processes (the others keep
# host state that is not split by member yet: CEM's distribution, DvD's
# bandit, HyperTrick's restarts, a shared replay).
MULTI_PROCESS_RULES = ('seeds', 'pbt')


def check_processes(config: RunConfig, driver: 'Driver', mesh):
  """The run's ``distributed.Processes``; over several processes, refuses
  (one line naming the flag) what does not work there yet."""
  from fastpbrl import distributed  # noqa: PLC0415
  processes = distributed.Processes(mesh, config.population_size)
  if not processes.several:
    return processes
  where = f'over {processes.count} processes'
  _check(driver.name in MULTI_PROCESS_RULES,
         f'fastpbrl {driver.name} does not run {where} yet; '
         f'{" and ".join(MULTI_PROCESS_RULES)} do')
  _check(not config.checkpoint_replay,
         f'--checkpoint-replay is not supported {where} yet (each process '
         'has its own replay); drop it')
  _check(not getattr(config, 'copy_replay', False),
         f'--copy-replay is not supported {where} (a member\'s replay stays '
         'in its own process); drop it')
  _check(config.replay_location in ('auto', 'host'),
         f'--replay-location {config.replay_location}: {where} each process '
         'samples its members from a host replay; use auto or host')
  log.info('process %d of %d: members %d-%d of %d (their actors and replay '
           'live here)', processes.index, processes.count,
           processes.local.start, processes.local.stop - 1,
           config.population_size)
  return processes


def shard_state(learner, state, hparams):
  """``(state, hparams)`` placed on the learner's mesh (a restored
  checkpoint is host arrays); unchanged for a learner without one."""
  if getattr(learner, 'mesh', None) is None:
    return state, hparams
  state, hparams, _ = learner.shard(state, hparams)
  return state, hparams


def _run(config: RunConfig, driver: Driver, agent, env_spec, run_dir: str,
         learner, hparams, state, k_rule,
         callbacks: Sequence[Callback], processes) -> RunResult:
  """``run`` from the initial population on.

  Over several processes (``processes.several``) this process runs the
  actors and replay of its own members (``processes.local``), turns its
  batches into global arrays for the one sharded learner call, and
  gathers from every process what a rule decision reads (episodes, env
  steps, a stop request), so every process takes the same decisions.
  Process 0 writes the run's logs in ``run_dir``; process ``p`` writes its
  own copy (lineage included, to check that they agree) in
  ``run_dir/processes/<p>``. Checkpoints are the whole population's,
  written once, in ``run_dir``.
  """
  n = config.population_size
  local = processes.local
  own_dir = run_dir if processes.main else os.path.join(
      run_dir, 'processes', str(processes.index))
  os.makedirs(own_dir, exist_ok=True)
  # Everything opened from here on is closed on the way out, whatever fails.
  with contextlib.ExitStack() as stack:
    stop = stack.enter_context(StopRequest())  # restored last
    checkpointer = Checkpointer(run_dir)
    stack.push(_closing(checkpointer.close))
    counters = {'calls': 0, 'update_steps': 0, 'env_steps': 0, 'wall_time': 0.0}
    replay_state = None
    if config.resume:
      extra_template = {'hparams': hparams, 'rule_key': k_rule,
                        'driver': driver.checkpoint_arrays()}
      saved_meta = checkpointer.restore_meta()
      replay_template = None
      if config.checkpoint_replay and saved_meta.get('has_replay'):
        replay_template = replay_state_template(
            'shared' if driver.shared_replay else 'per_member',
            transition_fields(env_spec), config.population_size,
            saved_meta['replay_rows'])
      state, extra, meta = checkpointer.restore(
          state, extra_template, replay_template=replay_template)
      state = jax.tree.map(jnp.asarray, state)
      hparams = jax.tree.map(jnp.asarray, extra['hparams'])
      state, hparams = shard_state(learner, state, hparams)
      k_rule = jnp.asarray(extra['rule_key'])
      driver.restore(extra['driver'], meta['driver'])
      counters = meta['counters']
      replay_state = meta.get('replay')
      if processes.main:
        truncate_logs(run_dir, meta.get('log_sizes', {}))
      log.info('resumed %s at call %d (%d env steps per member)%s', run_dir,
               counters['calls'], counters['env_steps'],
               '' if replay_state is not None else
               (', replay refilled by the restored policies'
                + (' (this checkpoint holds no replay)'
                   if config.checkpoint_replay else '')))
    # On a resume too, so that flags changed at the resume (a larger
    # --env-steps) are what the next resume starts from.
    write_json_atomic(os.path.join(own_dir, 'config.json'),
                      {'driver': driver.name, **dataclasses.asdict(config)},
                      default=str)
    log.info('run %s: %s', run_dir, json.dumps(dataclasses.asdict(config),
                                               default=str))

    from fastpbrl.pipeline import Pipeline  # noqa: PLC0415 (starts processes)

    member_env_steps = counters.get('member_env_steps',
                                    [counters['env_steps']] * n)
    logger = RunLogger(own_dir, n, total_env_steps=config.env_steps * n,
                       initial_env_steps=counters['env_steps'] * n,
                       wall_time_offset=counters['wall_time'],
                       progress=config.progress and processes.main,
                       eval_episodes=config.eval_episodes,
                       purge_step=counters['env_steps'] if config.resume
                       else None,
                       track=config.track if processes.main else 'none',
                       config={'driver': driver.name,
                               **dataclasses.asdict(config)})
    stack.push(_closing(logger.close))
    hparams_log = HParamsLog(own_dir)
    stack.push(_closing(hparams_log.close))
    rule_log = RuleLog(own_dir)
    stack.push(_closing(rule_log.close))
    try:
      pipeline = Pipeline.create(
          dataclasses.replace(config, population_size=processes.local_count,
                              replay_location='host')
          if processes.several else config,
          agent, shared_replay=driver.shared_replay,
          seed=pipeline_seed(config.seed, counters['calls'], processes.index),
          resume_env_steps=(np.asarray(member_env_steps)[local]
                            if config.resume else None),
          replay_state=replay_state,
          # Several processes: host batches, made global by to_global.
          device=(jax.local_devices(backend='cpu')[0] if processes.several
                  else None),
          mesh=None if processes.several else getattr(learner, 'mesh', None))
      pipeline.publish_every_version = processes.several
    except ValueError as e:
      if str(e).startswith('--'):  # a setting refused once sizes are known
        raise ConfigError(str(e)) from None
      raise
    replay_state = None  # the pipeline's replay holds it now
    stack.callback(pipeline.close)
    loop = Loop(config=config, run_dir=own_dir, agent=agent, learner=learner,
                pipeline=pipeline,
                state=state, hparams=hparams, key=k_rule,
                calls=counters['calls'], update_steps=counters['update_steps'],
                env_steps=counters['env_steps'],
                member_update_steps=np.asarray(counters.get(
                    'member_update_steps', [counters['update_steps']] * n),
                                               np.int64))
    loop.diverged = counters.get('diverged', 0)

    def save():
      if checkpointer.latest_step() == loop.calls:
        return  # already saved at this call (e.g. the last call, or resumed
                # from a finished run): orbax refuses a step twice
      checkpointer.check_space()
      replay = None
      if config.checkpoint_replay:
        replay = pipeline.replay.state_dict()
      start = time.monotonic()
      member_steps = (np.asarray(member_env_steps)
                      + processes.members(pipeline.env_steps))
      checkpointer.save(
          loop.calls, loop.state,
          {'hparams': loop.hparams, 'rule_key': loop.key,
           'driver': driver.checkpoint_arrays()},
          {'counters': {'calls': loop.calls, 'update_steps': loop.update_steps,
                        'member_update_steps':
                            loop.member_update_steps.tolist(),
                        'env_steps': loop.env_steps,
                        'member_env_steps': member_steps.tolist(),
                        'diverged': loop.diverged,
                        'wall_time': logger.wall_time},
           'driver': driver.checkpoint_meta(),
           'log_sizes': log_sizes(run_dir),
           'replay_rows': (None if replay is None else
                           pipeline.replay.state_rows(replay))},
          replay=replay)
      if replay is not None:
        log.info('checkpoint %d with replay (%s) written in %.1f s',
                 loop.calls, format_bytes(sum(
                     x.nbytes for x in jax.tree.leaves(replay))),
                 time.monotonic() - start)

    steps_before = counters['env_steps']
    pipeline.publish(processes.local_view(learner.policy_params(loop.state)),
                     processes.local_view(driver.actor_hparams(loop.hparams)))

    # Members replaced after call `calls` was dispatched: that call ran
    # their diverged predecessor, whose flags must not replace them again.
    replaced_in_flight = {'calls': -1, 'members': np.zeros(n, bool)}

    def read_back(done: Finished) -> None:
      """What needs call ``done.calls``'s results on the host: run once the
      next call is dispatched, so the device is never idle while we wait."""
      if 'finite' in done.metrics:  # one [N] flag per call, not per step
        diverged = ~processes.host(done.metrics['finite'])
        if replaced_in_flight['calls'] == done.calls:
          diverged &= ~replaced_in_flight['members']
        if diverged.any():
          # The learner kept these members' last finite state; they are
          # replaced in the newest state, one call after they diverged.
          if loop.calls > done.calls:  # call loop.calls ran the old member
            replaced_in_flight.update(calls=loop.calls, members=diverged)
          how = driver.replace_diverged(loop, diverged)
          loop.diverged += int(diverged.sum())
          log.warning('members %s diverged (NaN or Inf in their loss or '
                      'parameters) in learner call %d: %s (%d so far)',
                      np.flatnonzero(diverged).tolist(), done.calls, how,
                      loop.diverged)
      if done.scalars is not None:
        scalars = {f'learner/{k}': float(np.mean(processes.host(v)))
                   for k, v in done.metrics.items()}
        scalars.update(done.scalars)
        scalars['learner/diverged_members_total'] = loop.diverged
        logger.scalars(scalars, done.env_steps)

    pending: Finished | None = None
    while not driver.finished(loop):
      batch = pipeline.next_batch(should_stop=stop)
      if processes.any(batch is None):
        break  # a signal arrived while waiting for data (in any process)
      batch = processes.global_rows(batch)
      if driver.shared_critic:
        loop.state, metrics = learner.update(loop.state, loop.hparams, batch)
      else:  # members restarted and still warming up keep their state
        active = processes.members(pipeline.last_active)
        loop.state, metrics = learner.update(loop.state, loop.hparams, batch,
                                             active)
        loop.member_update_steps += learner.num_steps * active
      loop.calls += 1
      loop.update_steps += learner.num_steps
      if pending is not None:
        read_back(pending)
      # A resumed run's pipeline counts from zero: steps before the
      # checkpoint are added back, so budgets and logs continue (episode
      # records already carry the members' own, continued, counts).
      loop.episodes = processes.episodes(pipeline.drain_episodes())
      # The least over members (of every process); and whether a signal
      # came (to any process), so that all stop after the same call.
      stopping, least = processes.agree(stop.requested,
                                        pipeline.env_steps_per_member())
      loop.env_steps = steps_before + least
      logger.episodes(loop.episodes, loop.env_steps, loop.update_steps)
      driver.after_call(loop)
      events = driver.take_events()
      for callback in callbacks:
        for event in events:
          callback.after_rule_decision(loop, event)
        callback.after_call(loop)
      # After the rule, so that what it changed reaches the actors; written
      # by the publisher thread once this call is done (Pipeline.publish_async).
      pipeline.publish_async(
          processes.local_view(learner.policy_params(loop.state)),
          processes.local_view(driver.actor_hparams(loop.hparams)))
      if loop.calls % 10 == 0 or events or loop.calls == 1:
        hparams_log.write(loop.env_steps, loop.update_steps,
                          driver.hparam_rows(loop.hparams))
      scalars = None
      if loop.calls % 10 == 0:
        rule_scalars = driver.scalars()
        rule_log.write(loop.env_steps, loop.update_steps, rule_scalars)
        scalars = {f'rule/{k}': v for k, v in rule_scalars.items()}
        scalars['pipeline/learner_wait_fraction'] = pipeline.wait_fraction()
        scalars['pipeline/population_env_steps'] = loop.env_steps * n
        for i, row in enumerate(driver.hparam_rows(loop.hparams)):
          scalars.update({f'member_{i:03d}/hparams/{k}': v
                          for k, v in row.items()})
        logger.progress(loop.env_steps * n,
                        calls=loop.calls,
                        wait=f'{pipeline.wait_fraction():.0%}')
      # Against env steps per member, as the members' returns are.
      pending = Finished(loop.calls, metrics, loop.env_steps, scalars)
      if stopping:
        break
      if config.checkpoint_every and loop.calls % config.checkpoint_every == 0:
        read_back(pending)
        pending = None
        save()
    if pending is not None:
      read_back(pending)
      for event in driver.take_events():  # a last divergence's replacement
        for callback in callbacks:
          callback.after_rule_decision(loop, event)
    hparams_log.write(loop.env_steps, loop.update_steps,
                      driver.hparam_rows(loop.hparams))
    if loop.calls % 10:  # else written at this call already
      rule_log.write(loop.env_steps, loop.update_steps, driver.scalars())
    save()
    if processes.any(stop.requested):
      stack.callback(stop.disarm)  # runs first: the clean-up is not cut
      raise RunInterrupted(stop.signum or signal.SIGTERM, run_dir, loop.calls,
                           loop.env_steps, resume_command(driver.name, run_dir))
    stack.callback(stop.disarm)
    pipeline.close()  # frees the cores for the final evaluation
    final_returns = final_evaluation(loop, driver, logger, processes)
    write_json_atomic(os.path.join(own_dir, FINAL_RETURNS), {
        'env_steps': loop.env_steps, 'eval_episodes': config.eval_episodes,
        'seed': config.seed, 'checkpoint_step': checkpointer.latest_step(),
        'final_returns': final_returns})

  rows = driver.hparam_rows(loop.hparams)
  if not processes.main:  # process 0 summarises and draws
    return RunResult(run_dir=run_dir, best_return=logger.best_return,
                     env_steps=loop.env_steps, update_steps=loop.update_steps,
                     calls=loop.calls, hparams=rows,
                     wall_time=logger.wall_time, final_returns=final_returns,
                     rule_scalars=driver.scalars(), diverged=loop.diverged)
  table = summary_table(run_dir, rows, eval_episodes=config.eval_episodes)
  extra = driver.summary(loop)
  if loop.diverged:
    extra = (extra + '\n' if extra else '') + (
        f'{loop.diverged} member divergences (NaN/Inf) were replaced')
  with open(os.path.join(run_dir, 'summary.txt'), 'w') as f:
    f.write(table + '\n' + (extra + '\n' if extra else ''))
  plot = plot_returns(run_dir, eval_episodes=config.eval_episodes)
  pictures = [os.path.basename(p) for p in
              [plot] + plots.plot_run(run_dir)]
  print(table)
  if extra:
    print(extra)
  print(f'logs, checkpoints and {", ".join(pictures)} in {run_dir}')
  best = logger.best_return
  return RunResult(run_dir=run_dir, best_return=best, env_steps=loop.env_steps,
                   update_steps=loop.update_steps, calls=loop.calls,
                   hparams=rows, wall_time=logger.wall_time,
                   final_returns=final_returns,
                   rule_scalars=driver.scalars(), diverged=loop.diverged)


def _closing(close):
  """An ``ExitStack`` exit callback running ``close``; an I/O error of
  ``close`` while another exception is on its way out (a full disk fails
  every writer) does not replace that first, more telling one."""

  def callback(exc_type, exc, tb) -> bool:
    del exc_type, tb
    try:
      close()
    except OSError:
      if exc is None:
        raise
    return False

  return callback


def final_evaluation(loop: Loop, driver: Driver, logger,
                     processes=None) -> list[float]:
  """Evaluates every member's final policy (``--eval-episodes`` noise-free
  episodes each, seeded from the run seed), logs the episodes as one whole
  evaluation per member at the budget's env steps, and returns the means.

  The periodic evaluations run in the actors alongside training and end
  wherever the budget cuts them; this one always exists, so a run whose
  budget holds no ``--eval-every`` boundary still reports a result.
  """
  import functools  # noqa: PLC0415

  from fastpbrl.actors import EpisodeRecord  # noqa: PLC0415
  from fastpbrl.evaluation import evaluate_population  # noqa: PLC0415
  from fastpbrl.envs import make_env  # noqa: PLC0415

  config = loop.config
  if processes is None:
    from fastpbrl.distributed import Processes  # noqa: PLC0415
    processes = Processes(None, config.population_size)
  # Each process plays its own members (seeded by their population index);
  # every process then has everyone's returns.
  local = processes.local
  returns, lengths = processes.members(evaluate_population(
      loop.agent, functools.partial(make_env, config.env),
      processes.local_view(loop.learner.policy_params(loop.state)),
      processes.local_view(driver.actor_hparams(loop.hparams)),
      config.eval_episodes, config.seed,
      members=list(range(local.start, local.stop))))
  logger.drop_partial_evaluations()
  logger.episodes(
      [EpisodeRecord(member=m, episode_return=float(returns[m, k]),
                     episode_length=int(lengths[m, k]), evaluation=True,
                     env_steps=loop.env_steps, policy_version=-1,
                     start_policy_version=-1)
       for m in range(returns.shape[0]) for k in range(returns.shape[1])],
      loop.env_steps, loop.update_steps)
  means = [float(x) for x in returns.mean(axis=1)]
  log.info('final evaluation (%d episodes per member at %d env steps): %s',
           config.eval_episodes, loop.env_steps,
           ', '.join(f'{x:.1f}' for x in means))
  return means
