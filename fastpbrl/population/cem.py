"""The cross-entropy method of CEM-RL (Pourchot & Sigaud 2019, "CEM-RL:
Combining evolutionary and gradient-based methods for policy search").

A diagonal Gaussian ``N(mean, diag(var))`` over the flattened policy
parameters (``jax.flatten_util.ravel_pytree``). Each iteration: ``sample`` a
population, let half of it take TD3 steps against the shared critic (the
pipeline's job), evaluate everyone, then ``update`` the distribution from
the elites (sec. 3 of the paper):

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

Everything here is pure JAX; ``elite_fraction``, ``n`` and the shapes are
static, the rest is traced.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from fastpbrl.types import Params, PRNGKey


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
                  fields: tuple = ('policy', 'target_policy')) -> Any:
  """Writes a sampled population into a stacked state (e.g.
  ``SharedTD3State``): each of ``fields`` gets the unravelled ``[N, D]``
  parameters (CEM-RL loads each new actor into both the actor and its
  target). Other fields, optimizer states included, are unchanged. Each
  field gets its own buffers, so the state can be donated to the learner."""
  known = getattr(state, '_fields', ())
  unknown = [f for f in fields if f not in known]
  if unknown:
    raise ValueError(f'fields {unknown} are not in {type(state).__name__} '
                     f'{list(known)}')
  return state._replace(**{f: unflatten_population(flat, unravel)
                           for f in fields})
