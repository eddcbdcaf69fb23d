"""The population sharded over devices (``jax.sharding``; host-side helpers).

One program over a one-axis ``Mesh`` whose axis is the population
(``POPULATION_AXIS``, the name the learner's ``vmap`` binds too): every
leaf with a population axis is placed ``NamedSharding(mesh, P('population'))``
(member ``i`` of ``N`` lives on device ``i // (N / D)``), every leaf without
one (a shared critic, a scalar step counter, a rule key) is replicated. The
learner's jitted step is then partitioned by XLA (GSPMD) from these input
shardings: independent members need no communication, and the collectives a
population-wide operation needs (the shared critic's mean over members, a
PBT copy of member ``j`` into member ``i`` on another device, ``pmax`` in
``any_member``) are inserted by XLA. No per-device Python loop, no
``pmap``.

The learners (``fastpbrl.learner.population``) take the mesh and pin their outputs to
these shardings (``with_sharding_constraint`` inside the jitted functions),
so the donated state stays sharded call after call.

``whole_value`` reads an array back to the host whole, when the mesh spans
several processes too (``fastpbrl.devices.distributed``); ``placed_like`` puts a
whole host value back, as the array it replaces was placed; and
``process_zero_value`` hands every process process 0's host value.
``choose_devices`` implements the run flag ``--devices``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from fastpbrl.core.types import POPULATION_AXIS

log = logging.getLogger('fastpbrl')

DEVICES_CHOICES = "'auto' or a positive integer"


def make_mesh(devices: Sequence[jax.Device]) -> Mesh:
  """A one-axis mesh named ``POPULATION_AXIS`` over ``devices``."""
  if not devices:
    raise ValueError('make_mesh needs at least one device')
  return Mesh(np.asarray(list(devices)), (POPULATION_AXIS,))


def population_sharding(mesh: Mesh) -> NamedSharding:
  """The leading (population) axis split over the mesh, the rest whole."""
  return NamedSharding(mesh, PartitionSpec(POPULATION_AXIS))


def replicated(mesh: Mesh) -> NamedSharding:
  """A whole copy on every device of the mesh."""
  return NamedSharding(mesh, PartitionSpec())


def num_devices(mesh: Optional[Mesh]) -> int:
  return 1 if mesh is None else mesh.devices.size


def _has_population_axis(x, population_size: Optional[int]) -> bool:
  shape = np.shape(x)
  if not shape:
    return False
  return population_size is None or shape[0] == population_size


def shardings(tree: Any, mesh: Mesh, population_size: Optional[int] = None,
              per_member: Any = None) -> Any:
  """The ``NamedSharding`` of every leaf of ``tree``.

  A leaf gets ``population_sharding`` if it has a population axis,
  ``replicated`` otherwise. Which leaves have one: ``per_member`` (a tree
  of bools with ``tree``'s structure) when given; else every leaf of rank
  >= 1 whose leading size is ``population_size`` (every leaf of rank >= 1
  when that is None). Scalars (a step counter, a typed key) are replicated.
  """
  pop, rep = population_sharding(mesh), replicated(mesh)
  if per_member is not None:
    return jax.tree.map(lambda _, m: pop if m else rep, tree, per_member)
  return jax.tree.map(
      lambda x: pop if _has_population_axis(x, population_size) else rep, tree)


def shard_population(tree: Any, mesh: Mesh,
                     population_size: Optional[int] = None,
                     per_member: Any = None) -> Any:
  """``tree`` placed on ``mesh``: leading population axes split over its
  devices, the other leaves replicated (``shardings`` says which is which).
  A leaf already placed that way is returned as it is (no copy)."""
  targets = shardings(tree, mesh, population_size, per_member)
  n = num_devices(mesh)

  def place(x, target):
    if getattr(x, 'sharding', None) == target:
      return x
    if target.spec and np.shape(x)[0] % n:
      raise ValueError(
          f'a leaf of shape {np.shape(x)} cannot be split over {n} devices: '
          f'its population axis {np.shape(x)[0]} is not a multiple of {n}')
    return jax.device_put(x, target)

  return jax.tree.map(place, tree, targets)


def is_sharded_as(tree: Any, mesh: Mesh, population_size: Optional[int] = None,
                  per_member: Any = None) -> bool:
  """Every leaf of ``tree`` is a ``jax.Array`` placed as ``shardings``
  says (checked without moving anything)."""
  targets = jax.tree.leaves(shardings(tree, mesh, population_size, per_member))
  return all(isinstance(x, jax.Array) and x.sharding == t
             for x, t in zip(jax.tree.leaves(tree), targets))


def constrain(tree: Any, mesh: Mesh, population_size: Optional[int] = None,
              per_member: Any = None) -> Any:
  """Inside a jitted function: pins ``tree``'s leaves to ``shardings``, so
  the compiled function returns them placed that way."""
  return jax.lax.with_sharding_constraint(
      tree, shardings(tree, mesh, population_size, per_member))


def whole_value(x: Any) -> np.ndarray:
  """The whole value of a global array as numpy, in every process (a
  gather across processes when it is not all here: every process must
  call it then). Host-side."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)


def placed_like(value: np.ndarray, like: jax.Array) -> jax.Array:
  """``value`` (numpy, ``like``'s shape, its own dtype), the whole host
  value, placed with ``like``'s sharding, which may span several
  processes: each process places its own rows of it (every process must
  pass the same value)."""
  value = np.asarray(value)
  if value.shape != like.shape:
    raise ValueError(f'value of shape {value.shape} placed like an array of '
                     f'shape {like.shape}')
  return jax.make_array_from_callback(value.shape, like.sharding,
                                      lambda index: value[index])


def process_zero_value(x: Any) -> Any:
  """Process 0's value of the host tree ``x`` (numpy leaves), in every
  process; ``x`` itself in a single-process run. A host computation that
  may round differently on another machine (an optimizer in float64) is
  made one decision this way. Every process must call it."""
  if jax.process_count() == 1:
    return x
  return jax.tree.map(np.asarray, multihost_utils.broadcast_one_to_all(x))


def choose_devices(requested: Any, population_size: int,
                   devices: Optional[Sequence[jax.Device]] = None
                   ) -> list[jax.Device]:
  """The devices the flag ``--devices`` asks for.

  Args:
    requested: ``'auto'`` (every visible device when ``population_size``
      is a multiple of their count, else one device, logging why) or a
      positive integer ``k`` (an int or its string): the first ``k``
      devices.
    population_size: members to split; each device gets as many.
    devices: the visible devices (default ``jax.devices()``).

  Raises:
    ValueError: one line naming ``--devices`` for a value that is not
      allowed, more devices than visible, or a population that does not
      split evenly.
  """
  k = parse_devices(requested, population_size)
  devices = list(jax.devices() if devices is None else devices)
  if k == 'auto':
    if population_size % len(devices) == 0:
      return devices
    log.info('--devices auto: population of %d is not a multiple of the %d '
             'visible devices; using 1 device', population_size, len(devices))
    return devices[:1]
  if k > len(devices):
    raise ValueError(f'--devices {k} exceeds the {len(devices)} visible '
                     f'{devices[0].platform} devices; use at most '
                     f'{len(devices)} or auto')
  return devices[:k]


def parse_devices(requested: Any, population_size: int) -> Any:
  """``'auto'`` or the int ``--devices`` asks for, checked against the
  population without looking at the devices (``ValueError`` naming the
  flag)."""
  if isinstance(requested, str) and requested.strip().lower() == 'auto':
    return 'auto'
  try:
    if isinstance(requested, (bool, float)):
      raise ValueError
    k = int(requested)
  except (TypeError, ValueError):
    raise ValueError(f'--devices must be {DEVICES_CHOICES}, got '
                     f'{requested!r}') from None
  if k < 1:
    raise ValueError(f'--devices must be {DEVICES_CHOICES}, got {k}')
  if population_size % k:
    raise ValueError(f'--devices {k} does not divide --population-size '
                     f'{population_size} evenly; use a divisor of it or auto')
  return k


def describe(mesh: Optional[Mesh], population_size: int) -> str:
  """``'population of N over D devices: ...'``, for the run's log."""
  if mesh is None:
    device = jax.devices()[0]
    return (f'population of {population_size} over 1 device: {device} '
            '(not sharded)')
  d, per = num_devices(mesh), population_size // num_devices(mesh)
  return (f'population of {population_size} over {d} device'
          f'{"s" if d > 1 else ""}: {per} member{"s" if per > 1 else ""} '
          'each on ' + ', '.join(str(x) for x in mesh.devices.flat))
