"""Population Based Training (Jaderberg et al. 2017), all of it but the
array functions: settings, presets, fitness bookkeeping, readiness, the
decision, lineage events (host-side; the exploit/explore itself is jitted).

    fastpbrl pbt                    # small default: TD3, Pendulum-v1, 4 members
    fastpbrl pbt --preset paper     # the 2022 paper: HalfCheetah-v5, 80 members
    fastpbrl pbt --preset atari     # Nature DQN on ALE/Pong-v5 (pip install -e '.[atari]')
    fastpbrl pbt --resume runs/pbt-td3-...   # continue a killed run
    fastpbrl pbt --rerun-lineage runs/pbt-td3-.../lineage.jsonl --rerun-member 3

The pure half, exploit-and-explore over the stacked state, is
``fastpbrl.rules.pbt.exploit`` (the paper, its equations and every departure
are in that module's docstring). Here: ``PBTRunConfig`` (the flags),
``PBT`` (when members are ready, which episodes score them, what goes to
the lineage) and ``Schedule`` (re-runs one member's schedule from a
lineage file, ``--rerun-lineage``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar, Literal, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.agents import dqn
from fastpbrl.config.bounds import bounded, check_bounds
from fastpbrl.config.derived import as_update_steps, resolved
from fastpbrl.config.errors import ConfigError, as_flag_error, check
from fastpbrl.config.fields import Derived, RunConfig, rule_fields
from fastpbrl.core import search_space as ss
from fastpbrl.devices.sharding import (placed_like, process_zero_value,
                                       whole_value)
from fastpbrl.envs.jax_envs import is_jax_env
from fastpbrl.rules.base import (Decision, Observation, Population, Rule,
                                 RuleOutputs, split_key)
from fastpbrl.rules.common import (check_evaluations_per, evaluation_returns,
                                   search_space_of, validate_space)
from fastpbrl.rules.pbt import exploit as pbt_lib
from fastpbrl.rules.pbt import lineage as lineage_lib
from fastpbrl.rules.pbt import pb2
from fastpbrl.rules.pbt.lineage import LINEAGE
from fastpbrl.rules.registry import register


@dataclasses.dataclass
class PBTRunConfig(RunConfig):
  """PBT (Jaderberg et al. 2017) on top of the shared run settings."""

  ready_after: Optional[int] = bounded(None, ge=0, unit=' env steps')
  """Env steps per member between two exploit/explore decisions, each taken
  for the whole population at once (the 2022 paper: 100,000 update steps on
  HalfCheetah, at one update per env step); each span must hold the start
  of an evaluation (see --eval-every). Counted in update steps, x
  --update-to-data-ratio, so that decisions fall on the same learner calls
  in every run of a seed. Default: 2,500, or a quarter of --env-steps
  below 10,000."""
  eval_every: Optional[int] = None
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); PBT's fitness is their mean. Default: 2,500, or a
  quarter of --env-steps below 10,000."""
  exploit: Literal['truncation', 'tournament', 'ttest'] = 'truncation'
  """Exploit strategy: truncation, tournament (binary tournament) or ttest
  (each member draws another and copies it where that one's evaluation
  returns are higher by Welch's t-test at --significance; Jaderberg et al.'s
  T-test selection)."""
  significance: float = bounded(0.05, gt=0, lt=1)
  """Exploit ttest: the two-sided p-value below which a member copies the
  one it drew, in (0, 1)."""
  fraction: float = bounded(
      0.3, gt=0, le=0.5,
      note=' so that the bottom and top sets do not overlap')
  """Truncation: bottom fraction copies the top fraction, in (0, 0.5]."""
  explore: Literal['perturb', 'resample', 'pb2'] = 'perturb'
  """How a replaced member's hyperparameters are chosen: perturb (the
  parent's, each multiplied by 0.8 or 1.2, or resampled with
  --resample-probability; Jaderberg et al.), resample (every one drawn
  afresh from the distribution the population started from, as the 2022
  paper does, appendix B.1; --resample-probability is then unused) or pb2
  (Population-Based Bandits, Parker-Holder et al. 2020: the continuous
  ones maximise a GP upper confidence bound of the fitness gain, fitted on
  every member's intervals so far, within the search space's bounds;
  categorical ones are perturbed)."""
  resample_probability: float = bounded(0.25, ge=0, le=1)
  """Explore perturb: probability of resampling a hyperparameter from the
  distribution the population started from (see --init-hparams)."""
  reset_optimizers: bool = False
  """Reset the optimizer states of members that copied another."""
  copy_replay: bool = False
  """Also copy the source member's replay data (per-member buffers; not with
  --shared-replay)."""
  min_gap_absolute: float = bounded(0.0, ge=0)
  """Replace a member only if the source's fitness is higher by more than this."""
  min_gap_relative: float = bounded(0.0, ge=0)
  """... and by more than this fraction of the member's |fitness|."""
  no_mutation_before: int = bounded(0, ge=0, unit=' env steps')
  """No exploit/explore before this many env steps per member."""
  fitness_window: int = bounded(10, ge=1)
  """Fitness = mean of a member's last this-many evaluation returns."""
  true_objective: bool = False
  """Use the 'true_objective' the env reports in info at episode end as fitness."""
  init_hparams: Literal['near-defaults', 'prior', 'defaults'] = (
      'near-defaults')
  """Initial hyperparameters: 'near-defaults' (member 0 at the agent's
  published defaults, the others within a factor 1.25 of them), 'prior'
  (sampled from the whole search space, as the 2022 paper does) or
  'defaults' (every member at the defaults). Explore resamples from the
  same region: within a factor 1.25 of the defaults (near-defaults,
  defaults) or the whole search space (prior); perturbations reach the
  whole search space either way."""
  search_space: Optional[str] = None
  """A JSON (or YAML) file of the hyperparameters to search and their priors,
  or the same JSON object inline (format: docs/guides/search-spaces.md;
  example: examples/search_space.json); default: the agent's registered
  space."""
  rerun_lineage: Optional[str] = None
  """A lineage.jsonl of an earlier PBT run: re-run one member's schedule alone."""
  rerun_member: int = 0
  """With --rerun-lineage: the member whose hyperparameter schedule to re-run."""

  legacy_intervals: ClassVar[Mapping[str, tuple[str, str]]] = {
      **RunConfig.legacy_intervals,
      'ready_after': ('ready_after', 'update_steps'),
      'no_mutation_before': ('no_mutation_before', 'update_steps')}
  follows_budget: ClassVar[Mapping[str, Derived]] = {
      **RunConfig.follows_budget,
      'ready_after': Derived(2_500, 4), 'eval_every': Derived(2_500, 4)}


PRESETS = {
    # About 3 minutes on 2 cores: Pendulum-v1's members solve it by about
    # 7,500 env steps.
    'small': PBTRunConfig(env_steps=10_000),
    # The 2022 paper (appendix B.1): 80 members, the bottom 30% replaced
    # every 100,000 update steps by copies of the top 30%, their
    # hyperparameters resampled from the prior they started from.
    'paper': PBTRunConfig(env='HalfCheetah-v5', population_size=80,
                          env_steps=1_000_000, warmup_steps=25_000,
                          ready_after=100_000, eval_every=10_000,
                          checkpoint_every=25_000, explore='resample',
                          init_hparams='prior'),
    # Nature DQN's schedule (Mnih et al. 2015, Extended Data Table 1; see
    # fastpbrl/agents/dqn.py): 50M frames = 12.5M agent steps per member,
    # one update per 4 steps, 50k random steps first, a 100k replay per
    # member (5.3 GiB each); PBT decides every 500k env steps.
    'atari': PBTRunConfig(agent='dqn', env='ALE/Pong-v5', population_size=4,
                          env_steps=12_500_000, **dqn.NATURE_ATARI_RUN,
                          ready_after=500_000, eval_every=125_000,
                          eval_episodes=5, checkpoint_every=100_000),
}


class PBTState(NamedTuple):
  """PBT's bookkeeping (host numpy, but the key)."""

  key: jax.Array
  last_ready: np.ndarray  # [N] int64: update steps at each one's last decision
  # [N, --fitness-window] float64: each member's last fitness values, oldest
  # first, NaN where it has fewer.
  history: np.ndarray
  # [N] bool: an evaluation that started after the member's last decision
  # (``Observation.marked_at``) has come in.
  evaluated: np.ndarray
  started: np.ndarray  # () bool: this run (or resume) took its first call
  lineage_started: np.ndarray  # () bool: the init events are written
  exploits: np.ndarray  # () int64: members replaced so far
  # --explore pb2 (kept, unused, by the other explores): the decisions so
  # far, each member's fitness at its last one (NaN before), and the data,
  # one row per member interval (``pb2.empty_history``).
  decisions: np.ndarray  # () int64
  last_fitness: np.ndarray  # [N] float64
  pb2_rows: np.ndarray  # [pb2.WINDOW, 3 + continuous fields] float64


def _cut_intervals(rule_state: PBTState, members: np.ndarray) -> PBTState:
  """``rule_state`` where ``members`` (``[N]`` bool), replaced between two
  decisions, have no known start of their interval: PB2 leaves out an
  interval whose weights changed halfway."""
  last_fitness = np.array(rule_state.last_fitness, np.float64)
  last_fitness[np.asarray(members, bool)] = np.nan
  return rule_state._replace(last_fitness=last_fitness)


def record(history: np.ndarray, member: int, value: float) -> np.ndarray:
  """``history`` with ``value`` appended to ``member``'s row (the oldest
  dropped)."""
  history = history.copy()
  history[member, :-1] = history[member, 1:]
  history[member, -1] = value
  return history


def fitness_of(history: np.ndarray) -> np.ndarray:
  """``[N]`` float32: the mean of each member's recorded values (NaN for a
  member with none), oldest first, as ``tests/rules/pbt/reference.py``'s
  ``FitnessTracker`` computes it."""
  out = np.full((history.shape[0],), np.nan, np.float64)
  for i, row in enumerate(history):
    values = row[~np.isnan(row)]
    if values.size:
      out[i] = float(np.mean(values))
  return out.astype(np.float32)


def inherit(history: np.ndarray, parent: np.ndarray,
            replaced: np.ndarray) -> np.ndarray:
  """A replaced member runs its parent's weights: it takes over its
  parent's history (as it was before this decision)."""
  out = history.copy()
  out[replaced] = history[parent[replaced]]
  return out


@register
class PBT(Rule):
  """Independent members with per-member replay; PBT between calls.

  The whole population decides at once, as in the 2022 paper ("the entire
  population evolves at intervals of 100,000 update steps"), once every
  due member has been evaluated. Deciding for each member as its
  evaluation comes in would let a member copy one that was itself replaced
  a call earlier, whose fitness is its parent's but whose explored
  hyperparameters nobody has evaluated, and would spend several decisions
  per interval on a small population.
  """

  name = 'pbt'
  help = 'Population Based Training of TD3 / SAC / DQN members'
  config_class = PBTRunConfig
  presets = PRESETS
  min_population = 2
  log_files = (LINEAGE,)
  # 2: PB2's data rows hold each interval's starting fitness.
  state_version = 2

  @classmethod
  def outputs(cls) -> RuleOutputs:
    """Its lineage (``lineage.jsonl``): the table ``load_run(...).lineage``,
    the events, and the schedule behind a member's weights."""
    return super().outputs()._replace(
        tables={'lineage': lineage_lib.lineage_table},
        lineage=lineage_lib.read_run_lineage, schedule=lineage_lib.schedule)

  def __init__(self, config: PBTRunConfig,
               space: Optional[ss.SearchSpace] = None):
    config = resolved(config)
    super().__init__(config)
    check(config.init_hparams in ('near-defaults', 'prior', 'defaults'),
          f'--init-hparams must be near-defaults, prior or defaults, got '
          f'{config.init_hparams!r}')
    check(not (config.copy_replay and config.shared_replay),
          '--copy-replay copies a member\'s own replay, and with '
          '--shared-replay there is only the one all members share: drop '
          'one of them')
    check_bounds(config, rule_fields(config))  # --fraction, --ready-after...
    try:  # PBTConfig checks --exploit (and again the bounds it shares)
      self.pbt_config = pbt_lib.PBTConfig(
          ready_after=as_update_steps(config.ready_after, config),
          exploit=config.exploit,
          significance=config.significance,
          fraction=config.fraction,
          # Resampling every field is perturb's resampling, always taken.
          resample_probability=(1.0 if config.explore == 'resample'
                                else config.resample_probability),
          reset_optimizers=config.reset_optimizers,
          copy_replay=config.copy_replay,
          min_gap_absolute=config.min_gap_absolute,
          min_gap_relative=config.min_gap_relative,
          no_mutation_before=as_update_steps(config.no_mutation_before,
                                             config))
    except ValueError as e:
      raise as_flag_error(e, config) from None
    check(config.ready_after + config.no_mutation_before <= config.env_steps,
          f'--ready-after {config.ready_after} (after --no-mutation-before '
          f'{config.no_mutation_before}) is beyond the budget of '
          f'--env-steps {config.env_steps}: PBT would never exploit; lower '
          'it or raise --env-steps')
    check_evaluations_per(config.ready_after, config, '--ready-after')
    self.space = space or search_space_of(config)
    check(config.explore != 'pb2' or pb2.continuous_fields(self.space),
          f'--explore pb2: the search space ({", ".join(self.space.fields)}) '
          'has no continuous field for its GP to model; use perturb or '
          'resample')
    self.exploit = pbt_lib.CompiledExploitExplore(self.pbt_config, self.space)

  @classmethod
  def from_config(cls, config: PBTRunConfig) -> Rule:
    if not config.rerun_lineage:
      return cls(config)
    # Re-run one member's schedule: a population of one with the run settings.
    try:
      steps = lineage_lib.schedule(config.rerun_lineage, config.rerun_member)
    except (OSError, ValueError, KeyError) as e:
      raise ConfigError(f'--rerun-lineage {config.rerun_lineage} '
                        f'--rerun-member {config.rerun_member}: {e}') from None
    return Schedule(dataclasses.replace(config, population_size=1), steps)

  def multi_process_problem(self, config: PBTRunConfig,
                            where: str) -> Optional[str]:
    # A JAX env's rings are global arrays: a copy between processes is
    # part of the one partitioned program. A host replay holds only its
    # process's members.
    if config.copy_replay and not is_jax_env(config.env):
      return (f'--copy-replay is not supported {where} for a gymnasium env '
              '(a member\'s replay stays in its own process); drop it, or '
              'use a JAX env (--env gymnax:... or brax:...)')
    return None

  def prepare(self, agent) -> None:
    defaults = agent.default_hparams()
    validate_space(self.config, self.space, defaults)
    if self.config.init_hparams != 'prior':
      # Explore resamples from where the population started (Jaderberg et
      # al.: "the originally defined prior distribution"); from the whole
      # prior, each exploit would redraw a quarter of the copy's fields
      # from ranges (noise scales up to 1, learning rates 10x the default)
      # that the near-defaults start exists to avoid.
      self.exploit = pbt_lib.CompiledExploitExplore(
          self.pbt_config, self.space, ss.near(self.space, defaults))

  def initial_hparams(self, key, agent, population_size):
    defaults = agent.default_hparams()
    if self.config.init_hparams == 'defaults':
      return super().initial_hparams(key, agent, population_size)
    if self.config.init_hparams == 'near-defaults':
      return ss.sample_near(key, self.space, defaults, population_size)
    return ss.sample(key, self.space, defaults, population_size)

  def init(self, key, population: Population):
    n = self.config.population_size
    return PBTState(
        key=key, last_ready=np.zeros((n,), np.int64),
        history=np.full((n, self.config.fitness_window), np.nan),
        evaluated=np.zeros((n,), bool), started=np.asarray(False),
        lineage_started=np.asarray(False),
        exploits=np.asarray(0, np.int64), decisions=np.asarray(0, np.int64),
        last_fitness=np.full((n,), np.nan),
        pb2_rows=pb2.empty_history(len(pb2.continuous_fields(
            self.space)))), population.state

  def decide(self, rule_state: PBTState, observation: Observation):
    obs, n = observation, self.config.population_size
    if not rule_state.started:
      # The first call of a run (or of a resume): evaluations that started
      # before it played the policies as they were before any training (or
      # the restore); they score nobody.
      everyone = np.ones((n,), bool)
      logs = self._lineage_start(rule_state, obs)
      return rule_state._replace(
          started=np.asarray(True), lineage_started=np.asarray(True),
          evaluated=np.zeros((n,), bool)), Decision(
              renewed=everyone, mark=everyone, logs=logs)
    rule_state = self._record(rule_state, obs)
    # Members step in lockstep and a copy inherits its parent's step counter,
    # so every member's step count is update_steps.
    steps = np.full((n,), obs.update_steps, np.int64)
    ready = np.asarray(pbt_lib.ready_mask(steps, rule_state.last_ready,
                                          self.pbt_config))
    if not ready.any() or not rule_state.evaluated[ready].all():
      return rule_state, Decision()
    fitness = fitness_of(rule_state.history)
    rule_state, key = split_key(rule_state)
    result = self.exploit(key, obs.state, obs.hparams, fitness, ready,
                          samples=rule_state.history)
    replaced = whole_value(result.replaced)  # gathered over processes
    parent = whole_value(result.parent)
    if self.config.explore == 'pb2':
      rule_state, result = self._pb2(rule_state, obs.hparams, result, fitness,
                                     ready, replaced, parent)
    rule_state = rule_state._replace(
        decisions=np.asarray(rule_state.decisions + 1, np.int64),
        last_fitness=_fitness_after(rule_state.last_fitness, fitness, ready,
                                    parent, replaced))
    events = tuple(lineage_lib.exploit_events(obs.update_steps, result,
                                          obs.hparams, fitness,
                                          env_steps=obs.env_steps))
    evaluated = rule_state.evaluated.copy()
    evaluated[ready] = False  # the next decision waits for new evaluations
    rule_state = rule_state._replace(
        history=inherit(rule_state.history, parent, replaced),
        last_ready=np.where(ready, steps, rule_state.last_ready),
        evaluated=evaluated,
        exploits=np.asarray(rule_state.exploits + replaced.sum(), np.int64))
    return rule_state, Decision(
        state=result.state, hparams=result.hparams, renewed=replaced,
        mark=ready, copy_data=self._copies(parent, replaced), events=events,
        logs=tuple((LINEAGE, e) for e in events))

  def _pb2(self, rule_state: PBTState, hparams, result: pbt_lib.PBTResult,
           fitness: np.ndarray, ready: np.ndarray, replaced: np.ndarray,
           parent: np.ndarray):
    """PB2's explore (``fastpbrl.rules.pbt.pb2``): the intervals that
    just ended join the data; the ``replaced`` members (``[N]`` bool) take
    the GP-UCB choice for the continuous fields at their ``parent``'s
    context, the others keep theirs."""
    fields = pb2.continuous_fields(self.space)
    old = {name: np.asarray(whole_value(getattr(hparams, name)))
           for name in fields}
    change = fitness.astype(np.float64) - rule_state.last_fitness
    x = pb2.encode(self.space, old)
    rows = pb2.append(rule_state.pb2_rows, int(rule_state.decisions),
                      rule_state.last_fitness[ready], x[ready], change[ready])
    rule_state = rule_state._replace(pb2_rows=rows)
    replaced = np.asarray(replaced, bool)
    members = np.flatnonzero(replaced)
    if not members.size:
      return rule_state, result
    rule_state, key = split_key(rule_state)
    seed = int(jax.random.randint(key, (), 0, np.iinfo(np.int32).max))
    # A copy takes its parent's weights, so it is chosen at its parent's
    # context: as in PB2's authors' implementation, the fitness the
    # parent's last interval started from (its fitness now before it has
    # one), inside the data's range (the fitness now is usually above it,
    # where the GP's mean fades to its prior). The kept members' values
    # are pending points of the next interval at their own context.
    # Every process fits the same data; process 0's choice is taken, since
    # the fit's float64 optimizer may round otherwise on another machine.
    context = np.where(np.isfinite(rule_state.last_fitness),
                       rule_state.last_fitness, fitness.astype(np.float64))
    kept = ~replaced & np.isfinite(context)
    chosen = process_zero_value(pb2.explore(
        self.space, rows, int(rule_state.decisions) + 1,
        context[np.asarray(parent)[members]], seed,
        running=pb2.Pending(context[kept], x[kept])))
    return rule_state, result._replace(
        hparams=_with_rows(self.space, result.hparams, members, chosen))

  def _record(self, rule_state: PBTState, obs: Observation) -> PBTState:
    """This call's evaluations into the fitness history; which members an
    evaluation of the policy trained since their last decision reached."""
    n = self.config.population_size
    since = evaluation_returns(obs.episodes, n, since=obs.marked_at)
    evaluated = rule_state.evaluated | np.asarray([len(x) > 0 for x in since])
    field = ('true_objective' if self.config.true_objective
             else 'episode_return')
    history = rule_state.history
    for member, values in enumerate(
        evaluation_returns(obs.episodes, n, field=field)):
      if self.config.true_objective and np.isnan(values).any():
        raise ConfigError(
            f'--true-objective: {self.config.env} reported no '
            "info['true_objective'] at the end of an episode")
      for value in values:
        history = record(history, member, value)
    return rule_state._replace(history=history, evaluated=evaluated)

  def _copies(self, parent: np.ndarray, replaced: np.ndarray):
    """``Decision.copy_data`` for --copy-replay."""
    if not (self.pbt_config.copy_replay and replaced.any()):
      return None
    return np.flatnonzero(replaced), parent[replaced]

  def _lineage_start(self, rule_state: PBTState, obs: Observation) -> tuple:
    """The lineage's init events, once per run (not again on a resume)."""
    if rule_state.lineage_started:
      return ()
    return tuple((LINEAGE, e) for e in lineage_lib.init_events(
        obs.update_steps, obs.hparams, env_steps=obs.env_steps))

  def replace_diverged(self, rule_state: PBTState, observation: Observation,
                       diverged: np.ndarray):
    """Diverged members are replaced at once by copies of good members,
    with perturbed hyperparameters (``pbt.replace_diverged``), and logged
    in the lineage with ``reason: diverged``; if every member diverged,
    they are re-initialised instead (``reset`` events in the lineage: new
    lines of weights)."""
    obs = observation
    if diverged.all():
      rule_state, decision = super().replace_diverged(rule_state, obs,
                                                      diverged)
      logs = self._lineage_start(rule_state, obs) + tuple(
          (LINEAGE, e) for e in lineage_lib.init_events(
              obs.update_steps, obs.hparams, event='reset',
              env_steps=obs.env_steps))
      rule_state = rule_state._replace(lineage_started=np.asarray(True))
      return _cut_intervals(rule_state, diverged), decision._replace(
          logs=decision.logs + logs)
    fitness = fitness_of(rule_state.history)
    rule_state, key = split_key(rule_state)
    result = self.exploit.replace_diverged(key, obs.state, obs.hparams,
                                           fitness, diverged)
    parent = whole_value(result.parent)
    events = tuple(
        {**e, 'reason': 'diverged'} for e in lineage_lib.exploit_events(
            obs.update_steps, result, obs.hparams, fitness, obs.env_steps))
    logs = self._lineage_start(rule_state, obs)
    rule_state = _cut_intervals(rule_state._replace(
        history=inherit(rule_state.history, parent, diverged),
        lineage_started=np.asarray(True)), diverged)
    note = 'replaced by copies of members ' + ', '.join(
        f'{i}<-{parent[i]}' for i in np.flatnonzero(diverged))
    return rule_state, Decision(
        state=result.state, hparams=result.hparams, renewed=diverged,
        copy_data=self._copies(parent, diverged), events=events,
        logs=logs + tuple((LINEAGE, e) for e in events), note=note)

  def resumed(self, rule_state: PBTState) -> PBTState:
    # Versions count from 1 again: the next decision waits for an
    # evaluation of this run's policies.
    return rule_state._replace(started=np.asarray(False))

  def scalars(self, rule_state: PBTState) -> dict:
    fitness = fitness_of(rule_state.history)
    finite = fitness[np.isfinite(fitness)]
    return {'exploits': int(rule_state.exploits),
            'best_fitness': float(finite.max()) if finite.size else None}

  def summary(self, rule_state: PBTState, run_dir: str) -> str:
    return (f'PBT: {int(rule_state.exploits)} exploit/explore replacements; '
            f'lineage in {os.path.join(run_dir, LINEAGE)}')


def _fitness_after(last: np.ndarray, fitness: np.ndarray, ready: np.ndarray,
                   parent: np.ndarray, replaced: np.ndarray) -> np.ndarray:
  """Each member's fitness at the start of its next interval: its own for
  the ready ones, its parent's for a replaced one (it runs those weights)."""
  out = np.where(ready, fitness.astype(np.float64), last)
  out[replaced] = fitness[parent[replaced]]
  return out


def _with_rows(space: ss.SearchSpace, hparams, members: np.ndarray,
               chosen: dict):
  """``hparams`` with ``members``' fields set to ``chosen``'s values, then
  the space's constraint on those members; each array keeps its dtype and
  sharding (over several processes too: every process passes the same
  ``chosen``)."""
  values, rows = {}, None
  for name, new in chosen.items():
    old = getattr(hparams, name)
    full = np.array(whole_value(old))
    full[members] = new.astype(full.dtype)
    values[name] = placed_like(full, old)
    rows = np.isin(np.arange(full.shape[0]), members)
  updated = ss.constrained(space, hparams._replace(**values))
  return jax.tree.map(lambda new, old: jnp.where(
      placed_like(rows, old), new, old), updated, hparams)


class ScheduleState(NamedTuple):
  """``Schedule``'s bookkeeping."""

  key: jax.Array
  applied: np.ndarray  # () int64: the schedule entry in force


class Schedule(Rule):
  """Re-runs one member's hyperparameter schedule alone (population of 1):
  ``fastpbrl pbt --rerun-lineage FILE --rerun-member K``.

  ``schedule`` is ``[(update_step, hparams dict), ...]`` as rebuilt by
  ``fastpbrl.rules.pbt.lineage.schedule`` from a PBT lineage file.
  """

  name = 'pbt-rerun'
  command = 'pbt'
  config_class = PBTRunConfig
  not_resumable = ('a re-run of one member\'s schedule cannot be resumed; '
                   'start the re-run again (--rerun-lineage)')

  def __init__(self, config: PBTRunConfig, schedule: list):
    super().__init__(config)
    check(config.population_size == 1,
          '--population-size must be 1 when re-running one schedule')
    check(len(schedule) > 0, 'the schedule to re-run is empty')
    self.schedule = sorted(schedule, key=lambda e: e[0])

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
    return self._hparams(template, self._entry(0))

  def init(self, key, population: Population):
    return ScheduleState(key=key, applied=np.asarray(self._entry(0),
                                                     np.int64)), population.state

  def decide(self, rule_state: ScheduleState, observation: Observation):
    index = self._entry(observation.update_steps)
    if index == rule_state.applied:
      return rule_state, Decision()
    return rule_state._replace(applied=np.asarray(index, np.int64)), Decision(
        hparams=self._hparams(observation.hparams, index))
