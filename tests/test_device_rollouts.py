"""The on-device path of agents that learn from their own rollouts: JAX
envs (gymnax) stepped inside the learner call (``fastpbrl.learner.collect.
rollout``, ``PopulationLearner.update_with_rollouts``,
``fastpbrl.datapath.device_rollouts.DeviceRollouts``).

Beside the built-in PPO, the agent is ``tests.rollout_agent_for_tests``
(a user agent, outside the package), so the tests also show that the
rollout contract of ``fastpbrl.agents.base`` works for user agents.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastpbrl
from fastpbrl import agents
from fastpbrl.config.derived import resolved
from fastpbrl.datapath import factory as datapath
from fastpbrl.datapath import protocol
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.device_rollouts import DeviceRollouts
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import rollout_agent_for_tests as rollout_agent

pytest.importorskip('gymnax')

CARTPOLE = 'gymnax:CartPole-v1'
# The test agent as --agent names it (T = 16, E = 1 in runs).
REF = 'tests.rollout_agent_for_tests:ROLLOUT_TEST'
T, E = 8, 2


# ------------------------------------------------------------- helpers

def make_agent(name, env_spec):
  """The test agent, or the built-in PPO, at the test's sizes."""
  if name == 'rollout_test':
    return rollout_agent.make_agent(env_spec, rollout_agent.RolloutTestConfig(
        rollout_length=T, num_envs=E, steps_per_call=T * E))
  return agents.make_agent(name, env_spec, agents.get(name).config(
      hidden_sizes=(16, 16), rollout_length=T, num_envs=E, epochs=2,
      batch_size=8))


def setup(n=3, iterations=1, seed=0, agent='rollout_test'):
  env = jax_envs.make(CARTPOLE)
  agent = make_agent(agent, env.env_spec)
  learner = PopulationLearner(agent, num_steps=iterations * T * E)
  hparams = population_hparams(agent, n)
  state = learner.init(jax.random.PRNGKey(seed), hparams)
  envs = collect.init(env, n, E, None, 0, jax.random.PRNGKey(seed + 1))
  return env, agent, learner, hparams, state, envs


def copied(tree):
  return jax.tree.map(jnp.copy, tree)


def pipeline_config(num_steps, **kw):
  return PipelineConfig(num_steps=num_steps, batch_size=16,
                        replay_capacity=1, **kw)


# --------------------------------------------------------------- tests

def test_rollout_steps_keep_episodes_and_the_behaviour_log_probs():
  """Each env's steps follow on (``observation[t + 1] ==
  next_observation[t]`` unless step ``t`` ended the episode), an ended
  episode's return is the sum of its rewards, ``log_prob`` is the
  behaviour policy's of the sampled action, and no ring is kept."""
  env, agent, learner, hparams, state, envs = setup(n=3)
  params = learner.policy_params(state)
  steps = 64  # CartPole's random-ish episodes end well within it
  new, (rollout, episodes) = jax.jit(
      lambda e: collect.rollout(env, agent, params, hparams, e, steps))(envs)
  assert new.replay is None
  assert rollout.observation.shape == (steps, 3, E, 4)
  assert rollout.action.dtype == jnp.int32
  np.testing.assert_array_equal(new.env_steps, steps * E)
  done = np.asarray(episodes.done)
  assert done.any()
  np.testing.assert_array_equal(
      done, (rollout.terminated + rollout.truncated) > 0)
  obs, next_obs = np.asarray(rollout.observation), np.asarray(
      rollout.next_observation)
  follows = ~done[:-1]
  np.testing.assert_array_equal(obs[1:][follows], next_obs[:-1][follows])
  assert (obs[1:][~follows] != next_obs[:-1][~follows]).any(axis=-1).all()
  # Returns: every episode that started in the rollout sums its rewards.
  reward = np.asarray(rollout.reward)
  running = np.zeros((3, E))
  started = np.zeros((3, E), bool)
  for t in range(steps):
    running += reward[t]
    for m, e in zip(*np.nonzero(done[t])):
      if started[m, e]:
        assert episodes.episode_return[t, m, e] == running[m, e]
    running[done[t]] = 0.0
    started |= done[t]
  logp = jax.vmap(jax.vmap(rollout_agent.log_prob), in_axes=(None, 0, 0))(
      params, rollout.observation, rollout.action)
  np.testing.assert_allclose(rollout.log_prob, logp, rtol=1e-5, atol=1e-6)


def test_rollouts_of_a_replay_free_envs_restart_members():
  env, _, _, _, _, envs = setup(n=3)
  envs = envs._replace(episode_length=envs.episode_length + 5)
  restarted = collect.restart(env, envs, jnp.array([False, True, False]),
                              jnp.zeros(3, jnp.int32))
  assert restarted.replay is None
  np.testing.assert_array_equal(restarted.episode_length,
                                [[5, 5], [0, 0], [5, 5]])


@pytest.mark.parametrize('name', ['rollout_test', 'ppo'])
def test_the_fused_call_is_collect_then_update_each_iteration(name):
  """Two iterations of ``update_with_rollouts`` equal, per iteration, a
  rollout with the current policies then ``PopulationLearner.update`` on
  it (``[N, 1, T, E]``); an inactive member keeps its state."""
  env, agent, learner, hparams, state, envs = setup(n=3, iterations=2,
                                                    agent=name)
  learner.compile_with_rollouts(agent, env, 2)
  active = np.array([True, False, True])
  one = PopulationLearner(agent, num_steps=T * E)
  collect_t = jax.jit(lambda p, h, e: collect.rollout(env, agent, p, h, e, T))
  ref_state, ref_envs = copied(state), copied(envs)
  ref_episodes, ref_metrics = [], []
  for _ in range(2):
    ref_envs, (rollout, episodes) = collect_t(
        one.policy_params(ref_state), hparams, ref_envs)
    ref_episodes.append(episodes)
    batch = jax.tree.map(lambda x: jnp.moveaxis(x, 1, 0)[:, None], rollout)
    ref_state, metrics = one.update(ref_state, hparams, batch, active)
    ref_metrics.append(metrics)
  initial = copied(state)
  (state, metrics), envs, episodes = learner.update_with_rollouts(
      state, hparams, hparams, envs, active)
  np.testing.assert_array_equal(metrics['finite'], [True] * 3)
  if 'stale_ratio' in metrics:  # the policy that acted is the one learning
    assert float(np.max(metrics['stale_ratio'])) < 1e-5
  tight = dict(rtol=1e-5, atol=1e-6)  # one program vs several: fusion only
  for k, v in metrics.items():
    if k != 'finite':
      assert v.shape == (3, 2)
      np.testing.assert_allclose(
          v, np.concatenate([m[k] for m in ref_metrics], 1), **tight)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **tight),
               state, ref_state)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a[1], b[1]),
               state, initial)  # the inactive member's
  np.testing.assert_array_equal(episodes.done.shape, (2, T, 3, E))
  np.testing.assert_array_equal(
      episodes.done, np.stack([e.done for e in ref_episodes]))
  np.testing.assert_array_equal(envs.env_steps, 2 * T * E)
  assert learner.compilations == 1
  learner.update_with_rollouts(state, jax.tree.map(lambda x: x * 0.5,
                                                  hparams),
                               hparams, envs, active)
  assert learner.compilations == 1  # new hyperparameters: no new trace


def rollouts(n=2, iterations=2, seed=0, mesh=None, **kw):
  env = jax_envs.make(CARTPOLE)
  agent = make_agent('rollout_test', env.env_spec)
  learner = PopulationLearner(agent, num_steps=iterations * T * E, mesh=mesh)
  return DeviceRollouts(env, agent, learner, n,
                        pipeline_config(learner.num_steps), seed=seed,
                        **kw), learner


def learn(path, learner, state, hparams, calls):
  """``calls`` learner calls as the run loop makes them: a publish at the
  start (a resume's gives the restored policies their version again) and
  one after every call."""
  path.publish(learner.policy_params(state), hparams)
  for _ in range(calls):
    state = path.learn(learner, state, hparams, hparams,
                       shared_critic=False).state
    path.publish(learner.policy_params(state), hparams)
  return state


def test_device_rollouts_is_a_data_path_without_replay():
  path, learner = rollouts(n=2, iterations=2)
  assert isinstance(path, protocol.DataPath)
  hparams = population_hparams(path.agent, 2)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  path.publish(learner.policy_params(state), hparams)
  call = path.learn(learner, state, hparams, hparams, shared_critic=False)
  np.testing.assert_array_equal(call.member_update_steps, [32, 32])
  np.testing.assert_array_equal(path.env_steps, [32, 32])
  assert path.update_steps == 32 and path.calls == 1
  assert path.update_steps_owed(32) == 0
  assert path.replay.state_rows(path.replay.state_dict()) == 0
  assert not path.restored_exactly
  path.copy_member_data([0], [1])  # nothing to copy: a no-op
  path.restart_members([1])
  np.testing.assert_array_equal(path.envs.episode_length[1], [0, 0])
  np.testing.assert_array_equal(path.last_active, [True, True])
  returns, lengths, _ = path.evaluate(learner.policy_params(call.state), hparams,
                                   2, seed=0)
  assert returns.shape == lengths.shape == (2, 2)
  assert path.random_states(5, seed=0).shape == (5, 4)
  path.close()


def test_a_resumed_path_continues_the_run_bit_for_bit():
  """Four calls equal two, a checkpoint of the path and the learner
  state, and two calls of a path built from that checkpoint."""
  path, learner = rollouts()
  hparams = population_hparams(path.agent, 2)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  unstopped = learn(path, learner, copied(state), hparams, 4)
  episodes = path.drain_episodes()
  first, learner = rollouts()
  state = learn(first, learner, state, hparams, 2)
  saved, steps = first.checkpoint_state(), first.env_steps
  done = first.drain_episodes()
  first.close()
  resumed, learner = rollouts(saved_state=saved, resume_env_steps=steps)
  assert resumed.restored_exactly
  state = learn(resumed, learner, state, hparams, 2)
  jax.tree.map(np.testing.assert_array_equal, state, unstopped)
  jax.tree.map(np.testing.assert_array_equal, resumed.envs, path.envs)
  assert done + resumed.drain_episodes() == episodes


def test_create_picks_device_rollouts_for_a_rollout_agent():
  config = fastpbrl.RunConfig(agent=REF, env=CARTPOLE, population_size=2)
  env = jax_envs.make(CARTPOLE)
  agent = agents.make_agent(REF, env.env_spec)
  learner = PopulationLearner(agent)
  path = datapath.create(resolved(config), agent, learner,
                         shared_replay=False)
  assert isinstance(path, DeviceRollouts)
  assert path.envs_per_member == agent.config.num_envs
  assert path.iterations == 1
  path.close()


TINY = dict(agent=REF, env=CARTPOLE, population_size=3, env_steps=256,
            hidden_sizes=(16, 16), eval_every=128, eval_episodes=2,
            progress=False, track='none')


def without_wall_time(path):
  with open(path) as f:
    return [line.split(',', 1)[1] for line in f]


def test_seeds_run_on_device_with_rollouts(tmp_path):
  fastpbrl.train('seeds', run_dir=str(tmp_path / 'run'), **TINY)
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert len(run.final_returns) == 3
  assert set(run.evaluations['env_steps']) >= {128, 256}
  assert run.episodes['env_steps'].max() <= 256


@pytest.mark.slow
def test_pbt_with_rollouts_resumes_bit_for_bit(tmp_path):
  """Same seed, same run; a PBT run stopped at 256 env steps and resumed
  to 512 (no replay to checkpoint: the path's envs, keys and counters are
  all) is the run never stopped."""
  kw = dict(TINY, env_steps=512, ready_after=128, checkpoint_every=8)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'a'), **kw)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'c'),
                 **dict(kw, env_steps=256))
  fastpbrl.train(resume=str(tmp_path / 'c'), env_steps=512)
  for name in ('final_returns.json', 'lineage.jsonl', 'hparams.csv'):
    assert (open(tmp_path / 'a' / name).read()
            == open(tmp_path / 'c' / name).read()), name
  for member in ('member_000.csv', 'member_001.csv', 'member_002.csv'):
    assert (without_wall_time(tmp_path / 'a' / 'members' / member)
            == without_wall_time(tmp_path / 'c' / 'members' / member))
  with open(tmp_path / 'a' / 'lineage.jsonl') as f:
    assert any(json.loads(line)['event'] == 'exploit' for line in f)


def compare_one_and_two_devices():
  """Run in a process with two (CPU) devices: three calls of the path
  with the population split over both are the one-device calls, to the
  float tolerance of a partitioned program (it may sum in another order),
  with the same episodes; the envs stay split by member."""
  assert jax.device_count() >= 2, jax.devices()
  results = []
  for mesh in (None, sharding.make_mesh(jax.devices()[:2])):
    path, learner = rollouts(n=4, mesh=mesh)
    hparams = population_hparams(path.agent, 4, lr=[1e-2, 2e-2, 3e-2, 4e-2])
    state = learn(path, learner, learner.init(jax.random.PRNGKey(0), hparams),
                  hparams, 3)
    results.append((jax.tree.map(np.asarray, state), path.drain_episodes()))
    if mesh is not None:
      assert len(path.envs.observation.sharding.device_set) == 2
  (one, one_episodes), (two, two_episodes) = results
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5,
                                                       atol=1e-6), one, two)
  assert one_episodes == two_episodes


@pytest.mark.slow
def test_rollouts_sharded_over_two_devices_are_the_one_device_run():
  env = {**os.environ, 'XLA_FLAGS': os.environ.get('XLA_FLAGS', '') +
         ' --xla_force_host_platform_device_count=2'}
  out = subprocess.run(
      [sys.executable, '-c', 'from tests import test_device_rollouts as t; '
       't.compare_one_and_two_devices()'],
      env=env, capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]


@pytest.mark.slow
def test_ppo_learns_cartpole_on_device(tmp_path):
  """The built-in PPO at SB3's defaults (T = 2048, one env, 64x64 replaced
  by 16x16 for speed) through ``fastpbrl.train``: 8,192 env steps lift
  both members well above a random policy's ~20 steps per episode."""
  fastpbrl.train('seeds', run_dir=str(tmp_path / 'run'), agent='ppo',
                 env=CARTPOLE, population_size=2, env_steps=8192,
                 steps_per_call=2048, hidden_sizes=(16, 16), eval_every=4096,
                 eval_episodes=2, progress=False, track='none')
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert min(run.final_returns) > 100, run.final_returns
