"""The prefetch thread: order, bounded look-ahead, the rate limiter, errors,
and the wait-fraction measurement."""

import threading
import time

import jax
import numpy as np
import pytest

from fastpbrl.replay import PrefetchError, Prefetcher, RateLimiter


class CountingSampler:

  def __init__(self, delay: float = 0.0):
    self.calls = 0
    self.delay = delay
    self.lock = threading.Lock()

  def __call__(self):
    with self.lock:
      self.calls += 1
      k = self.calls
    if self.delay:
      time.sleep(self.delay)
    return {'x': np.full((2, 3, 4), k, np.float32)}


def test_batches_arrive_in_order_on_the_device_with_bounded_lookahead():
  sampler = CountingSampler()
  prefetcher = Prefetcher(sampler, None, num_updates=3, depth=2).start()
  try:
    first = prefetcher.get(timeout=60)
    assert isinstance(first['x'], jax.Array)
    assert first['x'].shape == (2, 3, 4) and float(first['x'][0, 0, 0]) == 1
    time.sleep(0.2)  # the thread fills the queue and stops there
    assert sampler.calls <= 1 + 2 + 1  # taken + queued + one in hand
    for k in range(2, 6):
      assert float(prefetcher.get(timeout=60)['x'][0, 0, 0]) == k
  finally:
    prefetcher.close()


def test_samples_only_what_the_limiter_allows():
  limiter = RateLimiter(1, target_ratio=1.0, warmup_steps=0)
  sampler = CountingSampler()
  prefetcher = Prefetcher(sampler, limiter, num_updates=10, depth=4).start()
  try:
    with pytest.raises(TimeoutError):
      prefetcher.get(timeout=0.2)
    assert sampler.calls == 0
    limiter.add_env_steps([0], 25)  # enough for two batches of 10 updates
    prefetcher.get(timeout=60)
    prefetcher.get(timeout=60)
    with pytest.raises(TimeoutError):
      prefetcher.get(timeout=0.2)
    assert sampler.calls == 2 and limiter.update_steps == 20
  finally:
    prefetcher.close()


def test_sampling_errors_reach_the_learner():

  def broken():
    raise ValueError('replay exploded')

  prefetcher = Prefetcher(broken, None, num_updates=1).start()
  try:
    with pytest.raises(PrefetchError, match='replay exploded') as info:
      prefetcher.get(timeout=60)
    assert isinstance(info.value.__cause__, ValueError)
  finally:
    prefetcher.close()


def test_close_stops_the_thread_quickly():
  limiter = RateLimiter(1, 1.0, warmup_steps=10**9)  # never allows
  prefetcher = Prefetcher(CountingSampler(), limiter, num_updates=1).start()
  start = time.monotonic()
  prefetcher.close()
  assert time.monotonic() - start < 1.0
  assert not prefetcher._thread.is_alive()
  with pytest.raises(RuntimeError, match='closed'):
    prefetcher.get(timeout=1)


def _measure(sample_delay, learner_delay, batches=12):
  prefetcher = Prefetcher(CountingSampler(sample_delay), None,
                          num_updates=1, depth=2, window=5).start()
  try:
    for _ in range(batches):
      prefetcher.get(timeout=10)
      time.sleep(learner_delay)
    return prefetcher.stats()
  finally:
    prefetcher.close()


def test_wait_fraction_when_data_is_the_bottleneck():
  stats = _measure(sample_delay=0.05, learner_delay=0.0)
  assert stats.batches == 12
  assert stats.wait_fraction > 0.7
  assert stats.recent_wait_fraction > 0.7
  assert stats.sample_s >= 0.05


def test_wait_fraction_when_the_learner_is_the_bottleneck():
  # The learner's 0.2 s per batch leaves the sampling thread (no delay of
  # its own) time to keep ahead even on a busy machine.
  stats = _measure(sample_delay=0.0, learner_delay=0.2)
  assert stats.wait_fraction < 0.2
  assert stats.recent_wait_fraction < 0.2
  assert stats.wall_s >= 11 * 0.2


def test_reset_stats_restarts_the_window():
  prefetcher = Prefetcher(CountingSampler(0.05), None, num_updates=1).start()
  try:
    for _ in range(3):
      prefetcher.get(timeout=10)
    assert prefetcher.stats().wait_s > 0.05
    prefetcher.reset_stats()
    stats = prefetcher.stats()
    assert stats.batches == 0 and stats.wait_s == 0.0
  finally:
    prefetcher.close()


def test_validation_names_the_parameter():
  with pytest.raises(ValueError, match='depth must be >= 1'):
    Prefetcher(CountingSampler(), None, num_updates=1, depth=0)
  with pytest.raises(ValueError, match='num_updates must be >= 1'):
    Prefetcher(CountingSampler(), None, num_updates=0)
