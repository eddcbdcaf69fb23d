"""Statistics over seeds for the learning report (host-side, numpy/scipy).

A handful of seeds per method cannot carry a mean +- std alone (Agarwal et
al., "Deep Reinforcement Learning at the Edge of the Statistical Precipice",
NeurIPS 2021). The report gives, per task and method:

* the mean and the sample standard deviation (``ddof=1``: the population
  formula, ``ddof=0``, understates the spread by 15-41% at 2-4 seeds);
* the interquartile mean (IQM: the mean of the middle 50% of the seeds,
  ``scipy.stats.trim_mean(x, 0.25)``) with a 95% percentile-bootstrap
  confidence interval over seeds (``scipy.stats.bootstrap``);
* for a rule, its probability of improvement over the ``seeds`` baseline,
  P(X > Y) + P(X = Y) / 2 for a seed X of the rule and a seed Y of the
  baseline (the Mann-Whitney U statistic over n x m pairs, as rliable
  defines it), with a 95% bootstrap interval resampling each side's seeds
  independently (rliable's stratified bootstrap with one task). A rule is
  called better than the baseline only where that interval lies above 1/2,
  worse where it lies below, and only with ``MIN_SEEDS`` seeds a side.

scipy's bootstrap rather than rliable: scipy is already installed with the
library's dependencies and implements the same percentile bootstrap;
rliable would add arch and its dependencies for three functions.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import NamedTuple, Sequence

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
RESAMPLES = 10_000
SEED = 0  # the bootstrap's resampling is fixed, so the report is too


class Interval(NamedTuple):
  """A point estimate and its confidence interval (NaN where undefined)."""

  value: float
  low: float
  high: float


def sample_std(values: Sequence[float]) -> float:
  """The sample standard deviation (``ddof=1``); NaN below 2 values."""
  values = np.asarray(values, np.float64)
  return float(np.std(values, ddof=1)) if values.size >= 2 else math.nan


def iqm(values: Sequence[float]) -> float:
  """The interquartile mean: the mean of the middle 50% of ``values``
  (scipy trims ``floor(0.25 n)`` values from each end)."""
  return float(stats.trim_mean(np.asarray(values, np.float64), 0.25))


def iqm_interval(values: Sequence[float]) -> Interval:
  """The IQM with its 95% percentile-bootstrap interval over the values;
  the interval is NaN below 2 values or when every value is equal."""
  values = np.asarray(values, np.float64)
  point = iqm(values)
  if values.size < 2 or np.all(values == values[0]):
    return Interval(point, math.nan, math.nan)
  result = stats.bootstrap(
      (values,), lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
      confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
      method='percentile', rng=np.random.default_rng(SEED))
  return Interval(point, float(result.confidence_interval.low),
                  float(result.confidence_interval.high))


def probability_of_improvement(x: Sequence[float],
                               y: Sequence[float]) -> float:
  """P(X > Y) + P(X = Y) / 2 over every pair of a value of ``x`` and one of
  ``y``."""
  x = np.asarray(x, np.float64)[:, None]
  y = np.asarray(y, np.float64)[None, :]
  return float(np.mean((x > y) + 0.5 * (x == y)))


def _poi_vectorized(x, y, axis=-1):
  x = np.moveaxis(np.asarray(x), axis, -1)[..., :, None]
  y = np.moveaxis(np.asarray(y), axis, -1)[..., None, :]
  return np.mean((x > y) + 0.5 * (x == y), axis=(-2, -1))


def improvement_interval(x: Sequence[float],
                         y: Sequence[float]) -> Interval:
  """The probability that ``x`` improves on ``y`` with its 95% bootstrap
  interval, each side's values resampled independently; NaN interval when
  either side has fewer than 2 values."""
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  point = probability_of_improvement(x, y)
  if x.size < 2 or y.size < 2:
    return Interval(point, math.nan, math.nan)
  result = stats.bootstrap(
      (x, y), _poi_vectorized, confidence_level=CONFIDENCE,
      n_resamples=RESAMPLES, method='percentile', paired=False,
      rng=np.random.default_rng(SEED))
  return Interval(point, float(result.confidence_interval.low),
                  float(result.confidence_interval.high))


# Seeds each side needs before a verdict. With complete separation (every
# seed of one side above every seed of the other) the percentile bootstrap
# gives [1, 1] whatever the counts, though 2 seeds against 4 separate so by
# chance with probability 1/15; from 5 against 5 that chance is 1/252.
MIN_SEEDS = 5


@functools.cache
def smallest_decisive_probability(n: int, m: int) -> float:
  """The smallest probability of improvement that is called ``better``
  with ``n`` seeds of a rule against ``m`` of the baseline, whichever seeds
  they are: the least P from which every ordering of the ``n + m`` returns
  gets an interval above 1/2 (ties aside). P and its bootstrap depend on
  the returns' ranks alone, so the orderings are all the ways of drawing
  the rule's ranks from ``n + m``; by symmetry ``1 - P`` is the largest P
  called ``worse``."""
  ranks = range(n + m)
  decisive = {}  # P -> whether every ordering with that P is called better
  for rule in itertools.combinations(ranks, n):
    baseline = [r for r in ranks if r not in rule]
    interval = improvement_interval(rule, baseline)
    key = round(interval.value * n * m)  # pairs won: P is a count over n m
    decisive[key] = decisive.get(key, True) and interval.low > 0.5
  wins = n * m
  while wins - 1 in decisive and decisive[wins - 1]:
    wins -= 1
  return wins / (n * m)


def normal_gap(probability: float) -> float:
  """The gap of two normal means, in their common standard deviation, at
  which a draw of one exceeds a draw of the other with ``probability``:
  P(X > Y) = Phi(gap / sqrt(2))."""
  return float(math.sqrt(2.0) * stats.norm.ppf(probability))


def verdict(interval: Interval, seeds: int) -> str:
  """``better`` / ``worse`` where the interval excludes 1/2, else
  ``not distinguishable``; ``too few seeds`` when either side has fewer
  than ``MIN_SEEDS`` (``seeds``: the smaller side's count)."""
  if math.isnan(interval.low) or seeds < MIN_SEEDS:
    return f'too few seeds (< {MIN_SEEDS})'
  if interval.low > 0.5:
    return 'better'
  if interval.high < 0.5:
    return 'worse'
  return 'not distinguishable'


def fmt_value(value: float, digits: int = 0) -> str:
  """``value`` to ``digits`` decimals, or to two significant digits where
  those decimals would round a nonzero value to zero (a return of -2e-06
  reads ``-2e-06``, not ``-0``)."""
  if value != 0 and abs(value) < 0.5 * 10.0 ** -digits:
    return f'{value:.2g}'
  return f'{value:.{digits}f}'


def fmt_interval(interval: Interval, digits: int = 0) -> str:
  """``value [low, high]``, or the value alone without an interval, each
  by ``fmt_value``."""
  if math.isnan(interval.low):
    return fmt_value(interval.value, digits)
  return (f'{fmt_value(interval.value, digits)} '
          f'[{fmt_value(interval.low, digits)}, '
          f'{fmt_value(interval.high, digits)}]')
