"""The population over several processes (multi-process JAX; host-side).

Multi-controller JAX (``jax.distributed``): every process runs the same
program on the devices of all processes. The population mesh
(``fastpbrl.devices.sharding``) then spans every process's devices, so a
population-sharded ``jax.Array`` holds, in each process, only the rows of
the members whose devices that process owns (``local_members``). The
learner (``fastpbrl.learner.population``) and the population rules
(``fastpbrl.rules``) are the same jitted functions as on one process:
XLA inserts the cross-process collectives (gloo on CPU, NCCL on GPU) that a
PBT copy of member ``j`` into member ``i`` on another process needs. There
is no RPC of ours: a process builds its own members' rows (its actors,
its replay, its batches) and turns them into global arrays with
``to_global``; host-side inputs of a rule that each process measured for
its own members (fitness) are gathered with ``allgather_members`` so every
process calls the rule with the same values and the same key, and so takes
the same decision.

The run loop uses all this through ``Processes`` (below): every built-in
rule runs over several processes unchanged. For the shared-replay rules
(CEM-RL, DvD) each process's shared replay holds its own members'
transitions, so a critic step's batch is stratified by process (see the
docs/guides/scale.md). Launch:
``python -m fastpbrl.launch --num-processes 2 -- fastpbrl pbt ...`` (or
``-- python my_run.py``) on one machine (``fastpbrl.launch`` sets the
variables below), or one task per node or per GPU under SLURM (see
``fastpbrl.launch``). The process calls ``initialize_from_env()`` before
anything else touches jax devices.

Environment variables read by ``initialize_from_env``:

* ``FASTPBRL_COORDINATOR``: ``host:port`` of process 0's coordinator.
* ``FASTPBRL_NUM_PROCESSES``: how many processes (>= 1).
* ``FASTPBRL_PROCESS_ID``: this process, in ``[0, FASTPBRL_NUM_PROCESSES)``.

When the last two are absent and SLURM's ``SLURM_NTASKS`` /
``SLURM_PROCID`` are present, those are used, and the coordinator is
``FASTPBRL_COORDINATOR`` if set, else jax's own SLURM detection (the first
host of ``SLURM_STEP_NODELIST``, a port derived from ``SLURM_JOB_ID`` or
``JAX_COORDINATOR_PORT``). Under SLURM jax restricts a process to the
GPU ``SLURM_LOCALID`` (one task per GPU); with one task per node set
``JAX_LOCAL_DEVICE_IDS=0,1,...`` to give each task every GPU of its node.
With none of these variables, nothing is initialised: one process.

Everything here is host-side (process setup, placement of arrays, host
gathers); nothing is jittable.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, NamedTuple, Optional, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.core.types import episode_record
from fastpbrl.devices import sharding

COORDINATOR = 'FASTPBRL_COORDINATOR'
NUM_PROCESSES = 'FASTPBRL_NUM_PROCESSES'
PROCESS_ID = 'FASTPBRL_PROCESS_ID'


class ProcessInfo(NamedTuple):
  """What ``initialize_from_env`` set up."""

  process_id: int  # this process, in [0, num_processes)
  num_processes: int  # processes taking part (1: not distributed)
  local_devices: list  # this process's jax devices
  global_devices: list  # every process's devices, in jax.devices() order


def _int_var(env: Mapping[str, str], name: str, low: int,
             high: Optional[int] = None) -> int:
  raw = env.get(name)
  try:
    value = int(raw)
  except (TypeError, ValueError):
    value = None
  if value is None or value < low or (high is not None and value >= high):
    bound = f'>= {low}' if high is None else f'in [{low}, {high})'
    raise ValueError(f'{name} must be an integer {bound}, got {raw!r}')
  return value


def _coordinator(env: Mapping[str, str]) -> Optional[str]:
  address = env.get(COORDINATOR)
  if address is None:
    return None
  host, _, port = address.rpartition(':')
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f'{COORDINATOR} must be host:port with a port in '
                     f'[1, 65535], got {address!r}')
  return address


def settings_from_env(env: Optional[Mapping[str, str]] = None
                      ) -> Optional[dict]:
  """The keyword arguments ``initialize_from_env`` gives
  ``jax.distributed.initialize``, or None for a single process (no
  variable set). Reads nothing but ``env`` (default ``os.environ``).

  Raises:
    ValueError: one line naming the variable that is missing or wrong.
  """
  env = os.environ if env is None else env
  ours = [v for v in (NUM_PROCESSES, PROCESS_ID) if v in env]
  if ours:
    for name in (COORDINATOR, NUM_PROCESSES, PROCESS_ID):
      if name not in env:
        raise ValueError(f'{name} is not set but {ours[0]} is: set '
                         f'{COORDINATOR}, {NUM_PROCESSES} and {PROCESS_ID} '
                         'together (python -m fastpbrl.launch does)')
    n = _int_var(env, NUM_PROCESSES, 1)
    # 'deactivate': no cluster detection on top (inside a SLURM allocation
    # it would restrict this process to the GPU SLURM_LOCALID).
    return dict(coordinator_address=_coordinator(env), num_processes=n,
                process_id=_int_var(env, PROCESS_ID, 0, n),
                cluster_detection_method='deactivate')
  if 'SLURM_NTASKS' in env and 'SLURM_PROCID' in env:
    n = _int_var(env, 'SLURM_NTASKS', 1)
    settings = dict(num_processes=n,
                    process_id=_int_var(env, 'SLURM_PROCID', 0, n))
    address = _coordinator(env)
    if address is not None:
      settings['coordinator_address'] = address
    elif 'SLURM_STEP_NODELIST' not in env:
      raise ValueError(f'{COORDINATOR} is not set and SLURM_STEP_NODELIST '
                       'is absent (not inside srun?): set it to host:port of '
                       'the first task')
    return settings
  if COORDINATOR in env:
    raise ValueError(f'{COORDINATOR} is set but {NUM_PROCESSES} is not: set '
                     f'{COORDINATOR}, {NUM_PROCESSES} and {PROCESS_ID} '
                     'together')
  return None


def initialize_from_env(env: Optional[Mapping[str, str]] = None,
                        timeout_s: int = 300) -> ProcessInfo:
  """Joins the processes named by the environment (``jax.distributed``).

  Call it first, before anything touches jax devices. On CPU the
  cross-process collectives are gloo's (``jax_cpu_collectives_implementation``;
  a value the user set, e.g. ``mpi``, is kept). With no variable set this
  is one process and nothing is initialised.

  Args:
    env: the variables (default ``os.environ``); see the module docstring.
    timeout_s: how long to wait for every process to join.

  Returns:
    ``ProcessInfo`` of this process.

  Raises:
    ValueError: a variable missing or wrong (one line naming it).
  """
  settings = settings_from_env(env)
  if settings is not None and not jax.distributed.is_initialized():
    if jax.config.values.get('jax_cpu_collectives_implementation') is None:
      jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    jax.distributed.initialize(initialization_timeout=timeout_s, **settings)
  return ProcessInfo(jax.process_index(), jax.process_count(),
                     jax.local_devices(), jax.devices())


def initialize_if_launched(env: Optional[Mapping[str, str]] = None
                           ) -> Optional[ProcessInfo]:
  """``initialize_from_env`` when the environment names more than one
  process (``python -m fastpbrl.launch``, or a SLURM step of several
  tasks), else nothing (None): a one-task SLURM job stays one plain
  process. What ``fastpbrl <rule>`` and ``fastpbrl.train`` call first."""
  settings = settings_from_env(env)
  if settings is None or settings['num_processes'] < 2:
    return None
  return initialize_from_env(env)


def global_population_mesh(devices: Optional[Sequence[jax.Device]] = None
                           ) -> Mesh:
  """The population mesh (``sharding.make_mesh``) over every process's
  devices (default ``jax.devices()``: process 0's first, so process ``p``
  owns a contiguous block of members)."""
  return sharding.make_mesh(jax.devices() if devices is None else devices)


def member_rows(mesh: Mesh, population_size: int,
                process_index: Optional[int] = None) -> np.ndarray:
  """The member rows whose devices in ``mesh`` belong to a process (this
  one by default), ascending: ``population_size / D`` rows per device, in
  the mesh's device order.

  Raises:
    ValueError: the population does not split evenly over the mesh's
      devices, or the process's rows are not one contiguous block (a
      device order that interleaves processes).
  """
  devices = list(mesh.devices.flat)
  d = len(devices)
  if population_size < 1 or population_size % d:
    raise ValueError(f'a population of {population_size} does not split '
                     f'evenly over {d} devices in {jax.process_count()} '
                     f'processes; use a multiple of {d}')
  p = jax.process_index() if process_index is None else process_index
  per = population_size // d
  rows = np.concatenate([np.arange(i * per, (i + 1) * per, dtype=np.int64)
                         for i, device in enumerate(devices)
                         if device.process_index == p] or
                        [np.zeros((0,), np.int64)])
  if rows.size and not np.array_equal(rows, np.arange(rows[0], rows[-1] + 1)):
    raise ValueError(f'process {p} owns rows {rows.tolist()}, not one block: '
                     'order the mesh devices by process (jax.devices())')
  return rows


def local_members(population_size: int, mesh: Optional[Mesh] = None
                  ) -> slice:
  """The contiguous block of members this process owns, as a slice of the
  population axis (``mesh`` defaults to ``global_population_mesh()``)."""
  rows = member_rows(mesh or global_population_mesh(), population_size)
  if not rows.size:
    return slice(0, 0)
  return slice(int(rows[0]), int(rows[-1]) + 1)


def to_global(local_tree: Any, mesh: Mesh, population_size: int,
              per_member: Any = None) -> Any:
  """Global ``jax.Array``s from each process's local rows.

  Every process calls it with its own rows
  (``jax.make_array_from_process_local_data``): a per-member leaf has this
  process's ``local_members`` rows on its leading axis and becomes a
  ``[population_size, ...]`` array split over the mesh; any other leaf (a
  shared critic, a step counter, a rule key) must hold the same value in
  every process and becomes replicated.

  Args:
    local_tree: this process's rows (numpy or jax arrays).
    mesh: the global population mesh.
    population_size: members in the whole population.
    per_member: a tree of bools (``local_tree``'s structure) saying which
      leaves are per member; default: those whose leading size is this
      process's number of rows.
  """
  local_count = len(member_rows(mesh, population_size))
  if per_member is None:
    per_member = jax.tree.map(
        lambda x: bool(np.ndim(x)) and np.shape(x)[0] == local_count,
        local_tree)
  targets = sharding.shardings(local_tree, mesh, per_member=per_member)

  def build(x, target: NamedSharding):
    x = np.asarray(x)
    shape = x.shape
    if target.spec:
      if shape[0] != local_count:
        raise ValueError(f'a per-member leaf has {shape[0]} local rows, '
                         f'expected {local_count} (this process\'s members '
                         f'of {population_size})')
      shape = (population_size,) + shape[1:]
    return jax.make_array_from_process_local_data(target, x, shape)

  return jax.tree.map(build, local_tree, targets)


def to_local(global_tree: Any) -> Any:
  """Numpy copies of this process's rows of every leaf of ``global_tree``:
  a leaf split over the population axis gives the ``local_members`` block,
  a replicated one its whole value."""

  def read(x: jax.Array) -> np.ndarray:
    parts = [np.asarray(data) for data in _local_blocks(x)]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)

  return jax.tree.map(read, global_tree)


def _local_blocks(x: jax.Array) -> list:
  """The single-device arrays holding this process's rows of ``x``, in row
  order, one per distinct block (replicas of a block counted once)."""
  shards = {}
  for shard in x.addressable_shards:
    start = shard.index[0].start if shard.index else None
    shards.setdefault(start or 0, shard)
  return [shards[k].data for k in sorted(shards)]


def allgather_host(x: Any) -> Any:
  """Numpy values from every process, stacked on a new leading axis
  (``[num_processes, ...]``; each process must give the same shapes). A
  global ``jax.Array`` gives its whole value instead
  (``multihost_utils.process_allgather``). Every process must call it."""
  return multihost_utils.process_allgather(x)


def allgather_members(local_values: Any, mesh: Mesh,
                      population_size: int) -> Any:
  """``[population_size, ...]`` numpy values assembled from each process's
  ``[local rows, ...]`` (per-member host values, e.g. the fitness each
  process measured for its own members), identical in every process.
  Every process must call it."""
  rows = member_rows(mesh, population_size)
  gathered_rows = allgather_host(rows)  # [P, local]

  def assemble(x):
    x = np.asarray(x)
    if x.shape[:1] != rows.shape:
      raise ValueError(f'local values have leading size {x.shape[:1]}, '
                       f'expected {len(rows)} (this process\'s members)')
    gathered = allgather_host(x)  # [P, local, ...]
    out = np.empty((population_size,) + x.shape[1:], x.dtype)
    out[gathered_rows.reshape(-1)] = gathered.reshape((-1,) + x.shape[1:])
    return out

  return jax.tree.map(assemble, local_values)


# The episode fields ``Processes.episodes`` gathers, in this order (numbers:
# float64 holds the integer fields exactly).
_EPISODE_FIELDS = ('member', 'episode_return', 'episode_length', 'evaluation',
                   'env_steps', 'policy_version', 'start_policy_version',
                   'true_objective')


class Processes:
  """The run loop's view of the processes a run spans (host-side).

  With one process (``count == 1``) every method is the identity, so the
  single-process loop is unchanged. With several (multi-process JAX), this
  process owns the members ``local`` (a contiguous block of the
  population): its actors and its replay hold only those, and the methods
  turn its rows into global arrays and gather, from every process, the
  host values each rule decision needs, so every process takes the same
  decision. Every process must call each method at the same point of the
  loop (they are collectives).
  """

  def __init__(self, mesh: Optional[Mesh], population_size: int):
    self.count = jax.process_count()
    self.index = jax.process_index()
    self.mesh = mesh
    self.population_size = population_size
    if self.count > 1:
      if mesh is None or len(mesh.devices.flat) != len(jax.devices()):
        raise ValueError('a run over several processes needs the population '
                         'mesh over every process\'s devices')
      self.local = local_members(population_size, mesh)
    else:
      self.local = slice(0, population_size)

  @property
  def several(self) -> bool:
    return self.count > 1

  @property
  def main(self) -> bool:
    """Process 0: the one that writes the run's logs and prints."""
    return self.index == 0

  @property
  def local_count(self) -> int:
    return self.local.stop - self.local.start

  def global_rows(self, local_tree: Any) -> Any:
    """Global arrays from this process's rows (every leaf per member)."""
    if not self.several:
      return local_tree
    return to_global(local_tree, self.mesh, self.population_size,
                     per_member=jax.tree.map(lambda _: True, local_tree))

  def local_view(self, tree: Any) -> Any:
    """This process's rows of per-member global arrays, as arrays on its
    first local device: no wait for the computation that produces them
    (what ``Pipeline.publish_async`` copies to the host in the
    background)."""
    if not self.several:
      return tree
    first = jax.local_devices()[0]

    def view(x):
      parts = [jax.device_put(data, first) for data in _local_blocks(x)]
      return parts[0] if len(parts) == 1 else jax.numpy.concatenate(parts)

    return jax.tree.map(view, tree)

  def local_indices(self, mask: np.ndarray) -> np.ndarray:
    """This process's row numbers (from 0) of the members ``mask`` (``[N]``
    bool) flags, for its pipeline."""
    members = np.flatnonzero(mask)
    mine = members[(members >= self.local.start) & (members < self.local.stop)]
    return mine - self.local.start

  def local_pairs(self, members, sources) -> tuple[np.ndarray, np.ndarray]:
    """The pairs whose member is this process's, both numbered from its
    first member: a source held by another process falls outside
    ``[0, local_count)``. A host replay refuses such a pair (its rings
    hold only this process's members); the device rings of a JAX env,
    global arrays, copy it (``DevicePipeline.copy_member_data``)."""
    members, sources = np.asarray(members), np.asarray(sources)
    mine = (members >= self.local.start) & (members < self.local.stop)
    return members[mine] - self.local.start, sources[mine] - self.local.start

  def host(self, tree: Any) -> Any:
    """The whole values of ``tree``'s leaves as numpy, in every process."""
    return jax.tree.map(sharding.whole_value, tree)

  def members(self, local_values: Any) -> Any:
    """``[N, ...]`` numpy from every process's ``[local rows, ...]``."""
    if not self.several:
      return jax.tree.map(np.asarray, local_values)
    return allgather_members(local_values, self.mesh, self.population_size)

  def any(self, flag: bool) -> bool:
    """True in every process if ``flag`` is True in any."""
    return self.agree(flag, 0)[0]

  def agree(self, flag: bool, value: int) -> tuple[bool, int]:
    """``(any process's flag, the least value)`` in one gather."""
    if not self.several:
      return bool(flag), int(value)
    both = allgather_host(np.asarray([int(bool(flag)), int(value)], np.int64))
    return bool(both[:, 0].any()), int(both[:, 1].min())

  def episodes(self, records: Sequence[Any]) -> list:
    """Every process's episode records (member indices made global),
    process 0's first: the same list, in the same order, in every
    process."""
    if not self.several:
      return [episode_record(r) for r in records]
    rows = np.asarray([[float(r[f]) for f in _EPISODE_FIELDS]
                       for r in records], np.float64).reshape(
                           len(records), len(_EPISODE_FIELDS))
    rows[:, 0] += self.local.start
    counts = allgather_host(np.asarray([len(rows)], np.int64))[:, 0]
    padded = np.zeros((max(int(counts.max()), 1), len(_EPISODE_FIELDS)))
    padded[:len(rows)] = rows
    gathered = allgather_host(padded)
    out = []
    for p, count in enumerate(counts):
      for row in gathered[p, :count]:
        out.append(EpisodeRecord(
            member=int(row[0]), episode_return=float(row[1]),
            episode_length=int(row[2]), evaluation=bool(row[3]),
            env_steps=int(row[4]), policy_version=int(row[5]),
            start_policy_version=int(row[6]), true_objective=float(row[7])))
    return out

  def gather_text(self, text: str) -> list[str]:
    """Every process's ``text``, process 0's first (e.g. the sizes of the
    logs each writes, for a checkpoint)."""
    if not self.several:
      return [text]
    raw = np.frombuffer(text.encode(), np.uint8)
    sizes = allgather_host(np.asarray([raw.size], np.int64))[:, 0]
    padded = np.zeros((max(int(sizes.max()), 1),), np.uint8)
    padded[:raw.size] = raw
    gathered = allgather_host(padded)
    return [bytes(row[:size]).decode() for row, size in zip(gathered, sizes)]

  def broadcast_text(self, text: str, limit: int = 4096) -> str:
    """Process 0's ``text`` in every process (a run folder's path)."""
    if not self.several:
      return text
    data = np.zeros((limit,), np.uint8)
    if self.main:
      raw = text.encode()
      if len(raw) > limit:
        raise ValueError(f'{text!r} is longer than {limit} bytes')
      data[:len(raw)] = np.frombuffer(raw, np.uint8)
    data = np.asarray(multihost_utils.broadcast_one_to_all(data))
    return bytes(data).rstrip(b'\0').decode()
