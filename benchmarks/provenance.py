"""Where a benchmark's figures came from: the commit and the CPU.

Host-side helpers shared by the benchmarks that write result files: the
provenance, a row run in a fresh process, the record written.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
from typing import Callable


def git_commit() -> str:
  """The checked-out commit, or 'unknown' outside a git tree."""
  try:
    return subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True,
                          text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return 'unknown'


def code_version() -> str:
  """The commit the checkout's code came from, short (``+changes`` if it
  had uncommitted changes to tracked code; results and new files do not
  count), so a table says which code each row measured."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=root,
                          capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(['git', 'status', '--porcelain',
                            '--untracked-files=no', '--', 'fastpbrl',
                            'experiments', 'benchmarks',
                            ':!benchmarks/results'],
                           cwd=root, capture_output=True, text=True,
                           timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return 'unknown'
  if head.returncode != 0:
    return 'unknown'
  return head.stdout.strip() + ('+changes' if dirty.stdout.strip() else '')


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


def machine() -> str:
  """The machine in one line: CPU model, CPUs and operating system."""
  return f'{cpu_model()}, {os.cpu_count()} cores, {platform.system()}'


def cpu_machine() -> dict:
  """The machine a CPU benchmark ran on: platform, CPU model, CPUs, the
  cores this process may use and the jax version."""
  return {'platform': platform.platform(), 'cpu_model': cpu_model(),
          'cpus': os.cpu_count(),
          'cores_available': len(os.sched_getaffinity(0)),
          'jax': importlib.metadata.version('jax')}


def row_in_process(module: str, one_args: list[str], argv: list[str],
                   env: dict | None = None) -> dict:
  """Runs ``python -m module --one *one_args *argv`` (one row of a
  benchmark, in a fresh process): the JSON its last line prints, or
  ``{'error': ...}`` with the last line of a failure's stderr."""
  done = subprocess.run([sys.executable, '-m', module, '--one', *one_args,
                         *argv], capture_output=True, text=True, env=env)
  if done.returncode != 0:
    tail = done.stderr.strip().splitlines()[-1:] or ['(no output)']
    return {'error': f'failed: {tail[0][:200]}'}
  return json.loads(done.stdout.strip().splitlines()[-1])


def write_record(out: str, record: dict, markdown: str) -> None:
  """Writes a benchmark's ``record`` (command, machine, date, commit, rows) to
  ``out`` as JSON, and ``markdown`` (its heading and table) beside it with
  ``.md``."""
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with open(out, 'w') as f:
    json.dump(record, f, indent=1)
  with open(os.path.splitext(out)[0] + '.md', 'w') as f:
    f.write(markdown)


def answered_one_row(args, one: Callable[..., dict]) -> bool:
  """A benchmark's start: warnings logged; in a row's process (``--one N
  MODE``, from :func:`row_in_process`) prints ``one(args, N, MODE)`` as
  JSON and returns True (the process is done)."""
  logging.basicConfig(level=logging.WARNING,
                      format='%(asctime)s %(name)s: %(message)s')
  if not args.one:
    return False
  print(json.dumps(one(args, int(args.one[0]), args.one[1])))
  return True
