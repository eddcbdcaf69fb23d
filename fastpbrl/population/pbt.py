"""Population Based Training (Jaderberg et al. 2017, "Population Based
Training of Neural Networks") over a stacked population.

The rule itself is one pure, jittable function, ``exploit_explore``: members
that are *ready* (trained ``ready_after`` steps since they were last ready)
and rank poorly **exploit** a better member, copying its WHOLE training state
(online and target networks, optimizer states, SAC's temperature, the step
counter, every leaf of the state pytree) and its hyperparameters with
``jnp.take(x, parent, axis=0)`` + ``jnp.where(replaced, ...)``, then
**explore** by perturbing the copied hyperparameters
(``search_space.perturb``). Values are traced; only the configuration, the
search space and the shapes are static, so changing fitness, readiness or
hyperparameter values never recompiles.

Exploit strategies (sec. 4.1.1 and 4.3 of the paper):

* ``'truncation'``: rank all members by fitness; a ready member in the bottom
  ``fraction`` copies a member drawn uniformly from the top ``fraction``.
  The paper uses 20%; the 2022 paper's PBT study (Flajolet et al., app. B.1)
  uses 30%, our default.
* ``'tournament'`` (binary tournament): each ready member picks another
  member uniformly at random and copies it if that one is better.
* ``'ttest'`` (T-test selection, the first of the paper's two exploits for
  RL, sec. 4.1.1): each ready member picks another member uniformly at
  random and copies it if that one's fitness (the mean of its samples) is
  higher and Welch's t-test on the two members' samples gives a
  two-sided p-value below ``significance``; the min-gap guards below
  apply too. The paper compares the last 10 episodic rewards and states
  no level; the rule passes each member's last ``--fitness-window`` (10)
  evaluation returns, and 0.05 is ours. Where a window holds episodes of
  two policy versions (one before and one after the last decision) the
  samples are not identically distributed, which makes the test more
  conservative; the paper's training episodes span versions too. A pair
  in which either member has fewer than two returns is never tested
  (its spread is unknown), so neither copies the other; two sets without
  spread differ with p = 0 when their means differ.

Departures and additions:

* Copies are simultaneous: every copy reads the population as it was before
  the call, so a member that is itself replaced in the same call still hands
  on its old state.
* Replacement guards from Sample Factory's PBT (``pbt_replace_reward_gap``,
  ``..._absolute``): a member is replaced only if the source beats it by more
  than ``min_gap_absolute`` and by more than ``min_gap_relative * |fitness|``.
* A copied member gets a fresh PRNG key (derived from the parent's key and
  the rule's key), so that it does not replay its parent's randomness.
* Optionally, replaced members' optimizer states are reset.
* Explore may resample from a narrower distribution than the search space
  (``resample_space``): the rule passes the region the population started
  from (``search_space.near`` around the defaults for ``--init-hparams
  near-defaults``), reading the paper's "resampled from the originally
  defined prior distribution" as the initial one; perturbations still
  reach the whole space.
* The rule (``fastpbrl.rules.pbt``) decides for the whole population at
  once, as the 2022 paper does ("the entire population evolves at
  intervals of 100,000 update steps"), once every member has been
  evaluated since the last decision; Jaderberg et al.'s members decide
  asynchronously, each when it is ready. ``ready`` still takes any mask.

The rest of this module is **host-side** bookkeeping, not jittable: a fitness
tracker (mean of the last 10 evaluation returns, as in the 2022 paper, or a
user-given "true objective") and the ``Lineage`` recorder, which appends every
exploit/explore event to a JSONL file and rebuilds one member's
hyperparameter schedule from it.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import json
import math
import os
from typing import Any, Callable, Iterable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl import search_space as ss
from fastpbrl.sharding import whole_value
from fastpbrl.types import PRNGKey

State = Any  # a NamedTuple training state with [N] leaves
HParams = Any  # a NamedTuple of [N] hyperparameter arrays

_EXPLOITS = ('truncation', 'tournament', 'ttest')


@dataclasses.dataclass(frozen=True)
class PBTConfig:
  """Static PBT settings (hashable: a static argument of ``jax.jit``)."""

  ready_after: int = 100_000
  """Update steps a member trains between two exploit/explore decisions
  (2022 paper: the population evolves every 1e5 update steps)."""
  exploit: str = 'truncation'
  """``'truncation'``, ``'tournament'`` (binary tournament) or ``'ttest'``
  (T-test selection)."""
  significance: float = 0.05
  """``'ttest'``: copy only where Welch's two-sided p-value is below this,
  in (0, 1)."""
  fraction: float = 0.3
  """Truncation: bottom and top fraction of the population, in (0, 0.5]."""
  resample_probability: float = 0.25
  """Explore: probability of resampling a field from the prior instead of
  perturbing it."""
  perturb_factors: tuple = (0.8, 1.2)
  """Explore: multiplicative factors for continuous hyperparameters."""
  reset_optimizers: bool = False
  """Reset replaced members' optimizer states (see ``optimizer_fields``)."""
  optimizer_fields: Optional[tuple] = None
  """State fields holding optimizer states; ``None`` means every field whose
  name ends in ``_opt`` (``TD3State.policy_opt``, ``SACState.alpha_opt``)."""
  optimizer_reset: Optional[Callable[[Any], Any]] = None
  """``opt_state -> fresh opt_state`` for ONE field of the stacked state;
  ``None`` means ``zeros_like`` on every leaf, which is exactly a fresh state
  for count/moment optimizers (Adam: count 0, mu 0, nu 0; SGD momentum;
  RMSProp) but NOT for states that hold hyperparameters
  (``optax.inject_hyperparams``): give a function for those."""
  key_fields: tuple = ('key',)
  """State fields holding PRNG keys, re-derived for copied members."""
  copy_replay: bool = False
  """Carried for the pipeline: also copy the parent's replay buffer into the
  replaced member's (the rule itself never touches replay)."""
  min_gap_absolute: float = 0.0
  """Replace only if the source is better by more than this."""
  min_gap_relative: float = 0.0
  """Replace only if the source is better by more than this times
  ``|fitness|`` of the member to replace."""
  no_mutation_before: int = 0
  """No member is ready before this many update steps (lets the initial
  population diversify; Sample Factory's ``pbt_start_mutation``)."""

  def __post_init__(self):
    object.__setattr__(self, 'perturb_factors', tuple(self.perturb_factors))
    if self.optimizer_fields is not None:
      object.__setattr__(self, 'optimizer_fields', tuple(self.optimizer_fields))
    object.__setattr__(self, 'key_fields', tuple(self.key_fields))
    if self.exploit not in _EXPLOITS:
      raise ValueError(f'exploit must be one of {_EXPLOITS}, got '
                       f'{self.exploit!r}')
    if not 0.0 < self.significance < 1.0:
      raise ValueError(f'significance must be in (0, 1), got '
                       f'{self.significance}')
    if not 0.0 < self.fraction <= 0.5:
      raise ValueError(f'fraction must be in (0, 0.5] so that the bottom and '
                       f'top sets do not overlap, got {self.fraction}')
    ss.check_perturb_args(self.perturb_factors, self.resample_probability)
    if self.ready_after < 0:
      raise ValueError(f'ready_after must be >= 0, got {self.ready_after}')
    if self.no_mutation_before < 0:
      raise ValueError(f'no_mutation_before must be >= 0, got '
                       f'{self.no_mutation_before}')
    for name in ('min_gap_absolute', 'min_gap_relative'):
      value = getattr(self, name)
      if not (math.isfinite(value) and value >= 0):
        raise ValueError(f'{name} must be a finite number >= 0, got {value}')


class PBTResult(NamedTuple):
  """What ``exploit_explore`` returns (unpacks as a 4-tuple)."""

  state: State  # the new stacked training state
  hparams: HParams  # the new stacked hyperparameters
  parent: jax.Array  # [N] int32, whose state member i now holds (i if kept)
  replaced: jax.Array  # [N] bool, members that exploited and explored


def num_truncated(population_size: int, fraction: float) -> int:
  """Size of the bottom (and top) set of truncation selection:
  ``floor(fraction * N)``, at least 1 when ``N >= 2``."""
  if population_size < 2:
    return 0
  return max(1, int(math.floor(fraction * population_size + 1e-9)))


def ready_mask(member_steps: jax.Array, last_ready_steps: jax.Array,
               config: PBTConfig) -> jax.Array:
  """``[N]`` bool: members trained ``ready_after`` steps since they were last
  ready, and past ``no_mutation_before``.

  After a call to ``exploit_explore`` update ``last_ready_steps`` with
  ``jnp.where(ready, new_member_steps, last_ready_steps)``, reading the steps
  from the NEW state (a copied member inherits its parent's step counter).
  """
  return ((member_steps - last_ready_steps >= config.ready_after)
          & (member_steps >= config.no_mutation_before))


def _optimizer_fields(state: State, config: PBTConfig) -> tuple[str, ...]:
  fields = getattr(state, '_fields', None)
  if fields is None:
    raise ValueError('reset_optimizers needs a NamedTuple state to find its '
                     f'optimizer fields, got {type(state).__name__}')
  if config.optimizer_fields is None:
    chosen = tuple(f for f in fields if f.endswith('_opt'))
    if not chosen:
      raise ValueError(f'reset_optimizers: no state field ends in "_opt" in '
                       f'{type(state).__name__} {list(fields)}; set '
                       'PBTConfig.optimizer_fields')
    return chosen
  unknown = [f for f in config.optimizer_fields if f not in fields]
  if unknown:
    raise ValueError(f'optimizer_fields {unknown} are not fields of '
                     f'{type(state).__name__}; known: {list(fields)}')
  return config.optimizer_fields


def _is_better(source: jax.Array, target: jax.Array,
               config: PBTConfig) -> jax.Array:
  gap = source - target
  return ((gap > config.min_gap_absolute)
          & (gap > config.min_gap_relative * jnp.abs(target)))


def _rows(flag: jax.Array, x: jax.Array) -> jax.Array:
  return flag.reshape(flag.shape + (1,) * (x.ndim - 1))


def _moments(samples: jax.Array):
  """Count, mean and sample variance (ddof 1) of each row; NaN is missing."""
  present = jnp.isfinite(samples)
  count = present.sum(-1).astype(jnp.float32)
  mean = jnp.where(present, samples, 0.0).sum(-1) / count
  squares = jnp.where(present, (samples - mean[..., None]) ** 2, 0.0)
  return count, mean, squares.sum(-1) / (count - 1)


def welch_p_value(x: jax.Array, y: jax.Array) -> jax.Array:
  """Two-sided p-value of Welch's t-test that rows of ``x`` and ``y``
  (``[..., W]``, NaN for a missing value) have equal means; NaN where a
  row has fewer than two values. Without spread on either side the means
  differ with p = 0, or not at all (p = 1)."""
  nx, mx, vx = _moments(x)
  ny, my, vy = _moments(y)
  sx, sy = vx / nx, vy / ny
  spread = sx + sy
  t2 = (mx - my) ** 2 / spread
  # Welch-Satterthwaite degrees of freedom; P(|T| > |t|) for Student's t
  # with df degrees is I_{df / (df + t^2)}(df / 2, 1 / 2).
  # df written with shares of the spread: no square of a variance, which
  # float32 overflows (or flushes to 0) for returns beyond about 1e9.
  a, b = sx / spread, sy / spread
  df = 1.0 / (a ** 2 / (nx - 1) + b ** 2 / (ny - 1))
  safe_df = jnp.where(spread > 0, df, 1.0)
  p = jax.scipy.special.betainc(safe_df / 2, 0.5,
                                safe_df / (safe_df + jnp.where(spread > 0,
                                                               t2, 0.0)))
  p = jnp.where(spread > 0, p, jnp.where(mx == my, 1.0, 0.0))
  return jnp.where((nx >= 2) & (ny >= 2), p, jnp.nan)


def select_parents(key: PRNGKey, fitness: jax.Array, ready: jax.Array,
                   config: PBTConfig, samples: Optional[jax.Array] = None
                   ) -> tuple[jax.Array, jax.Array]:
  """The exploit decision alone: ``(parent[N] int32, replaced[N] bool)``.

  ``samples`` (``[N, W]``, NaN for missing; the returns ``fitness`` is the
  mean of) is read by ``'ttest'`` alone, which needs it. A member with
  non-finite fitness (e.g. NaN: not evaluated yet) is never replaced and
  ranks last, so it is never a parent either.
  """
  n = fitness.shape[0]
  index = jnp.arange(n, dtype=jnp.int32)
  fitness = fitness.astype(jnp.float32)
  finite = jnp.isfinite(fitness)
  ranked = jnp.where(finite, fitness, -jnp.inf)
  if config.exploit == 'ttest' and samples is None:
    raise ValueError("exploit 'ttest' needs the samples of each member's "
                     'fitness')
  if n < 2:
    return index, jnp.zeros((n,), bool)
  if config.exploit == 'truncation':
    k = num_truncated(n, config.fraction)
    order = jnp.argsort(ranked, stable=True)  # ascending: worst first
    rank = jnp.zeros((n,), jnp.int32).at[order].set(index)
    bottom = rank < k
    candidates = order[n - k:]  # the top k
    parent = candidates[jax.random.randint(key, (n,), 0, k)]
  else:  # tournament, t-test: another member drawn uniformly
    parent = (index + jax.random.randint(key, (n,), 1, n)) % n
    bottom = jnp.ones((n,), bool)
    if config.exploit == 'ttest':
      samples = jnp.asarray(samples, jnp.float32)
      bottom = welch_p_value(samples[parent], samples) < config.significance
  replaced = (ready & bottom & finite
              & _is_better(ranked[parent], ranked, config))
  return jnp.where(replaced, parent, index).astype(jnp.int32), replaced


def copy_members(state: State, parent: jax.Array, replaced: jax.Array) -> State:
  """Member ``i`` takes every leaf of member ``parent[i]`` where
  ``replaced[i]``."""
  return jax.tree.map(
      lambda x: jnp.where(_rows(replaced, x), jnp.take(x, parent, axis=0), x),
      state)


def _refresh_keys(key: PRNGKey, keys: jax.Array, replaced: jax.Array):
  # fold_in(parent key, fresh random bits): differs from the parent's key and
  # from every other copy of the same parent; works for raw uint32 [N, 2] and
  # typed [N] key arrays alike.
  salt = jax.random.bits(key, (replaced.shape[0],), jnp.uint32)
  fresh = jax.vmap(jax.random.fold_in)(keys, salt)
  return jnp.where(_rows(replaced, keys), fresh, keys)


def exploit_explore(key: PRNGKey, state: State, hparams: HParams,
                    fitness: jax.Array, ready: jax.Array, config: PBTConfig,
                    space: ss.SearchSpace,
                    resample_space: Optional[ss.SearchSpace] = None,
                    samples: Optional[jax.Array] = None) -> PBTResult:
  """One PBT exploit-and-explore step over the whole population.

  Args:
    key: PRNG key (parent choice, new member keys, perturbations).
    state: stacked training state, every leaf ``[N, ...]``.
    hparams: stacked hyperparameters, ``[N]`` leaves.
    fitness: ``[N]`` float, higher is better (e.g. ``FitnessTracker``).
    ready: ``[N]`` bool, members allowed to exploit now (``ready_mask``).
    config: static PBT settings.
    space: static search space for explore; fields outside it are copied
      from the parent and left as they are.
    resample_space: static; where explore resamples (``ss.perturb``):
      the distribution the population started from. Default: ``space``.
    samples: ``[N, W]`` float, the values ``fitness`` is the mean of (NaN
      for missing); needed by the ``'ttest'`` exploit, unused otherwise.

  Returns:
    ``PBTResult(state, hparams, parent, replaced)``. For a replaced member
    ``i``: every state leaf equals the parent's, except the key fields
    (fresh keys) and, with ``reset_optimizers``, the optimizer fields
    (fresh states); its hyperparameters are the parent's, perturbed. Other
    members are returned unchanged.
  """
  k_select, k_copy = jax.random.split(key)
  ready = jnp.asarray(ready, bool)
  parent, replaced = select_parents(k_select, jnp.asarray(fitness), ready,
                                    config, samples)
  return copy_and_explore(k_copy, state, hparams, parent, replaced, config,
                          space, resample_space)


def diverged_parents(key: PRNGKey, fitness: jax.Array, diverged: jax.Array,
                     config: PBTConfig) -> jax.Array:
  """``parent[N]`` for replacing diverged members (NaN or Inf in their loss
  or parameters) at once, whether ready or not: each draws a parent
  uniformly from the top ``num_truncated(N, fraction)`` healthy members by
  fitness (members without a finite fitness rank below those with one).
  Healthy members are their own parents. Needs at least one healthy member.

  Not in the PBT paper, which has no notion of a diverged member: a
  diverged member's next evaluations would be NaN, which ``select_parents``
  never replaces, so it would stay broken for good.
  """
  n = fitness.shape[0]
  index = jnp.arange(n, dtype=jnp.int32)
  fitness = jnp.asarray(fitness, jnp.float32)
  score = jnp.where(jnp.isfinite(fitness), fitness,
                    jnp.finfo(jnp.float32).min)
  score = jnp.where(diverged, -jnp.inf, score)
  k = jnp.minimum(num_truncated(n, config.fraction),
                  jnp.sum(~diverged)).astype(jnp.int32)
  order = jnp.argsort(score, stable=True)  # ascending: diverged first
  pick = n - 1 - jax.random.randint(key, (n,), 0, jnp.maximum(k, 1))
  return jnp.where(diverged, order[pick], index).astype(jnp.int32)


def replace_diverged(key: PRNGKey, state: State, hparams: HParams,
                     fitness: jax.Array, diverged: jax.Array,
                     config: PBTConfig, space: ss.SearchSpace,
                     resample_space: Optional[ss.SearchSpace] = None
                     ) -> PBTResult:
  """Every diverged member takes a copy of a good member, as an exploit
  would (``diverged_parents``, then ``copy_and_explore``): the state, fresh
  keys, reset optimizers if configured, the parent's perturbed
  hyperparameters. So a learning rate explored too high is left behind."""
  k_select, k_copy = jax.random.split(key)
  diverged = jnp.asarray(diverged, bool)
  parent = diverged_parents(k_select, fitness, diverged, config)
  return copy_and_explore(k_copy, state, hparams, parent, diverged, config,
                          space, resample_space)


def copy_and_explore(key: PRNGKey, state: State, hparams: HParams,
                     parent: jax.Array, replaced: jax.Array, config: PBTConfig,
                     space: ss.SearchSpace,
                     resample_space: Optional[ss.SearchSpace] = None
                     ) -> PBTResult:
  """Exploit and explore for a given decision: member ``i`` with
  ``replaced[i]`` becomes a copy of ``parent[i]`` (see ``exploit_explore``
  for what is copied, refreshed and perturbed)."""
  k_keys, k_explore = jax.random.split(key)
  new_state = copy_members(state, parent, replaced)
  fields = getattr(new_state, '_fields', ())
  updates = {}
  for name in config.key_fields:
    if name in fields:
      updates[name] = _refresh_keys(k_keys, getattr(new_state, name), replaced)
  if config.reset_optimizers:
    reset = config.optimizer_reset or (
        lambda tree: jax.tree.map(jnp.zeros_like, tree))
    for name in _optimizer_fields(new_state, config):
      old = getattr(new_state, name)
      updates[name] = jax.tree.map(
          lambda f, x: jnp.where(_rows(replaced, x), f, x), reset(old), old)
  if updates:
    new_state = new_state._replace(**updates)

  copied_hparams = copy_members(hparams, parent, replaced)
  explored = ss.perturb(k_explore, space, copied_hparams,
                        config.perturb_factors, config.resample_probability,
                        resample_space)
  new_hparams = jax.tree.map(
      lambda e, c: jnp.where(replaced, e, c), explored, copied_hparams)
  return PBTResult(new_state, new_hparams, parent, replaced)


class CompiledExploitExplore:
  """Host-side wrapper (not jittable): ``exploit_explore`` jitted once for a
  configuration and a search space, counting its traces so that callers can
  check that new values never recompile."""

  def __init__(self, config: PBTConfig, space: ss.SearchSpace,
               resample_space: Optional[ss.SearchSpace] = None):
    self.config = config
    self.space = space
    self.resample_space = resample_space
    self.compilations = 0

    def traced(key, state, hparams, fitness, ready, samples):
      self.compilations += 1  # runs once per trace, never at run time
      return exploit_explore(key, state, hparams, fitness, ready, config,
                             space, resample_space, samples)

    self._step = jax.jit(traced)
    self._replace_diverged = jax.jit(
        lambda key, state, hparams, fitness, diverged: replace_diverged(
            key, state, hparams, fitness, diverged, config, space,
            resample_space))

  def __call__(self, key: PRNGKey, state: State, hparams: HParams,
               fitness, ready, samples=None) -> PBTResult:
    """``samples``: see ``exploit_explore`` (``'ttest'`` needs them)."""
    if samples is not None:
      samples = jnp.asarray(samples, jnp.float32)
    return self._step(key, state, hparams, jnp.asarray(fitness, jnp.float32),
                      jnp.asarray(ready, bool), samples)

  def replace_diverged(self, key: PRNGKey, state: State, hparams: HParams,
                       fitness, diverged) -> PBTResult:
    """``replace_diverged`` jitted (compiled on first use only)."""
    return self._replace_diverged(key, state, hparams,
                                  jnp.asarray(fitness, jnp.float32),
                                  jnp.asarray(diverged, bool))


# ---------------------------------------------------------------------------
# Host-side bookkeeping (numpy and files; not jittable)
# ---------------------------------------------------------------------------


def mean_of_last(history: Sequence[Sequence[float]],
                 window: int = 10) -> np.ndarray:
  """Host-side. ``[N]`` fitness: the mean of each member's last ``window``
  values (NaN for a member with none)."""
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  out = np.full((len(history),), np.nan, np.float64)
  for i, values in enumerate(history):
    values = list(values)[-window:]
    if values:
      out[i] = float(np.mean(values))
  return out


class FitnessTracker:
  """Host-side per-member fitness: mean of the last ``window`` evaluation
  returns (the 2022 paper's PBT uses the last 10 episode returns), or of a
  user-given "true objective" (Sample Factory's ``true_objective``: e.g. a
  sparse win/loss score while training on a shaped reward).

  After ``exploit_explore``, call ``on_exploit(parent, replaced)``: a replaced
  member now runs its parent's weights, so it takes over its parent's
  history.
  """

  def __init__(self, population_size: int, window: int = 10,
               use_true_objective: bool = False):
    if population_size < 1:
      raise ValueError(f'population_size must be >= 1, got {population_size}')
    if window < 1:
      raise ValueError(f'window must be >= 1, got {window}')
    self.window = window
    self.use_true_objective = use_true_objective
    self._history = [collections.deque(maxlen=window)
                     for _ in range(population_size)]

  def record(self, member: int, episode_return: float,
             true_objective: Optional[float] = None) -> None:
    """Adds one evaluation episode of ``member``."""
    if self.use_true_objective:
      if true_objective is None:
        raise ValueError('FitnessTracker(use_true_objective=True) needs a '
                         'true_objective for every record')
      value = true_objective
    else:
      value = episode_return
    self._history[member].append(float(value))

  def fitness(self) -> np.ndarray:
    """``[N]`` float32, NaN for members not evaluated yet (never replaced,
    never parents)."""
    return mean_of_last(self._history, self.window).astype(np.float32)

  def on_exploit(self, parent: np.ndarray, replaced: np.ndarray) -> None:
    parent, replaced = np.asarray(parent), np.asarray(replaced)
    old = [list(h) for h in self._history]
    for i in np.flatnonzero(replaced):
      self._history[i] = collections.deque(old[int(parent[i])],
                                           maxlen=self.window)

  def reset(self, members: Iterable[int]) -> None:
    """Forgets the history of ``members`` (e.g. slots restarted afresh)."""
    for i in members:
      self._history[int(i)].clear()

  def history(self) -> list[list[float]]:
    """Each member's recorded values (at most ``window``), oldest first;
    JSON-friendly, for checkpoints."""
    return [list(h) for h in self._history]

  def set_history(self, history: Sequence[Sequence[float]]) -> None:
    """Restores ``history()`` output (e.g. from a checkpoint)."""
    if len(history) != len(self._history):
      raise ValueError(f'history has {len(history)} members, the tracker '
                       f'{len(self._history)}')
    self._history = [collections.deque((float(v) for v in values),
                                       maxlen=self.window)
                     for values in history]


def _hparams_dicts(hparams: HParams) -> list[dict]:
  arrays = {name: whole_value(value)
            for name, value in hparams._asdict().items()}
  n = len(next(iter(arrays.values())))
  return [{name: values[i].item() for name, values in arrays.items()}
          for i in range(n)]


class Lineage:
  """Host-side JSONL log of a population's hyperparameter history.

  One JSON object per line, appended and flushed at once:

  * ``{"event": "init", "step", "member", "hparams"}`` for each member of
    the initial population (``record_init``), or of a slot restarted from
    scratch (``record_reset``, event ``"reset"``);
  * ``{"event": "exploit", "step", "member", "parent", "old_hparams",
    "new_hparams", "fitness", "parent_fitness"}`` for each replaced member
    (``record``), with ``"reason": "diverged"`` for a member replaced because
    its loss or parameters became NaN or infinite.

  ``step`` counts update steps per member; events also carry ``env_steps``
  (per member) when the caller gives it (the run loop does; the lineage
  picture, ``fastpbrl.plots``, draws against it).

  ``schedule(path, member)`` rebuilds the hyperparameters that produced a
  member's current weights, following copies back through its ancestors.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = os.fspath(path)
    directory = os.path.dirname(self.path)
    if directory:
      os.makedirs(directory, exist_ok=True)

  def _write(self, events: list[dict]) -> None:
    if not events:
      return
    with open(self.path, 'a', encoding='utf-8') as f:
      for event in events:
        f.write(json.dumps(event, sort_keys=True) + '\n')

  def record_init(self, step: int, hparams: HParams,
                  members: Optional[Iterable[int]] = None,
                  event: str = 'init', env_steps: Optional[int] = None
                  ) -> None:
    self._write(init_events(step, hparams, members, event, env_steps))

  def record_reset(self, step: int, hparams: HParams,
                   members: Iterable[int]) -> None:
    """Slots restarted with fresh weights (no ancestor), e.g. HyperTrick."""
    self.record_init(step, hparams, members, event='reset')

  def record(self, step: int, result: PBTResult, old_hparams: HParams,
             fitness: Optional[Sequence[float]] = None,
             env_steps: Optional[int] = None,
             reason: Optional[str] = None) -> int:
    """Appends one event per replaced member of ``result``; returns how many.
    ``reason`` (e.g. ``'diverged'``) is stored with each event."""
    events = exploit_events(step, result, old_hparams, fitness, env_steps)
    if reason is not None:
      events = [{**e, 'reason': reason} for e in events]
    self.write(events)
    return len(events)

  def write(self, events: list[dict]) -> None:
    """Appends events built elsewhere (``exploit_events``)."""
    self._write(events)


def init_events(step: int, hparams: HParams,
                members: Optional[Iterable[int]] = None, event: str = 'init',
                env_steps: Optional[int] = None) -> list[dict]:
  """Host-side. The lineage events that start ``members``' lines of weights
  (all members by default): ``init``, or ``reset`` for slots restarted
  from scratch."""
  rows = _hparams_dicts(hparams)
  members = range(len(rows)) if members is None else members
  extra = {} if env_steps is None else {'env_steps': int(env_steps)}
  return [{'event': event, 'step': int(step), 'member': int(i),
           'hparams': rows[int(i)], **extra} for i in members]


def exploit_events(step: int, result: PBTResult, old_hparams: HParams,
                   fitness: Optional[Sequence[float]] = None,
                   env_steps: Optional[int] = None) -> list[dict]:
  """Host-side. The lineage events of ``result``: one per replaced member."""
  replaced = whole_value(result.replaced)  # gathered over processes
  parent = whole_value(result.parent)
  old_rows = _hparams_dicts(old_hparams)
  new_rows = _hparams_dicts(result.hparams)
  fit = None if fitness is None else np.asarray(fitness, np.float64)
  events = []
  for i in np.flatnonzero(replaced):
    p = int(parent[i])
    event = {'event': 'exploit', 'step': int(step), 'member': int(i),
             'parent': p, 'old_hparams': old_rows[i],
             'new_hparams': new_rows[i]}
    if env_steps is not None:
      event['env_steps'] = int(env_steps)
    if fit is not None:
      event['fitness'] = _json_float(fit[i])
      event['parent_fitness'] = _json_float(fit[p])
    events.append(event)
  return events


def _json_float(x: float) -> Optional[float]:
  return float(x) if math.isfinite(x) else None


def read_lineage(path: str | os.PathLike) -> list[dict]:
  """Host-side. All events of a lineage file, in the order written."""
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def founders(path_or_events) -> dict[int, tuple[int, int]]:
  """Host-side. The start of each member's current line of weights, as
  ``(member, step)`` of the ``init`` or ``reset`` event it descends from:
  the number of distinct values is the number of lineages still alive.

  The copies of one decision read the population as it was before it
  (consecutive copies with the same step and ``reason`` are one
  decision), as ``exploit_explore`` makes them.

  Raises:
    ValueError: if a copy's parent has no line of weights yet.
  """
  events = (read_lineage(path_or_events)
            if isinstance(path_or_events, (str, os.PathLike))
            else list(path_or_events))
  origin: dict[int, tuple[int, int]] = {}
  for _, decision in itertools.groupby(
      events, key=lambda e: (e['step'], e.get('reason'),
                             e['event'] == 'exploit')):
    before = dict(origin)
    for e in decision:
      if e['event'] != 'exploit':  # init / reset: a line of weights starts
        origin[e['member']] = (e['member'], e['step'])
      elif e['parent'] in before:
        origin[e['member']] = before[e['parent']]
      else:
        raise ValueError(f'lineage: member {e["member"]} copies member '
                         f'{e["parent"]} at step {e["step"]}, which has no '
                         'init event before it')
  return origin


def schedule(path_or_events, member: int,
             until_step: Optional[int] = None) -> list[tuple[int, dict]]:
  """Host-side. The hyperparameter schedule behind ``member``'s weights.

  Follows copies backwards: if ``member`` copied ``parent`` at step ``t``,
  its weights were trained by ``parent``'s schedule before ``t`` (events of
  ``parent`` AT step ``t`` are excluded: copies read the population as it
  was before the call) and by its own new hyperparameters from ``t`` on.

  Args:
    path_or_events: a lineage file path, or the list from ``read_lineage``.
    member: the member whose current weights to explain.
    until_step: consider only events at or before this step (default: all).

  Returns:
    ``[(step, hparams), ...]`` in increasing step order: run with
    ``hparams`` from ``step`` until the next entry's step. Re-running these
    alone reproduces the member's hyperparameter history.

  Raises:
    ValueError: if the file has no ``init``/``reset`` event for an ancestor.
  """
  events = (read_lineage(path_or_events)
            if isinstance(path_or_events, (str, os.PathLike))
            else list(path_or_events))
  out: list[tuple[int, dict]] = []
  current, limit, strict = int(member), until_step, False
  while True:
    own = [e for e in events if e['member'] == current
           and (limit is None or e['step'] < limit
                or (not strict and e['step'] == limit))]
    if not own:
      raise ValueError(f'lineage has no init event for member {current}'
                       + ('' if limit is None else f' before step {limit}'))
    last = own[-1]
    if last['event'] == 'exploit':
      out.append((last['step'], last['new_hparams']))
      current, limit, strict = last['parent'], last['step'], True
    else:  # init / reset: the start of this line of weights
      out.append((last['step'], last['hparams']))
      break
  return out[::-1]
