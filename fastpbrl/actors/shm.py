"""Shared-memory segments and fixed layouts of numpy arrays inside them.

Host-side module: POSIX shared memory (``multiprocessing.shared_memory``) and
numpy views; nothing here is jittable.

Every segment fastpbrl creates is named ``fpbrl_<pid>_<tag>_<random>`` after
the creating process, so a leak is easy to attribute in ``/dev/shm``. The
creator owns a segment and is the only process that unlinks it; other
processes attach by name and only close their mapping.

Memory-ordering note for the lock-free protocols built on these segments
(the param store's seqlock, the transition channel's ring indices): they rely
on the total store order of x86-64, where stores become visible to other cores
in program order and loads are not reordered with other loads, and on glibc's
``memcpy`` fencing the non-temporal stores it uses for large copies. Each
index or sequence counter is one aligned 8-byte word, so it is read and
written atomically. On other CPUs (aarch64: Graviton, Grace) these protocols
are not verified; importing this module there warns once.
"""

from __future__ import annotations

import os
import platform
import secrets
import warnings
from multiprocessing import shared_memory
from typing import Mapping

import numpy as np

SEGMENT_PREFIX = 'fpbrl_'

X86_64 = ('x86_64', 'amd64')
if platform.machine().lower() not in X86_64:
  warnings.warn(
      f'fastpbrl: the shared-memory param store and transition channels rely '
      f'on x86-64 memory ordering; on {platform.machine()} they are not '
      'verified and a reader could see torn parameters or chunks',
      RuntimeWarning, stacklevel=2)

FieldSpec = tuple[tuple[int, ...], np.dtype]


def create_segment(nbytes: int, tag: str) -> shared_memory.SharedMemory:
  """Creates a new zero-filled shared-memory segment of ``nbytes`` bytes."""
  if nbytes < 1:
    raise ValueError(f'nbytes must be >= 1, got {nbytes}')
  name = f'{SEGMENT_PREFIX}{os.getpid()}_{tag}_{secrets.token_hex(4)}'
  return shared_memory.SharedMemory(name=name, create=True, size=int(nbytes))


SHM_DIR = '/dev/shm'  # where POSIX shared memory lives on Linux


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def sweep_stale_segments(directory: str = SHM_DIR) -> list[str]:
  """Unlinks the segments of fastpbrl processes that no longer exist.

  A run killed as a whole process group (``kill -9`` of the learner and of
  Python's resource tracker) leaves its ``fpbrl_<pid>_*`` segments behind
  until reboot. Only segments whose creating ``pid`` is gone are removed:
  those of live runs, and names that do not parse, are left alone. (A pid
  reused by an unrelated process keeps its dead owner's segment until that
  process exits too: never a live run's segment removed.)

  Returns:
    The names removed.
  """
  try:
    names = os.listdir(directory)
  except OSError:  # no /dev/shm (not Linux): nothing to sweep
    return []
  removed = []
  for name in names:
    if not name.startswith(SEGMENT_PREFIX):
      continue
    pid = name[len(SEGMENT_PREFIX):].split('_', 1)[0]
    if not pid.isdigit() or int(pid) == os.getpid() or _pid_alive(int(pid)):
      continue
    try:
      os.unlink(os.path.join(directory, name))
    except FileNotFoundError:  # another run swept it first
      continue
    except OSError:
      continue  # not ours to remove (permissions): leave it
    removed.append(name)
  return removed


def attach_segment(name: str) -> shared_memory.SharedMemory:
  """Maps an existing segment created by another process."""
  return shared_memory.SharedMemory(name=name, create=False)


def release_segment(segment: shared_memory.SharedMemory | None,
                    unlink: bool) -> None:
  """Closes a mapping and, for its owner, unlinks the segment.

  Safe to call twice and on a segment whose numpy views are still alive (the
  mapping then stays until they are garbage collected, but the name is gone
  from ``/dev/shm`` at once).
  """
  if segment is None:
    return
  try:
    segment.close()
  except BufferError:
    # Views into the buffer are still referenced somewhere; the mmap is
    # released when they die. Unlinking below still frees the name.
    pass
  if unlink:
    try:
      segment.unlink()
    except FileNotFoundError:
      pass


def _align(offset: int, alignment: int) -> int:
  return (offset + alignment - 1) // alignment * alignment


class StructLayout:
  """Named numpy arrays packed at aligned offsets in one byte region.

  Attributes:
    fields: ``name -> (shape, dtype)``.
    offsets: ``name -> byte offset`` from the start of the region.
    nbytes: size of the region, a multiple of the alignment.
  """

  def __init__(self, fields: Mapping[str, FieldSpec], alignment: int = 64):
    self.fields = {k: (tuple(int(d) for d in shape), np.dtype(dtype))
                   for k, (shape, dtype) in fields.items()}
    self.offsets = {}
    offset = 0
    for name, (shape, dtype) in self.fields.items():
      offset = _align(offset, alignment)
      self.offsets[name] = offset
      offset += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    self.nbytes = max(_align(offset, alignment), alignment)

  def views(self, buffer, base: int = 0) -> dict[str, np.ndarray]:
    """Numpy views of every field of the region starting at ``base``."""
    return {name: np.ndarray(shape, dtype, buffer=buffer,
                             offset=base + self.offsets[name])
            for name, (shape, dtype) in self.fields.items()}
