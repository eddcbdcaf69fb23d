"""Start-up time of the ``fastpbrl`` command: each command line run N times
in a fresh process, wall seconds from start to exit (host-side).

    python -m benchmarks.cli_startup                       # --help, pbt --help
    python -m benchmarks.cli_startup --before /tmp/base    # and another tree

Each command runs as the installed console script does (``from
fastpbrl.cli.commands import console_script``) with ``PYTHONPATH`` set to a
source tree: this checkout, and with ``--before DIR`` another (a ``git
worktree`` of an older commit). The trees' runs alternate, A B A B, so that
a machine whose load drifts slows both alike. Median, min and max per
command and tree go to ``--out`` (default
``benchmarks/results/cli/startup.json``) with the machine, the date and
the commit. Not a test: shared machines are noisy; quote medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = (('--help',), ('pbt', '--help'))
SCRIPT = 'from fastpbrl.cli.commands import console_script; console_script()'


def wall_seconds(tree: str, args) -> float:
  """One run of ``fastpbrl ARGS`` from ``tree``: seconds from start to exit."""
  env = {**os.environ, 'PYTHONPATH': tree}
  start = time.perf_counter()
  # From the tree's folder: ``python -c`` puts the current folder on
  # ``sys.path`` ahead of ``PYTHONPATH``.
  subprocess.run([sys.executable, '-c', SCRIPT, *args], env=env, cwd=tree,
                 check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)
  return time.perf_counter() - start


def summary(seconds: list[float]) -> dict:
  return {'median_s': round(statistics.median(seconds), 4),
          'min_s': round(min(seconds), 4), 'max_s': round(max(seconds), 4),
          'runs': len(seconds)}


def measure(trees: dict[str, str], args, runs: int) -> dict:
  """``{label: summary}`` of ``fastpbrl ARGS`` from each tree, the trees'
  runs alternating, after one warm-up run each (not counted)."""
  for tree in trees.values():
    wall_seconds(tree, args)
  seconds = {label: [] for label in trees}
  for _ in range(runs):
    for label, tree in trees.items():
      seconds[label].append(wall_seconds(tree, args))
  return {label: summary(s) for label, s in seconds.items()}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', type=int, default=7)
  parser.add_argument('--before', default=None,
                      help='another source tree to measure alongside')
  parser.add_argument('--out', default=os.path.join(
      ROOT, 'benchmarks', 'results', 'cli', 'startup.json'))
  args = parser.parse_args(argv)
  trees = {'after': ROOT}
  if args.before is not None:
    trees['before'] = os.path.abspath(args.before)
  rows = []
  for command in COMMANDS:
    row = {'command': 'fastpbrl ' + ' '.join(command),
           **measure(trees, command, args.runs)}
    if 'before' in row:
      row['speedup'] = round(row['before']['median_s']
                             / row['after']['median_s'], 1)
    print(json.dumps(row))
    rows.append(row)
  result = {
      'benchmark': 'fastpbrl command start-up, wall seconds per run',
      'command': ' '.join(['python -m benchmarks.cli_startup',
                           *(argv if argv is not None else sys.argv[1:])]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'git_commit': provenance.git_commit(),
      'machine': provenance.cpu_machine(),
      'load_average_1min': round(os.getloadavg()[0], 2),
      'trees': {label: ('this checkout' if tree == ROOT else
                        'another tree (--before)') for label, tree in
                trees.items()},
      'rows': rows,
  }
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=2)
    f.write('\n')


if __name__ == '__main__':
  main()
