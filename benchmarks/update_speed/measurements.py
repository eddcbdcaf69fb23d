"""Measurements common to all implementations (host-side, plus small jitted
probes): calls per timed sample, XLA's FLOP count of a program, the matmul
peak that FLOP/s are compared with, memory peaks, and the description of
the machine and its library versions.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import platform
import resource
import statistics
import sys
import time
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.provenance import cpu_model
from benchmarks.update_speed.config import available_cores


def calls_per_sample(steps: int) -> int:
  """Calls averaged into one timed sample: enough for two update steps.

  TD3 updates its policy on every second step; with one step per call,
  single calls alternate between two costs, so a sample covers a pair.
  """
  return max(1, math.ceil(2 / steps))


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype),
                      tree)


def _flops_from(cost) -> Optional[float]:
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0] if cost else None
  if not isinstance(cost, dict):
    return None
  flops = cost.get('flops')
  return float(flops) if flops is not None and flops > 0 else None


def xla_flops(fn: Callable, *args) -> Optional[float]:
  """XLA's FLOP count of ``jit(fn)(*args)``, or None if the backend has none.

  Uses the HLO cost analysis of the lowered program (no compilation), and the
  compiled program's when that is missing. Only call this on a program
  without loops: XLA counts a while loop's body once whatever its trip count
  (so the benchmark counts ONE update step and multiplies), and a
  ``lax.cond`` as if its costlier branch ran.
  """
  lowered = jax.jit(fn).lower(*_abstract(args))
  for analysis in (lowered.cost_analysis,
                   lambda: lowered.compile().cost_analysis()):
    try:
      flops = _flops_from(analysis())
    except Exception:  # pylint: disable=broad-except
      flops = None
    if flops:
      return flops
  return None


def measure_matmul_peak(size: Optional[int] = None, repeats: int = 20) -> dict:
  """FLOP/s of a square f32 matmul on the default JAX device.

  ``peak_flop_per_s`` is from the fastest of ``repeats`` runs (the peak the
  device reached), ``median_flop_per_s`` from their median.
  """
  if size is None:
    size = 2048 if jax.default_backend() == 'cpu' else 8192
  ka, kb = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(ka, (size, size), jnp.float32)
  b = jax.random.normal(kb, (size, size), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  flops = 2.0 * size ** 3
  return dict(size=size, flops=flops, best_s=min(times),
              median_s=statistics.median(times),
              peak_flop_per_s=flops / min(times),
              median_flop_per_s=flops / statistics.median(times))


def _peak_rss_bytes() -> int:
  # ru_maxrss is in KiB on Linux (bytes on macOS).
  scale = 1 if sys.platform == 'darwin' else 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _jax_device_peak_bytes() -> Optional[int]:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats or 'peak_bytes_in_use' not in stats:
    return None
  return int(stats['peak_bytes_in_use'])


def is_out_of_memory(error: BaseException) -> bool:
  """Whether an exception means the device or host ran out of memory."""
  if isinstance(error, MemoryError):
    return True
  if type(error).__name__ == 'OutOfMemoryError':  # torch.OutOfMemoryError
    return True
  text = str(error)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def device_description() -> str:
  """The device's name, with the CPU model on CPU."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return f'cpu: {cpu_model()} ({available_cores()} cores)'
  return f'{device.platform}: {device.device_kind}'


def _memory_total_bytes() -> Optional[int]:
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _version(package: str) -> Optional[str]:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine_description() -> dict:
  """Host, device and library versions (torch's without importing it)."""
  devices = jax.devices()
  return dict(
      platform=platform.platform(), python=platform.python_version(),
      cpu_model=cpu_model(), logical_cpus=os.cpu_count(),
      available_cores=available_cores(),
      memory_total_bytes=_memory_total_bytes(),
      jax_backend=jax.default_backend(), device=device_description(),
      device_kind=devices[0].device_kind, device_count=len(devices),
      versions={p: _version(p) for p in (
          'jax', 'jaxlib', 'numpy', 'dm-haiku', 'optax', 'torch',
          'matplotlib')})
