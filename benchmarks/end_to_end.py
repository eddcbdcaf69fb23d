"""End-to-end speed: env steps per second per member of a whole PBT run.

Runs ``python -m experiments.pbt`` (the whole run: actors, replay, learner,
PBT, logging, checkpoints) for each population size and each source tree
given, one after the other, and reads the rate from the members' episode
logs: training env steps per member per second of wall time between each
member's first and last training episode (so start-up, warm-up, the first
compile and the final evaluation do not count). Several trees compare two
versions of the code on the same machine in one run ("before" and "after").

Usage::

  python -m benchmarks.end_to_end                         # this tree, 4 and 16
  python -m benchmarks.end_to_end --trees ../old-checkout . --labels before after

Host-side code only (subprocesses, CSV reading, prints).
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--members', type=int, nargs='+', default=[4, 16])
  parser.add_argument('--env-steps', type=int, default=6_000,
                      help='budget per member of each run')
  parser.add_argument('--hidden', type=int, nargs='+', default=[256, 256])
  parser.add_argument('--trees', nargs='+', default=['.'],
                      help='source trees to run (each a checkout)')
  parser.add_argument('--labels', nargs='+', default=None)
  parser.add_argument('--extra', default='',
                      help='more flags for every run, one string')
  parser.add_argument('--out', default=None,
                      help='JSON with every row (default: none)')
  args = parser.parse_args(argv)
  args.labels = args.labels or [os.path.basename(os.path.abspath(t))
                                for t in args.trees]
  if len(args.labels) != len(args.trees):
    parser.error('--labels needs one label per --trees entry')
  return args


def rate_per_member(run_dir: str) -> tuple[float, list[float]]:
  """Mean over members of (training env steps between the first and the
  last training episode) / (wall seconds between them)."""
  rates = []
  for path in sorted(glob.glob(os.path.join(run_dir, 'members', '*.csv'))):
    with open(path) as f:
      rows = [r for r in csv.DictReader(f) if r['evaluation'] in ('0', 'False')]
    if len(rows) < 2:
      raise SystemExit(f'{path}: fewer than 2 training episodes; raise '
                       '--env-steps')
    first, last = rows[0], rows[-1]
    rates.append((int(last['env_steps']) - int(first['env_steps']))
                 / (float(last['wall_time']) - float(first['wall_time'])))
  return float(np.mean(rates)), rates


def main(argv=None) -> None:
  args = parse_args(argv)
  rows = []
  print(f'end to end: PBT of TD3 {tuple(args.hidden)} on {args.env}, '
        f'{args.env_steps} env steps per member, {os.cpu_count()} CPUs')
  print(f'{"tree":>10} {"N":>4} {"env steps/s/member":>19} '
        f'{"population env steps/s":>23} {"wall s":>7}')
  for n in args.members:
    for tree, label in zip(args.trees, args.labels):
      tree = os.path.abspath(tree)
      with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, 'run')
        command = [sys.executable, '-m', 'experiments.pbt', '--env', args.env,
                   '--population-size', str(n), '--env-steps',
                   str(args.env_steps), '--hidden-sizes',
                   *map(str, args.hidden), '--run-dir', run_dir,
                   '--no-progress', '--track', 'none', *args.extra.split()]
        # The tree first; an install on PYTHONPATH (wheels unpacked by
        # pip --target) stays importable.
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [tree] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
        start = time.monotonic()
        done = subprocess.run(command, cwd=tree, env=env,
                              capture_output=True, text=True)
        wall = time.monotonic() - start
        if done.returncode != 0:
          raise SystemExit(f'{label} N={n} failed ({done.returncode}):\n'
                           f'{done.stderr[-3000:]}')
        rate, _ = rate_per_member(run_dir)
      rows.append({'tree': label, 'members': n, 'env_steps_per_s_member': rate,
                   'population_env_steps_per_s': rate * n, 'wall_s': wall})
      print(f'{label:>10} {n:>4} {rate:>19.1f} {rate * n:>23.0f} '
            f'{wall:>7.0f}', flush=True)
  if args.out:
    with open(args.out, 'w') as f:
      json.dump({'command': ' '.join([sys.executable, '-m',
                                      'benchmarks.end_to_end', *sys.argv[1:]]),
                 'machine': platform.platform(), 'cpus': os.cpu_count(),
                 'date': time.strftime('%Y-%m-%d'), 'rows': rows}, f, indent=1)


if __name__ == '__main__':
  main()
