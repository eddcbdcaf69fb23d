"""``Pipeline.publish_async``'s publisher thread: the newest submission
lands, nothing queues up, failures surface, and parameters survive the
learner state being donated right after they were submitted."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.datapath.actor_family import AsyncPublisher, PublishError

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
  publisher = AsyncPublisher(store.write)
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


def test_keep_every_writes_every_submission_in_order():
  # A multi-process run numbers versions alike in every process only if no
  # submission is superseded: submit then waits for the thread to take the
  # previous one (released here from another thread while it waits).
  store = SlowStore()
  publisher = AsyncPublisher(store.write, keep_every=True)
  try:
    publisher.submit({'w': np.array([0])})
    assert store.entered.wait(DEADLINE_S)  # the thread is writing 0
    publisher.submit({'w': np.array([1])})  # waits in the mailbox
    done = threading.Event()

    def submit_more():
      for version in range(2, 6):
        publisher.submit({'w': np.array([version])})
      done.set()

    thread = threading.Thread(target=submit_more, daemon=True)
    thread.start()
    assert not done.wait(0.2)  # blocked behind 1 while 0 is being written
    store.release.set()
    assert done.wait(DEADLINE_S)
    assert publisher.wait(DEADLINE_S)
    assert [int(t['w'][0]) for t in store.writes] == [0, 1, 2, 3, 4, 5]
    assert publisher.replaced == 0
  finally:
    publisher.close()


def test_wait_times_out_while_a_write_is_stuck_then_succeeds():
  store = SlowStore()
  publisher = AsyncPublisher(store.write)
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

  publisher = AsyncPublisher(write)
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
  publisher = AsyncPublisher(store.write)
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


@pytest.mark.parametrize('shared_critic', [False, True])
def test_learner_policy_params_survive_the_next_update(shared_critic):
  # What the run loop publishes asynchronously must not alias the state it
  # donates to the next call (the shared-critic learner used to return the
  # state's own arrays).
  from fastpbrl.agents import td3  # noqa: PLC0415
  from fastpbrl.learner.population import (PopulationLearner,  # noqa: PLC0415
                                SharedCriticLearner, population_hparams)
  from tests.agents.helpers import env_spec, random_batch  # noqa: PLC0415
  agent = td3.make_agent(env_spec('Pendulum-v1'), td3.TD3Config(
      hidden_sizes=(8,), batch_size=4, steps_per_call=2))
  learner = (SharedCriticLearner(agent.shared_critic, 2) if shared_critic
             else PopulationLearner(agent))
  hparams = population_hparams(agent, 2)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  published = learner.policy_params(state)
  before = jax.tree.map(np.array, published)
  state, _ = learner.update(state, hparams,
                            random_batch(agent.env_spec, (2, 2, 4), seed=0))
  jax.block_until_ready(state)
  after = jax.tree.map(np.asarray, published)  # raises if it was donated
  jax.tree.map(np.testing.assert_array_equal, before, after)
