"""DvD-TD3's host-side half: its run settings and driver (not jittable).

The pure half, the diversity loss plugged into the shared-critic update and
the lambda bandit and schedule, is ``fastpbrl.population.dvd`` (the paper
and the departures are in that module's docstring). Here: ``DvDRunConfig``
(the ``fastpbrl dvd`` flags) and ``DvDDriver`` (lambda between calls, the
logged diversity figure, the bandit's bookkeeping in the checkpoint).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.population import dvd as dvd_lib
from fastpbrl.rules.common import _check_evaluations_per, _check_shared_critic
from fastpbrl.run import (ConfigError, Driver, Loop, RunConfig, _check,
                          agent_spec, hparam_rows)


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
  bandit_score: str = 'mean'
  """Bandit: a round's return, which its reward compares: mean (the
  population mean: each member's mean evaluation return in the round,
  averaged over the members that evaluated; as the DvD authors' code) or best
  (the best evaluation episode in the round)."""
  bandit_reward: str = 'improvement'
  """Bandit: a round's reward. improvement (the DvD paper's): 1 if its
  return (--bandit-score) beats the best of the previous --bandit-lookback
  rounds, 0 if lower, 0.5 on a tie; relative-gain: 1 if its gain over the
  previous round beats the median gain of the previous --bandit-lookback
  rounds (an experiment: it did not learn better, see
  docs/learning-benchmark.md)."""
  bandit_lookback: int = 5
  """Bandit: previous rounds a round is compared with (--bandit-reward)."""
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
    _check(config.bandit_score in ('mean', 'best'),
           f'--bandit-score must be mean or best, got {config.bandit_score!r}')
    _check(config.bandit_reward in dvd_lib.BANDIT_REWARDS,
           f'--bandit-reward must be improvement or relative-gain, got '
           f'{config.bandit_reward!r}')
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
    # Evaluation returns of the current round, by member.
    self.round_returns: dict[int, list[float]] = {}
    # Returns (--bandit-score) of the last --bandit-lookback + 1 rounds
    # (relative-gain compares with the last --bandit-lookback gains).
    self.recent_scores = []
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
        self.round_returns.setdefault(int(r['member']), []).append(
            float(r['episode_return']))
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
    score = dvd_lib.round_score(self.round_returns, self.config.bandit_score)
    if score is None:
      return None  # no evaluation ended in this round: keep the arm, no reward
    lookback = self.config.bandit_lookback
    if self.config.bandit_reward == 'relative-gain':
      reward = dvd_lib.relative_gain_reward(self.recent_scores, score)
    else:
      reward = dvd_lib.improvement_reward(self.recent_scores[-lookback:], score)
    if reward is not None:  # None: too few rounds yet to compare with
      self.bandit.update(self.arm, reward)
    self.recent_scores = (self.recent_scores + [score])[-(lookback + 1):]
    self.round_returns = {}
    self.arm, lam = self.bandit.select()
    return lam

  def scalars(self) -> dict:
    out = {'diversity_weight': self.lam}
    if self.diversity is not None:
      out['mean_pairwise_action_distance'] = self.diversity
    return out

  def checkpoint_meta(self) -> dict:
    return {'arm': self.arm, 'lam': self.lam,
            'bandit_score': self.config.bandit_score,
            'bandit_reward': self.config.bandit_reward,
            'round_returns': {str(m): r for m, r in self.round_returns.items()},
            'recent_scores': self.recent_scores,
            'calls_in_round': self.calls_in_round,
            'bandit': self.bandit.state()}

  def restore(self, arrays, meta) -> None:
    del arrays
    if 'recent_bests' not in meta and 'recent_scores' not in meta:
      raise ConfigError(
          'this DvD checkpoint predates the scaled kernel and the windowed '
          'lambda bandit (its objective is not the one this code trains); '
          'start a new run instead of --resume')
    # Checkpoints written before --bandit-score scored rounds by their best.
    saved_score = meta.get('bandit_score', 'best')
    if saved_score != self.config.bandit_score:
      raise ConfigError(
          f'this DvD checkpoint scored bandit rounds with --bandit-score '
          f'{saved_score}; resume it with --bandit-score {saved_score}')
    # Checkpoints written before --bandit-reward rewarded improvement.
    saved_reward = meta.get('bandit_reward', 'improvement')
    if saved_reward != self.config.bandit_reward:
      raise ConfigError(
          f'this DvD checkpoint rewarded bandit rounds with --bandit-reward '
          f'{saved_reward}; resume it with --bandit-reward {saved_reward}')
    self.arm, self.lam = meta['arm'], meta['lam']
    if 'recent_scores' in meta:
      self.round_returns = {int(m): [float(x) for x in r]
                            for m, r in meta['round_returns'].items()}
      self.recent_scores = [float(r) for r in meta['recent_scores']]
    else:  # the round's best so far stands in for its returns
      best = meta['round_best']
      self.round_returns = {} if best is None else {0: [float(best)]}
      self.recent_scores = [float(r) for r in meta['recent_bests']]
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
