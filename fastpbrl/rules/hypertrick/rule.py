"""HyperTrick (Heinrich & Frosio): hyperparameter search with early
termination. Configurations train in phases; at each phase's end the late
reporters in the lower quantile are terminated and their slot restarts with
fresh parameters and newly sampled hyperparameters. Ends with the best
configuration found.

    fastpbrl hypertrick                  # small default: TD3, Pendulum-v1
    fastpbrl hypertrick --preset paper   # HalfCheetah-v5, 100 configurations, 8 slots

This is the rule's host-side half (not jittable): ``HyperTrickRunConfig``
(the flags) and ``HyperTrick`` (which slots finished a phase, their reports
in a random order, evicted slots restarted as new experiments). The
scheduler (phases, quantile eviction) over array state and the pure slot
reset are ``fastpbrl.rules.hypertrick.scheduler``, whose docstring has the paper
and the departures.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Mapping, NamedTuple, Optional

import jax
import numpy as np

from fastpbrl.config.bounds import bounded, check_bounds
from fastpbrl.config.derived import (as_update_steps, resolved,
                                     restart_warmup_steps)
from fastpbrl.config.errors import as_flag_error, check
from fastpbrl.config.fields import Derived, RunConfig, rule_fields
from fastpbrl.core import search_space as ss
from fastpbrl.core.rng import Pcg64State, pcg64_generator, pcg64_state
from fastpbrl.rules.base import (Decision, Observation, Population, Rule,
                                 hparam_rows, split_key)
from fastpbrl.rules.common import (check_evaluations_per, evaluation_returns,
                                   search_space_of, validate_space)
from fastpbrl.rules.hypertrick import scheduler as hypertrick_lib
from fastpbrl.rules.registry import register

# A phase's metric: the mean of the slot's last this-many evaluation returns
# in the phase.
RETURNS_WINDOW = 10


@dataclasses.dataclass
class HyperTrickRunConfig(RunConfig):
  """HyperTrick (Heinrich & Frosio): phases with early termination."""

  num_workers: int = bounded(8, ge=1)
  """Configurations to try in total (each runs in a population slot)."""
  num_phases: int = bounded(4, ge=1)
  """Phases per configuration; a configuration reports at each phase's end."""
  phase_env_steps: Optional[int] = bounded(None, ge=1)
  """Env steps per member per phase (counted in the slot's own update
  steps, x --update-to-data-ratio); a phase must hold an evaluation
  (--eval-every). Default: 2,500, or a quarter of --env-steps below
  10,000."""
  eval_every: Optional[int] = None
  """Env steps per member between evaluations (no-noise episodes).
  Default: 1,000, or a tenth of --env-steps below 10,000."""
  eviction_rate: float = 0.25
  """Target fraction of the configurations in a phase terminated at its end."""
  quantile: float = bounded(0.5, gt=0, le=1)
  """A late reporter below this quantile of its phase's metrics is terminated."""
  init_hparams: Literal['prior', 'defaults'] = 'prior'
  """Hyperparameters of every configuration: prior (sampled) or defaults."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the prior the configurations are sampled from,
  or the same JSON object inline (format: docs/guides/search-spaces.md);
  default: the agent's registered space."""

  legacy_intervals: ClassVar[Mapping[str, tuple[str, str]]] = {
      **RunConfig.legacy_intervals,
      'phase_env_steps': ('phase_update_steps', 'update_steps')}
  follows_budget: ClassVar[Mapping[str, Derived]] = {
      **RunConfig.follows_budget,
      'phase_env_steps': Derived(2_500, 4), 'eval_every': Derived(1_000, 10)}


PRESETS = {
    'small': HyperTrickRunConfig(),
    'paper': HyperTrickRunConfig(env='HalfCheetah-v5', population_size=8,
                                 num_workers=100, num_phases=5,
                                 phase_env_steps=100_000,
                                 env_steps=50_000_000, warmup_steps=25_000,
                                 eval_every=10_000, checkpoint_every=25_000),
}

class HyperTrickState(NamedTuple):
  """HyperTrick's bookkeeping (host numpy, but the key); ``N`` slots."""

  key: jax.Array
  scheduler: hypertrick_lib.SchedulerState  # workers, phases, metrics
  # [N] int64: the slot's own update steps when its current phase began.
  phase_start: np.ndarray
  # [N, RETURNS_WINDOW] float64: the slot's last evaluation returns of its
  # current phase, oldest first; only the last min(returns_count,
  # RETURNS_WINDOW) are this phase's.
  returns: np.ndarray
  returns_count: np.ndarray  # [N] int64: evaluation returns in this phase
  rng: Pcg64State  # the report order's generator (PCG64 from --seed)


@register
class HyperTrick(Rule):
  """Independent members; slots report per phase, losers restart afresh."""

  name = 'hypertrick'
  help = 'HyperTrick: phased search with early termination'
  config_class = HyperTrickRunConfig
  presets = PRESETS

  def __init__(self, config: HyperTrickRunConfig,
               space: Optional[ss.SearchSpace] = None):
    config = resolved(config)
    super().__init__(config)
    check(not config.shared_replay,
          '--shared-replay: HyperTrick restarts a slot as a new experiment, '
          'with an empty replay of its own; drop it')
    check_bounds(config, rule_fields(config))  # --num-workers, --quantile...
    self.phase_update_steps = as_update_steps(config.phase_env_steps, config)
    # Env steps a restarted slot spends before its first phase: its warm-up
    # of random actions, as the run's data path has one (none where members
    # learn from their own rollouts).
    self.restart_warmup = restart_warmup_steps(config)
    check_evaluations_per(config.phase_env_steps, config,
                          '--phase-env-steps')
    check(config.init_hparams in ('prior', 'defaults'),
          f'--init-hparams must be prior or defaults, got {config.init_hparams!r}')
    try:
      self.ht_config = hypertrick_lib.HyperTrickConfig(
          num_workers=config.num_workers, num_phases=config.num_phases,
          eviction_rate=config.eviction_rate, quantile=config.quantile)
    except ValueError as e:
      raise as_flag_error(e, config) from None
    self.space = space or search_space_of(config)
    self.fields: tuple = ()  # the agent's hyperparameters (prepare)
    self.reset_slots = None  # the compiled slot reset (prepare)

  def prepare(self, agent) -> None:
    defaults = agent.default_hparams()
    validate_space(self.config, self.space, defaults)
    self.fields = tuple(defaults._fields)
    space = self.space if self.config.init_hparams == 'prior' else None
    self.reset_slots = jax.jit(lambda key, state, hparams, reset:
                               hypertrick_lib.reset_members(
                                   key, state, hparams, reset, agent.init,
                                   space, defaults))

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    if self.config.init_hparams == 'defaults':
      return super().initial_hparams(key, agent, population_size)
    return ss.sample(key, self.space, defaults, population_size)

  def init(self, key, population: Population):
    n = self.config.population_size
    rows = hparam_rows(population.hparams)
    scheduler = hypertrick_lib.start(self.ht_config, n,
                                     len(population.hparams._fields))
    for slot, worker in enumerate(scheduler.slot_worker):
      if worker >= 0:
        scheduler = hypertrick_lib.set_hparams(scheduler, worker,
                                               list(rows[slot].values()))
    return HyperTrickState(
        key=key, scheduler=scheduler, phase_start=np.zeros((n,), np.int64),
        returns=np.full((n, RETURNS_WINDOW), np.nan),
        returns_count=np.zeros((n,), np.int64),
        rng=pcg64_state(np.random.default_rng(self.config.seed))
    ), population.state

  def decide(self, rule_state: HyperTrickState, observation: Observation):
    obs, config = observation, self.config
    returns = rule_state.returns.copy()
    count = rule_state.returns_count.copy()
    for member, values in enumerate(
        evaluation_returns(obs.episodes, config.population_size)):
      for value in values:
        returns[member, :-1] = returns[member, 1:]
        returns[member, -1] = value
        count[member] += 1
    rule_state = rule_state._replace(returns=returns, returns_count=count)
    scheduler = rule_state.scheduler
    # A phase counts the slot's own update steps: a restarted slot takes
    # none while it warms up.
    due = [slot for slot in range(config.population_size)
           if scheduler.slot_worker[slot] >= 0
           and obs.member_update_steps[slot] - rule_state.phase_start[slot]
           >= self.phase_update_steps]
    if not due:
      return rule_state, Decision()
    # Departure from the paper, whose budget is a number of workers: ours is
    # also env steps per member, and a new experiment started when the
    # budget left cannot hold its warm-up and one phase is evaluated
    # untrained at the end (on HalfCheetah-v5 every slot completed its last
    # phase on the budget's last call and was restarted just before the
    # final evaluation). Such a slot keeps its worker and goes on training.
    left = config.env_steps - obs.env_steps
    launch = left >= self.restart_warmup + config.phase_env_steps
    phase_start = rule_state.phase_start.copy()
    reset = np.zeros((config.population_size,), bool)
    # Slots finish phases together here; report in a random order, as the
    # asynchronous workers of the paper would arrive.
    rng = pcg64_generator(rule_state.rng)
    for slot in rng.permutation(due):
      k = min(int(count[slot]), RETURNS_WINDOW)
      metric = (float(np.mean(returns[slot, RETURNS_WINDOW - k:])) if k
                else -np.inf)
      scheduler, report = hypertrick_lib.report(
          self.ht_config, scheduler, int(slot), metric, launch=launch)
      phase_start[slot] = obs.member_update_steps[slot]
      returns[slot], count[slot] = np.nan, 0
      if report.new_worker is not None:
        reset[slot] = True
    rule_state = rule_state._replace(
        scheduler=scheduler, phase_start=phase_start, returns=returns,
        returns_count=count, rng=pcg64_state(rng))
    if not reset.any():
      return rule_state, Decision()
    rule_state, key = split_key(rule_state)
    state, hparams = self.reset_slots(key, obs.state, obs.hparams, reset)
    rows = hparam_rows(hparams)
    for slot in np.flatnonzero(reset):
      scheduler = hypertrick_lib.set_hparams(
          scheduler, scheduler.slot_worker[slot], list(rows[slot].values()))
    events = tuple({'event': 'reset', 'step': obs.update_steps,
                    'env_steps': obs.env_steps, 'member': int(slot),
                    'hparams': rows[slot]} for slot in np.flatnonzero(reset))
    # A new experiment from phase one: an empty replay and its own warm-up
    # (the evicted configuration's data is not reused).
    return rule_state._replace(scheduler=scheduler), Decision(
        state=state, hparams=hparams, restart=reset, renewed=reset,
        events=events)

  def finished(self, rule_state: HyperTrickState) -> bool:
    return hypertrick_lib.done(self.ht_config, rule_state.scheduler)

  def scalars(self, rule_state: HyperTrickState) -> dict:
    return {'workers_launched': int(rule_state.scheduler.launched)}

  def summary(self, rule_state: HyperTrickState, run_dir: str) -> str:
    del run_dir
    scheduler = rule_state.scheduler
    try:
      best = hypertrick_lib.best(scheduler)
    except ValueError:
      return 'HyperTrick: no configuration finished a phase'
    hparams = None if best.hparams is None else dict(zip(
        self.fields or [f'hparam_{i}' for i in range(best.hparams.size)],
        best.hparams.tolist()))
    rates = ', '.join(f'{r:.2f}' for r in hypertrick_lib.eviction_rates(
        self.ht_config, scheduler))
    return (f'HyperTrick: {int(scheduler.launched)} configurations launched; '
            f'eviction rate per phase [{rates}] (target '
            f'{self.ht_config.eviction_rate}); best: configuration '
            f'{best.worker}, mean evaluation return {best.metric:.1f} at the '
            f'end of phase {best.phase}, hyperparameters {hparams}')
