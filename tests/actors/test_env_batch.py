"""Env batches against gymnasium's own envs: every vectorized batch gives
the observations, rewards, terminations, time-limit truncations and
resets of ``gymnasium.make(...)`` instances stepped one by one, and an
actor fills the same chunks with and without them."""

import functools

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.actors import Actor, ParamStore, chunk_layout
from fastpbrl.actors import vector_envs
from fastpbrl.actors.env_batch import SerialEnvs
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import transition_fields

MEMBERS = 3
EPISODE = 40  # a short time limit, so that every run truncates

# (env id, batch class, time limit, exact): Hopper and Walker2d fall
# within ~20 steps of random actions, so their limit is shorter. MuJoCo batches run the envs' own
# mj_step and gymnasium's formulas in its float types: equal bits.
# Pendulum's batch calls numpy's sin and cos on [M] arrays, whose SIMD
# loops may round the last bit differently from a one-element call; an
# episode of 40 steps of its damped, clipped dynamics grows such a
# difference (~1e-16) by far less than the 1e-9 allowed here, while an
# error of the equations is of the order of the state itself.
CASES = [
    ('HalfCheetah-v5', vector_envs.HalfCheetah, EPISODE, True),
    ('Hopper-v5', vector_envs.Hopper, 25, True),
    ('Walker2d-v5', vector_envs.Walker2d, 25, True),
    ('Pendulum-v1', vector_envs.Pendulum, EPISODE, False),
]


def make(env_id, max_episode_steps=EPISODE, **kwargs):
  return gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs)


@pytest.mark.parametrize('env_id,kind,limit,exact', CASES,
                         ids=[c[0] for c in CASES])
def test_vectorized_batch_steps_as_gymnasium(env_id, kind, limit, exact):
  env_fn = functools.partial(make, env_id, limit)
  batch = vector_envs.make_batch(env_fn, MEMBERS)
  assert type(batch) is kind
  reference = [env_fn() for _ in range(MEMBERS)]
  compare = (np.testing.assert_array_equal if exact else functools.partial(
      np.testing.assert_allclose, rtol=0, atol=1e-9))
  for j, env in enumerate(reference):
    np.testing.assert_array_equal(batch.reset(j, seed=100 + j),
                                  env.reset(seed=100 + j)[0])
  space = reference[0].action_space
  rng = np.random.default_rng(0)
  ended = {'terminated': 0, 'truncated': 0}
  for _ in range(3 * limit):
    actions = rng.uniform(space.low, space.high,
                          (MEMBERS, *space.shape)).astype(space.dtype)
    got = batch.step(actions)
    assert got.observation.shape == (MEMBERS, *reference[0].observation_space
                                     .shape)
    for j, env in enumerate(reference):
      obs, reward, terminated, truncated, _ = env.step(actions[j])
      compare(got.observation[j], obs)
      compare(got.reward[j], reward)
      assert (got.terminated[j], got.truncated[j]) == (terminated, truncated)
      assert np.isnan(got.true_objective[j])
      if terminated or truncated:
        ended['terminated'] += terminated
        ended['truncated'] += truncated
        # Resets continue each env's own generator: the same new episode.
        np.testing.assert_array_equal(batch.reset(j), env.reset()[0])
  assert ended['truncated'] >= 1
  if env_id in ('Hopper-v5', 'Walker2d-v5'):
    assert ended['terminated'] >= 1


MASKED = CASES + [('Hopper-v5', SerialEnvs, 25, True)]


@pytest.mark.parametrize('env_id,kind,limit,exact', MASKED,
                         ids=[f'{c[0]}-{c[1].__name__}' for c in MASKED])
def test_a_masked_step_steps_only_the_active_envs(env_id, kind, limit, exact):
  """``step(actions, active)``, as the evaluation envs are stepped: the
  flagged envs step as gymnasium's do, the others do not move (their
  next steps, time limit included, are those of envs never stepped in
  between)."""
  env_fn = functools.partial(make, env_id, limit)
  batch = vector_envs.make_batch(env_fn, MEMBERS,
                                 vectorized=kind is not SerialEnvs)
  assert type(batch) is kind
  reference = [env_fn() for _ in range(MEMBERS)]
  compare = (np.testing.assert_array_equal if exact else functools.partial(
      np.testing.assert_allclose, rtol=0, atol=1e-9))
  for j, env in enumerate(reference):
    batch.reset(j, seed=200 + j)
    env.reset(seed=200 + j)
  space = reference[0].action_space
  rng = np.random.default_rng(1)
  truncated = 0
  for _ in range(3 * limit):
    actions = rng.uniform(space.low, space.high,
                          (MEMBERS, *space.shape)).astype(space.dtype)
    active = rng.random(MEMBERS) < 0.6
    got = batch.step(actions, active)
    for j in np.flatnonzero(active):
      obs, reward, term, trunc, _ = reference[j].step(actions[j])
      compare(got.observation[j], obs)
      compare(got.reward[j], reward)
      assert (got.terminated[j], got.truncated[j]) == (term, trunc)
      if term or trunc:
        truncated += trunc
        np.testing.assert_array_equal(batch.reset(j), reference[j].reset()[0])
  assert truncated >= 1


def test_serial_envs_step_each_env_and_keep_its_true_objective():
  class Scored(gym.Env):
    observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
    action_space = gym.spaces.Box(-1, 1, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
      super().reset(seed=seed)
      self.t = 0
      return np.zeros(1, np.float32), {}

    def step(self, action):
      self.t += 1
      done = self.t == 2
      info = {'true_objective': 7.0} if done else {}
      return (np.full(1, action[0], np.float32), float(self.t), done, False,
              info)

  batch = vector_envs.make_batch(Scored, 2)
  assert type(batch) is SerialEnvs
  for j in range(2):
    batch.reset(j, seed=j)
  first = batch.step(np.array([[0.5], [-0.5]], np.float32))
  np.testing.assert_array_equal(first.observation, [[0.5], [-0.5]])
  np.testing.assert_array_equal(first.reward, [1.0, 1.0])
  assert not first.terminated.any() and np.isnan(first.true_objective).all()
  second = batch.step(np.zeros((2, 1), np.float32))
  assert second.terminated.all()
  np.testing.assert_array_equal(second.true_objective, [7.0, 7.0])
  # The returned observations are the step's, not a view changed later.
  batch.step(np.ones((2, 1), np.float32))
  np.testing.assert_array_equal(first.observation, [[0.5], [-0.5]])


@pytest.mark.parametrize('env_fn', [
    functools.partial(make, 'CartPole-v1'),  # no batch for this env
    lambda: gym.wrappers.ClipReward(make('Pendulum-v1'), -1.0, 1.0),
    functools.partial(make, 'Pendulum-v1', render_mode='rgb_array'),
], ids=['no-batch', 'other-wrapper', 'render-mode'])
def test_envs_a_batch_cannot_serve_are_stepped_serially(env_fn):
  assert type(vector_envs.make_batch(env_fn, 2)) is SerialEnvs


def test_vectorized_off_or_one_env_gives_serial_envs():
  pendulum = functools.partial(make, 'Pendulum-v1')
  assert type(vector_envs.make_batch(pendulum, 2, vectorized=False)) is (
      SerialEnvs)
  assert type(vector_envs.make_batch(pendulum, 1)) is SerialEnvs
  assert type(vector_envs.make_batch(pendulum, 2)) is vector_envs.Pendulum


def test_an_actor_fills_the_same_chunks_with_and_without_vectorized_envs():
  """Hopper (terminations and time-limit truncations), warm-up actions,
  then the members' TD3 policies, and evaluations of 3 episodes every 20
  steps (one batch of 6 evaluation envs, stepped while their episodes
  last): every chunk field is equal, the evaluation episodes' too."""
  env_fn = functools.partial(make, 'Hopper-v5', 25)
  spec = make_env_spec(env_fn())
  config = TD3Config(hidden_sizes=(8,))
  agent = agents.make_agent('td3', spec, config)
  learner = PopulationLearner(agent)
  hparams = population_hparams(agent, 2, exploration_noise=0.3)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  tree = jax.device_get((learner.policy_params(state), hparams))
  agent_fn = functools.partial(agents.make_agent, 'td3', config=config)
  layout = chunk_layout(transition_fields(spec), 2, 80, 3)
  chunks = []
  with ParamStore.create(tree) as store:
    store.write(tree)
    for vectorized in (True, False):
      actor = Actor(members=[0, 1], env_fn=env_fn, agent_fn=agent_fn,
                    store=store, seed=3, warmup_steps=50,
                    eval_interval=20, eval_episodes=3,
                    vectorized_envs=vectorized)
      out = layout.views(bytearray(layout.nbytes))
      assert actor.fill(out)
      actor.close()
      chunks.append({k: np.array(v) for k, v in out.items()})
  vectorized, serial = chunks
  assert vectorized['terminated'].any() and vectorized['truncated'].any()
  evaluations = vectorized['episode_evaluation'][:vectorized['meta'][1]]
  assert evaluations.sum() >= 6  # ended evaluation episodes, both members
  for name in serial:
    np.testing.assert_array_equal(vectorized[name], serial[name], name)
