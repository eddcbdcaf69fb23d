"""Diversity via Determinants (Parker-Holder et al. 2020, "Effective
Diversity in Population Based Reinforcement Learning", NeurIPS 2020).

**Embedding and kernel.** Member ``i`` is embedded by its actions
on states drawn from the shared replay, the same states for every member:
``phi_i = concat(pi_i(s_1), ..., pi_i(s_B))``, a vector of ``D = B * A``
entries (the paper's action-based embedding; the authors' code calls it
``'a_s'`` and uses 20 states). The population's diversity is the
determinant of the kernel matrix ``K_ij = k(phi_i, phi_j)`` with a squared
exponential kernel. DvD-TD3 adds ``lambda * diversity_loss``, with
``diversity_loss = -log det K``, to the sum of the members' policy losses.

**Kernel scale.** The textbook kernel ``exp(-||phi_i - phi_j||^2 / (2 l^2))``
with a fixed ``l`` vanishes as ``D`` grows: the squared distance is a sum of
``D`` per-entry gaps, 0.2 ``D`` or more between freshly initialised 256x256
policies, so with ``l = 1`` and 20 states the largest off-diagonal entry of
5 members is at most ~1e-4 for 6 actions and ~1e-13 for 17 (1e-21 and 0 on
states of HalfCheetah-v5 and Humanoid-v5): ``K`` is the identity in float32,
the gradient is (exactly) 0 and DvD silently becomes shared-critic TD3. We
divide the squared distance by ``D``:

    K_ij = exp(-msd_ij / (2 sigma^2)),  msd_ij = ||phi_i - phi_j||^2 / D,

i.e. the squared exponential kernel with length scale ``l = sigma sqrt(D)``.
``msd_ij`` is the mean squared gap between two members' actions, so
``sigma`` is a length in action units (policies act in ``[-1, 1]``): two
members whose actions differ by ``sigma`` (root mean square) have
``K_ij = exp(-1/2)``, whatever the number of states or actions. This is
also the authors' choice: their DvD-ES code builds ``K`` with scikit-learn's
``rbf_kernel`` at its default ``gamma = 1 / n_features``, i.e.
``exp(-||phi_i - phi_j||^2 / D)`` (``sigma = 1/sqrt(2)`` here). A per-entry
gap is at most 2, so with the default ``sigma = 1`` every entry stays in
``[exp(-2), 1]``: the term neither vanishes for distant members nor depends
on the action dimension (at initialisation the off-diagonal entries are
between ~0.4 and ~0.99 for 1, 6 or 17 actions, and the gradient of the term
is within two orders of magnitude of the TD3 policy-loss gradient; see the
tests). A median-heuristic length scale would also be active at
initialisation, but it rescales with the population, so the loss would no
longer tell a spread population from a huddled one of the same shape; we
keep a fixed kernel. A shorter one (``sigma = 0.3``, so that the push
relaxes once members act about as far apart as fresh policies do) was
measured on HalfCheetah-v5: the bandit then chose lambda 0 for most of the
run and the members ended no more diverse than with lambda 0
(``docs/benchmarks/learning-log.md``), so the default stays 1.

Departures from the paper:

* ``log det K`` instead of the paper's ``det K``. When members act alike
  ``K`` is near the all-ones matrix, ``det K`` is a product of ``N - 1``
  small eigenvalues and its gradient vanishes with it; the gradient of
  ``log det`` instead grows as members get closer (a log barrier on their
  distances). The 2022 fastpbrl paper's DvD-TD3 (Flajolet et al.) also
  minimises ``-log det K`` (with the unscaled kernel).
* The authors' DvD-ES code standardises each embedding entry across the
  population before the kernel; we do not, since under gradient descent it
  would make the objective blind to the population's spread.
* ``K + jitter I`` (below) keeps the loss and its gradient finite.

Numerics: ``K`` is singular whenever two members act identically (all ones
for a fresh copy), so ``log det`` uses the Cholesky factor of ``K + jitter
I``: the loss is then finite (``-log(N + jitter) - (N - 1) log(jitter)``
for identical members) and so is its gradient (zero there, since
``dK_ij/dphi_i`` vanishes at ``phi_i = phi_j``). Squared distances are
computed from differences, not ``|a|^2 + |b|^2 - 2ab``, so they are never
negative.

**Lambda without recompiling.** ``SharedCritic.with_policy_loss(extra)``
takes ``extra(policies, observations)``, which receives no hyperparameters;
a Python float (or an array captured by a closure) is a trace-time constant,
so changing it would need a new compilation (or, for a closure over a
mutable array, would silently keep the old value). ``with_diversity`` solves
this without touching the agent: it wraps a ``SharedCritic`` into one whose
hyperparameters are ``DvDHParams(agent, diversity_weight)`` and, INSIDE the
traced ``update``, builds ``make_policy_term(policy_apply,
hparams.diversity_weight, sigma)`` and calls
``shared.with_policy_loss(term).update``. Lambda is thus a traced
hyperparameter leaf like any learning rate (``[N]``, all members equal, so
the learner's population-axis checks hold; the term uses the mean) and
``SharedCriticLearner`` compiles once for every lambda schedule or bandit
choice.

**Lambda bandit (host-side, numpy, not jittable).** The paper adapts lambda
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

Also here: ``mean_pairwise_action_distance``, the diversity figure that the
DvD rule logs (and that a lambda-0 baseline can be compared on).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.agents.base import SharedCritic
from fastpbrl.rng import Pcg64State, pcg64_generator, pcg64_state
from fastpbrl.types import Params

# ---------------------------------------------------------------------------
# Pure JAX: kernel and loss
# ---------------------------------------------------------------------------


def pairwise_sq_dists(embeddings: jax.Array) -> jax.Array:
  """``[N, D] -> [N, N]`` squared Euclidean distances (exactly 0 on the
  diagonal, never negative)."""
  diff = embeddings[:, None, :] - embeddings[None, :, :]
  return jnp.sum(jnp.square(diff), axis=-1)


def kernel_matrix(actions: jax.Array, sigma: float | jax.Array) -> jax.Array:
  """DvD's kernel matrix ``K_ij = exp(-||phi_i - phi_j||^2 / (2 sigma^2 D))``.

  Args:
    actions: ``[N, B, A]`` (or any ``[N, ...]``): member ``i``'s actions on
      the shared states, flattened into its embedding ``phi_i`` of ``D``
      entries.
    sigma: length scale in action units, traced or static: the root mean
      square gap between two members' actions at which ``K_ij =
      exp(-1/2)``. Dividing the squared distance by ``D`` (a squared
      exponential kernel of length scale ``sigma * sqrt(D)``) keeps ``K``
      away from the identity for any number of states and actions; see the
      module docstring.

  Returns:
    ``[N, N]`` float32 (float64 for float64 actions), ones on the diagonal.
  """
  phi = actions.reshape(actions.shape[0], -1)
  phi = phi.astype(jnp.promote_types(phi.dtype, jnp.float32))
  mean_sq_dists = pairwise_sq_dists(phi) / phi.shape[1]
  return jnp.exp(-mean_sq_dists / (2.0 * jnp.square(sigma)))


def diversity_loss(actions: jax.Array, sigma: float | jax.Array, *,
                   jitter: float = 1e-4) -> jax.Array:
  """``-log det(K + jitter I)``, DvD's diversity term to minimise.

  Args:
    actions: ``[N, B, A]`` member ``i``'s actions on the SAME ``B`` states.
    sigma: kernel length scale in action units (``kernel_matrix``).
    jitter: added to the diagonal; bounds the loss by ``-N log(jitter)`` and
      keeps the Cholesky factorisation defined for identical members.

  Returns:
    A scalar of the kernel's dtype (``kernel_matrix``).
  """
  k = kernel_matrix(actions, sigma)
  n = k.shape[0]
  chol = jnp.linalg.cholesky(k + jitter * jnp.eye(n, dtype=k.dtype))
  return -2.0 * jnp.sum(jnp.log(jnp.diagonal(chol)))


def mean_pairwise_action_distance(actions: jax.Array) -> jax.Array:
  """Mean over member pairs ``i < j`` and states ``b`` of ``||a_i(s_b) -
  a_j(s_b)||_2``, from ``actions[N, B, A]``: how far apart the members act,
  in action units. Not part of the objective; the DvD rule logs it.
  """
  n = actions.shape[0]
  if n < 2:
    raise ValueError(f'mean_pairwise_action_distance needs >= 2 members, '
                     f'got actions of shape {actions.shape}')
  diff = actions[:, None] - actions[None, :]  # [N, N, B, A]
  # Off-diagonal pairs only (the diagonal is 0; sqrt's gradient there is not
  # needed, this is a metric).
  dist = jnp.sqrt(jnp.sum(jnp.square(diff), axis=-1))  # [N, N, B]
  off = 1.0 - jnp.eye(n, dtype=dist.dtype)
  return jnp.sum(jnp.mean(dist, axis=-1) * off) / (n * (n - 1))


def make_policy_term(policy_apply: Callable[[Params, jax.Array], jax.Array],
                     lam: float | jax.Array, sigma: float | jax.Array, *,
                     num_states: Optional[int] = None,
                     jitter: float = 1e-4
                     ) -> Callable[[Params, jax.Array], jax.Array]:
  """The DvD term for ``SharedCritic.with_policy_loss``.

  Args:
    policy_apply: ``(params, observations[B, ...]) -> actions[B, A]``
      (``td3.make_networks(...).policy.apply``).
    lam: diversity weight. A traced array when called inside a traced update
      (``with_diversity`` does this); a Python float is baked into the
      compiled program.
    sigma: kernel length scale in action units (``kernel_matrix``).
    num_states: embed on the first ``num_states`` states only (default: the
      whole batch). The paper's embedding uses 20.
    jitter: see ``diversity_loss``.

  Returns:
    ``extra(policies[N], observations[N, B, ...]) -> lam * diversity_loss``.
    Every member is embedded on the SAME states, ``observations[0]`` (member
    0's batch, drawn from the shared replay), so the kernel compares actions
    state by state.
  """

  def extra(policies: Params, observations: jax.Array) -> jax.Array:
    states = observations[0]
    if num_states is not None:
      states = states[:num_states]
    actions = jax.vmap(policy_apply, in_axes=(0, None))(policies, states)
    return lam * diversity_loss(actions, sigma, jitter=jitter)

  return extra


class DvDHParams(NamedTuple):
  """Hyperparameters of a DvD population (``with_diversity``)."""

  agent: Any  # the agent's stacked hparams, e.g. TD3HParams with [N] leaves
  diversity_weight: jax.Array  # [N] float32 lambda, equal across members


def dvd_hparams(agent_hparams: Any, lam: float) -> DvDHParams:
  """Wraps stacked agent hyperparameters with a diversity weight ``lam``."""
  n = jax.tree.leaves(agent_hparams)[0].shape[0]
  return DvDHParams(agent_hparams, jnp.full((n,), lam, jnp.float32))


def set_lambda(hparams: DvDHParams, lam: float) -> DvDHParams:
  """A new lambda for every member (same shape: no recompilation)."""
  return hparams._replace(diversity_weight=jnp.full_like(
      hparams.diversity_weight, lam))


def with_diversity(shared: SharedCritic,
                   policy_apply: Callable[[Params, jax.Array], jax.Array],
                   sigma: float, *, num_states: Optional[int] = None,
                   jitter: float = 1e-4) -> SharedCritic:
  """A shared-critic population update with DvD's term and a traced lambda.

  Args:
    shared: the agent's ``SharedCritic`` (``agent.shared_critic``), without
      an extra policy loss.
    policy_apply: the policy network's apply function
      (``shared.policy_apply``).
    sigma, num_states, jitter: see ``make_policy_term``.

  Returns:
    A ``SharedCritic`` whose ``init``/``update`` take ``DvDHParams``; its
    ``with_policy_loss`` adds a further term on top of DvD's.
  """

  def build(extra_other):
    def init(key, hparams: DvDHParams):
      return shared.init(key, hparams.agent)

    def update(state, hparams: DvDHParams, batch):
      lam = jnp.mean(hparams.diversity_weight)  # a traced scalar
      term = make_policy_term(policy_apply, lam, sigma,
                              num_states=num_states, jitter=jitter)
      if extra_other is not None:
        dvd_term = term
        term = lambda p, o: dvd_term(p, o) + extra_other(p, o)
      return shared.with_policy_loss(term).update(state, hparams.agent, batch)

    return SharedCritic(init=init, update=update,
                        policy_params=shared.policy_params,
                        with_policy_loss=build,
                        policy_apply=shared.policy_apply)

  return build(None)


# ---------------------------------------------------------------------------
# Host-side: lambda schedule and bandit (numpy; not jittable)
# ---------------------------------------------------------------------------


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
