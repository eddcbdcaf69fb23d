"""``Pipeline.publish_async``'s publisher thread: the newest submission
lands, nothing queues up, failures surface, and parameters survive the
learner state being donated right after they were submitted."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.pipeline import PublishError, _AsyncPublisher

DEADLINE_S = 60.0  # generous: only a very busy machine gets near it


class SlowStore:
  """Records every write; the first write blocks until released."""

  def __init__(self):
    self.writes = []
    self.release = threading.Event()
    self.entered = threading.Event()

  def write(self, tree):
    self.entered.set()
    assert self.release.wait(DEADLINE_S)
    self.writes.append(tree)
    return len(self.writes)


def test_the_newest_submission_lands_and_older_waiting_ones_are_replaced():
  store = SlowStore()
  publisher = _AsyncPublisher(store.write)
  try:
    publisher.submit({'w': np.array([0])})
    assert store.entered.wait(DEADLINE_S)  # the thread is writing 0
    for version in range(1, 6):  # 1..4 are superseded while 0 is written
      publisher.submit({'w': np.array([version])})
    store.release.set()
    assert publisher.wait(DEADLINE_S)
    assert [int(t['w'][0]) for t in store.writes] == [0, 5]
    assert publisher.replaced == 4
  finally:
    publisher.close()


def test_wait_times_out_while_a_write_is_stuck_then_succeeds():
  store = SlowStore()
  publisher = _AsyncPublisher(store.write)
  try:
    publisher.submit({'w': np.array([1])})
    assert store.entered.wait(DEADLINE_S)
    assert not publisher.wait(0.05)
    store.release.set()
    assert publisher.wait(DEADLINE_S)
  finally:
    publisher.close()


def test_a_failed_write_is_raised_by_wait_check_and_submit():
  def write(tree):
    raise OSError('disk gone')

  publisher = _AsyncPublisher(write)
  try:
    publisher.submit({'w': np.array([1])})
    with pytest.raises(PublishError, match='disk gone') as info:
      publisher.wait(DEADLINE_S)
    assert isinstance(info.value.__cause__, OSError)
    with pytest.raises(PublishError):
      publisher.check()
    with pytest.raises(PublishError):
      publisher.submit({'w': np.array([2])})
  finally:
    publisher.close()


def test_parameters_survive_the_state_being_donated_after_submit():
  # The run loop submits policy_params(state) and then passes state, donated,
  # to the next learner call: what is published must be the old values.
  policy_params = jax.jit(lambda s: {'p': s['p'] * 1})
  step = jax.jit(lambda s: {'p': s['p'] + 1.0}, donate_argnums=0)
  state = {'p': jnp.arange(4.0)}
  store = SlowStore()
  publisher = _AsyncPublisher(store.write)
  try:
    publisher.submit(policy_params(state))
    for _ in range(3):
      state = step(state)
    store.release.set()
    assert publisher.wait(DEADLINE_S)
    np.testing.assert_array_equal(store.writes[-1]['p'], np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(state['p']), np.arange(4.0) + 3)
  finally:
    publisher.close()
