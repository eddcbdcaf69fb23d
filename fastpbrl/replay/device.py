"""A replay that lives on the accelerator; sampling runs inside the learner's
compiled call.

Two halves, kept apart:

* **Pure JAX functions** over :class:`DeviceReplayState` (``init_state``,
  ``insert``, ``write_rows``, ``sample_indices``, ``sample``, ``clear``,
  ``copy_members``). They hold the same per-member (``[N, capacity, ...]``)
  and shared (``[capacity, ...]``) rings as :mod:`fastpbrl.replay.buffers`,
  with the same insertion order, so after the same inserts both replays hold
  the same rows. ``sample`` is what ``PopulationLearner.update_from_replay``
  calls inside its jitted program, so a learner call takes no batch from the
  host.
* **A host-side class** :class:`DeviceReplay` (not jittable: a lock, numpy
  staging and jitted calls) with the interface of
  :class:`fastpbrl.replay.buffers.Replay`, so the pipeline can hold either.

Threading. ``DeviceReplay.insert`` (and ``clear``) are called from reader
threads and never touch device arrays: the learner thread donates the replay
state to jitted calls, and a reader holding a donated buffer would fail. An
insert copies its rows into a host staging area under the lock, computes
their ring rows from host mirrors of ``pos``/``size`` (so ``sizes()`` never
waits for the device) and returns. ``flush()``, called only from the learner
thread before each learner call, drains the staging area and writes it with
one jitted, donated scatter per bucket of rows (bucket sizes are a few fixed
powers of four, so there are at most a handful of compilations). The staging
area is bounded (``staging_rows``, by default 64 MiB of rows). When full it
is first compacted to the latest write of each ring row (so it never needs
more rows than the rings hold); an insert that would still overflow it
blocks until the learner flushes, for at most ``insert_timeout_s``, and then raises
``TimeoutError`` with nothing of the chunk written. Data is never dropped
silently and a stuck learner cannot hang a reader forever. A chunk larger
than the whole bound is accepted when the staging area is empty, so no chunk
can wait forever. The owner must therefore call ``flush()`` regularly, also
while the learner waits for warm-up data.

Why plain ``jnp`` rings and not flashbax: flashbax is not installed in this
environment, and its buffers keep one ring (with one insertion pointer)
for the whole batch of ``add`` calls, whereas fastpbrl needs independent
per-member rings that actors fill at different rates, member-major shared
inserts matching :class:`~fastpbrl.replay.buffers.SharedReplay`, clears and
snapshot copies of single members (PBT), and checkpoints interchangeable with
the numpy replay. Those are a few scatters and gathers over the same arrays,
simpler to own than to adapt.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.core.types import Transition
from fastpbrl.devices import sharding
from fastpbrl.replay.buffers import (DEFAULT_CAPACITY, FieldSpecs, Replay,
                                     bytes_per_transition, format_bytes)

logger = logging.getLogger(__name__)

LOCATIONS = ('auto', 'host', 'device')
DEVICE_MEMORY_FRACTION = 0.5  # of device memory an 'auto' replay may take


class DeviceReplayState(NamedTuple):
  """Rings on the device. ``R`` below is ``[N]`` for the per-member layout
  and ``[]`` for the shared one."""

  data: Any  # dict field -> [N, capacity, *shape] (per-member) or [capacity, *shape] (shared), the field's dtype
  pos: jax.Array  # R int32: next ring row to write
  size: jax.Array  # R int32: valid rows, <= capacity


def _layout(layout: str) -> str:
  if layout in ('per_member', 'per-member'):
    return 'per-member'
  if layout == 'shared':
    return 'shared'
  raise ValueError(f"layout must be 'per_member' or 'shared'; got {layout!r}")


def _per_member(state: DeviceReplayState) -> bool:
  return state.size.ndim == 1


def _capacity(state: DeviceReplayState) -> int:
  first = jax.tree.leaves(state.data)[0]
  return first.shape[1] if _per_member(state) else first.shape[0]


# ------------------------------------------------------------ pure functions


def init_state(layout: str, fields: FieldSpecs, num_members: int,
               capacity: int) -> DeviceReplayState:
  """Empty rings for ``layout`` (``'per_member'`` or ``'shared'``)."""
  ring = () if _layout(layout) == 'shared' else (num_members,)
  data = {k: jnp.zeros((*ring, capacity, *shape), dtype)
          for k, (shape, dtype) in fields.items()}
  return DeviceReplayState(data, jnp.zeros(ring, jnp.int32),
                           jnp.zeros(ring, jnp.int32))


def insert(state: DeviceReplayState, members: jax.Array, chunk: Mapping,
           num_steps: jax.Array) -> DeviceReplayState:
  """Appends the first ``num_steps`` of ``T`` steps of ``M`` members.

  Same result as ``PerMemberReplay.insert`` / ``SharedReplay.insert``:
  when more steps arrive than a ring holds, only the newest are kept; the
  shared layout writes the ``M * num_steps`` rows member-major. Padding
  steps (``t >= num_steps``) get an out-of-range row and ``mode='drop'``,
  so they never write.

  Args:
    state: the rings.
    members: ``[M]`` distinct int32 member indices.
    chunk: field -> ``[M, T, ...]``; row ``j`` belongs to ``members[j]``.
    num_steps: traced int scalar in ``[0, T]``.
  """
  capacity = _capacity(state)
  members = jnp.asarray(members, jnp.int32)
  num_steps = jnp.asarray(num_steps, jnp.int32)
  first_leaf = chunk[next(iter(state.data))]
  m, t_max = first_leaf.shape[:2]
  t = jnp.arange(t_max, dtype=jnp.int32)
  data = dict(state.data)
  if _per_member(state):
    first = jnp.maximum(0, num_steps - capacity)  # only the newest fit
    kept = num_steps - first
    write = (t >= first) & (t < num_steps)  # [T]
    rows = (state.pos[members][:, None] + t[None] - first) % capacity
    rows = jnp.where(write[None], rows, capacity)  # [M, T], capacity: drop
    who = jnp.broadcast_to(members[:, None], rows.shape)
    for k in data:
      data[k] = data[k].at[who, rows].set(chunk[k].astype(data[k].dtype),
                                          mode='drop')
    pos = state.pos.at[members].set((state.pos[members] + kept) % capacity)
    size = state.size.at[members].set(
        jnp.minimum(state.size[members] + kept, capacity))
  else:
    total = m * num_steps
    first = jnp.maximum(0, total - capacity)
    kept = total - first
    idx = jnp.arange(m, dtype=jnp.int32)[:, None] * num_steps + t[None]
    write = (t < num_steps)[None] & (idx >= first)
    rows = jnp.where(write, (state.pos + idx - first) % capacity, capacity)
    for k in data:
      data[k] = data[k].at[rows].set(chunk[k].astype(data[k].dtype),
                                     mode='drop')
    pos = (state.pos + kept) % capacity
    size = jnp.minimum(state.size + kept, capacity)
  return DeviceReplayState(data, pos, size)


def insert_every_member(state: DeviceReplayState, chunk: Mapping,
                        num_steps: jax.Array) -> DeviceReplayState:
  """:func:`insert` of every member, in order (``members = 0..N-1``): what
  the device path's acting step writes, the same rings.

  A per-member ring is written by a ``vmap`` over members, so a population
  sharded over devices (``fastpbrl.devices.sharding``) writes each
  device's own rings and the partitioned program exchanges nothing: with
  the members as explicit scatter indices (:func:`insert`), XLA gathered
  every member's rows and positions onto every device at every env step
  (12 all-gathers a step for TD3), which kept the devices in lock-step.
  The shared layout has one ring: it is :func:`insert`'s.

  Args:
    state: the rings (``N`` of them, per-member).
    chunk: field -> ``[N, T, ...]``; row ``i`` belongs to member ``i``.
    num_steps: traced int scalar in ``[0, T]``.
  """
  first_leaf = chunk[next(iter(state.data))]
  if not _per_member(state):
    members = jnp.arange(first_leaf.shape[0], dtype=jnp.int32)
    return insert(state, members, chunk, num_steps)
  capacity = _capacity(state)
  num_steps = jnp.asarray(num_steps, jnp.int32)
  t = jnp.arange(first_leaf.shape[1], dtype=jnp.int32)
  first = jnp.maximum(0, num_steps - capacity)  # only the newest fit
  kept = num_steps - first
  write = (t >= first) & (t < num_steps)  # [T]

  def one_ring(ring, pos, values):  # [C, ...], [], [T, ...]
    rows = jnp.where(write, (pos + t - first) % capacity, capacity)
    return ring.at[rows].set(values.astype(ring.dtype), mode='drop')

  data = {k: jax.vmap(one_ring)(v, state.pos, chunk[k])
          for k, v in state.data.items()}
  return DeviceReplayState(data, (state.pos + kept) % capacity,
                           jnp.minimum(state.size + kept, capacity))


def write_rows(state: DeviceReplayState, rows: jax.Array, values: Mapping,
               pos: jax.Array, size: jax.Array) -> DeviceReplayState:
  """Writes ``values`` (field -> ``[R, ...]``) at flat ring rows ``rows``
  (``[R]``: ``member * capacity + row`` per-member, ``row`` shared) and sets
  ``pos`` and ``size``. Rows out of range (padding) are dropped; ``rows``
  must not repeat an in-range row. What ``DeviceReplay.flush`` runs."""
  data = {}
  for k, v in state.data.items():
    flat = v.reshape(-1, *v.shape[2 if _per_member(state) else 1:])
    flat = flat.at[rows].set(values[k].astype(v.dtype), mode='drop')
    data[k] = flat.reshape(v.shape)
  return DeviceReplayState(data, jnp.asarray(pos, jnp.int32).reshape(
      state.pos.shape), jnp.asarray(size, jnp.int32).reshape(state.size.shape))


def sample_indices(state: DeviceReplayState, key: jax.Array, num_steps: int,
                   batch_size: int, inactive: jax.Array | None = None, *,
                   num_members: int | None = None) -> jax.Array:
  """``[N, num_steps, batch_size]`` int32 ring rows, uniform over the valid
  rows; per-member: member ``i`` draws from its own ring with its own key
  (``jax.random.split(key, N)[i]``).

  A ring with no valid rows draws row 0 (whatever it holds): indices are
  always in range, so nothing reads out of bounds or makes NaN. The host
  side (``DeviceReplay.sample``) raises for such members unless they are
  ``inactive``, as ``PerMemberReplay.sample`` does; here ``inactive``
  (``[N]`` bool) is accepted for the same call shape and changes nothing.

  Args:
    num_members: ``N``; needed for the shared layout only (per-member: the
      ring count).
  """
  del inactive  # empty rings are always safe, see above
  if _per_member(state):
    n = state.size.shape[0]
    sizes = state.size
  else:
    if num_members is None:
      raise ValueError('the shared layout needs num_members to sample')
    n = num_members
    sizes = jnp.broadcast_to(state.size, (n,))
  keys = jax.random.split(key, n)
  draw = lambda k, s: jax.random.randint(k, (num_steps, batch_size), 0,
                                         jnp.maximum(s, 1), jnp.int32)
  return jax.vmap(draw)(keys, sizes)


def sample(state: DeviceReplayState, key: jax.Array, num_steps: int,
           batch_size: int, inactive: jax.Array | None = None, *,
           num_members: int | None = None) -> Transition:
  """A ``Transition`` of ``[N, num_steps, batch_size, ...]`` arrays at
  :func:`sample_indices`' rows (same arguments)."""
  idx = sample_indices(state, key, num_steps, batch_size, inactive,
                       num_members=num_members)
  if _per_member(state):
    take = jax.vmap(lambda d, i: jnp.take(d, i, axis=0))
  else:
    take = lambda d, i: jnp.take(d, i, axis=0)
  return Transition(**{k: take(state.data[k], idx)
                       for k in Transition._fields})


def clear(state: DeviceReplayState, rows_mask: jax.Array) -> DeviceReplayState:
  """Empties the per-member rings flagged in ``rows_mask`` (``[N]`` bool);
  their data stays but is no longer valid (as ``PerMemberReplay.clear``)."""
  if not _per_member(state):
    raise ValueError('clear needs the per-member layout')
  return state._replace(pos=jnp.where(rows_mask, 0, state.pos),
                        size=jnp.where(rows_mask, 0, state.size))


def copy_members(state: DeviceReplayState, dst: jax.Array,
                 src: jax.Array) -> DeviceReplayState:
  """Member ``dst[k]`` gets member ``src[k]``'s ring, pos and size.

  A snapshot, like ``PerMemberReplay.copy_members``: every source is read
  from the state before the call, so ``dst=[0, 1], src=[1, 0]`` swaps.
  ``dst`` must be distinct. Whole rings are copied (the rows past ``size``
  differ from the numpy version's, which copies only valid rows; they are
  never sampled).
  """
  if not _per_member(state):
    raise ValueError('copy_members needs the per-member layout')
  take = lambda x: x.at[dst].set(x[src])
  return DeviceReplayState(jax.tree.map(take, state.data), take(state.pos),
                           take(state.size))


# ----------------------------------------------------------- location choice


def state_of_dict(like: DeviceReplayState,
                  state: Mapping) -> DeviceReplayState:
  """A numpy ``DeviceReplayState`` shaped like ``like`` that holds a
  ``Replay.state_dict`` (a checkpoint's rings, cut to the rows written);
  the rows past them are zeros."""
  per_member = np.ndim(like.size) == 1
  data = {}
  for k, v in like.data.items():
    rows = np.asarray(state['data'][k])
    full = np.zeros(v.shape, v.dtype)
    if per_member:
      full[:, :rows.shape[1]] = rows
    else:
      full[:rows.shape[0]] = rows
    data[k] = full
  return DeviceReplayState(
      data, np.asarray(state['pos']).astype(np.int32).reshape(
          np.shape(like.pos)),
      np.asarray(state['size']).astype(np.int32).reshape(np.shape(like.size)))


def choose_replay_location(requested: str, backend: str, nbytes: int,
                           device_memory: int | None) -> tuple[str, str]:
  """Where the replay lives: ``('host' | 'device', reason)``.

  ``'auto'`` picks the device on a non-CPU backend when the replay fits in
  :data:`DEVICE_MEMORY_FRACTION` of the device's memory (the rest is left to
  parameters, optimizer states, activations and XLA's workspace), and the
  host otherwise. On the CPU backend the host numpy replay is kept: "device"
  memory is the same RAM, so nothing is saved on transfers, while the
  device replay adds a staging copy, donation-bound jitted inserts and
  sampling inside the learner's program (which then cannot overlap with the
  prefetch thread's sampling, as the numpy path does on a second core).

  Args:
    requested: ``'auto'``, ``'host'`` or ``'device'`` (``--replay-location``).
    backend: ``jax.default_backend()``: ``'cpu'``, ``'gpu'``, ``'tpu'``...
    nbytes: the replay's storage when full.
    device_memory: bytes of memory of one device (``None``: unknown).

  Raises:
    ValueError: an unknown ``requested``, or ``'device'`` for a replay larger
      than the device's memory.
  """
  if requested not in LOCATIONS:
    raise ValueError(f'--replay-location must be one of {LOCATIONS}; got '
                     f'{requested!r}')
  size = format_bytes(nbytes)
  if requested == 'host':
    return 'host', 'requested with --replay-location host'
  if requested == 'device':
    if device_memory is not None and nbytes > device_memory:
      raise ValueError(
          f'--replay-location device: the replay needs {size} when full but '
          f'the device has {format_bytes(device_memory)}; lower '
          'replay_capacity or the population size, or use '
          '--replay-location host (or auto)')
    return 'device', 'requested with --replay-location device'
  if backend == 'cpu':
    return 'host', ('the backend is the CPU: the numpy replay avoids a '
                    'staging copy and keeps sampling in the prefetch thread')
  if device_memory is None:
    return 'host', (f'{backend} device memory is unknown, so a {size} replay '
                    'stays on the host')
  limit = int(device_memory * DEVICE_MEMORY_FRACTION)
  if nbytes <= limit:
    return 'device', (f'a {size} replay fits in {DEVICE_MEMORY_FRACTION:.0%} '
                      f'of the {format_bytes(device_memory)} of the '
                      f'{backend} device')
  return 'host', (f'a {size} replay exceeds {DEVICE_MEMORY_FRACTION:.0%} of '
                  f'the {format_bytes(device_memory)} of the {backend} device')


def device_memory_bytes(device=None) -> int | None:
  """Bytes of memory of ``device`` (default: the first), if it says."""
  device = device or jax.devices()[0]
  try:
    stats = device.memory_stats()
  except Exception:  # noqa: BLE001 (backends without memory stats)
    return None
  return None if not stats else stats.get('bytes_limit')


# ------------------------------------------------------------- host-side class


class _Staged(NamedTuple):
  rows: np.ndarray  # [R] int64 flat ring rows
  members: np.ndarray  # [R] int64 member each row came from
  values: dict  # field -> [R, ...]


class DeviceReplay(Replay):
  """A :class:`Replay` whose rings are a :class:`DeviceReplayState`.

  Host-side class, not jittable. Reader threads call :meth:`insert` and
  :meth:`clear` (host only, see the module docstring); the learner thread
  calls :meth:`flush` before each learner call and passes :attr:`state` to
  ``update_from_replay``. :meth:`flush`, :meth:`sample`, :meth:`copy_members`,
  :meth:`state_dict` and :meth:`load_state_dict` touch the device and belong
  to the learner thread.
  """

  def __init__(self, layout: str, fields: FieldSpecs, num_members: int,
               capacity: int = DEFAULT_CAPACITY, *, device=None, mesh=None,
               staging_rows: int | None = None,
               insert_timeout_s: float | None = 300.0,
               min_bucket: int = 256, max_bucket_bytes: int = 64 << 20):
    """Args:
      layout: ``'per_member'`` or ``'shared'``.
      fields, num_members, capacity: as the numpy replays.
      device: where the rings live (default device if ``None``).
      mesh: a population mesh (``fastpbrl.devices.sharding``) to keep the rings
        on instead: per-member rings split with their members (each device
        holds its own members' data), a shared ring replicated. Every
        flush, copy and restore keeps that layout, so the learner never
        reshards the replay.
      staging_rows: rows (transitions) the staging area holds before an
        insert blocks; default: what ``max_bucket_bytes`` holds. When full,
        the staging area is first compacted to the latest write per ring
        row, so a bound of at least the rings' total rows plus the largest
        chunk never blocks.
      insert_timeout_s: how long a blocked insert waits for a flush before
        ``TimeoutError`` (``None``: forever).
      min_bucket: smallest padded row count of a flush's jitted write.
      max_bucket_bytes: bytes of the largest padded write; larger flushes
        are split. Bucket sizes are ``min_bucket * 4**k`` up to it.
    """
    super().__init__(fields, num_members, capacity)
    self.layout = _layout(layout)
    self._per_member = self.layout == 'per-member'
    self._device = device
    self._rows_total = (self.num_members * self.capacity if self._per_member
                        else self.capacity)
    self._init_staging(staging_rows, min_bucket, max_bucket_bytes)
    self.insert_timeout_s = insert_timeout_s
    ring = (self.num_members,) if self._per_member else ()
    self._pos = np.zeros(ring, np.int64)  # host mirrors, staged inserts included
    self._size = np.zeros(ring, np.int64)
    self._staged: list[_Staged] = []
    self._staged_count = 0
    self._dirty = False  # pos/size changed since the last flush
    self._drained = threading.Condition(self._lock)
    self._device_lock = threading.RLock()  # serialises device work
    self.compilations = 0  # traces of the flush write (all buckets)
    self.mesh = mesh
    self._make_device_fns(mesh)
    self._state = self._allocate_state(device, mesh)
    self._log_size()

  def _init_staging(self, staging_rows: int | None, min_bucket: int,
                    max_bucket_bytes: int) -> None:
    """Sets the flush's bucket sizes and the staging area's bound."""
    row_bytes = max(bytes_per_transition(self.fields), 1)
    buckets = [min_bucket]
    while buckets[-1] * 4 * row_bytes <= max_bucket_bytes:
      buckets.append(buckets[-1] * 4)
    self._buckets = buckets
    default_staging = max(buckets[-1], max_bucket_bytes // row_bytes)
    self.staging_rows = int(staging_rows or default_staging)
    if self.staging_rows < 1:
      raise ValueError(f'staging_rows must be >= 1, got {staging_rows}')

  def _make_device_fns(self, mesh) -> None:
    """Jits the flush write, the member copy and the sampler (each output
    kept on ``mesh``'s layout when there is one)."""

    def traced_write(state, rows, values, pos, size):
      self.compilations += 1  # runs once per trace, never at run time
      return write_rows(state, rows, values, pos, size)

    abstract = jax.eval_shape(lambda: init_state(
        self.layout, self.fields, self.num_members, self.capacity))
    if mesh is None:
      pin = lambda state: state  # noqa: E731
    else:
      per_member = jax.tree.map(lambda _: self._per_member, abstract)
      self._shardings = sharding.shardings(abstract, mesh, None, per_member)
      pin = lambda state: sharding.constrain(  # noqa: E731
          state, mesh, None, per_member)
    self._write = jax.jit(lambda *args: pin(traced_write(*args)),
                          donate_argnums=0)
    self._copy = jax.jit(lambda *args: pin(copy_members(*args)),
                         donate_argnums=0)
    self._sample = jax.jit(sample, static_argnums=(2, 3),
                           static_argnames=('num_members',))

  def _allocate_state(self, device, mesh) -> DeviceReplayState:
    """Empty rings on ``mesh`` (each device its part), else on ``device``."""
    if mesh is not None:  # allocated in place, each device its part
      return jax.jit(lambda: init_state(
          self.layout, self.fields, self.num_members, self.capacity),
                     out_shardings=self._shardings)()
    with (jax.default_device(device) if device is not None
          else contextlib.nullcontext()):
      return init_state(self.layout, self.fields, self.num_members,
                        self.capacity)

  # ------------------------------------------------------------- reporting

  @property
  def nbytes(self) -> int:
    return int(sum(int(np.prod(x.shape)) * x.dtype.itemsize
                   for x in jax.tree.leaves(self._state.data)))

  def _rings_text(self) -> str:
    return f'{self.num_members} rings' if self._per_member else '1 ring'

  def describe(self) -> str:
    device = self._device or jax.devices()[0]
    return f'device {super().describe()} on {device}'

  def _log_size(self) -> None:
    logger.info('%s', self.describe())

  def sizes(self) -> np.ndarray:
    """``[N]`` valid rows per member, staged inserts included (host
    mirrors: never waits for the device)."""
    with self._lock:
      return np.broadcast_to(self._size, (self.num_members,)).copy()

  def staged(self) -> int:
    """Rows waiting in the staging area for the next :meth:`flush`."""
    with self._lock:
      return self._staged_count

  @property
  def state(self) -> DeviceReplayState:
    """The rings as of the last :meth:`flush` (learner thread only)."""
    return self._state

  # ------------------------------------------------- reader threads (host)

  def insert(self, members, chunk, num_steps=None) -> None:
    """Stages ``num_steps`` steps of ``members`` (see ``Replay.insert``).

    Host only: copies the rows and returns; :meth:`flush` writes them.
    Blocks while the staging area is full (see the module docstring).

    Raises:
      TimeoutError: no flush made room within ``insert_timeout_s``; nothing
        of this chunk was staged.
    """
    members, num_steps, _ = self._prepare(members, chunk, num_steps)
    if num_steps == 0:
      return
    if self._per_member:
      first = max(0, num_steps - self.capacity)
      kept = num_steps - first
      values = {k: np.array(chunk[k][:, first:num_steps]).reshape(
          members.size * kept, *shape) for k, (shape, _) in self.fields.items()}
      who = np.repeat(members, kept)
    else:
      total = members.size * num_steps
      first = max(0, total - self.capacity)
      kept = total - first
      values = {k: np.array(chunk[k][:, :num_steps]).reshape(
          total, *shape)[first:] for k, (shape, _) in self.fields.items()}
      who = np.repeat(members, num_steps)[first:]
    count = who.size
    deadline = (None if self.insert_timeout_s is None
                else time.monotonic() + self.insert_timeout_s)
    with self._lock:
      if self._staged_count + count > self.staging_rows and self._staged:
        self._compact_locked()
      while self._staged_count and self._staged_count + count > self.staging_rows:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          raise TimeoutError(
              f'device replay staging full ({self._staged_count} of '
              f'{self.staging_rows} rows) for {self.insert_timeout_s} s: '
              'the learner thread must call flush()')
        self._drained.wait(left)
      if self._per_member:
        steps = np.arange(kept)
        rows = ((self._pos[members, None] + steps) % self.capacity
                + members[:, None] * self.capacity).reshape(-1)
        self._pos[members] = (self._pos[members] + kept) % self.capacity
        self._size[members] = np.minimum(self._size[members] + kept,
                                         self.capacity)
      else:
        rows = (self._pos + np.arange(kept)) % self.capacity
        self._pos = np.asarray((self._pos + kept) % self.capacity)
        self._size = np.asarray(min(int(self._size) + kept, self.capacity))
      self._staged.append(_Staged(rows, who, values))
      self._staged_count += count
      self._dirty = True
      self._inserted[members] += num_steps

  def clear(self, members: Sequence[int] | np.ndarray) -> None:
    """Empties the rings of ``members`` (per-member layout), as
    ``PerMemberReplay.clear``. Host only: staged rows of those members are
    dropped and the next :meth:`flush` sends the new ``pos``/``size``."""
    if not self._per_member:
      raise ValueError('clear needs the per-member layout')
    members = np.asarray(members, np.int64).reshape(-1)
    self._check_members('members', members)
    with self._lock:
      self._pos[members] = 0
      self._size[members] = 0
      kept, count = [], 0
      for entry in self._staged:
        keep = ~np.isin(entry.members, members)
        if not keep.all():
          entry = _Staged(entry.rows[keep], entry.members[keep],
                          {k: v[keep] for k, v in entry.values.items()})
        if entry.rows.size:
          kept.append(entry)
          count += entry.rows.size
      self._staged, self._staged_count = kept, count
      self._dirty = True
      self._drained.notify_all()

  # ---------------------------------------------------------- learner thread

  def _compact_locked(self) -> None:
    """Merges the staged entries into one holding only the latest write of
    each ring row (a ring that wrapped while staged), so the staging area
    never needs more rows than the rings have."""
    rows = np.concatenate([e.rows for e in self._staged])
    who = np.concatenate([e.members for e in self._staged])
    values = {k: np.concatenate([e.values[k] for e in self._staged])
              for k in self.fields}
    if np.unique(rows).size != rows.size:
      last = rows.size - 1 - np.unique(rows[::-1], return_index=True)[1]
      last.sort()
      rows, who = rows[last], who[last]
      values = {k: v[last] for k, v in values.items()}
    self._staged, self._staged_count = [_Staged(rows, who, values)], rows.size

  def _drain(self):
    """Under the lock: the staged rows (latest write per row) and the
    ``pos``/``size`` they lead to; empties the staging area."""
    if not self._staged and not self._dirty:
      return None
    if self._staged:
      self._compact_locked()
      rows, _, values = self._staged[0]
    else:
      rows, values = np.zeros(0, np.int64), {
          k: np.zeros((0, *shape), dtype)
          for k, (shape, dtype) in self.fields.items()}
    drained = (rows, values, self._pos.copy(), self._size.copy())
    self._staged, self._staged_count, self._dirty = [], 0, False
    self._drained.notify_all()
    return drained

  def _write_drained(self, drained) -> None:
    rows, values, pos, size = drained
    start = 0
    while True:
      left = rows.size - start
      bucket = next((b for b in self._buckets if b >= left), self._buckets[-1])
      n = min(left, bucket)
      padded_rows = np.full(bucket, self._rows_total, np.int32)  # dropped
      padded_rows[:n] = rows[start:start + n]
      padded = {}
      for k, (shape, dtype) in self.fields.items():
        padded[k] = np.zeros((bucket, *shape), dtype)
        padded[k][:n] = values[k][start:start + n]
      self._state = self._write(self._state, padded_rows, padded,
                                pos.astype(np.int32), size.astype(np.int32))
      start += n
      if start >= rows.size:
        return

  def flush(self) -> DeviceReplayState:
    """Writes every staged row to the device (learner thread only) and
    returns :attr:`state`. Cheap when nothing is staged."""
    with self._device_lock:
      with self._lock:
        drained = self._drain()
      if drained is not None:
        self._write_drained(drained)
      return self._state

  def sample(self, rng: np.random.Generator, num_steps: int, batch_size: int,
             inactive=None) -> Transition:
    """As ``PerMemberReplay.sample``, as device arrays (learner thread):
    flushes, then draws with a key taken from ``rng``."""
    self._check_sample_args(num_steps, batch_size)
    state = self.flush()
    sizes = self.sizes()
    if inactive is not None:
      sizes = np.where(np.asarray(inactive, bool), np.maximum(sizes, 1), sizes)
    if (sizes == 0).any():
      raise ValueError(f'members {np.flatnonzero(sizes == 0).tolist()} '
                       'have no transitions to sample yet')
    key = jax.random.PRNGKey(int(rng.integers(0, 2**31)))
    return self._sample(state, key, num_steps, batch_size,
                        num_members=self.num_members)

  def _check_members(self, name: str, idx: np.ndarray) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= self.num_members):
      raise ValueError(f'{name} must be in [0, {self.num_members}); got '
                       f'{idx.tolist()}')

  def copy_members(self, dst_indices, src_indices) -> None:
    """As ``PerMemberReplay.copy_members`` (a snapshot; ``inserted`` is not
    changed). Learner thread: flushes first, then copies on the device."""
    if not self._per_member:
      raise ValueError('copy_members needs the per-member layout')
    dst = np.asarray(dst_indices, np.int64).reshape(-1)
    src = np.asarray(src_indices, np.int64).reshape(-1)
    if dst.shape != src.shape:
      raise ValueError(f'dst_indices and src_indices must have the same '
                       f'length; got {dst.size} and {src.size}')
    self._check_members('dst_indices', dst)
    self._check_members('src_indices', src)
    if np.unique(dst).size != dst.size:
      raise ValueError(f'dst_indices must be distinct; got {dst.tolist()}')
    if not dst.size:
      return
    with self._device_lock:
      with self._lock:
        drained = self._drain()
        # Inserts staged after this point are computed from the copied
        # pos/size and written after the copy by the next flush.
        pos, size = self._pos.copy(), self._size.copy()
        self._pos[dst], self._size[dst] = pos[src], size[src]
      if drained is not None:
        self._write_drained(drained)
      self._state = self._copy(self._state, dst.astype(np.int32),
                               src.astype(np.int32))

  def state_dict(self) -> dict:
    """Same format as the numpy replays' (checkpoints are interchangeable).
    Learner thread: flushes, then copies the valid rows to the host."""
    with self._device_lock:
      with self._lock:
        drained = self._drain()
        pos, size = self._pos.copy(), self._size.copy()
        inserted = self._inserted.copy()
      if drained is not None:
        self._write_drained(drained)
      rows = int(size.max()) if self._per_member else int(size)
      cut = ((lambda v: v[:, :rows]) if self._per_member
             else (lambda v: v[:rows]))
      data = jax.device_get({k: cut(v) for k, v in self._state.data.items()})
    return {'data': {k: np.asarray(v) for k, v in data.items()},
            'pos': pos.astype(np.int64), 'size': size.astype(np.int64),
            'inserted': inserted}

  def load_state_dict(self, state: Mapping) -> None:
    """Replaces the contents by a ``state_dict`` of a numpy or device
    replay of the same layout, population, fields and capacity (learner
    thread; staged rows are discarded)."""
    self._check_state(state)
    data = state_of_dict(self._state, state).data
    with self._device_lock:
      with self._lock:
        self._staged, self._staged_count = [], 0
        self._pos = np.array(state['pos'], np.int64).reshape(self._pos.shape)
        self._size = np.array(state['size'], np.int64).reshape(
            self._size.shape)
        self._inserted[:] = np.asarray(state['inserted'])
        self._dirty = False
        self._drained.notify_all()
        new = DeviceReplayState(
            data, self._pos.astype(np.int32), self._size.astype(np.int32))
      self._state = jax.device_put(
          new, self._device if self.mesh is None else self._shardings)

