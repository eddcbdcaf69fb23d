"""DvD's lambda between learner calls (Parker-Holder et al. 2020): the
Thompson-sampling bandit over a few values and the schedule that can
replace it (host-side, numpy, not jittable). The diversity term that
lambda weighs is ``fastpbrl.rules.dvd.diversity``.

The paper adapts lambda
online with Thompson sampling over a few values, ``{0, 0.5}`` for DvD-TD3,
with a binary reward: did the population's return improve?
``ThompsonBandit`` and ``improvement_reward`` follow the authors'
implementation (``bandits.py`` of their DvD-ES code) where the paper leaves
details open: Beta(1, 1) priors; the first 5 choices uniformly at random;
a round's reward is 1 if its return beats the best of the previous 5
rounds, 0 if it is lower and 1/2 on a tie, and none before there is a
previous round; the posteriors count only the last 50 rewards (the best
lambda changes during training); the return of a round is the population
mean (``round_score``: each member's mean evaluation return in the round,
averaged over the members), as the authors' ES code feeds the mean of the
population's evaluations (``--bandit-score best`` scores a round by its best
evaluation episode instead, which this code did before: on Pendulum-v1 it
kept choosing lambda 0.5 while the population mean fell behind the lambda-0
baseline). Departures: a round is ``--bandit-every`` env steps per member
(rounded to whole learner calls) rather
than one ES iteration; a round is compared with the 5 rounds just before
it (the authors' code compares with the 2nd to 6th rounds before it,
skipping the latest, which looks like an off-by-one) and as soon as one
previous round exists (theirs waits for 5). ``relative_gain_reward``
(``--bandit-reward relative-gain``) is an alternative that was tried and
measured, not the default: it did not learn better
(``docs/benchmarks/learning-log.md``).
``PiecewiseLinear`` is the alternative of Flajolet et al. 2022: a schedule
instead of the bandit. The bandit's state (windowed rewards, its numpy
``PCG64`` generator) and a round's returns are fixed-shape arrays
(``BanditState``, ``RoundReturns``) taken and returned by pure functions,
so a rule's state holds them and a checkpoint stores them.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Optional, Sequence

import numpy as np

from fastpbrl.core.rng import Pcg64State, pcg64_generator, pcg64_state


@dataclasses.dataclass(frozen=True)
class PiecewiseLinear:
  """Host-side lambda schedule through ``(step, value)`` knots, constant
  before the first and after the last: ``PiecewiseLinear(((0, 0.5),
  (300_000, 0.0)))`` anneals the diversity weight from 0.5 to 0."""

  knots: tuple

  def __post_init__(self):
    knots = tuple((float(s), float(v)) for s, v in self.knots)
    if not knots:
      raise ValueError('PiecewiseLinear needs at least one (step, value) knot')
    steps = [s for s, _ in knots]
    if any(b <= a for a, b in zip(steps, steps[1:])):
      raise ValueError(f'PiecewiseLinear knot steps must increase strictly, '
                       f'got {steps}')
    object.__setattr__(self, 'knots', knots)

  def __call__(self, step: float) -> float:
    steps, values = zip(*self.knots)
    return float(np.interp(step, steps, values))


class BanditState(NamedTuple):
  """``ThompsonBandit``'s state: fixed-shape numpy arrays (``A`` arms,
  ``W = max(window, 1)``)."""

  rng: Pcg64State  # the draws' generator
  selections: np.ndarray  # () int64: ``select`` calls so far
  # [A] float64: each arm's Beta parameters before the windowed rewards:
  # the prior, plus every reward when the bandit has no window.
  alpha: np.ndarray
  beta: np.ndarray
  # [W]: the last ``window`` rewards, oldest first: the arm (-1: empty
  # slot) and the reward (NaN). Unwindowed, the one slot stays empty
  # (orbax stores no empty arrays).
  recent_arms: np.ndarray
  recent_rewards: np.ndarray


@dataclasses.dataclass(frozen=True)
class ThompsonBandit:
  """Host-side Beta-Bernoulli Thompson sampling over lambda values: the
  settings; the state is a ``BanditState`` of arrays, which ``select``
  and ``update`` take and return (they change nothing they are given).

  DvD's adaptive lambda (Parker-Holder et al. 2020), with the details of the
  authors' implementation: each arm's posterior is ``Beta(prior + rewards,
  prior + (1 - rewards))`` over the last ``window`` rewards only (the best
  lambda drifts during training, so old evidence is forgotten); the first
  ``burn_in`` choices are uniform, later ones take the arm with the largest
  draw from its posterior. Arms default to DvD-TD3's ``{0, 0.5}``.

  Attributes:
    arms: the lambda values to choose from.
    prior: Beta prior ``(alpha, beta)`` of every arm.
    window: the posteriors count the last this-many rewards (over all
      arms); ``None`` counts every reward.
    burn_in: choices made uniformly at random before Thompson sampling.
  """

  arms: tuple = (0.0, 0.5)
  prior: tuple = (1.0, 1.0)
  window: Optional[int] = 50
  burn_in: int = 5

  def __post_init__(self):
    if len(self.arms) < 1:
      raise ValueError('ThompsonBandit needs at least one arm')
    if not (self.prior[0] > 0 and self.prior[1] > 0):
      raise ValueError(f'Beta prior parameters must be > 0, got {self.prior}')
    if self.window is not None and self.window < 1:
      raise ValueError(f'window must be >= 1 or None, got {self.window}')
    if self.burn_in < 0:
      raise ValueError(f'burn_in must be >= 0, got {self.burn_in}')
    object.__setattr__(self, 'arms', tuple(float(a) for a in self.arms))
    object.__setattr__(self, 'prior', (float(self.prior[0]),
                                       float(self.prior[1])))
    object.__setattr__(self, 'burn_in', int(self.burn_in))

  def init(self, rng: np.random.Generator) -> BanditState:
    """The state of a bandit with no rewards yet, drawing from ``rng``'s
    stream (a ``PCG64`` generator seeded from the run's seed; ``rng``
    itself is not advanced)."""
    num_arms, slots = len(self.arms), self.window or 1
    return BanditState(
        rng=pcg64_state(rng), selections=np.asarray(0, np.int64),
        alpha=np.full((num_arms,), self.prior[0]),
        beta=np.full((num_arms,), self.prior[1]),
        recent_arms=np.full((slots,), -1, np.int64),
        recent_rewards=np.full((slots,), np.nan))

  def posterior(self, state: BanditState) -> tuple[np.ndarray, np.ndarray]:
    """``(alpha, beta)``, ``[A]`` float64: each arm's Beta posterior over
    the windowed rewards (added oldest first)."""
    alpha, beta = state.alpha.copy(), state.beta.copy()
    for arm, reward in zip(state.recent_arms, state.recent_rewards):
      if arm >= 0:
        alpha[arm] += reward
        beta[arm] += 1.0 - reward
    return alpha, beta

  def select(self, state: BanditState) -> tuple[BanditState, int, float]:
    """``(state, arm index, lambda)``: uniform during burn-in, else one
    posterior draw per arm and the largest wins."""
    rng = pcg64_generator(state.rng)
    if state.selections < self.burn_in:
      arm = int(rng.integers(len(self.arms)))
    else:
      arm = int(np.argmax(rng.beta(*self.posterior(state))))
    selections = np.asarray(state.selections + 1, np.int64)
    return state._replace(rng=pcg64_state(rng),
                          selections=selections), arm, self.arms[arm]

  def update(self, state: BanditState, arm: int,
             reward: float) -> BanditState:
    """``state`` with ``reward`` in ``[0, 1]`` (1/2 for a tie) recorded for
    ``arm``; beyond the window the oldest reward is forgotten."""
    if not 0 <= arm < len(self.arms):
      raise ValueError(f'arm must be in [0, {len(self.arms)}), got {arm}')
    if not 0.0 <= reward <= 1.0:
      raise ValueError(f'reward must be in [0, 1], got {reward}')
    if self.window is None:
      alpha, beta = state.alpha.copy(), state.beta.copy()
      alpha[arm] += float(reward)
      beta[arm] += 1.0 - float(reward)
      return state._replace(alpha=alpha, beta=beta)
    return state._replace(
        recent_arms=np.append(state.recent_arms[1:], int(arm)),
        recent_rewards=np.append(state.recent_rewards[1:], float(reward)))

  def history(self, state: BanditState) -> list[tuple[int, float]]:
    """The windowed ``(arm, reward)`` pairs, oldest first (none when the
    bandit has no window: their sums are in ``state.alpha``)."""
    return [(int(a), float(r)) for a, r in zip(state.recent_arms,
                                               state.recent_rewards) if a >= 0]

  def means(self, state: BanditState) -> np.ndarray:
    """Posterior mean reward of each arm."""
    a, b = self.posterior(state)
    return a / (a + b)


class RoundReturns(NamedTuple):
  """The evaluation returns of one bandit round, by member, as fixed-shape
  numpy arrays (``N`` members, at most ``K`` returns kept per member):
  what ``round_score`` needs (``round_returns``, ``record_return``)."""

  # [N, K] float64: each member's returns in the order they came, NaN past
  # its count (and past K: the sums stand in for the mean then).
  returns: np.ndarray
  counts: np.ndarray  # [N] int64: returns recorded per member
  sums: np.ndarray  # [N] float64: their sums, in the order they came
  best: np.ndarray  # [N] float64: the largest (-inf: none)
  # [N] int64: the order in which members first evaluated in the round
  # (0 first; -1: not yet), the order of ``round_score``'s mean.
  first: np.ndarray


def round_returns(population_size: int, capacity: int) -> RoundReturns:
  """An empty round of ``population_size`` members, keeping ``capacity``
  returns per member (``round_score``'s mean is exact up to there)."""
  n = population_size
  return RoundReturns(returns=np.full((n, capacity), np.nan),
                      counts=np.zeros((n,), np.int64),
                      sums=np.zeros((n,), np.float64),
                      best=np.full((n,), -np.inf),
                      first=np.full((n,), -1, np.int64))


def record_return(round_: RoundReturns, member: int,
                  value: float) -> RoundReturns:
  """``round_`` with ``member``'s evaluation return ``value`` added."""
  count = int(round_.counts[member])
  returns, counts = round_.returns, round_.counts.copy()
  sums, best, first = round_.sums.copy(), round_.best.copy(), round_.first
  if count < returns.shape[1]:
    returns = returns.copy()
    returns[member, count] = value
  if count == 0:
    first = first.copy()
    first[member] = int((first >= 0).sum())
  counts[member] += 1
  sums[member] += value
  best[member] = np.maximum(best[member], value)  # NaN wins, as .max()
  return RoundReturns(returns, counts, sums, best, first)


def round_score(round_: RoundReturns, score: str = 'mean') -> Optional[float]:
  """A bandit round's return, from the evaluation returns that ended in it.

  Args:
    round_: the round's returns by member (``record_return``).
    score: ``'mean'``: the mean over members of each member's mean return
      (a member that evaluated more often does not weigh more); ``'best'``:
      the best single episode.

  Returns:
    The round's return; ``None`` when no evaluation ended in the round.
    The means are numpy's of the returns as they came, members in the
    order they first evaluated (the same bits as the means of those
    lists); a member with more than ``K`` returns in the round (see
    ``round_returns``) is averaged from its sum instead, which may differ
    in the last bits (numpy sums 8 or more values pairwise).
  """
  if score not in ('mean', 'best'):
    raise ValueError(f"score must be 'mean' or 'best', got {score!r}")
  members = [int(m) for m in np.argsort(round_.first, kind='stable')
             if round_.first[m] >= 0]
  if not members:
    return None
  if score == 'best':
    return float(max(round_.best[m] for m in members))
  capacity = round_.returns.shape[1]
  means = [round_.returns[m, :round_.counts[m]].mean()
           if round_.counts[m] <= capacity
           else round_.sums[m] / round_.counts[m] for m in members]
  return float(np.mean(means))


def improvement_reward(previous_returns: Sequence[float],
                       current_return: float) -> Optional[float]:
  """A bandit round's reward: did the population's return improve?

  Args:
    previous_returns: the returns of the rounds just before (the rule keeps
      the last 5, as in the authors' code).
    current_return: this round's return.

  Returns:
    1.0 if ``current_return`` beats the best of ``previous_returns``, 0.0 if
    it is lower, 0.5 on a tie; ``None`` (no reward) when there is no
    previous round to compare with.
  """
  previous = [float(r) for r in previous_returns if np.isfinite(r)]
  if not previous:
    return None
  return _compare(current_return, max(previous))


def relative_gain_reward(previous_returns: Sequence[float],
                         current_return: float) -> Optional[float]:
  """A bandit round's reward: did the population gain more than it usually
  does? (``--bandit-reward relative-gain``; the paper's is
  ``improvement_reward``, the default.)

  ``improvement_reward`` asks whether the population improved at all, so
  while it learns steadily every round earns 1 whichever lambda it played,
  and the bandit cannot see what the diversity term costs: on
  HalfCheetah-v5 it held lambda 0.5 for 65-75% of two runs whose members all
  finished below those of lambda 0. Here a round's gain (its return minus
  the previous round's) is compared with the median of the gains of the
  rounds before it: a lambda under which the population gains less than its
  recent pace earns 0, one under which it gains more earns 1, and while the
  arms do equally well each earns 1/2 on average (the slowing pace of a
  learning curve lowers every arm's rewards alike). Measured, it did not
  help: on HalfCheetah-v5 at 50k env steps per member DvD still ended below
  lambda 0 (round-to-round evaluation noise is larger than a lambda's
  effect on one round's gain), and on Pendulum-v1 the population mean fell.

  Args:
    previous_returns: the returns of the rounds just before, oldest first
      (non-finite ones are skipped).
    current_return: this round's return.

  Returns:
    1.0 if this round's gain exceeds the median of the previous gains, 0.0
    if it is lower, 0.5 on a tie; ``None`` (no reward) before two previous
    rounds exist.
  """
  previous = [float(r) for r in previous_returns if np.isfinite(r)]
  if len(previous) < 2:
    return None
  return _compare(current_return - previous[-1],
                  float(np.median(np.diff(previous))))


def _compare(value: float, reference: float) -> float:
  """1 above ``reference``, 0 below, 1/2 on a tie."""
  if value > reference:
    return 1.0
  if value < reference:
    return 0.0
  return 0.5


BANDIT_REWARDS = ('improvement', 'relative-gain')  # --bandit-reward
