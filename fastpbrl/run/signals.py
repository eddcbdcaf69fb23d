"""SIGINT and SIGTERM during a run: finish the call, checkpoint, exit.

Host-side module (Python signal handlers; nothing here is jittable).

Preemptible queues (SLURM, Kubernetes) send SIGTERM some seconds before a
kill, and a user presses Ctrl-C (SIGINT). Inside :func:`fastpbrl.run.main.run`
both only *ask* the loop to stop: it finishes the learner call under way,
writes a checkpoint, stops every process, releases every shared-memory
segment and raises :class:`RunInterrupted`, which the command line turns
into one line (where the checkpoint is, the command that resumes it) and
the conventional exit status ``128 + signal`` (130 for SIGINT, 143 for
SIGTERM).

A second signal while that is under way raises :class:`ForcedExit` at once
(whatever the main thread is doing, e.g. writing the checkpoint): the run
still closes its pipeline (no process or segment is left behind), and a
checkpoint being written is never half-visible (orbax writes to a temporary
directory and renames it when complete), so the previous one stays usable.
Signals during that clean-up are only logged.

Handlers can only be installed from the main thread; a run started from
another thread keeps Python's defaults.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Optional

log = logging.getLogger('fastpbrl')

HANDLED = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
  """A run stopped by a signal after writing its checkpoint.

  Attributes:
    signum: the signal (``signal.SIGINT`` or ``signal.SIGTERM``).
    run_dir: the run directory (its ``checkpoints/`` holds the checkpoint).
    calls: learner calls the checkpoint holds.
    resume_command: the command line that continues the run.
  """

  def __init__(self, signum: int, run_dir: str, calls: int, env_steps: int,
               resume_command: str):
    self.signum, self.run_dir, self.calls = signum, run_dir, calls
    self.resume_command = resume_command
    self.exit_status = 128 + int(signum)
    super().__init__(
        f'{signal.Signals(signum).name}: stopped after learner call {calls} '
        f'({env_steps} env steps per member); checkpoint in {run_dir}/'
        f'checkpoints; resume with: {resume_command}')


class ForcedExit(BaseException):
  """A second signal: the run stops without finishing its checkpoint.

  A ``BaseException`` (as ``KeyboardInterrupt``), so that no
  ``except Exception`` on the way swallows it.
  """

  def __init__(self, signum: int, detail: str = ''):
    self.signum = signum
    self.exit_status = 128 + int(signum)
    super().__init__(f'{signal.Signals(signum).name} again: stopped at once '
                     'without a new checkpoint' + (f'; {detail}' if detail
                                                   else ''))


class StopRequest:
  """Context manager: while active, SIGINT/SIGTERM request a stop.

  ``requested`` is polled by the run loop; ``disarm()`` (called when the
  run starts closing down) makes further signals only logged.
  """

  def __init__(self):
    self.signum: Optional[int] = None
    self._armed = True
    self._forced = False
    self._previous = {}

  @property
  def requested(self) -> bool:
    return self.signum is not None

  def __call__(self) -> bool:  # as a ``should_stop`` callable
    return self.signum is not None

  def disarm(self) -> None:
    self._armed = False

  def _handle(self, signum, frame) -> None:
    del frame
    name = signal.Signals(signum).name
    if self.signum is None:
      self.signum = signum
      log.warning('%s received: finishing the current learner call, then '
                  'writing a checkpoint (send it again to stop at once)', name)
      return
    if self._armed and not self._forced:
      self._forced = True
      raise ForcedExit(signum)
    log.warning('%s received again: already stopping', name)

  def __enter__(self) -> 'StopRequest':
    if threading.current_thread() is threading.main_thread():
      for s in HANDLED:
        self._previous[s] = signal.signal(s, self._handle)
    return self

  def __exit__(self, *exc) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
