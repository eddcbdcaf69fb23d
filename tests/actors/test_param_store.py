"""The shared-memory param store: round trips, the seqlock's cases, and a
writer racing reader processes without a single torn read."""

import multiprocessing as mp
import os
import time
from typing import NamedTuple

import numpy as np
import pytest

from fastpbrl.actors import ParamStore
from fastpbrl.actors import param_store as ps


class HParams(NamedTuple):
  noise: np.ndarray
  lr: np.ndarray


def make_tree(n: int, value: float, width: int = 8):
  params = {'linear': {'w': np.full((n, width, width), value, np.float32),
                       'b': np.full((n, width), value, np.float32)},
            'count': np.full((n,), value, np.int64)}
  return params, HParams(np.full((n,), value, np.float32),
                         np.full((n,), value, np.float64))


def per_member_tree(n: int, width: int = 4):
  """Member i's leaves hold i (to check which rows a read returns)."""
  ids = np.arange(n, dtype=np.float32)
  params = {'w': np.broadcast_to(ids[:, None, None], (n, width, 3)).copy(),
            'b': ids.copy()}
  return params, HParams(ids * 10, ids.astype(np.float64) * 100)


def test_round_trip_all_and_some_members():
  tree = per_member_tree(5)
  with ParamStore.create(tree) as store:
    assert store.version == 0 and store.read() is None
    assert store.write(tree) == 1
    version, got = store.read()
    assert version == 1
    np.testing.assert_array_equal(got[0]['w'], tree[0]['w'])
    assert isinstance(got[1], HParams)
    assert got[1].lr.dtype == np.float64
    np.testing.assert_array_equal(got[1].lr, tree[1].lr)
    _, some = store.read(slice(1, 3))
    np.testing.assert_array_equal(some[0]['b'], [1, 2])
    np.testing.assert_array_equal(some[1].noise, [10, 20])
    _, picked = store.read([4, 0])
    np.testing.assert_array_equal(picked[0]['w'][:, 0, 0], [4, 0])
    # A new version replaces the old one.
    tree2 = (tree[0], tree[1]._replace(noise=tree[1].noise + 1))
    assert store.write(tree2) == 2
    version, got = store.read([3])
    assert version == 2 and got[1].noise.tolist() == [31]
    # Readers get copies, not views of shared memory.
    got[1].noise[:] = -1
    assert store.read([3])[1][1].noise.tolist() == [31]


def test_attached_reader_sees_the_writers_versions():
  tree = make_tree(3, 1.0)
  with ParamStore.create(tree) as writer:
    reader = ParamStore.attach(writer.handle)
    try:
      assert reader.read() is None
      writer.write(make_tree(3, 7.0))
      version, got = reader.read()
      assert version == 1 and (got[0]['linear']['w'] == 7).all()
    finally:
      reader.close()


def test_segment_is_unlinked_on_close():
  store = ParamStore.create(make_tree(2, 0.0))
  name = store.handle.name
  assert os.path.exists(f'/dev/shm/{name}')
  assert name.startswith(f'fpbrl_{os.getpid()}_')
  store.close()
  assert not os.path.exists(f'/dev/shm/{name}')
  with pytest.raises(FileNotFoundError):
    ParamStore.attach(store.handle)


def test_write_validation():
  with ParamStore.create(make_tree(2, 0.0)) as store:
    with pytest.raises(ValueError, match='structure'):
      store.write({'other': np.zeros(2)})
    bad = make_tree(3, 0.0)
    with pytest.raises(ValueError, match=r'shape \(3,'):
      store.write(bad)
  with pytest.raises(ValueError, match='leading population axis'):
    ParamStore.create({'x': np.float32(1.0)})
  with pytest.raises(ValueError, match='different leading'):
    ParamStore.create({'x': np.zeros(2), 'y': np.zeros(3)})


def test_reader_ignores_a_version_being_written():
  tree = make_tree(2, 1.0)
  with ParamStore.create(tree) as store:
    store.write(tree)  # version 1 in slot 1
    # The writer is half-way through version 2 (slot 0): counter odd, data
    # partly new. Readers keep getting version 1, whole.
    header = store._header
    header[ps._SEQ + 0] += 1
    store._leaf_views[0][0][:1] = 99.0
    version, got = store.read()
    assert version == 1
    assert (got[0]['count'] == 1).all()
    assert (got[0]['linear']['b'] == 1).all()


def test_an_exception_mid_write_leaves_the_store_usable(monkeypatch):
  """A write interrupted between its two counter increments (here: the
  second leaf's copy raises) must not flip the seqlock's odd/even meaning:
  readers keep the previous version, whole, and the next write works."""
  with ParamStore.create(make_tree(2, 0.0)) as store:
    store.write(make_tree(2, 1.0))
    real_copyto, calls = np.copyto, []

    def failing_copyto(dst, src, **kwargs):
      calls.append(1)
      if len(calls) == 2:  # after the first leaf of the new version landed
        raise KeyboardInterrupt('signal mid-write')
      return real_copyto(dst, src, **kwargs)

    monkeypatch.setattr(ps.np, 'copyto', failing_copyto)
    with pytest.raises(KeyboardInterrupt):
      store.write(make_tree(2, 2.0))
    monkeypatch.setattr(ps.np, 'copyto', real_copyto)
    assert all(int(store._header[ps._SEQ + s]) % 2 == 0 for s in (0, 1))
    version, got = store.read(timeout=0.5)
    assert version == 1
    assert all((leaf == 1).all() for leaf in jax_leaves(got))
    assert store.write(make_tree(2, 3.0)) == 2
    version, got = store.read(timeout=0.5)
    assert version == 2
    assert all((leaf == 3).all() for leaf in jax_leaves(got))


def test_reader_retries_while_its_slot_is_rewritten():
  tree = make_tree(2, 1.0)
  with ParamStore.create(tree) as store:
    store.write(tree)
    # A writer two versions ahead is rewriting the slot of the latest
    # version: no consistent copy exists, so the read must not return.
    store._header[ps._SEQ + 1] += 1
    start = time.monotonic()
    with pytest.raises(TimeoutError, match='no consistent read'):
      store.read(timeout=0.1)
    assert time.monotonic() - start >= 0.1
    store._header[ps._SEQ + 1] += 1  # the writer finished
    assert store.read()[0] == 1


# ----------------------------------------------------- racing processes
# Every leaf of version v holds v everywhere, so a torn read shows up as a
# tree whose values are not all equal to the version it was read as.

RACE_WIDTH = 256  # 256 KiB per member and slot: copies take a while


def _race_writer(handle, stop, ready):
  store = ParamStore.attach(handle)
  try:
    ready.wait()
    n = handle.num_members
    end = time.monotonic() + RACE_DEADLINE_S
    v = store.version
    while not stop.is_set() and time.monotonic() < end:
      v += 1
      store.write(make_tree(n, float(v), RACE_WIDTH))
  finally:
    store.close()


def _race_reader(handle, ready, results):
  """Reads until it has RACE_READS reads of RACE_VERSIONS distinct versions
  (a count, not a duration: on a busy machine it only takes longer)."""
  store = ParamStore.attach(handle)
  torn = reads = 0
  versions = set()
  try:
    ready.wait()
    end = time.monotonic() + RACE_DEADLINE_S
    while ((reads < RACE_READS or len(versions) < RACE_VERSIONS)
           and time.monotonic() < end):
      members = slice(1, 3) if reads % 2 else None
      version, tree = store.read(members, timeout=RACE_DEADLINE_S)
      values = np.concatenate([np.ravel(x).astype(np.float64)
                               for x in jax_leaves(tree)])
      if not (values == version).all():
        torn += 1
      reads += 1
      versions.add(version)
  finally:
    store.close()
  results.put((torn, reads, len(versions)))


RACE_READS, RACE_VERSIONS, RACE_DEADLINE_S = 200, 20, 120.0


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


@pytest.mark.slow
def test_no_torn_reads_under_a_racing_writer():
  n = 4
  ctx = mp.get_context('spawn')
  tree = make_tree(n, 1.0, RACE_WIDTH)
  with ParamStore.create(tree) as store:
    store.write(tree)
    ready, stop = ctx.Event(), ctx.Event()
    results = ctx.Queue()
    procs = [ctx.Process(target=_race_writer,
                         args=(store.handle, stop, ready))]
    procs += [ctx.Process(target=_race_reader,
                          args=(store.handle, ready, results))
              for _ in range(2)]
    for p in procs:
      p.start()
    try:
      ready.set()
      outcomes = [results.get(timeout=RACE_DEADLINE_S + 60)
                  for _ in range(2)]
    finally:
      stop.set()
      for p in procs:
        p.join(60)
        if p.is_alive():
          p.kill()
    assert all(p.exitcode == 0 for p in procs)
    assert store.writes > 50  # the writer really raced the readers
  for torn, reads, distinct in outcomes:
    assert torn == 0
    assert reads >= RACE_READS and distinct >= RACE_VERSIONS
