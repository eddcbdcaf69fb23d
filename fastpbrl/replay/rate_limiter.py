"""The update-to-data rate limiter between actors and the learner.

Host-side module (a ``threading.Condition``; nothing here is jittable).

Every member takes the same number of update steps (the learner updates the
whole population in one call), while each member's actor collects its own env
steps. The learner may take ``k`` more update steps only if, for every member
``i``,

* member ``i`` finished its warm-up (``env_steps[i] >= warmup_steps[i]``), and
* ``(update_steps + k) / env_steps[i] <= target_ratio``.

So the ratio of update steps to collected env steps never exceeds the target,
for any member, and the learner blocks until the slowest member's actor has
collected enough. Warm-up steps count as collected data (Reverb's
``SampleToInsertRatio`` convention): right after warm-up the learner may take
up to ``target_ratio * warmup_steps`` update steps at once. With the shared
replay layout the same per-member rule applies, so the ratio is update steps
of each member to env steps of each member; the shared critic of CEM-RL/DvD
then sees ``target_ratio / N`` updates per env step of the population.

Update steps are counted when a batch is *sampled* (by the prefetch thread),
not when the learner consumes it, so prefetching never lets the ratio slip.

The other side (optional, ``max_env_steps_ahead``): when the learner is the
slower side, the reader threads stop inserting a member's chunks once the
member is more than ``max_env_steps_ahead`` env steps ahead of what the
learner's update steps call for (``max(warmup_steps, update_steps /
target_ratio)``). The actors' bounded channels then fill up and the actors
block (backpressure), so the ratio stays close to the target from below too
(as Reverb's rate limiter with an error buffer) and idle actors leave the CPU
to the learner. For the learner never to starve, the slack must cover one
learner call plus one chunk: ``max_env_steps_ahead >= num_updates /
target_ratio + chunk_steps``.
"""

from __future__ import annotations

import threading
import time
from typing import Sequence

import numpy as np


class LimiterClosed(RuntimeError):
  """Raised to a waiter when the limiter is closed (pipeline shutdown)."""


class RateLimiter:
  """Caps (update steps) / (env steps) per member at ``target_ratio``."""

  def __init__(self, num_members: int, target_ratio: float = 1.0,
               warmup_steps: int | Sequence[int] = 10_000,
               max_env_steps_ahead: int | None = None,
               warmup_is_data: bool = True,
               carried_env_steps: float | Sequence[float] = 0.0):
    """Args:
      num_members: population size ``N``.
      target_ratio: update steps allowed per collected env step, > 0.
      warmup_steps: env steps each member collects (with random actions)
        before the first update step; an int for all members or ``N`` ints.
      max_env_steps_ahead: how far (in env steps) a member may run ahead of
        the learner before :meth:`wait_to_insert` holds its data back;
        ``None`` never holds data back.
      warmup_is_data: True: warm-up steps count as collected data (right
        after warm-up, ``target_ratio * warmup_steps`` updates are allowed);
        False: the ratio counts only env steps after the warm-up.
      carried_env_steps: env steps (an int for all members or ``N``)
        collected before this limiter started that still count as data
        for updates not yet taken: a resumed run's, ``env steps at the
        checkpoint - steps its ratio did not count - update steps /
        target_ratio`` (``resume_credit``), so that the resumed run takes
        as many update steps in all as the run would have without the
        stop. The warm-up gate still counts only new env steps.
    """
    if num_members < 1:
      raise ValueError(f'num_members must be >= 1, got {num_members}')
    if not np.isfinite(target_ratio) or target_ratio <= 0:
      raise ValueError(f'target_ratio must be in (0, inf); got {target_ratio}')
    if np.ndim(warmup_steps) == 0:
      warmup = np.full(num_members, int(warmup_steps), np.int64)
    else:
      warmup = np.asarray(warmup_steps, np.int64)
    if warmup.shape != (num_members,):
      raise ValueError(f'warmup_steps must be an int or {num_members} ints; '
                       f'got shape {warmup.shape}')
    if (warmup < 0).any():
      raise ValueError(f'warmup_steps must be >= 0; got {warmup.tolist()}')
    if max_env_steps_ahead is not None and max_env_steps_ahead < 1:
      raise ValueError(f'max_env_steps_ahead must be None or >= 1; got '
                       f'{max_env_steps_ahead}')
    self.max_env_steps_ahead = max_env_steps_ahead
    self.num_members = int(num_members)
    self.target_ratio = float(target_ratio)
    self.warmup_steps = warmup
    self.warmup_is_data = bool(warmup_is_data)
    # Env steps that do not count as data for the ratio (negative: data
    # carried over from before a resume).
    self._uncounted = ((np.zeros_like(warmup) if warmup_is_data else warmup)
                       - np.broadcast_to(np.asarray(carried_env_steps,
                                                    np.float64),
                                         warmup.shape))
    self._env_steps = np.zeros(num_members, np.int64)
    self._update_steps = 0
    self._blocked_s = 0.0
    self._closed = False
    self._cond = threading.Condition()

  # ------------------------------------------------------------- producers

  def add_env_steps(self, members: Sequence[int] | np.ndarray,
                    steps: int | Sequence[int] | np.ndarray) -> None:
    """Records ``steps`` new env steps for each of ``members``."""
    members = np.asarray(members, np.int64)
    with self._cond:
      np.add.at(self._env_steps, members, np.asarray(steps, np.int64))
      self._cond.notify_all()

  def _needed(self, update_steps: int, members=slice(None)) -> int:
    """Env steps each of ``members`` needs before ``update_steps`` update
    steps in all are allowed: past its warm-up, and enough counted data."""
    by_ratio = np.ceil(update_steps / self.target_ratio - 1e-9)
    return int(np.maximum(self.warmup_steps[members],
                          np.ceil(by_ratio + self._uncounted[members])).max())

  def _admits(self, members: np.ndarray, steps: int) -> bool:
    if self.max_env_steps_ahead is None:
      return True
    return (int(self._env_steps[members].max()) + steps
            <= self._needed(self._update_steps, members)
            + self.max_env_steps_ahead)

  def wait_to_insert(self, members: Sequence[int] | np.ndarray, steps: int,
                     timeout: float) -> bool:
    """Waits until ``steps`` more env steps of ``members`` may be inserted.

    Returns True when they may (always at once without
    ``max_env_steps_ahead``, and once the limiter is closed), False if
    ``timeout`` passed first. Does not record anything: call
    :meth:`add_env_steps` after inserting.
    """
    members = np.asarray(members, np.int64)
    deadline = time.monotonic() + timeout
    with self._cond:
      while not (self._closed or self._admits(members, steps)):
        left = deadline - time.monotonic()
        if left <= 0:
          return False
        self._cond.wait(left)
      return True

  # -------------------------------------------------------------- consumer

  def _allows(self, num_updates: int) -> bool:
    env = self._env_steps
    if (env < self.warmup_steps).any():
      return False
    return (self._update_steps + num_updates
            <= self.target_ratio * (env - self._uncounted).min())

  def try_acquire(self, num_updates: int) -> bool:
    """Records ``num_updates`` update steps if allowed now; never blocks."""
    with self._cond:
      if self._closed:
        raise LimiterClosed('rate limiter closed')
      if not self._allows(num_updates):
        return False
      self._update_steps += num_updates
      self._cond.notify_all()
      return True

  def acquire(self, num_updates: int, timeout: float | None = None) -> bool:
    """Blocks until ``num_updates`` more update steps are allowed, then
    records them.

    Args:
      num_updates: update steps the next learner call takes (>= 1).
      timeout: seconds to wait at most (``None``: until allowed or closed).

    Returns:
      True once recorded, False if ``timeout`` passed first.

    Raises:
      LimiterClosed: if the limiter is closed before or while waiting.
    """
    if num_updates < 1:
      raise ValueError(f'num_updates must be >= 1, got {num_updates}')
    start = time.monotonic()
    with self._cond:
      try:
        while True:
          if self._closed:
            raise LimiterClosed('rate limiter closed')
          if self._allows(num_updates):
            self._update_steps += num_updates
            self._cond.notify_all()  # data held back may now be inserted
            return True
          left = None if timeout is None else timeout - (
              time.monotonic() - start)
          if left is not None and left <= 0:
            return False
          self._cond.wait(left)
      finally:
        self._blocked_s += time.monotonic() - start

  def close(self) -> None:
    """Wakes every waiter with :class:`LimiterClosed`."""
    with self._cond:
      self._closed = True
      self._cond.notify_all()

  # ----------------------------------------------------------------- stats

  @property
  def env_steps(self) -> np.ndarray:
    """``[N]`` env steps collected per member (a copy)."""
    with self._cond:
      return self._env_steps.copy()

  @property
  def update_steps(self) -> int:
    """Update steps granted so far (the same for every member)."""
    with self._cond:
      return self._update_steps

  @property
  def blocked_s(self) -> float:
    """Total seconds callers of :meth:`acquire` spent inside it."""
    with self._cond:
      return self._blocked_s

  @property
  def warmed_up(self) -> bool:
    with self._cond:
      return bool((self._env_steps >= self.warmup_steps).all())

  def ratio(self) -> float:
    """Update steps per env step of the member with the fewest env steps."""
    with self._cond:
      least = int(self._env_steps.min())
      return self._update_steps / least if least else 0.0

  def update_steps_owed(self, env_steps: int,
                        taken: int | None = None) -> int:
    """Update steps that each member's first ``env_steps`` env steps (of
    those collected) earn at the target ratio, less ``taken`` (default:
    those granted so far); 0 before the warm-up ends. A run whose budget
    ends at ``env_steps`` takes them before it stops. A learner fed
    ahead of time (a prefetch queue) passes the update steps it has
    learned: what was granted for batches still queued is owed too."""
    with self._cond:
      env = np.minimum(self._env_steps, env_steps)
      if (env < self.warmup_steps).any():
        return 0
      earned = np.floor(self.target_ratio * (env - self._uncounted).min()
                        + 1e-9)
      if taken is None:
        taken = self._update_steps
      return max(0, int(earned) - taken)

  def env_steps_needed(self, num_updates: int) -> int:
    """Env steps every member needs before ``num_updates`` more updates."""
    with self._cond:
      return self._needed(self._update_steps + num_updates)
