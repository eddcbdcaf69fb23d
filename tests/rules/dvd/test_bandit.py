"""DvD's host-side lambda: the schedule, the Thompson bandit over array
state, its rewards and round scores, and the generator state it keeps."""

import collections

import jax
import numpy as np
import pytest

from fastpbrl.core import rng as rng_lib
from fastpbrl.rules.dvd import bandit as bandit_lib
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

def test_piecewise_linear_schedule():
  sched = bandit_lib.PiecewiseLinear(((0, 0.5), (100, 0.0), (200, 0.2)))
  assert sched(-5) == 0.5 and sched(0) == 0.5
  # np.interp in float64: a slope, a product and a sum (rule 1, k = 4).
  assert sched(50) == pytest.approx(0.25, rel=numerics.rounding_rtol(
      4, np.float64))
  assert sched(150) == pytest.approx(0.1, rel=numerics.rounding_rtol(
      4, np.float64)) and sched(1000) == 0.2
  with pytest.raises(ValueError, match='increase'):
    bandit_lib.PiecewiseLinear(((0, 0.5), (0, 0.1)))


def test_thompson_bandit_prefers_the_better_arm():
  # Thompson sampling itself: no burn-in, no window (a stationary bandit).
  bandit = bandit_lib.ThompsonBandit(arms=(0.0, 0.5), window=None, burn_in=0)
  state = bandit.init(np.random.default_rng(0))
  rewards = np.random.default_rng(1)
  success = {0: 0.2, 1: 0.7}
  pulls = np.zeros(2)
  for _ in range(400):
    state, arm, lam = bandit.select(state)
    assert lam == (0.0, 0.5)[arm]
    pulls[arm] += 1
    state = bandit.update(state, arm, float(rewards.uniform() < success[arm]))
  assert pulls[1] > 3 * pulls[0]
  # Statistical: a success rate over pulls[1] draws, sd sqrt(0.7 0.3 /
  # pulls[1]) = 0.024; 5 sd, plus the Beta(1, 1) prior's pull (1 / pulls[1]).
  np.testing.assert_allclose(
      bandit.means(state)[1], 0.7, rtol=0,
      atol=5 * np.sqrt(0.7 * 0.3 / pulls[1]) + 1 / pulls[1])
  # Beta counts: alpha - 1 + beta - 1 = pulls, sums of 0/1 rewards: exact.
  alpha, beta = bandit.posterior(state)
  np.testing.assert_array_equal(alpha + beta - 2, pulls)
  with pytest.raises(ValueError, match='reward'):
    bandit.update(state, 0, 2.0)
  with pytest.raises(ValueError, match='arm'):
    bandit.update(state, 2, 1.0)


def test_bandit_defaults_follow_the_authors_code():
  """Arms {0, 0.5}, Beta(1, 1) priors, 5 uniform choices first, posteriors
  over the last 50 rewards (``bandits.py`` of the authors' DvD-ES code)."""
  bandit = bandit_lib.ThompsonBandit()
  assert bandit.arms == (0.0, 0.5) and bandit.burn_in == 5
  assert bandit.prior == (1.0, 1.0) and bandit.window == 50
  state = bandit.init(np.random.default_rng(0))
  for got in bandit.posterior(state):
    np.testing.assert_array_equal(got, [1.0, 1.0])
  # Window: 100 successes of arm 0, then 50 failures; only the failures
  # remain in the posterior, so arm 0 now looks bad.
  for reward in [1.0] * 100 + [0.0] * 50:
    state = bandit.update(state, 0, reward)
  alpha, beta = bandit.posterior(state)
  np.testing.assert_array_equal(alpha, [1.0, 1.0])
  np.testing.assert_array_equal(beta, [51.0, 1.0])
  assert bandit.history(state) == [(0, 0.0)] * 50
  unwindowed = bandit_lib.ThompsonBandit(window=None)
  other = unwindowed.init(np.random.default_rng(0))
  for reward in [1.0] * 100 + [0.0] * 50:
    other = unwindowed.update(other, 0, reward)
  np.testing.assert_array_equal(unwindowed.posterior(other)[0], [101.0, 1.0])
  # Ties count half.
  state = bandit.update(state, 1, 0.5)
  np.testing.assert_array_equal(bandit.posterior(state)[0], [1.0, 1.5])


def test_bandit_burn_in_picks_uniformly_whatever_the_evidence():
  """During burn-in the arm is uniform even when the posterior is sure; after
  it, Thompson sampling follows the posterior."""
  bandit = bandit_lib.ThompsonBandit(burn_in=5, window=None)
  first, later = [], []
  for seed in range(200):
    state = bandit.init(np.random.default_rng(seed))
    for _ in range(40):
      state = bandit.update(state, 0, 1.0)
      state = bandit.update(state, 1, 0.0)
    for _ in range(5):
      state, arm, _ = bandit.select(state)
      first.append(arm)
    later.append(bandit.select(state)[1])
  # Arm 1 about half the time: 1000 fair picks, sd 0.016; 0.1 is 6 sd.
  assert 0.4 < np.mean(first) < 0.6
  # Then (almost) never: P(Beta(1, 41) > Beta(41, 1)) ~ 1e-24 per pick; 0.02
  # allows 4 of 200.
  assert np.mean(later) < 0.02


def test_bandit_state_copy_continues_identically_and_inputs_stay():
  bandit = bandit_lib.ThompsonBandit(burn_in=2)
  a = bandit.init(np.random.default_rng(3))
  for _ in range(4):
    a, arm, _ = bandit.select(a)
    a = bandit.update(a, arm, 1.0 if arm else 0.0)
  # What a checkpoint keeps: the arrays (tests/rules/dvd/test_rule.py writes
  # them through orbax).
  b = jax.tree.map(np.array, a)
  before = jax.tree.map(np.array, a)
  picks = []
  for state in (a, b):
    got = []
    for _ in range(20):
      state, arm, lam = bandit.select(state)
      state = bandit.update(state, arm, 0.5)
      got.append((arm, lam))
    picks.append(got)
  assert picks[0] == picks[1]
  # select and update returned new states: the one they were given is
  # unchanged (exact: the same arrays).
  jax.tree.map(np.testing.assert_array_equal, a, before)


class _OldThompsonBandit:
  """The bandit as it was before its state became arrays (a numpy
  ``Generator`` and a deque of ``(arm, reward)``): the reference the array
  state must draw exactly like."""

  def __init__(self, rng, arms, window, burn_in):
    self.rng, self.arms, self.burn_in = rng, tuple(arms), burn_in
    self.history = collections.deque(maxlen=window)
    self.selections = 0

  def posterior(self):
    a, b = np.ones(len(self.arms)), np.ones(len(self.arms))
    for arm, reward in self.history:
      a[arm] += reward
      b[arm] += 1.0 - reward
    return a, b

  def select(self):
    if self.selections < self.burn_in:
      arm = int(self.rng.integers(len(self.arms)))
    else:
      arm = int(np.argmax(self.rng.beta(*self.posterior())))
    self.selections += 1
    return arm, self.arms[arm]

  def update(self, arm, reward):
    self.history.append((arm, reward))


@pytest.mark.parametrize('window', [None, 1, 7])
def test_bandit_draws_as_the_numpy_generator_it_was_seeded_from(window):
  """The array state (PCG64's state, buffered 32-bit half included, and
  the windowed rewards) gives the draws of the generator-and-deque bandit
  it replaced, bit for bit, with rewards in [0, 1] of any value."""
  arms = (0.0, 0.25, 0.5)
  bandit = bandit_lib.ThompsonBandit(arms, window=window, burn_in=4)
  state = bandit.init(np.random.default_rng(11))
  old = _OldThompsonBandit(np.random.default_rng(11), arms, window, 4)
  rewards = np.random.default_rng(12)
  for t in range(60):
    state, arm, lam = bandit.select(state)
    assert (arm, lam) == old.select(), t
    reward = float(rewards.choice([0.0, 0.5, 1.0, rewards.uniform()]))
    state = bandit.update(state, arm, reward)
    old.update(arm, reward)
    # The same additions in the same order: exact.
    for got, want in zip(bandit.posterior(state), old.posterior()):
      np.testing.assert_array_equal(got, want)
  assert pcg_draws(state.rng) == pcg_draws(
      rng_lib.pcg64_state(old.rng))


def pcg_draws(rng_state) -> list:
  rng = rng_lib.pcg64_generator(rng_state)
  return [int(rng.integers(2)), float(rng.random()), int(rng.integers(7))]


def test_pcg64_state_continues_the_generator_mid_32_bit_draw():
  rng = np.random.default_rng(5)
  rng.integers(2)  # draws 32 bits of a 64-bit output: the other half waits
  state = rng_lib.pcg64_state(rng)
  assert int(state.has_uint32) == 1
  copy = rng_lib.pcg64_generator(state)
  assert [copy.integers(2) for _ in range(9)] + [copy.random()] == [
      rng.integers(2) for _ in range(9)] + [rng.random()]
  with pytest.raises(ValueError, match='PCG64'):
    rng_lib.pcg64_state(np.random.Generator(np.random.MT19937(0)))


def test_improvement_reward_compares_with_the_best_recent_round():
  # No previous round: nothing to compare with, no reward (a first round
  # does not count as an improvement for whichever arm it played).
  assert bandit_lib.improvement_reward([], 9.0) is None
  assert bandit_lib.improvement_reward([-np.inf], 9.0) is None
  assert bandit_lib.improvement_reward([10.0], 12.0) == 1.0
  assert bandit_lib.improvement_reward([10.0], 9.0) == 0.0
  # Above the last round but below the best of the recent ones: no
  # improvement.
  assert bandit_lib.improvement_reward([1.0, 7.0, 3.0], 6.0) == 0.0
  assert bandit_lib.improvement_reward([1.0, 7.0, 3.0], 7.5) == 1.0
  assert bandit_lib.improvement_reward([1.0, 7.0, 3.0], 7.0) == 0.5


def test_relative_gain_reward_compares_the_gain_with_the_recent_median():
  # Fewer than two previous rounds: no previous gain, no reward.
  assert bandit_lib.relative_gain_reward([], 9.0) is None
  assert bandit_lib.relative_gain_reward([10.0], 12.0) is None
  assert bandit_lib.relative_gain_reward([-np.inf, 10.0], 12.0) is None
  # Previous gains 2, 6, 1 (median 2); this round gains 13 - 9 = 4.
  previous = [0.0, 2.0, 8.0, 9.0]
  assert bandit_lib.relative_gain_reward(previous, 13.0) == 1.0
  assert bandit_lib.relative_gain_reward(previous, 10.0) == 0.0  # gains 1 < 2
  assert bandit_lib.relative_gain_reward(previous, 11.0) == 0.5  # gains 2 = 2
  # A new best that gains less than the usual pace earns 0 (improvement_reward
  # pays it 1): what a lambda costs while the population learns shows.
  assert bandit_lib.improvement_reward(previous, 10.0) == 1.0
  # A fall that is smaller than the usual fall earns 1.
  assert bandit_lib.relative_gain_reward([10.0, 6.0, 3.0], 2.0) == 1.0


def test_relative_gain_reward_is_even_for_arms_that_learn_alike():
  # A concave learning curve with noise, two arms that do not matter: each
  # arm's mean reward is near 1/2.
  rng = np.random.default_rng(0)
  scores = 4000 * (1 - np.exp(-np.arange(400) / 150)) + rng.normal(0, 30, 400)
  arms = rng.integers(2, size=400)
  gain = {0: [], 1: []}
  for t in range(6, 400):
    gain[arms[t]].append(bandit_lib.relative_gain_reward(scores[t - 6:t], scores[t]))
  for arm in (0, 1):
    # Statistical: rewards in [0, 1] with mean 1/2, sd <= 0.5 / sqrt(n) per
    # arm (0.028 measured over 300 seeds); 5 sd.
    assert abs(np.mean(gain[arm]) - 0.5) < 5 * 0.5 / np.sqrt(len(gain[arm]))
  # And an arm that gains 20% less than the other is told apart.
  scores = np.zeros(400)
  for t in range(1, 400):
    scores[t] = scores[t - 1] + (8.0 if arms[t] else 10.0) + rng.normal(0, 1)
  gain = {0: [], 1: []}
  for t in range(6, 400):
    gain[arms[t]].append(bandit_lib.relative_gain_reward(scores[t - 6:t], scores[t]))
  # The means are 0.78 and 0.22, sd 0.028 (measured over 300 seeds): the
  # thresholds are 6 sd away.
  assert np.mean(gain[0]) > 0.6 > 0.4 > np.mean(gain[1])


def _round(returns_by_member: dict, capacity: int = 8) -> bandit_lib.RoundReturns:
  """A round with these returns, recorded member by member in dict order."""
  round_ = bandit_lib.round_returns(4, capacity)
  for member, returns in returns_by_member.items():
    for value in returns:
      round_ = bandit_lib.record_return(round_, member, value)
  return round_


def test_round_score_averages_members_then_population():
  returns = _round({0: [1.0, 3.0], 1: [10.0], 2: []})
  # Member means 2 and 10 (member 2 did not evaluate): mean 6, not the
  # episodes' mean 14 / 3.
  # Means of small integers: exact in float64.
  assert bandit_lib.round_score(returns) == 6.0
  assert bandit_lib.round_score(returns, 'mean') == 6.0
  assert bandit_lib.round_score(returns, 'best') == 10.0
  assert bandit_lib.round_score(_round({})) is None
  assert bandit_lib.round_score(_round({3: []}), 'best') is None
  with pytest.raises(ValueError, match='mean.*best'):
    bandit_lib.round_score(returns, 'median')


def test_round_score_is_numpys_mean_of_the_returns_as_they_came():
  """The same bits as the mean of each member's list of returns, members in
  the order they first evaluated (numpy sums 8 values or more pairwise, so
  a running sum would differ), however they interleave; past the capacity,
  the running sum stands in."""
  rng = np.random.default_rng(0)
  order = [2, 0, 3, 2, 1, 0] + list(rng.integers(4, size=40))
  lists, round_ = {}, bandit_lib.round_returns(4, 16)
  for member in order:
    value = float(rng.normal(-1000, 300))
    lists.setdefault(int(member), []).append(value)
    round_ = bandit_lib.record_return(round_, int(member), value)
  assert list(lists) == [2, 0, 3, 1] and all(
      8 <= len(r) <= 16 for r in lists.values())
  expected = float(np.mean([np.asarray(r, np.float64).mean()
                            for r in lists.values()]))
  # Exact: the same numpy reductions of the same values in the same order.
  assert bandit_lib.round_score(round_) == expected
  assert bandit_lib.round_score(round_, 'best') == max(max(r) for r in lists.values())
  # Capacity 4: means of running sums, equal within rounding (rule 1: the
  # sums of <= 16 terms of one sign, a division, and a mean of 4: k = 22).
  small = _round(lists, capacity=4)
  assert bandit_lib.round_score(small) == pytest.approx(
      expected, rel=numerics.rounding_rtol(22, np.float64))
  assert bandit_lib.round_score(small, 'best') == bandit_lib.round_score(round_, 'best')
  # Recording made new arrays: the round it was given is unchanged.
  empty = bandit_lib.round_returns(4, 4)
  bandit_lib.record_return(empty, 1, 5.0)
  assert int(empty.counts.sum()) == 0 and np.isnan(empty.returns).all()
