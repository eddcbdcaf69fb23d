"""fastpbrl against rejax 0.1.3, a pure-JAX RL library that vmaps a whole
training loop: the same work on both sides, as whole processes.

Each row (``benchmarks/peers/rows.py``) is one task with one layout and
the same widths on both sides, members that differ by seed only:

* ``ppo-sb3``: PPO, 16 members x 500,000 env steps, gymnax CartPole-v1,
  Stable-Baselines3's layout (2,048 steps of 1 env, 10 epochs of
  minibatches of 64, 64x64 tanh, SB3's hyperparameters);
* ``td3``: TD3, 4 members x 15,000 env steps, gymnax Pendulum-v1, 64x64,
  batch 256, one update per env step after 1,000 random steps;
* ``ppo-purejaxrl``: PPO, 16 members x 500,000 env steps, CartPole-v1,
  PureJaxRL's layout (4 envs x 128 steps, 4 epochs of 4 minibatches);
* ``scale``: the PureJaxRL layout at ``--scale-members`` (16 64 256)
  members x ``--scale-env-steps`` (100,000) env steps each.

For each row, one process after the other (``--repeats`` times, in
turn): ``fastpbrl seeds`` with default flags but for the row's task,
layout and hyperparameters; rejax through ``benchmarks/peers/
rejax_train.py`` in its own virtual environment (``bash benchmarks/
peers/setup_rejax.sh`` makes ``.venv-rejax``), once as ``jax.jit(
jax.vmap(algo.train))`` on one device and once as ``jax.pmap(jax.vmap(
algo.train))`` over one host device per core (``XLA_FLAGS`` set in that
process's environment before it starts), evaluating as little as rejax
allows. Each process is timed whole (``time.perf_counter`` around
``subprocess.run``: start-up, imports, compilation, training).

Usage::

  bash benchmarks/peers/setup_rejax.sh               # once
  python -m benchmarks.peers                          # every row
  python -m benchmarks.peers --rows ppo-sb3 td3 --repeats 3
  python -m benchmarks.peers --rows scale --scale-env-steps 50000
  python -m benchmarks.peers --smoke                  # tiny: both run?

Writes ``--out`` (default ``benchmarks/results/peers/peers.json``: every
run of every side, min and median, the ratio fastpbrl / best rejax, the
settings and commands, the machine, date, commit and both sides' jax
versions) and the same name with ``.md``; ``--smoke`` writes to a
temporary folder unless ``--out`` is given. Run nothing else on the
machine meanwhile. Host-side code: subprocesses, timers, files.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks.peers import report
from benchmarks.peers import rows as rows_lib
from benchmarks.provenance import (code_version, cpu_machine, git_commit,
                                   write_record)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
ROWS = ('ppo-sb3', 'td3', 'ppo-purejaxrl', 'scale')
UPDATE_STEPS = re.compile(r'update steps: (\d+) per member in (\d+) learner')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.peers',
      description=__doc__.split('\n\n', 1)[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--rows', nargs='+', default=list(ROWS),
                      choices=ROWS, help='rows to run, in this order')
  parser.add_argument('--scale-members', type=int, nargs='+',
                      default=[16, 64, 256],
                      help='members of the scaling rows')
  parser.add_argument('--scale-env-steps', type=int, default=100_000,
                      help='env steps per member of the scaling rows')
  parser.add_argument('--sides', nargs='+',
                      default=list(report.DEFAULT_SIDES),
                      choices=report.SIDES,
                      help='fastpbrl-one-device: fastpbrl on one host '
                      'device, what one device per core gains; '
                      'fastpbrl-pbt: under PBT, deciding every 5%% of '
                      'the budget, what the rule costs')
  parser.add_argument('--repeats', type=int, default=1,
                      help='runs of each side per row, in turn')
  parser.add_argument('--cores', type=int,
                      default=len(os.sched_getaffinity(0)),
                      help='host devices of rejax\'s pmap variant')
  parser.add_argument('--rejax-python',
                      default=os.path.join(ROOT, '.venv-rejax', 'bin',
                                           'python'),
                      help='the python of setup_rejax.sh\'s venv')
  parser.add_argument('--fastpbrl', default=os.path.join(
      os.path.dirname(sys.executable), 'fastpbrl'),
                      help='the fastpbrl command')
  parser.add_argument('--smoke', action='store_true',
                      help='every row at 2 members (scaling: 2 and 4) x '
                      '4,096 env steps (TD3 2,000): only checks both run')
  parser.add_argument('--out', default=None, help='the record\'s JSON '
                      '(default benchmarks/results/peers/peers.json)')
  parser.add_argument('--report-only', action='store_true',
                      help='rewrite the .md of --out from its JSON')
  args = parser.parse_args(argv)
  if args.out is None:
    args.out = (os.path.join(tempfile.gettempdir(), 'peers_smoke.json')
                if args.smoke else os.path.join(
                    'benchmarks', 'results', 'peers', 'peers.json'))
  return args


def _timed(command: list[str],
           env: dict) -> tuple[float, subprocess.CompletedProcess]:
  """Runs ``command`` in a fresh process: its wall seconds, its end."""
  start = time.perf_counter()
  done = subprocess.run(command, env=env, capture_output=True, text=True)
  return time.perf_counter() - start, done


def _failure(done: subprocess.CompletedProcess) -> str:
  tail = done.stderr.strip().splitlines()[-1:] or ['(no output)']
  return f'failed ({done.returncode}): {tail[0][:300]}'


def run_fastpbrl(row: rows_lib.Row, args, mode: str = 'vmap',
                 rule: str = 'seeds') -> dict:
  """One ``fastpbrl seeds`` (or ``rule``) process for the row, into a
  temporary run folder (removed after): its wall time, env and update
  steps, final returns and resolved config. ``mode`` ``one-device``: on
  one host device."""
  run_dir = tempfile.mkdtemp(prefix=f'peers-{row.name}-')
  try:
    seconds, done = _timed(
        [args.fastpbrl, *rows_lib.fastpbrl_command(row, run_dir, rule)],
        rows_lib.side_environment(mode, args.cores))
    if done.returncode != 0:
      return {'error': _failure(done)}
    with open(os.path.join(run_dir, 'final_returns.json')) as f:
      finals = json.load(f)
    with open(os.path.join(run_dir, 'config.json')) as f:
      config = json.load(f)
    with open(os.path.join(run_dir, 'summary.txt')) as f:
      updates = UPDATE_STEPS.search(f.read())
  finally:
    shutil.rmtree(run_dir, ignore_errors=True)
  returns = finals['final_returns']
  return {'seconds': seconds, 'env_steps_per_member': finals['env_steps'],
          'update_steps_per_member': updates and int(updates.group(1)),
          'learner_calls': updates and int(updates.group(2)),
          'final_eval_mean_return': sum(returns) / len(returns),
          'config': {k: v for k, v in config.items() if k != 'run_dir'}}


def run_rejax(row: rows_lib.Row, mode: str, args) -> dict:
  """One rejax driver process for the row (``mode`` vmap or pmap): its
  wall time and what the driver printed (phases, steps, versions)."""
  seconds, done = _timed(
      [args.rejax_python, *rows_lib.rejax_command(row, mode)],
      rows_lib.side_environment(mode, args.cores))
  if done.returncode != 0:
    return {'error': _failure(done)}
  return {**json.loads(done.stdout.strip().splitlines()[-1]),
          'seconds': seconds}


def run_side(row: rows_lib.Row, side: str, args) -> dict:
  """One process of ``side`` (``report.SIDES``)."""
  if side == 'fastpbrl':
    return run_fastpbrl(row, args)
  if side == 'fastpbrl-one-device':
    return run_fastpbrl(row, args, 'one-device')
  if side == 'fastpbrl-pbt':
    return run_fastpbrl(row, args, rule='pbt')
  return run_rejax(row, side.split('-', 1)[1], args)


def commands(row: rows_lib.Row, sides, cores: int) -> dict:
  """Each side's command for the record, as a shell would run it from
  the repository's root."""
  shown = {}
  for side in sides:
    if side.startswith('fastpbrl'):
      rule = 'pbt' if side == 'fastpbrl-pbt' else 'seeds'
      argv = ['fastpbrl', *rows_lib.fastpbrl_command(row, 'RUN_DIR', rule)]
      if side == 'fastpbrl-one-device':
        argv.insert(0, 'FASTPBRL_CPU_DEVICES=1')
    else:
      mode = side.split('-', 1)[1]
      argv = ['.venv-rejax/bin/python',
              *rows_lib.rejax_command(row, mode)]
      argv[1] = os.path.relpath(argv[1], ROOT)
      if mode == 'pmap':
        argv.insert(0, f'XLA_FLAGS={rows_lib.DEVICE_COUNT_FLAG}={cores}')
    shown[side] = shlex.join(argv)
  return shown


def run_row(row: rows_lib.Row, args) -> dict:
  """Every side of one row, ``--repeats`` times in turn."""
  runs = {side: [] for side in args.sides}
  for _ in range(args.repeats):
    for side in args.sides:
      runs[side].append(run_side(row, side, args))
      last = runs[side][-1]
      print(f'{row.name} {side}: '
            + (f'{last["seconds"]:.1f} s' if 'seconds' in last
               else last['error']), flush=True)
  sides = {}
  for side, done in runs.items():
    seconds = [r['seconds'] for r in done if 'error' not in r]
    errors = [r['error'] for r in done if 'error' in r]
    sides[side] = {'runs': done, **(report.summary(seconds) if seconds
                                    else {'error': errors[0]})}
  result = {'row': row.name, 'settings': dataclasses.asdict(row),
            'commands': commands(row, args.sides, args.cores),
            'sides': sides}
  result['settings']['hparams'] = dict(row.hparams)
  result['settings']['hidden'] = list(row.hidden)
  return {**result, **report.ratios(result)}


def _version(name: str):
  try:
    return importlib.metadata.version(name)
  except importlib.metadata.PackageNotFoundError:
    return None


def rejax_versions(rows: list[dict]):
  """The rejax side's package versions, as its first finished run
  reported them."""
  for row in rows:
    for side in report.REJAX_SIDES:
      for run in row['sides'].get(side, {}).get('runs', []):
        if 'versions' in run:
          return run['versions']
  return None


def main(argv=None) -> None:
  args = parse_args(argv)
  if args.report_only:
    with open(args.out) as f:
      record = json.load(f)
    write_record(args.out, record, report.markdown(record))
    return
  if any(s.startswith('rejax') for s in args.sides) and not os.path.exists(
      args.rejax_python):
    raise SystemExit(f'no {args.rejax_python}: run bash benchmarks/peers/'
                     'setup_rejax.sh first (or give --rejax-python)')
  chosen = rows_lib.rows(args.rows, args.scale_members,
                         args.scale_env_steps, smoke=args.smoke)
  done = [run_row(row, args) for row in chosen]
  argv = argv if argv is not None else sys.argv[1:]
  record = {
      'command': shlex.join(['python', '-m', 'benchmarks.peers', *argv]),
      'machine': cpu_machine(), 'date': time.strftime('%Y-%m-%d'),
      'commit': git_commit(), 'code': code_version(),
      'versions': {'fastpbrl': {p: _version(p) for p in
                                ('fastpbrl', 'jax', 'jaxlib', 'gymnax')},
                   'rejax': rejax_versions(done)},
      'settings': {k: v for k, v in vars(args).items()
                   if k not in ('out', 'report_only', 'fastpbrl',
                                'rejax_python')},
      'differences': list(report.DIFFERENCES),
      'rows': done}
  write_record(args.out, record, report.markdown(record))
  print(report.table(record))
  print(f'record in {args.out} and {os.path.splitext(args.out)[0]}.md')
