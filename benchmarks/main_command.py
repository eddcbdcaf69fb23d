"""The README's main command, timed: ``fastpbrl pbt`` with no flags.

Runs the installed ``fastpbrl pbt`` (the ``small`` preset: 4 TD3 members,
Pendulum-v1, 10,000 env steps each) ``--repeats`` times, one after the
other, each into a fresh run folder, and records each run's wall time (the
whole process: start-up, compiles, actors, final evaluation) and its
members' final returns and PBT replacements. The install is not timed
(``pip`` time depends on the package cache, not on this library).

Usage::

  python -m benchmarks.main_command --repeats 3 --out benchmarks/results/cpu

Writes ``main_command.json`` (command, machine, date, commit, one row per
run) and ``main_command.md``. Host-side code only; run nothing else on the
machine meanwhile.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.provenance import code_version, machine
from fastpbrl.logs.logging import read_final_returns, write_json_atomic
from fastpbrl.rules.pbt import read_lineage

COMMAND = ('pbt', '--no-progress')  # the README's command, without the bar


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--out', default='benchmarks/results/cpu')
  return parser.parse_args(argv)


def one_run(run_dir: str) -> dict:
  """Runs the main command into ``run_dir``; its wall time and outcome."""
  fastpbrl = os.path.join(os.path.dirname(sys.executable), 'fastpbrl')
  start = time.monotonic()
  done = subprocess.run([fastpbrl, *COMMAND, '--run-dir', run_dir],
                        capture_output=True, text=True)
  wall = time.monotonic() - start
  if done.returncode != 0:
    raise SystemExit(f'fastpbrl pbt failed ({done.returncode}):\n'
                     f'{done.stderr[-3000:]}')
  finals = read_final_returns(run_dir)['final_returns']
  exploits = [e for e in read_lineage(os.path.join(run_dir, 'lineage.jsonl'))
              if e.get('event') == 'exploit']
  return {'wall_s': round(wall, 1), 'final_returns': [round(float(r), 1)
                                                      for r in finals],
          'replacements': len(exploits)}


def markdown(result: dict) -> str:
  walls = [row['wall_s'] for row in result['rows']]
  lines = ['# The main command, timed', '',
           f'`{result["timed"]}` on {result["machine"]}, '
           f'{result["date"]}, code {result["commit"]}; written by '
           f'`{result["command"]}`.', '',
           '| run | wall time | final returns (4 members) | PBT replacements |',
           '|---|---|---|---|']
  for i, row in enumerate(result['rows']):
    finals = ', '.join(f'{r:.0f}' for r in row['final_returns'])
    lines.append(f'| {i + 1} | {row["wall_s"] / 60:.1f} min | {finals} | '
                 f'{row["replacements"]} |')
  lines += ['', f'Median wall time: {np.median(walls) / 60:.1f} min '
            '(the install not included).']
  return '\n'.join(lines) + '\n'


def main(argv=None) -> None:
  args = parse_args(argv)
  rows = []
  for i in range(args.repeats):
    run_dir = tempfile.mkdtemp(prefix='main-command-')
    try:
      rows.append(one_run(os.path.join(run_dir, 'run')))
    finally:
      shutil.rmtree(run_dir, ignore_errors=True)
    print(f'run {i + 1}: {rows[-1]}', flush=True)
  result = {'command': ' '.join(['python -m benchmarks.main_command',
                                 *(argv if argv is not None
                                   else sys.argv[1:])]),
            'timed': 'fastpbrl ' + ' '.join(COMMAND),
            'machine': machine(), 'date': time.strftime('%Y-%m-%d'),
            'commit': code_version(), 'rows': rows,
            'median_wall_s': float(np.median([r['wall_s'] for r in rows]))}
  os.makedirs(args.out, exist_ok=True)
  write_json_atomic(os.path.join(args.out, 'main_command.json'), result)
  with open(os.path.join(args.out, 'main_command.md'), 'w') as f:
    f.write(markdown(result))
  print(markdown(result))


if __name__ == '__main__':
  main()
