"""Start a multi-process run on this machine (host-side; no jax here).

``python -m fastpbrl.launch --num-processes 2 -- fastpbrl pbt FLAGS`` (or
any command: ``python my_run.py ARGS``, whose script calls
``fastpbrl.devices.distributed.initialize_from_env()`` first) starts the command ``--num-processes`` times, each with the variables
``fastpbrl.devices.distributed.initialize_from_env`` reads:
``FASTPBRL_COORDINATOR=localhost:<free port>``,
``FASTPBRL_NUM_PROCESSES=N`` and ``FASTPBRL_PROCESS_ID=0..N-1``.
SIGINT and SIGTERM are forwarded to every child (still running ``--grace``
seconds later, they get SIGTERM, then SIGKILL). If a child exits with a
non-zero status the others (likely blocked in a collective waiting for it)
get ``--grace`` seconds to finish, then SIGTERM, then SIGKILL; the launcher
exits with the first failure's status (128 + signal for a child killed by
a signal), 0 when every child succeeded.

Per-process device counts are the children's business: on CPU, a
child run on the device path takes its share of the machine's cores, one
host device per core (``fastpbrl.devices.cores``); ``FASTPBRL_CPU_DEVICES=N``
or ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` in the
launcher's environment gives every process ``N`` devices; on a multi-GPU
machine give each child its GPU with ``JAX_LOCAL_DEVICE_IDS`` (not set
here).

Under SLURM (several machines) this launcher is not used: ``srun`` starts
the tasks and ``initialize_from_env`` reads SLURM's variables
(``SLURM_NTASKS``, ``SLURM_PROCID``; coordinator: ``FASTPBRL_COORDINATOR``
if set, else the first host of the step's node list, port from the job
id or ``JAX_COORDINATOR_PORT``)::

    # one task per GPU (jax gives task i the GPU SLURM_LOCALID)
    srun --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 \\
        --kill-on-bad-exit=1 fastpbrl pbt --population-size 80

    # one task per node, owning every GPU of its node
    srun --nodes=2 --ntasks-per-node=1 --gpus-per-node=4 \\
        env JAX_LOCAL_DEVICE_IDS=0,1,2,3 python my_run.py

    # CPU nodes (gloo collectives), coordinator set by hand
    export FASTPBRL_COORDINATOR=$(scontrol show hostnames \\
        "$SLURM_JOB_NODELIST" | head -n1):12345
    srun --nodes=2 --ntasks-per-node=1 python my_run.py
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence

POLL_S = 0.1


def free_port(host: str = 'localhost') -> int:
  """A TCP port free on ``host`` now (the OS's choice; another program
  could still take it before the coordinator binds it)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind((host, 0))
    return s.getsockname()[1]


def child_env(process_id: int, num_processes: int, coordinator: str,
              base: Optional[dict] = None) -> dict:
  """``base`` (default ``os.environ``) with the three variables set."""
  env = dict(os.environ if base is None else base)
  env.update(FASTPBRL_COORDINATOR=coordinator,
             FASTPBRL_NUM_PROCESSES=str(num_processes),
             FASTPBRL_PROCESS_ID=str(process_id))
  return env


def exit_status(returncode: int) -> int:
  """A child's status as a shell reports it: 128 + signal if killed."""
  return 128 - returncode if returncode < 0 else returncode


def launch(command: Sequence[str], num_processes: int, *,
           grace_s: float = 10.0, timeout_s: Optional[float] = None,
           port: Optional[int] = None) -> int:
  """Runs ``command`` as ``num_processes`` processes and waits for them.

  Args:
    command: the program and its arguments, the same for every process.
    num_processes: how many processes (>= 1).
    grace_s: after the first failure, how long the others may still run
      before SIGTERM (and again before SIGKILL).
    timeout_s: if given, the whole run is stopped (SIGTERM, then SIGKILL)
      after this many seconds, and the status is 124.
    port: the coordinator's port on localhost (default: a free one).

  Returns:
    0 if every process succeeded, else the first failure's status.
  """
  if num_processes < 1:
    raise ValueError(f'--num-processes must be >= 1, got {num_processes}')
  if not command:
    raise ValueError('no command given: python -m fastpbrl.launch '
                     '--num-processes N -- COMMAND ...')
  coordinator = f'localhost:{port or free_port()}'
  children = []
  forwarded = []

  def forward(signum, _frame):
    forwarded.append(signum)
    for child in children:
      if child.poll() is None:
        child.send_signal(signum)

  previous = {s: signal.signal(s, forward)
              for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    for i in range(num_processes):
      # A session of its own: a Ctrl-C on the terminal reaches the
      # children once, through ``forward``.
      children.append(subprocess.Popen(
          list(command), env=child_env(i, num_processes, coordinator),
          start_new_session=True))
    return _wait(children, grace_s, timeout_s, forwarded)
  finally:
    for child in children:  # never leave one behind
      if child.poll() is None:
        child.kill()
        child.wait()
    for s, handler in previous.items():
      signal.signal(s, handler)


def _wait(children, grace_s: float, timeout_s: Optional[float],
          forwarded: list) -> int:
  start = time.monotonic()
  first_failure = None
  stop_at = None if timeout_s is None else start + timeout_s
  terminated = False
  while True:
    codes = [c.poll() for c in children]
    if first_failure is None:
      failed = [code for code in codes if code not in (None, 0)]
      if failed:
        first_failure = exit_status(failed[0])
        print(f'fastpbrl.launch: a process exited with status '
              f'{first_failure}; stopping the others in {grace_s:g} s',
              file=sys.stderr, flush=True)
        stop_at = min(stop_at or float('inf'), time.monotonic() + grace_s)
    if all(code is not None for code in codes):
      return first_failure or 0
    now = time.monotonic()
    if forwarded and not terminated and (stop_at is None
                                         or stop_at > now + grace_s):
      # A forwarded signal the children do not act on: stop them anyway.
      stop_at = now + grace_s
    if stop_at is not None and now >= stop_at:
      if first_failure is None and forwarded:
        first_failure = 128 + forwarded[0]
      elif first_failure is None:
        first_failure = 124
        print(f'fastpbrl.launch: timed out after {timeout_s:g} s',
              file=sys.stderr, flush=True)
      if not terminated:
        for c in children:
          if c.poll() is None:
            c.terminate()
        terminated, stop_at = True, now + grace_s
      else:
        for c in children:
          if c.poll() is None:
            c.kill()
        for c in children:
          c.wait()
        return first_failure
    time.sleep(POLL_S)


def main(argv: Optional[Sequence[str]] = None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  if '--' in argv:
    cut = argv.index('--')
    argv, command = argv[:cut], argv[cut + 1:]
  else:
    command = []
  args = parser().parse_args(argv)
  try:
    return launch(command, args.num_processes, grace_s=args.grace,
                  timeout_s=args.timeout, port=args.port)
  except ValueError as e:
    parser().error(str(e))


def parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m fastpbrl.launch',
      description='Run COMMAND as N jax processes on this machine.',
      epilog='usage: python -m fastpbrl.launch --num-processes 2 -- '
             'python my_run.py ...')
  parser.add_argument('--num-processes', type=int, required=True,
                      help='processes to start')
  parser.add_argument('--grace', type=float, default=10.0,
                      help='seconds the others may run after a failure')
  parser.add_argument('--timeout', type=float, default=None,
                      help='stop everything after this many seconds (124)')
  parser.add_argument('--port', type=int, default=None,
                      help='coordinator port on localhost (default: free)')
  return parser


if __name__ == '__main__':
  sys.exit(main())
