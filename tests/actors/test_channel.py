"""The transition channel: ordered, whole chunks through the ring,
backpressure on a full ring, stop requests, error text, cleanup."""

import multiprocessing as mp
import os
import threading
import time

import numpy as np
import pytest

from fastpbrl.actors import Channel, chunk_layout

FIELDS = {'observation': ((3,), np.float32), 'action': ((2,), np.float32),
          'reward': ((), np.float32), 'next_observation': ((3,), np.float32),
          'terminated': ((), np.float32), 'truncated': ((), np.float32)}


def make_channel(num_slots=4, members=2, steps=5):
  layout = chunk_layout(FIELDS, members, steps)
  return Channel.create(layout, num_slots, mp.get_context('spawn'))


def fill(chunk, k):
  for name in FIELDS:
    chunk[name][...] = k
  chunk['meta'][:] = (chunk['reward'].shape[1], 0, k, 0)


def test_layout_shapes():
  layout = chunk_layout(FIELDS, num_members=3, chunk_steps=7)
  assert layout.fields['observation'][0] == (3, 7, 3)
  assert layout.fields['reward'][0] == (3, 7)
  assert layout.fields['env_steps'][0] == (3,)
  assert layout.fields['episode_return'][0] == (2 * 3 * 7,)
  assert all(off % 64 == 0 for off in layout.offsets.values())
  with pytest.raises(ValueError, match='chunk_steps must be >= 1'):
    chunk_layout(FIELDS, 1, 0)


def test_chunks_arrive_whole_and_in_order_across_wraps():
  channel = make_channel(num_slots=3)
  total = 50
  producer = Channel.attach(channel.handle)  # another mapping of the ring

  def produce():
    for k in range(total):
      chunk = producer.acquire_slot()
      fill(chunk, k)
      producer.commit()

  thread = threading.Thread(target=produce)
  thread.start()
  got = []
  try:
    deadline = time.monotonic() + 10
    while len(got) < total and time.monotonic() < deadline:
      if channel.wait(0.1):
        chunk = channel.peek()
        k = int(chunk['meta'][2])
        for name in FIELDS:
          assert (chunk[name] == k).all()
        assert channel.pending() <= 3
        got.append(k)
        channel.release()
  finally:
    thread.join(60)
    producer.close()
    channel.close()
  assert got == list(range(total))


def wait_until(condition, timeout):
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


def test_full_ring_blocks_the_producer_until_a_slot_frees():
  channel = make_channel(num_slots=2)
  committed = []
  stop = threading.Event()

  def produce():
    k = 0
    while True:
      chunk = channel.acquire_slot(should_stop=stop.is_set)
      if chunk is None:
        return
      fill(chunk, k)
      channel.commit()
      committed.append(k)
      k += 1

  thread = threading.Thread(target=produce)
  thread.start()
  try:
    assert wait_until(lambda: len(committed) == 2, 60)
    blocked_from = time.monotonic()
    time.sleep(0.3)  # however long: nothing beyond the ring is committed
    assert committed == [0, 1]  # bounded: nothing beyond the ring
    assert channel.pending() == 2
    assert channel.blocked_s == 0.0  # only counted once a wait ends
    channel.release()  # frees one slot: exactly one more chunk fits
    assert wait_until(lambda: len(committed) == 3, 60)
    time.sleep(0.1)
    assert committed == [0, 1, 2]
    # It waited at least from the moment the ring was seen full.
    assert channel.blocked_s >= min(0.3, time.monotonic() - blocked_from) - 0.05
    assert int(channel.peek()['meta'][2]) == 1
  finally:
    stop.set()
    thread.join(60)
  assert not thread.is_alive()
  channel.close()


def test_stop_request_releases_a_blocked_producer():
  channel = make_channel(num_slots=1)
  fill(channel.acquire_slot(), 0)
  channel.commit()
  results = []
  thread = threading.Thread(
      target=lambda: results.append(channel.acquire_slot()))
  thread.start()
  time.sleep(0.1)
  assert thread.is_alive()  # blocked on the full ring, however long
  channel.request_stop()
  thread.join(60)
  assert not thread.is_alive() and results == [None]
  assert channel.stop_requested
  channel.close()


def test_wait_times_out_without_data():
  channel = make_channel()
  start = time.monotonic()
  assert not channel.wait(0.1)
  assert time.monotonic() - start >= 0.09
  assert channel.peek() is None
  channel.close()


def test_error_text_round_trip_keeps_the_end_of_long_tracebacks():
  channel = make_channel()
  assert channel.error_text() == ''
  channel.set_error('Traceback ...\nValueError: boom')
  assert channel.error_text().endswith('ValueError: boom')
  channel.set_error('x' * 100_000 + 'the last line')
  text = channel.error_text()
  assert text.startswith('...') and text.endswith('the last line')
  channel.close()


def test_close_unlinks_the_segment():
  channel = make_channel()
  name = channel.handle.name
  assert os.path.exists(f'/dev/shm/{name}')
  channel.close()
  assert not os.path.exists(f'/dev/shm/{name}')
  channel.close()  # idempotent
