"""Fault injection against real runs: does a run survive, and what is lost?

Host-side script (processes and signals; nothing here is jittable). Each
scenario starts a real, small run (``python -m experiments.seeds`` or
``experiments.pbt`` on Pendulum-v1 / HalfCheetah-v5, 2-4 members, CPU),
injects one fault, and checks what a user on a preemptible queue relies on:
the run stops cleanly or recovers by itself, leaves no process or
shared-memory segment behind, and a resume continues from a whole
checkpoint. It prints one row per fault:

* ``survived``: every check of the scenario held (the note says which
  failed otherwise);
* ``data lost``: env steps per member collected but not in the resumed run
  (from the member CSVs' last episode before the fault, so a lower bound to
  within one episode, 200 steps on Pendulum);
* ``calls lost``: learner calls done before the fault that the resumed run
  redoes (likewise from the CSVs' update-step column);
* ``recover s``: seconds from the fault until the run trains again (a
  restarted actor's first log line; or signal to exit plus resume to its
  first new episode).

    python -m benchmarks.faults                 # every scenario (~10 min on 2 cores)
    python -m benchmarks.faults --only sigterm hung-actor

The full-disk scenario mounts a small tmpfs and needs root; without it the
row says so (not survived, not tested).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS_PER_CALL = 10
SMALL = ['--env', 'Pendulum-v1', '--population-size', '2',
         '--warmup-steps', '200', '--hidden-sizes', '32', '32',
         '--batch-size', '32', '--steps-per-call', str(STEPS_PER_CALL),
         '--eval-every', '1000', '--eval-episodes', '1', '--num-actors', '1',
         '--replay-capacity', '100000', '--checkpoint-every', str(20 * STEPS_PER_CALL),
         '--no-progress']
ACTOR_STARTED = re.compile(r'^(\S+ \S+) fastpbrl\.actors\.pool INFO actor '
                           r'(\d+) \(members .*\) started, pid (\d+)')
RESUMED = re.compile(r'resumed \S+ at call (\d+) \((\d+) env steps per member\)')


@dataclasses.dataclass
class Row:
  fault: str
  survived: bool = False
  data_lost: str = '-'
  calls_lost: str = '-'
  recover_s: str = '-'
  note: str = ''


class Run:
  """One training process, its stderr in a file."""

  def __init__(self, args: list[str], run_dir: str, script: str = 'seeds',
               log_dir: Optional[str] = None):
    self.run_dir = run_dir
    self.log = os.path.join(log_dir or os.path.dirname(run_dir),
                            f'{os.path.basename(run_dir)}.stderr.'
                            f'{int(time.time() * 1000)}')
    os.makedirs(os.path.dirname(self.log), exist_ok=True)
    command = [sys.executable, '-m', f'experiments.{script}', *args]
    self.stderr = open(self.log, 'w')  # noqa: SIM115 (closed in wait)
    self.proc = subprocess.Popen(command, cwd=REPO,
                                 stdout=subprocess.DEVNULL,
                                 stderr=self.stderr, start_new_session=True)
    self.pid = self.proc.pid

  def text(self) -> str:
    with open(self.log) as f:
      return f.read()

  def last_line(self) -> str:
    lines = [x for x in self.text().splitlines() if x.strip()]
    return lines[-1] if lines else ''

  def actor_starts(self) -> list[tuple[float, int, int]]:
    """(time, actor id, pid) of every actor process start, in order."""
    out = []
    for line in self.text().splitlines():
      m = ACTOR_STARTED.match(line)
      if m:
        stamp = time.mktime(time.strptime(m[1].split(',')[0],
                                          '%Y-%m-%d %H:%M:%S'))
        stamp += int(m[1].split(',')[1]) / 1000
        out.append((stamp, int(m[2]), int(m[3])))
    return out

  def wait(self, timeout: float = 900) -> int:
    try:
      return self.proc.wait(timeout)
    except subprocess.TimeoutExpired:
      os.killpg(self.pid, signal.SIGKILL)
      self.proc.wait(30)
      raise
    finally:
      self.stderr.close()

  def kill_all(self) -> None:
    try:
      os.killpg(self.pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def wait_until(condition: Callable[[], bool], timeout: float,
               poll: float = 0.05) -> bool:
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(poll)
  return True


def checkpoints(run_dir: str) -> list[int]:
  folder = os.path.join(run_dir, 'checkpoints')
  if not os.path.isdir(folder):
    return []
  return sorted(int(d) for d in os.listdir(folder) if d.isdigit())


def segments(pid: int) -> list[str]:
  return glob.glob(f'/dev/shm/fpbrl_{pid}_*')


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  try:
    with open(f'/proc/{pid}/status') as f:
      return 'State:\tZ' not in f.read()
  except FileNotFoundError:
    return False


def csv_progress(run_dir: str) -> tuple[int, int]:
  """(env steps, update steps) of the newest episode in the member CSVs."""
  env, upd = 0, 0
  for path in glob.glob(os.path.join(run_dir, 'members', '*.csv')):
    with open(path, newline='') as f:
      for row in csv.DictReader(f):
        try:
          env = max(env, int(row['env_steps']))
          upd = max(upd, int(row['update_steps']))
        except (TypeError, ValueError):
          continue  # a line cut by the kill
  return env, upd


def wait_for_checkpoint(run: Run, at_least: int = 1,
                        timeout: float = 600) -> None:
  if not wait_until(lambda: len(checkpoints(run.run_dir)) >= at_least
                    or run.proc.poll() is not None, timeout, 0.2):
    raise RuntimeError('no checkpoint within the deadline')
  if run.proc.poll() is not None:
    raise RuntimeError(f'the run ended early:\n{run.text()[-2000:]}')


def resume(run_dir: str, extra_env_steps: int = 600, script: str = 'seeds',
           log_dir: Optional[str] = None) -> tuple[Run, int, int, float]:
  """Resumes and waits until it trains again (a new episode row) and
  ends. Returns (run, resumed call, resumed env steps, seconds from start
  to the first new episode)."""
  before = csv_progress(run_dir)[0]
  start = time.monotonic()
  run = Run(['--resume', run_dir, '--env-steps', str(before + extra_env_steps)],
            run_dir, script, log_dir)
  found = {}

  def resumed() -> bool:
    m = RESUMED.search(run.text())
    if m:
      found['call'], found['env'] = int(m[1]), int(m[2])
    return bool(m) or run.proc.poll() is not None

  wait_until(resumed, 600, 0.1)
  first_new = None
  if found:
    def training() -> bool:
      return (csv_progress(run_dir)[0] > found['env']
              or run.proc.poll() is not None)
    wait_until(training, 600, 0.1)
    first_new = time.monotonic() - start
  rc = run.wait()
  if rc != 0:
    raise RuntimeError(f'the resume failed ({rc}):\n{run.text()[-3000:]}')
  return run, found.get('call', -1), found.get('env', -1), first_new or 0.0


def lost(before: tuple[int, int], call: int, env: int) -> tuple[str, str]:
  env_before, upd_before = before
  return (str(max(0, env_before - env)),
          str(max(0, upd_before // STEPS_PER_CALL - call)))


def conclude(row: Row, checks: dict, note_if_ok: str = '') -> Row:
  """Survived iff every check held; the note names those that failed."""
  row.survived = all(checks.values())
  row.note = '; '.join(k for k, ok in checks.items() if not ok) or note_if_ok
  return row


# ------------------------------------------------------------- scenarios


def signal_scenario(out: str, signum: int, group: bool) -> Row:
  name = signal.Signals(signum).name
  row = Row(f'{name} ({"process group" if group else "learner only"})')
  run_dir = os.path.join(out, name.lower())
  run = Run(SMALL + ['--env-steps', '1000000', '--run-dir', run_dir,
                     '--checkpoint-replay'], run_dir)
  try:
    wait_for_checkpoint(run, 2)
    t0 = time.monotonic()
    (os.killpg if group else os.kill)(run.pid, signum)
    rc = run.wait(300)
    stopped_s = time.monotonic() - t0
    line = run.last_line()
    checks = {
        f'exit status {128 + signum}': rc == 128 + signum,
        'one line naming checkpoint and resume command':
            line.startswith(f'{name}: stopped after learner call')
            and 'resume with:' in line and 'Traceback' not in run.text(),
        'no segment left': not segments(run.pid),
    }
    before = csv_progress(run_dir)  # what the stopped run logged in all
    resumed, call, env, first_new = resume(run_dir)
    checks['resumed at the stop call, with its replay'] = (
        f'call {call} ' in line and 'replay restored' in resumed.text())
    row.data_lost, row.calls_lost = lost(before, call, env)
    row.recover_s = f'{stopped_s:.1f} + {first_new:.1f}'
    conclude(row, checks, f'stopped in {stopped_s:.1f} s at call {call}')
  finally:
    run.kill_all()
  return row


def kill_learner_during_save(out: str) -> Row:
  row = Row('kill -9 learner during a checkpoint save')
  run_dir = os.path.join(out, 'kill-during-save')
  run = Run(SMALL + ['--env-steps', '1000000', '--run-dir', run_dir,
                     '--checkpoint-every', str(10 * STEPS_PER_CALL), '--checkpoint-replay'],
            run_dir)
  folder = os.path.join(run_dir, 'checkpoints')
  try:
    wait_for_checkpoint(run, 1)

    def saving() -> bool:
      return any('orbax-checkpoint-tmp' in d for d in os.listdir(folder))

    if not wait_until(saving, 300, 0.002):
      row.note = 'no save caught in progress'
      return row
    os.kill(run.pid, signal.SIGKILL)
    being_saved = [int(d.split('.')[0]) for d in os.listdir(folder)
                   if 'orbax-checkpoint-tmp' in d]
    run.wait(60)
    actors = [pid for _, _, pid in run.actor_starts()]
    actors_gone = wait_until(lambda: not any(map(alive, actors)), 60, 0.1)
    tmp_left = [d for d in os.listdir(folder) if 'tmp' in d]
    _, call, env, first_new = resume(run_dir)
    checks = {
        'actors exited by themselves': actors_gone,
        'save killed mid-way': bool(tmp_left),
        'unfinished save removed at resume': not any(
            'tmp' in d for d in os.listdir(folder)),
        'segments released': wait_until(lambda: not segments(run.pid), 60),
        'resumed from the previous checkpoint': call >= 0,
    }
    # Everything after the restored checkpoint is redone, the call being
    # saved included: at most one --checkpoint-every interval.
    calls_lost = max(being_saved) - call if being_saved else -1
    row.calls_lost = str(calls_lost)
    row.data_lost = f'{calls_lost * STEPS_PER_CALL} (the steps those calls used)'
    row.recover_s = f'{first_new:.1f} (resume to training)'
    conclude(row, checks, f'previous checkpoint (call {call}) restored')
  finally:
    run.kill_all()
  return row


def kill_actor_three_times(out: str) -> Row:
  row = Row('kill -9 of one actor, 3 times')
  run_dir = os.path.join(out, 'kill-actor')
  run = Run(SMALL + ['--env-steps', '6000', '--run-dir', run_dir], run_dir)
  recover = []
  try:
    wait_for_checkpoint(run, 1)
    for k in range(3):
      starts = run.actor_starts()
      victim = starts[-1][2]
      t0 = time.time()
      os.kill(victim, signal.SIGKILL)
      if not wait_until(lambda: len(run.actor_starts()) > len(starts)
                        or run.proc.poll() is not None, 120, 0.05):
        break
      if run.proc.poll() is not None:
        break
      recover.append(run.actor_starts()[-1][0] - t0)
      time.sleep(1.0)  # let the replacement produce before the next kill
    rc = run.wait(900)
    checks = {'run finished (exit 0)': rc == 0,
              '3 restarts': len(recover) == 3,
              'no segment left': not segments(run.pid)}
    row.data_lost = '<= 32 per kill'  # the chunk being filled (chunk_steps)
    row.calls_lost = '0'
    row.recover_s = f'{max(recover):.1f}' if recover else '-'
    conclude(row, checks, 'replacement started in ' + ', '.join(
        f'{r:.1f}' for r in recover) + ' s')
  finally:
    run.kill_all()
  return row


def hung_actor(out: str) -> Row:
  row = Row('hung actor (SIGSTOP), --actor-timeout 10')
  run_dir = os.path.join(out, 'hung-actor')
  run = Run(SMALL + ['--env-steps', '4000', '--run-dir', run_dir,
                     '--actor-timeout', '10'], run_dir)
  try:
    wait_for_checkpoint(run, 1)
    starts = run.actor_starts()
    victim = starts[-1][2]
    t0 = time.time()
    os.kill(victim, signal.SIGSTOP)
    detected = wait_until(lambda: len(run.actor_starts()) > len(starts)
                          or run.proc.poll() is not None, 300, 0.1)
    recover = run.actor_starts()[-1][0] - t0 if detected else None
    rc = run.wait(900)
    checks = {'run finished (exit 0)': rc == 0,
              'hang detected and actor restarted':
                  detected and 'hung: no heartbeat' in run.text(),
              'hung process removed': not alive(victim),
              'no segment left': not segments(run.pid)}
    row.data_lost = '<= 32'
    row.calls_lost = '0'
    row.recover_s = f'{recover:.1f}' if recover is not None else '-'
    conclude(row, checks)
  finally:
    run.kill_all()
  return row


def diverging_member(out: str) -> Row:
  row = Row('diverging member (learning rates 1e3) in PBT of 4')
  run_dir = os.path.join(out, 'diverging')
  os.makedirs(out, exist_ok=True)
  log = os.path.join(out, 'diverging.stderr')
  with open(log, 'w') as f:
    proc = subprocess.run(
        [sys.executable, '-m', 'benchmarks.faults', '--child-diverge', run_dir],
        cwd=REPO, stdout=subprocess.PIPE, stderr=f, text=True, timeout=900)
  result = proc.stdout.strip().splitlines()[-1] if proc.stdout else ''
  m = re.match(r'DIVERGED (\d+) FINAL (.*)$', result)
  checks = {'run finished (exit 0)': proc.returncode == 0,
            'divergence detected and replaced': bool(m) and int(m[1]) >= 1,
            'every member ends finite': bool(m) and 'nan' not in m[2]}
  row.data_lost = '0'
  row.calls_lost = '0 (the diverged call is discarded)'
  row.recover_s = '0 (same call)'
  return conclude(row, checks, f'{m[1]} replacement(s); final returns {m[2]}'
                  if m else '')


def child_diverge(run_dir: str) -> None:
  from fastpbrl.logs.logging import setup_logging  # noqa: PLC0415
  from fastpbrl.rules.pbt import PBT, PBTRunConfig  # noqa: PLC0415
  from fastpbrl.run.main import run  # noqa: PLC0415

  class OneBadMember(PBT):
    def initial_hparams(self, key, agent, population_size):
      hp = super().initial_hparams(key, agent, population_size)
      return hp._replace(critic_lr=hp.critic_lr.at[2].set(1e3),
                         policy_lr=hp.policy_lr.at[2].set(1e3))

  setup_logging()
  config = PBTRunConfig(
      env='HalfCheetah-v5', population_size=4, env_steps=3000,
      warmup_steps=500, hidden_sizes=(64, 64), batch_size=64,
      steps_per_call=10, eval_every=500, eval_episodes=1, num_actors=1,
      ready_after=1000, progress=False, run_dir=run_dir,
      replay_capacity=100_000)
  result = run(config, OneBadMember(config))
  print(f'DIVERGED {result.diverged} FINAL '
        + ' '.join(f'{x:.0f}' for x in result.final_returns))


def full_disk(out: str) -> Row:
  row = Row('full disk for the run folder')
  if os.geteuid() != 0:
    row.note = 'not tested: mounting a small tmpfs needs root'
    return row
  mount = os.path.join(out, 'small-disk')
  os.makedirs(mount, exist_ok=True)
  subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', mount],
                 check=True)
  try:
    run_dir = os.path.join(mount, 'run')
    run = Run(SMALL + ['--env-steps', '1000000', '--run-dir', run_dir,
                       '--checkpoint-every', str(100 * STEPS_PER_CALL)], run_dir, log_dir=out)
    try:
      wait_for_checkpoint(run, 1)
      filler = os.path.join(mount, 'filler')
      # Every free byte (unbuffered, so closing has nothing left to
      # write): the run's next write fails.
      with open(filler, 'wb', buffering=0) as f:
        for size in (1 << 20, 1 << 12, 1):
          try:
            while True:
              f.write(b'\0' * size)
          except OSError:
            pass
      t0 = time.monotonic()
      rc = run.wait(600)
      stopped_s = time.monotonic() - t0
      line = run.last_line()
      before = csv_progress(run_dir)
      os.unlink(filler)
      _, call, env, first_new = resume(run_dir, log_dir=out)
      checks = {'exit status 1': rc == 1,
                'one line naming the cause and the intact checkpoint':
                    line.startswith('error:') and 'No space left' in line
                    and 'resume with:' in line,
                'no segment left': not segments(run.pid),
                'resumed from the previous checkpoint': call >= 0}
      # The logs could not be written either: count from the save that
      # failed (everything after the intact checkpoint is redone).
      failed = re.search(r'writing checkpoint (\d+) ', line)
      if failed:
        calls = int(failed[1]) - call
        row.calls_lost = str(calls)
        row.data_lost = f'{calls * STEPS_PER_CALL} (the steps those calls used)'
      else:
        row.data_lost, row.calls_lost = lost(before, call, env)
      row.recover_s = f'{stopped_s:.1f} + {first_new:.1f} after freeing space'
      conclude(row, checks, line[:120])
    finally:
      run.kill_all()
  finally:
    subprocess.run(['umount', '-l', mount], check=False)
  return row


SCENARIOS = {
    'sigint': lambda out: signal_scenario(out, signal.SIGINT, group=True),
    'sigterm': lambda out: signal_scenario(out, signal.SIGTERM, group=False),
    'kill-during-save': kill_learner_during_save,
    'kill-actor': kill_actor_three_times,
    'hung-actor': hung_actor,
    'diverging': diverging_member,
    'full-disk': full_disk,
}


def table(rows: list[Row]) -> str:
  header = ('fault', 'survived', 'data lost (env steps/member)',
            'calls lost', 'recover s', 'note')
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '---|' * len(header)]
  for r in rows:
    lines.append('| ' + ' | '.join([r.fault, 'yes' if r.survived else 'NO',
                                    r.data_lost, r.calls_lost, r.recover_s,
                                    r.note]) + ' |')
  return '\n'.join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--only', nargs='*', choices=list(SCENARIOS),
                      help='scenarios to run (default: all)')
  parser.add_argument('--out', default=None,
                      help='folder for the runs (default: a temporary one)')
  parser.add_argument('--child-diverge', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child_diverge:
    child_diverge(args.child_diverge)
    return 0
  out = args.out or tempfile.mkdtemp(prefix='fastpbrl-faults-')
  rows = []
  for name in args.only or list(SCENARIOS):
    start = time.monotonic()
    try:
      row = SCENARIOS[name](os.path.join(out, name))
    except Exception as e:  # a scenario that breaks is a row that failed
      row = Row(name, note=f'{type(e).__name__}: {str(e)[:200]}')
    print(f'{name}: {"survived" if row.survived else "FAILED"} '
          f'({time.monotonic() - start:.0f} s) {row.note}', flush=True)
    rows.append(row)
  print()
  print(table(rows))
  if not args.out:
    shutil.rmtree(out, ignore_errors=True)
  return 0 if all(r.survived for r in rows) else 1


if __name__ == '__main__':
  sys.exit(main())
