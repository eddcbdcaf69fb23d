"""PBT's host-side half: its run settings and driver (not jittable).

The pure half, exploit-and-explore over the stacked state, the fitness
tracker and the lineage file, is ``fastpbrl.population.pbt`` (the paper, its
equations and every departure are in that module's docstring). Here:
``PBTRunConfig`` (the ``fastpbrl pbt`` flags), ``PBTDriver`` (when members
are ready, which episodes score them, what goes to the lineage and the
checkpoint) and ``ScheduleDriver`` (re-runs one member's schedule from a
lineage file, ``fastpbrl pbt --rerun-lineage``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax.numpy as jnp
import numpy as np

from fastpbrl.distributed import whole_value
from fastpbrl.population import pbt as pbt_lib
from fastpbrl.population import search_space as ss
from fastpbrl.rules.common import (FreshEpisodes, _check_evaluations_per,
                                   _search_space, _validate_space)
from fastpbrl.run import (ConfigError, Driver, Loop, RunConfig, _check,
                          as_flag_error)


@dataclasses.dataclass
class PBTRunConfig(RunConfig):
  """PBT (Jaderberg et al. 2017) on top of the shared run settings."""

  ready_after: int = 2_500
  """Update steps between two exploit/explore decisions, each taken for the
  whole population at once (the 2022 paper: 100,000 on HalfCheetah); each
  span must hold the start of an evaluation (see --eval-every)."""
  eval_every: int = 2_500
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); PBT's fitness is their mean."""
  exploit: str = 'truncation'
  """Exploit strategy: truncation or tournament (binary tournament)."""
  fraction: float = 0.3
  """Truncation: bottom fraction copies the top fraction, in (0, 0.5]."""
  resample_probability: float = 0.25
  """Explore: probability of resampling a hyperparameter from the
  distribution the population started from (see --init-hparams)."""
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
  'defaults' (every member at the defaults). Explore resamples from the
  same region: within a factor 1.25 of the defaults (near-defaults,
  defaults) or the whole search space (prior); perturbations reach the
  whole search space either way."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the hyperparameters to search and their priors
  (format: README, "Search space from a file"; example:
  examples/search_space.json); default: the agent's registered space."""


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
    # A member is ready only once an evaluation of the policy it trained
    # since its last decision has come in: ``evaluated_after[i]`` is the
    # param-store version such an evaluation must start after, ``evaluated``
    # whether one has. Update steps alone are not enough: right after the
    # warm-up the rate limiter grants ``ratio x warm-up`` updates at once,
    # so ``--ready-after`` update steps can pass within a few hundred env
    # steps, before any evaluation of a trained policy, and the first
    # exploit would copy members on the noise of untrained policies.
    self.evaluated_after: Optional[np.ndarray] = None
    self.evaluated = np.zeros((config.population_size,), bool)

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    _validate_space(self.config, self.space, defaults)
    if self.config.init_hparams != 'prior':
      # Explore resamples from where the population started (Jaderberg et
      # al.: "the originally defined prior distribution"); from the whole
      # prior, each exploit would redraw a quarter of the copy's fields
      # from ranges (noise scales up to 1, learning rates 10x the default)
      # that the near-defaults start exists to avoid.
      self.exploit = pbt_lib.CompiledExploitExplore(
          self.pbt_config, self.space, ss.near(self.space, defaults))
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
    if self.evaluated_after is None:
      # The first call of a run (or of a resume): evaluations that started
      # before it played the policies as they were before any training (or
      # the restore); they score nobody.
      self.evaluated_after = np.full(self.last_ready.shape,
                                     loop.pipeline.policy_version, np.int64)
      self.fresh.first_version[:] = np.maximum(
          self.fresh.first_version, loop.pipeline.policy_version + 1)
    for r in loop.episodes:
      if r['evaluation'] and self.fresh.keep(r):
        member = int(r['member'])
        if r['start_policy_version'] > self.evaluated_after[member]:
          self.evaluated[member] = True
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
    # The whole population decides at once, as in the 2022 paper ("the
    # entire population evolves at intervals of 100,000 update steps"),
    # once every due member has been evaluated. Deciding for each member as
    # its evaluation comes in would let a member copy one that was itself
    # replaced a call earlier, whose fitness is its parent's but whose
    # explored hyperparameters nobody has evaluated, and would spend
    # several decisions per interval on a small population.
    if not ready.any() or not self.evaluated[ready].all():
      return
    fitness = self.fitness.fitness()
    result = self.exploit(loop.next_key(), loop.state, loop.hparams, fitness,
                          ready)
    replaced = whole_value(result.replaced)  # gathered over processes
    parent = whole_value(result.parent)
    events = pbt_lib.exploit_events(loop.update_steps, result, loop.hparams,
                                    fitness, env_steps=loop.env_steps)
    lineage.write(events)
    self.emit(events)
    self.fitness.on_exploit(parent, replaced)
    self.fresh.renew(loop, replaced)
    self.last_ready = np.where(ready, steps, self.last_ready)
    # The next decision for these members waits for an evaluation that
    # starts after this one (after the new weights, for replaced members).
    self.evaluated[ready] = False
    self.evaluated_after[ready] = loop.pipeline.policy_version
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
    parent = whole_value(result.parent)
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
    self.evaluated_after = None  # versions count from zero again
    self.evaluated[:] = False

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
