"""Every CPU core for a run on the device path: one host device per core
(host-side; decided before JAX's backend starts).

On a CPU, XLA runs a small network's operations on one thread, so a
population in one device's program uses one core of the machine. Split
over one host device per core (``jax_num_cpu_devices``), the devices run
their members' shares of the one program in parallel (``--devices auto``
then shards the population over them, ``fastpbrl.devices.sharding``).
JAX reads the count when its backend starts, that is at the first JAX
operation, so the run sets it first thing: the ``fastpbrl`` commands and
``fastpbrl.train`` alike, in every process of a launched run.

What decides the count, first match wins:

1. ``XLA_FLAGS`` with ``--xla_force_host_platform_device_count``: the
   user's own count, left alone;
2. ``FASTPBRL_CPU_DEVICES=N``: ``N`` devices per process;
3. ``--devices K``: ``K`` devices over all processes;
4. ``--devices auto``: the most devices, at most one per core of this
   process's share of the machine, over which the population splits
   evenly (6 members on 4 cores: 3 devices of 2 members).

Only runs whose envs are stepped on the device ask for it: the actor path
leaves the cores to its actor processes, as before. On a GPU the count
changes nothing (the population goes on the GPUs).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

import jax

COUNT_FLAG = '--xla_force_host_platform_device_count'
CPU_DEVICES_VAR = 'FASTPBRL_CPU_DEVICES'


def available_cores() -> int:
  """The cores this process may run on (its CPU affinity, else the
  machine's count)."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    return os.cpu_count() or 1


def cpu_devices_for(devices: Any, population_size: int,
                    num_processes: int = 1,
                    env: Optional[Mapping[str, str]] = None,
                    cores: Optional[int] = None) -> Optional[int]:
  """The host devices each process of a run on the device path gets (see
  the module's order); None where nothing is to be set (the user's own
  ``XLA_FLAGS`` count, or a single device).

  Args:
    devices: the run's ``--devices`` (``'auto'`` or a count).
    population_size: the run's members, split evenly over every process's
      devices.
    num_processes: processes of the run, sharing this machine's cores.
    env: the environment (default ``os.environ``).
    cores: the machine's cores (default ``available_cores()``).

  Raises:
    ValueError: ``FASTPBRL_CPU_DEVICES`` is not a positive integer.
  """
  env = os.environ if env is None else env
  if COUNT_FLAG in env.get('XLA_FLAGS', ''):
    return None
  if env.get(CPU_DEVICES_VAR, '').strip():
    return _count_of_var(env[CPU_DEVICES_VAR])
  processes = max(1, int(num_processes))
  if str(devices).strip().lower() != 'auto':
    try:
      k = int(devices)
    except (TypeError, ValueError):
      return None  # the run's checks refuse it, naming --devices
    return k // processes if k % processes == 0 and k > processes else None
  share = max(1, (available_cores() if cores is None else cores) // processes)
  fits = [d for d in range(1, share + 1)
          if population_size % (d * processes) == 0]
  count = max(fits) if fits else 1
  return count if count > 1 else None


def _count_of_var(value: str) -> Optional[int]:
  try:
    count = int(value)
  except ValueError:
    count = 0
  if count < 1:
    raise ValueError(f'{CPU_DEVICES_VAR} must be a positive integer (host '
                     f'devices per process), got {value!r}')
  return count if count > 1 else None


def set_cpu_devices(count: int) -> bool:
  """Gives JAX's CPU backend ``count`` devices; False, and nothing set,
  when the backend has already started (a JAX operation ran before)."""
  try:
    jax.config.update('jax_num_cpu_devices', int(count))
  except RuntimeError:
    return False
  return True
