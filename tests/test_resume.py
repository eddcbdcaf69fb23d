"""A resume loses nothing (the actor path): a PBT run stopped by SIGTERM in
its first learner call, resumed, killed with SIGKILL mid-run and resumed
again ends, as a run never stopped does, with exactly the update steps
its budget earned and its env steps past the budget by no more than the
actors run ahead of the learner, and its rule decisions are as many
within one per member per resume; its logs read back and its pictures
are drawn. So does a run killed so close to its end that the refill is
more than what is left of its budget. Resuming the finished run trains
nothing. (The on-device path's bit-for-bit resume is in
``tests/test_on_device.py``.)"""

import csv
import json
import os
import signal
import subprocess
import sys

import pytest

import fastpbrl
from tests.test_pipeline import wait_until
from tests.test_preemption import FLAGS, REPO, checkpoints, finish, last_line

pytestmark = pytest.mark.slow

STEPS_PER_CALL = 10  # FLAGS' --steps-per-call
CHUNK = 32  # env steps per member an actor sends at once
PREFETCH_DEPTH = 2  # batches the prefetch thread samples ahead
BUDGET = 1500  # env steps per member
PBT = [*FLAGS, '--ready-after', '100', '--eval-every', '100',
       '--env-steps', str(BUDGET)]


def start(args):
  return subprocess.Popen(
      [sys.executable, '-m', 'experiments.pbt', *args], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)


def wait_for(proc, condition, what):
  """Waits (generously: the machine may be busy) until ``condition()``."""
  if not wait_until(lambda: condition() or proc.poll() is not None, 600):
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f'no {what} within 600 s')
  if proc.poll() is not None:
    raise AssertionError(f'the run ended before {what}:\n'
                         f'{proc.communicate()[1]}')


def completes(proc) -> str:
  _, err = finish(proc, 600)
  assert proc.returncode == 0, err
  return err


def ends_with_what_its_budget_earned(run_dir):
  """The run took exactly the update steps its budget's data earned (one
  per env step, the warm-up's included, in whole learner calls: the
  budget is a multiple of one), whether stopped or not; and its env steps
  passed the budget by no more than the actors may run ahead of the
  learner: ``PipelineConfig.env_steps_ahead`` past the update steps the
  prefetch thread was granted, which is at most ``PREFETCH_DEPTH + 1``
  calls past those learned. Where the last chunk ends is the actors'
  timing, in any run."""
  env_steps, update_steps, _ = counts(run_dir)
  assert update_steps == BUDGET, (run_dir, update_steps)
  ahead = (PREFETCH_DEPTH + 2) * STEPS_PER_CALL + CHUNK
  most = BUDGET + (PREFETCH_DEPTH + 1) * STEPS_PER_CALL + ahead
  assert BUDGET <= env_steps <= most, (run_dir, env_steps)


def counts(run_dir):
  """Env steps and update steps at the end (the last hyperparameter row)
  and the PBT decisions (lineage events), from the run's files."""
  with open(os.path.join(run_dir, 'hparams.csv'), newline='') as f:
    last = list(csv.DictReader(f))[-1]
  with open(os.path.join(run_dir, 'lineage.jsonl')) as f:
    decisions = [json.loads(line) for line in f]
  return int(last['env_steps']), int(last['update_steps']), len(decisions)


def test_stopped_killed_and_resumed_twice_ends_as_a_run_never_stopped(
    tmp_path):
  whole, stopped = str(tmp_path / 'whole'), str(tmp_path / 'stopped')
  completes(start([*PBT, '--run-dir', whole]))

  # SIGTERM as soon as checkpoint 0 is written: in the warm-up or the
  # first learner call (compiling), the likeliest moment for a Ctrl-C.
  proc = start([*PBT, '--run-dir', stopped])
  wait_for(proc, lambda: checkpoints(stopped), 'checkpoint 0')
  os.kill(proc.pid, signal.SIGTERM)
  _, err = finish(proc)
  assert proc.returncode == 143, err
  assert 'stopped after learner call 0 ' in last_line(err), err

  # Resumed, then killed with SIGKILL mid-run: no checkpoint of its own.
  proc = start(['--resume', stopped, '--no-progress'])
  wait_for(proc, lambda: max(checkpoints(stopped), default=0) >= 40,
           'checkpoint 40')
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()

  err = completes(start(['--resume', stopped, '--no-progress']))
  assert 'resumed' in err and 'Traceback' not in err

  _, _, decisions = counts(whole)
  got_env_steps, _, got_decisions = counts(stopped)
  for run_dir in (whole, stopped):
    ends_with_what_its_budget_earned(run_dir)
  # PBT decides when a member's update steps pass --ready-after, at the
  # same update steps in both runs; whether a member copies follows the
  # returns, which asynchronous actors do not reproduce.
  resumes = 2
  assert abs(got_decisions - decisions) <= resumes * 2, (got_decisions,
                                                         decisions)
  run = fastpbrl.load_run(stopped)
  assert len(run.final_returns) == 2
  assert run.evaluations['env_steps'].max() == got_env_steps
  assert not run.episodes.duplicated(['member', 'env_steps',
                                      'evaluation']).any()
  for picture in ('returns.png', 'hparams.png'):
    assert os.path.getsize(os.path.join(stopped, picture)) > 0

  # Killed close to the end of its budget, where the refill (200 steps)
  # is more than what is left: it takes the update steps it earned anyway.
  late = str(tmp_path / 'late')
  proc = start([*PBT, '--run-dir', late])
  wait_for(proc, lambda: max(checkpoints(late), default=0) >= 130,
           'checkpoint 130')
  os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()
  completes(start(['--resume', late, '--no-progress']))
  ends_with_what_its_budget_earned(late)

  # The finished run, resumed: nothing is trained or evaluated again.
  before = open(os.path.join(stopped, 'final_returns.json')).read()
  err = completes(start(['--resume', stopped, '--no-progress']))
  assert 'nothing left to train' in err, err
  assert 'pipeline:' not in err  # no actors started
  assert open(os.path.join(stopped, 'final_returns.json')).read() == before
