"""The actor loop, in-process on toy environments: terminated vs truncated,
the real final observation, warm-up then policy actions (against a
per-member reference), seeding, evaluation episodes and discrete actions."""

import functools
import threading
import time

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.actors import Actor, ParamStore, chunk_layout, member_seeds
from fastpbrl.agents.dqn import DQNConfig
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import transition_fields
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

TIME_LIMIT = 5
TERMINATE_AT = 3
# Rule 1 for an action of the TD3 policy below (3 inputs, 8 hidden units,
# tanh) plus its exploration noise (a normal draw) and the clip, in the
# actor's program against a per-member call: <= 32 roundings of sums whose
# terms add up to <= 16 (the observations hold episode and step counters).
# Another member, key or step is off by ~0.1 or more.
ACTION_ATOL = 16 * numerics.rounding_rtol(32)
# The env's rescaling to [-2, 2], -2 + (a + 1) * 0.5 * 4: 2 roundings of
# values <= 4.
SCALE_ATOL = 4 * numerics.rounding_rtol(2)


class StepEnv(gym.Env):
  """obs = [episode, step in episode, seeded noise drawn at reset].

  Reward = step in episode. Even episodes terminate at step 3; odd ones run
  into the time limit (5). Records every (observation, action) it sees.
  """

  def __init__(self, discrete: bool = False):
    self.observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    self.action_space = (gym.spaces.Discrete(3) if discrete else
                         gym.spaces.Box(-2.0, 2.0, (2,), np.float32))
    self.episode = -1
    self.t = 0
    self.noise = 0.0
    self.history = []

  def _obs(self):
    return np.array([self.episode, self.t, self.noise], np.float32)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.episode += 1
    self.t = 0
    self.noise = float(self.np_random.uniform())
    return self._obs(), {}

  def step(self, action):
    self.history.append((self._obs(), np.array(action)))
    self.t += 1
    terminated = self.episode % 2 == 0 and self.t == TERMINATE_AT
    return self._obs(), float(self.t), terminated, False, {}


def make_step_env(discrete=False):
  return gym.wrappers.TimeLimit(StepEnv(discrete), TIME_LIMIT)


def td3_setup(n, seed=0):
  spec = make_env_spec(make_step_env())
  config = TD3Config(hidden_sizes=(8,))
  agent = agents.make_agent('td3', spec, config)
  hparams = population_hparams(agent, n, exploration_noise=0.3)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(seed), hparams)
  tree = jax.device_get((learner.policy_params(state), hparams))
  agent_fn = functools.partial(agents.make_agent, 'td3', config=config)
  return spec, agent, tree, agent_fn


def new_chunk(spec, m, t, eval_episodes=1):
  layout = chunk_layout(transition_fields(spec), m, t, eval_episodes)
  return layout.views(bytearray(layout.nbytes))


@pytest.fixture(scope='module')
def store4():
  """One population and its published parameters, shared by the tests (the
  actors only read it)."""
  spec, agent, tree, agent_fn = td3_setup(4)
  with ParamStore.create(tree) as store:
    store.write(tree)
    yield spec, agent, tree, agent_fn, store


def make_actor(store4, members, **kwargs):
  spec, _, _, agent_fn, store = store4
  kwargs.setdefault('seed', 0)
  return Actor(members=members, env_fn=make_step_env, agent_fn=agent_fn,
               store=store, **kwargs)


def check_episode_structure(out, j):
  """Walks member row j: continuity, flags and the real final observation."""
  obs, nxt = out['observation'][j], out['next_observation'][j]
  term, trunc = out['terminated'][j], out['truncated'][j]
  np.testing.assert_array_equal(out['reward'][j], nxt[:, 1])
  boundaries = 0
  for t in range(obs.shape[0]):
    episode, step = nxt[t, 0], nxt[t, 1]
    assert episode == obs[t, 0] and step == obs[t, 1] + 1
    assert term[t] == (episode % 2 == 0 and step == TERMINATE_AT)
    assert trunc[t] == (episode % 2 == 1 and step == TIME_LIMIT)
    if t + 1 < obs.shape[0]:
      if term[t] or trunc[t]:
        boundaries += 1
        # next_observation is the final state, the next obs the reset one.
        assert obs[t + 1, 0] == episode + 1 and obs[t + 1, 1] == 0
        assert not np.array_equal(obs[t + 1], nxt[t])
      else:
        np.testing.assert_array_equal(obs[t + 1], nxt[t])
  return boundaries


def test_terminated_and_truncated_kept_apart_with_real_final_obs(store4):
  actor = make_actor(store4, [0, 1], warmup_steps=10**6)
  out = new_chunk(store4[0], 2, 20)
  assert actor.fill(out)
  for j in range(2):
    assert check_episode_structure(out, j) >= 4
  assert out['terminated'].sum() > 0 and out['truncated'].sum() > 0
  assert out['env_steps'].tolist() == [20, 20]
  meta = out['meta']
  assert meta[0] == 20
  records = [
      (int(out['episode_member'][k]), float(out['episode_return'][k]),
       int(out['episode_length'][k]), int(out['episode_evaluation'][k]),
       int(out['episode_env_steps'][k])) for k in range(meta[1])]
  # Lengths alternate 3 (terminated), 5 (truncated): ends at 3, 8, 11, 16, 19.
  for j in range(2):
    mine = [r for r in records if r[0] == j]
    assert [r[2] for r in mine] == [3, 5, 3, 5, 3]
    assert [r[4] for r in mine] == [3, 8, 11, 16, 19]
    assert [r[1] for r in mine] == [6, 15, 6, 15, 6]  # 1+...+length
    assert all(r[3] == 0 for r in mine)
  # The next chunk continues the same episodes.
  out2 = new_chunk(store4[0], 2, 4)
  actor.fill(out2)
  np.testing.assert_array_equal(out2['observation'][:, 0, :2],
                                [[5, 1], [5, 1]])
  actor.close()


def test_warmup_actions_are_random_then_the_members_policies(store4):
  spec, agent, tree, _, _ = store4
  warmup, steps = 6, 10
  members = [1, 2]
  actor = make_actor(store4, members, warmup_steps=warmup, seed=3)
  out = new_chunk(spec, 2, steps)
  actor.fill(out)
  actions = out['action']
  assert np.abs(actions).max() <= 1.0
  assert out['meta'][2] == 1  # acted with version 1 after warm-up
  params, hparams = tree
  for j, m in enumerate(members):
    key = jax.random.key(member_seeds(3, m).key)
    p_m = jax.tree.map(lambda x: x[m], params)
    h_m = jax.tree.map(lambda x: x[m], hparams)
    for t in range(steps):
      obs = out['observation'][j, t][None]
      expected = np.asarray(agent.act(p_m, obs, jax.random.fold_in(key, t),
                                      h_m, True))[0]
      if t < warmup:  # uniform random, not the policy
        # A uniform draw on [-1, 1]^2 lands within 1e-3 of the policy's
        # action with chance ~1e-6; the policy's own is within ACTION_ATOL.
        assert not np.allclose(actions[j, t], expected, atol=1e-3)
      else:  # one vectorized call == the per-member loop
        np.testing.assert_allclose(actions[j, t], expected, rtol=0,
                                   atol=ACTION_ATOL)
    # The env received the action rescaled to its [-2, 2] bounds.
    env_actions = np.stack(
        [a for _, a in actor._batch.envs[j].unwrapped.history])
    np.testing.assert_allclose(env_actions, 2.0 * actions[j], rtol=0,
                               atol=SCALE_ATOL)
  # Warm-up actions spread over [-1, 1]: 24 uniform draws miss either bound
  # with chance 0.65^24 = 3e-5.
  first = actions[:, :warmup].ravel()
  assert first.min() < -0.3 and first.max() > 0.3
  actor.close()


def test_a_resumed_actor_acts_with_the_policy_from_its_first_step(store4):
  """A resumed run's actors continue their members' counters and act with
  the restored (published) policies at once: no second random warm-up."""
  spec, agent, tree, _, _ = store4
  resumed_at, steps = 5000, 8
  members = [0, 3]
  actor = make_actor(store4, members, warmup_steps=1000, seed=4,
                     env_steps=[resumed_at] * 2,
                     random_until=[resumed_at] * 2)
  out = new_chunk(spec, 2, steps)
  actor.fill(out)
  params, hparams = tree
  for j, m in enumerate(members):
    key = jax.random.key(member_seeds(4, m).key)
    p_m = jax.tree.map(lambda x: x[m], params)
    h_m = jax.tree.map(lambda x: x[m], hparams)
    for t in range(steps):
      obs = out['observation'][j, t][None]
      # The exploration key continues from the resumed step count.
      expected = np.asarray(agent.act(
          p_m, obs, jax.random.fold_in(key, resumed_at + t), h_m, True))[0]
      np.testing.assert_allclose(out['action'][j, t], expected, rtol=0,
                                 atol=ACTION_ATOL)
  np.testing.assert_array_equal(out['env_steps'], [resumed_at + steps] * 2)
  actor.close()


def test_streams_depend_on_seed_and_member_not_on_the_layout(store4):
  spec = store4[0]
  together = make_actor(store4, [0, 1], warmup_steps=4, seed=11)
  alone = make_actor(store4, [1], warmup_steps=4, seed=11)
  other_seed = make_actor(store4, [1], warmup_steps=4, seed=12)
  out2, out1, out_other = (new_chunk(spec, 2, 8), new_chunk(spec, 1, 8),
                           new_chunk(spec, 1, 8))
  together.fill(out2)
  alone.fill(out1)
  other_seed.fill(out_other)
  for name in ('observation', 'reward', 'next_observation', 'terminated'):
    np.testing.assert_array_equal(out2[name][1], out1[name][0])
  # Policies vmapped over 2 or 1 members may round differently (rule 1).
  np.testing.assert_allclose(out2['action'][1], out1['action'][0], rtol=0,
                             atol=ACTION_ATOL)
  assert not np.array_equal(out1['observation'], out_other['observation'])
  assert not np.array_equal(out1['action'], out_other['action'])
  # Members differ from each other too.
  assert not np.array_equal(out2['action'][0], out2['action'][1])
  for a in (together, alone, other_seed):
    a.close()


def test_restart_resumes_the_schedule_with_fresh_seeds(store4):
  spec = store4[0]
  first = make_actor(store4, [0], warmup_steps=4, seed=5)
  restarted = make_actor(store4, [0], warmup_steps=4, seed=5, restart=1,
                         env_steps=[10])
  a, b = new_chunk(spec, 1, 4), new_chunk(spec, 1, 4)
  first.fill(a)
  restarted.fill(b)
  assert b['env_steps'].tolist() == [14]
  assert a['observation'][0, 0, 2] != b['observation'][0, 0, 2]
  # Past its warm-up: the restarted actor uses the policy (version 1); the
  # first one, warming up, took random actions whatever version it read.
  assert b['meta'][2] == 1
  assert not np.array_equal(a['action'], b['action'])
  first.close()
  restarted.close()


def test_evaluation_episodes_use_the_noise_free_policy(store4):
  spec, agent, tree, _, _ = store4
  actor = make_actor(store4, [2, 3], warmup_steps=0, eval_interval=4,
                     eval_episodes=2)
  out = new_chunk(spec, 2, 20, eval_episodes=2)
  actor.fill(out)
  n = int(out['meta'][1])
  evals = [(int(out['episode_member'][k]), float(out['episode_return'][k]),
            int(out['episode_length'][k]), int(out['episode_env_steps'][k]))
           for k in range(n) if out['episode_evaluation'][k]]
  for m in (2, 3):
    mine = [e for e in evals if e[0] == m]
    # Each evaluation plays its two episodes at once, one per evaluation
    # env. They start at steps 4, 8 and 13 (the next multiple of 4 after
    # the previous start, once that one is over), and the envs' episodes
    # alternate: terminated at 3, cut at 5, terminated at 3; the fourth
    # is still under way at the chunk's end.
    assert [e[2] for e in mine] == [3, 3, 5, 5, 3, 3]
    assert [e[1] for e in mine] == [6, 6, 15, 15, 6, 6]
    # Recorded at the evaluation's start: the steps of the policy played.
    assert [e[3] for e in mine] == [4, 4, 8, 8, 13, 13]
  # Training transitions are untouched by the evaluation envs.
  for j in range(2):
    check_episode_structure(out, j)
  # Evaluation actions are the deterministic policy of the right member.
  params, hparams = tree
  for j, m in enumerate((2, 3)):
    for env in actor._eval_envs[j]:
      history = env.unwrapped.history
      assert len(history) == 3 + 5 + 3 + 4
      assert_greedy(agent, params, hparams, m, history)
  actor.close()


def test_evaluations_keep_their_interval_when_their_episodes_would_not_fit(
    store4):
  """Three episodes of up to 5 steps, every 6 steps: played one after
  another they would take 11 steps and start every 12th (or later); played
  at once, an evaluation starts every 6 steps as asked."""
  spec = store4[0]
  actor = make_actor(store4, [0], warmup_steps=0, eval_interval=6,
                     eval_episodes=3)
  out = new_chunk(spec, 1, 40, eval_episodes=3)
  assert actor.fill(out)
  n = int(out['meta'][1])
  evals = [k for k in range(n) if out['episode_evaluation'][k]]
  starts = [int(out['episode_env_steps'][k]) for k in evals]
  assert starts == [6] * 3 + [12] * 3 + [18] * 3 + [24] * 3 + [30] * 3
  # Three evaluation envs with their own reset seeds: different noise in
  # their first observations.
  first_obs = [env.unwrapped.history[0][0] for env in actor._eval_envs[0]]
  assert len({float(o[2]) for o in first_obs}) == 3
  actor.close()


def assert_greedy(agent, params, hparams, m, history):
  """Every env action in ``history`` is member ``m``'s noise-free action
  (scaled to the env's [-2, 2])."""
  p_m = jax.tree.map(lambda x: x[m], params)
  h_m = jax.tree.map(lambda x: x[m], hparams)
  for obs, env_action in history:
    greedy = np.asarray(agent.act(p_m, obs[None], jax.random.key(0), h_m,
                                  False))[0]
    # The action's rounding (rule 1), doubled by the rescaling, and the
    # rescaling's own.
    np.testing.assert_allclose(env_action, 2.0 * greedy, rtol=0,
                               atol=2 * ACTION_ATOL + SCALE_ATOL)


def test_an_evaluation_plays_one_frozen_policy_version():
  spec, agent, tree, agent_fn = td3_setup(2, seed=1)
  params, hparams = tree
  other = (jax.tree.map(lambda x: -x, params), hparams)
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = Actor(members=[0, 1], env_fn=make_step_env, agent_fn=agent_fn,
                  store=store, seed=0, warmup_steps=0, eval_interval=4,
                  eval_episodes=2)
    out = new_chunk(spec, 2, 6, 2)  # the evaluation starts at step 4
    assert actor.fill(out)
    version_a = actor.policy_version
    store.write(other)  # new weights in the middle of the evaluation
    out2 = new_chunk(spec, 2, 14, 2)
    assert actor.fill(out2)
    assert actor.policy_version > version_a
    version_b = actor.policy_version
    n = int(out2['meta'][1])
    evals = [k for k in range(n) if out2['episode_evaluation'][k]]
    # Both episodes of the first evaluation (steps 4..6, at once) carry
    # version A; the later evaluations (from steps 8, 13, 16) version B.
    starts = [(int(out2['episode_member'][k]),
               int(out2['episode_start_version'][k]),
               int(out2['episode_policy_version'][k])) for k in evals]
    for m in (0, 1):
      mine = [v for mm, *v in starts if mm == m]
      assert mine[:2] == [[version_a, version_a]] * 2
      assert all(v == [version_b, version_b] for v in mine[2:])
    for j in range(2):
      for env in actor._eval_envs[j]:
        history = env.unwrapped.history
        # 3 steps of evaluation 1, then the later ones.
        first, second = history[:3], history[3:]
        assert len(second) == 5 + 3 + 4
        for weights, steps in ((params, first), (other[0], second)):
          assert_greedy(agent, weights, hparams, j, steps)
    actor.close()


def test_a_restart_starts_a_new_episode_and_warm_up_for_that_member():
  spec, agent, tree, agent_fn = td3_setup(2, seed=2)
  params, hparams = tree
  restarts = np.zeros(2, np.int64)
  with ParamStore.create((params, hparams, restarts)) as store:
    store.write((params, hparams, restarts))
    actor = Actor(members=[0, 1], env_fn=make_step_env, agent_fn=agent_fn,
                  store=store, seed=4, warmup_steps=2)
    out = new_chunk(spec, 2, 6)
    assert actor.fill(out)
    assert out['restart_count'].tolist() == [0, 0]
    assert out['restart_at'].tolist() == [0, 0]
    store.write((params, hparams, np.array([0, 1], np.int64)))
    out = new_chunk(spec, 2, 6)
    assert actor.fill(out)
    # Member 1's data belongs to restart 1 from the chunk's first step: a
    # fresh episode (step 0 of a new episode) and two random actions.
    assert out['restart_count'].tolist() == [0, 1]
    assert out['restart_at'].tolist() == [0, 0]
    assert out['observation'][1, 0, 1] == 0  # step in episode
    assert out['observation'][1, 0, 0] == 2  # a new (third) episode
    key = jax.random.key(member_seeds(4, 1).key)
    p1 = jax.tree.map(lambda x: x[1], params)
    h1 = jax.tree.map(lambda x: x[1], hparams)
    for t in range(6):
      expected = np.asarray(agent.act(
          p1, out['observation'][1, t][None],
          jax.random.fold_in(key, 6 + t), h1, True))[0]
      # A random warm-up action lands within ACTION_ATOL of the policy's
      # with chance ~1e-8.
      assert np.allclose(out['action'][1, t], expected, rtol=0,
                         atol=ACTION_ATOL) == (t >= 2)
    # Member 0 went on with its policy and its episode.
    assert out['observation'][0, 0, 0] == 1
    out = new_chunk(spec, 2, 3)
    assert actor.fill(out)
    assert out['restart_count'].tolist() == [0, 1]
    assert out['restart_at'].tolist() == [0, 0]
    actor.close()


def test_discrete_actions():
  spec = make_env_spec(make_step_env(discrete=True))
  config = DQNConfig(mlp_hidden_sizes=(8,))
  agent = agents.make_agent('dqn', spec, config)
  hparams = population_hparams(agent, 2)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  tree = jax.device_get((learner.policy_params(state), hparams))
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = Actor(members=[0, 1], env_fn=functools.partial(make_step_env, True),
                  agent_fn=functools.partial(agents.make_agent, 'dqn',
                                             config=config),
                  store=store, seed=0, warmup_steps=5)
    out = new_chunk(spec, 2, 12)
    actor.fill(out)
    assert out['action'].dtype == np.int32 and out['action'].shape == (2, 12)
    assert set(np.unique(out['action'])) <= {0, 1, 2}
    received = [int(a) for _, a in actor._batch.envs[0].unwrapped.history]
    assert received == out['action'][0].tolist()
    check_episode_structure(out, 0)
    actor.close()


def test_waits_for_first_parameters_and_stops_on_request():
  spec, _, tree, agent_fn = td3_setup(2)
  with ParamStore.create(tree) as store:  # nothing published
    stop = threading.Event()
    actor = Actor(members=[0, 1], env_fn=make_step_env, agent_fn=agent_fn,
                  store=store, seed=0, warmup_steps=2,
                  should_stop=stop.is_set)
    # Warm-up steps need no parameters.
    assert actor.fill(new_chunk(spec, 2, 2))
    threading.Timer(0.2, stop.set).start()
    start = time.monotonic()
    assert not actor.fill(new_chunk(spec, 2, 2))  # waited, then stopped
    assert 0.15 < time.monotonic() - start < 60  # waited; then stopped
    # Once parameters are published the actor proceeds.
    store.write(tree)
    stop.clear()
    out = new_chunk(spec, 2, 2)
    assert actor.fill(out) and out['meta'][2] == 1
    actor.close()


class ObjectiveEnv(StepEnv):
  """StepEnv that reports info['true_objective'] = 10 * episode at the end."""

  def step(self, action):
    obs, r, term, trunc, info = super().step(action)
    if term or self.t == TIME_LIMIT:
      info = {'true_objective': 10.0 * self.episode}
    return obs, r, term, trunc, info


def test_episode_records_start_version_and_true_objective(store4):
  spec, _, tree, agent_fn, store = store4
  env_fn = lambda: gym.wrappers.TimeLimit(ObjectiveEnv(), TIME_LIMIT)
  actor = Actor(members=[0], env_fn=env_fn, agent_fn=agent_fn, store=store,
                seed=0)
  out = new_chunk(spec, 1, 10)
  assert actor.fill(out)
  first_version = actor.policy_version
  n = int(out['meta'][1])
  # Episodes end at steps 3 and 8: objectives 0 and 10, both started and
  # ended under the version the actor read.
  np.testing.assert_array_equal(out['episode_objective'][:n], [0.0, 10.0])
  assert out['episode_start_version'][:n].tolist() == [first_version] * n
  store.write(tree)  # a new version mid-episode: the third episode spans it
  out = new_chunk(spec, 1, 3)
  assert actor.fill(out)
  assert actor.policy_version > first_version
  n = int(out['meta'][1])
  assert n == 1
  assert out['episode_start_version'][0] == first_version
  assert out['episode_policy_version'][0] == actor.policy_version


def test_missing_true_objective_is_nan(store4):
  actor = make_actor(store4, [0])
  out = new_chunk(store4[0], 1, 5)
  assert actor.fill(out)
  assert int(out['meta'][1]) >= 1
  assert np.isnan(out['episode_objective'][0])
