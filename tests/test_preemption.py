"""SIGTERM and SIGINT against a real run: the loop finishes its call,
checkpoints, stops every process, releases every segment and exits with
128 + signal and one line naming the checkpoint and the resume command; a
second signal exits at once and leaves the earlier checkpoint usable; the
resumed run continues. And a script without a ``__main__`` guard gets an
error naming the fix."""

import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from tests.test_pipeline import our_segments, wait_until

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ['--env', 'Pendulum-v1', '--population-size', '2',
         '--warmup-steps', '200', '--hidden-sizes', '16', '16',
         '--batch-size', '16', '--steps-per-call', '10', '--eval-every',
         '400', '--eval-episodes', '1', '--num-actors', '1',
         '--replay-capacity', '20000', '--checkpoint-every', '50',
         '--no-progress']
LINE = re.compile(r'^(SIGTERM|SIGINT): stopped after learner call (\d+) '
                  r'\((\d+) env steps per member\); checkpoint in (\S+)/'
                  r'checkpoints; resume with: fastpbrl seeds '
                  r"--resume (\S+)$")


def start(args):
  return subprocess.Popen(
      [sys.executable, '-m', 'experiments.seeds', *args], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)


def checkpoints(run_dir):
  folder = os.path.join(run_dir, 'checkpoints')
  if not os.path.isdir(folder):
    return []
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit())


def wait_for_checkpoint(proc, run_dir):
  """Waits for a checkpoint after the first learner call (checkpoint 0 is
  written before it)."""
  if not wait_until(lambda: max(checkpoints(run_dir), default=0) > 0
                    or proc.poll() is not None, 600):
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError('no checkpoint within 600 s')
  if proc.poll() is not None:
    raise AssertionError(f'the run ended early:\n{proc.communicate()[1]}')


def stopped_by_sigterm(args, run_dir, module='experiments.seeds') -> str:
  """Runs ``python -m module args``, SIGTERMs it after its first
  checkpoint in ``run_dir``, checks it exited with 143; its stderr."""
  proc = subprocess.Popen(
      [sys.executable, '-m', module, *args, '--run-dir', run_dir], cwd=REPO,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      start_new_session=True)
  wait_for_checkpoint(proc, run_dir)
  os.kill(proc.pid, signal.SIGTERM)
  _, err = finish(proc)
  assert proc.returncode == 143, err
  return err


def finish(proc, timeout=300):
  try:
    return proc.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # leave nothing behind on failure
    raise


def last_line(stderr):
  return [line for line in stderr.splitlines() if line.strip()][-1]


def resume(run_dir, env_steps):
  proc = start(['--resume', run_dir, '--env-steps', str(env_steps)])
  out, err = finish(proc, 600)
  assert proc.returncode == 0, err
  return err


@pytest.mark.parametrize('signum', [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_and_exits_with_one_line(tmp_path, signum):
  run_dir = str(tmp_path / 'run')
  proc = start(FLAGS + ['--env-steps', '100000', '--run-dir', run_dir])
  wait_for_checkpoint(proc, run_dir)
  if signum == signal.SIGINT:
    os.killpg(proc.pid, signum)  # a terminal's Ctrl-C: the whole group
  else:
    os.kill(proc.pid, signum)  # a batch system's SIGTERM to the job
  _, err = finish(proc)
  assert proc.returncode == 128 + signum, err
  match = LINE.match(last_line(err))
  assert match, err
  name, calls, env_steps, where, resume_dir = match.groups()
  assert name == signal.Signals(signum).name
  assert where == run_dir == resume_dir
  assert int(calls) == checkpoints(run_dir)[-1]
  assert 'Traceback' not in err and 'leaked' not in err
  assert our_segments(proc.pid) == []
  # The resumed run continues from that call: no warm-up of random
  # actions, and it ends normally.
  err = resume(run_dir, int(env_steps) + 300)
  assert f'resumed {run_dir} at call {calls}' in err
  assert 'replay refilled by the restored policies' in err


def test_a_second_signal_exits_at_once_and_keeps_the_earlier_checkpoint(
    tmp_path):
  run_dir = str(tmp_path / 'run')
  proc = start(FLAGS + ['--env-steps', '100000', '--run-dir', run_dir,
                        '--checkpoint-replay'])
  wait_for_checkpoint(proc, run_dir)
  os.killpg(proc.pid, signal.SIGINT)
  os.killpg(proc.pid, signal.SIGINT)
  _, err = finish(proc)
  assert proc.returncode == 130, err
  line = last_line(err)
  assert line.startswith(('SIGINT again: stopped at once', 'SIGINT: stopped')
                         ), err  # the first may already have finished
  assert 'resume with: fastpbrl seeds --resume' in line
  assert our_segments(proc.pid) == []
  last = checkpoints(run_dir)[-1]  # a save cut short is not listed
  err = resume(run_dir, 2000)
  assert f'resumed {run_dir} at call {last} ' in err
  assert 'replay restored' in err
  assert not any('orbax-checkpoint-tmp' in d for d in os.listdir(
      os.path.join(run_dir, 'checkpoints')))


SCRIPT = textwrap.dedent('''
    from fastpbrl.config.fields import RunConfig
    from fastpbrl.rules.seeds import Seeds
    from fastpbrl.run.main import run
    config = RunConfig(env='Pendulum-v1', population_size=2, env_steps=600,
                       warmup_steps=100, hidden_sizes=(8,), batch_size=8,
                       steps_per_call=5, eval_every=300, eval_episodes=1,
                       num_actors=1, replay_capacity=1000, progress=False,
                       run_dir={run_dir!r})
    run(config, Seeds(config))  # no __main__ guard
''')


def test_a_script_without_main_guard_gets_an_error_naming_the_fix(tmp_path):
  script = tmp_path / 'train.py'
  script.write_text(SCRIPT.format(run_dir=str(tmp_path / 'run')))
  proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  _, err = finish(proc)
  assert proc.returncode != 0
  assert ("without `if __name__ == '__main__':`" in last_line(err)), err
  assert err.count('Traceback') <= 1
  assert our_segments(proc.pid) == []


# Per rule: the flags that make a short run of it take decisions.
RULE_FLAGS = {
    'pbt': ['--ready-after', '100', '--eval-every', '100'],
    'cemrl': ['--population-size', '4', '--total-env-steps', '1000000',
              '--mean-eval-episodes', '1'],
    'dvd': ['--bandit-every', '20', '--eval-every', '20'],
    'hypertrick': ['--num-workers', '6', '--phase-env-steps', '100',
                   '--eval-every', '100'],
    'seeds': [],
}


@pytest.mark.parametrize('rule', sorted(RULE_FLAGS))
def test_every_rule_stops_on_sigterm_and_resumes(tmp_path, rule):
  """Each rule's own command: SIGTERM after a checkpoint stops it with 143
  and the resume command of that rule; the resume, which restores the
  rule's state pytree, runs to the end."""
  run_dir = str(tmp_path / 'run')
  budget = [] if rule == 'cemrl' else ['--env-steps', '100000']
  err = stopped_by_sigterm([*FLAGS, *RULE_FLAGS[rule], *budget], run_dir,
                           f'experiments.{rule}')
  line = last_line(err)
  assert f'resume with: fastpbrl {rule} --resume {run_dir}' in line, err
  env_steps = int(re.search(r'\((\d+) env steps per member\)', line)[1])
  more = (['--total-env-steps', str((env_steps + 200) * 4)]
          if rule == 'cemrl' else ['--env-steps', str(env_steps + 200)])
  proc = subprocess.Popen(
      [sys.executable, '-m', f'experiments.{rule}', '--resume', run_dir,
       *more, '--no-progress'], cwd=REPO, stdout=subprocess.PIPE,
      stderr=subprocess.PIPE, text=True, start_new_session=True)
  _, err = finish(proc, 600)
  assert proc.returncode == 0, err
  assert f'resumed {run_dir} at call' in err
  assert our_segments(proc.pid) == []


def test_ppo_on_device_stops_on_sigterm_and_resumes(tmp_path):
  """PPO on the on-device rollout path (``fastpbrl.datapath.device_rollouts``),
  through the command: a SIGTERM after a checkpoint stops it after whole
  iterations (32 env steps per call) with 143 and the resume line; the
  resumed run restores the envs (nothing to refill: no replay) and learns
  exactly the calls its larger budget adds."""
  pytest.importorskip('gymnax')
  run_dir = str(tmp_path / 'run')
  flags = ['--agent', 'ppo', '--env', 'gymnax:CartPole-v1',
           '--population-size', '2', '--hidden-sizes', '16', '16',
           '--agent-settings', 'rollout_length=16', 'num_envs=2',
           'batch_size=16', 'epochs=2', '--eval-every', '64',
           '--eval-episodes', '1', '--checkpoint-every', '64',
           '--no-progress', '--track', 'none', '--env-steps', '10000000']
  err = stopped_by_sigterm(flags, run_dir)
  match = LINE.match(last_line(err))
  assert match, err
  assert 'Traceback' not in err
  calls, env_steps = int(match.group(2)), int(match.group(3))
  assert calls == checkpoints(run_dir)[-1]
  assert env_steps == calls * 32  # T x E per call, one iteration each
  err = resume(run_dir, env_steps + 4 * 32)
  assert f'resumed {run_dir} at call {calls}' in err
  assert 'refilled' not in err
  with open(os.path.join(run_dir, 'summary.txt')) as f:
    summary = f.read()
  assert (f'update steps: {env_steps + 128} per member in {calls + 4} '
          'learner calls') in summary, summary
