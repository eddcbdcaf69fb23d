"""DvD-TD3 (Parker-Holder et al. 2020): a population of TD3 policies with one
shared critic and a diversity term (minus the log-determinant of the members'
action kernel), on one machine.

    fastpbrl dvd                    # small default: Pendulum-v1, 4 members
    fastpbrl dvd --preset paper     # Humanoid-v5, 5 members, as in the 2022 paper
    fastpbrl dvd --lambda-mode schedule --lambda-start 0.5
    # Baseline: shared-critic TD3 without the term (lambda held at 0)
    fastpbrl dvd --lambda-mode schedule --lambda-start 0 --lambda-end 0

Both log rule/mean_pairwise_action_distance (tensorboard), the members'
mean action gap on a fixed batch of states, to compare their diversity.

This is the rule's host-side half (not jittable): ``DvDRunConfig`` (the
flags) and ``DvD`` (lambda between calls, the bandit's rounds, the logged
diversity figure). The pure half, the diversity loss plugged into the
shared-critic update and the lambda bandit and schedule over array state,
is ``fastpbrl.rules.dvd.diversity``, whose docstring has the paper and the
departures.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.config.agent_settings import steps_per_call_of
from fastpbrl.config.bounds import bounded, check_bounds
from fastpbrl.config.derived import as_learner_calls, as_update_steps, resolved
from fastpbrl.config.errors import check
from fastpbrl.config.fields import Derived, RunConfig, rule_fields
from fastpbrl.devices.sharding import whole_value
from fastpbrl.rules.base import (Decision, Observation, Population, Rule,
                                 hparam_rows)
from fastpbrl.rules.common import (check_evaluations_per, check_shared_critic,
                                   evaluations)
from fastpbrl.rules.dvd import bandit as bandit_lib
from fastpbrl.rules.dvd import diversity as dvd_lib
from fastpbrl.rules.registry import register

# Learner calls between two measurements of the logged diversity figure
# (the loop logs rule scalars every 10 calls).
_DIVERSITY_EVERY = 10
# Evaluation returns kept per member in a bandit round: its mean is
# numpy's mean of them, bit for bit, up to this many (the defaults give 5
# or 10); beyond, of their sum (``bandit_lib.round_score``).
_ROUND_CAPACITY = 64
_SCORES = ('mean', 'best')  # --bandit-score


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
  lambda_mode: Literal['bandit', 'schedule'] = 'bandit'
  """How the diversity weight is set: bandit (Thompson sampling over
  --lambda-arms, as in the DvD paper) or schedule (linear from
  --lambda-start to --lambda-end over --lambda-decay-steps update steps, as
  in the 2022 paper)."""
  lambda_arms: tuple[float, ...] = (0.0, 0.5)
  """Bandit: the lambda values to choose from."""
  lambda_start: float = bounded(0.5, ge=0)
  """Schedule: lambda at update step 0."""
  lambda_end: float = bounded(0.0, ge=0)
  """Schedule: lambda after --lambda-decay-steps."""
  lambda_decay_steps: int = bounded(100_000, ge=1)
  """Schedule: env steps per member over which lambda goes from start to
  end (counted in update steps, x --update-to-data-ratio)."""
  bandit_every: Optional[int] = bounded(None, ge=1)
  """Bandit: env steps per member per round (one lambda per round), rounded
  to whole learner calls; a round must hold an evaluation (see
  --eval-every). Default: 5,000, or half of --env-steps below 10,000."""
  bandit_score: Literal['mean', 'best'] = 'mean'
  """Bandit: a round's return, which its reward compares: mean (the
  population mean: each member's mean evaluation return in the round,
  averaged over the members that evaluated; as the DvD authors' code) or best
  (the best evaluation episode in the round)."""
  bandit_reward: Literal['improvement', 'relative-gain'] = 'improvement'
  """Bandit: a round's reward. improvement (the DvD paper's): 1 if its
  return (--bandit-score) beats the best of the previous --bandit-lookback
  rounds, 0 if lower, 0.5 on a tie; relative-gain: 1 if its gain over the
  previous round beats the median gain of the previous --bandit-lookback
  rounds (an experiment: it did not learn better, see
  docs/benchmarks/learning-log.md)."""
  bandit_lookback: int = bounded(5, ge=1)
  """Bandit: previous rounds a round is compared with (--bandit-reward)."""
  bandit_window: int = bounded(50, ge=0, note=' (0: all rounds)')
  """Bandit: the posteriors count only the last this-many rewards (0: all)."""
  bandit_burn_in: int = bounded(5, ge=0)
  """Bandit: the first this-many rounds pick lambda uniformly at random."""
  kernel_sigma: float = bounded(1.0, gt=0)
  """Length scale of the RBF kernel on the members' actions, in action units
  (actions in [-1, 1]): the root-mean-square action gap at which two
  members' kernel entry is exp(-1/2). The squared distance is divided by
  --embedding-states x action dim, so the term is active for any action
  dimension."""
  embedding_states: int = bounded(20, ge=2)
  """States of the shared batch on which members' actions are compared."""
  diversity_states: int = bounded(256, ge=1)
  """States of the logged rule/mean_pairwise_action_distance: a fixed batch
  visited by uniformly random actions from resets seeded by --seed."""

  legacy_intervals: ClassVar[Mapping[str, tuple[str, str]]] = {
      **RunConfig.legacy_intervals,
      'lambda_decay_steps': ('lambda_decay_steps', 'update_steps'),
      'bandit_every': ('bandit_every', 'calls')}
  follows_budget: ClassVar[Mapping[str, Derived]] = {
      **RunConfig.follows_budget, 'bandit_every': Derived(5_000, 2)}


PRESETS = {
    'small': DvDRunConfig(),
    'paper': DvDRunConfig(env='Humanoid-v5', population_size=5,
                          env_steps=2_000_000, warmup_steps=25_000,
                          eval_every=10_000, checkpoint_every=25_000,
                          lambda_mode='schedule', lambda_decay_steps=500_000),
}


class DvDState(NamedTuple):
  """DvD's bookkeeping (host numpy, but the key)."""

  key: jax.Array  # split only to re-initialise diverged members
  lam: np.ndarray  # () float64: the lambda in force
  arm: np.ndarray  # () int64: the bandit's arm in force (-1: schedule)
  calls_in_round: np.ndarray  # () int64: learner calls of the round so far
  bandit: bandit_lib.BanditState  # posteriors' window and generator
  round: bandit_lib.RoundReturns  # the round's evaluation returns, by member
  # [--bandit-lookback + 1] float64: the returns (--bandit-score) of the
  # last rounds that had evaluations, oldest first, NaN where fewer
  # (relative-gain compares with the last --bandit-lookback gains).
  recent_scores: np.ndarray
  # () float64: the last mean pairwise action distance (NaN: none yet in
  # this run or resume).
  diversity: np.ndarray
  # () int64: --bandit-score and --bandit-reward as indices into
  # ``_SCORES`` and ``bandit_lib.BANDIT_REWARDS`` (a resume keeps them).
  bandit_score: np.ndarray
  bandit_reward: np.ndarray


@register
class DvD(Rule):
  """Shared critic and shared replay; lambda set between calls, and the
  members' mean pairwise action distance measured every 10 calls."""

  name = 'dvd'
  help = 'DvD-TD3: shared critic, diversity term, bandit over lambda'
  config_class = DvDRunConfig
  presets = PRESETS
  shared_critic = True
  shared_replay = True
  min_population = 2

  def __init__(self, config: DvDRunConfig):
    # The agent first, as CEM-RL: its other settings may not apply to an
    # agent without a shared critic.
    check_shared_critic('DvD', config)
    config = resolved(config)
    super().__init__(config)
    check(config.lambda_mode in ('bandit', 'schedule'),
          f'--lambda-mode must be bandit or schedule, got {config.lambda_mode!r}')
    check(len(config.lambda_arms) >= 1 and all(
        a >= 0 for a in config.lambda_arms),
          f'--lambda-arms must be one or more values >= 0, got {config.lambda_arms}')
    check_bounds(config, rule_fields(config))  # --lambda-start, --bandit-every...
    check(config.bandit_score in _SCORES,
          f'--bandit-score must be mean or best, got {config.bandit_score!r}')
    check(config.bandit_reward in bandit_lib.BANDIT_REWARDS,
          f'--bandit-reward must be improvement or relative-gain, got '
          f'{config.bandit_reward!r}')
    # A round is whole learner calls: its env steps as the calls hold them.
    self.round_calls = as_learner_calls(config.bandit_every, config)
    if config.lambda_mode == 'bandit':
      check_evaluations_per(
          self.round_calls * steps_per_call_of(config)
          / config.update_to_data_ratio, config, '--bandit-every')
    self.schedule = bandit_lib.PiecewiseLinear(
        ((0, config.lambda_start),
         (as_update_steps(config.lambda_decay_steps, config),
          config.lambda_end)))
    self.bandit = bandit_lib.ThompsonBandit(
        config.lambda_arms, window=config.bandit_window or None,
        burn_in=config.bandit_burn_in)

  def prepare(self, agent) -> None:
    """The compiled distance of the logged diversity figure (from the
    training state and the probe states)."""
    shared = agent.shared_critic
    policy_apply = shared.policy_apply
    self.distance = jax.jit(
        lambda state, states: dvd_lib.mean_pairwise_action_distance(
            jax.vmap(policy_apply, in_axes=(0, None))(
                shared.policy_params(state), states)))

  def shared_critic_update(self, agent):
    return dvd_lib.with_diversity(
        agent.shared_critic, agent.shared_critic.policy_apply,
        self.config.kernel_sigma,
        num_states=self.config.embedding_states)

  def _start(self) -> tuple[bandit_lib.BanditState, int, float]:
    """``(bandit state, arm, lambda)`` of the first round: the bandit's
    first choice, from ``--seed``'s generator (``--lambda-mode bandit``),
    or ``--lambda-start`` and arm -1."""
    bandit = self.bandit.init(np.random.default_rng(self.config.seed))
    if self.config.lambda_mode != 'bandit':
      return bandit, -1, self.config.lambda_start
    return self.bandit.select(bandit)

  def initial_hparams(self, key, agent, population_size):
    _, _, lam = self._start()
    return dvd_lib.dvd_hparams(
        super().initial_hparams(key, agent, population_size), lam)

  def init(self, key, population: Population):
    n = self.config.population_size
    bandit, arm, lam = self._start()
    return DvDState(
        key=key, lam=np.asarray(lam, np.float64),
        arm=np.asarray(arm, np.int64),
        calls_in_round=np.asarray(0, np.int64), bandit=bandit,
        round=bandit_lib.round_returns(n, _ROUND_CAPACITY),
        recent_scores=np.full((self.config.bandit_lookback + 1,), np.nan),
        diversity=np.asarray(np.nan, np.float64),
        bandit_score=np.asarray(_SCORES.index(self.config.bandit_score),
                                np.int64),
        bandit_reward=np.asarray(bandit_lib.BANDIT_REWARDS.index(
            self.config.bandit_reward), np.int64)), population.state

  def actor_hparams(self, hparams):
    return hparams.agent

  def hparam_rows(self, hparams) -> list[dict]:
    rows = hparam_rows(hparams.agent)
    for row, lam in zip(rows, whole_value(hparams.diversity_weight)):
      row['diversity_weight'] = float(lam)
    return rows

  def decide(self, rule_state: DvDState, observation: Observation):
    obs = observation
    if obs.calls % _DIVERSITY_EVERY == 0 and obs.data is not None:
      # The same states every time (the data path's, from --seed): asked
      # anew rather than kept, so the rule state holds no env's shapes.
      probe_states = jnp.asarray(obs.data.random_states(
          self.config.diversity_states, self.config.seed))
      rule_state = rule_state._replace(diversity=np.asarray(
          float(whole_value(self.distance(obs.state, probe_states))),
          np.float64))
    if self.config.lambda_mode == 'schedule':
      lam = self.schedule(obs.update_steps)
    else:
      rule_state = self._record(rule_state, obs)
      rule_state, lam = self._end_of_round(rule_state)
      if lam is None:
        return rule_state, Decision()
    if lam == float(rule_state.lam):
      return rule_state, Decision()
    event = {'event': 'lambda', 'step': obs.update_steps,
             'env_steps': obs.env_steps, 'value': float(lam)}
    return rule_state._replace(lam=np.asarray(lam, np.float64)), Decision(
        hparams=dvd_lib.set_lambda(obs.hparams, lam), events=(event,))

  def _record(self, rule_state: DvDState, obs: Observation) -> DvDState:
    """This call's evaluation returns into the round's."""
    round_ = rule_state.round
    # In the episodes' order: a round ranks members by their first report.
    for r in evaluations(obs.episodes):
      round_ = bandit_lib.record_return(round_, int(r.member),
                                     float(r.episode_return))
    return rule_state._replace(round=round_)

  def _end_of_round(self, rule_state: DvDState
                    ) -> tuple[DvDState, Optional[float]]:
    """Bandit bookkeeping after one call; the next round's lambda when a
    round ends, else None."""
    calls = int(rule_state.calls_in_round) + 1
    if calls < self.round_calls:
      return rule_state._replace(calls_in_round=np.asarray(calls,
                                                           np.int64)), None
    rule_state = rule_state._replace(calls_in_round=np.asarray(0, np.int64))
    score = bandit_lib.round_score(rule_state.round, self.config.bandit_score)
    if score is None:
      return rule_state, None  # no evaluation ended in this round: keep the
                               # arm, no reward
    lookback, recent = self.config.bandit_lookback, rule_state.recent_scores
    # NaN (no round yet) is skipped as the rewards skip any non-finite return.
    if self.config.bandit_reward == 'relative-gain':
      reward = bandit_lib.relative_gain_reward(recent, score)
    else:
      reward = bandit_lib.improvement_reward(recent[-lookback:], score)
    bandit = rule_state.bandit
    if reward is not None:  # None: too few rounds yet to compare with
      bandit = self.bandit.update(bandit, int(rule_state.arm), reward)
    bandit, arm, lam = self.bandit.select(bandit)
    return rule_state._replace(
        bandit=bandit, arm=np.asarray(arm, np.int64),
        recent_scores=np.append(recent[1:], score),
        round=bandit_lib.round_returns(self.config.population_size,
                                    _ROUND_CAPACITY)), lam

  def resumed(self, rule_state: DvDState) -> DvDState:
    """Refuses a checkpoint whose rounds were scored or rewarded otherwise,
    or whose bandit's shapes other settings fixed; the diversity figure is
    measured again."""
    saved_score = _SCORES[int(rule_state.bandit_score)]
    check(saved_score == self.config.bandit_score,
          f'this DvD checkpoint scored bandit rounds with --bandit-score '
          f'{saved_score}; resume it with --bandit-score {saved_score}')
    saved_reward = bandit_lib.BANDIT_REWARDS[int(rule_state.bandit_reward)]
    check(saved_reward == self.config.bandit_reward,
          f'this DvD checkpoint rewarded bandit rounds with --bandit-reward '
          f'{saved_reward}; resume it with --bandit-reward {saved_reward}')
    # A checkpoint is read back in the shapes it was saved with.
    fresh, _ = self.init(rule_state.key, Population(None, None, None, None))
    check(jax.tree.all(jax.tree.map(lambda a, b: np.shape(a) == np.shape(b),
                                    fresh, rule_state)),
          'this DvD checkpoint\'s bandit does not fit --bandit-lookback, '
          '--bandit-window or --lambda-arms as given; resume it with the '
          'values it was written with')
    return rule_state._replace(diversity=np.asarray(np.nan, np.float64))

  def scalars(self, rule_state: DvDState) -> dict:
    out = {'diversity_weight': float(rule_state.lam)}
    if not np.isnan(rule_state.diversity):
      out['mean_pairwise_action_distance'] = float(rule_state.diversity)
    return out

  def summary(self, rule_state: DvDState, run_dir: str) -> str:
    del run_dir
    if self.config.lambda_mode == 'bandit':
      means = ', '.join(f'{a}: {m:.2f}' for a, m in zip(
          self.bandit.arms, self.bandit.means(rule_state.bandit)))
      text = f'DvD bandit posterior mean reward per lambda: {means}'
    else:
      text = f'DvD final lambda: {float(rule_state.lam)}'
    if not np.isnan(rule_state.diversity):
      text += (f'\nDvD mean pairwise action distance (last measured): '
               f'{float(rule_state.diversity):.4f}')
    return text
