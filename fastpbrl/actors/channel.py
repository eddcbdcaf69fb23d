"""A bounded single-producer, single-consumer queue of transition chunks.

Host-side module (shared memory, a pipe and numpy; nothing here is
jittable).

One channel connects one actor process (producer) to one reader thread in the
learner process (consumer). It is a ring of ``num_slots`` fixed-size slots in
a shared-memory segment; each slot holds one *chunk*: ``chunk_steps`` steps of
every member the actor hosts (``[M, T, ...]`` per transition field), the
episodes that ended during those steps, and the members' env-step counters.

Why not ``multiprocessing.Queue``: a queue's messages are pickled and written
to a pipe under a lock held by a feeder thread, so an actor killed mid-write
leaves the pipe with a partial message (the reader then blocks forever) or the
lock held (other writers block forever). Here the producer fills a slot in
place and then advances the write index with one 8-byte store, so a producer
that dies at any instant leaves only whole chunks behind; the ring is bounded
by construction, and a full ring blocks the producer (backpressure) until the
consumer frees a slot or a stop is requested. No pickling either.

The segment also carries a small control block: a stop flag the consumer side
raises, the producer's heartbeat and blocked time, and an error area where a
failing producer leaves its traceback before exiting.

Wake-ups: after each commit the producer writes an empty message to a pipe
the consumer waits on (``poll`` with a timeout, no GIL held). The indices in
shared memory stay the truth; a lost or stale wake-up only costs a timeout.
A pipe rather than a semaphore, because an unnamed pipe leaves nothing behind
in ``/dev/shm`` whatever happens to either process.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Mapping, NamedTuple

import numpy as np

from fastpbrl.actors import shm

# Header words (int64 unless noted).
_WRITE = 0  # chunks committed
_READ = 1  # chunks consumed
_STOP = 2  # 1 once the consumer side asks the producer to stop
_ERROR_LEN = 3  # bytes of error text
_PID = 4  # producer pid
_HEARTBEAT = 8  # float64: time.monotonic() of the producer's last sign of life
_BLOCKED_S = 9  # float64: seconds the producer waited on a full ring
_STARTED = 10  # 1 once the producer attached and is about to run
_HEADER_BYTES = 128
_ERROR_BYTES = 16384
# Slots start on a page boundary.
_SLOTS_OFFSET = -(-(_HEADER_BYTES + _ERROR_BYTES) // 4096) * 4096


def chunk_layout(transition_fields: Mapping[str, shm.FieldSpec],
                 num_members: int, chunk_steps: int,
                 eval_episodes: int = 1) -> shm.StructLayout:
  """The layout of one slot.

  Args:
    transition_fields: per-transition ``name -> (shape, dtype)``, e.g.
      ``fastpbrl.replay.transition_fields(env_spec)``.
    num_members: members hosted by the producer (``M``).
    chunk_steps: env steps per member in one chunk (``T``).
    eval_episodes: evaluation envs per member (``K``, see ``Actor``).

  Returns:
    A layout with every transition field as ``[M, T, *shape]``, ``env_steps``
    ``[M]`` (each member's training env steps after the chunk), ``meta``
    ``[4]`` (steps in the chunk, episodes recorded, policy version, unused),
    ``restart_count`` and ``restart_at`` ``[M]`` (the restart of each member
    its data belongs to, from step ``restart_at`` of the chunk on: see
    ``Pipeline.restart_members``) and per-episode arrays ``episode_*`` of
    room ``(1 + K) * M * T`` (a member ends at most one training episode
    and one episode of each evaluation env per step).
  """
  if num_members < 1:
    raise ValueError(f'num_members must be >= 1, got {num_members}')
  if chunk_steps < 1:
    raise ValueError(f'chunk_steps must be >= 1, got {chunk_steps}')
  if eval_episodes < 1:
    raise ValueError(f'eval_episodes must be >= 1, got {eval_episodes}')
  m, t = num_members, chunk_steps
  fields = {k: ((m, t, *shape), dtype)
            for k, (shape, dtype) in transition_fields.items()}
  e = (1 + eval_episodes) * m * t
  fields.update({
      'env_steps': ((m,), np.int64),
      'meta': ((4,), np.int64),
      'restart_count': ((m,), np.int64),
      'restart_at': ((m,), np.int64),
      'episode_member': ((e,), np.int64),
      'episode_return': ((e,), np.float64),
      'episode_length': ((e,), np.int64),
      'episode_evaluation': ((e,), np.int64),
      'episode_env_steps': ((e,), np.int64),
      'episode_policy_version': ((e,), np.int64),
      'episode_start_version': ((e,), np.int64),
      'episode_objective': ((e,), np.float64),
  })
  return shm.StructLayout(fields)


class ChannelHandle(NamedTuple):
  """What the producer process needs to attach: picklable at spawn time."""

  name: str
  layout: shm.StructLayout
  num_slots: int
  wakeup: object  # write end of a multiprocessing pipe, one message a commit


class Channel:
  """One end of a transition channel (see the module docstring).

  The consumer side creates it (:meth:`create`, owning the segment); the
  producer attaches from its handle (:meth:`attach`).
  """

  def __init__(self, handle: ChannelHandle, segment, owner: bool,
               wakeup_reader=None):
    self.handle = handle
    self.layout = handle.layout
    self.num_slots = handle.num_slots
    self._segment = segment
    self._owner = owner
    self._owner_pid = os.getpid()
    self._wake_w = handle.wakeup
    self._wake_r = wakeup_reader
    self._producer_gone = False
    buf = segment.buf
    self._header = np.ndarray((_HEADER_BYTES // 8,), np.int64, buffer=buf)
    self._fheader = np.ndarray((_HEADER_BYTES // 8,), np.float64, buffer=buf)
    self._error = np.ndarray((_ERROR_BYTES,), np.uint8, buffer=buf,
                             offset=_HEADER_BYTES)
    base = _SLOTS_OFFSET
    self._slots = [self.layout.views(buf, base + i * self.layout.nbytes)
                   for i in range(self.num_slots)]

  @staticmethod
  def nbytes_for(layout: shm.StructLayout, num_slots: int) -> int:
    return _SLOTS_OFFSET + num_slots * layout.nbytes

  @classmethod
  def create(cls, layout: shm.StructLayout, num_slots: int,
             mp_context) -> 'Channel':
    """Allocates a channel of ``num_slots`` chunks (consumer side)."""
    if num_slots < 1:
      raise ValueError(f'num_slots must be >= 1, got {num_slots}')
    segment = shm.create_segment(cls.nbytes_for(layout, num_slots), 'chunks')
    try:
      reader, writer = mp_context.Pipe(duplex=False)
      handle = ChannelHandle(segment.name, layout, num_slots, writer)
      return cls(handle, segment, owner=True, wakeup_reader=reader)
    except BaseException:
      shm.release_segment(segment, unlink=True)
      raise

  @classmethod
  def attach(cls, handle: ChannelHandle) -> 'Channel':
    """Maps a channel created by the consumer (producer side)."""
    return cls(handle, shm.attach_segment(handle.name), owner=False)

  # ------------------------------------------------------------ both sides

  def pending(self) -> int:
    """Chunks committed and not yet consumed."""
    return int(self._header[_WRITE]) - int(self._header[_READ])

  @property
  def committed(self) -> int:
    return int(self._header[_WRITE])

  @property
  def stop_requested(self) -> bool:
    return bool(self._header[_STOP])

  @property
  def heartbeat(self) -> float:
    """``time.monotonic()`` of the producer's last heartbeat (0: none)."""
    return float(self._fheader[_HEARTBEAT])

  @property
  def blocked_s(self) -> float:
    """Seconds the producer spent waiting on a full ring (backpressure)."""
    return float(self._fheader[_BLOCKED_S])

  @property
  def started(self) -> bool:
    return bool(self._header[_STARTED])

  @property
  def producer_pid(self) -> int:
    return int(self._header[_PID])

  # --------------------------------------------------------- producer side

  def mark_started(self) -> None:
    self._header[_PID] = os.getpid()
    self.beat()
    self._header[_STARTED] = 1

  def beat(self) -> None:
    self._fheader[_HEARTBEAT] = time.monotonic()

  def acquire_slot(self, should_stop: Callable[[], bool] | None = None,
                   poll_s: float = 0.002) -> dict[str, np.ndarray] | None:
    """The next free slot's views, blocking while the ring is full.

    Returns ``None`` (without a slot) once a stop is requested or
    ``should_stop()`` returns true; both are checked every ``poll_s``.
    """
    header = self._header
    start = None
    while int(header[_WRITE]) - int(header[_READ]) >= self.num_slots:
      if header[_STOP] or (should_stop is not None and should_stop()):
        return None
      if start is None:
        start = time.monotonic()
      time.sleep(poll_s)
      self.beat()
    if start is not None:
      self._fheader[_BLOCKED_S] += time.monotonic() - start
    if header[_STOP]:
      return None
    return self._slots[int(header[_WRITE]) % self.num_slots]

  def commit(self) -> None:
    """Publishes the slot returned by :meth:`acquire_slot`."""
    self._header[_WRITE] += 1  # one aligned store: the chunk is whole
    self.beat()
    try:
      self._wake_w.send_bytes(b'')  # one 4-byte write: atomic on a pipe
    except (BrokenPipeError, OSError):
      pass  # the consumer is gone; the stop checks end the producer

  def set_error(self, text: str) -> None:
    """Leaves ``text`` (truncated to fit, keeping its end) for the consumer."""
    data = text.encode('utf-8', 'replace')
    if len(data) > _ERROR_BYTES:
      data = b'...' + data[-(_ERROR_BYTES - 3):]
    self._error[:len(data)] = np.frombuffer(data, np.uint8)
    self._header[_ERROR_LEN] = len(data)

  # --------------------------------------------------------- consumer side

  def _drain_wakeups(self) -> None:
    try:
      while self._wake_r.poll(0):
        self._wake_r.recv_bytes()
    except EOFError:  # every write end is closed: the producer exited
      self._producer_gone = True

  def wait(self, timeout: float) -> bool:
    """Blocks until a chunk is pending or ``timeout`` passes."""
    # Drop wake-ups of chunks already visible (this also keeps the pipe far
    # from full: at most ``num_slots`` commits happen between two waits),
    # then re-check before blocking, so no wake-up is lost.
    if not self._producer_gone:
      self._drain_wakeups()
    if self.pending() > 0:
      return True
    if self._producer_gone:
      time.sleep(timeout)  # nothing will wake us; chunks left are visible
    elif self._wake_r.poll(timeout):
      self._drain_wakeups()
    return self.pending() > 0

  def peek(self) -> dict[str, np.ndarray] | None:
    """Views of the oldest pending chunk (valid until :meth:`release`)."""
    header = self._header
    read = int(header[_READ])
    if read >= int(header[_WRITE]):
      return None
    return self._slots[read % self.num_slots]

  def release(self) -> None:
    """Frees the slot returned by :meth:`peek`."""
    self._header[_READ] += 1

  def request_stop(self) -> None:
    if self._header is not None:
      self._header[_STOP] = 1

  def error_text(self) -> str:
    n = int(self._header[_ERROR_LEN])
    return bytes(self._error[:n]).decode('utf-8', 'replace') if n else ''

  def release_producer_end(self) -> None:
    """Consumer side: closes its copy of the pipe's write end once the
    producer process has been spawned with it."""
    if self._owner and self._wake_w is not None:
      self._wake_w.close()

  def close(self) -> None:
    """Unmaps the segment (the creating process also unlinks it) and closes
    the wake-up pipe ends this process holds."""
    for end in (self._wake_r, self._wake_w):
      if end is not None and not end.closed:
        end.close()
    self._slots = []
    self._header = self._fheader = self._error = None
    segment, self._segment = self._segment, None
    shm.release_segment(
        segment, unlink=self._owner and os.getpid() == self._owner_pid)
