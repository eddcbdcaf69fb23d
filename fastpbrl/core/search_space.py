"""Declarative hyperparameter search spaces, sampled and perturbed in JAX.

A ``SearchSpace`` maps hyperparameter field names (of an agent's ``HParams``
``NamedTuple``) to a prior distribution: ``LogUniform(low, high)``,
``Uniform(low, high)`` or ``Categorical(values)``, plus an optional user
``constraint`` applied after every sample and perturbation. Fields that are not
in the space are never touched.

``sample`` draws a population from the prior; ``perturb`` is the explore step
of PBT (Jaderberg et al. 2017, sec. 4.1.1 "explore": each hyperparameter is
independently multiplied by 0.8 or 1.2, or with some probability resampled
from the prior; a categorical one moves to an adjacent value, as in Ray Tune's
``PopulationBasedTraining``). Both are pure, jittable functions: the space is a
hashable frozen dataclass meant to be a static argument, and every value stays
a traced array, so nothing recompiles when values change.

Departures from "multiply by 0.8 or 1.2, then clip" (Jaderberg et al.;
Ray Tune clips the same way), each because clipping collapses a population
onto its bounds:

* a perturbed value that leaves the bounds is *reflected* back into them
  (in log space for ``LogUniform``), not clipped: with clipping, every member
  of a field whose range is narrow relative to its value (a discount in
  ``[0.9, 1]``: ``0.95 x 1.2`` and ``0.95 x 0.8`` are both outside) lands
  exactly on a bound and stays on one of two points for good;
* a discount is searched in horizon space, ``Discount(low, high)``:
  ``1 - gamma`` is log-uniform and the explore factor multiplies ``1 -
  gamma`` (an effective horizon ``1 / (1 - gamma)``), with ``high < 1``.
  The paper's ``U(0.9, 1)`` puts members at gamma = 1, where Q targets
  bootstrapped through time-limit truncations do not contract.

Each agent registers its default space (``fastpbrl.agents.register``;
``fastpbrl.agents.get(name).default_search_space`` looks it up; this module
imports no agent): TD3's and SAC's follow Flajolet et al. 2022,
appendix B.1, with the discount in horizon space over ``[0.9, 0.999]``
(above); DQN's is ours (the paper tunes none). ``load(path)`` reads
one from a JSON or YAML file (``--search-space``).

Each agent also registers the *domain* of its hyperparameters
(``HParamDomain``: a one-line meaning, a unit, the valid range with open or
closed ends, whether values are whole numbers). ``check_values`` checks
values (``--hparams``, ``train(hparams=...)``) against it and
``check_space`` a search space (``--search-space``, the default priors):
each refusal is one line naming the field, the value and the range. A
field without a domain is unchecked (a user agent that declares none keeps
working; ``fastpbrl info`` says "undeclared").
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp

from fastpbrl.core import settings_file
from fastpbrl.core.types import PRNGKey

HParams = Any  # a NamedTuple of scalar (one member) or [N] (population) arrays


@dataclasses.dataclass(frozen=True)
class LogUniform:
  """``exp(U(log low, log high))``: for scale parameters such as step sizes."""

  low: float
  high: float

  def check(self, name: str) -> None:
    _check_bounds(name, self, 'LogUniform')
    if self.low <= 0:
      raise ValueError(
          f'search space field {name!r}: LogUniform needs positive bounds '
          f'(0 < low < high), got low={self.low}, high={self.high}')


@dataclasses.dataclass(frozen=True)
class Uniform:
  """``U(low, high)``."""

  low: float
  high: float

  def check(self, name: str) -> None:
    _check_bounds(name, self, 'Uniform')


@dataclasses.dataclass(frozen=True)
class Discount:
  """A discount factor searched in horizon space: ``1 - gamma`` is
  ``LogUniform(1 - high, 1 - low)``, and PBT's explore factor multiplies
  ``1 - gamma``. Needs ``0 <= low < high < 1``."""

  low: float
  high: float

  def check(self, name: str) -> None:
    _check_bounds(name, self, 'Discount')
    if not 0.0 <= self.low < self.high < 1.0:
      raise ValueError(
          f'search space field {name!r}: Discount needs 0 <= low < high < 1 '
          f'(1 - gamma is searched in log space), got low={self.low}, '
          f'high={self.high}')


@dataclasses.dataclass(frozen=True)
class Categorical:
  """A uniform choice among ordered ``values``; perturbation moves to a
  neighbour in the given order."""

  values: tuple

  def __post_init__(self):
    object.__setattr__(self, 'values', tuple(float(v) for v in self.values))

  def check(self, name: str) -> None:
    if not self.values:
      raise ValueError(f'search space field {name!r}: Categorical needs at '
                       'least one value, got none')
    if not all(math.isfinite(v) for v in self.values):
      raise ValueError(f'search space field {name!r}: Categorical values must '
                       f'be finite, got {self.values}')
    if len(set(self.values)) != len(self.values):
      raise ValueError(f'search space field {name!r}: Categorical values must '
                       f'be distinct, got {self.values}')


Distribution = Union[LogUniform, Uniform, Discount, Categorical]


def _check_bounds(name: str, dist, kind: str) -> None:
  if not (math.isfinite(dist.low) and math.isfinite(dist.high)):
    raise ValueError(f'search space field {name!r}: {kind} bounds must be '
                     f'finite, got low={dist.low}, high={dist.high}')
  if dist.low >= dist.high:
    raise ValueError(f'search space field {name!r}: {kind} needs low < high, '
                     f'got low={dist.low}, high={dist.high}')


@dataclasses.dataclass(frozen=True)
class SearchSpace:
  """Prior distributions over some hyperparameter fields.

  Build it from a mapping, ``SearchSpace({'policy_lr': LogUniform(3e-5,
  3e-3)})``; it is stored as a tuple of ``(field, distribution)`` pairs so that
  it is hashable and can be a static argument of ``jax.jit``.

  Attributes:
    distributions: ``(field name, distribution)`` pairs, in the given order.
    constraint: optional ``hparams -> hparams`` on ONE member's hyperparameters
      (scalar leaves), applied (vmapped over the population) after every
      ``sample`` and ``perturb``, e.g. to enforce ``critic_lr >= policy_lr``.
      It must be a pure, jittable function; it may change any field.
  """

  distributions: Any
  constraint: Optional[Callable[[HParams], HParams]] = None

  def __post_init__(self):
    items = self.distributions
    if isinstance(items, Mapping):
      items = tuple(items.items())
    items = tuple((str(name), dist) for name, dist in items)
    names = [name for name, _ in items]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
      raise ValueError(f'search space fields {duplicated} appear more than once')
    for name, dist in items:
      if not isinstance(dist, (LogUniform, Uniform, Discount, Categorical)):
        raise ValueError(
            f'search space field {name!r}: expected LogUniform, Uniform, '
            f'Discount or Categorical, got {dist!r}')
      dist.check(name)
    if self.constraint is not None and not callable(self.constraint):
      raise ValueError(f'search space constraint must be callable, got '
                       f'{self.constraint!r}')
    object.__setattr__(self, 'distributions', items)

  @property
  def fields(self) -> tuple[str, ...]:
    return tuple(name for name, _ in self.distributions)

  def __getitem__(self, name: str) -> Distribution:
    return dict(self.distributions)[name]


@dataclasses.dataclass(frozen=True)
class HParamDomain:
  """Where one hyperparameter may lie, and what it means (host-side).

  ``HParamDomain('Adam step size of the actor', 'step size', low=0,
  low_open=True)`` is ``(0, inf)``; ``None`` bounds are unbounded.

  Attributes:
    meaning: one line: what the hyperparameter does.
    unit: what its values count or measure ("update steps", "reward
      multiplier"; "" for a plain number).
    low: smallest valid value; ``None``: unbounded below.
    high: largest valid value; ``None``: unbounded above.
    low_open: ``low`` itself is invalid (``(0, ...``).
    high_open: ``high`` itself is invalid (``..., 1)``).
    integer: only whole numbers are valid; a search space over it must be
      a ``Categorical`` of whole numbers.
  """

  meaning: str
  unit: str = ''
  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False
  high_open: bool = False
  integer: bool = False

  def __str__(self) -> str:
    low = '-inf' if self.low is None else f'{self.low:g}'
    high = 'inf' if self.high is None else f'{self.high:g}'
    text = (f'{"(" if self.low_open or self.low is None else "["}{low}, '
            f'{high}{")" if self.high_open or self.high is None else "]"}')
    return text + (' integers' if self.integer else '')

  def problem(self, value: float) -> Optional[str]:
    """Why ``value`` is invalid (``None``: it is valid)."""
    value = float(value)
    if not math.isfinite(value):
      return f'is not finite (valid range: {self})'
    below = self.low is not None and (value < self.low or (
        self.low_open and value == self.low))
    above = self.high is not None and (value > self.high or (
        self.high_open and value == self.high))
    if below or above:
      return f'is outside its valid range {self}'
    if self.integer and value != round(value):
      return f'is not an integer (valid range: {self})'
    return None


def positive(meaning: str, unit: str = '') -> HParamDomain:
  """``(0, inf)``: a step size, a noise scale above zero, a multiplier."""
  return HParamDomain(meaning, unit, low=0.0, low_open=True)


def non_negative(meaning: str, unit: str = '') -> HParamDomain:
  """``[0, inf)``."""
  return HParamDomain(meaning, unit, low=0.0)


def check_renamed(name: str, renamed: Mapping[str, str]) -> None:
  """Raises ``ValueError`` (one line) if ``name`` is an old name in
  ``renamed`` (old name -> what to write instead)."""
  if name in renamed:
    raise ValueError(f'{name} {renamed[name]}')


def check_values(domains: Mapping[str, HParamDomain],
                 values: Mapping[str, float],
                 renamed: Optional[Mapping[str, str]] = None) -> None:
  """Checks hyperparameter values (``{field: value}``, host-side) against
  their domains; a field without a domain is unchecked.

  Raises:
    ValueError: one line naming the field, the value and the valid range
      (or the new name of a renamed field).
  """
  for name, value in values.items():
    check_renamed(name, renamed or {})
    domain = domains.get(name)
    problem = None if domain is None else domain.problem(value)
    if problem:
      raise ValueError(f'{name}={float(value):g} {problem} ({domain.meaning})')


def check_space(domains: Mapping[str, HParamDomain], space: SearchSpace,
                renamed: Optional[Mapping[str, str]] = None) -> None:
  """Checks that every value ``space`` can give (sample, perturb) lies in
  its field's domain: both ends of a range, every categorical value.

  Raises:
    ValueError: one line naming the field, the offending bound or value and
      the valid range.
  """
  for name, dist in space.distributions:
    check_renamed(name, renamed or {})
    domain = domains.get(name)
    if domain is None:
      continue
    if isinstance(dist, Categorical):
      ends = [('value', v) for v in dist.values]
    else:
      if domain.integer:
        raise ValueError(
            f'search space field {name!r}: {type(dist).__name__} draws '
            f'fractions, but {name} takes integers ({domain}); use a '
            'categorical of whole numbers')
      ends = [('low', dist.low), ('high', dist.high)]
    for label, value in ends:
      problem = domain.problem(value)
      if problem:
        raise ValueError(f'search space field {name!r}: {label} {value:g} '
                         f'{problem} ({domain.meaning})')


def validate(space: SearchSpace, hparams: HParams) -> None:
  """Checks that every field of ``space`` is a field of ``hparams``.

  Raises:
    ValueError: naming the unknown fields and the known ones.
  """
  known = getattr(hparams, '_fields', None)
  if known is None:
    raise ValueError(f'hparams must be a NamedTuple of arrays, got '
                     f'{type(hparams).__name__}')
  unknown = [f for f in space.fields if f not in known]
  if unknown:
    raise ValueError(
        f'search space fields {unknown} are not hyperparameters of '
        f'{type(hparams).__name__}; known fields: {list(known)}')


def _log_bounds(dist: Distribution) -> tuple[float, float]:
  """Bounds, in log space, of the quantity a log-scale field samples and
  perturbs: the value itself (``LogUniform``) or ``1 - gamma``
  (``Discount``)."""
  if isinstance(dist, Discount):
    return math.log(1.0 - dist.high), math.log(1.0 - dist.low)
  return math.log(dist.low), math.log(dist.high)


def _from_log(dist: Distribution, y: jax.Array) -> jax.Array:
  """Inverse of the log-space coordinate of ``_log_bounds``."""
  x = jnp.exp(y)
  if isinstance(dist, Discount):
    x = 1.0 - x
  return jnp.clip(x, dist.low, dist.high)


def _to_log(dist: Distribution, x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  if isinstance(dist, Discount):
    x = 1.0 - x
  # A value outside the support (a default, say) is taken from its bound.
  lo, hi = _log_bounds(dist)
  return jnp.clip(jnp.log(jnp.maximum(x, 1e-30)), lo, hi)


def _reflect(y: jax.Array, low: float, high: float) -> jax.Array:
  """Folds ``y`` back into ``[low, high]`` at the bounds (a mirror), so that
  repeated perturbation keeps a spread instead of piling onto a bound."""
  width = high - low
  z = jnp.mod(y - low, 2.0 * width)
  return low + jnp.where(z > width, 2.0 * width - z, z)


def _sample_field(key: PRNGKey, dist: Distribution, n: int) -> jax.Array:
  if isinstance(dist, (LogUniform, Discount)):
    lo, hi = _log_bounds(dist)
    return _from_log(dist, jax.random.uniform(key, (n,), minval=lo, maxval=hi))
  if isinstance(dist, Uniform):
    return jax.random.uniform(key, (n,), minval=dist.low, maxval=dist.high)
  values = jnp.asarray(dist.values, jnp.float32)
  return values[jax.random.randint(key, (n,), 0, len(dist.values))]


def _cast(x: jax.Array, like: jax.Array) -> jax.Array:
  if jnp.issubdtype(like.dtype, jnp.integer):
    x = jnp.round(x)
  return x.astype(like.dtype)


def constrained(space: SearchSpace, hparams: HParams) -> HParams:
  """``[N]`` ``hparams`` after the space's constraint (if any), each field
  cast back to its dtype."""
  if space.constraint is None:
    return hparams
  constrained = jax.vmap(space.constraint)(hparams)
  return jax.tree.map(_cast, constrained, hparams)


def _stacked_with_keys(key: PRNGKey, space: SearchSpace, template: HParams,
                       n: int) -> tuple[HParams, jax.Array]:
  """``template`` broadcast to ``[n]`` leaves, and one key per field."""
  validate(space, template)
  stacked = jax.tree.map(
      lambda x: jnp.broadcast_to(jnp.asarray(x), (n,)), template)
  return stacked, jax.random.split(key, max(1, len(space.distributions)))


def sample(key: PRNGKey, space: SearchSpace, hparams_template: HParams,
           n: int) -> HParams:
  """Draws ``n`` members' hyperparameters from the prior.

  Args:
    key: PRNG key.
    space: the search space (static under ``jit``).
    hparams_template: one member's hyperparameters (scalar leaves) or a
      population's (``[n]`` leaves); fields outside the space take these
      values.
    n: population size (static).

  Returns:
    Hyperparameters with ``[n]`` leaves, of the template's dtypes.
  """
  stacked, keys = _stacked_with_keys(key, space, hparams_template, n)
  values = {}
  for k, (name, dist) in zip(keys, space.distributions):
    values[name] = _cast(_sample_field(k, dist, n), getattr(stacked, name))
  return constrained(space, stacked._replace(**values))


def sample_near(key: PRNGKey, space: SearchSpace, defaults: HParams, n: int,
                spread: float = 1.25) -> HParams:
  """A population centred on the published defaults.

  Member 0 takes ``defaults`` exactly; every other member takes each field
  of the space at the default times a factor ``exp(U(-log spread, log
  spread))`` (of ``1 - gamma`` for a ``Discount``), reflected into the
  bounds; a categorical field takes the default's nearest grid value or a
  neighbour of it. Fields outside the space keep the defaults.

  This is ``--init-hparams near-defaults``, the default initial population
  of PBT here (a departure from Flajolet et al. 2022, which samples the whole
  prior): at small budgets a population drawn from the whole prior (noise
  scales up to 1, discounts up to 1) starts far behind the defaults, while
  one around the defaults loses nothing against N default seeds and still
  gives the exploit step differences to select on.

  Args:
    key: PRNG key.
    space: the search space (static under ``jit``).
    defaults: ONE member's hyperparameters (scalar leaves).
    n: population size (static).
    spread: largest factor away from a default, > 1.
  """
  if not spread > 1.0:
    raise ValueError(f'spread must be > 1, got {spread}')
  stacked, keys = _stacked_with_keys(key, space, defaults, n)
  values = {}
  for k, (name, dist) in zip(keys, space.distributions):
    x = getattr(stacked, name)
    if isinstance(dist, Categorical):
      moved = _perturb_field(k, dist, x, (1.0,))
      keep = jax.random.bernoulli(jax.random.fold_in(k, 1), 0.5, (n,))
      grid = jnp.asarray(dist.values, jnp.float32)
      nearest = grid[jnp.argmin(jnp.abs(x.astype(jnp.float32)[:, None]
                                        - grid[None]), axis=1)]
      near = jnp.where(keep, nearest, moved)
    else:
      log_factor = jax.random.uniform(k, (n,), minval=-math.log(spread),
                                      maxval=math.log(spread))
      near = _scale(dist, x, jnp.exp(log_factor))
    values[name] = _cast(jnp.where(jnp.arange(n) == 0, x, near), x)
  return constrained(space, stacked._replace(**values))


def _near_field(dist: Distribution, default: float,
                spread: float) -> Distribution:
  """The part of ``dist`` within a factor ``spread`` of ``default`` (of
  ``1 - default`` for a ``Discount``); ``dist`` itself where that part is
  empty or a point (a default of 0 in a ``Uniform``, or one outside or at the
  edge of the support)."""
  if isinstance(dist, Categorical):
    values = dist.values
    i = min(range(len(values)), key=lambda j: abs(values[j] - default))
    return Categorical(values[max(0, i - 1):i + 2])
  if isinstance(dist, Discount):
    horizon = 1.0 - default
    near_dist = Discount(max(dist.low, 1.0 - horizon * spread),
                         min(dist.high, 1.0 - horizon / spread))
  elif default > 0:
    near_dist = type(dist)(max(dist.low, default / spread),
                           min(dist.high, default * spread))
  elif default < 0:
    near_dist = type(dist)(max(dist.low, default * spread),
                           min(dist.high, default / spread))
  else:
    return dist
  return near_dist if near_dist.low < near_dist.high else dist


def near(space: SearchSpace, defaults: HParams,
         spread: float = 1.25) -> SearchSpace:
  """The search space restricted to a factor ``spread`` around the defaults:
  each field's support intersected with ``[default / spread, default *
  spread]`` (for a ``Discount``, ``1 - gamma`` around ``1 - default``); a
  categorical field keeps the default's nearest value and its neighbours.
  Same kinds of distributions, same constraint.

  Host-side (``defaults`` must be concrete: ONE member's hyperparameters).
  It is about the region ``sample_near`` draws the initial population from
  (which reflects at the bounds instead of cutting them) and, with
  ``--init-hparams near-defaults``, where PBT's explore step resamples
  (``perturb``'s ``resample_space``): Jaderberg et al. resample "from the
  originally defined prior distribution", the one the population started
  from.
  """
  if not spread > 1.0:
    raise ValueError(f'spread must be > 1, got {spread}')
  validate(space, defaults)
  return SearchSpace(
      tuple((name, _near_field(dist, float(getattr(defaults, name)), spread))
            for name, dist in space.distributions), space.constraint)


def _scale(dist: Distribution, x: jax.Array, factor: jax.Array) -> jax.Array:
  """``x`` times ``factor`` (``1 - x`` for a ``Discount``, in log space for
  log-scale fields), mirrored back into the bounds."""
  if isinstance(dist, (LogUniform, Discount)):
    lo, hi = _log_bounds(dist)
    return _from_log(dist, _reflect(_to_log(dist, x) + jnp.log(factor), lo, hi))
  moved = _reflect(x.astype(jnp.float32) * factor, dist.low, dist.high)
  return jnp.clip(moved, dist.low, dist.high)


def _perturb_field(key: PRNGKey, dist: Distribution, x: jax.Array,
                   factors: Sequence[float]) -> jax.Array:
  n = x.shape[0]
  if isinstance(dist, Categorical):
    values = jnp.asarray(dist.values, jnp.float32)
    m = len(dist.values)
    if m == 1:
      return jnp.broadcast_to(values[0], (n,))
    # A value off the grid (e.g. a default) snaps to its nearest value first.
    index = jnp.argmin(jnp.abs(x.astype(jnp.float32)[:, None] - values[None]),
                       axis=1)
    step = jnp.where(jax.random.bernoulli(key, 0.5, (n,)), 1, -1)
    moved = index + step
    # At either end there is one neighbour: move there.
    moved = jnp.where(moved < 0, 1, jnp.where(moved >= m, m - 2, moved))
    return values[moved]
  factor = jnp.asarray(factors, jnp.float32)[
      jax.random.randint(key, (n,), 0, len(factors))]
  return _scale(dist, x, factor)


def check_perturb_args(factors: Sequence[float],
                       resample_probability: float) -> None:
  """Raises ``ValueError`` for perturbation factors or a resampling
  probability out of range."""
  factors = tuple(factors)
  if not factors or not all(math.isfinite(f) and f > 0 for f in factors):
    raise ValueError(f'perturb factors must be a non-empty sequence of '
                     f'positive numbers, got {factors}')
  if not isinstance(resample_probability, jax.Array) and not (
      0.0 <= resample_probability <= 1.0):
    raise ValueError(f'resample_probability must be in [0, 1], got '
                     f'{resample_probability}')


def perturb(key: PRNGKey, space: SearchSpace, hparams: HParams,
            factors: Sequence[float] = (0.8, 1.2),
            resample_probability: float | jax.Array = 0.25,
            resample_space: Optional[SearchSpace] = None) -> HParams:
  """PBT's explore step on every member (Jaderberg et al. 2017, sec. 4.1.1).

  For each member and each field of the space, independently: with
  probability ``resample_probability`` the value is redrawn from the prior
  (``resample_space``; the whole space by default);
  otherwise a continuous value is multiplied by a factor drawn uniformly from
  ``factors`` (``1 - gamma`` for a ``Discount``) and reflected back into the
  distribution's bounds if it left them, and a categorical
  value moves to a uniformly chosen adjacent value (the only neighbour at an
  end). Then the space's constraint, if any, is applied. Fields outside the
  space are returned unchanged.

  Note that a continuous value of exactly 0 (allowed by ``Uniform(0, 1)``)
  stays 0 under multiplicative perturbation until it is resampled.

  Args:
    key: PRNG key.
    space: the search space (static under ``jit``).
    hparams: the population's hyperparameters, ``[N]`` leaves.
    factors: multiplicative perturbation factors (static).
    resample_probability: probability of resampling from the prior instead
      of perturbing; may be a traced scalar.
    resample_space: where a resampled value is drawn from (static): the
      distribution the population was initialised from (e.g. ``near(space,
      defaults)``); it must have the same fields as ``space``. Default:
      ``space``, the whole prior. Perturbed values stay within ``space``'s
      bounds either way.

  Returns:
    Perturbed hyperparameters of the same structure, shapes and dtypes.
  """
  validate(space, hparams)
  check_perturb_args(factors, resample_probability)
  resample_space = space if resample_space is None else resample_space
  if resample_space.fields != space.fields:
    raise ValueError(f'resample_space has fields {resample_space.fields}, '
                     f'the search space {space.fields}')
  values = {}
  keys = jax.random.split(key, max(1, len(space.distributions)))
  for k, (name, dist) in zip(keys, space.distributions):
    x = getattr(hparams, name)
    n = x.shape[0]
    k_move, k_flag, k_new = jax.random.split(k, 3)
    moved = _perturb_field(k_move, dist, x, factors)
    resampled = _sample_field(k_new, resample_space[name], n)
    flag = jax.random.uniform(k_flag, (n,)) < resample_probability
    values[name] = _cast(jnp.where(flag, resampled, moved), x)
  return constrained(space, hparams._replace(**values))


def contains(dist: Distribution, value: float) -> bool:
  """Whether one value lies in ``dist``'s support (host-side)."""
  if isinstance(dist, Categorical):
    return float(value) in dist.values
  return dist.low <= float(value) <= dist.high


def within_bounds(space: SearchSpace, hparams: HParams) -> jax.Array:
  """``[N]`` bool: every field of the space lies in its support (categorical
  values must be one of the values)."""
  ok = None
  for name, dist in space.distributions:
    x = getattr(hparams, name).astype(jnp.float32)
    if isinstance(dist, Categorical):
      inside = jnp.any(x[:, None] == jnp.asarray(dist.values, jnp.float32),
                       axis=1)
    else:
      inside = (x >= jnp.float32(dist.low)) & (x <= jnp.float32(dist.high))
    ok = inside if ok is None else ok & inside
  return ok


# ---------------------------------------------------------------------------
# Building blocks of the agents' default spaces (Flajolet et al. 2022,
# appendix B.1); each agent registers its own (``fastpbrl.agents.register``)
# ---------------------------------------------------------------------------

PAPER_LR = LogUniform(3e-5, 3e-3)  # "roughly centred around the default 3e-4"
# The paper's U(0.9, 1) in horizon space, without gamma = 1 (module doc).
PAPER_DISCOUNT = Discount(0.9, 0.999)


# ---------------------------------------------------------------------------
# Search spaces from a file (host-side: ``--search-space``)
# ---------------------------------------------------------------------------

# kind in the file -> (distribution, the keys it takes)
FILE_KINDS = {
    'log_uniform': (LogUniform, ('low', 'high')),
    'uniform': (Uniform, ('low', 'high')),
    'discount': (Discount, ('low', 'high')),
    'categorical': (Categorical, ('values',)),
}
# Ray Tune's and Optuna's spellings: tune.loguniform, tune.choice(categories),
# suggest_categorical(choices).
KIND_ALIASES = {'loguniform': 'log_uniform', 'choice': 'categorical'}
VALUES_ALIASES = ('categories', 'choices')


def _normalized(entry: Mapping) -> dict:
  """A file entry with Ray Tune's or Optuna's spellings as ours."""
  entry = dict(entry)
  entry['kind'] = KIND_ALIASES.get(entry['kind'], entry['kind'])
  if entry['kind'] == 'categorical':
    for alias in VALUES_ALIASES:
      if alias in entry and 'values' not in entry:
        entry['values'] = entry.pop(alias)
  return entry


def from_dict(entries: Any) -> SearchSpace:
  """A ``SearchSpace`` from ``{field: {"kind": ..., ...}}`` as read from a
  file (see ``load``).

  Raises:
    ValueError: one line naming the field and what is wrong with it.
  """
  if not isinstance(entries, Mapping):
    raise ValueError('the top level must be a mapping of hyperparameter '
                     f'names to distributions, got {type(entries).__name__}')
  if not entries:
    raise ValueError('it defines no hyperparameter')
  distributions = {}
  kinds = ', '.join(FILE_KINDS)
  for name, entry in entries.items():
    where = f'search space field {name!r}'
    if not isinstance(entry, Mapping) or 'kind' not in entry:
      raise ValueError(f'{where}: expected {{"kind": one of {kinds}, ...}}, '
                       f'got {entry!r}')
    entry = _normalized(entry)
    kind = entry['kind']
    if kind not in FILE_KINDS:
      raise ValueError(f'{where}: kind {kind!r} is unknown; choose one of '
                       f'{kinds} (or loguniform, choice)')
    cls, keys = FILE_KINDS[kind]
    given = [k for k in entry if k != 'kind']
    unknown = [k for k in given if k not in keys]
    missing = [k for k in keys if k not in entry]
    if unknown or missing:
      raise ValueError(f'{where}: a {kind} takes {", ".join(keys)}; '
                       + (f'unknown {unknown}' if unknown else
                          f'missing {missing}'))
    if kind == 'categorical':
      values = entry['values']
      if not isinstance(values, (list, tuple)) or not all(
          _is_number(v) for v in values):
        raise ValueError(f'{where}: categorical values must be a list of '
                         f'numbers, got {values!r}')
      distributions[str(name)] = cls(tuple(values))
    else:
      bad = [k for k in keys if not _is_number(entry[k])]
      if bad:
        raise ValueError(f'{where}: {bad[0]} must be a number, got '
                         f'{entry[bad[0]]!r}')
      distributions[str(name)] = cls(float(entry['low']), float(entry['high']))
  return SearchSpace(distributions)  # checks bounds, naming the field


def _is_number(x: Any) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def load(path: str) -> SearchSpace:
  """Reads a search space from a JSON file (YAML for ``.yaml``/``.yml``,
  with PyYAML installed)::

      {"policy_lr": {"kind": "log_uniform", "low": 3e-5, "high": 3e-3},
       "discount": {"kind": "discount", "low": 0.9, "high": 0.999},
       "exploration_noise": {"kind": "uniform", "low": 0.0, "high": 0.5},
       "policy_update_fraction": {"kind": "categorical",
                                  "values": [0.25, 0.5, 1.0]}}

  Host-side. Whether the names are fields of the agent's hyperparameters is
  checked against the agent (``validate``).

  Raises:
    ValueError: one line: an unreadable file, bad syntax, or a field whose
      distribution is wrong (see ``from_dict``).
  """
  return from_dict(settings_file.read(path))
