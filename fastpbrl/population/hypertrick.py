"""HyperTrick (Heinrich & Frosio, "Metaoptimization on a Distributed System
for Deep Reinforcement Learning"): asynchronous early stopping over phases.

``W`` configurations ("workers") are tried in total, ``num_slots`` at a time
(the population). Each worker trains through ``P`` phases and reports a
metric (higher is better) at the end of each. For the phase ``p`` it just
finished (``p = 1..P``, sec. 3.2):

* **Data Collection Mode**: the first ``M_p`` reporters of phase ``p``
  continue unconditionally, with (eq. 2, as we reconstruct it from the proof
  of eq. 1 and Table 1)
  ``M_p = floor(W (1 - r)^(p-1) (1 - r / q))``,
  where ``r`` is the target eviction rate and ``q = 0.5`` the quantile below
  which a worker is terminated (the paper's Fig. 2: a late worker continues
  "only if its score is in the top 50%").
* **Worker Selection Mode**: afterwards, a reporter whose metric is below the
  ``q``-quantile of the metrics already reported for phase ``p`` is
  terminated. With a stationary metric, each of the expected ``E[W_p] - M_p
  = E[W_p] r / q`` late reporters is terminated with probability ``q``, so
  ``r E[W_p]`` are terminated and ``E[W_{p+1}] = W (1 - r)^p`` (eq. 1).

A terminated worker frees its slot, which restarts from phase one with fresh
parameters and newly sampled hyperparameters, until ``W`` workers have been
launched. A worker reporting its last phase completes (there is nothing left
to stop). The search ends with the best configuration observed (Algorithm 1,
line 11).

``HyperTrick`` is **host-side** bookkeeping (Python and numpy, not
jittable), driven by the run loop; ``reset_members`` is the pure JAX
function that gives restarted slots of the stacked state fresh weights and
newly sampled hyperparameters.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.population import search_space as ss
from fastpbrl.types import PRNGKey

CONTINUE = 'continue'
TERMINATE = 'terminate'
COMPLETE = 'complete'


@dataclasses.dataclass(frozen=True)
class HyperTrickConfig:
  """HyperTrick's inputs (Table 1 of the paper: r = 25%, P = 5 or 10)."""

  num_workers: int
  """W: configurations to try in total (100 in the paper's experiments)."""
  num_phases: int
  """P: phases per worker (units of training between reports)."""
  eviction_rate: float = 0.25
  """r: expected fraction of the workers in a phase terminated at its end."""
  quantile: float = 0.5
  """q: in Worker Selection Mode, a metric below this quantile of the phase's
  reported metrics is terminated; needs r < q <= 1."""

  def __post_init__(self):
    if self.num_workers < 1:
      raise ValueError(f'num_workers must be >= 1, got {self.num_workers}')
    if self.num_phases < 1:
      raise ValueError(f'num_phases must be >= 1, got {self.num_phases}')
    if not 0.0 < self.quantile <= 1.0:
      raise ValueError(f'quantile must be in (0, 1], got {self.quantile}')
    if not 0.0 < self.eviction_rate < self.quantile:
      raise ValueError(
          f'eviction_rate must be in (0, quantile={self.quantile}) so that '
          f'some workers pass each phase unconditionally, got '
          f'{self.eviction_rate}')


def expected_workers(config: HyperTrickConfig, phase: int) -> float:
  """Eq. 1: ``E[W_p] = W (1 - r)^(p - 1)`` workers reach phase ``p``."""
  return config.num_workers * (1.0 - config.eviction_rate) ** (phase - 1)


def min_continuing(config: HyperTrickConfig, phase: int) -> int:
  """Eq. 2: ``M_p``, reporters of phase ``p`` that continue unconditionally."""
  m = expected_workers(config, phase) * (
      1.0 - config.eviction_rate / config.quantile)
  return int(math.floor(m + 1e-9))


def expected_completion_rate(config: HyperTrickConfig) -> float:
  """Eq. 9: expected fraction of all ``W * P`` phases that are run."""
  return sum(expected_workers(config, p) for p in
             range(1, config.num_phases + 1)) / (
                 config.num_workers * config.num_phases)


def min_completion_rate(config: HyperTrickConfig) -> float:
  """Eq. 8: ``(1/P) sum_p M_p / W`` (every late reporter terminated)."""
  return sum(min_continuing(config, p) for p in
             range(1, config.num_phases + 1)) / (
                 config.num_workers * config.num_phases)


def _quantile(sorted_values: list[float], q: float) -> float:
  # numpy's default ('linear') quantile of an already sorted list.
  # A -inf (diverged) value below the quantile position makes it -inf
  # rather than NaN.
  pos = q * (len(sorted_values) - 1)
  lo = int(math.floor(pos))
  hi = min(lo + 1, len(sorted_values) - 1)
  low, high = sorted_values[lo], sorted_values[hi]
  if pos == lo or low == high or math.isinf(low):
    return low
  return low + (pos - lo) * (high - low)


class Report(NamedTuple):
  """The scheduler's answer to one end-of-phase report."""

  worker: int  # the worker that reported
  phase: int  # the phase it finished, 1-based
  decision: str  # CONTINUE, TERMINATE or COMPLETE
  new_worker: Optional[int]  # launched in the freed slot (restart it), else None


class Best(NamedTuple):
  worker: int
  metric: float
  phase: int  # the phase at whose end the metric was reported
  hparams: Optional[dict]


class HyperTrick:
  """Host-side HyperTrick scheduler over ``num_slots`` population slots.

  Usage::

    sched = HyperTrick(config, num_slots)
    sched.start()                       # slots 0..S-1 get workers 0..S-1
    ...                                 # train; at the end of a slot's phase:
    report = sched.report(slot, metric)
    if report.new_worker is not None:   # restart the slot from phase one:
      ...                               # reset_members(...), set_hparams(...)
    ...
    sched.best()                        # once sched.done

  Workers are numbered in launch order. Slots run asynchronously: different
  slots may be in different phases, as in the paper.
  """

  def __init__(self, config: HyperTrickConfig, num_slots: int):
    if num_slots < 1:
      raise ValueError(f'num_slots must be >= 1, got {num_slots}')
    self.config = config
    self.num_slots = num_slots
    self.slot_worker: list[Optional[int]] = [None] * num_slots
    self.worker_phase: dict[int, int] = {}  # phase the worker is running
    self.hparams: dict[int, dict] = {}
    self.history: list[tuple[int, int, float, str]] = []  # (worker, phase, metric, decision)
    self._sorted = [[] for _ in range(config.num_phases + 1)]  # per phase
    self.reported = np.zeros((config.num_phases + 1,), np.int64)
    self.terminated = np.zeros((config.num_phases + 1,), np.int64)
    self.launched = 0
    self._best: Optional[Best] = None
    self._started = False

  def _launch(self, slot: int) -> Optional[int]:
    if self.launched >= self.config.num_workers:
      self.slot_worker[slot] = None
      return None
    worker = self.launched
    self.launched += 1
    self.slot_worker[slot] = worker
    self.worker_phase[worker] = 1
    return worker

  def start(self) -> list[Optional[int]]:
    """Launches ``min(W, num_slots)`` workers (Algorithm 1, lines 2-3);
    returns the worker of each slot (``None`` for an idle slot)."""
    if self._started:
      raise RuntimeError('HyperTrick.start was already called')
    self._started = True
    for slot in range(self.num_slots):
      self._launch(slot)
    return list(self.slot_worker)

  def set_hparams(self, worker: int, hparams: dict) -> None:
    """Records the hyperparameters a worker runs with (for ``best``)."""
    self.hparams[int(worker)] = dict(hparams)

  @property
  def done(self) -> bool:
    """All ``W`` workers launched and none running."""
    return (self._started and self.launched >= self.config.num_workers
            and all(w is None for w in self.slot_worker))

  def report(self, slot: int, metric: float, launch: bool = True) -> Report:
    """The worker in ``slot`` finished its current phase with ``metric``.

    ``launch=False``: a stopped worker is not replaced (the slot goes idle),
    for a caller whose budget could not train a new worker any more.

    Returns:
      The decision; when the worker stops (terminated or complete) and fewer
      than ``W`` workers were launched, ``new_worker`` is the worker now in
      ``slot``, to be restarted from phase one with fresh parameters and
      newly sampled hyperparameters.
    """
    worker = self.slot_worker[slot]
    if worker is None:
      raise ValueError(f'slot {slot} has no running worker')
    metric = float(metric)
    if not math.isfinite(metric):
      metric = -math.inf  # a diverged worker ranks last
    phase = self.worker_phase[worker]
    seen = self._sorted[phase]
    if len(seen) < min_continuing(self.config, phase):
      keep = True  # Data Collection Mode
    else:  # Worker Selection Mode
      keep = metric > -math.inf and not metric < _quantile(
          seen, self.config.quantile)
    bisect.insort(seen, metric)
    self.reported[phase] += 1

    if self._best is None or metric > self._best.metric:
      self._best = Best(worker, metric, phase, self.hparams.get(worker))

    if phase == self.config.num_phases:
      decision = COMPLETE
    elif keep:
      decision = CONTINUE
    else:
      decision = TERMINATE
      self.terminated[phase] += 1
    self.history.append((worker, phase, metric, decision))

    new_worker = None
    if decision == CONTINUE:
      self.worker_phase[worker] = phase + 1
    else:
      del self.worker_phase[worker]
      if launch:
        new_worker = self._launch(slot)
      else:
        self.slot_worker[slot] = None
    return Report(worker, phase, decision, new_worker)

  def eviction_rates(self) -> np.ndarray:
    """``[P - 1]`` observed fraction of phase-``p`` reporters terminated,
    ``p = 1..P-1`` (NaN for a phase nobody reported)."""
    rep = self.reported[1:self.config.num_phases].astype(np.float64)
    term = self.terminated[1:self.config.num_phases].astype(np.float64)
    with np.errstate(invalid='ignore', divide='ignore'):
      return np.where(rep > 0, term / np.maximum(rep, 1), np.nan)

  def best(self) -> Best:
    """The best metric reported so far, its worker and hyperparameters
    (hyperparameters are looked up now, so ``set_hparams`` may come after
    the worker's reports)."""
    if self._best is None:
      raise ValueError('no worker has reported yet')
    return self._best._replace(hparams=self.hparams.get(self._best.worker))


def reset_members(key: PRNGKey, state: Any, hparams: Any, reset: jax.Array,
                  init: Callable[[PRNGKey, Any], Any],
                  space: Optional[ss.SearchSpace] = None,
                  hparams_template: Any = None) -> tuple[Any, Any]:
  """Pure. Restarts the slots where ``reset[i]``: fresh parameters and
  hyperparameters newly sampled from ``space``; other slots are unchanged.

  Args:
    key: PRNG key.
    state: stacked training state, ``[N, ...]`` leaves.
    hparams: stacked hyperparameters, ``[N]`` leaves.
    reset: ``[N]`` bool.
    init: ONE member's ``(key, hparams) -> state`` (``agent.init``), vmapped
      here over the population (static under ``jit``).
    space: the prior to sample new hyperparameters from (static); ``None``
      keeps the slots' hyperparameters.
    hparams_template: values for the fields outside ``space`` (default: the
      slots' current values).

  Returns:
    ``(state, hparams)``.
  """
  reset = jnp.asarray(reset, bool)
  n = reset.shape[0]
  k_init, k_hp = jax.random.split(key)
  if space is not None:
    template = hparams if hparams_template is None else hparams_template
    new_hparams = ss.sample(k_hp, space, template, n)
  else:
    new_hparams = hparams
  fresh = jax.vmap(init)(jax.random.split(k_init, n), new_hparams)

  def pick(new, old):
    return jnp.where(reset.reshape(reset.shape + (1,) * (old.ndim - 1)),
                     new, old)

  return jax.tree.map(pick, fresh, state), jax.tree.map(pick, new_hparams,
                                                        hparams)
