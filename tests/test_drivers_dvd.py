"""The DvD driver between learner calls: the lambda bandit's rounds and
rewards, the lambda-0 baseline, the logged diversity figure and the
checkpointed bandit state (no pipeline: a stand-in loop)."""

import dataclasses
import json
import types

import jax
import numpy as np
import pytest

from fastpbrl.actors.actor import EpisodeRecord
from fastpbrl.agents import td3
from fastpbrl.drivers import DvDDriver, DvDRunConfig, _probe_states
from fastpbrl.run import ConfigError, make_agent, make_env_spec
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 3


def _config(**overrides) -> DvDRunConfig:
  base = dict(env='Pendulum-v1', population_size=N, hidden_sizes=(8, 8),
              batch_size=4, steps_per_call=10, eval_every=20,
              bandit_every=2, bandit_lookback=2, diversity_states=16)
  return DvDRunConfig(**{**base, **overrides})


def _start(config: DvDRunConfig):
  """Driver, and a stand-in for ``run.Loop`` with a fresh population."""
  driver = DvDDriver(config)
  agent = make_agent(config, make_env_spec(config.env))
  learner = driver.make_learner(agent, 1)
  key = jax.random.PRNGKey(0)
  hparams = driver.initial_hparams(key, agent, N)
  state = driver.initialize(key, learner.init(key, hparams), agent)
  loop = types.SimpleNamespace(calls=0, update_steps=0, env_steps=0, episodes=[],
                               learner=learner, state=state, hparams=hparams)
  return driver, loop, agent


def _call(driver, loop, eval_returns=()):
  """One learner call's worth of bookkeeping, with these evaluations."""
  loop.calls += 1
  loop.update_steps += 10
  loop.episodes = [EpisodeRecord(i % N, float(r), 200, True, 0, 0)
                   for i, r in enumerate(eval_returns)]
  driver.after_call(loop)


def _lam(loop) -> np.ndarray:
  return np.asarray(loop.hparams.diversity_weight)


def test_bandit_rounds_reward_improvement_over_recent_rounds():
  driver, loop, _ = _start(_config(bandit_score='best',
                                   bandit_reward='improvement'))
  np.testing.assert_array_equal(_lam(loop), driver.lam)
  # Round = 2 calls; its return = best evaluation in it. Rounds: 10, 12, 11,
  # 15 -> rewards: none (first round), 1 (12 > 10), 0 (11 < max(10, 12)),
  # 1 (15 > max(12, 11)).
  arms = []
  for best in (10.0, 12.0, 11.0, 15.0):
    arms.append(driver.arm)
    _call(driver, loop, [best - 5.0])
    _call(driver, loop, [best, best - 1.0])
    np.testing.assert_array_equal(_lam(loop), driver.lam)  # new arm applied
    assert driver.lam == driver.config.lambda_arms[driver.arm]
  assert list(driver.bandit.history) == [(arms[1], 1.0), (arms[2], 0.0),
                                         (arms[3], 1.0)]
  # --bandit-lookback 2 rounds are compared; one more is kept (the
  # relative-gain reward needs 2 gains).
  assert driver.recent_scores == [12.0, 11.0, 15.0]
  # A round in which no evaluation ended keeps its arm and earns nothing.
  arm = driver.arm
  _call(driver, loop)
  _call(driver, loop)
  assert driver.arm == arm and len(driver.bandit.history) == 3


def test_bandit_rounds_reward_gains_above_the_recent_median_if_asked():
  assert _config().bandit_reward == 'improvement'  # the paper's, the default
  driver, loop, _ = _start(_config(bandit_score='best',
                                   bandit_reward='relative-gain'))
  # Rounds 10, 12, 11, 15, 16, 19: gains 2, -1, 4, 1, 3. Rewards: none, none
  # (one previous gain is needed), 0 (-1 < 2), 1 (4 > median(2, -1)),
  # 0 (1 < median(-1, 4) with --bandit-lookback 2), 1 (3 > median(4, 1)).
  # improvement would pay rounds 4-6 all 1 (each a new best).
  arms = []
  for best in (10.0, 12.0, 11.0, 15.0, 16.0, 19.0):
    arms.append(driver.arm)
    _call(driver, loop, [best])
    _call(driver, loop, [best - 1.0])
  assert list(driver.bandit.history) == list(zip(arms[2:], [0.0, 1.0, 0.0, 1.0]))
  assert driver.recent_scores == [15.0, 16.0, 19.0]


def _member_call(driver, loop, returns_by_member):
  """One learner call in which these members' evaluations ended."""
  loop.calls += 1
  loop.update_steps += 10
  loop.episodes = [EpisodeRecord(m, float(r), 200, True, 0, 0)
                   for m, rs in returns_by_member.items() for r in rs]
  driver.after_call(loop)


@pytest.mark.parametrize('score, rewards, scores', [
    # Population mean (the default, as the DvD authors' code): member means
    # first, so member 0's two evaluations in round 3 do not weigh double.
    ('mean', [0.0, 1.0], [5.0, 0.0, (7.0 + 4.0) / 2]),
    # Best episode: round 2's best rose although its mean fell.
    ('best', [1.0, 0.0], [10.0, 20.0, 8.0]),
])
def test_bandit_round_return_is_the_population_mean_by_default(
    score, rewards, scores):
  config = _config(bandit_lookback=5, bandit_reward='improvement')
  if score != 'mean':
    config = dataclasses.replace(config, bandit_score=score)
  assert config.bandit_score == score
  driver, loop, _ = _start(config)
  arms = []
  for first, second in (({0: [10.0]}, {1: [0.0]}),
                        ({0: [20.0], 1: [-20.0]}, {}),
                        ({0: [6.0]}, {0: [8.0], 1: [4.0]})):
    arms.append(driver.arm)
    _member_call(driver, loop, first)
    _member_call(driver, loop, second)
  assert driver.recent_scores == scores  # means of small integers: exact
  assert list(driver.bandit.history) == list(zip(arms[1:], rewards))


def test_lambda_zero_baseline_never_applies_the_term():
  driver, loop, _ = _start(_config(lambda_mode='schedule', lambda_start=0.0,
                                   lambda_end=0.0))
  for _ in range(5):
    _call(driver, loop, [1.0])
    np.testing.assert_array_equal(_lam(loop), 0.0)
  assert driver.scalars()['diversity_weight'] == 0.0


def test_logged_diversity_is_the_mean_pairwise_action_distance():
  driver, loop, agent = _start(_config())
  assert 'mean_pairwise_action_distance' not in driver.scalars()
  for _ in range(9):
    _call(driver, loop)
  assert 'mean_pairwise_action_distance' not in driver.scalars()
  _call(driver, loop)  # call 10: measured
  got = driver.scalars()['mean_pairwise_action_distance']
  # By hand: every member's actions on the probe states, all pairs.
  states = _probe_states('Pendulum-v1', 16, seed=0)
  nets = td3.make_networks(agent.env_spec, agent.config)
  policies = loop.learner.policy_params(loop.state)
  acts = [np.asarray(nets.policy.apply(
      jax.tree.map(lambda x, i=i: x[i], policies), states)) for i in range(N)]
  dists = [np.linalg.norm(acts[i] - acts[j], axis=-1).mean()
           for i in range(N) for j in range(N) if i != j]
  # Two programs' actions (in [-1, 1]) differ by rule 1's bound for a forward
  # pass (k = 32), twice per distance; then the means' 24 ops, relative.
  action_atol = 2 * numerics.rounding_rtol(32)
  expected = float(np.mean(dists))
  assert got == pytest.approx(expected, rel=0, abs=action_atol
                              + numerics.rounding_rtol(24) * expected)
  assert got > 0.0
  # Identical members: distance 0.
  loop.state = loop.state._replace(policy=jax.tree.map(
      lambda x: np.broadcast_to(x[:1], x.shape), loop.state.policy))
  for _ in range(10):
    _call(driver, loop)
  # Rows of one vmapped forward pass: at most rule 1's bound, as above.
  assert driver.scalars()['mean_pairwise_action_distance'] == pytest.approx(
      0.0, abs=action_atol)


def test_probe_states_are_fixed_by_env_and_seed():
  a = _probe_states('Pendulum-v1', 300, seed=1)  # crosses an episode end
  np.testing.assert_array_equal(a, _probe_states('Pendulum-v1', 300, seed=1))
  assert a.shape == (300, 3) and a.dtype == np.float32
  assert not np.array_equal(a, _probe_states('Pendulum-v1', 300, seed=2))


def test_checkpointed_bandit_continues_identically():
  driver, loop, _ = _start(_config())
  for best in (3.0, 1.0, 4.0):
    _call(driver, loop, [best])
    _call(driver, loop, [best])
  _call(driver, loop, [9.0])  # mid-round
  meta = json.loads(json.dumps(driver.checkpoint_meta()))
  resumed, loop2, _ = _start(_config())
  resumed.restore({}, meta)
  loop2.hparams = loop.hparams
  for best in (2.0, 8.0, 5.0, 7.0):
    for d, lp in ((driver, loop), (resumed, loop2)):
      _call(d, lp, [best])
  assert resumed.arm == driver.arm and resumed.lam == driver.lam
  assert list(resumed.bandit.history) == list(driver.bandit.history)
  assert resumed.recent_scores == driver.recent_scores
  assert resumed.round_returns == driver.round_returns


def test_checkpoint_that_scored_rounds_by_their_best_resumes_only_so():
  # Written before --bandit-score: the round's best so far, no score mode.
  old = {'arm': 1, 'lam': 0.5, 'round_best': 7.0, 'recent_bests': [3.0, 5.0],
         'calls_in_round': 1,
         'bandit': DvDDriver(_config()).bandit.state()}
  with pytest.raises(ConfigError, match='--bandit-score best'):
    DvDDriver(_config()).restore({}, old)
  # ... and rewarded improvement.
  with pytest.raises(ConfigError, match='--bandit-reward improvement'):
    DvDDriver(_config(bandit_score='best', bandit_reward='relative-gain')
              ).restore({}, old)
  driver = DvDDriver(_config(bandit_score='best'))
  driver.restore({}, old)
  assert driver.recent_scores == [3.0, 5.0]
  assert driver.round_returns == {0: [7.0]}


def test_checkpoint_from_before_the_scaled_kernel_is_refused():
  driver = DvDDriver(_config())
  old = {'arm': 0, 'lam': 0.0, 'round_best': None, 'previous_best': None,
         'calls_in_round': 0, 'bandit': {'alpha': [1, 1], 'beta': [1, 1]}}
  with pytest.raises(ConfigError, match='start a new run'):
    driver.restore({}, old)


@pytest.mark.parametrize('flag, value, message', [
    ('bandit_lookback', 0, '--bandit-lookback must be >= 1'),
    ('bandit_window', -1, '--bandit-window must be >= 0'),
    ('bandit_burn_in', -1, '--bandit-burn-in must be >= 0'),
    ('bandit_score', 'median', '--bandit-score must be mean or best'),
    ('bandit_reward', 'gain', '--bandit-reward must be improvement or '
     'relative-gain'),
    ('diversity_states', 0, '--diversity-states must be >= 1'),
])
def test_bad_bandit_flags_name_the_flag(flag, value, message):
  with pytest.raises(ConfigError, match=message):
    DvDDriver(_config(**{flag: value}))
