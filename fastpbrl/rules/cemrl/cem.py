"""CEM-RL (Pourchot & Sigaud 2019, "CEM-RL: Combining evolutionary and
gradient-based methods for policy search", ICLR 2019): its cross-entropy
method and the RL half's shared-critic update.

The cross-entropy method
------------------------

A diagonal Gaussian ``N(mean, diag(var))`` over the flattened policy
parameters (``jax.flatten_util.ravel_pytree``). Each iteration: ``sample`` a
population, let half of it take TD3 steps against the shared critic
(``with_rl_schedule``), evaluate everyone, then ``update`` the distribution
from the elites (sec. 3 of the paper):

* elites: the ``K = floor(elite_fraction * N)`` best members (K_e = N / 2 in
  the paper);
* weights ``w_i ∝ log(1 + K) - log(i)`` for rank ``i = 1..K`` (best first),
  normalised to sum to one;
* ``mean' = sum_i w_i z_i``;
* ``var' = sum_i w_i (z_i - mean)^2 + eps'``, around the OLD ``mean``
  (CEM-RL's choice, which keeps the variance from collapsing onto the new
  mean);
* the extra noise ``eps`` moves geometrically towards a floor:
  ``eps' = tau * eps + (1 - tau) * eps_limit`` with ``tau = 0.95`` and
  ``eps_limit = 1e-5`` (the paper's tau and eps_end; the update rule and its
  order, the UPDATED ``eps'`` being added, are those of the authors'
  released code). It approaches the floor without reaching it, where
  ``max(eps_limit, tau * eps)`` would reach it in finite time.

Departures: the extra noise starts at 1e-2 rather than the paper's 1e-3, as
in Flajolet et al. 2022 (app. B.2, "an increased initial random noise in CEM
from 1e-3 to 1e-2"); the authors' code also divides the variance sum by K,
which the paper's equation does not: we follow the paper.

Sampling is mirrored (antithetic): ``n / 2`` perturbations ``e`` give
``mean + e`` (rows ``0 .. n/2 - 1``) and ``mean - e`` (rows ``n/2 .. n-1``).

The RL half (Algorithm 1, lines 7-13)
-------------------------------------

In Algorithm 1 each of the ``n/2`` RL actors of a generation is a freshly
sampled policy with its own target actor initialised to it; the critic takes
``2 * actor_steps / n`` steps and the actor ``actor_steps`` steps, one RL
actor after the other, where ``actor_steps`` is the number of env steps of
the previous generation's evaluation episodes (0 in the first generation).
The critic thus takes ``actor_steps`` steps per generation in all.

Flajolet et al. 2022 (sec. 4.2, app. B.2) vectorize this: the critic "overall
undergoes the same number of updates but each batch of training data goes
through all of the policy networks in parallel and the critic loss is
averaged over the population". ``with_rl_schedule`` is that update restricted
to the RL members: on an active step the first ``num_rl`` members (the RL
half: rows ``0 .. num_rl - 1``) take one TD3 policy step each and the
shared critic one step, its loss averaged over THOSE members' batches and
target policies only; the other members' policies, optimizer states, keys
and batches take no part. A generation of ``actor_steps`` active steps gives
each RL actor ``actor_steps`` policy steps (with ``policy_update_fraction
= 1``) and the critic ``actor_steps`` steps: Algorithm 1's counts.

Steps are switched on and off by a traced bound (``CEMRLHParams.
train_until``): a step is active while the shared step counter is below it,
so a generation's step count needs no recompilation and need not be a
multiple of the learner's steps per call; inactive steps change nothing
(not even the step counter or the keys). A newly sampled generation also
starts with fresh policy optimizer states (``load_policies(..., reset=...)``),
as the authors' code builds a new Adam optimizer for each RL actor.

Departures of the schedule as ``fastpbrl.rules.cemrl.rule.CEMRL`` runs it on
the asynchronous pipeline (its docstring has the details): besides the
vectorized critic above (with ``policy_update_fraction = 1`` for every
member), the actors never pause, so the env steps collected while the RL half trains,
and in the evaluation phase before and beside the fitness episodes, count
in the budget but not in ``actor_steps`` (the paper collects none); the
rate limiter keeps the learner calling, with every step inactive, while the
population is evaluated; the warm-up is random actions. No rounding:
``train_until`` stops a generation's training mid-call.

Everything here is pure JAX; ``elite_fraction``, ``n``, ``num_rl`` and the
shapes are static, the rest is traced.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fastpbrl.agents.base import SharedCritic
from fastpbrl.core.types import Params, PRNGKey


class CEMState(NamedTuple):
  """A diagonal Gaussian search distribution."""

  mean: jax.Array  # [D] float32, the distribution mean (the "mean policy")
  var: jax.Array  # [D] float32, the diagonal variance
  extra_noise: jax.Array  # float32 scalar, eps added to var at each update


def init(mean: jax.Array | Params, *, initial_var: float = 1e-3,
         initial_extra_noise: float = 1e-2) -> CEMState:
  """A CEM distribution centred on ``mean``.

  Args:
    mean: flat ``[D]`` parameters, or ONE policy's parameter pytree (it is
      flattened with ``ravel_pytree``; keep the ``unravel`` from
      ``flatten_population`` to go back).
    initial_var: initial diagonal variance (CEM-RL's sigma_init, 1e-3).
    initial_extra_noise: initial extra noise eps (1e-2, Flajolet et al.).
  """
  if not initial_var > 0:
    raise ValueError(f'initial_var must be > 0, got {initial_var}')
  if not initial_extra_noise >= 0:
    raise ValueError(f'initial_extra_noise must be >= 0, got '
                     f'{initial_extra_noise}')
  if not (isinstance(mean, jax.Array) and mean.ndim == 1):
    mean = ravel_pytree(mean)[0]
  mean = jnp.asarray(mean, jnp.float32)
  return CEMState(mean=mean, var=jnp.full_like(mean, initial_var),
                  extra_noise=jnp.asarray(initial_extra_noise, jnp.float32))


def sample(key: PRNGKey, cem_state: CEMState, n: int, *,
           mirrored: bool = True) -> jax.Array:
  """Draws ``n`` flat parameter vectors ``[n, D]``.

  With ``mirrored`` (``n`` must be even) row ``i + n/2`` is row ``i``
  reflected through the mean: ``mean + e_i`` and ``mean - e_i``.
  """
  if n < 1:
    raise ValueError(f'n must be >= 1, got {n}')
  std = jnp.sqrt(cem_state.var)
  if not mirrored:
    return cem_state.mean + std * jax.random.normal(
        key, (n,) + cem_state.mean.shape)
  if n % 2:
    raise ValueError(f'mirrored sampling needs an even n, got {n}')
  eps = std * jax.random.normal(key, (n // 2,) + cem_state.mean.shape)
  return cem_state.mean + jnp.concatenate([eps, -eps], axis=0)


def num_elites(population_size: int, elite_fraction: float) -> int:
  """``K = max(1, floor(elite_fraction * N))``."""
  if not 0.0 < elite_fraction <= 1.0:
    raise ValueError(f'elite_fraction must be in (0, 1], got {elite_fraction}')
  return max(1, int(math.floor(elite_fraction * population_size + 1e-9)))


def elite_weights(k: int) -> jax.Array:
  """``[K]`` weights ``w_i ∝ log(1 + K) - log(i)``, ``i = 1..K``, summing to
  one (best member first)."""
  if k < 1:
    raise ValueError(f'number of elites must be >= 1, got {k}')
  ranks = jnp.arange(1, k + 1, dtype=jnp.float32)
  w = jnp.log(1.0 + k) - jnp.log(ranks)
  return w / jnp.sum(w)


def update(cem_state: CEMState, samples: jax.Array, fitness: jax.Array, *,
           elite_fraction: float = 0.5, noise_decay: float = 0.95,
           noise_limit: float = 1e-5) -> CEMState:
  """One CEM-RL distribution update from evaluated ``samples``.

  Args:
    cem_state: the current distribution.
    samples: ``[N, D]`` the population's flat parameters AFTER any RL steps
      (CEM-RL feeds the improved actors back into the distribution).
    fitness: ``[N]`` higher is better; non-finite values rank last.
    elite_fraction: fraction of the population kept as elites (static).
    noise_decay: tau of the extra-noise update.
    noise_limit: floor that the extra noise decays towards.

  Returns:
    The new ``CEMState``: weighted elite mean, variance around the old mean
    plus the decayed extra noise.
  """
  n = samples.shape[0]
  if fitness.shape != (n,):
    raise ValueError(f'fitness must have shape ({n},) to match samples, got '
                     f'{fitness.shape}')
  k = num_elites(n, elite_fraction)
  fitness = jnp.where(jnp.isfinite(fitness), fitness, -jnp.inf)
  order = jnp.argsort(-fitness, stable=True)[:k]  # best first
  elites = samples[order].astype(jnp.float32)
  w = elite_weights(k)
  mean = w @ elites
  extra_noise = (noise_decay * cem_state.extra_noise
                 + (1.0 - noise_decay) * noise_limit)
  var = w @ jnp.square(elites - cem_state.mean) + extra_noise
  return CEMState(mean=mean, var=var, extra_noise=extra_noise)


# ---------------------------------------------------------------------------
# Flat vectors <-> stacked policy pytrees
# ---------------------------------------------------------------------------


def flatten_population(policies: Params) -> tuple[jax.Array, Callable]:
  """``policies`` with ``[N, ...]`` leaves -> ``([N, D] flat, unravel)``.

  ``unravel`` maps ONE flat ``[D]`` vector back to one policy's pytree;
  ``unflatten_population`` applies it over a population.
  """
  one = jax.tree.map(lambda x: x[0], policies)
  _, unravel = ravel_pytree(one)
  flat = jax.vmap(lambda p: ravel_pytree(p)[0])(policies)
  return flat, unravel


def unflatten_population(flat: jax.Array, unravel: Callable) -> Params:
  """``[N, D]`` flat parameters -> a policy pytree with ``[N, ...]`` leaves."""
  return jax.vmap(unravel)(flat)


def load_policies(state: Any, flat: jax.Array, unravel: Callable,
                  fields: tuple = ('policy', 'target_policy'), *,
                  reset: Optional[dict] = None) -> Any:
  """Writes a sampled population into a stacked state (e.g.
  ``SharedTD3State``): each of ``fields`` gets the unravelled ``[N, D]``
  parameters (Algorithm 1 loads each new actor into both the actor and its
  target, line 10).

  Args:
    state: the stacked state (a ``NamedTuple``).
    flat: ``[N, D]`` sampled parameters.
    unravel: one ``[D]`` vector -> one policy (``flatten_population``'s).
    fields: the state's fields that receive the sampled parameters.
    reset: ``{field: fresh value}`` for fields to start afresh, e.g.
      ``{'policy_opt': initial_policy_opt}``: a newly sampled policy gets a
      new optimizer state (the authors' code builds a new Adam optimizer
      for each RL actor). Other fields are unchanged.

  Each field gets its own buffers (``reset`` values are copied), so the
  state can be donated to the learner.
  """
  reset = dict(reset or {})
  known = getattr(state, '_fields', ())
  unknown = [f for f in (*fields, *reset) if f not in known]
  if unknown:
    raise ValueError(f'fields {unknown} are not in {type(state).__name__} '
                     f'{list(known)}')
  for f, fresh in reset.items():
    want = jax.tree.structure(getattr(state, f))
    if jax.tree.structure(fresh) != want:
      raise ValueError(f'reset[{f!r}] has tree structure '
                       f'{jax.tree.structure(fresh)}, expected {want}')
  return state._replace(
      **{f: unflatten_population(flat, unravel) for f in fields},
      **{f: jax.tree.map(jnp.copy, fresh) for f, fresh in reset.items()})


# ---------------------------------------------------------------------------
# The RL half: the shared-critic update on the first num_rl members
# ---------------------------------------------------------------------------


class CEMRLHParams(NamedTuple):
  """Hyperparameters of a CEM-RL population (``with_rl_schedule``)."""

  agent: Any  # the agent's stacked hparams, e.g. TD3HParams with [N] leaves
  train_until: jax.Array  # [N] int32, equal across members: the shared step
  # counter (state.step) at which this generation's RL training stops


def rl_hparams(agent_hparams: Any, train_until: int = 0) -> CEMRLHParams:
  """Wraps stacked agent hyperparameters with a training bound."""
  n = jax.tree.leaves(agent_hparams)[0].shape[0]
  return CEMRLHParams(agent_hparams, jnp.full((n,), train_until, jnp.int32))


def set_train_until(hparams: CEMRLHParams, train_until: int) -> CEMRLHParams:
  """A new training bound for every member (same shape: no recompilation)."""
  return hparams._replace(train_until=jnp.full_like(hparams.train_until,
                                                    train_until))


# Fields of a shared-critic state with a leading population axis.
MEMBER_FIELDS = ('policy', 'target_policy', 'policy_opt', 'key')


def with_rl_schedule(shared: SharedCritic, num_rl: int) -> SharedCritic:
  """The shared-critic update of CEM-RL's RL half, on a traced schedule.

  Args:
    shared: the agent's ``SharedCritic`` (``agent.shared_critic``): a state
      with per-member ``policy``, ``target_policy``, ``policy_opt`` and
      ``key`` and a scalar ``step``.
    num_rl: the RL half's size; the RL members are rows ``0 .. num_rl - 1``
      (with mirrored sampling, the ``mean + e`` half, as in the authors'
      code).

  Returns:
    A ``SharedCritic`` whose ``init``/``update`` take ``CEMRLHParams``. A step
    with ``state.step < train_until`` is ``shared.update`` on the RL members
    alone (their hyperparameters, batches and states; the critic loss is the
    mean over them); any other step returns the state unchanged. Metrics are
    ``[N]``, zero for members and steps that did not train, plus
    ``critic_updated`` (1 on active steps).
  """
  if num_rl < 1:
    raise ValueError(f'num_rl must be >= 1, got {num_rl}')

  def head(tree):
    return jax.tree.map(lambda x: x[:num_rl], tree)

  def build(inner: SharedCritic) -> SharedCritic:
    def init(key, hparams: CEMRLHParams):
      return inner.init(key, hparams.agent)

    def update(state, hparams: CEMRLHParams, batch):
      n = hparams.train_until.shape[0]
      if num_rl > n:
        raise ValueError(f'num_rl {num_rl} exceeds the population size {n}')

      def train(_):
        rl_state = state._replace(**{f: head(getattr(state, f))
                                     for f in MEMBER_FIELDS})
        new, metrics = inner.update(rl_state, head(hparams.agent),
                                    head(batch))
        # The other members' rows are written back untouched.
        new = new._replace(**{f: jax.tree.map(
            lambda old, x: old.at[:num_rl].set(x), getattr(state, f),
            getattr(new, f)) for f in MEMBER_FIELDS})
        metrics = jax.tree.map(
            lambda x: jnp.zeros((n,) + x.shape[1:], x.dtype).at[:num_rl].set(x),
            metrics)
        return new, metrics

      def skip(_):
        shapes = jax.eval_shape(train, None)[1]
        return state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                   shapes)

      active = state.step < hparams.train_until[0]
      # A real cond (no vmap around it): inactive steps cost nothing.
      new, metrics = jax.lax.cond(active, train, skip, None)
      metrics = dict(metrics, critic_updated=jnp.full(
          (n,), active, jnp.float32))
      return new, metrics

    return SharedCritic(
        init=init, update=update, policy_params=inner.policy_params,
        with_policy_loss=lambda extra: build(inner.with_policy_loss(extra)),
        policy_apply=inner.policy_apply)

  return build(shared)
