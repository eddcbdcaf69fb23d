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
import json
import logging as std_logging
import math
import os
import time
from typing import Any, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl import agents as agents_lib
from fastpbrl.checkpoint import Checkpointer
from fastpbrl.learner import PopulationLearner, SharedCriticLearner
from fastpbrl.logging import RunLogger, plot_returns, summary_table

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
  num_actors: Optional[int] = None
  """Actor processes (default: CPU cores minus one, at least 1)."""
  hidden_sizes: tuple[int, ...] = (256, 256)
  """MLP widths of policies and critics (TD3/SAC) or of the Q-MLP (DQN): the
  config field the agent registered as its hidden sizes."""
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
  """Episodes per evaluation; their mean is one point of the return curve."""
  checkpoint_every: int = 100
  """Learner calls between checkpoints (0: only at the end)."""
  run_dir: Optional[str] = None
  """Where logs and checkpoints go (default: runs/<script>-<env>-<time>)."""
  resume: Optional[str] = None
  """A run directory to continue from its last checkpoint."""
  progress: bool = True
  """Show the progress bar."""
  track: str = 'tensorboard'
  """Where scalars go besides the CSVs: tensorboard (event files in the run
  directory), wandb or mlflow (each with the TensorBoard files too; pip
  install 'fastpbrl[wandb]' / 'fastpbrl[mlflow]'), or none."""


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


def pipeline_seed(seed: int, calls: int) -> int:
  """The pipeline's seed: the run's own, or for a run resumed after
  ``calls`` learner calls, fresh streams derived from both (never another
  run seed's streams, as ``seed + calls`` would be)."""
  if calls == 0:
    return seed
  return int(np.random.SeedSequence([seed, calls]).generate_state(1)[0])


def log_sizes(run_dir: str) -> dict:
  """Byte sizes of the run's append-only logs (member CSVs, lineage, CEM
  means), stored in each checkpoint."""
  names = [os.path.join('members', f) for f in sorted(
      os.listdir(os.path.join(run_dir, 'members')))] if os.path.isdir(
          os.path.join(run_dir, 'members')) else []
  names += ['lineage.jsonl', 'mean_policy.csv']
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
         f'continue it with experiments.{saved.get("driver")}')
  for name in SHAPE_SETTINGS:
    now, before = getattr(config, name), saved.get(name)
    if isinstance(now, tuple):
      before = tuple(before or ())
    _check(now == before,
           f'--{name.replace("_", "-")} {now} differs from the resumed run\'s '
           f'{before}; a resume cannot change it')


def make_env_spec(env_id: str):
  """Env spec for ``env_id``, with a clear error for an unknown id."""
  import gymnasium as gym  # noqa: PLC0415

  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.types import make_env_spec as spec_of  # noqa: PLC0415

  try:
    env = make_env(env_id)
  except gym.error.Error as e:
    raise ConfigError(f'--env {env_id!r} cannot be made: {e}') from None
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
  try:
    agent = agents_lib.make_agent(
        config.agent, env_spec, dataclasses.replace(spec.config(), **overrides))
  except ValueError as e:
    raise ConfigError(f'--agent {config.agent} on --env {config.env}: {e}') from None
  if spec.name == 'dqn' and len(env_spec.observations.shape) == 3:
    from fastpbrl.agents.dqn import NATURE_ATARI_RUN  # noqa: PLC0415
    differ = [f'--{k.replace("_", "-")} {getattr(config, k)} (Nature DQN: '
              f'{v})' for k, v in NATURE_ATARI_RUN.items()
              if getattr(config, k) != v]
    if differ:
      log.warning('DQN on Atari frames with %s; see NATURE_ATARI_RUN in '
                  'fastpbrl/agents/dqn.py, or experiments.pbt --preset atari',
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

  def next_key(self) -> jax.Array:
    self.key, sub = jax.random.split(self.key)
    return sub


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
    validate(config, self.min_population)
    self.config = config

  def initial_hparams(self, key: jax.Array, agent, population_size: int):
    del key
    from fastpbrl.learner import population_hparams  # noqa: PLC0415
    return population_hparams(agent, population_size)

  def make_learner(self, agent, num_steps: int):
    if self.shared_critic:
      if agent.shared_critic is None:
        raise ConfigError(f'{self.name} needs an agent with a shared-critic '
                         f'update (td3); --agent {agent.name} has none')
      return SharedCriticLearner(self.shared_critic_update(agent), num_steps)
    return PopulationLearner(agent, num_steps)

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

  def finished(self, loop: Loop) -> bool:
    return loop.env_steps >= loop.config.env_steps

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


def hparam_rows(hparams) -> list[dict]:
  arrays = {k: np.asarray(v) for k, v in hparams._asdict().items()}
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


def default_run_dir(script: str, env: str) -> str:
  stamp = time.strftime('%Y%m%d-%H%M%S')
  return os.path.join('runs', f'{script}-{env}-{stamp}')


def run(config: RunConfig, driver: Driver) -> RunResult:
  """Trains a population with ``driver``'s rule; returns the outcome.

  With ``config.resume`` set, the run continues from the last checkpoint in
  that directory: the training state, the hyperparameters (as PBT left
  them, not the initial ones), the counters, the RNG keys and the driver's
  state. The replay buffers are refilled (warm-up) rather than restored.
  """
  if config.resume:
    check_resume(config, driver.name)
  validate(config, driver.min_population)
  env_spec = make_env_spec(config.env)
  agent = make_agent(config, env_spec)
  run_dir = config.resume or config.run_dir or default_run_dir(driver.name,
                                                               config.env)
  os.makedirs(run_dir, exist_ok=True)
  n = config.population_size
  learner = driver.make_learner(agent, agent.config.steps_per_call)

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
  # Everything opened from here on is closed on the way out, whatever fails.
  with contextlib.ExitStack() as stack:
    checkpointer = Checkpointer(run_dir)
    stack.callback(checkpointer.close)
    counters = {'calls': 0, 'update_steps': 0, 'env_steps': 0, 'wall_time': 0.0}
    if config.resume:
      extra_template = {'hparams': hparams, 'rule_key': k_rule,
                        'driver': driver.checkpoint_arrays()}
      state, extra, meta = checkpointer.restore(state, extra_template)
      state = jax.tree.map(jnp.asarray, state)
      hparams = jax.tree.map(jnp.asarray, extra['hparams'])
      k_rule = jnp.asarray(extra['rule_key'])
      driver.restore(extra['driver'], meta['driver'])
      counters = meta['counters']
      truncate_logs(run_dir, meta.get('log_sizes', {}))
      log.info('resumed %s at call %d (%d env steps per member)', run_dir,
               counters['calls'], counters['env_steps'])
    # On a resume too, so that flags changed at the resume (a larger
    # --env-steps) are what the next resume starts from.
    with open(os.path.join(run_dir, 'config.json'), 'w') as f:
      json.dump({'driver': driver.name, **dataclasses.asdict(config)}, f,
                indent=2, default=str)
    log.info('run %s: %s', run_dir, json.dumps(dataclasses.asdict(config),
                                               default=str))

    from fastpbrl.pipeline import Pipeline  # noqa: PLC0415 (starts processes)

    logger = RunLogger(run_dir, n, total_env_steps=config.env_steps * n,
                       initial_env_steps=counters['env_steps'] * n,
                       wall_time_offset=counters['wall_time'],
                       progress=config.progress,
                       eval_episodes=config.eval_episodes,
                       track=config.track,
                       config={'driver': driver.name,
                               **dataclasses.asdict(config)})
    stack.callback(logger.close)
    pipeline = Pipeline.create(config, agent, shared_replay=driver.shared_replay,
                               seed=pipeline_seed(config.seed,
                                                  counters['calls']))
    stack.callback(pipeline.close)
    loop = Loop(config=config, run_dir=run_dir, agent=agent, learner=learner,
                pipeline=pipeline,
                state=state, hparams=hparams, key=k_rule,
                calls=counters['calls'], update_steps=counters['update_steps'],
                env_steps=counters['env_steps'],
                member_update_steps=np.asarray(counters.get(
                    'member_update_steps', [counters['update_steps']] * n),
                                               np.int64))

    def save():
      if checkpointer.latest_step() == loop.calls:
        return  # already saved at this call (e.g. the last call, or resumed
                # from a finished run): orbax refuses a step twice
      checkpointer.save(
          loop.calls, loop.state,
          {'hparams': loop.hparams, 'rule_key': loop.key,
           'driver': driver.checkpoint_arrays()},
          {'counters': {'calls': loop.calls, 'update_steps': loop.update_steps,
                        'member_update_steps':
                            loop.member_update_steps.tolist(),
                        'env_steps': loop.env_steps,
                        'wall_time': logger.wall_time},
           'driver': driver.checkpoint_meta(),
           'log_sizes': log_sizes(run_dir)})

    steps_before = counters['env_steps']
    pipeline.publish(learner.policy_params(loop.state),
                     driver.actor_hparams(loop.hparams))
    while not driver.finished(loop):
      batch = pipeline.next_batch()
      if driver.shared_critic:
        loop.state, metrics = learner.update(loop.state, loop.hparams, batch)
      else:  # members restarted and still warming up keep their state
        loop.state, metrics = learner.update(loop.state, loop.hparams, batch,
                                             pipeline.last_active)
        loop.member_update_steps += learner.num_steps * pipeline.last_active
      loop.calls += 1
      loop.update_steps += learner.num_steps
      # A resumed run's pipeline counts from zero: steps before the
      # checkpoint are added back, so budgets and logs continue.
      loop.episodes = [r._replace(env_steps=r.env_steps + steps_before)
                       for r in pipeline.drain_episodes()]
      loop.env_steps = steps_before + pipeline.env_steps_per_member()
      logger.episodes(loop.episodes, loop.env_steps, loop.update_steps)
      driver.after_call(loop)
      # After the rule, so that what it changed reaches the actors now.
      pipeline.publish(learner.policy_params(loop.state),
                       driver.actor_hparams(loop.hparams))
      if loop.calls % 10 == 0:
        scalars = {f'learner/{k}': float(np.mean(v)) for k, v in metrics.items()}
        scalars.update({f'rule/{k}': v for k, v in driver.scalars().items()})
        scalars['pipeline/learner_wait_fraction'] = pipeline.wait_fraction()
        scalars['pipeline/population_env_steps'] = loop.env_steps * n
        for i, row in enumerate(driver.hparam_rows(loop.hparams)):
          scalars.update({f'member_{i:03d}/hparams/{k}': v
                          for k, v in row.items()})
        # Against env steps per member, as the members' returns are.
        logger.scalars(scalars, loop.env_steps)
        logger.progress(loop.env_steps * n,
                        calls=loop.calls,
                        wait=f'{pipeline.wait_fraction():.0%}')
      if config.checkpoint_every and loop.calls % config.checkpoint_every == 0:
        save()
    save()
    pipeline.close()  # frees the cores for the final evaluation
    final_returns = final_evaluation(loop, driver, logger)

  rows = driver.hparam_rows(loop.hparams)
  table = summary_table(run_dir, rows, eval_episodes=config.eval_episodes)
  extra = driver.summary(loop)
  with open(os.path.join(run_dir, 'summary.txt'), 'w') as f:
    f.write(table + '\n' + (extra + '\n' if extra else ''))
  plot = plot_returns(run_dir, eval_episodes=config.eval_episodes)
  print(table)
  if extra:
    print(extra)
  print(f'logs, checkpoints and {os.path.basename(plot)} in {run_dir}')
  best = logger.best_return
  return RunResult(run_dir=run_dir, best_return=best, env_steps=loop.env_steps,
                   update_steps=loop.update_steps, calls=loop.calls,
                   hparams=rows, wall_time=logger.wall_time,
                   final_returns=final_returns,
                   rule_scalars=driver.scalars())


def final_evaluation(loop: Loop, driver: Driver, logger) -> list[float]:
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
  returns, lengths = evaluate_population(
      loop.agent, functools.partial(make_env, config.env),
      loop.learner.policy_params(loop.state),
      driver.actor_hparams(loop.hparams), config.eval_episodes, config.seed)
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
