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

The scheduler is **host-side** (numpy, not jittable) but pure: its
bookkeeping is a ``SchedulerState`` of fixed-shape arrays (a rule's state
checkpoints it as it is), and ``start``, ``report``, ``set_hparams`` and
``best`` return new values rather than change their arguments, so the same
reports in the same order give the same decisions. ``reset_members`` is the
pure JAX function that gives restarted slots of the stacked state fresh
weights and newly sampled hyperparameters.

Departure: a phase in which ``M_p = 0`` (a small ``W``, a late phase)
starts in Worker Selection Mode with no metric to compare the first
reporter with; it continues (the quantile of no metric is undefined).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.core import search_space as ss
from fastpbrl.core.types import PRNGKey

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


def _quantile(sorted_values: Sequence[float], q: float) -> float:
  # numpy's default ('linear') quantile of already sorted values.
  # A -inf (diverged) value below the quantile position makes it -inf
  # rather than NaN.
  pos = q * (len(sorted_values) - 1)
  lo = int(math.floor(pos))
  hi = min(lo + 1, len(sorted_values) - 1)
  low, high = float(sorted_values[lo]), float(sorted_values[hi])
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
  hparams: Optional[np.ndarray]  # [H] its ``set_hparams`` values, or None


class SchedulerState(NamedTuple):
  """HyperTrick's bookkeeping over ``S`` slots, ``W`` workers, ``P`` phases
  and ``H`` hyperparameters per configuration (host numpy, fixed shapes).

  Workers are numbered in launch order. Slots run asynchronously:
  different slots may be in different phases, as in the paper.
  """

  slot_worker: np.ndarray  # [S] int64: the worker each slot runs, -1: idle
  slot_phase: np.ndarray  # [S] int64: the phase it runs (1-based), 0: idle
  # [P + 1, W] float64: row p holds the metrics reported at the end of phase
  # p, ascending, NaN after the first ``reported[p]`` (row 0 is unused).
  metrics: np.ndarray
  reported: np.ndarray  # [P + 1] int64: reports per phase (index 0 unused)
  terminated: np.ndarray  # [P + 1] int64: of those, terminated
  launched: np.ndarray  # () int64: workers launched so far
  # [W, H] float64: each worker's hyperparameters (``set_hparams``), NaN
  # until set.
  hparams: np.ndarray
  best_worker: np.ndarray  # () int64: the best reporter so far, -1: none
  best_metric: np.ndarray  # () float64: its metric (-inf: none)
  best_phase: np.ndarray  # () int64: the phase at whose end it reported


def start(config: HyperTrickConfig, num_slots: int,
          num_hparams: int = 0) -> SchedulerState:
  """Launches ``min(W, num_slots)`` workers (Algorithm 1, lines 2-3):
  slot ``s`` runs worker ``s``, the others are idle.

  Usage::

    sched = start(config, num_slots, num_hparams)
    sched = set_hparams(sched, worker, values)  # for each launched worker
    ...                                         # train; at a phase's end:
    sched, report = hypertrick.report(config, sched, slot, metric)
    if report.new_worker is not None:           # restart the slot from phase
      ...                                       # one: reset_members(...)
    ...
    best(sched)                                 # once done(config, sched)
  """
  if num_slots < 1:
    raise ValueError(f'num_slots must be >= 1, got {num_slots}')
  w, p = config.num_workers, config.num_phases
  launched = min(w, num_slots)
  slot_worker = np.full((num_slots,), -1, np.int64)
  slot_worker[:launched] = np.arange(launched)
  return SchedulerState(
      slot_worker=slot_worker,
      slot_phase=np.where(slot_worker >= 0, 1, 0).astype(np.int64),
      metrics=np.full((p + 1, w), np.nan),
      reported=np.zeros((p + 1,), np.int64),
      terminated=np.zeros((p + 1,), np.int64),
      launched=np.asarray(launched, np.int64),
      hparams=np.full((w, num_hparams), np.nan),
      best_worker=np.asarray(-1, np.int64),
      best_metric=np.asarray(-np.inf),
      best_phase=np.asarray(0, np.int64))


def set_hparams(state: SchedulerState, worker: int,
                values) -> SchedulerState:
  """Records the hyperparameters (``[H]``) a worker runs with (for
  ``best``)."""
  hparams = state.hparams.copy()
  hparams[int(worker)] = np.asarray(values, np.float64)
  return state._replace(hparams=hparams)


def done(config: HyperTrickConfig, state: SchedulerState) -> bool:
  """All ``W`` workers launched and none running."""
  return bool(int(state.launched) >= config.num_workers
              and np.all(state.slot_worker < 0))


def phase_metrics(state: SchedulerState, phase: int) -> np.ndarray:
  """The metrics reported at the end of ``phase`` (1-based), ascending."""
  return state.metrics[phase, :int(state.reported[phase])]


def report(config: HyperTrickConfig, state: SchedulerState, slot: int,
           metric: float, launch: bool = True
           ) -> tuple[SchedulerState, Report]:
  """The worker in ``slot`` finished its current phase with ``metric``.

  ``launch=False``: a stopped worker is not replaced (the slot goes idle),
  for a caller whose budget could not train a new worker any more.

  Returns:
    ``(state, report)``: the new state, and the decision; when the worker
    stops (terminated or complete) and fewer than ``W`` workers were
    launched, ``report.new_worker`` is the worker now in ``slot``, to be
    restarted from phase one with fresh parameters and newly sampled
    hyperparameters.
  """
  worker = int(state.slot_worker[slot])
  if worker < 0:
    raise ValueError(f'slot {slot} has no running worker')
  metric = float(metric)
  if not math.isfinite(metric):
    metric = -math.inf  # a diverged worker ranks last
  phase = int(state.slot_phase[slot])
  seen = phase_metrics(state, phase)
  count = seen.shape[0]
  if count < min_continuing(config, phase) or count == 0:
    keep = True  # Data Collection Mode (or nothing to compare with yet)
  else:  # Worker Selection Mode
    keep = metric > -math.inf and not metric < _quantile(seen,
                                                         config.quantile)
  metrics = state.metrics.copy()
  at = int(np.searchsorted(seen, metric, side='right'))  # bisect.insort
  metrics[phase, at + 1:count + 1] = seen[at:]
  metrics[phase, at] = metric
  reported = state.reported.copy()
  reported[phase] += 1
  state = state._replace(metrics=metrics, reported=reported)

  if int(state.best_worker) < 0 or metric > float(state.best_metric):
    state = state._replace(best_worker=np.asarray(worker, np.int64),
                           best_metric=np.asarray(metric),
                           best_phase=np.asarray(phase, np.int64))

  if phase == config.num_phases:
    decision = COMPLETE
  elif keep:
    decision = CONTINUE
  else:
    decision = TERMINATE
    terminated = state.terminated.copy()
    terminated[phase] += 1
    state = state._replace(terminated=terminated)

  slot_worker, slot_phase = state.slot_worker.copy(), state.slot_phase.copy()
  launched = int(state.launched)
  new_worker = None
  if decision == CONTINUE:
    slot_phase[slot] = phase + 1
  elif launch and launched < config.num_workers:
    new_worker = launched
    launched += 1
    slot_worker[slot], slot_phase[slot] = new_worker, 1
  else:
    slot_worker[slot], slot_phase[slot] = -1, 0
  state = state._replace(slot_worker=slot_worker, slot_phase=slot_phase,
                         launched=np.asarray(launched, np.int64))
  return state, Report(worker, phase, decision, new_worker)


def eviction_rates(config: HyperTrickConfig,
                   state: SchedulerState) -> np.ndarray:
  """``[P - 1]`` observed fraction of phase-``p`` reporters terminated,
  ``p = 1..P-1`` (NaN for a phase nobody reported)."""
  rep = state.reported[1:config.num_phases].astype(np.float64)
  term = state.terminated[1:config.num_phases].astype(np.float64)
  with np.errstate(invalid='ignore', divide='ignore'):
    return np.where(rep > 0, term / np.maximum(rep, 1), np.nan)


def best(state: SchedulerState) -> Best:
  """The best metric reported so far, its worker and hyperparameters
  (looked up now, so ``set_hparams`` may come after the worker's reports;
  None if they were never set)."""
  worker = int(state.best_worker)
  if worker < 0:
    raise ValueError('no worker has reported yet')
  hparams = state.hparams[worker]
  return Best(worker, float(state.best_metric), int(state.best_phase),
              None if hparams.size and np.isnan(hparams).all() else
              hparams.copy())


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
