"""The prefetch thread: the next learner call's batches, ready on the device.

Host-side module (a thread, a bounded ``queue.Queue`` and ``jax.device_put``;
nothing here is jittable).

While the learner runs call ``k``, a background thread waits for the rate
limiter to allow call ``k + 1``, samples the whole ``[N, S, B, ...]`` batch
from the replay in one vectorized gather per field, moves it to the
accelerator with ``jax.device_put`` and waits for the transfer, so the learner
gets a batch that is already resident. At most ``depth`` batches wait in the
queue.

The learner-side :meth:`Prefetcher.get` measures how long the learner waits
for data; :meth:`Prefetcher.stats` reports that as a fraction of wall time,
counted from the first batch handed out (so warm-up and the first compile do
not count), and over a recent window.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, NamedTuple

import jax

from fastpbrl.replay.rate_limiter import LimiterClosed, RateLimiter


class PrefetchError(RuntimeError):
  """The prefetch thread failed; the original exception is ``__cause__``."""


class WaitStats(NamedTuple):
  """How much the learner waited for data.

  ``wait_fraction`` counts from the moment the first batch was handed out;
  the wait for that first batch (warm-up steps, actor start-up) is reported
  apart as ``first_wait_s``.
  """

  batches: int  # batches handed to the learner
  wait_s: float  # seconds the learner spent blocked after its first batch
  wall_s: float  # seconds since the first batch was handed out
  wait_fraction: float  # wait_s / wall_s
  recent_wait_fraction: float  # the same over the last `window` batches
  first_wait_s: float  # seconds waited for the first batch
  limiter_wait_s: float  # prefetch thread: seconds held by the rate limiter
  sample_s: float  # prefetch thread: mean seconds to sample one batch
  transfer_s: float  # prefetch thread: mean seconds to device_put one batch


class Prefetcher:
  """Runs ``sample`` in a background thread, ``depth`` batches ahead."""

  def __init__(self, sample: Callable[[], Any], limiter: RateLimiter | None,
               num_updates: int, depth: int = 2, device=None,
               window: int = 50, name: str = 'fastpbrl-prefetch'):
    """Args:
      sample: returns one host batch (a pytree of numpy arrays).
      limiter: asked for ``num_updates`` update steps before each sample;
        ``None`` samples as fast as the queue drains.
      num_updates: update steps one batch feeds (``N`` members each take
        them; the limiter counts per member).
      depth: batches sampled ahead, >= 1.
      device: target of ``jax.device_put`` (default device if ``None``).
      window: batches in the recent wait-fraction window, >= 1.
      name: thread name.
    """
    if depth < 1:
      raise ValueError(f'depth must be >= 1, got {depth}')
    if num_updates < 1:
      raise ValueError(f'num_updates must be >= 1, got {num_updates}')
    if window < 1:
      raise ValueError(f'window must be >= 1, got {window}')
    self._sample = sample
    self._limiter = limiter
    self._num_updates = int(num_updates)
    self._device = device
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._error: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._window = window
    self._lock = threading.Lock()
    self._reset_locked()
    self._produced = 0
    self._sample_total = 0.0
    self._transfer_total = 0.0

  def _reset_locked(self) -> None:
    self._batches = 0
    self._first_wait = 0.0
    self._first_time = None
    self._wait = 0.0
    self._pending_wait = 0.0
    self._recent = collections.deque(maxlen=self._window + 1)

  # ------------------------------------------------------------ background

  def start(self) -> 'Prefetcher':
    self._thread.start()
    return self

  def _run(self) -> None:
    try:
      while not self._stop.is_set():
        if self._limiter is not None:
          try:
            if not self._limiter.acquire(self._num_updates, timeout=0.1):
              continue
          except LimiterClosed:
            return
        t0 = time.monotonic()
        batch = self._sample()
        t1 = time.monotonic()
        batch = jax.block_until_ready(jax.device_put(batch, self._device))
        t2 = time.monotonic()
        with self._lock:
          self._produced += 1
          self._sample_total += t1 - t0
          self._transfer_total += t2 - t1
        while not self._stop.is_set():
          try:
            self._queue.put(batch, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as e:  # reported to the learner by get()
      self._error = e

  # --------------------------------------------------------------- learner

  @property
  def error(self) -> BaseException | None:
    return self._error

  def get(self, timeout: float | None = None) -> Any:
    """The next batch, waiting at most ``timeout`` seconds (forever: None).

    Raises:
      TimeoutError: no batch within ``timeout``.
      PrefetchError: the prefetch thread failed (cause attached).
      RuntimeError: the prefetcher was closed.
    """
    start = time.monotonic()
    try:
      while True:
        left = None if timeout is None else timeout - (time.monotonic() - start)
        if left is not None and left <= 0:
          raise TimeoutError(f'no batch within {timeout} s')
        try:
          batch = self._queue.get(timeout=0.05 if left is None else
                                  min(0.05, left))
          break
        except queue.Empty:
          if self._error is not None:
            raise PrefetchError(
                f'the prefetch thread failed: {self._error!r}') from self._error
          if self._stop.is_set():
            raise RuntimeError('the prefetcher is closed') from None
    finally:
      now = time.monotonic()
      with self._lock:
        self._pending_wait += now - start
    with self._lock:
      if self._first_time is None:
        self._first_time = now
        self._first_wait = self._pending_wait
      else:
        self._wait += self._pending_wait
      # The window spans from its oldest batch's hand-out to the newest's;
      # the oldest entry's own wait lies before that span and is not counted.
      self._recent.append((now, self._pending_wait))
      self._pending_wait = 0.0
      self._batches += 1
    return batch

  def stats(self) -> WaitStats:
    """Learner wait statistics (see :class:`WaitStats`)."""
    now = time.monotonic()
    with self._lock:
      wall = 0.0 if self._first_time is None else now - self._first_time
      recent = list(self._recent)
      if len(recent) >= 2:
        span = recent[-1][0] - recent[0][0]
        recent_fraction = (sum(w for _, w in recent[1:]) / span
                           if span > 0 else 0.0)
      else:
        recent_fraction = 0.0
      produced = max(self._produced, 1)
      return WaitStats(
          batches=self._batches, wait_s=self._wait, wall_s=wall,
          wait_fraction=self._wait / wall if wall > 0 else 0.0,
          recent_wait_fraction=recent_fraction,
          first_wait_s=self._first_wait,
          limiter_wait_s=(self._limiter.blocked_s
                          if self._limiter is not None else 0.0),
          sample_s=self._sample_total / produced,
          transfer_s=self._transfer_total / produced)

  def reset_stats(self) -> None:
    """Restarts the wait statistics from now (e.g. once the learner is warm)."""
    with self._lock:
      self._reset_locked()
      self._first_time = time.monotonic()
      self._recent.append((self._first_time, 0.0))

  def close(self, timeout: float = 5.0) -> None:
    """Stops the thread (it wakes within ~0.1 s) and drops queued batches."""
    self._stop.set()
    if self._thread.is_alive():
      self._thread.join(timeout)
    while True:
      try:
        self._queue.get_nowait()
      except queue.Empty:
        break
