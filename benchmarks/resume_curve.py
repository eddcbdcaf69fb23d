"""A run killed with ``kill -9`` and resumed vs the same run uninterrupted.

Host-side script. Trains ``--population-size`` independent TD3 members
(``fastpbrl seeds``) twice with the same seed: once straight through, once
killed with SIGKILL (no chance to save anything) once it has passed half of
its budget and then resumed from its last checkpoint: with
``--checkpoint-replay``, or with ``--refill`` without it (the default of
``fastpbrl``: the restored policies refill the replay). Asynchronous
actors make two runs of one seed drift apart anyway
(docs/guides/preemption.md, "What is reproducible"), so the test is
whether the resumed run's returns lie within the members' own spread, the
seed noise, and whether it ends with the update steps of the run never
stopped. Prints both final evaluations and writes the figures with their
command, machine, date and commit, and a plot of the two mean return
curves.

    python -m benchmarks.resume_curve --out benchmarks/results/resume
    python -m benchmarks.resume_curve --refill --out benchmarks/results/resume
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import signal
import sys
import time

import numpy as np

from benchmarks import provenance
from benchmarks.faults import Run, checkpoints, csv_progress, wait_until
from fastpbrl.logs.logging import evaluation_points, read_member_csvs

EVAL_EPISODES = 5


def flags(args, run_dir: str) -> list[str]:
  return ['--env', args.env, '--population-size', str(args.population_size),
          '--env-steps', str(args.env_steps), '--seed', str(args.seed),
          '--eval-every', str(args.eval_every), '--eval-episodes',
          str(EVAL_EPISODES),
          '--checkpoint-every', str(args.checkpoint_every),
          '--no-checkpoint-replay' if args.refill else '--checkpoint-replay',
          '--no-progress', '--run-dir', run_dir]


def update_steps(run_dir: str) -> int:
  """The run's update steps per member at its end (its last
  hyperparameter row)."""
  with open(os.path.join(run_dir, 'hparams.csv'), newline='') as f:
    return int(list(csv.DictReader(f))[-1]['update_steps'])


def final_returns(run_dir: str) -> list[float]:
  with open(os.path.join(run_dir, 'final_returns.json')) as f:
    return json.load(f)['final_returns']


def curve(run_dir: str, eval_every: int) -> tuple[np.ndarray, np.ndarray]:
  """Mean over members of each evaluation's mean return, by env steps
  (each evaluation binned to the nearest multiple of ``eval_every``)."""
  by_step: dict[int, list[float]] = {}
  for rows in read_member_csvs(run_dir):
    for step, _, mean in evaluation_points(rows, EVAL_EPISODES):
      step = int(round(step / eval_every)) * eval_every
      by_step.setdefault(step, []).append(mean)
  steps = np.array(sorted(by_step))
  return steps, np.array([np.mean(by_step[s]) for s in steps])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--out', default='benchmarks/results/resume')
  parser.add_argument('--env', default='Pendulum-v1')
  parser.add_argument('--population-size', type=int, default=4)
  parser.add_argument('--env-steps', type=int, default=10_000)
  parser.add_argument('--eval-every', type=int, default=1000)
  parser.add_argument('--checkpoint-every', type=int, default=2500,
                      help='env steps per member between checkpoints')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--refill', action='store_true',
                      help='resume without the replay in the checkpoints '
                      '(fastpbrl\'s default): the restored policies refill '
                      'it; the figures go to resume_curve_refill.*')
  args = parser.parse_args(argv)
  name = 'resume_curve_refill' if args.refill else 'resume_curve'

  out = os.path.abspath(args.out)
  runs = os.path.join(out, 'runs', name)
  os.makedirs(runs, exist_ok=True)
  straight, killed = (os.path.join(runs, name) for name in
                      ('uninterrupted', 'killed-and-resumed'))
  for path in (straight, killed):
    if os.path.exists(path):
      raise SystemExit(f'error: {path} exists; choose a new --out')

  start = time.monotonic()
  run = Run(flags(args, straight), straight)
  if run.wait(3600) != 0:
    raise SystemExit(f'the uninterrupted run failed:\n{run.text()[-2000:]}')
  straight_s = time.monotonic() - start

  run = Run(flags(args, killed), killed)
  half = args.env_steps // 2
  wait_until(lambda: csv_progress(killed)[0] >= half
             and checkpoints(killed) or run.proc.poll() is not None, 3600, 0.5)
  before = csv_progress(killed)
  os.killpg(run.pid, signal.SIGKILL)  # learner, actors, resource tracker
  run.wait(60)
  resumed = Run(['--resume', killed], killed)
  if resumed.wait(3600) != 0:
    raise SystemExit(f'the resume failed:\n{resumed.text()[-2000:]}')
  text = resumed.text()
  marker = 'resumed '
  line = next(x for x in text.splitlines() if marker in x)
  call = int(line.split(' at call ')[1].split()[0])
  lost_calls = max(0, before[1] // 50 - call)

  a, b = final_returns(straight), final_returns(killed)
  result = {
      'command': 'python -m benchmarks.resume_curve ' + ' '.join(
          argv if argv is not None else sys.argv[1:]),
      'machine': provenance.cpu_machine(), 'commit': provenance.git_commit(),
      'date': datetime.date.today().isoformat(),
      'checkpoint_replay': not args.refill,
      'env': args.env, 'population_size': args.population_size,
      'env_steps': args.env_steps, 'seed': args.seed,
      'killed_at_env_steps': before[0], 'resumed_at_call': call,
      'learner_calls_lost': lost_calls,
      'uninterrupted_final_returns': a, 'resumed_final_returns': b,
      'uninterrupted_mean': float(np.mean(a)), 'uninterrupted_std':
          float(np.std(a)), 'resumed_mean': float(np.mean(b)),
      'resumed_std': float(np.std(b)), 'uninterrupted_seconds': straight_s,
      'uninterrupted_update_steps': update_steps(straight),
      'resumed_update_steps': update_steps(killed)}
  with open(os.path.join(out, f'{name}.json'), 'w') as f:
    json.dump(result, f, indent=2)

  import matplotlib  # noqa: PLC0415
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for label, path in (('uninterrupted', straight),
                      ('killed at %d steps, resumed' % before[0], killed)):
    x, y = curve(path, args.eval_every)
    ax.plot(x, y, marker='o', label=label)
  ax.axvline(before[0], color='grey', linestyle=':')
  ax.set_xlabel('env steps per member')
  ax.set_ylabel(f'mean evaluation return ({args.population_size} members)')
  ax.set_title(f'{args.env}, seed {args.seed}: kill -9 and resume'
               + (' (replay refilled)' if args.refill else ''))
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out, f'{name}.png'), dpi=120)

  print(f'uninterrupted: final returns {np.round(a, 1).tolist()} '
        f'(mean {np.mean(a):.1f} +- {np.std(a):.1f})')
  print(f'killed at {before[0]} env steps per member, resumed at call '
        f'{call} ({lost_calls} learner calls redone): final returns '
        f'{np.round(b, 1).tolist()} (mean {np.mean(b):.1f} +- '
        f'{np.std(b):.1f})')
  print(f'update steps per member: {result["uninterrupted_update_steps"]} '
        f'uninterrupted, {result["resumed_update_steps"]} killed and resumed')
  print(f'results and {name}.png in {out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
