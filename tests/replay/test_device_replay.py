"""Device replay: the same rows as the numpy rings after the same inserts
(pure ``insert`` and the staged ``DeviceReplay``), uniform in-range sampling,
clear and copy_members against the numpy versions, checkpoints interchangeable
with the numpy replay, bounded compilations, and the staging bound."""

import threading
import time

import jax
import numpy as np
import pytest

from fastpbrl.replay import PerMemberReplay, SharedReplay
from fastpbrl.replay import device
from fastpbrl.replay.device import DeviceReplay, choose_replay_location
from tests.replay.test_replay_buffers import chunk, fields

N, CAP = 3, 10
NUMPY = {'per_member': PerMemberReplay, 'shared': SharedReplay}

# (members, T, num_steps): partial steps, wrap-around, more than a ring holds.
INSERTS = [([0, 2], 7, 5), ([1], 4, 4), ([2, 0, 1], 6, 6), ([0], 13, 12),
           ([1, 2], 5, 0), ([2], 9, 3), ([0, 1, 2], 4, 2)]


def run_inserts(replays, flush_every=None):
  """Applies INSERTS (distinct transition ids) to every replay, flushing
  device replays after every ``flush_every``-th insert."""
  next_id = 0
  for i, (members, t, steps) in enumerate(INSERTS):
    ids = next_id + np.arange(len(members) * t).reshape(len(members), t)
    next_id += ids.size
    for r in replays:
      r.insert(members, chunk(ids), steps)
    if flush_every and i % flush_every == 0:
      for r in replays:
        if isinstance(r, DeviceReplay):
          r.flush()


def valid_rows(layout, state_dict):
  """field -> per member list of its valid rows (or the shared ring's)."""
  size = np.asarray(state_dict['size'])
  if layout == 'shared':
    return {k: [v[:int(size)]] for k, v in state_dict['data'].items()}
  return {k: [v[i, :size[i]] for i in range(len(size))]
          for k, v in state_dict['data'].items()}


def assert_same(layout, expected, actual):
  for name in ('pos', 'size', 'inserted'):
    np.testing.assert_array_equal(np.asarray(actual[name]),
                                  np.asarray(expected[name]), err_msg=name)
  a, e = valid_rows(layout, actual), valid_rows(layout, expected)
  for k in e:
    for i, (x, y) in enumerate(zip(a[k], e[k])):
      np.testing.assert_array_equal(x, y, err_msg=f'{k} ring {i}')


def pure_state_dict(state, inserted):
  size = np.asarray(state.size)
  rows = int(size.max())
  cut = (lambda v: np.asarray(v)[:, :rows]) if size.ndim else (
      lambda v: np.asarray(v)[:rows])
  return {'data': {k: cut(v) for k, v in state.data.items()},
          'pos': np.asarray(state.pos), 'size': size, 'inserted': inserted}


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
@pytest.mark.parametrize('flush_every', [None, 1, 3])
def test_staged_inserts_hold_what_the_numpy_replay_holds(layout, flush_every):
  host = NUMPY[layout](fields(), N, CAP)
  dev = DeviceReplay(layout, fields(), N, CAP)
  run_inserts([host, dev], flush_every)
  np.testing.assert_array_equal(dev.sizes(), host.sizes())  # before a flush
  dev.flush()
  assert dev.staged() == 0
  np.testing.assert_array_equal(np.asarray(dev.state.size),
                                np.asarray(dev.state_dict()['size']))
  assert_same(layout, host.state_dict(), dev.state_dict())


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_pure_jitted_insert_matches_numpy_with_one_compilation(layout):
  host = NUMPY[layout](fields(), N, CAP)
  traces = []

  def traced(state, members, c, steps):
    traces.append(1)
    return device.insert(state, members, c, steps)

  insert = jax.jit(traced)
  state = device.init_state(layout, host.fields, N, CAP)
  next_id = 0
  for members, t, steps in INSERTS:
    ids = next_id + np.arange(len(members) * t).reshape(len(members), t)
    next_id += ids.size
    host.insert(members, chunk(ids), steps)
    # Steps padded to T=16: the padding must never be written.
    padded = {k: np.zeros((len(members), 16, *v.shape[2:]), v.dtype)
              for k, v in chunk(ids).items()}
    for k, v in chunk(ids).items():
      padded[k][:, :t] = v
    state = insert(state, np.asarray(members, np.int32), padded,
                   np.int32(steps))
  assert_same(layout, host.state_dict(),
              pure_state_dict(state, host.inserted()))
  assert len(traces) == 3  # one per distinct M (1, 2, 3); num_steps traced


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_inserting_every_member_is_insert_of_all_members(layout):
  """``insert_every_member`` (a vmap over the rings) writes what
  ``insert`` with members 0..N-1 (explicit scatter indices) writes, bit
  for bit: partial steps, a wrap-around and more steps than a ring holds
  (T, num_steps as INSERTS)."""
  state = device.init_state(layout, fields(), N, CAP)
  both = [state, state]
  every = jax.jit(device.insert_every_member)
  explicit = jax.jit(device.insert)
  next_id = 0
  for t, steps in [(7, 5), (4, 4), (13, 12), (5, 0), (9, 3), (4, 2)]:
    ids = next_id + np.arange(N * t).reshape(N, t)
    next_id += ids.size
    both = [every(both[0], chunk(ids), np.int32(steps)),
            explicit(both[1], np.arange(N, dtype=np.int32), chunk(ids),
                     np.int32(steps))]
    jax.tree.map(np.testing.assert_array_equal, *both)
  assert int(np.max(np.asarray(both[0].size))) == CAP  # rings wrapped


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_sampled_rows_are_the_rows_at_the_sampled_indices(layout):
  dev = DeviceReplay(layout, fields(), N, CAP)
  run_inserts([dev])
  state = dev.flush()
  key = jax.random.PRNGKey(3)
  idx = np.asarray(device.sample_indices(state, key, 4, 5, num_members=N))
  batch = device.sample(state, key, 4, 5, num_members=N)
  assert idx.shape == (N, 4, 5)
  for k, field in zip(batch._fields, batch):
    data = np.asarray(state.data[k])
    expected = (data[np.arange(N)[:, None, None], idx]
                if layout == 'per_member' else data[idx])
    np.testing.assert_array_equal(np.asarray(field), expected, err_msg=k)


def test_per_member_indices_stay_in_each_ring_and_are_uniform():
  cap = 64
  sizes = [64, 20, 0, 1]  # full, partial, empty (inactive), one row
  dev = DeviceReplay('per_member', fields(), 4, cap)
  for m, s in enumerate(sizes):
    if s:
      dev.insert([m], chunk(np.arange(s)[None] + 1000 * m))
  state = dev.flush()
  inactive = np.array([False, False, True, False])
  idx = np.asarray(device.sample_indices(state, jax.random.PRNGKey(0), 50,
                                         200, inactive))
  for m, s in enumerate(sizes):
    assert idx[m].min() >= 0 and idx[m].max() < max(s, 1), m
  # The inactive, empty member draws an in-range row: no invalid gather.
  batch = device.sample(state, jax.random.PRNGKey(0), 50, 200, inactive)
  assert all(np.isfinite(np.asarray(x)).all() for x in batch)
  for m in (0, 1):
    counts = np.bincount(idx[m].ravel(), minlength=sizes[m])
    expected = idx[m].size / sizes[m]
    chi2 = ((counts - expected) ** 2 / expected).sum()
    dof = sizes[m] - 1
    # 8 sd (chi-square's is sqrt(2 dof)) over its mean: tail < 2e-7, fixed seed.
    assert chi2 < dof + 8 * np.sqrt(2 * dof), (m, chi2)
  # Members draw independently: different keys, different rows.
  assert not np.array_equal(idx[0, :, :20] % 20, idx[1, :, :20])


def test_shared_indices_cover_the_filled_rows_uniformly():
  dev = DeviceReplay('shared', fields(), 3, 64)
  dev.insert([0, 1], chunk(np.arange(40).reshape(2, 20)))
  state = dev.flush()
  idx = np.asarray(device.sample_indices(state, jax.random.PRNGKey(1), 50,
                                         100, num_members=3))
  assert idx.min() >= 0 and idx.max() < 40
  counts = np.bincount(idx.ravel(), minlength=40)
  expected = idx.size / 40
  # Chi-square, 39 dof: 8 sd (sqrt(2 x 39)) over its mean, tail < 2e-8.
  assert ((counts - expected) ** 2 / expected).sum() < 39 + 8 * np.sqrt(78)


def test_host_sample_raises_for_empty_active_members_like_numpy():
  dev = DeviceReplay('per_member', fields(), 2, CAP)
  dev.insert([0], chunk(np.arange(3)[None]))
  with pytest.raises(ValueError, match=r'members \[1\] have no transitions'):
    dev.sample(np.random.default_rng(0), 2, 3)
  batch = dev.sample(np.random.default_rng(0), 2, 3, inactive=[False, True])
  assert set(np.asarray(batch.reward)[0].ravel()) <= {0.0, 1.0, 2.0}


def test_clear_and_copy_members_match_numpy():
  host = PerMemberReplay(fields(), 4, CAP)
  dev = DeviceReplay('per_member', fields(), 4, CAP)
  for r in (host, dev):
    r.insert([0, 1, 2, 3], chunk(np.arange(4 * 7).reshape(4, 7)))
    r.insert([1, 3], chunk(100 + np.arange(2 * 6).reshape(2, 6)))
  dev.flush()
  for r in (host, dev):
    r.insert([2], chunk(200 + np.arange(5)[None]))  # staged, then cleared
    r.clear([2])
    r.insert([2], chunk(300 + np.arange(3)[None]))
  assert_same('per_member', host.state_dict(), dev.state_dict())
  for r in (host, dev):
    r.insert([0], chunk(400 + np.arange(2)[None]))  # staged before the copy
    r.copy_members([0, 1, 2], [1, 0, 3])  # 0 and 1 swap, 2 <- 3
    r.insert([0], chunk(500 + np.arange(4)[None]))  # staged after it
  assert_same('per_member', host.state_dict(), dev.state_dict())
  # The pure functions agree with the class.
  state = device.clear(dev.flush(), np.array([False, True, False, False]))
  assert np.asarray(state.size).tolist()[1] == 0


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_checkpoints_are_interchangeable_with_the_numpy_replay(layout):
  host = NUMPY[layout](fields(), N, CAP)
  run_inserts([host])
  dev = DeviceReplay(layout, fields(), N, CAP)
  dev.load_state_dict(host.state_dict())
  assert_same(layout, host.state_dict(), dev.state_dict())
  np.testing.assert_array_equal(dev.sizes(), host.sizes())
  # Both keep going alike, and the device state goes back into numpy.
  for r in (host, dev):
    r.insert([1, 2], chunk(900 + np.arange(2 * 4).reshape(2, 4)))
  back = NUMPY[layout](fields(), N, CAP)
  back.load_state_dict(dev.state_dict())
  assert_same(layout, host.state_dict(), back.state_dict())
  assert dev.state_rows(dev.state_dict()) == host.state_rows(host.state_dict())
  spec = dev.state_template(4)
  assert spec['data']['observation'].shape == host.state_template(4)[
      'data']['observation'].shape


def test_many_flushes_of_varying_sizes_compile_a_handful_of_times():
  dev = DeviceReplay('per_member', fields(), 4, 5000, min_bucket=64,
                     max_bucket_bytes=64 * 16 * 44, staging_rows=10_000,
                     insert_timeout_s=5)  # buckets 64, 256, 1024
  assert dev._buckets == [64, 256, 1024]
  rng = np.random.default_rng(0)
  host = PerMemberReplay(fields(), 4, 5000)
  next_id = 0
  for _ in range(25):
    for _ in range(rng.integers(1, 4)):
      t = int(rng.integers(1, 700))
      ids = next_id + np.arange(4 * t).reshape(4, t)
      next_id += ids.size
      for r in (host, dev):
        r.insert([0, 1, 2, 3], chunk(ids))
    dev.flush()
  assert dev.compilations <= 3
  assert_same('per_member', host.state_dict(), dev.state_dict())


def test_a_full_staging_area_blocks_the_inserter_until_a_flush():
  dev = DeviceReplay('per_member', fields(), 2, 100, staging_rows=8,
                     insert_timeout_s=30)
  dev.insert([0, 1], chunk(np.arange(8).reshape(2, 4)))
  done = threading.Event()

  def reader():
    dev.insert([0, 1], chunk(100 + np.arange(8).reshape(2, 4)))
    done.set()

  thread = threading.Thread(target=reader)
  thread.start()
  time.sleep(0.3)
  assert not done.is_set()  # held back, not dropped
  dev.flush()
  assert done.wait(10)
  thread.join()
  dev.flush()
  assert dev.sizes().tolist() == [8, 8]
  np.testing.assert_array_equal(np.asarray(dev.state.data['reward'])[0, :8],
                                [0, 1, 2, 3, 100, 101, 102, 103])
  # Without a flush, the blocked insert gives up and writes nothing.
  quick = DeviceReplay('per_member', fields(), 2, 100, staging_rows=8,
                       insert_timeout_s=0.2)
  quick.insert([0, 1], chunk(np.arange(8).reshape(2, 4)))
  with pytest.raises(TimeoutError, match='must call flush'):
    quick.insert([0], chunk(np.arange(4)[None]))
  assert quick.sizes().tolist() == [4, 4]
  # A chunk larger than the whole bound goes in alone.
  quick.flush()
  quick.insert([0, 1], chunk(np.arange(40).reshape(2, 20)))
  assert quick.sizes().tolist() == [24, 24]


def test_a_full_staging_area_compacts_rewritten_rows_before_blocking():
  dev = DeviceReplay('per_member', fields(), 1, 4, staging_rows=7,
                     insert_timeout_s=0.5)
  host = PerMemberReplay(fields(), 1, 4)
  for i in range(10):  # 30 rows into a ring of 4, never flushed
    for r in (dev, host):
      r.insert([0], chunk(10 * i + np.arange(3)[None]))
  assert dev.staged() <= 7  # never more than ring rows + one chunk
  assert_same('per_member', host.state_dict(), dev.state_dict())


def test_choose_replay_location():
  gib = 1 << 30
  assert choose_replay_location('auto', 'gpu', 10 * gib, 80 * gib)[0] == (
      'device')
  assert choose_replay_location('auto', 'gpu', 50 * gib, 80 * gib)[0] == 'host'
  assert choose_replay_location('auto', 'cpu', 1, 80 * gib)[0] == 'host'
  assert choose_replay_location('auto', 'tpu', 1, None)[0] == 'host'
  assert choose_replay_location('host', 'gpu', 1, 80 * gib)[0] == 'host'
  where, reason = choose_replay_location('device', 'cpu', 1, None)
  assert where == 'device' and 'requested' in reason
  with pytest.raises(ValueError, match='--replay-location'):
    choose_replay_location('device', 'gpu', 90 * gib, 80 * gib)
  with pytest.raises(ValueError, match='--replay-location'):
    choose_replay_location('gpu', 'gpu', 1, 80 * gib)
