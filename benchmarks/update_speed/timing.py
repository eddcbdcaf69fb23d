"""Timing one configuration: a case at one population size (host-side).

``measure`` times it in this process; ``measure_parallel`` (the
one-process-per-member implementations) starts one spawned process per
member, ``_parallel_member``, and times them in step through a barrier.
Each gives one result row (``COLUMNS``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import threading
import time
from typing import Optional, Sequence

from benchmarks.update_speed.config import (BARRIER_TIMEOUT_S, COLUMNS,
                                            MIN_SAMPLES, BenchmarkConfig, Case,
                                            available_cores)
from benchmarks.update_speed.implementations import (PARALLEL_MEMBER_RUNNERS,
                                                     RUNNERS, TorchSequential,
                                                     _TorchRunner)
from benchmarks.update_speed.measurements import (_peak_rss_bytes,
                                                  calls_per_sample,
                                                  device_description,
                                                  is_out_of_memory)


def _base_row(case: Case, n: int) -> dict:
  row = dict.fromkeys(COLUMNS)
  row.update(mode=case.mode, agent=case.agent,
             implementation=case.implementation, steps_per_call=case.steps,
             population_size=n, batch_size=case.batch_size, hidden=case.hidden,
             device=device_description(), reason='',
             load_average_1min=_load_average())
  return row


def _load_average() -> Optional[float]:
  # Other jobs on the machine slow every measurement: this says how busy it was.
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:
    return None


def _finish_row(row: dict, samples: Sequence[float], n: int, steps: int,
                flops: Optional[float], matmul: dict) -> dict:
  median = statistics.median(samples)
  row.update(
      status='ok', time_per_call_ms=1e3 * median,
      load_average_1min=_load_average(),
      time_per_call_min_ms=1e3 * min(samples),
      time_per_call_max_ms=1e3 * max(samples), num_samples=len(samples),
      time_per_update_step_ms=1e3 * median / steps,
      time_per_member_step_ms=1e3 * median / (n * steps))
  row['matmul_peak_flop_per_s'] = matmul['peak_flop_per_s']
  if flops:
    row.update(flops_per_call=flops, achieved_flop_per_s=flops / median,
               fraction_of_matmul_peak=flops / median / matmul['peak_flop_per_s'])
  return row


def measure(case: Case, cfg: BenchmarkConfig, n: int, cache: dict,
            matmul: dict) -> dict:
  """Times ``case`` at population size ``n`` in this process; one result row.

  The first call is never timed (it compiles); then ``cfg.warmup`` untimed
  calls; then up to ``cfg.repeats`` samples of ``calls_per_sample`` calls,
  fewer (but at least ``MIN_SAMPLES``) once ``cfg.max_seconds_per_config``
  has passed.
  """
  if case.implementation in PARALLEL_MEMBER_RUNNERS:
    return measure_parallel(case, cfg, n, matmul)
  started = time.perf_counter()
  row = _base_row(case, n)
  runner_cls = RUNNERS[(case.mode, case.implementation)]
  kwargs = ({'threads': cfg.torch_threads}
            if issubclass(runner_cls, _TorchRunner) else {})
  runner = runner_cls(case, n, cfg.seed, cache, **kwargs)
  start = time.perf_counter()
  runner.call()
  first_call_s = time.perf_counter() - start
  for _ in range(cfg.warmup):
    runner.call()
  k = calls_per_sample(case.steps)
  samples = []
  while len(samples) < cfg.repeats:
    start = time.perf_counter()
    for _ in range(k):
      runner.call()
    samples.append((time.perf_counter() - start) / k)
    if (len(samples) >= MIN_SAMPLES
        and time.perf_counter() - started > cfg.max_seconds_per_config):
      break
  flops = runner.flops_per_call()
  _finish_row(row, samples, n, case.steps, flops, matmul)
  if runner.compiles_on_first_call:
    # First call = trace + compile + one run.
    row['compile_s'] = max(0.0, first_call_s - statistics.median(samples))
  else:
    row['compile_s'] = runner.compile_s
  row.update(flops_source=runner.flops_source if flops else None,
             peak_device_bytes=runner.device_peak_bytes(),
             peak_rss_bytes=_peak_rss_bytes(),
             memory_note=('process peaks since this sweep started; sweeps '
                          'go up in N'),
             torch_threads=runner.torch_threads)
  return row


def exit_with_parent(poll_s: float = 1.0) -> None:
  """In a spawned child: ends the process (``os._exit(1)``) once its
  parent is gone. A child whose parent was killed outright (SIGKILL, the
  out-of-memory killer, a CI job cancelled) would otherwise wait forever,
  for instance at exit on a ``multiprocessing.Queue`` that no one reads."""
  parent = os.getppid()

  def watch():
    while os.getppid() == parent:
      time.sleep(poll_s)
    os._exit(1)

  threading.Thread(target=watch, name='exit-with-parent', daemon=True).start()


def _parallel_member(case: Case, cfg: BenchmarkConfig, n: int, rank: int,
                     barrier, stop, results) -> None:
  """One process of a parallel implementation: one member, timed in step
  with the others through ``barrier`` (host-side, runs in a child)."""
  exit_with_parent()
  result = dict(rank=rank, ok=False)
  try:
    runner_cls = PARALLEL_MEMBER_RUNNERS[case.implementation]
    kwargs = {}
    if runner_cls is TorchSequential:
      # One process per member: split the cores instead of oversubscribing.
      kwargs['threads'] = max(1, available_cores() // n)
    runner = runner_cls(case, 1, cfg.seed + rank, {}, **kwargs)
    barrier.wait(BARRIER_TIMEOUT_S)
    start = time.monotonic()
    runner.call()
    first_call_s = time.monotonic() - start
    for _ in range(cfg.warmup):
      runner.call()
    k = calls_per_sample(case.steps)
    starts, ends = [], []
    began = time.monotonic()
    for r in range(cfg.repeats):
      barrier.wait(BARRIER_TIMEOUT_S)
      starts.append(time.monotonic())  # CLOCK_MONOTONIC: shared by processes
      for _ in range(k):
        runner.call()
      ends.append(time.monotonic())
      if (rank == 0 and r + 1 >= MIN_SAMPLES
          and time.monotonic() - began > cfg.max_seconds_per_config):
        stop.value = 1
      barrier.wait(BARRIER_TIMEOUT_S)
      if stop.value:
        break
    result.update(
        ok=True, starts=starts, ends=ends, first_call_s=first_call_s,
        compile_s=runner.compile_s,
        compiles_on_first_call=runner.compiles_on_first_call,
        flops=runner.flops_per_call() if rank == 0 else None,
        flops_source=runner.flops_source,
        peak_device_bytes=runner.device_peak_bytes(),
        peak_rss_bytes=_peak_rss_bytes(), torch_threads=runner.torch_threads)
  except threading.BrokenBarrierError:
    result.update(error='another process of this configuration failed',
                  oom=False, secondary=True)
  except BaseException as e:  # pylint: disable=broad-except
    barrier.abort()
    result.update(error=f'{type(e).__name__}: {e}'[:2000],
                  oom=is_out_of_memory(e), secondary=False)
  results.put(result)


class _ParallelFailure(Exception):

  def __init__(self, message: str, oom: bool):
    super().__init__(message)
    self.oom = oom


def measure_parallel(case: Case, cfg: BenchmarkConfig, n: int,
                     matmul: dict) -> dict:
  """One process per member, all on the same device, started together.

  A sample is the wall time from the first process starting its calls to the
  last one finishing them (the clocks are the shared CLOCK_MONOTONIC).
  """
  row = _base_row(case, n)
  ctx = mp.get_context('spawn')
  barrier, stop, results = ctx.Barrier(n), ctx.Value('b', 0), ctx.Queue()
  procs = [ctx.Process(target=_parallel_member,
                       args=(case, cfg, n, rank, barrier, stop, results))
           for rank in range(n)]
  collected = []
  try:
    for p in procs:
      p.start()
    while len(collected) < n:
      try:
        collected.append(results.get(timeout=1.0))
      except queue.Empty:
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and results.empty():
          code = dead[0].exitcode
          raise _ParallelFailure(
              f'a member process died with exit code {code}'
              + (' (killed: likely out of host memory)' if code == -9 else ''),
              oom=code == -9)
    for p in procs:
      p.join()
  finally:  # on failure or interruption, leave no member process behind
    if any(p.is_alive() for p in procs):
      barrier.abort()
      for p in procs:
        p.join(timeout=10)
        if p.is_alive():
          p.kill()
          p.join()
  failures = [r for r in collected if not r['ok']]
  if failures:
    first = min(failures, key=lambda r: r.get('secondary', False))
    raise _ParallelFailure(f'process {first["rank"]}: {first["error"]}',
                           oom=any(r.get('oom') for r in failures))
  collected.sort(key=lambda r: r['rank'])
  num = min(len(r['starts']) for r in collected)
  k = calls_per_sample(case.steps)
  samples = [(max(r['ends'][i] for r in collected)
              - min(r['starts'][i] for r in collected)) / k
             for i in range(num)]
  member_flops = collected[0]['flops']
  flops = None if member_flops is None else member_flops * n
  _finish_row(row, samples, n, case.steps, flops, matmul)
  if collected[0]['compiles_on_first_call']:
    compile_s = max(r['first_call_s'] for r in collected) - statistics.median(
        samples)
  elif collected[0]['compile_s'] is not None:
    # The processes compile at the same time: the slowest one counts.
    compile_s = max(r['compile_s'] for r in collected)
  else:  # eager torch
    compile_s = None
  device_peaks = [r['peak_device_bytes'] for r in collected]
  row.update(
      compile_s=None if compile_s is None else max(0.0, compile_s),
      flops_source=collected[0]['flops_source'] if flops else None,
      peak_device_bytes=(sum(device_peaks) if None not in device_peaks
                         else None),
      peak_rss_bytes=sum(r['peak_rss_bytes'] for r in collected),
      memory_note='sum over the member processes',
      torch_threads=collected[0]['torch_threads'])
  return row
