"""Replay storage: preallocated numpy rings in two layouts behind one interface.

Host-side module (numpy and a lock; nothing here is jittable).

* :class:`PerMemberReplay`: one ring per member, stored as ``[N, capacity,
  ...]`` arrays. Member ``i``'s batches come only from member ``i``'s
  transitions (PBT, independent seeds).
* :class:`SharedReplay`: one ring fed by every member, ``[capacity, ...]``.
  Every member's batch is drawn from all transitions inserted (CEM-RL, DvD).

Each field of :class:`fastpbrl.core.types.Transition` has its own array. Sampling a
learner call's worth of data, ``[N, num_steps, batch_size, ...]``, draws all
indices at once and gathers each field with one ``np.take`` — no Python loop
over members or steps. Sampling is uniform over the stored transitions.

Storage is allocated with ``np.zeros``: the OS maps the pages as the ring
first fills, so resident memory grows up to :attr:`Replay.nbytes` rather than
being committed at start-up. The size is logged when a buffer is made.

Inserts (from reader threads) and samples (from the prefetch thread) may run
concurrently. A lock makes each insert atomic; a sample draws its rows under
the lock but gathers them outside it (at the paper's scale the gather is
about a million rows, 0.2-0.5 s, during which inserts, and so the actors,
would otherwise wait). Afterwards, under the lock again, the rows that an
insert (or a clear, copy or load) rewrote during the gather are gathered
again, so a batch never holds a half-written transition: every row of a
batch is a whole transition, the one the ring held at the draw or a newer
one written since.
"""

from __future__ import annotations

import abc
import logging
import os
import threading
from typing import Mapping, Sequence

import numpy as np
from acme import specs

from fastpbrl.core.types import Transition

logger = logging.getLogger(__name__)

FieldSpecs = Mapping[str, tuple[tuple[int, ...], np.dtype]]

DEFAULT_CAPACITY = 1_000_000


def transition_fields(env_spec: specs.EnvironmentSpec) -> dict:
  """Per-transition ``name -> (shape, dtype)`` of every ``Transition`` field.

  Observations keep the spec's dtype (float32, or uint8 for frames); actions
  are float32 vectors for continuous control and int32 scalars for discrete
  action spaces; reward, terminated and truncated are float32 scalars.
  """
  obs = env_spec.observations
  actions = env_spec.actions
  if isinstance(actions, specs.DiscreteArray):
    action = ((), np.dtype(np.int32))
  else:
    action = (tuple(actions.shape), np.dtype(np.float32))
  observation = (tuple(obs.shape), np.dtype(obs.dtype))
  scalar = ((), np.dtype(np.float32))
  return {'observation': observation, 'action': action, 'reward': scalar,
          'next_observation': observation, 'terminated': scalar,
          'truncated': scalar}


def bytes_per_transition(fields: FieldSpecs) -> int:
  return int(sum(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
                 for shape, dtype in fields.values()))


def format_bytes(n: float) -> str:
  if n < 1024:
    return f'{int(n)} B'
  for unit in ('KiB', 'MiB', 'GiB', 'TiB'):
    n /= 1024
    if n < 1024 or unit == 'TiB':
      break
  return f'{n:,.1f} {unit}'


def _available_memory() -> int | None:
  try:
    return os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE')
  except (ValueError, OSError, AttributeError):
    return None


def _check_fields(fields: FieldSpecs) -> dict:
  expected = set(Transition._fields)
  if set(fields) != expected:
    raise ValueError(f'fields must be exactly {sorted(expected)}; got '
                     f'{sorted(fields)}')
  return {k: (tuple(int(d) for d in fields[k][0]), np.dtype(fields[k][1]))
          for k in Transition._fields}


# A restart (``Decision.restart``) empties one member's ring; a shared
# replay has none of its own. The pipelines refuse it with this line.
CLEAR_NEEDS_PER_MEMBER = (
    'a restarted member starts with an empty replay, but the population '
    'shares one replay: a rule that restarts members needs per-member '
    'replays (no --shared-replay)')


class Replay(abc.ABC):
  """The interface both layouts share.

  Attributes:
    num_members: population size ``N``.
    capacity: transitions one ring holds before overwriting the oldest.
    fields: per-transition ``name -> (shape, dtype)``.
    nbytes: bytes of storage when full.
  """

  layout: str

  def __init__(self, fields: FieldSpecs, num_members: int, capacity: int):
    if num_members < 1:
      raise ValueError(f'num_members must be >= 1, got {num_members}')
    if capacity < 1:
      raise ValueError(f'capacity must be >= 1, got {capacity}')
    self.fields = _check_fields(fields)
    self.num_members = int(num_members)
    self.capacity = int(capacity)
    self._lock = threading.Lock()
    # Transitions ever inserted per member (env steps they came from).
    self._inserted = np.zeros(self.num_members, np.int64)

  @property
  @abc.abstractmethod
  def nbytes(self) -> int:
    ...

  @abc.abstractmethod
  def insert(self, members: Sequence[int] | np.ndarray,
             chunk: Mapping[str, np.ndarray],
             num_steps: int | None = None) -> None:
    """Appends ``num_steps`` consecutive steps of several members.

    Args:
      members: ``[M]`` distinct member indices.
      chunk: every ``Transition`` field as an ``[M, T, ...]`` array (extra
        keys are ignored); row ``j`` belongs to ``members[j]``.
      num_steps: how many of the ``T`` steps to insert (all by default).
    """

  @abc.abstractmethod
  def sample(self, rng: np.random.Generator, num_steps: int,
             batch_size: int) -> Transition:
    """Uniformly samples ``[N, num_steps, batch_size, ...]`` for all members.

    Raises:
      ValueError: if a member has nothing to sample from yet.
    """

  @abc.abstractmethod
  def sizes(self) -> np.ndarray:
    """``[N]``: how many transitions each member's batches are drawn from."""

  @abc.abstractmethod
  def state_dict(self) -> dict:
    """A consistent copy of the stored data, for a checkpoint: numpy
    arrays only, the rings cut to the rows ever written (so an unfilled
    ring costs only what it holds). Taken under the lock: inserts wait."""

  @abc.abstractmethod
  def load_state_dict(self, state: Mapping) -> None:
    """Replaces the contents by a :meth:`state_dict` of a replay with the
    same layout, population, fields and capacity."""

  def state_template(self, rows: int) -> dict:
    """Shapes and dtypes of a :meth:`state_dict` whose rings hold
    ``rows`` rows (``state_template`` below)."""
    return state_template(self.layout, self.fields, self.num_members, rows)

  @staticmethod
  def state_rows(state: Mapping) -> int:
    """Ring rows held by a :meth:`state_dict`."""
    first = next(iter(state['data'].values()))
    return int(first.shape[0] if np.ndim(state['size']) == 0 else
               first.shape[1])

  def _check_state(self, state: Mapping) -> int:
    rows = self.state_rows(state)
    template = self.state_template(rows)
    expected = {**{f'data/{k}': v for k, v in template['data'].items()},
                **{k: template[k] for k in ('pos', 'size', 'inserted')}}
    for name, spec in expected.items():
      value = state
      for part in name.split('/'):
        value = value[part]
      if np.shape(value) != spec.shape:
        raise ValueError(f'replay state {name} has shape {np.shape(value)}; '
                         f'this {self.layout} replay of {self.num_members} '
                         f'members needs {spec.shape}')
    if rows > self.capacity:
      raise ValueError(f'replay state holds {rows} rows per ring, more than '
                       f'the capacity {self.capacity}')
    return rows

  def inserted(self) -> np.ndarray:
    """``[N]``: transitions ever inserted from each member."""
    with self._lock:
      return self._inserted.copy()

  def describe(self) -> str:
    per = bytes_per_transition(self.fields)
    shapes = ', '.join(f'{k} {shape} {dtype}'
                       for k, (shape, dtype) in self.fields.items()
                       if k in ('observation', 'action'))
    return (f'{self.layout} replay: {self._rings_text()} x '
            f'{self.capacity:,} transitions x {per} B = '
            f'{format_bytes(self.nbytes)} when full ({shapes}; '
            f'next_observation stored separately)')

  def _log_size(self) -> None:
    logger.info('%s', self.describe())
    available = _available_memory()
    if available is not None and self.nbytes > available:
      logger.warning(
          'replay needs %s when full but only %s of memory is available now; '
          'lower replay_capacity or the population size',
          format_bytes(self.nbytes), format_bytes(available))

  @abc.abstractmethod
  def _rings_text(self) -> str:
    ...

  def _gather(self, arrays: Mapping[str, np.ndarray],
              rows: np.ndarray) -> dict:
    """One ``np.take`` per field, called outside the lock (tests wrap it
    to insert while a gather is in progress)."""
    return {k: np.take(v, rows, axis=0) for k, v in arrays.items()}

  @staticmethod
  def _rewritten(ring_rows: np.ndarray, pos0, written: np.ndarray,
                 capacity: int) -> np.ndarray:
    """Which of ``ring_rows`` an insert rewrote since a draw: inserts write
    consecutive rows from the position ``pos0`` at the draw, ``written``
    rows in all (broadcast against ``ring_rows``)."""
    return (ring_rows - pos0) % capacity < np.minimum(written, capacity)

  @staticmethod
  def _regather(out: dict, arrays: Mapping[str, np.ndarray], rows: np.ndarray,
                stale: np.ndarray) -> None:
    """Under the lock: gathers again the entries flagged in ``stale``."""
    if stale.any():
      again = rows[stale]
      for k, v in arrays.items():
        out[k][stale] = np.take(v, again, axis=0)

  @staticmethod
  def _check_sample_args(num_steps: int, batch_size: int) -> None:
    if num_steps < 1:
      raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    if batch_size < 1:
      raise ValueError(f'batch_size must be >= 1, got {batch_size}')

  def _prepare(self, members, chunk, num_steps) -> tuple[np.ndarray, int,
                                                          int]:
    members = np.asarray(members, np.int64).reshape(-1)
    if members.size == 0:
      raise ValueError('members must not be empty')
    if members.min() < 0 or members.max() >= self.num_members:
      raise ValueError(f'members must be in [0, {self.num_members}); got '
                       f'{members.tolist()}')
    if np.unique(members).size != members.size:
      raise ValueError(f'members must be distinct; got {members.tolist()}')
    total = None
    for name, (shape, _) in self.fields.items():
      arr = chunk[name]
      if arr.shape[0] != members.size or tuple(arr.shape[2:]) != shape:
        raise ValueError(f'chunk field {name} has shape {arr.shape}; expected '
                         f'({members.size}, T, *{shape})')
      if total is None:
        total = arr.shape[1]
      elif arr.shape[1] != total:
        raise ValueError('chunk fields disagree on the number of steps T')
    num_steps = total if num_steps is None else int(num_steps)
    if not 0 <= num_steps <= total:
      raise ValueError(f'num_steps must be in [0, {total}]; got {num_steps}')
    return members, num_steps, total


def state_template(layout: str, fields: FieldSpecs, num_members: int,
                   rows: int) -> dict:
  """Shapes and dtypes (``jax.ShapeDtypeStruct``) of ``Replay.state_dict``
  of a ``layout`` replay (``'shared'`` or the per-member one) whose rings
  hold ``rows`` rows; for restoring a checkpoint without building a replay."""
  import jax  # noqa: PLC0415 (only checkpoint restores need it)

  def spec(shape, dtype):
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))

  ring = () if layout == 'shared' else (num_members,)
  return {'data': {k: spec((*ring, rows, *shape), dtype)
                   for k, (shape, dtype) in _check_fields(fields).items()},
          'pos': spec(ring, np.int64), 'size': spec(ring, np.int64),
          'inserted': spec((num_members,), np.int64)}


class PerMemberReplay(Replay):
  """One ring per member; member ``i`` only ever samples member ``i``'s data."""

  layout = 'per-member'

  def __init__(self, fields: FieldSpecs, num_members: int,
               capacity: int = DEFAULT_CAPACITY):
    super().__init__(fields, num_members, capacity)
    n, cap = self.num_members, self.capacity
    self._data = {k: np.zeros((n, cap, *shape), dtype)
                  for k, (shape, dtype) in self.fields.items()}
    # Flat views [N * capacity, ...] so one np.take gathers every member.
    self._flat = {k: v.reshape(n * cap, *v.shape[2:])
                  for k, v in self._data.items()}
    self._pos = np.zeros(n, np.int64)  # next row to write per member
    self._size = np.zeros(n, np.int64)  # valid rows per member
    # For sampling outside the lock: ring rows ever written per member, and
    # a count of the changes that move a ring's position (clear, copy, load).
    self._written = np.zeros(n, np.int64)
    self._epoch = np.zeros(n, np.int64)
    self._log_size()

  @property
  def nbytes(self) -> int:
    return int(sum(v.nbytes for v in self._data.values()))

  def _rings_text(self) -> str:
    return f'{self.num_members} rings'

  def sizes(self) -> np.ndarray:
    with self._lock:
      return self._size.copy()

  def insert(self, members, chunk, num_steps=None) -> None:
    members, num_steps, _ = self._prepare(members, chunk, num_steps)
    if num_steps == 0:
      return
    first = max(0, num_steps - self.capacity)  # only the newest fit
    kept = num_steps - first
    steps = np.arange(kept)
    with self._lock:
      rows = (self._pos[members, None] + steps) % self.capacity  # [M, kept]
      for name, data in self._data.items():
        data[members[:, None], rows] = chunk[name][:, first:num_steps]
      self._pos[members] = (self._pos[members] + kept) % self.capacity
      self._size[members] = np.minimum(self._size[members] + kept,
                                       self.capacity)
      self._written[members] += kept
      self._inserted[members] += num_steps

  def state_dict(self) -> dict:
    with self._lock:
      rows = int(self._size.max())
      return {'data': {k: v[:, :rows].copy() for k, v in self._data.items()},
              'pos': self._pos.copy(), 'size': self._size.copy(),
              'inserted': self._inserted.copy()}

  def load_state_dict(self, state: Mapping) -> None:
    rows = self._check_state(state)
    with self._lock:
      for k, v in self._data.items():
        v[:, :rows] = state['data'][k]
      self._pos[:] = np.asarray(state['pos'])
      self._size[:] = np.asarray(state['size'])
      self._inserted[:] = np.asarray(state['inserted'])
      self._epoch += 1

  def clear(self, members: Sequence[int] | np.ndarray) -> None:
    """Empties the rings of ``members`` (a restarted experiment's replay).
    Their ``inserted`` counts stay: they count env steps collected."""
    members = np.asarray(members, np.int64).reshape(-1)
    if members.size and (members.min() < 0 or members.max() >= self.num_members):
      raise ValueError(f'members must be in [0, {self.num_members}); got '
                       f'{members.tolist()}')
    with self._lock:
      self._pos[members] = 0
      self._size[members] = 0
      self._epoch[members] += 1

  def sample(self, rng, num_steps, batch_size, inactive=None) -> Transition:
    """As ``Replay.sample``; members flagged in ``inactive`` (``[N]`` bool),
    whose updates the learner discards, may have empty rings: their rows
    are then arbitrary."""
    self._check_sample_args(num_steps, batch_size)
    n, cap = self.num_members, self.capacity
    with self._lock:
      sizes = self._size.copy()
      if inactive is not None:
        sizes = np.where(np.asarray(inactive, bool), np.maximum(sizes, 1),
                         sizes)
      if (sizes == 0).any():
        raise ValueError(f'members {np.flatnonzero(sizes == 0).tolist()} '
                         'have no transitions to sample yet')
      ring = rng.integers(0, sizes[:, None, None],
                          size=(n, num_steps, batch_size))
      pos0, written0 = self._pos.copy(), self._written.copy()
      epoch0 = self._epoch.copy()
    rows = ring + (np.arange(n, dtype=np.int64) * cap)[:, None, None]
    out = self._gather(self._flat, rows)  # the long part, outside the lock
    with self._lock:
      written = self._written - written0
      moved = self._epoch != epoch0
      if written.any() or moved.any():
        stale = self._rewritten(ring, pos0[:, None, None],
                                written[:, None, None], cap)
        stale |= moved[:, None, None]
        self._regather(out, self._flat, rows, stale)
    return Transition(**out)

  def copy_members(self, dst_indices: Sequence[int] | np.ndarray,
                   src_indices: Sequence[int] | np.ndarray) -> None:
    """Replaces members ``dst_indices[k]``'s data by ``src_indices[k]``'s.

    PBT's "also copy the source's replay data" exploit option. The copy is a
    snapshot: all sources are read before any destination is written, so
    overlapping pairs (``dst=[0, 1], src=[1, 0]``) swap. Only the valid rows
    are copied. Env-step counters (:meth:`inserted`) are not changed: they
    count the steps each member's actor collected.

    Args:
      dst_indices: ``[K]`` distinct members to overwrite.
      src_indices: ``[K]`` members to copy from.
    """
    dst = np.asarray(dst_indices, np.int64).reshape(-1)
    src = np.asarray(src_indices, np.int64).reshape(-1)
    if dst.shape != src.shape:
      raise ValueError(f'dst_indices and src_indices must have the same '
                       f'length; got {dst.size} and {src.size}')
    for name, idx in (('dst_indices', dst), ('src_indices', src)):
      if idx.size and (idx.min() < 0 or idx.max() >= self.num_members):
        raise ValueError(f'{name} must be in [0, {self.num_members}); got '
                         f'{idx.tolist()}')
    if np.unique(dst).size != dst.size:
      raise ValueError(f'dst_indices must be distinct; got {dst.tolist()}')
    with self._lock:
      # Sources that are also overwritten are snapshotted first.
      overwritten = set(dst.tolist())
      snapshot = {}
      for s in set(src.tolist()) & overwritten:
        size = int(self._size[s])
        snapshot[s] = {k: v[s, :size].copy() for k, v in self._data.items()}
      pos, size = self._pos.copy(), self._size.copy()
      for d, s in zip(dst.tolist(), src.tolist()):
        if d == s:
          continue
        valid = int(size[s])
        for k, v in self._data.items():
          v[d, :valid] = snapshot[s][k] if s in snapshot else v[s, :valid]
        self._pos[d], self._size[d] = pos[s], size[s]
        self._epoch[d] += 1


class SharedReplay(Replay):
  """One ring for the whole population; every batch spans all its data."""

  layout = 'shared'

  def __init__(self, fields: FieldSpecs, num_members: int,
               capacity: int = DEFAULT_CAPACITY):
    super().__init__(fields, num_members, capacity)
    self._data = {k: np.zeros((self.capacity, *shape), dtype)
                  for k, (shape, dtype) in self.fields.items()}
    self._pos = 0
    self._size = 0
    self._written = 0  # rows ever written, for sampling outside the lock
    self._epoch = 0  # loads, which move the position
    self._log_size()

  @property
  def nbytes(self) -> int:
    return int(sum(v.nbytes for v in self._data.values()))

  def _rings_text(self) -> str:
    return '1 ring'

  def sizes(self) -> np.ndarray:
    with self._lock:
      return np.full(self.num_members, self._size, np.int64)

  def insert(self, members, chunk, num_steps=None) -> None:
    members, num_steps, _ = self._prepare(members, chunk, num_steps)
    if num_steps == 0:
      return
    total = members.size * num_steps
    first = max(0, total - self.capacity)
    kept = total - first
    with self._lock:
      rows = (self._pos + np.arange(kept)) % self.capacity
      for name, data in self._data.items():
        values = chunk[name][:, :num_steps]
        values = values.reshape(total, *values.shape[2:])
        data[rows] = values[first:]
      self._pos = (self._pos + kept) % self.capacity
      self._size = min(self._size + kept, self.capacity)
      self._written += kept
      self._inserted[members] += num_steps

  def state_dict(self) -> dict:
    with self._lock:
      rows = int(self._size)
      return {'data': {k: v[:rows].copy() for k, v in self._data.items()},
              'pos': np.asarray(self._pos, np.int64),
              'size': np.asarray(self._size, np.int64),
              'inserted': self._inserted.copy()}

  def load_state_dict(self, state: Mapping) -> None:
    rows = self._check_state(state)
    with self._lock:
      for k, v in self._data.items():
        v[:rows] = state['data'][k]
      self._pos = int(state['pos'])
      self._size = int(state['size'])
      self._inserted[:] = np.asarray(state['inserted'])
      self._epoch += 1

  def sample(self, rng, num_steps, batch_size) -> Transition:
    self._check_sample_args(num_steps, batch_size)
    with self._lock:
      if self._size == 0:
        raise ValueError('the shared replay has no transitions to sample yet')
      rows = rng.integers(0, self._size,
                          size=(self.num_members, num_steps, batch_size))
      pos0, written0, epoch0 = self._pos, self._written, self._epoch
    out = self._gather(self._data, rows)  # the long part, outside the lock
    with self._lock:
      written = self._written - written0
      if self._epoch != epoch0:
        self._regather(out, self._data, rows, np.ones(rows.shape, bool))
      elif written:
        self._regather(out, self._data, rows,
                       self._rewritten(rows, pos0, written, self.capacity))
    return Transition(**out)


LAYOUTS = ('per_member', 'shared')


def make_replay(layout: str, fields: FieldSpecs, num_members: int,
                capacity: int = DEFAULT_CAPACITY) -> Replay:
  """Builds the replay for ``layout``, one of :data:`LAYOUTS`."""
  if layout == 'per_member':
    return PerMemberReplay(fields, num_members, capacity)
  if layout == 'shared':
    return SharedReplay(fields, num_members, capacity)
  raise ValueError(f'layout must be one of {LAYOUTS}; got {layout!r}')
