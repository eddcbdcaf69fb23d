"""The learning benchmark's command line: runs each task, seed and method
asked for in a fresh process (``--one``), keeps the results already there,
and rebuilds the report."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Optional

from benchmarks.learning.report import report
from benchmarks.learning.runs import run_one
from benchmarks.learning.store import DEFAULT_OUT, is_current, result_path
from benchmarks.learning.suite import (
    DEFAULT_POPULATION, METHODS, TASKS, fits)


def parse_args(argv=None) -> argparse.Namespace:
  """The flags, each checked (one line naming the flag and its range)."""
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.learning',
      description='Learning benchmark: each population rule against N default '
      'seeds.')
  parser.add_argument('--tasks', nargs='+', default=list(TASKS),
                      help=f'tasks of the suite, from {list(TASKS)}')
  parser.add_argument('--methods', nargs='+', default=list(METHODS),
                      help=f'methods, from {list(METHODS)}')
  parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2],
                      help='benchmark seeds (each a whole population run)')
  parser.add_argument('--population-size', type=int,
                      default=DEFAULT_POPULATION,
                      help='members per run (rules need 2 or more, '
                      'CEM-RL an even number; 1 suits seeds-* and sb3-* '
                      'parity rows)')
  parser.add_argument('--eval-episodes', type=int, default=5)
  parser.add_argument('--env-steps', type=int, default=None,
                      help="override every task's budget per member")
  parser.add_argument('--out', default=DEFAULT_OUT)
  parser.add_argument('--redo', action='store_true',
                      help='run again even where a result exists')
  parser.add_argument('--report-only', action='store_true')
  parser.add_argument('--run-root', default=None,
                      help="folder for each run's own logs (default: the "
                      "system's temporary directory)")
  parser.add_argument('--one', nargs=3, metavar=('TASK', 'METHOD', 'SEED'),
                      help=argparse.SUPPRESS)  # one run, in a subprocess
  args = parser.parse_args(argv)
  for name in args.tasks:
    if name not in TASKS:
      parser.error(f'--tasks: unknown task {name!r}; choose from {list(TASKS)}')
  for name in args.methods:
    if name not in METHODS:
      parser.error(f'--methods: unknown method {name!r}; choose from '
                   f'{list(METHODS)}')
  if args.population_size < 1:
    parser.error(f'--population-size must be >= 1, got {args.population_size}')
  if args.eval_episodes < 1:
    parser.error(f'--eval-episodes must be >= 1, got {args.eval_episodes}')
  if args.env_steps is not None and args.env_steps < 2:
    parser.error(f'--env-steps must be >= 2, got {args.env_steps}')
  if args.run_root is not None and not os.path.isdir(args.run_root):
    parser.error(f'--run-root: {args.run_root!r} is not a folder')
  return args


def run_in_process(args, task: str, method: str, seed: int) -> None:
  """One run of the suite in a fresh process (``--one``), so that one
  run's actors, memory and JIT caches never touch the next; a run whose
  current result is there is kept (unless ``--redo``), one whose agent
  cannot act in the task skipped."""
  why_not = fits(task, method)
  if why_not is not None:
    print(f'{task} {method}: skipped ({why_not})', flush=True)
    return
  path = result_path(args.out, task, method, seed, args.env_steps,
                     args.population_size)
  if is_current(path) and not args.redo:
    print(f'{task} {method} seed {seed}: kept {path}', flush=True)
    return
  print(f'{task} {method} seed {seed}: running', flush=True)
  command = [sys.executable, '-m', 'benchmarks.learning', '--one',
             task, method, str(seed), '--out', args.out,
             '--population-size', str(args.population_size),
             '--eval-episodes', str(args.eval_episodes)]
  if args.env_steps is not None:
    command += ['--env-steps', str(args.env_steps)]
  if args.run_root is not None:
    command += ['--run-root', args.run_root]
  done = subprocess.run(command, check=False)
  if done.returncode != 0:
    print(f'{task} {method} seed {seed}: FAILED (exit '
          f'{done.returncode})', flush=True)


def main(argv: Optional[list] = None) -> None:
  """Runs every task, seed and method asked for (task by task, each seed's
  methods together, so a stopped benchmark leaves whole seeds), then
  prints the report."""
  args = parse_args(argv)
  if args.one:
    task, method, seed = args.one
    run_one(args, task, method, int(seed))
    return
  if not args.report_only:
    for task in args.tasks:
      for seed in args.seeds:
        for method in args.methods:
          run_in_process(args, task, method, seed)
  print(report(args.out))
