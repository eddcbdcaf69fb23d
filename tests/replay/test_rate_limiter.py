"""The update-to-data rate limiter: warm-up, the per-member cap, blocking,
holding data back, and the ratio it keeps over a run."""

import threading
import time

import numpy as np
import pytest

from fastpbrl.replay import LimiterClosed, RateLimiter
from tests import numerics

# The cap target * least is one rounded product, a ratio one rounded
# quotient: a ratio at the cap reads at most 2 roundings above the target.
AT_MOST = 1 + numerics.rounding_rtol(2, np.float64)


def test_warmup_then_ratio_cap_per_member():
  limiter = RateLimiter(2, target_ratio=2.0, warmup_steps=100)
  limiter.add_env_steps([0, 1], 99)
  assert not limiter.try_acquire(1)  # still warming up
  limiter.add_env_steps([0, 1], 1)
  assert limiter.warmed_up
  # 100 env steps each at ratio 2: 200 update steps, in any grouping.
  assert limiter.try_acquire(150)
  assert not limiter.try_acquire(51)
  assert limiter.try_acquire(50)
  assert limiter.update_steps == 200
  assert limiter.ratio() == 2.0  # exact: 200 / 100
  # The member with the fewest env steps binds.
  limiter.add_env_steps([0], 1000)
  assert not limiter.try_acquire(1)
  limiter.add_env_steps([1], 5)
  assert limiter.try_acquire(10)
  assert not limiter.try_acquire(1)


def test_a_warmup_that_is_not_data_grants_no_burst_of_updates():
  """warmup_is_data=False (TD3's and SB3's loops): the learner waits for
  the warm-up, then the ratio counts only what came after it, instead of
  granting ratio x warmup updates at once."""
  counted = RateLimiter(2, target_ratio=2.0, warmup_steps=100)
  refill = RateLimiter(2, target_ratio=2.0, warmup_steps=100,
                       warmup_is_data=False, max_env_steps_ahead=60)
  for limiter in (counted, refill):
    limiter.add_env_steps([0, 1], 100)
  assert counted.try_acquire(200)  # the burst a fresh run allows
  assert not refill.try_acquire(1)
  refill.add_env_steps([0, 1], 10)
  assert refill.try_acquire(20) and not refill.try_acquire(1)
  assert refill.env_steps_needed(10) == 100 + 15
  # Holding data back counts from the refill's end too.
  assert refill.wait_to_insert(np.array([0]), 60, 0.0)
  assert not refill.wait_to_insert(np.array([0]), 61, 0.0)


def test_a_resume_takes_the_updates_carried_and_refilled():
  """A resumed run: its refill (the warm-up gate, 50 new steps) counts as
  data, and so do the carried steps (30 and 40: what the run had earned
  but not taken at its checkpoint), the least member binding; what the
  first env steps earned and was not granted is owed."""
  limiter = RateLimiter(2, target_ratio=2.0, warmup_steps=50,
                        carried_env_steps=[30.0, 40.0])
  limiter.add_env_steps([0, 1], 49)
  assert not limiter.try_acquire(1)  # the refill is not in yet
  assert limiter.update_steps_owed(1000) == 0
  limiter.add_env_steps([0, 1], 1)
  # 2 x (50 + 30) = 160 for member 0, which binds (member 1: 180).
  assert limiter.update_steps_owed(1000) == 160
  assert limiter.update_steps_owed(50) == 160
  assert limiter.try_acquire(150) and not limiter.try_acquire(11)
  assert limiter.update_steps_owed(1000) == 10
  limiter.add_env_steps([0, 1], 20)  # 2 x (70 + 30) = 200 earned in all
  assert limiter.update_steps_owed(1000) == 50
  assert limiter.update_steps_owed(60) == 30  # the first 60 steps: 180
  # A learner that has learned 120 of the 150 granted (a batch of 30 still
  # queued) is owed that batch too: 200 - 120.
  assert limiter.update_steps_owed(1000, taken=120) == 80
  assert limiter.update_steps_owed(60, taken=120) == 60
  assert limiter.update_steps_owed(60, taken=190) == 0  # never negative


def test_per_member_warmup():
  limiter = RateLimiter(2, 1.0, warmup_steps=[10, 50])
  limiter.add_env_steps([0, 1], 20)
  assert not limiter.try_acquire(1)
  limiter.add_env_steps([1], 30)
  assert limiter.try_acquire(20)


def test_acquire_blocks_until_env_steps_arrive_and_times_out():
  limiter = RateLimiter(1, 1.0, warmup_steps=0)
  start = time.monotonic()
  assert not limiter.acquire(5, timeout=0.1)
  assert time.monotonic() - start >= 0.1
  timer = threading.Timer(0.1, limiter.add_env_steps, args=([0], 5))
  timer.start()
  assert limiter.acquire(5, timeout=5.0)
  timer.join()
  assert limiter.update_steps == 5
  assert limiter.blocked_s > 0.1


def test_close_wakes_waiters():
  limiter = RateLimiter(1, 1.0, warmup_steps=0)
  errors = []

  def wait():
    try:
      limiter.acquire(1)
    except LimiterClosed as e:
      errors.append(e)

  thread = threading.Thread(target=wait)
  thread.start()
  time.sleep(0.05)  # before or after it waits: either way it is woken
  limiter.close()
  thread.join(60.0)
  assert not thread.is_alive() and len(errors) == 1
  with pytest.raises(LimiterClosed):
    limiter.try_acquire(1)


def test_data_held_back_until_the_learner_catches_up():
  limiter = RateLimiter(2, 1.0, warmup_steps=100, max_env_steps_ahead=50)
  # Warm-up plus the slack may go in at once...
  assert limiter.wait_to_insert([0, 1], 150, timeout=0)
  limiter.add_env_steps([0, 1], 150)
  # ...but not one step more until update steps call for it.
  assert not limiter.wait_to_insert([0, 1], 1, timeout=0.05)
  assert limiter.try_acquire(120)  # now 170 steps may be collected
  assert limiter.wait_to_insert([0, 1], 20, timeout=0)
  assert not limiter.wait_to_insert([0, 1], 21, timeout=0)
  # A waiting inserter is woken by the learner's acquire.
  timer = threading.Timer(0.05, limiter.try_acquire, args=(30,))
  timer.start()
  assert limiter.wait_to_insert([0, 1], 40, timeout=60.0)
  timer.join()
  # Without a slack nothing is ever held back.
  assert RateLimiter(1, 1.0, 0).wait_to_insert([0], 10**9, timeout=0)


def _run(limiter, n, chunk, actor_delay, learner_delay, num_updates,
         grants, timeout=120.0):
  """Actors add chunks, a learner acquires, until the learner was granted
  ``grants`` times (a count, not a duration: a busy machine only makes it
  slower); returns the ratios it saw."""
  stop = threading.Event()
  seen = []

  def actor(member):
    rng = np.random.default_rng(member)
    while not stop.is_set():
      if limiter.wait_to_insert([member], chunk, timeout=0.05):
        limiter.add_env_steps([member], chunk)
        time.sleep(actor_delay * rng.uniform(0.5, 1.5))

  def learner():
    while not stop.is_set():
      if limiter.acquire(num_updates, timeout=0.05):
        # Under the cap at every grant, for every member.
        seen.append(limiter.update_steps / limiter.env_steps.min())
        time.sleep(learner_delay)

  threads = [threading.Thread(target=actor, args=(i,)) for i in range(n)]
  threads.append(threading.Thread(target=learner))
  for t in threads:
    t.start()
  deadline = time.monotonic() + timeout
  while len(seen) < grants and time.monotonic() < deadline:
    time.sleep(0.01)
  stop.set()
  for t in threads:
    t.join()
  return seen


@pytest.mark.parametrize('target', [0.5, 1.0, 4.0])
def test_fast_learner_holds_the_target_ratio(target):
  limiter = RateLimiter(4, target, warmup_steps=64)
  seen = _run(limiter, n=4, chunk=16, actor_delay=0.002, learner_delay=0.0,
              num_updates=8, grants=200)
  assert len(seen) >= 200
  assert max(seen) <= target * AT_MOST
  # The learner is granted all the ratio allows and no more, however the
  # threads were scheduled: once the actors stop, it reaches the target
  # within one call. (Comparing the ratio at the moment the run stopped
  # with the target failed on a loaded machine: 3.60 for 4.0, while the
  # starved learner thread had updates left to take.)
  while limiter.try_acquire(8):
    pass
  least = int(limiter.env_steps.min())
  assert target - 8 / least <= limiter.ratio() <= target * AT_MOST


def test_slow_learner_holds_actors_back_with_a_slack():
  target, ahead = 1.0, 64
  limiter = RateLimiter(2, target, warmup_steps=32, max_env_steps_ahead=ahead)
  seen = _run(limiter, n=2, chunk=8, actor_delay=0.0, learner_delay=0.005,
              num_updates=16, grants=100)
  assert max(seen) <= target * AT_MOST
  env = limiter.env_steps
  # Actors ran at most `ahead` steps beyond what the learner called for.
  assert env.max() <= max(32, limiter.update_steps / target) + ahead
  assert limiter.ratio() >= 0.85 * target


def test_validation_names_the_parameter():
  with pytest.raises(ValueError, match='target_ratio must be in'):
    RateLimiter(2, 0.0)
  with pytest.raises(ValueError, match='num_members must be >= 1'):
    RateLimiter(0)
  with pytest.raises(ValueError, match='warmup_steps must be an int or 2'):
    RateLimiter(2, 1.0, [1, 2, 3])
  with pytest.raises(ValueError, match='warmup_steps must be >= 0'):
    RateLimiter(2, 1.0, -1)
  with pytest.raises(ValueError, match='max_env_steps_ahead must be None'):
    RateLimiter(2, 1.0, 0, max_env_steps_ahead=0)
  with pytest.raises(ValueError, match='num_updates must be >= 1'):
    RateLimiter(2).acquire(0)
