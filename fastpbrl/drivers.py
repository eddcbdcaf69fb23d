"""Drivers: the host-side half of each population rule (not jittable).

A driver tells ``fastpbrl.run.run`` which learner mode to use and what to do
between learner calls; the arithmetic of each rule is a pure function in
``fastpbrl.population`` that the driver calls on the stacked state. Drivers
keep only bookkeeping (fitness histories, counters, lineage files) and hand
all of it to the checkpoint, so that ``--resume`` continues a rule exactly
where it was.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import pickle
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.evaluation import evaluate_policy
from fastpbrl.learner import population_hparams
from fastpbrl.population import cem as cem_lib
from fastpbrl.population import dvd as dvd_lib
from fastpbrl.population import hypertrick as hypertrick_lib
from fastpbrl.population import pbt as pbt_lib
from fastpbrl.population import search_space as ss
from fastpbrl.run import (ConfigError, Driver, Loop, RunConfig, _check,
                          agent_spec, as_flag_error, hparam_rows)


def _search_space(config: RunConfig) -> ss.SearchSpace:
  """``--search-space FILE`` if given, else the agent's default space."""
  path = getattr(config, 'search_space', None)
  if path is None:
    return agent_spec(config.agent).default_search_space
  try:
    return ss.load(path)
  except ValueError as e:
    raise ConfigError(f'--search-space {path}: {e}') from None


def _validate_space(config: RunConfig, space: ss.SearchSpace,
                    defaults) -> None:
  """Every field of the space is a hyperparameter of the agent."""
  try:
    ss.validate(space, defaults)
  except ValueError as e:
    path = getattr(config, 'search_space', None)
    if path:
      source = f'--search-space {path}'
    elif space == agent_spec(config.agent).default_search_space:
      source = f'the default search space of --agent {config.agent}'
    else:  # a space passed to the driver in code
      source = 'the search space'
    raise ConfigError(f'{source}: {e}') from None


def _check_shared_critic(rule: str, config: RunConfig) -> None:
  """CEM-RL and DvD train deterministic policies through one critic shared
  by the population: the agent must register that update
  (``register(..., shared_critic=...)``; of the built-ins, TD3 does)."""
  spec = agent_spec(config.agent)
  _check(spec.shared_critic is not None,
         f'{rule} needs deterministic policies trained through one shared '
         f'critic: --agent {config.agent} registers no shared_critic update '
         '(of the built-in agents only td3 does)')


# ---------------------------------------------------------------------------
# Many seeds
# ---------------------------------------------------------------------------


class SeedsDriver(Driver):
  """N independent members at the agent's published defaults, each with its
  own initial parameters, env and exploration streams and replay: N seeds
  of one agent trained at once, and the baseline every rule is measured
  against."""

  name = 'seeds'


# ---------------------------------------------------------------------------
# PBT
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class PBTRunConfig(RunConfig):
  """PBT (Jaderberg et al. 2017) on top of the shared run settings."""

  ready_after: int = 2_500
  """Update steps a member trains between exploit/explore decisions
  (the 2022 paper: 100,000 on HalfCheetah); each span must hold the start
  of an evaluation (see --eval-every)."""
  eval_every: int = 2_500
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); PBT's fitness is their mean."""
  exploit: str = 'truncation'
  """Exploit strategy: truncation or tournament (binary tournament)."""
  fraction: float = 0.3
  """Truncation: bottom fraction copies the top fraction, in (0, 0.5]."""
  resample_probability: float = 0.25
  """Explore: probability of resampling a hyperparameter from its prior."""
  reset_optimizers: bool = False
  """Reset the optimizer states of members that copied another."""
  copy_replay: bool = False
  """Also copy the source member's replay data (per-member buffers)."""
  min_gap_absolute: float = 0.0
  """Replace a member only if the source's fitness is higher by more than this."""
  min_gap_relative: float = 0.0
  """... and by more than this fraction of the member's |fitness|."""
  no_mutation_before: int = 0
  """No exploit/explore before this many update steps."""
  fitness_window: int = 10
  """Fitness = mean of a member's last this-many evaluation returns."""
  true_objective: bool = False
  """Use the 'true_objective' the env reports in info at episode end as fitness."""
  init_hparams: str = 'near-defaults'
  """Initial hyperparameters: 'near-defaults' (member 0 at the agent's
  published defaults, the others within a factor 1.25 of them), 'prior'
  (sampled from the whole search space, as the 2022 paper does) or
  'defaults' (every member at the defaults)."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the hyperparameters to search and their priors
  (format: README, "Search space from a file"; example:
  examples/search_space.json); default: the agent's registered space."""


class FreshEpisodes:
  """Host-side. Per member, the first policy version whose episodes count.

  After a member's weights are replaced (PBT exploit, HyperTrick restart,
  a new CEM-RL generation),
  episodes that started under its old weights still arrive for a while;
  they must not score the new weights. ``renew`` marks members replaced by
  this call (their new weights go out with the next publish); ``keep``
  filters episode records by the version they started under.
  """

  def __init__(self, population_size: int):
    self.first_version = np.zeros((population_size,), np.int64)

  def keep(self, record) -> bool:
    return (record['start_policy_version']
            >= self.first_version[int(record['member'])])

  def renew(self, loop: Loop, members: np.ndarray) -> None:
    self.first_version[members] = loop.pipeline.policy_version + 1

  def restart(self) -> None:
    """A resumed run's pipeline numbers versions from zero again."""
    self.first_version[:] = 0


def _check_evaluations_per(span_update_steps: float, config: RunConfig,
                           span_flags: str) -> None:
  """A rule that scores every span of update steps needs an evaluation
  to start inside each span."""
  span_env_steps = span_update_steps / config.update_to_data_ratio
  _check(config.eval_every <= span_env_steps,
         f'--eval-every {config.eval_every} is longer than one {span_flags} '
         f'span ({span_env_steps:.0f} env steps per member): spans would end '
         'without an evaluation to score them; lower --eval-every or lengthen '
         'the span')


class PBTDriver(Driver):
  """Independent members with per-member replay; PBT between calls."""

  name = 'pbt'
  min_population = 2

  def __init__(self, config: PBTRunConfig,
               space: Optional[ss.SearchSpace] = None):
    super().__init__(config)
    _check(config.init_hparams in ('near-defaults', 'prior', 'defaults'),
           f'--init-hparams must be near-defaults, prior or defaults, got '
           f'{config.init_hparams!r}')
    _check(config.fitness_window >= 1,
           f'--fitness-window must be >= 1, got {config.fitness_window}')
    try:  # PBTConfig checks --exploit, --fraction, --resample-probability...
      self.pbt_config = pbt_lib.PBTConfig(
          ready_after=config.ready_after, exploit=config.exploit,
          fraction=config.fraction,
          resample_probability=config.resample_probability,
          reset_optimizers=config.reset_optimizers,
          copy_replay=config.copy_replay,
          min_gap_absolute=config.min_gap_absolute,
          min_gap_relative=config.min_gap_relative,
          no_mutation_before=config.no_mutation_before)
    except ValueError as e:
      raise as_flag_error(e, config) from None
    total_updates = config.env_steps * config.update_to_data_ratio
    _check(config.ready_after + config.no_mutation_before <= total_updates,
           f'--ready-after {config.ready_after} (after --no-mutation-before '
           f'{config.no_mutation_before}) is beyond the budget of about '
           f'{total_updates:.0f} update steps per member (--env-steps x '
           '--update-to-data-ratio): PBT would never exploit; lower it or '
           'raise --env-steps')
    _check_evaluations_per(config.ready_after, config, '--ready-after')
    self.space = space or _search_space(config)
    self.exploit = pbt_lib.CompiledExploitExplore(self.pbt_config, self.space)
    self.fitness = pbt_lib.FitnessTracker(
        config.population_size, config.fitness_window, config.true_objective)
    self.last_ready = np.zeros((config.population_size,), np.int64)
    self.exploits = 0
    self.lineage: Optional[pbt_lib.Lineage] = None
    self.fresh = FreshEpisodes(config.population_size)

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    _validate_space(self.config, self.space, defaults)
    if self.config.init_hparams == 'defaults':
      return super().initial_hparams(key, agent, population_size)
    if self.config.init_hparams == 'near-defaults':
      return ss.sample_near(key, self.space, defaults, population_size)
    return ss.sample(key, self.space, defaults, population_size)

  def _lineage(self, loop: Loop) -> pbt_lib.Lineage:
    if self.lineage is None:
      path = os.path.join(loop.run_dir, 'lineage.jsonl')
      self.lineage = pbt_lib.Lineage(path)
      if not os.path.exists(path):
        self.lineage.record_init(loop.update_steps, loop.hparams,
                                 env_steps=loop.env_steps)
    return self.lineage

  def after_call(self, loop: Loop) -> None:
    lineage = self._lineage(loop)
    for r in loop.episodes:
      if r['evaluation'] and self.fresh.keep(r):
        objective = r['true_objective']
        if self.config.true_objective and np.isnan(objective):
          raise ConfigError(
              f'--true-objective: {self.config.env} reported no '
              "info['true_objective'] at the end of an episode")
        self.fitness.record(int(r['member']), float(r['episode_return']),
                            None if np.isnan(objective) else objective)
    # Members step in lockstep and a copy inherits its parent's step counter,
    # so every member's step count is loop.update_steps.
    steps = np.full_like(self.last_ready, loop.update_steps)
    ready = np.asarray(pbt_lib.ready_mask(steps, self.last_ready,
                                          self.pbt_config))
    if not ready.any():
      return
    fitness = self.fitness.fitness()
    result = self.exploit(loop.next_key(), loop.state, loop.hparams, fitness,
                          ready)
    replaced = np.asarray(result.replaced)
    parent = np.asarray(result.parent)
    events = pbt_lib.exploit_events(loop.update_steps, result, loop.hparams,
                                    fitness, env_steps=loop.env_steps)
    lineage.write(events)
    self.emit(events)
    self.fitness.on_exploit(parent, replaced)
    self.fresh.renew(loop, replaced)
    self.last_ready = np.where(ready, steps, self.last_ready)
    if replaced.any() and self.pbt_config.copy_replay:
      loop.pipeline.copy_member_data(np.flatnonzero(replaced),
                                     parent[replaced])
    self.exploits += int(replaced.sum())
    loop.state, loop.hparams = result.state, result.hparams

  def replace_diverged(self, loop: Loop, diverged: np.ndarray) -> str:
    """Diverged members are replaced at once by copies of good members,
    with perturbed hyperparameters (``pbt.replace_diverged``), and logged
    in the lineage with ``reason: diverged``; if every member diverged,
    they are re-initialised instead."""
    if diverged.all():
      return super().replace_diverged(loop, diverged)
    fitness = self.fitness.fitness()
    result = self.exploit.replace_diverged(loop.next_key(), loop.state,
                                           loop.hparams, fitness, diverged)
    parent = np.asarray(result.parent)
    events = [{**e, 'reason': 'diverged'} for e in pbt_lib.exploit_events(
        loop.update_steps, result, loop.hparams, fitness, loop.env_steps)]
    self._lineage(loop).write(events)
    self.emit(events)
    self.fitness.on_exploit(parent, diverged)
    self.fresh.renew(loop, diverged)
    if self.pbt_config.copy_replay:
      loop.pipeline.copy_member_data(np.flatnonzero(diverged),
                                     parent[diverged])
    loop.state, loop.hparams = result.state, result.hparams
    return 'replaced by copies of members ' + ', '.join(
        f'{i}<-{parent[i]}' for i in np.flatnonzero(diverged))

  def scalars(self) -> dict:
    fitness = self.fitness.fitness()
    finite = fitness[np.isfinite(fitness)]
    return {'exploits': self.exploits,
            'best_fitness': float(finite.max()) if finite.size else None}

  def checkpoint_arrays(self):
    return {'last_ready': self.last_ready}

  def checkpoint_meta(self) -> dict:
    return {'fitness_history': self.fitness.history(),
            'exploits': self.exploits}

  def restore(self, arrays, meta) -> None:
    self.last_ready = np.asarray(arrays['last_ready'], np.int64)
    self.fitness.set_history(meta['fitness_history'])
    self.exploits = meta['exploits']
    self.fresh.restart()

  def summary(self, loop: Loop) -> str:
    return (f'PBT: {self.exploits} exploit/explore replacements; lineage in '
            f'{self._lineage(loop).path}')


class ScheduleDriver(Driver):
  """Re-runs one member's hyperparameter schedule alone (population of 1).

  ``schedule`` is ``[(update_step, hparams dict), ...]`` as rebuilt by
  ``fastpbrl.population.pbt.schedule`` from a PBT lineage file.
  """

  name = 'pbt-rerun'

  def __init__(self, config: RunConfig, schedule: list):
    super().__init__(config)
    _check(config.population_size == 1,
           '--population-size must be 1 when re-running one schedule')
    _check(len(schedule) > 0, 'the schedule to re-run is empty')
    self.schedule = sorted(schedule, key=lambda e: e[0])
    self.applied = -1

  def _entry(self, update_steps: int) -> int:
    index = 0
    for i, (step, _) in enumerate(self.schedule):
      if step <= update_steps:
        index = i
    return index

  def _hparams(self, template, index: int):
    values = self.schedule[index][1]
    return template._replace(**{
        k: jnp.full_like(getattr(template, k), v) for k, v in values.items()
        if k in template._fields})

  def initial_hparams(self, key, agent, population_size):
    template = super().initial_hparams(key, agent, population_size)
    self.applied = self._entry(0)
    return self._hparams(template, self.applied)

  def after_call(self, loop: Loop) -> None:
    index = self._entry(loop.update_steps)
    if index != self.applied:
      loop.hparams = self._hparams(loop.hparams, index)
      self.applied = index

  def checkpoint_meta(self) -> dict:
    return {'applied': self.applied}

  def restore(self, arrays, meta) -> None:
    del arrays
    self.applied = meta['applied']




# ---------------------------------------------------------------------------
# DvD
# ---------------------------------------------------------------------------

# Learner calls between two measurements of the logged diversity figure
# (``run`` logs rule scalars every 10 calls).
_DIVERSITY_EVERY = 10


@dataclasses.dataclass
class DvDRunConfig(RunConfig):
  """DvD-TD3 (Parker-Holder et al. 2020): shared critic, diversity term.

  A shared-critic TD3 baseline without the diversity term is the same run
  with lambda held at 0: ``--lambda-mode schedule --lambda-start 0
  --lambda-end 0``.
  """

  agent: str = 'td3'
  """Agent with the shared-critic update this rule trains: td3 (SAC and DQN
  have none), or one of your own that registers it (module:attribute)."""
  lambda_mode: str = 'bandit'
  """How the diversity weight is set: bandit (Thompson sampling over
  --lambda-arms, as in the DvD paper) or schedule (linear from
  --lambda-start to --lambda-end over --lambda-decay-steps update steps, as
  in the 2022 paper)."""
  lambda_arms: tuple[float, ...] = (0.0, 0.5)
  """Bandit: the lambda values to choose from."""
  lambda_start: float = 0.5
  """Schedule: lambda at update step 0."""
  lambda_end: float = 0.0
  """Schedule: lambda after --lambda-decay-steps."""
  lambda_decay_steps: int = 100_000
  """Schedule: update steps over which lambda goes from start to end."""
  bandit_every: int = 100
  """Bandit: learner calls per round (one lambda per round); a round must
  hold an evaluation (see --eval-every)."""
  bandit_lookback: int = 5
  """Bandit: a round's reward is 1 if its best evaluation return beats the
  best of the previous this-many rounds, 0 if lower, 0.5 on a tie."""
  bandit_window: int = 50
  """Bandit: the posteriors count only the last this-many rewards (0: all)."""
  bandit_burn_in: int = 5
  """Bandit: the first this-many rounds pick lambda uniformly at random."""
  kernel_sigma: float = 1.0
  """Length scale of the RBF kernel on the members' actions, in action units
  (actions in [-1, 1]): the root-mean-square action gap at which two
  members' kernel entry is exp(-1/2). The squared distance is divided by
  --embedding-states x action dim, so the term is active for any action
  dimension."""
  embedding_states: int = 20
  """States of the shared batch on which members' actions are compared."""
  diversity_states: int = 256
  """States of the logged rule/mean_pairwise_action_distance: a fixed batch
  visited by uniformly random actions from resets seeded by --seed."""


def _probe_states(env_id: str, num_states: int, seed: int) -> np.ndarray:
  """Host-side: ``[num_states, ...]`` observations of ``env_id`` visited by
  uniformly random actions from resets seeded by ``seed`` (the same states
  for the same env and seed, so runs with the same seed compare on them)."""
  import gymnasium as gym  # noqa: PLC0415 (only env-making code needs it)

  rng = np.random.default_rng(seed)
  env = gym.make(env_id)
  states = []
  try:
    obs, _ = env.reset(seed=seed)
    space = env.action_space
    while len(states) < num_states:
      states.append(np.asarray(obs, np.float32))
      obs, _, terminated, truncated, _ = env.step(
          rng.uniform(space.low, space.high).astype(space.dtype))
      if terminated or truncated:
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
  finally:
    env.close()
  return np.stack(states)


class DvDDriver(Driver):
  """Shared critic and shared replay; lambda set between calls, and the
  members' mean pairwise action distance measured every 10 calls."""

  name = 'dvd'
  shared_critic = True
  shared_replay = True
  min_population = 2

  def __init__(self, config: DvDRunConfig):
    super().__init__(config)
    _check_shared_critic('DvD', config)
    _check(config.lambda_mode in ('bandit', 'schedule'),
           f'--lambda-mode must be bandit or schedule, got {config.lambda_mode!r}')
    _check(len(config.lambda_arms) >= 1 and all(
        a >= 0 for a in config.lambda_arms),
           f'--lambda-arms must be one or more values >= 0, got {config.lambda_arms}')
    _check(config.lambda_start >= 0 and config.lambda_end >= 0,
           '--lambda-start and --lambda-end must be >= 0')
    _check(config.lambda_decay_steps >= 1, '--lambda-decay-steps must be >= 1')
    _check(config.bandit_every >= 1, '--bandit-every must be >= 1')
    _check(config.bandit_lookback >= 1,
           f'--bandit-lookback must be >= 1, got {config.bandit_lookback}')
    _check(config.bandit_window >= 0,
           f'--bandit-window must be >= 0 (0: all rounds), got '
           f'{config.bandit_window}')
    _check(config.bandit_burn_in >= 0,
           f'--bandit-burn-in must be >= 0, got {config.bandit_burn_in}')
    if config.lambda_mode == 'bandit':
      _check_evaluations_per(
          config.bandit_every * (config.steps_per_call or
                                 agent_spec(config.agent).config.steps_per_call),
          config, '--bandit-every x --steps-per-call')
    _check(config.kernel_sigma > 0,
           f'--kernel-sigma must be > 0, got {config.kernel_sigma}')
    _check(config.embedding_states >= 2,
           f'--embedding-states must be >= 2, got {config.embedding_states}')
    _check(config.diversity_states >= 1,
           f'--diversity-states must be >= 1, got {config.diversity_states}')
    self.schedule = dvd_lib.PiecewiseLinear(
        ((0, config.lambda_start),
         (config.lambda_decay_steps, config.lambda_end)))
    self.bandit = dvd_lib.ThompsonBandit(
        np.random.default_rng(config.seed), config.lambda_arms,
        window=config.bandit_window or None, burn_in=config.bandit_burn_in)
    self.arm = None
    self.lam = config.lambda_start
    self.round_best = -np.inf  # best evaluation return in the current round
    self.recent_bests = []  # best eval returns of the last lookback rounds
    self.calls_in_round = 0
    self.diversity = None  # last mean pairwise action distance
    self._probe = None  # (states, jitted distance), set by initialize

  def shared_critic_update(self, agent):
    return dvd_lib.with_diversity(
        agent.shared_critic, agent.shared_critic.policy_apply,
        self.config.kernel_sigma,
        num_states=self.config.embedding_states)

  def initial_hparams(self, key, agent, population_size):
    if self.config.lambda_mode == 'bandit':
      self.arm, self.lam = self.bandit.select()
    return dvd_lib.dvd_hparams(
        super().initial_hparams(key, agent, population_size), self.lam)

  def initialize(self, key, state, agent):
    del key
    policy_apply = agent.shared_critic.policy_apply
    states = _probe_states(self.config.env, self.config.diversity_states,
                           self.config.seed)
    distance = jax.jit(lambda policies, s: dvd_lib.mean_pairwise_action_distance(
        jax.vmap(policy_apply, in_axes=(0, None))(policies, s)))
    self._probe = (jnp.asarray(states), distance)
    return state

  def actor_hparams(self, hparams):
    return hparams.agent

  def hparam_rows(self, hparams) -> list[dict]:
    rows = hparam_rows(hparams.agent)
    for row, lam in zip(rows, np.asarray(hparams.diversity_weight)):
      row['diversity_weight'] = float(lam)
    return rows

  def after_call(self, loop: Loop) -> None:
    if loop.calls % _DIVERSITY_EVERY == 0 and self._probe is not None:
      states, distance = self._probe
      self.diversity = float(distance(
          loop.learner.policy_params(loop.state), states))
    for r in loop.episodes:
      if r['evaluation']:
        self.round_best = max(self.round_best, float(r['episode_return']))
    if self.config.lambda_mode == 'schedule':
      lam = self.schedule(loop.update_steps)
    else:
      lam = self._end_of_round()
      if lam is None:
        return
    if lam != self.lam:
      self.lam = lam
      loop.hparams = dvd_lib.set_lambda(loop.hparams, lam)
      self.emit([{'event': 'lambda', 'step': loop.update_steps,
                  'env_steps': loop.env_steps, 'value': float(lam)}])

  def _end_of_round(self) -> Optional[float]:
    """Bandit bookkeeping after one call; the next round's lambda when a
    round ends, else None."""
    self.calls_in_round += 1
    if self.calls_in_round < self.config.bandit_every:
      return None
    self.calls_in_round = 0
    if not np.isfinite(self.round_best):
      return None  # no evaluation ended in this round: keep the arm, no reward
    reward = dvd_lib.improvement_reward(self.recent_bests, self.round_best)
    if reward is not None:  # None: the first round, nothing to compare with
      self.bandit.update(self.arm, reward)
    self.recent_bests = (self.recent_bests + [self.round_best])[
        -self.config.bandit_lookback:]
    self.round_best = -np.inf
    self.arm, lam = self.bandit.select()
    return lam

  def scalars(self) -> dict:
    out = {'diversity_weight': self.lam}
    if self.diversity is not None:
      out['mean_pairwise_action_distance'] = self.diversity
    return out

  def checkpoint_meta(self) -> dict:
    return {'arm': self.arm, 'lam': self.lam,
            'round_best': _json_number(self.round_best),
            'recent_bests': self.recent_bests,
            'calls_in_round': self.calls_in_round,
            'bandit': self.bandit.state()}

  def restore(self, arrays, meta) -> None:
    del arrays
    if 'recent_bests' not in meta:
      raise ConfigError(
          'this DvD checkpoint predates the scaled kernel and the windowed '
          'lambda bandit (its objective is not the one this code trains); '
          'start a new run instead of --resume')
    self.arm, self.lam = meta['arm'], meta['lam']
    self.round_best = _from_json_number(meta['round_best'])
    self.recent_bests = [float(r) for r in meta['recent_bests']]
    self.calls_in_round = meta['calls_in_round']
    self.bandit.load_state(meta['bandit'])

  def summary(self, loop: Loop) -> str:
    del loop
    if self.config.lambda_mode == 'bandit':
      means = ', '.join(f'{a}: {m:.2f}' for a, m in
                        zip(self.bandit.arms, self.bandit.means()))
      text = f'DvD bandit posterior mean reward per lambda: {means}'
    else:
      text = f'DvD final lambda: {self.lam}'
    if self.diversity is not None:
      text += (f'\nDvD mean pairwise action distance (last measured): '
               f'{self.diversity:.4f}')
    return text


def _json_number(x: float):
  return float(x) if np.isfinite(x) else None


def _from_json_number(x) -> float:
  return -np.inf if x is None else float(x)


# ---------------------------------------------------------------------------
# HyperTrick
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class HyperTrickRunConfig(RunConfig):
  """HyperTrick (Heinrich & Frosio): phases with early termination."""

  num_workers: int = 8
  """Configurations to try in total (each runs in a population slot)."""
  num_phases: int = 4
  """Phases per configuration; a configuration reports at each phase's end."""
  phase_update_steps: int = 2_500
  """Update steps per phase; a phase must hold an evaluation (--eval-every)."""
  eval_every: int = 1_000
  """Env steps per member between evaluations (no-noise episodes)."""
  eviction_rate: float = 0.25
  """Target fraction of the configurations in a phase terminated at its end."""
  quantile: float = 0.5
  """A late reporter below this quantile of its phase's metrics is terminated."""
  init_hparams: str = 'prior'
  """Hyperparameters of every configuration: prior (sampled) or defaults."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the prior the configurations are sampled from
  (format: README, "Search space from a file"); default: the agent's
  registered space."""


class HyperTrickDriver(Driver):
  """Independent members; slots report per phase, losers restart afresh."""

  name = 'hypertrick'

  def __init__(self, config: HyperTrickRunConfig,
               space: Optional[ss.SearchSpace] = None):
    super().__init__(config)
    _check(config.phase_update_steps >= 1, '--phase-update-steps must be >= 1')
    _check_evaluations_per(config.phase_update_steps, config,
                           '--phase-update-steps')
    _check(config.init_hparams in ('prior', 'defaults'),
           f'--init-hparams must be prior or defaults, got {config.init_hparams!r}')
    try:
      self.ht_config = hypertrick_lib.HyperTrickConfig(
          num_workers=config.num_workers, num_phases=config.num_phases,
          eviction_rate=config.eviction_rate, quantile=config.quantile)
    except ValueError as e:
      raise as_flag_error(e, config) from None
    self.space = space or _search_space(config)
    self.scheduler = hypertrick_lib.HyperTrick(self.ht_config,
                                               config.population_size)
    self.rng = np.random.default_rng(config.seed)
    n = config.population_size
    self.phase_start = np.zeros((n,), np.int64)
    self.phase_returns = [[] for _ in range(n)]
    self._reset = None
    self.fresh = FreshEpisodes(n)

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    _validate_space(self.config, self.space, defaults)
    if self.config.init_hparams == 'defaults':
      hparams = super().initial_hparams(key, agent, population_size)
    else:
      hparams = ss.sample(key, self.space, defaults, population_size)
    rows = hparam_rows(hparams)
    for slot, worker in enumerate(self.scheduler.start()):
      if worker is not None:
        self.scheduler.set_hparams(worker, rows[slot])
    return hparams

  def _reset_fn(self, loop: Loop):
    if self._reset is None:
      space = self.space if self.config.init_hparams == 'prior' else None
      template = loop.agent.default_hparams()
      self._reset = jax.jit(lambda key, state, hparams, reset:
                            hypertrick_lib.reset_members(
                                key, state, hparams, reset, loop.agent.init,
                                space, template))
    return self._reset

  def after_call(self, loop: Loop) -> None:
    for r in loop.episodes:
      if r['evaluation'] and self.fresh.keep(r):
        self.phase_returns[int(r['member'])].append(float(r['episode_return']))
    # A phase counts the slot's own update steps: a restarted slot takes
    # none while it warms up.
    due = [slot for slot in range(len(self.phase_start))
           if self.scheduler.slot_worker[slot] is not None
           and loop.member_update_steps[slot] - self.phase_start[slot]
           >= self.config.phase_update_steps]
    if not due:
      return
    # Slots finish phases together here; report in a random order, as the
    # asynchronous workers of the paper would arrive.
    reset = np.zeros((len(self.phase_start),), bool)
    for slot in self.rng.permutation(due):
      returns = self.phase_returns[slot][-10:]
      metric = float(np.mean(returns)) if returns else -np.inf
      report = self.scheduler.report(int(slot), metric)
      self.phase_start[slot] = loop.member_update_steps[slot]
      self.phase_returns[slot] = []
      if report.new_worker is not None:
        reset[slot] = True
    if reset.any():
      loop.state, loop.hparams = self._reset_fn(loop)(
          loop.next_key(), loop.state, loop.hparams, reset)
      # A new experiment from phase one: an empty replay and its own
      # warm-up (the evicted configuration's data is not reused).
      loop.pipeline.restart_members(np.flatnonzero(reset))
      self.fresh.renew(loop, reset)
      rows = hparam_rows(loop.hparams)
      for slot in np.flatnonzero(reset):
        self.scheduler.set_hparams(self.scheduler.slot_worker[slot], rows[slot])
      self.emit([{'event': 'reset', 'step': loop.update_steps,
                  'env_steps': loop.env_steps, 'member': int(slot),
                  'hparams': rows[slot]} for slot in np.flatnonzero(reset)])

  def finished(self, loop: Loop) -> bool:
    return self.scheduler.done or super().finished(loop)

  def scalars(self) -> dict:
    return {'workers_launched': self.scheduler.launched}

  def checkpoint_arrays(self):
    return {'phase_start': self.phase_start}

  def checkpoint_meta(self) -> dict:
    return {'scheduler': base64.b64encode(pickle.dumps(
        self.scheduler)).decode('ascii'),
            'rng': self.rng.bit_generator.state,
            'phase_returns': self.phase_returns}

  def restore(self, arrays, meta) -> None:
    self.phase_start = np.asarray(arrays['phase_start'], np.int64)
    self.scheduler = pickle.loads(base64.b64decode(meta['scheduler']))  # noqa: S301 (our own checkpoint)
    self.rng.bit_generator.state = meta['rng']
    self.phase_returns = meta['phase_returns']
    self.fresh.restart()

  def summary(self, loop: Loop) -> str:
    del loop
    try:
      best = self.scheduler.best()
    except ValueError:
      return 'HyperTrick: no configuration finished a phase'
    rates = ', '.join(f'{r:.2f}' for r in self.scheduler.eviction_rates())
    return (f'HyperTrick: {self.scheduler.launched} configurations launched; '
            f'eviction rate per phase [{rates}] (target '
            f'{self.ht_config.eviction_rate}); best: configuration '
            f'{best.worker}, mean evaluation return {best.metric:.1f} at the '
            f'end of phase {best.phase}, hyperparameters {best.hparams}')


# ---------------------------------------------------------------------------
# CEM-RL
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class CEMRLRunConfig(RunConfig):
  """CEM-RL (Pourchot & Sigaud 2019) with the 2022 paper's shared critic.

  The budget is stated as CEM-RL states it: env steps of the whole
  population together (``--total-env-steps``), not per member.
  """

  agent: str = 'td3'
  """Agent with the shared-critic update this rule trains: td3 (SAC and DQN
  have none), or one of your own that registers it (module:attribute)."""

  population_size: int = 6
  """Number of members (even: CEM samples mirrored pairs)."""
  total_env_steps: int = 180_000
  """Budget: env steps of the WHOLE POPULATION together, as CEM-RL states
  budgets (its paper: 1,000,000 on HalfCheetah with 10 members). The random
  warm-up and the steps actors collect while the RL half trains count too."""
  env_steps: Optional[int] = None
  """Per-member budget, which CEM-RL derives: ceil(--total-env-steps /
  --population-size). Leave it unset."""
  update_to_data_ratio: Optional[float] = None
  """Rate limiter cap in update steps per env step PER MEMBER; default: the
  population size, i.e. one shared-critic step per env step of the
  population (CEM-RL's ratio). Higher: fewer env steps collected while the
  RL half trains, more idle learner calls while the population is evaluated."""
  rl_fraction: float = 0.5
  """Fraction of each generation that takes TD3 steps through the shared critic."""
  elite_fraction: float = 0.5
  """Fraction of the population the CEM distribution is refit on."""
  initial_variance: float = 1e-3
  """Initial variance of the CEM distribution around the initial policy."""
  initial_extra_noise: float = 1e-2
  """Extra variance added at each update; decays towards --noise-limit."""
  noise_decay: float = 0.95
  """Factor of the extra noise's geometric decay."""
  noise_limit: float = 1e-5
  """Value the extra noise decays towards."""
  action_noise: float = 0.0
  """Gaussian action noise of the members' episodes (CEM-RL: none; the
  population's parameter noise explores). Fitness episodes are played with it."""
  mean_eval_episodes: int = 1
  """Episodes of the distribution's mean policy after each generation."""


class CEMRLDriver(Driver):
  """CEM-RL's generations (Algorithm 1 of Pourchot & Sigaud 2019).

  Generation ``g``, in two phases:

  * train: ``N`` policies are sampled from the CEM distribution and loaded
    into the actors and their target actors, with fresh policy optimizer
    states (line 10; the authors' code builds a new Adam for each RL actor).
    The RL half (members ``0 .. round(rl_fraction N) - 1``) then takes
    ``actor_steps[g]`` update steps through the shared critic
    (``cem.with_rl_schedule``): each step is one TD3 policy step per RL
    member and one critic step whose loss is averaged over the RL members.
    So, per generation, each RL actor takes ``actor_steps[g]`` actor steps and
    the critic ``actor_steps[g]`` critic steps, Algorithm 1's counts (its
    sequential loop gives the critic ``2 actor_steps / n`` steps per RL actor,
    ``actor_steps`` in all).
  * eval: the learner's calls change nothing; each member's fitness is the
    return of its first training episode that starts after the trained
    policies were published. Then the CEM distribution is refit on the
    ``N`` policies (the trained ones fed back, line 13) and the mean policy
    is evaluated in the learner process (``mean_policy.csv``).

  ``actor_steps[g + 1]`` is the total length of generation ``g``'s fitness
  episodes (lines 14-17: the env steps of the evaluations);
  ``actor_steps[1] = 0``, so the first generation is evaluated untrained.

  Departures from the paper, all forced by the asynchronous pipeline (the
  paper's loop is sequential) except the first:

  * the critic update is the 2022 paper's vectorized one (sec. 4.2): each
    step, every RL member's batch goes through its own target policy and
    the critic loss is their mean; ``policy_delay`` is 1 for all members
    (as in the 2022 authors' code), which gives the counts above;
  * actors never pause. While the RL half trains they keep stepping (with
    the policies being trained) at the rate limiter's pace, one env step per
    member per ``--update-to-data-ratio`` update steps (by default one
    population env step per update step, i.e. ``actor_steps`` env steps in
    all); in the eval phase each member finishes the episode in progress
    (and what its actor had already queued, up to 8 chunks of 32 steps)
    before its fitness episode starts, and keeps acting until the slowest
    member's ends. All these steps go into the replay and count in
    ``--total-env-steps``, but not in ``actor_steps`` (the paper collects
    none of them), so a budget buys fewer generations and fewer critic
    steps than in the paper, which has one critic step per env step. At
    the default ratio a generation collected about 3 times ``actor_steps``
    env steps on HalfCheetah-v5 (12,032 for 4,000 with 4 members and
    1,000-step episodes) and 4 times on Pendulum-v1 (200-step episodes);
  * the rate limiter paces the actors by the learner's update steps, so the
    learner keeps calling (with every step inactive) during the eval phase;
  * the learner runs whole calls of ``--steps-per-call`` steps: a
    generation's last training call has only its first ``actor_steps mod
    steps_per_call`` steps active (a traced bound, ``train_until``), so the
    counts are exact, with no rounding;
  * the warm-up is ``--warmup-steps`` random-action steps per member before
    the first generation; the paper instead runs its first generations
    (``start_steps`` = 10,000 env steps in all) without RL training.
  """

  name = 'cemrl'
  shared_critic = True
  shared_replay = True
  min_population = 2

  def __init__(self, config: CEMRLRunConfig):
    config = self.resolve(config)
    super().__init__(config)
    _check_shared_critic('CEM-RL', config)
    _check(config.population_size % 2 == 0, f'--population-size must be even '
           f'(mirrored sampling), got {config.population_size}')
    _check(0 < config.rl_fraction <= 1,
           f'--rl-fraction must be in (0, 1], got {config.rl_fraction}')
    _check(0 < config.elite_fraction <= 1,
           f'--elite-fraction must be in (0, 1], got {config.elite_fraction}')
    _check(config.initial_variance > 0, '--initial-variance must be > 0')
    _check(config.initial_extra_noise >= 0, '--initial-extra-noise must be >= 0')
    _check(0 < config.noise_decay < 1, '--noise-decay must be in (0, 1)')
    _check(config.noise_limit >= 0, '--noise-limit must be >= 0')
    _check(config.action_noise >= 0, '--action-noise must be >= 0')
    _check(config.mean_eval_episodes >= 1, '--mean-eval-episodes must be >= 1')
    n = config.population_size
    self.num_rl = max(1, round(config.rl_fraction * n))
    self.phase = 'train'
    self.generation = 0  # CEM updates done
    self.actor_steps = 0  # Algorithm 1's actor_steps for this generation
    self.critic_steps = 0  # shared critic steps so far (state.step)
    self.fresh = FreshEpisodes(n)  # the eval phase scores fresh episodes
    self.resumed = False
    self.fitness = np.full((n,), np.nan)
    self.lengths = np.zeros((n,), np.int64)  # of the fitness episodes
    # (generation, total env steps, actor steps, mean-policy return)
    self.mean_returns: list[tuple[int, int, int, float]] = []
    self.cem_state = None
    self.unravel = None
    self.initial_policy_opt = None
    self.agent = None

  @staticmethod
  def resolve(config: CEMRLRunConfig) -> CEMRLRunConfig:
    """The config ``run`` gets (``driver.config``): the per-member budget
    from ``--total-env-steps`` and the default update-to-data ratio filled in.
    Idempotent, so a resumed run resolves its saved config alike."""
    _check(config.total_env_steps > 0,
           f'--total-env-steps must be > 0, got {config.total_env_steps}')
    n = config.population_size
    if n < 1:
      return config  # validate names --population-size
    per_member = -(-config.total_env_steps // n)
    # A resume re-derives it from the (possibly raised) --total-env-steps.
    _check(config.env_steps in (None, per_member) or config.resume is not None,
           f'--env-steps is per member and CEM-RL derives it from '
           f'--total-env-steps, the budget of the whole population as the '
           f'paper states it: pass --total-env-steps '
           f'{(config.env_steps or 0) * n} for {config.env_steps} per member')
    _check(config.warmup_steps * n < config.total_env_steps,
           f'--warmup-steps {config.warmup_steps} per member '
           f'({config.warmup_steps * n} in all) must be below '
           f'--total-env-steps {config.total_env_steps}')
    ratio = config.update_to_data_ratio
    return dataclasses.replace(
        config, env_steps=per_member,
        update_to_data_ratio=float(n) if ratio is None else ratio)

  def initial_hparams(self, key, agent, population_size):
    del key
    # policy_delay 1 (an agent that has one, as TD3): every critic step comes
    # with one policy step per RL member, so both counts are actor_steps
    # (see the class docstring).
    fields = agent.default_hparams()._fields
    every_step = {'policy_delay': 1.0} if 'policy_delay' in fields else {}
    return cem_lib.rl_hparams(population_hparams(
        agent, population_size, **every_step))

  def shared_critic_update(self, agent):
    return cem_lib.with_rl_schedule(agent.shared_critic, self.num_rl)

  def actor_hparams(self, hparams):
    agent = hparams.agent
    return agent._replace(exploration_noise=jnp.full_like(
        agent.exploration_noise, self.config.action_noise))

  def hparam_rows(self, hparams) -> list[dict]:
    return hparam_rows(hparams.agent)

  def _sample_generation(self, key, state):
    flat = cem_lib.sample(key, self.cem_state, self.config.population_size)
    return cem_lib.load_policies(state, flat, self.unravel,
                                 reset={'policy_opt': self.initial_policy_opt})

  def initialize(self, key, state, agent):
    flat, self.unravel = cem_lib.flatten_population(state.policy)
    self.cem_state = cem_lib.init(
        flat[0], initial_var=self.config.initial_variance,
        initial_extra_noise=self.config.initial_extra_noise)
    # The freshly initialised policy optimizer state. Adam's depends only on
    # the parameters' shapes, so it is the fresh state of any sampled policy.
    self.initial_policy_opt = jax.tree.map(jnp.copy, state.policy_opt)
    self.agent = agent
    # Generation 1: actor_steps = 0, and hparams' train_until is 0.
    return self._sample_generation(key, state)

  def _start_evaluation(self, loop: Loop) -> None:
    self.phase = 'eval'
    self.fitness[:] = np.nan
    self.lengths[:] = 0
    # The trained policies go out with the publish that follows this call.
    self.fresh.renew(loop, np.ones(self.fitness.shape, bool))

  def after_call(self, loop: Loop) -> None:
    self.critic_steps = int(loop.state.step)
    if self.phase == 'train':
      if self.critic_steps >= int(np.asarray(loop.hparams.train_until)[0]):
        self._start_evaluation(loop)
      return
    if self.resumed:
      # Versions restart with a resumed run's pipeline, and its first
      # episodes are random warm-up: score from the next publish on.
      self.resumed = False
      self.fresh.renew(loop, np.ones(self.fitness.shape, bool))
      return
    for r in loop.episodes:
      m = int(r['member'])
      # Training episodes: like Algorithm 1's evaluations they go into the
      # replay and the budget (the pipeline's evaluation episodes do not).
      if (not r['evaluation'] and np.isnan(self.fitness[m])
          and self.fresh.keep(r)):
        self.fitness[m] = float(r['episode_return'])
        self.lengths[m] = int(r['episode_length'])
    if np.isnan(self.fitness).any():
      return
    flat, _ = cem_lib.flatten_population(loop.state.policy)
    self.cem_state = cem_lib.update(
        self.cem_state, flat, jnp.asarray(self.fitness, jnp.float32),
        elite_fraction=self.config.elite_fraction,
        noise_decay=self.config.noise_decay,
        noise_limit=self.config.noise_limit)
    self.generation += 1
    mean_return = float(np.mean(evaluate_policy(
        self.agent, self.config.env, self.unravel(self.cem_state.mean),
        self.config.mean_eval_episodes,
        seed=self.config.seed + 10_000 * self.generation)))
    # The run's count: the least member's env steps, times N.
    total_env_steps = loop.env_steps * self.config.population_size
    self.mean_returns.append((self.generation, total_env_steps,
                              self.actor_steps, mean_return))
    with open(os.path.join(loop.run_dir, 'mean_policy.csv'), 'a') as f:
      if f.tell() == 0:
        f.write('generation,total_env_steps,actor_steps,mean_policy_return\n')
      f.write(f'{self.generation},{total_env_steps},{self.actor_steps},'
              f'{mean_return}\n')
    # Algorithm 1, lines 14-17: the next RL actors each train for as many
    # steps as this generation's evaluation episodes took in all.
    self.actor_steps = int(self.lengths.sum())
    self.emit([{'event': 'generation', 'step': loop.update_steps,
                'env_steps': loop.env_steps, 'generation': self.generation,
                'mean_policy_return': mean_return}])
    loop.state = self._sample_generation(loop.next_key(), loop.state)
    loop.hparams = cem_lib.set_train_until(
        loop.hparams, self.critic_steps + self.actor_steps)
    self.phase = 'train'

  def scalars(self) -> dict:
    out = {'generation': self.generation, 'actor_steps': self.actor_steps,
           'critic_steps': self.critic_steps}
    if self.mean_returns:
      out['mean_policy_return'] = self.mean_returns[-1][3]
    return out

  def checkpoint_arrays(self):
    return {'cem': self.cem_state}

  def checkpoint_meta(self) -> dict:
    return {'phase': self.phase, 'generation': self.generation,
            'actor_steps': self.actor_steps,
            'critic_steps': self.critic_steps,
            'mean_returns': self.mean_returns}

  def restore(self, arrays, meta) -> None:
    self.cem_state = cem_lib.CEMState(*[jnp.asarray(x) for x in arrays['cem']])
    self.phase, self.generation = meta['phase'], meta['generation']
    self.actor_steps = meta['actor_steps']
    self.critic_steps = meta['critic_steps']
    # A train phase goes on to its bound (state.step and hparams are
    # restored); an eval phase evaluates the trained policies anew.
    self.resumed = self.phase == 'eval'
    self.fitness = np.full_like(self.fitness, np.nan)
    self.lengths = np.zeros_like(self.lengths)
    self.fresh.restart()
    self.mean_returns = [tuple(x) for x in meta['mean_returns']]

  def summary(self, loop: Loop) -> str:
    del loop
    if not self.mean_returns:
      return 'CEM-RL: no generation finished'
    best = max(r[3] for r in self.mean_returns)
    return (f'CEM-RL: {self.generation} generations, {self.critic_steps} '
            f'critic steps; mean-policy return {self.mean_returns[-1][3]:.1f} '
            f'at the end, best {best:.1f} (mean_policy.csv)')


__all__ = ['CEMRLDriver', 'CEMRLRunConfig', 'DvDDriver', 'DvDRunConfig', 'HyperTrickDriver',
           'HyperTrickRunConfig', 'PBTDriver', 'PBTRunConfig', 'ScheduleDriver']
