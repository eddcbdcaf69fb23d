"""Today's actor beside the actor of an earlier commit, in one run.

The batched actors were to step at least 1.5x the env steps per second
per actor process of the actors before them (HalfCheetah-v5, 8 members
per actor), measured in one run beside those. The actors before them
are those of the commit before the batched env stepping
(``BASELINE_REV``): each env stepped by its own ``step``, JAX's
asynchronous CPU dispatch, the per-step numpy of that time. This
benchmark extracts that commit's tree (``git archive``) into a temporary
folder and runs its own ``benchmarks.actor_throughput`` measurement (one
actor process, TD3 policies with exploration noise, chunks through the
real transport into a per-member replay) in a subprocess, alternating
with this tree's actor in both of its modes (``serial``:
``--no-vector-envs``; ``vectorized``: the default), ``--repeats`` times,
so that the machine's drift reaches all three.

The rate is env steps per second of wall time of the one actor process,
as the earlier commit's benchmark measured it (it does not report the
process's CPU time); run it on an otherwise idle machine.

Usage::

  python -m benchmarks.actor_baseline            # HalfCheetah-v5, 8 members
  python -m benchmarks.actor_baseline --envs HalfCheetah-v5 Pendulum-v1 \
      --members 4 8 16 --repeats 3

Writes every run with the command, machine, date and both commits to
``--out`` (default ``benchmarks/results/cpu/actor_baseline.json``) and a
table to the same name with ``.md``. Host-side code only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks.actor_throughput import actor_steps_per_s
from benchmarks.pages import actor_baseline_table
from benchmarks.provenance import cpu_machine, git_commit

# The last commit whose actors stepped every env with its own ``step``:
# the parent of "Step an actor's envs as one vectorized numpy batch".
BASELINE_REV = '3439fde57d42bae72c2e0bf44a472aed56c7eb01'

# Run in the earlier tree: its own measurement of one actor process with
# TD3 policies; prints the rate as JSON on the last line.
_PROBE = '''
import json
from benchmarks.actor_throughput import Args, actor_steps_per_s
import fastpbrl

if __name__ == '__main__':
  args = Args(env={env!r}, members={members}, processes=1,
              seconds={seconds}, hidden={hidden}, chunk_steps={chunk_steps},
              seed={seed})
  rate, processes = actor_steps_per_s(args, random_phase=False)
  print(json.dumps({{'rate': rate, 'processes': processes,
                     'fastpbrl': fastpbrl.__file__}}))
'''

PROBE_TIMEOUT_S = 900  # start-up, compile and the measured seconds


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--envs', nargs='+', default=['HalfCheetah-v5'])
  parser.add_argument('--members', type=int, nargs='+', default=[8],
                      help='members hosted by the one actor process')
  parser.add_argument('--baseline-rev', default=BASELINE_REV,
                      help='the earlier commit whose actor is the baseline')
  parser.add_argument('--seconds', type=float, default=10.0,
                      help='measured time per run, once warm')
  parser.add_argument('--repeats', type=int, default=3,
                      help='runs of each actor per row, alternating')
  parser.add_argument('--hidden', type=int, nargs='+', default=[256, 256])
  parser.add_argument('--chunk-steps', type=int, default=32)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default=os.path.join(
      'benchmarks', 'results', 'cpu', 'actor_baseline.json'))
  args = parser.parse_args(argv)
  if args.repeats < 1 or args.seconds <= 0:
    parser.error('--repeats must be >= 1 and --seconds > 0')
  return args


def extract_tree(rev: str, folder: str) -> str:
  """Writes commit ``rev``'s files into ``folder``; returns the full hash."""
  full = subprocess.run(['git', 'rev-parse', '--verify', f'{rev}^{{commit}}'],
                        capture_output=True, text=True, check=True
                        ).stdout.strip()
  archive = subprocess.run(['git', 'archive', '--format=tar', full],
                           capture_output=True, check=True).stdout
  subprocess.run(['tar', '-x', '-C', folder], input=archive, check=True)
  return full


def baseline_steps_per_s(tree: str, args, env_id: str, n: int) -> float:
  """The earlier tree's actor rate (env steps per wall second), measured
  by its own benchmark in a subprocess that imports that tree."""
  probe = os.path.join(tree, '_actor_baseline_probe.py')
  with open(probe, 'w') as f:
    f.write(_PROBE.format(env=env_id, members=n, seconds=args.seconds,
                          hidden=tuple(args.hidden),
                          chunk_steps=args.chunk_steps, seed=args.seed))
  env = {**os.environ, 'PYTHONPATH': tree}
  done = subprocess.run([sys.executable, probe], cwd=tree, env=env,
                        capture_output=True, text=True,
                        timeout=PROBE_TIMEOUT_S)
  if done.returncode != 0:
    raise RuntimeError(f'the baseline actor failed:\n{done.stderr[-4000:]}')
  result = json.loads(done.stdout.strip().splitlines()[-1])
  # The probe must have imported the earlier tree, not the installed one.
  if not os.path.abspath(result['fastpbrl']).startswith(
      os.path.abspath(tree)):
    raise RuntimeError(f'the baseline imported {result["fastpbrl"]}, not '
                       f'the tree in {tree}')
  return float(result['rate'])


def measure_row(tree: str, args, env_id: str, n: int) -> dict:
  """``--repeats`` runs of the baseline, serial and vectorized actors,
  alternating; each mode's mean and the ratios to the baseline."""
  runs = {'baseline': [], 'serial': [], 'vectorized': []}
  for _ in range(args.repeats):
    runs['baseline'].append(baseline_steps_per_s(tree, args, env_id, n))
    for mode in ('serial', 'vectorized'):
      wall, cpu = actor_steps_per_s(args, env_id, n, mode == 'vectorized')
      runs[mode].append({'wall': wall, 'cpu': cpu})
  row = {'env': env_id, 'members': n, 'runs': runs,
         'baseline': float(np.mean(runs['baseline']))}
  for mode in ('serial', 'vectorized'):
    row[mode] = float(np.mean([r['wall'] for r in runs[mode]]))
  return row


def main(argv=None) -> None:
  args = parse_args(argv)
  # actor_steps_per_s reads these; the baseline's actors evaluate nothing.
  args.eval_every, args.eval_episodes = 0, 1
  logging.basicConfig(level=logging.WARNING)
  cores = len(os.sched_getaffinity(0))
  rows = []
  with tempfile.TemporaryDirectory(prefix='fastpbrl-baseline-') as tree:
    try:
      baseline = extract_tree(args.baseline_rev, tree)
    except (OSError, subprocess.CalledProcessError):
      raise SystemExit(f'--baseline-rev: {args.baseline_rev!r} is not a '
                       'commit of this git checkout (run from the '
                       'repository, with its history)') from None
    print(f'actor baseline: {baseline[:12]} beside this tree, TD3 '
          f'{tuple(args.hidden)}, one actor process, {args.seconds:g} s per '
          f'run, {args.repeats} repeats, {cores} cores available', flush=True)
    for env_id in args.envs:
      for n in args.members:
        rows.append(measure_row(tree, args, env_id, n))
        print(actor_baseline_table({'rows': rows[-1:]}).splitlines()[-1],
              flush=True)
  record = {'command': ' '.join(['python', '-m', 'benchmarks.actor_baseline',
                                 *(sys.argv[1:] if argv is None else argv)]),
            'machine': cpu_machine(),
            'date': time.strftime('%Y-%m-%d'), 'commit': git_commit(),
            'baseline_commit': baseline,
            'settings': {k: v for k, v in vars(args).items() if k != 'out'},
            'rows': rows}
  os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(record, f, indent=1)
  table = actor_baseline_table(record)
  with open(os.path.splitext(args.out)[0] + '.md', 'w') as f:
    f.write(f'Actor throughput beside the actor of commit {baseline[:12]} '
            f'(before the batched env stepping): env steps per wall second '
            f'of one actor process, TD3 {tuple(args.hidden)} policy + noise; '
            f'{cores} cores; {record["date"]}, commit '
            f'{record["commit"][:12]}.\nCommand: `{record["command"]}`\n\n'
            f'{table}\n')
  print(table)


if __name__ == '__main__':
  main()
