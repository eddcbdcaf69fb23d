"""Where a benchmark's figures came from: the commit and the CPU.

Host-side helpers shared by the benchmarks that write result files.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess


def git_commit() -> str:
  """The checked-out commit, or 'unknown' outside a git tree."""
  try:
    return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


def cpu_model() -> str:
  """The CPU's model name from /proc/cpuinfo (elsewhere the processor or
  machine that ``platform`` reports)."""
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def cpu_machine() -> dict:
  """The machine a CPU benchmark ran on: platform, CPU model, CPUs, the
  cores this process may use and the jax version."""
  return {'platform': platform.platform(), 'cpu_model': cpu_model(),
          'cpus': os.cpu_count(),
          'cores_available': len(os.sched_getaffinity(0)),
          'jax': importlib.metadata.version('jax')}
