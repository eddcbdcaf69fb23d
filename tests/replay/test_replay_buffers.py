"""Replay rings: wrap-around, per-member isolation, the shared layout,
vectorized sampling against a per-member loop, copying members, and inserts
racing samples."""

import threading

import jax
import numpy as np
import pytest
from acme import specs

from fastpbrl.core.types import Transition
from fastpbrl.replay import (PerMemberReplay, SharedReplay, make_replay,
                             transition_fields)
from fastpbrl.replay.buffers import Replay

OBS_DIM = 3


def fields():
  spec = specs.EnvironmentSpec(
      observations=specs.Array((OBS_DIM,), np.float32),
      actions=specs.BoundedArray((2,), np.float32, -1.0, 1.0),
      rewards=specs.Array((), np.float32),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0))
  return transition_fields(spec)


def chunk(ids: np.ndarray) -> dict:
  """A chunk whose every field encodes the transition id ``ids[m, t]``."""
  ids = np.asarray(ids, np.float32)
  return {
      'observation': np.repeat(ids[..., None], OBS_DIM, -1),
      'action': np.stack([ids, -ids], -1),
      'reward': ids.copy(),
      'next_observation': np.repeat(ids[..., None] + 0.5, OBS_DIM, -1),
      'terminated': (ids % 2 == 0).astype(np.float32),
      'truncated': (ids % 3 == 0).astype(np.float32),
  }


def assert_coherent(batch: Transition) -> np.ndarray:
  """Every sampled transition's fields come from one inserted transition."""
  ids = batch.reward
  np.testing.assert_array_equal(batch.observation,
                                np.repeat(ids[..., None], OBS_DIM, -1))
  np.testing.assert_array_equal(batch.next_observation,
                                batch.observation + 0.5)
  np.testing.assert_array_equal(batch.action[..., 0], ids)
  np.testing.assert_array_equal(batch.action[..., 1], -ids)
  np.testing.assert_array_equal(batch.terminated, ids % 2 == 0)
  np.testing.assert_array_equal(batch.truncated, ids % 3 == 0)
  return ids


def test_transition_fields_continuous_and_discrete():
  f = fields()
  assert list(f) == list(Transition._fields)
  assert f['observation'] == ((OBS_DIM,), np.float32)
  assert f['action'] == ((2,), np.float32)
  assert f['reward'] == ((), np.float32)
  discrete = transition_fields(specs.EnvironmentSpec(
      observations=specs.Array((84, 84, 4), np.uint8),
      actions=specs.DiscreteArray(18),
      rewards=specs.Array((), np.float32),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0)))
  assert discrete['observation'] == ((84, 84, 4), np.uint8)
  assert discrete['action'] == ((), np.int32)


def test_ring_wraps_around_and_keeps_the_newest():
  replay = PerMemberReplay(fields(), num_members=1, capacity=5)
  replay.insert([0], chunk([[1, 2, 3]]))
  assert replay.sizes().tolist() == [3]
  replay.insert([0], chunk([[4, 5, 6, 7]]))  # wraps: 6 and 7 overwrite 1, 2
  assert replay.sizes().tolist() == [5]
  assert replay.inserted().tolist() == [7]
  stored = replay._data['reward'][0]  # ring order, not insertion order
  np.testing.assert_array_equal(stored, [6, 7, 3, 4, 5])
  ids = assert_coherent(replay.sample(np.random.default_rng(0), 20, 50))
  assert set(np.unique(ids).tolist()) == {3, 4, 5, 6, 7}
  # A chunk longer than the ring keeps only its newest transitions.
  replay.insert([0], chunk([np.arange(100, 112)]))
  assert sorted(replay._data['reward'][0].tolist()) == list(range(107, 112))


def test_partial_chunk_inserts_only_num_steps():
  replay = PerMemberReplay(fields(), num_members=2, capacity=10)
  replay.insert([1, 0], chunk([[1, 2, 3], [4, 5, 6]]), num_steps=2)
  assert replay.sizes().tolist() == [2, 2]
  assert sorted(replay._data['reward'][1, :2].tolist()) == [1, 2]
  assert sorted(replay._data['reward'][0, :2].tolist()) == [4, 5]


def test_members_never_sample_each_others_data():
  n = 4
  replay = PerMemberReplay(fields(), num_members=n, capacity=64)
  rng = np.random.default_rng(1)
  for start in range(0, 200, 10):  # wraps several times, members interleaved
    order = rng.permutation(n)
    ids = order[:, None] * 1000 + start + np.arange(10)
    replay.insert(order, chunk(ids))
  batch = replay.sample(rng, num_steps=7, batch_size=33)
  assert batch.observation.shape == (n, 7, 33, OBS_DIM)
  assert batch.action.shape == (n, 7, 33, 2)
  assert batch.reward.shape == (n, 7, 33)
  ids = assert_coherent(batch)
  for i in range(n):
    assert ((ids[i] // 1000) == i).all()
    assert ids[i].min() % 1000 >= 200 - 64  # only what the ring still holds


def test_vectorized_sample_matches_a_per_member_loop():
  n, cap = 3, 50
  replay = PerMemberReplay(fields(), num_members=n, capacity=cap)
  replay.insert([0, 1, 2], chunk(np.arange(3)[:, None] * 100 + np.arange(40)))
  replay.insert([1], chunk([np.arange(1000, 1030)]))  # member 1 wraps
  batch = replay.sample(np.random.default_rng(7), 5, 11)
  # Same indices drawn independently, then gathered member by member.
  sizes = replay.sizes()
  rows = np.random.default_rng(7).integers(0, sizes[:, None, None],
                                           size=(n, 5, 11))
  for i in range(n):
    for name in Transition._fields:
      np.testing.assert_array_equal(getattr(batch, name)[i],
                                    replay._data[name][i][rows[i]])


def test_shared_layout_samples_across_everything_inserted():
  n = 3
  replay = SharedReplay(fields(), num_members=n, capacity=1000)
  replay.insert([0, 1], chunk([np.arange(0, 20), np.arange(100, 120)]))
  replay.insert([2], chunk([np.arange(200, 220)]))
  assert replay.sizes().tolist() == [60, 60, 60]
  assert replay.inserted().tolist() == [20, 20, 20]
  batch = replay.sample(np.random.default_rng(0), 10, 100)
  ids = assert_coherent(batch)
  inserted = set(range(0, 20)) | set(range(100, 120)) | set(range(200, 220))
  assert set(np.unique(ids).tolist()) <= inserted
  for i in range(n):  # every member's batch mixes every member's data
    assert set(np.unique(ids[i] // 100).tolist()) == {0, 1, 2}
  # Roughly uniform over the 60 transitions.
  counts = np.bincount(np.searchsorted(sorted(inserted), ids.ravel()),
                       minlength=60)
  # Each count is Binomial(3000, 1/60): mean 50, sd 7.0, so the bounds are
  # 3.5 sd either side (fixed seed; a row never drawn gives 0).
  assert counts.min() > 0.5 * counts.mean()
  assert counts.max() < 1.5 * counts.mean()


def test_shared_ring_wraps():
  replay = SharedReplay(fields(), num_members=2, capacity=8)
  replay.insert([0, 1], chunk([[1, 2, 3], [4, 5, 6]]))
  replay.insert([0, 1], chunk([[7, 8, 9], [10, 11, 12]]))
  assert replay.sizes().tolist() == [8, 8]
  ids = assert_coherent(replay.sample(np.random.default_rng(0), 10, 40))
  assert set(np.unique(ids).tolist()) == set(range(5, 13))


def test_copy_members_swaps_snapshots_and_keeps_env_step_counts():
  replay = PerMemberReplay(fields(), num_members=3, capacity=10)
  replay.insert([0], chunk([np.arange(0, 4)]))
  replay.insert([1], chunk([np.arange(100, 110)]))
  replay.insert([2], chunk([np.arange(200, 207)]))
  replay.copy_members([0, 1], [1, 0])  # swap
  assert replay.sizes().tolist() == [10, 4, 7]
  assert replay.inserted().tolist() == [4, 10, 7]
  ids = assert_coherent(replay.sample(np.random.default_rng(0), 10, 50))
  assert ((ids[0] >= 100) & (ids[0] < 110)).all()
  assert ((ids[1] >= 0) & (ids[1] < 4)).all()
  assert ((ids[2] >= 200) & (ids[2] < 207)).all()
  # The destination continues its ring from the source's position.
  replay.insert([1], chunk([[50]]))
  assert sorted(replay._data['reward'][1, :5].tolist()) == [0, 1, 2, 3, 50]
  replay.copy_members([2], [0])
  ids = replay.sample(np.random.default_rng(1), 4, 50).reward
  assert ((ids[2] >= 100) & (ids[2] < 110)).all()


def test_sampling_an_empty_member_names_it():
  replay = PerMemberReplay(fields(), num_members=3, capacity=10)
  replay.insert([0, 2], chunk([[1], [2]]))
  with pytest.raises(ValueError, match=r'members \[1\]'):
    replay.sample(np.random.default_rng(0), 1, 1)
  with pytest.raises(ValueError, match='no transitions'):
    SharedReplay(fields(), 2, 10).sample(np.random.default_rng(0), 1, 1)


@pytest.mark.parametrize('kwargs, message', [
    ({'num_members': 0}, 'num_members must be >= 1'),
    ({'capacity': 0}, 'capacity must be >= 1'),
])
def test_constructor_validation_names_the_parameter(kwargs, message):
  args = {'num_members': 2, 'capacity': 10, **kwargs}
  with pytest.raises(ValueError, match=message):
    PerMemberReplay(fields(), **args)


def test_insert_and_copy_validation():
  replay = PerMemberReplay(fields(), num_members=2, capacity=10)
  with pytest.raises(ValueError, match=r'members must be in \[0, 2\)'):
    replay.insert([2], chunk([[1]]))
  with pytest.raises(ValueError, match='distinct'):
    replay.insert([0, 0], chunk([[1], [2]]))
  with pytest.raises(ValueError, match='num_steps must be in'):
    replay.insert([0], chunk([[1]]), num_steps=2)
  with pytest.raises(ValueError, match='same length'):
    replay.copy_members([0], [0, 1])
  with pytest.raises(ValueError, match=r'src_indices must be in \[0, 2\)'):
    replay.copy_members([0], [5])
  with pytest.raises(ValueError, match='layout must be one of'):
    make_replay('ring', fields(), 2, 10)
  with pytest.raises(ValueError, match='batch_size must be >= 1'):
    replay.sample(np.random.default_rng(0), 1, 0)


def test_describe_reports_the_memory_for_the_env():
  replay = PerMemberReplay(fields(), num_members=4)  # default capacity 1e6
  # obs 3 float32 twice (24 B), action 2 float32 (8 B), 3 scalars (12 B).
  assert replay.capacity == 1_000_000
  assert replay.nbytes == 4 * 1_000_000 * 44
  text = replay.describe()
  assert '4 rings x 1,000,000 transitions x 44 B' in text
  assert '167.8 MiB' in text


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_inserts_racing_samples_never_yield_torn_transitions(layout):
  replay = make_replay(layout, fields(), num_members=2, capacity=256)
  replay.insert([0, 1], chunk(np.arange(2)[:, None] * 10**6 + np.arange(8)))
  stop = threading.Event()

  def insert():
    start = 8
    while not stop.is_set():
      ids = np.arange(2)[:, None] * 10**6 + start + np.arange(64)
      replay.insert([0, 1], chunk(ids))
      start += 64

  thread = threading.Thread(target=insert)
  thread.start()
  try:
    rng = np.random.default_rng(0)
    for _ in range(100):
      assert_coherent(replay.sample(rng, 4, 64))
  finally:
    stop.set()
    thread.join()


def write_during_the_gather(replay: Replay, write) -> list:
  """Makes the next sample's gather read the rings, then run ``write`` in
  another thread, which must finish while the gather is still in progress
  (so the sample holds no lock then), then tear every gathered entry the
  write changed (its reward no longer matches its other fields), as a
  gather racing that write could. Returns ``[entries torn]``."""
  torn = []
  gather = replay._gather

  def racing(arrays, rows):
    out = gather(arrays, rows)
    thread = threading.Thread(target=write)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), 'an insert waited on a sample in progress'
    changed = out['reward'] != np.take(arrays['reward'], rows, axis=0)
    out['reward'][changed] = -1.0
    torn.append(int(changed.sum()))
    return out

  replay._gather = racing
  return torn


def stored_ids(replay: Replay, member=None) -> set:
  data = replay._data['reward']
  return set((data if member is None else data[member]).ravel().tolist())


def test_a_sample_gathers_outside_the_lock_and_regathers_what_an_insert_rewrote():
  replay = PerMemberReplay(fields(), num_members=2, capacity=8)
  replay.insert([0, 1], chunk(np.arange(2)[:, None] * 100 + np.arange(8)))
  torn = write_during_the_gather(
      replay, lambda: replay.insert([0], chunk([[50, 51, 52]])))
  batch = replay.sample(np.random.default_rng(0), 4, 64)
  ids = assert_coherent(batch)
  assert torn[0] > 0  # the drawn rows 0-2 of member 0 were rewritten
  assert set(ids[0].ravel().tolist()) <= stored_ids(replay, 0)
  assert {50, 51, 52} & set(ids[0].ravel().tolist())
  assert set(ids[1].ravel().tolist()) == set(range(100, 108))


@pytest.mark.parametrize('change', ['clear', 'copy', 'load'])
def test_a_clear_copy_or_load_during_the_gather_regathers_the_member(change):
  replay = PerMemberReplay(fields(), num_members=2, capacity=8)
  replay.insert([0, 1], chunk(np.arange(2)[:, None] * 100 + np.arange(8)))
  other = PerMemberReplay(fields(), num_members=2, capacity=8)
  other.insert([0, 1], chunk(np.arange(2)[:, None] * 100 + 1000
                             + np.arange(8)))

  def write():
    if change == 'clear':  # a restart: its ring is refilled from row 0
      replay.clear([1])
      replay.insert([1], chunk([[70, 71]]))
    elif change == 'copy':
      replay.copy_members([1], [0])
    else:
      replay.load_state_dict(other.state_dict())

  torn = write_during_the_gather(replay, write)
  ids = assert_coherent(replay.sample(np.random.default_rng(0), 4, 64))
  assert torn[0] > 0
  for member in range(2):
    assert set(ids[member].ravel().tolist()) <= stored_ids(replay, member)
  if change == 'copy':
    assert set(ids[1].ravel().tolist()) <= set(range(8))


@pytest.mark.parametrize('change', ['insert', 'load'])
def test_the_shared_ring_regathers_what_changed_during_the_gather(change):
  replay = SharedReplay(fields(), num_members=2, capacity=16)
  replay.insert([0, 1], chunk(np.arange(2)[:, None] * 8 + np.arange(8)))
  other = SharedReplay(fields(), num_members=2, capacity=16)
  other.insert([0, 1], chunk(1000 + np.arange(2)[:, None] * 8
                             + np.arange(8)))
  write = ((lambda: replay.insert([0, 1], chunk([[90, 91, 92], [93, 94, 95]])))
           if change == 'insert' else
           (lambda: replay.load_state_dict(other.state_dict())))
  torn = write_during_the_gather(replay, write)
  ids = assert_coherent(replay.sample(np.random.default_rng(0), 4, 64))
  assert torn[0] > 0
  assert set(ids.ravel().tolist()) <= stored_ids(replay)


def test_sampling_draws_the_same_rows_as_before_for_a_seed():
  """Gathering outside the lock changes no draw: with no concurrent write,
  a seed gives the rows ``rng.integers`` gives, as before the change."""
  replay = PerMemberReplay(fields(), num_members=3, capacity=32)
  replay.insert([0, 1, 2], chunk(np.arange(3)[:, None] * 100
                                 + np.arange(20)))
  ids = assert_coherent(replay.sample(np.random.default_rng(7), 5, 16))
  rows = np.random.default_rng(7).integers(0, np.full((3, 1, 1), 20),
                                           size=(3, 5, 16))
  np.testing.assert_array_equal(ids, rows + np.arange(3)[:, None, None] * 100)


def test_clear_empties_a_members_ring_and_inactive_members_may_be_empty():
  from fastpbrl.replay.buffers import PerMemberReplay
  fields = {'observation': ((2,), np.float32), 'action': ((1,), np.float32),
            'reward': ((), np.float32), 'next_observation': ((2,), np.float32),
            'terminated': ((), np.float32), 'truncated': ((), np.float32)}
  replay = PerMemberReplay(fields, 3, capacity=10)
  chunk = {k: np.full((3, 4, *shape), 1.0, dtype)
           for k, (shape, dtype) in fields.items()}
  replay.insert([0, 1, 2], chunk)
  replay.clear([1])
  assert replay.sizes().tolist() == [4, 0, 4]
  assert replay.inserted().tolist() == [4, 4, 4]  # env steps still count
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match=r'members \[1\]'):
    replay.sample(rng, 2, 3)
  batch = replay.sample(rng, 2, 3, inactive=np.array([False, True, False]))
  assert batch.observation.shape == (3, 2, 3, 2)
  chunk2 = {k: np.full((1, 2, *shape), 7.0, dtype)
            for k, (shape, dtype) in fields.items()}
  replay.insert([1], chunk2)
  assert replay.sizes().tolist() == [4, 2, 4]
  batch = replay.sample(rng, 5, 8)
  assert (np.asarray(batch.reward)[1] == 7.0).all()  # only the new data


@pytest.mark.parametrize('layout', ['per_member', 'shared'])
def test_state_dict_round_trip_restores_what_sampling_sees(layout):
  fields = {'observation': ((3,), np.float32), 'action': ((2,), np.float32),
            'reward': ((), np.float32), 'next_observation': ((3,), np.float32),
            'terminated': ((), np.float32), 'truncated': ((), np.float32)}
  replay = make_replay(layout, fields, 3, capacity=50)
  rng = np.random.default_rng(0)
  for k in range(5):  # wraps the shared ring, not the per-member ones
    chunk = {name: rng.normal(size=(3, 8, *shape)).astype(dtype)
             for name, (shape, dtype) in fields.items()}
    replay.insert([0, 1, 2] if k != 2 else [0, 2], chunk if k != 2 else
                  {name: v[:2] for name, v in chunk.items()})
  state = replay.state_dict()
  rows = Replay.state_rows(state)
  assert rows == (50 if layout == 'shared' else 40)
  template = replay.state_template(rows)
  assert jax.tree.map(lambda x: x.shape, template) == jax.tree.map(
      np.shape, state)
  copy = make_replay(layout, fields, 3, capacity=50)
  copy.load_state_dict(state)
  np.testing.assert_array_equal(copy.sizes(), replay.sizes())
  np.testing.assert_array_equal(copy.inserted(), replay.inserted())
  a = replay.sample(np.random.default_rng(7), 4, 16)
  b = copy.sample(np.random.default_rng(7), 4, 16)
  jax.tree.map(np.testing.assert_array_equal, a, b)
  # Inserting continues at the same ring position.
  chunk = {name: np.full((3, 1, *shape), 9, dtype)
           for name, (shape, dtype) in fields.items()}
  replay.insert([0, 1, 2], chunk)
  copy.insert([0, 1, 2], chunk)
  jax.tree.map(np.testing.assert_array_equal, replay.state_dict(),
               copy.state_dict())
  with pytest.raises(ValueError, match='needs'):
    make_replay(layout, fields, 2, capacity=50).load_state_dict(state)
