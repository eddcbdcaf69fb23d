"""PB2's explore: a time-varying GP bandit over the population's history.

Population-Based Bandits (Parker-Holder, Nguyen & Roberts 2020, "Provably
Efficient Online Hyperparameter Optimization with Population-Based
Bandits") keeps PBT's exploit and replaces its random explore: a Gaussian
process models the change of a member's fitness over one interval as a
function of the interval (time) and of the hyperparameters it trained
with, fitted on every member's intervals so far, and a replaced member
takes the hyperparameters that maximise an upper confidence bound of that
change at the coming interval.

Host-side module (numpy and scipy; called once per PBT decision).

The model, as in the paper:

* Inputs: the interval's index ``t`` (PBT decisions so far) and the
  continuous hyperparameters ``x`` scaled to ``[0, 1]`` within the search
  space's bounds (``LogUniform`` and ``Discount`` fields in log space,
  where their priors are uniform). Output: the change of fitness over the
  interval, standardised over the data.
* Kernel: ``k = s2 * exp(-|x - x'|^2 / (2 l^2)) * (1 - eps)^(|t - t'| / 2)``,
  a squared exponential over hyperparameters times the time-varying kernel
  of Bogunovic et al. (2016), which forgets old intervals at the rate
  ``eps``; plus Gaussian noise ``n2``. ``s2, l, eps, n2`` maximise the
  log marginal likelihood (L-BFGS-B from fixed starting points, so a
  seed gives the same fit).
* Acquisition: GP-UCB, ``mean + sqrt(beta_t) * std`` at the coming
  interval, maximised over a scrambled Sobol set of :data:`CANDIDATES`
  points, with ``beta_t = 2 log(|D| t^2 pi^2 / (6 delta)) / 5`` (Srinivas
  et al. 2010, Theorem 1, for a finite set ``D``; the division by 5 is
  theirs, from their experiments), ``delta = 0.1``.
* Several members replaced at one decision (the paper's parallel,
  "batch" setting): chosen in turn, each with the standard deviation of
  the GP conditioned also on the points the coming interval will try
  already, the members that were not replaced and the choices made so
  far (GP-BUCB, Desautels et al. 2014), so that they spread out; the mean
  stays the data's.

Departures, each for a stated reason:

* Categorical fields are not modelled: PBT's explore (perturb or
  resample, ``--explore``'s companions) sets them, as it does without
  PB2. The paper's follow-up (PB2-Mix) adds a bandit for them.
* Data is kept for the last :data:`WINDOW` intervals of all members (the
  time kernel gives older ones little weight, and the fit is cubic in the
  data).
* Before any interval has a before and after fitness (the first
  decision), the GP is its prior: every candidate ties, and the first
  candidate of the scrambled Sobol set, a uniform draw over the box, is
  taken for the first member, the next ones spread out by GP-BUCB.

Why no GP library: scikit-learn's ``GaussianProcessRegressor`` has no
kernel over a subset of the inputs, so the product of a time kernel and a
hyperparameter kernel needs a custom ``Kernel`` subclass there anyway, and
GPy is unmaintained; the Cholesky algebra below is a few dozen lines and
``tests/population/test_pb2.py`` checks it against worked posteriors.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
from scipy import optimize
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import qmc

from fastpbrl import search_space as ss

CANDIDATES = 1024  # Sobol points the acquisition is maximised over
WINDOW = 512  # data rows kept (the newest)
DELTA = 0.1  # GP-UCB's failure probability
BETA_SCALE = 0.2  # Srinivas et al.'s experiments scale beta_t by 1/5
# Bounds of the fitted kernel settings (on standardised outputs).
VARIANCE_BOUNDS = (1e-2, 1e2)
LENGTHSCALE_BOUNDS = (1e-2, 1e1)
EPSILON_BOUNDS = (1e-4, 0.5)
NOISE_BOUNDS = (1e-4, 1e1)


class KernelParams(NamedTuple):
  variance: float  # s2
  lengthscale: float  # l
  epsilon: float  # eps: how fast old intervals are forgotten
  noise: float  # n2


class GP(NamedTuple):
  """A GP posterior: its data (``t [n]``, ``x [n, d]``), settings, and
  the Cholesky factor and weights of the data's kernel matrix."""

  t: np.ndarray
  x: np.ndarray
  params: KernelParams
  factor: tuple  # scipy's cho_factor of K + n2 I
  alpha: np.ndarray  # (K + n2 I)^-1 y


# ----------------------------------------------------------------- encoding


def continuous_fields(space: ss.SearchSpace) -> tuple[str, ...]:
  """The fields PB2 models: every non-categorical field of ``space``."""
  return tuple(name for name, dist in space.distributions
               if not isinstance(dist, ss.Categorical))


def encode(space: ss.SearchSpace, values: dict) -> np.ndarray:
  """``[n, d]`` in ``[0, 1]``: each continuous field's ``[n]`` values
  within its bounds (log space for ``LogUniform`` and ``Discount``);
  values outside the bounds are clipped to them."""
  columns = []
  for name in continuous_fields(space):
    dist = space[name]
    x = np.asarray(values[name], np.float64)
    if isinstance(dist, ss.Uniform):
      lo, hi = dist.low, dist.high
    else:
      if isinstance(dist, ss.Discount):
        x = 1.0 - x
      lo, hi = ss._log_bounds(dist)  # noqa: SLF001 (one definition)
      x = np.log(np.maximum(x, 1e-300))
    columns.append(np.clip((x - lo) / (hi - lo), 0.0, 1.0))
  return np.stack(columns, axis=-1)


def decode(space: ss.SearchSpace, x: np.ndarray) -> dict:
  """Inverse of :func:`encode`: ``{field: [n] values}``."""
  out = {}
  for j, name in enumerate(continuous_fields(space)):
    dist = space[name]
    u = np.clip(np.asarray(x, np.float64)[:, j], 0.0, 1.0)
    if isinstance(dist, ss.Uniform):
      out[name] = dist.low + u * (dist.high - dist.low)
      continue
    lo, hi = ss._log_bounds(dist)  # noqa: SLF001
    value = np.exp(lo + u * (hi - lo))
    if isinstance(dist, ss.Discount):
      value = 1.0 - value
    out[name] = np.clip(value, dist.low, dist.high)
  return out


# ---------------------------------------------------------------------- GP


def kernel(t1: np.ndarray, x1: np.ndarray, t2: np.ndarray, x2: np.ndarray,
           params: KernelParams) -> np.ndarray:
  """``[n1, n2]``: the time-varying squared-exponential kernel."""
  sq = ((x1[:, None, :] - x2[None, :, :]) ** 2).sum(-1)
  dt = np.abs(t1[:, None] - t2[None, :])
  return (params.variance * np.exp(-sq / (2.0 * params.lengthscale**2))
          * (1.0 - params.epsilon) ** (dt / 2.0))


def log_marginal_likelihood(t, x, y, params: KernelParams) -> float:
  """``log p(y | t, x)`` under the GP with ``params``."""
  k = kernel(t, x, t, x, params) + params.noise * np.eye(len(y))
  try:
    factor = cho_factor(k, lower=True)
  except np.linalg.LinAlgError:
    return -np.inf
  alpha = cho_solve(factor, y)
  log_det = 2.0 * np.log(np.diag(factor[0])).sum()
  return float(-0.5 * y @ alpha - 0.5 * log_det
               - 0.5 * len(y) * math.log(2.0 * math.pi))


_BOUNDS = (VARIANCE_BOUNDS, LENGTHSCALE_BOUNDS, EPSILON_BOUNDS, NOISE_BOUNDS)
# Starting points of the likelihood's maximisation (log space but epsilon).
_STARTS = ((1.0, 0.2, 0.1, 0.1), (1.0, 1.0, 0.01, 0.5), (1.0, 0.05, 0.3, 0.01))
# The settings with no data to fit them (the first decision): the first
# start, whose length scale spreads several choices over the box.
PRIOR = KernelParams(*_STARTS[0])


def _to_params(z: np.ndarray) -> KernelParams:
  return KernelParams(math.exp(z[0]), math.exp(z[1]), float(z[2]),
                      math.exp(z[3]))


def fit_params(t: np.ndarray, x: np.ndarray, y: np.ndarray) -> KernelParams:
  """The kernel settings of highest log marginal likelihood within the
  bounds, from each of the fixed starting points."""
  bounds = [(math.log(lo), math.log(hi)) for lo, hi in _BOUNDS]
  bounds[2] = EPSILON_BOUNDS

  def loss(z):
    value = log_marginal_likelihood(t, x, y, _to_params(z))
    return 1e10 if not np.isfinite(value) else -value

  best, best_loss = None, np.inf
  for start in _STARTS:
    z0 = np.array([math.log(start[0]), math.log(start[1]), start[2],
                   math.log(start[3])])
    result = optimize.minimize(loss, z0, method='L-BFGS-B', bounds=bounds)
    if result.fun < best_loss:
      best, best_loss = result.x, result.fun
  return _to_params(best)


def posterior(t: np.ndarray, x: np.ndarray, y: np.ndarray,
              params: KernelParams) -> GP:
  """The GP conditioned on ``y`` at ``(t, x)``."""
  k = kernel(t, x, t, x, params) + params.noise * np.eye(len(y))
  factor = cho_factor(k, lower=True)
  return GP(t, x, params, factor, cho_solve(factor, y))


def predict(gp: GP, t: np.ndarray, x: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray]:
  """Posterior mean and variance (of the latent function) at ``(t, x)``."""
  cross = kernel(t, x, gp.t, gp.x, gp.params)
  mean = cross @ gp.alpha
  v = cho_solve(gp.factor, cross.T)
  variance = gp.params.variance - (cross * v.T).sum(-1)
  return mean, np.maximum(variance, 0.0)


def beta(t: int, num_candidates: int) -> float:
  """GP-UCB's ``beta_t`` for a finite candidate set (module docstring)."""
  t = max(int(t), 1)
  return BETA_SCALE * 2.0 * math.log(
      num_candidates * t**2 * math.pi**2 / (6.0 * DELTA))


# -------------------------------------------------------------- the choice


def candidates(dims: int, seed: int) -> np.ndarray:
  """``[CANDIDATES, dims]`` scrambled Sobol points in ``[0, 1]^dims``."""
  return qmc.Sobol(dims, scramble=True, seed=seed).random(CANDIDATES)


def select(t: np.ndarray, x: np.ndarray, y: np.ndarray, t_next: int,
           count: int, points: np.ndarray,
           running: np.ndarray | None = None) -> np.ndarray:
  """``[count, d]``: the hyperparameters (in ``[0, 1]^d``) of ``count``
  members starting interval ``t_next``, chosen in turn from ``points``
  by GP-UCB with GP-BUCB's shrinking variance (module docstring).

  ``t, x, y``: the data, one row per member interval (``y`` the raw
  change of fitness; it is standardised here). No data: the prior.
  ``running``: ``[k, d]`` hyperparameters the other members train with
  in interval ``t_next`` (pending points, like the choices).
  """
  dims = points.shape[1]
  if len(y):
    scale = float(np.std(y)) or 1.0
    z = (np.asarray(y, np.float64) - float(np.mean(y))) / scale
    params = fit_params(t, x, z)
    mean, _ = predict(posterior(t, x, z, params), np.full(len(points), t_next,
                                                          np.float64), points)
  else:
    params, mean = PRIOR, np.zeros(len(points))
  kappa = math.sqrt(beta(t_next, len(points)))
  chosen = np.zeros((0, dims))
  running = np.zeros((0, dims)) if running is None else np.asarray(
      running, np.float64).reshape(-1, dims)
  seen_t = np.concatenate([np.asarray(t, np.float64),
                           np.full(len(running), float(t_next))])
  seen_x = np.concatenate([np.asarray(x, np.float64).reshape(-1, dims),
                           running])
  t_points = np.full(len(points), t_next, np.float64)
  for _ in range(count):
    if len(seen_t):
      # The variance needs no outputs: zeros stand for the pending ones.
      gp = posterior(seen_t, seen_x, np.zeros(len(seen_t)), params)
      _, variance = predict(gp, t_points, points)
    else:
      variance = np.full(len(points), params.variance)
    best = int(np.argmax(mean + kappa * np.sqrt(variance)))
    chosen = np.vstack([chosen, points[best]])
    seen_t = np.append(seen_t, float(t_next))
    seen_x = np.vstack([seen_x.reshape(-1, dims), points[best][None]])
  return chosen


def empty_history(dims: int) -> np.ndarray:
  """PB2's data in a PBT rule state, of fixed shape (so that a checkpoint
  restores into the state's template): ``[WINDOW, 2 + d]`` rows of ``(t,
  change of fitness, x...)``, NaN where unused, the newest last."""
  return np.full((WINDOW, 2 + dims), np.nan)


def append(rows: np.ndarray, t: int, x: np.ndarray,
           change: np.ndarray) -> np.ndarray:
  """``rows`` with one row per member interval whose change is known
  (finite); the oldest rows make room."""
  keep = np.isfinite(change)
  new = np.concatenate([np.full((keep.sum(), 1), float(t)),
                        change[keep, None], x[keep]], axis=1)
  return np.concatenate([rows, new])[-len(rows):] if len(new) else rows


def data(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``(t, x, change)`` of the used rows."""
  used = rows[np.isfinite(rows[:, 0])]
  return used[:, 0], used[:, 2:], used[:, 1]


def explore(space: ss.SearchSpace, rows: np.ndarray, t_next: int,
            members: Sequence[int], seed: int,
            running: np.ndarray | None = None) -> dict:
  """PB2's new values ``{field: [len(members)]}`` of the continuous fields
  for ``members``, which start interval ``t_next`` beside members
  training with ``running`` (encoded, ``[k, d]``)."""
  t, x, change = data(rows)
  dims = len(continuous_fields(space))
  points = candidates(dims, seed)
  chosen = select(t, x, change, t_next, len(members), points, running)
  return decode(space, chosen)
