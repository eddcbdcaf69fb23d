"""Sweeps over population sizes, each in its own process (host-side).

``run_sweep`` measures one case at each population size, ascending, and
stops at the first out-of-memory or when the time budget would be
exceeded; ``run_case`` runs it in a fresh spawned process
(``_sweep_worker``) and records a crash as a row.
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import queue
import signal
import sys
import traceback
from typing import Callable

from benchmarks.update_speed.config import MIN_SAMPLES, BenchmarkConfig, Case
from benchmarks.update_speed.implementations import (PARALLEL_MEMBER_RUNNERS,
                                                     _SkipCase, torch_device)
from benchmarks.update_speed.measurements import (calls_per_sample,
                                                  is_out_of_memory,
                                                  measure_matmul_peak)
from benchmarks.update_speed.timing import (_base_row, exit_with_parent,
                                            measure)


def run_sweep(case: Case, cfg: BenchmarkConfig, matmul: dict,
              emit: Callable[[dict], None]) -> None:
  """Measures ``case`` at each population size, ascending; ``emit``s a row
  for each (measured, skipped with the reason, or out of memory).

  ``matmul`` is the run's matmul peak so far; when
  ``cfg.matmul_per_sweep``, the sweep measures the matmul again first and
  keeps the better of the two (``apply_run_peak`` later rescales every row
  to the best measurement of the whole run).
  """
  if cfg.matmul_per_sweep or not matmul:
    fresh = measure_matmul_peak(cfg.matmul_size)
    matmul = max(matmul, fresh, key=lambda m: m['peak_flop_per_s']) if (
        matmul) else fresh
  cache: dict = {}
  stop_reason = None
  previous = None  # (n, seconds per call)
  for n in cfg.population_sizes:
    if stop_reason is None and case.implementation.startswith('torch'):
      try:
        torch_device()
      except _SkipCase as e:
        stop_reason = str(e)
    if (stop_reason is None and case.implementation in PARALLEL_MEMBER_RUNNERS
        and n > cfg.max_parallel_processes):
      stop_reason = (f'N > --max-parallel-processes '
                     f'{cfg.max_parallel_processes} (one process per member)')
    if stop_reason is None and previous is not None:
      prev_n, per_call = previous
      minimum_calls = 1 + cfg.warmup + MIN_SAMPLES * calls_per_sample(case.steps)
      predicted = minimum_calls * per_call * n / prev_n
      if predicted > cfg.max_seconds_per_config:
        stop_reason = (
            f'predicted {predicted:.0f} s for N={n} (from N={prev_n}) > '
            f'--max-seconds-per-config {cfg.max_seconds_per_config:g}')
    if stop_reason is not None:
      row = _base_row(case, n)
      row.update(status='skipped', reason=stop_reason)
      emit(row)
      continue
    try:
      row = measure(case, cfg, n, cache, matmul)
    except Exception as e:  # pylint: disable=broad-except
      row = _base_row(case, n)
      oom = getattr(e, 'oom', False) or is_out_of_memory(e)
      row.update(status='oom' if oom else 'error',
                 reason=f'{type(e).__name__}: {e}'[:500])
      stop_reason = (f'out of memory at N={n}' if oom else
                     f'error at N={n}')
      emit(row)
      gc.collect()
      continue
    previous = (n, row['time_per_call_ms'] / 1e3)
    emit(row)
    gc.collect()


def _exit_on_sigterm() -> None:
  # SystemExit instead of an abrupt end, so `finally` blocks stop children.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _sweep_worker(case: Case, cfg: BenchmarkConfig, matmul: dict,
                  results) -> None:
  """Entry point of a sweep's own process (host-side)."""
  _exit_on_sigterm()
  exit_with_parent()
  try:
    run_sweep(case, cfg, matmul, lambda row: results.put(('row', row)))
  except BaseException:  # pylint: disable=broad-except
    results.put(('failed', traceback.format_exc()))
  results.put(('done', None))


def run_case(case: Case, cfg: BenchmarkConfig, matmul: dict,
             emit: Callable[[dict], None]) -> None:
  """Runs one sweep, in a fresh process unless ``cfg.isolation == 'none'``.

  A worker that dies (segfault, killed for memory) is recorded as a
  'crashed' row at the N it was measuring and skipped rows after it.
  """
  if cfg.isolation == 'none':
    run_sweep(case, cfg, matmul, emit)
    return
  ctx = mp.get_context('spawn')
  results = ctx.Queue()
  worker = ctx.Process(target=_sweep_worker,
                       args=(case, cfg, matmul, results))
  done_sizes = []
  failure = None
  try:
    worker.start()
    while True:
      try:
        kind, payload = results.get(timeout=1.0)
      except queue.Empty:
        if worker.is_alive():
          continue
        try:  # it may have put its last messages just before exiting
          kind, payload = results.get(timeout=5.0)
        except queue.Empty:
          break
      if kind == 'row':
        done_sizes.append(payload['population_size'])
        emit(payload)
      elif kind == 'failed':
        failure = payload
      elif kind == 'done':
        break
    worker.join()
  finally:  # interrupted: stop the worker (it stops its own children)
    if worker.is_alive():
      worker.terminate()
      worker.join()
  remaining = [n for n in cfg.population_sizes if n not in done_sizes]
  if not remaining:
    return
  code = worker.exitcode
  reason = failure or (f'sweep process died with exit code {code}'
                       + (' (killed: likely out of host memory)'
                          if code == -9 else ''))
  for i, n in enumerate(remaining):
    row = _base_row(case, n)
    row.update(status='crashed' if i == 0 else 'skipped',
               reason=reason if i == 0 else
               f'sweep process crashed at N={remaining[0]}')
    emit(row)
