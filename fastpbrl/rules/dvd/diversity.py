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

The lambda schedule and bandit that set lambda between calls are
``fastpbrl.rules.dvd.bandit`` (host-side).

Also here: ``mean_pairwise_action_distance``, the diversity figure that the
DvD rule logs (and that a lambda-0 baseline can be compared on).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from fastpbrl.agents.base import SharedCritic
from fastpbrl.core.types import Params

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
