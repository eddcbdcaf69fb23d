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

The model, as in the paper and its authors' implementation (Ray Tune's
``PB2``, which they wrote; compared with ``ray/tune/schedulers/pb2.py``
and ``pb2_utils.py`` of its GPy-based versions):

* Inputs: the interval's index ``t`` (PBT decisions so far), the fitness
  the member had when the interval started (its "context", scaled to
  ``[0, 1]`` over the data and the decision's contexts), and the
  continuous hyperparameters ``x`` scaled to ``[0, 1]`` within the search
  space's bounds. Output: the change of fitness over the interval,
  standardised over the data and clipped to ``[-CLIP, CLIP]`` so that one
  collapse does not set the scale.
* Kernel: ``k = s2 * exp(-|z - z'|^2 / (2 l^2)) * (1 - eps)^(|t - t'| / 2)``
  with ``z`` the context and ``x``: a squared exponential times the
  time-varying kernel of Bogunovic et al. (2016), which forgets old
  intervals at the rate ``eps``; plus Gaussian noise ``n2``. ``s2, l,
  eps, n2`` maximise the log marginal likelihood (L-BFGS-B from fixed
  starting points, so a seed gives the same fit), with ``l`` at most
  ``1/sqrt(2)`` (the authors' implementation caps it at 1 in its
  ``exp(-d^2 / l)`` form), so that the mean does not extrapolate one
  trend to a corner of the box.
* Acquisition: GP-UCB, ``mean + sqrt(beta) * std``, with ``beta = 0.2 +
  max(0, log(0.4 n))`` for ``n`` data rows (the authors' schedule; the
  paper's regret bound sets ``beta`` only up to constants). A copy takes
  its parent's weights, so it is chosen at its parent's context: the
  fitness the parent's last interval started from, as the authors'
  implementation does. That keeps the query inside the data (the
  parent's fitness now is usually above every start the data holds,
  where the GP's mean fades to its prior and the choice would follow the
  variance alone). Before the parent has a last interval, its fitness
  now.
* Several members replaced at one decision (the paper's parallel,
  "batch" setting): chosen in turn, each with the standard deviation of
  the GP conditioned also on the points the coming interval will try
  already, the members that were not replaced and the choices made so
  far (GP-BUCB, Desautels et al. 2014), so that they spread out; the mean
  stays the data's.

Departures from the paper or its authors' implementation, each for a
stated reason:

* Categorical fields are not modelled: PBT's explore (perturb or
  resample, ``--explore``'s companions) sets them, as it does without
  PB2. The paper's follow-up (PB2-Mix) adds a bandit for them.
* ``LogUniform`` and ``Discount`` fields are scaled in log space (of
  ``1 - gamma`` for a discount), where their priors are uniform; the
  authors scale every field linearly within its bounds, which would put
  nine tenths of a learning rate's range from 1e-5 to 1e-3 above 1e-4.
* Time is the decision count, and the choice is for the coming interval
  ``t + 1``, as the paper's time-varying GP-UCB writes it; the authors'
  implementation scales time to ``[0, 1]`` over its data and queries at
  the newest rows' time.
* Data is kept for the last :data:`WINDOW` intervals of all members (the
  time kernel gives older ones little weight, and the fit is cubic in the
  data); the authors keep up to 1,000 and choose how many by likelihood.
* Before any interval has a before and after fitness (the first
  decision), the GP is its prior, and the choice follows the variance
  alone: the first candidate of the scrambled Sobol set (a uniform draw
  over the box) where no member is still running, else the point
  farthest from the running members by GP-BUCB. The authors'
  implementation keeps the parent's values then, which makes a first
  decision a plain copy.
* The acquisition is maximised over a fixed Sobol set rather than by
  L-BFGS-B from random starts (a seed then fixes the choice), and uses
  the standard deviation as the paper writes it (the authors'
  implementation adds ``sqrt(beta)`` times the variance).
* The members still training (not replaced) are pending points too, at
  their own context, with the kernel settings fitted on the data:
  GP-BUCB's batch as Desautels et al. write it. The authors'
  implementation counts only the choices of the current decision, puts
  them at the chosen member's context, and refits the settings with
  them.
* The contexts are scaled over the data and this decision's contexts
  (at the first decision there is no data to scale them by); the authors
  scale over the data alone.

Why no GP library: scikit-learn's ``GaussianProcessRegressor`` has no
kernel over a subset of the inputs, so the product of a time kernel and a
hyperparameter kernel needs a custom ``Kernel`` subclass there anyway, and
GPy is unmaintained; the Cholesky algebra below is a few dozen lines and
``tests/rules/pbt/test_pb2.py`` checks it against worked posteriors.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np
from scipy import optimize
from scipy.linalg import cho_factor, cho_solve
from scipy.stats import qmc

from fastpbrl.core import search_space as ss

CANDIDATES = 1024  # Sobol points the acquisition is maximised over
WINDOW = 512  # data rows kept (the newest)
# beta = BETA_BASE + max(0, log(BETA_RATE * n)): the authors' schedule.
BETA_BASE = 0.2
BETA_RATE = 0.4
CLIP = 2.0  # standardised changes of fitness are clipped to +-CLIP
# Bounds of the fitted kernel settings (on standardised outputs).
VARIANCE_BOUNDS = (1e-2, 1e2)
LENGTHSCALE_BOUNDS = (1e-2, 1.0 / math.sqrt(2.0))
EPSILON_BOUNDS = (1e-4, 0.5)
NOISE_BOUNDS = (1e-4, 1e1)


class KernelParams(NamedTuple):
  variance: float  # s2
  lengthscale: float  # l
  epsilon: float  # eps: how fast old intervals are forgotten
  noise: float  # n2


class GP(NamedTuple):
  """A GP posterior: its data (``t [n]``, inputs ``z [n, e]``), settings,
  and the Cholesky factor and weights of the data's kernel matrix."""

  t: np.ndarray
  x: np.ndarray
  params: KernelParams
  factor: tuple  # scipy's cho_factor of K + n2 I
  alpha: np.ndarray  # (K + n2 I)^-1 y


class History(NamedTuple):
  """PB2's data, one entry per member interval."""

  t: np.ndarray  # [n] the interval's index
  start: np.ndarray  # [n] the member's fitness when it started
  x: np.ndarray  # [n, d] its hyperparameters, encoded
  change: np.ndarray  # [n] its change of fitness over the interval


class Pending(NamedTuple):
  """Members that train through the coming interval with known values:
  their starting fitness ``start [k]`` and hyperparameters ``x [k, d]``."""

  start: np.ndarray
  x: np.ndarray


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
_STARTS = ((1.0, 0.2, 0.1, 0.1), (1.0, 0.7, 0.01, 0.5), (1.0, 0.05, 0.3, 0.01))
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


def beta(n: int) -> float:
  """GP-UCB's ``beta`` with ``n`` data rows (module docstring)."""
  return BETA_BASE + max(0.0, math.log(BETA_RATE * n)) if n > 0 else BETA_BASE


def standardise(change: np.ndarray) -> np.ndarray:
  """``change`` less its mean, over its standard deviation (1 if it has
  none), clipped to ``[-CLIP, CLIP]``."""
  change = np.asarray(change, np.float64)
  scale = float(np.std(change)) or 1.0
  return np.clip((change - float(np.mean(change))) / scale, -CLIP, CLIP)


def start_scale(start: np.ndarray) -> tuple[float, float]:
  """``(low, span)`` that take the fitness values ``start`` to ``[0, 1]``
  (span 1 where they hold one value, or none)."""
  if not len(start):
    return 0.0, 1.0
  low, high = float(np.min(start)), float(np.max(start))
  # Values equal but for rounding are one value, not a spread of [0, 1].
  if high - low <= 1e-9 * max(1.0, abs(low), abs(high)):
    return low, 1.0
  return low, high - low


def inputs(start, x: np.ndarray, scale: tuple[float, float]) -> np.ndarray:
  """``[n, 1 + d]``: the GP's inputs besides time, the scaled starting
  fitness (one value, or one per row of ``x [n, d]``) then ``x``."""
  x = np.asarray(x, np.float64)
  low, span = scale
  start = np.broadcast_to((np.asarray(start, np.float64) - low) / span,
                          (len(x),))
  return np.concatenate([start[:, None], x], axis=1)


# -------------------------------------------------------------- the choice


def candidates(dims: int, seed: int) -> np.ndarray:
  """``[CANDIDATES, dims]`` scrambled Sobol points in ``[0, 1]^dims``."""
  return qmc.Sobol(dims, scramble=True, seed=seed).random(CANDIDATES)


def select(history: History, t_next: int, starts: np.ndarray,
           points: np.ndarray, running: Pending | None = None) -> np.ndarray:
  """``[len(starts), d]``: the hyperparameters (in ``[0, 1]^d``) of the
  members starting interval ``t_next`` from fitness ``starts``, chosen in
  turn from ``points`` by GP-UCB with GP-BUCB's shrinking variance
  (module docstring). No data: the prior. ``running``: the members that
  train through interval ``t_next`` beside them (pending points, like the
  choices)."""
  dims = points.shape[1]
  if running is None:
    running = Pending(np.zeros(0), np.zeros((0, dims)))
  starts = np.asarray(starts, np.float64)
  # Every fitness this decision knows sets the scale, so that at the first
  # (no data) the members still running are near their parent's copy.
  scale = start_scale(np.concatenate([history.start, running.start, starts]))
  t_points = np.full(len(points), float(t_next))
  z = inputs(history.start, history.x, scale)
  gp = None
  if len(history.change):
    y = standardise(history.change)
    params = fit_params(history.t, z, y)
    gp = posterior(history.t, z, y, params)
  else:
    params = PRIOR
  kappa = math.sqrt(beta(len(history.change)))
  seen_t = np.concatenate([history.t, np.full(len(running.start),
                                              float(t_next))])
  seen_z = np.concatenate([z, inputs(running.start, running.x, scale)])
  chosen = np.zeros((0, dims))
  for start in starts:
    z_points = inputs(start, points, scale)
    mean = (predict(gp, t_points, z_points)[0] if gp is not None
            else np.zeros(len(points)))
    if len(seen_t):
      # The variance needs no outputs: zeros stand for the pending ones.
      pending = posterior(seen_t, seen_z, np.zeros(len(seen_t)), params)
      _, variance = predict(pending, t_points, z_points)
    else:
      variance = np.full(len(points), params.variance)
    best = int(np.argmax(mean + kappa * np.sqrt(variance)))
    chosen = np.vstack([chosen, points[best]])
    seen_t = np.append(seen_t, float(t_next))
    seen_z = np.vstack([seen_z, z_points[best][None]])
  return chosen


def empty_history(dims: int) -> np.ndarray:
  """PB2's data in a PBT rule state, of fixed shape (so that a checkpoint
  restores into the state's template): ``[WINDOW, 3 + d]`` rows of ``(t,
  starting fitness, change of fitness, x...)``, NaN where unused, the
  newest last."""
  return np.full((WINDOW, 3 + dims), np.nan)


def append(rows: np.ndarray, t: int, start: np.ndarray, x: np.ndarray,
           change: np.ndarray) -> np.ndarray:
  """``rows`` with one row per member interval whose change is known
  (finite); the oldest rows make room."""
  keep = np.isfinite(change)
  new = np.concatenate([np.full((keep.sum(), 1), float(t)),
                        start[keep, None], change[keep, None], x[keep]],
                       axis=1)
  return np.concatenate([rows, new])[-len(rows):] if len(new) else rows


def data(rows: np.ndarray) -> History:
  """The used rows of ``rows``."""
  used = rows[np.isfinite(rows[:, 0])]
  return History(used[:, 0], used[:, 1], used[:, 3:], used[:, 2])


def explore(space: ss.SearchSpace, rows: np.ndarray, t_next: int,
            starts: Sequence[float], seed: int,
            running: Pending | None = None) -> dict:
  """PB2's new values ``{field: [len(starts)]}`` of the continuous fields
  for the members that start interval ``t_next`` from fitness ``starts``
  (their parents'), beside the ``running`` members."""
  dims = len(continuous_fields(space))
  chosen = select(data(rows), t_next, np.asarray(starts, np.float64),
                  candidates(dims, seed), running)
  return decode(space, chosen)
