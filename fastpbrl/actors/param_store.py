"""Versioned policy parameters in shared memory: one writer, many readers.

Host-side module (shared memory and numpy; nothing here is jittable).

The learner process writes, after each learner call, a pytree whose leaves all
have the population as leading axis (the members' policy parameters and the
hyperparameters actors need, e.g. exploration noise). Actor processes read the
rows of the members they host and never see a half-written set.

Protocol: a seqlock over two slots (double buffer). Version ``v`` is written
into slot ``v % 2``:

1. the writer makes that slot's sequence counter odd,
2. copies the leaves into the slot and stores ``v`` as the slot's version,
3. makes the counter even again, then publishes ``v`` as the latest version.

Step 3's first half runs also when the copy raises (``finally``), and the
latest version is only published after a whole copy: an exception mid-write
leaves readers on the previous version instead of breaking the protocol.

A reader takes the latest version, reads the counter of its slot, copies the
rows and reads the counter again; the copy is consistent iff both counter
reads are equal and even. Since the writer always writes the slot *not*
holding the latest version, a reader only retries when the writer completes
two versions during one read. Readers take no lock, so a reader that dies
mid-read (an actor killed by a signal) can never block the writer.

See ``fastpbrl.actors.shm`` for the memory-ordering assumptions.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple, Sequence

import jax
import numpy as np

from fastpbrl.actors import shm

# Header words (int64).
_VERSION = 0
_SEQ = 1  # _SEQ + slot
_SLOT_VERSION = 3  # _SLOT_VERSION + slot
_WRITES = 5
_HEADER_WORDS = 8
_HEADER_BYTES = 64


class ParamStoreHandle(NamedTuple):
  """What another process needs to attach: picklable."""

  name: str  # shared-memory segment name
  treedef: Any  # jax PyTreeDef of the stored tree
  shapes: tuple  # per-member shape of each leaf, in tree order
  dtypes: tuple  # dtype string of each leaf
  num_members: int


class ParamStore:
  """A seqlock-protected, double-buffered pytree of ``[N, ...]`` arrays.

  Create it in the writer process with :meth:`create` (it then owns and
  unlinks the segment), pass :attr:`handle` to other processes and
  :meth:`attach` there.
  """

  def __init__(self, handle: ParamStoreHandle, segment, owner: bool):
    self.handle = handle
    self.num_members = handle.num_members
    self._segment = segment
    self._owner = owner
    self._owner_pid = os.getpid()
    # Member-major rows: each member's leaves are one contiguous byte row, so
    # reading a block of hosted members is a single copy per slot.
    self._row = shm.StructLayout(
        {str(i): (shape, dtype)
         for i, (shape, dtype) in enumerate(zip(handle.shapes, handle.dtypes))},
        alignment=8)
    self._row_bytes = self._row.nbytes
    slot_bytes = self._row_bytes * self.num_members
    buf = segment.buf
    self._header = np.ndarray((_HEADER_WORDS,), np.int64, buffer=buf)
    self._slots = [
        np.ndarray((self.num_members, self._row_bytes), np.uint8, buffer=buf,
                   offset=_HEADER_BYTES + s * slot_bytes) for s in range(2)]
    # Per-slot, per-leaf strided views [N, *shape] for the writer.
    self._leaf_views = []
    for s in range(2):
      views = []
      for i, (shape, dtype) in enumerate(zip(handle.shapes, handle.dtypes)):
        dtype = np.dtype(dtype)
        inner = np.empty(shape, dtype).strides if shape else ()
        views.append(np.ndarray(
            (self.num_members, *shape), dtype, buffer=buf,
            offset=_HEADER_BYTES + s * slot_bytes + self._row.offsets[str(i)],
            strides=(self._row_bytes, *inner)))
      self._leaf_views.append(views)

  @staticmethod
  def nbytes_for(shapes: Sequence[tuple], dtypes: Sequence[Any],
                 num_members: int) -> int:
    """Segment size for leaves of these per-member shapes and dtypes."""
    row = shm.StructLayout({str(i): (shape, dtype) for i, (shape, dtype)
                            in enumerate(zip(shapes, dtypes))}, alignment=8)
    return _HEADER_BYTES + 2 * num_members * row.nbytes

  @classmethod
  def create(cls, example: Any) -> 'ParamStore':
    """Allocates a store shaped like ``example`` (nothing is published yet).

    Args:
      example: a pytree whose leaves are numeric arrays with the population as
        leading axis (numpy or jax arrays, or ``jax.ShapeDtypeStruct``: only
        shapes and dtypes are used).

    Raises:
      ValueError: if the tree is empty, a leaf has no leading axis, the
        leading axes differ, or a leaf is not a plain numeric array.
    """
    leaves, treedef = jax.tree.flatten(example)
    if not leaves:
      raise ValueError('example must have at least one array leaf')
    shapes, dtypes, sizes = [], [], set()
    for x in leaves:
      if not hasattr(x, 'shape'):
        x = np.asarray(x)
      try:
        dtype = np.dtype(x.dtype)
      except TypeError:
        dtype = np.dtype('O')  # e.g. typed PRNG keys
      if dtype.kind not in 'biuf':
        raise ValueError(
            f'param store leaves must be bool, integer or float arrays; got '
            f'dtype {x.dtype}')
      shape = tuple(x.shape)
      if not shape:
        raise ValueError('every leaf needs a leading population axis; got a '
                         'scalar leaf')
      sizes.add(shape[0])
      shapes.append(shape[1:])
      dtypes.append(dtype.str)
    if len(sizes) != 1:
      raise ValueError(f'leaves have different leading (population) sizes '
                       f'{sorted(sizes)}')
    n = sizes.pop()
    if n < 1:
      raise ValueError(f'population size must be >= 1, got {n}')
    segment = shm.create_segment(cls.nbytes_for(shapes, dtypes, n), 'params')
    try:
      handle = ParamStoreHandle(segment.name, treedef, tuple(shapes),
                                tuple(dtypes), n)
      return cls(handle, segment, owner=True)
    except BaseException:
      shm.release_segment(segment, unlink=True)
      raise

  @classmethod
  def attach(cls, handle: ParamStoreHandle) -> 'ParamStore':
    """Maps a store created by another process (read side)."""
    return cls(handle, shm.attach_segment(handle.name), owner=False)

  @property
  def version(self) -> int:
    """Latest published version; 0 before the first :meth:`write`."""
    return int(self._header[_VERSION])

  @property
  def writes(self) -> int:
    return int(self._header[_WRITES])

  def write(self, tree: Any) -> int:
    """Publishes a new version (single writer only). Returns its number.

    Args:
      tree: same structure, per-member shapes and population size as the
        store's example; values are cast to the stored dtypes.
    """
    leaves, treedef = jax.tree.flatten(tree)
    if treedef != self.handle.treedef:
      raise ValueError(f'tree structure {treedef} differs from the store\'s '
                       f'{self.handle.treedef}')
    arrays = [np.asarray(x) for x in leaves]
    for i, (x, shape) in enumerate(zip(arrays, self.handle.shapes)):
      if x.shape != (self.num_members, *shape):
        raise ValueError(f'leaf {i} has shape {x.shape}, expected '
                         f'{(self.num_members, *shape)}')
    header = self._header
    version = int(header[_VERSION]) + 1
    slot = version & 1
    header[_SEQ + slot] += 1  # odd: slot being written
    try:
      for view, x in zip(self._leaf_views[slot], arrays):
        np.copyto(view, x, casting='unsafe')
      header[_SLOT_VERSION + slot] = version
    finally:
      # Even again also after an exception mid-copy (a signal, a bad cast):
      # readers keep reading the latest version, in the other slot, and
      # the next write rewrites this slot whole under the same number.
      header[_SEQ + slot] += 1
    header[_VERSION] = version
    header[_WRITES] += 1
    return version

  def read(self, members: slice | Sequence[int] | np.ndarray | None = None,
           timeout: float = 5.0) -> tuple[int, Any] | None:
    """Copies the newest consistent version for some members.

    Args:
      members: a slice or index array over the population (all by default).
      timeout: seconds to keep retrying while the writer races ahead.

    Returns:
      ``(version, tree)`` with leaves ``[len(members), ...]`` numpy arrays
      owned by the caller, or ``None`` if nothing was published yet.

    Raises:
      TimeoutError: if no consistent copy could be made within ``timeout``
        (a writer publishing faster than one copy takes, continuously).
    """
    rows = slice(None) if members is None else members
    if not isinstance(rows, slice):
      rows = np.asarray(rows, np.int64)
    header = self._header
    deadline = None
    while True:
      version = int(header[_VERSION])
      if version == 0:
        return None
      slot = version & 1
      before = int(header[_SEQ + slot])
      if not before & 1:
        raw = self._slots[slot][rows].copy()
        slot_version = int(header[_SLOT_VERSION + slot])
        if int(header[_SEQ + slot]) == before:
          return slot_version, self._unpack(raw)
      now = time.monotonic()
      if deadline is None:
        deadline = now + timeout
      elif now > deadline:
        raise TimeoutError(
            f'param store {self.handle.name}: no consistent read within '
            f'{timeout} s; the writer published continuously')
      os.sched_yield()

  def _unpack(self, raw: np.ndarray) -> Any:
    leaves = []
    for i, (shape, dtype) in enumerate(zip(self.handle.shapes,
                                           self.handle.dtypes)):
      dtype = np.dtype(dtype)
      off = self._row.offsets[str(i)]
      size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
      leaf = raw[:, off:off + size].view(dtype).reshape(raw.shape[0], *shape)
      leaves.append(leaf)
    return jax.tree.unflatten(self.handle.treedef, leaves)

  def close(self) -> None:
    """Unmaps the segment; the creating process also unlinks it."""
    self._leaf_views = []
    self._slots = []
    self._header = None
    segment, self._segment = self._segment, None
    shm.release_segment(
        segment, unlink=self._owner and os.getpid() == self._owner_pid)

  def __enter__(self) -> 'ParamStore':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
