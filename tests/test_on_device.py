"""The on-device data path: JAX envs (gymnax) stepped inside the learner
call (``fastpbrl.envs.jax_envs``, ``fastpbrl.learner.collect``,
``fastpbrl.datapath.device_replay``, ``PopulationLearner.update_with_envs``)."""

import json
import math
import os

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastpbrl
from fastpbrl import agents
from fastpbrl.config.errors import ConfigError
from fastpbrl.core.types import ReplaySample
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.device_replay import DevicePipeline, EnvCall
from fastpbrl.envs import gym as envs
from fastpbrl.envs import gymnax_envs
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect
from fastpbrl.learner.collect import Plan
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import transition_fields

pytest.importorskip('gymnax')

PENDULUM = 'gymnax:Pendulum-v1'


def small_td3(env):
  spec = agents.get('td3')
  return agents.make_agent('td3', env.env_spec,
                           spec.config(hidden_sizes=(32, 32), batch_size=16))


def empty_replay(env, n, capacity=1000, layout='per_member'):
  return device_replay.init_state(layout, transition_fields(env.env_spec), n,
                                  capacity)


def test_gymnax_pendulum_steps_as_gymnasiums():
  """From the same state and actions, the adapter's step gives gymnasium's
  Pendulum-v1 observations and rewards (float32 against gymnasium's
  float64 arithmetic: 1e-4 relative)."""
  env = jax_envs.make(PENDULUM)
  reference = gym.make('Pendulum-v1').unwrapped
  reference.reset(seed=0)
  state, _ = env.reset(jax.random.PRNGKey(0))
  reference.state = np.array([float(state.theta), float(state.theta_dot)])
  rng = np.random.default_rng(0)
  step = jax.jit(env.step)
  for _ in range(50):
    u = rng.uniform(-2, 2, (1,)).astype(np.float32)
    state, obs, reward, terminated = step(state, jnp.asarray(u),
                                          jax.random.PRNGKey(1))
    ref_obs, ref_reward, ref_terminated, _, _ = reference.step(u)
    np.testing.assert_allclose(obs, ref_obs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(reward, ref_reward, rtol=1e-4, atol=1e-4)
    assert bool(terminated) == ref_terminated is False


def test_plan_splits_a_call_into_whole_groups():
  assert Plan.of(50, 1.0, 1) == Plan(1, 50, 50)
  assert Plan.of(50, 1.0, 1, 50) == Plan(50, 1, 1)
  assert Plan.of(50, 0.25, 1, 50) == Plan(50, 4, 1)  # 200 env steps
  assert Plan.of(50, 2.0, 1, 25) == Plan(25, 1, 2)  # 25 env steps
  assert Plan.of(50, 1.0, 64) == Plan(1, 1, 50)  # one batch of 64 envs
  assert Plan.of(50, 1.0, 8) == Plan(1, 7, 50)  # ceil(50 / 8) = 7 batches
  assert Plan.of(50, 1.0, 8).env_steps_per_call(8) == 56
  with pytest.raises(ValueError, match=r'--interleave 3: a learner call of '
                     r'50 update steps and 50 env-step batches splits into '
                     r'1, 2, 5, 10, 25, 50 groups'):
    Plan.of(50, 1.0, 1, 3)


def run_random(env_id, steps, n=2, e=1, capacity=1000, warmup=10**6):
  """``steps`` collect steps of random actions (all warm-up)."""
  env = jax_envs.make(env_id)
  agent = (small_td3(env) if env_id == PENDULUM else agents.make_agent(
      'dqn', env.env_spec))
  hparams = population_hparams(agent, n)
  params = jax.vmap(agent.policy_params)(jax.vmap(agent.init)(
      jax.random.split(jax.random.PRNGKey(0), n), hparams))
  state = collect.init(env, n, e, empty_replay(env, n, capacity), warmup,
                       jax.random.PRNGKey(3))
  run = jax.jit(lambda s: collect.run(env, agent, params, hparams, s, steps))
  return env, run(state)


def test_time_limit_truncates_and_keeps_the_real_next_observation():
  env, (state, episodes) = run_random(PENDULUM, 205)
  done = np.asarray(episodes.done)  # [T, N, E]
  assert np.flatnonzero(done[:, 0, 0]).tolist() == [199]
  assert np.asarray(episodes.episode_length)[199].tolist() == [[200], [200]]
  data = {k: np.asarray(v) for k, v in state.replay.data.items()}
  assert data['truncated'][:, 199].tolist() == [1.0, 1.0]
  assert data['terminated'].sum() == 0
  assert data['truncated'].sum() == 2
  # Within an episode, each row's next observation is the next row's
  # observation; across the reset it is not (a new episode starts).
  same = np.all(np.isclose(data['next_observation'][:, :204],
                           data['observation'][:, 1:205]), axis=-1)
  assert same[:, :199].all() and same[:, 200:].all()
  assert not same[:, 199].any()
  # Rewards are Pendulum's cost of the stored observation and the action
  # scaled from [-1, 1] to [-2, 2]: the replay holds what the env was fed.
  obs, action = data['observation'][:, :205], data['action'][:, :205, 0]
  theta, theta_dot = np.arctan2(obs[..., 1], obs[..., 0]), obs[..., 2]
  cost = theta**2 + 0.1 * theta_dot**2 + 0.001 * (2 * action)**2
  np.testing.assert_allclose(data['reward'][:, :205], -cost, rtol=1e-4,
                             atol=1e-4)
  assert int(state.env_steps[0]) == 205
  returns = np.asarray(episodes.episode_return)[199, :, 0]
  np.testing.assert_allclose(returns, data['reward'][:, :200].sum(axis=1),
                             rtol=1e-5)


def test_termination_is_not_a_truncation():
  """CartPole falls under random actions: terminated, never truncated, and
  the episode's return is its length (reward 1 per step)."""
  _, (state, episodes) = run_random('gymnax:CartPole-v1', 300)
  data = {k: np.asarray(v) for k, v in state.replay.data.items()}
  assert data['truncated'].sum() == 0
  terminated = data['terminated'][:, :300]
  assert (terminated.sum(axis=1) >= 3).all()
  done = np.asarray(episodes.done)[:, :, 0].T  # [N, T]
  np.testing.assert_array_equal(done, terminated.astype(bool))
  lengths = np.asarray(episodes.episode_length)[:, :, 0].T[done]
  returns = np.asarray(episodes.episode_return)[:, :, 0].T[done]
  np.testing.assert_allclose(returns, lengths)
  assert (lengths < 500).all()


def test_several_envs_per_member_fill_the_ring_member_by_member():
  _, (state, _) = run_random(PENDULUM, 10, n=3, e=4)
  assert np.asarray(state.replay.size).tolist() == [40, 40, 40]
  assert np.asarray(state.env_steps).tolist() == [40, 40, 40]
  obs = np.asarray(state.replay.data['observation'])  # [N, cap, 3]
  # Rows 0-3 are the 4 envs' first observations: 4 different resets.
  assert len({tuple(np.round(r, 5)) for r in obs[0, :4]}) == 4


def test_policy_acts_after_the_warm_up():
  """Warm-up actions are uniform; then the member's policy acts (TD3 with
  exploration noise 0 acts deterministically: the same observation gives
  the stored action)."""
  env = jax_envs.make(PENDULUM)
  agent = small_td3(env)
  hparams = population_hparams(agent, 2, exploration_noise=0.0)
  params = jax.vmap(agent.policy_params)(jax.vmap(agent.init)(
      jax.random.split(jax.random.PRNGKey(0), 2), hparams))
  state = collect.init(env, 2, 1, empty_replay(env, 2), 5,
                       jax.random.PRNGKey(0))
  state, _ = collect.run(env, agent, params, hparams, state, 12)
  data = state.replay.data
  for m in range(2):
    member = jax.tree.map(lambda x: x[m], params)
    hp = jax.tree.map(lambda x: x[m], hparams)
    expected = agent.act(member, data['observation'][m, :12],
                         jax.random.PRNGKey(9), hp, False)
    acted = np.isclose(np.asarray(expected), np.asarray(data['action'][m, :12]),
                       atol=1e-5).all(axis=-1)
    assert acted.tolist() == [False] * 5 + [True] * 7


def make_pipeline(n=2, warmup=100, ratio=1.0, counts=True, layout='per_member',
                  eval_interval=0, envs_per_member=1):
  env = jax_envs.make(PENDULUM)
  agent = small_td3(env)
  learner = PopulationLearner(agent, 10, 16)
  hparams = population_hparams(agent, n)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  config = PipelineConfig(num_steps=10, batch_size=16, replay_capacity=500,
                          warmup_steps=warmup, update_to_data_ratio=ratio,
                          warmup_counts_as_data=counts, layout=layout,
                          eval_interval=eval_interval, eval_episodes=2)
  pipeline = DevicePipeline(env, agent, learner, n, config, seed=0,
                            envs_per_member=envs_per_member)
  pipeline.publish(learner.policy_params(state), hparams)
  return pipeline, learner, state, hparams


def test_warm_up_then_catch_up_then_collecting_calls():
  """As the actor path's rate limiter: 100 warm-up steps, then 10 update-
  only calls of 10 steps (the ratio counts the warm-up), then calls that
  collect 10 env steps per 10 updates."""
  pipeline, learner, state, hparams = make_pipeline(warmup=100)
  kinds = []
  for _ in range(13):
    batch = pipeline.next_batch()
    if isinstance(batch, EnvCall):
      kinds.append('collect')
      state, metrics = pipeline.run_call(learner, state, hparams, hparams)
    else:
      assert isinstance(batch, ReplaySample)
      kinds.append('update')
      state, metrics = learner.update(state, hparams, batch)
    assert np.asarray(metrics['finite']).all()
  assert kinds == ['update'] * 10 + ['collect'] * 3
  assert pipeline.env_steps.tolist() == [130, 130]
  assert pipeline.update_steps == 130
  assert pipeline.calls == 13


def test_without_catch_up_the_first_call_collects():
  pipeline, *_ = make_pipeline(warmup=100, counts=False)
  assert isinstance(pipeline.next_batch(), EnvCall)
  assert pipeline.env_steps.tolist() == [100, 100]


def test_episodes_are_recorded_with_their_returns_and_steps():
  pipeline, learner, state, hparams = make_pipeline(warmup=0,
                                                    eval_interval=200)
  for _ in range(45):
    pipeline.next_batch()
    state, _ = pipeline.run_call(learner, state, hparams, hparams)
  records = pipeline.drain_episodes()
  training = [r for r in records if not r.evaluation]
  evaluations = [r for r in records if r.evaluation]
  assert sorted((r.member, r.env_steps) for r in training) == [
      (m, s) for m in range(2) for s in (200, 400)]
  assert all(r.episode_length == 200 for r in training)
  assert all(-2000 < r.episode_return < 0 for r in training)
  # Evaluations at 200 and 400 env steps: 2 episodes per member each.
  assert sorted((r.member, r.env_steps) for r in evaluations) == sorted(
      [(m, s) for m in range(2) for s in (200, 400)] * 2)
  assert pipeline.drain_episodes() == []


def test_restart_empties_the_ring_and_masks_the_member():
  pipeline, learner, state, hparams = make_pipeline(warmup=20, counts=False)
  pipeline.next_batch()
  state, _ = pipeline.run_call(learner, state, hparams, hparams)
  pipeline.restart_members([1])
  assert np.asarray(pipeline.envs.replay.size).tolist() == [30, 0]
  assert pipeline.envs.episode_length[1].tolist() == [0]
  pipeline.next_batch()
  assert pipeline.last_active.tolist() == [True, False]
  before = jax.tree.map(np.asarray, state)
  state, _ = pipeline.run_call(learner, state, hparams, hparams)
  after = jax.tree.map(np.asarray, state)
  same = jax.tree.map(lambda a, b: np.array_equal(a[1], b[1]), before, after)
  moved = jax.tree.map(lambda a, b: np.array_equal(a[0], b[0]), before, after)
  assert all(jax.tree.leaves(same)) and not all(jax.tree.leaves(moved))
  pipeline.next_batch()  # 10 more random steps: the warm-up is over
  assert pipeline.last_active.tolist() == [True, False]
  state, _ = pipeline.run_call(learner, state, hparams, hparams)
  pipeline.next_batch()
  assert pipeline.last_active.tolist() == [True, True]


def test_a_restart_of_a_shared_replay_names_the_flag():
  """A restart empties a member's ring; with one ring for everyone it is
  refused (a rule of one's own that restarts members, with
  --shared-replay), by name, before anything changes."""
  pipeline, *_ = make_pipeline(layout='shared')
  size = np.asarray(pipeline.envs.replay.size).tolist()
  with pytest.raises(ValueError, match='a rule that restarts members needs '
                                       r'per-member replays \(no '
                                       r'--shared-replay\)'):
    pipeline.restart_members([1])
  assert np.asarray(pipeline.envs.replay.size).tolist() == size


def test_copy_member_data_copies_the_ring():
  pipeline, learner, state, hparams = make_pipeline(warmup=0)
  pipeline.next_batch()
  state, _ = pipeline.run_call(learner, state, hparams, hparams)
  data = np.asarray(pipeline.envs.replay.data['observation'])
  pipeline.copy_member_data([0], [1])
  copied = np.asarray(pipeline.envs.replay.data['observation'])
  np.testing.assert_array_equal(copied[0], data[1])
  np.testing.assert_array_equal(copied[1], data[1])


def test_replay_state_round_trips_through_a_checkpoint_dict():
  pipeline, learner, state, hparams = make_pipeline(warmup=0)
  pipeline.next_batch()
  state, _ = pipeline.run_call(learner, state, hparams, hparams)
  saved = pipeline.replay.state_dict()
  assert pipeline.replay.state_rows(saved) == 10
  env = pipeline.env
  restored = DevicePipeline(env, pipeline.agent, learner, 2, pipeline.config,
                            resume_env_steps=[10, 10], replay_state=saved)
  for k, v in saved['data'].items():
    np.testing.assert_array_equal(
        np.asarray(restored.envs.replay.data[k])[:, :10], v)
  assert np.asarray(restored.envs.replay.size).tolist() == [10, 10]
  # A resumed member acts with its policy at once (no random warm-up).
  assert np.asarray(restored.envs.warmup_left).tolist() == [0, 0]


def test_bad_env_ids_stop_with_one_line_naming_env():
  with pytest.raises(ConfigError, match=r"--env 'gymnax:Nope-v0': Nope-v0 is "
                     r"not a gymnax env; gymnax has CartPole-v1"):
    fastpbrl.train('seeds', env='gymnax:Nope-v0')
  with pytest.raises(ConfigError, match='downloads its data'):
    fastpbrl.train('seeds', env='gymnax:MNISTBandit-bsuite')

  class Discrete:  # a gymnax space of that name (FrozenLake-misc's, in
    n = 16         # gymnax releases that have it)

  with pytest.raises(jax_envs.JaxEnvError, match=r"--env 'gymnax:Lake': "
                     r'observation space Discrete is not supported'):
    gymnax_envs.observation_spec('gymnax:Lake', Discrete())
  with pytest.raises(ConfigError, match=r'--agent dqn on --env '
                     r'gymnax:Pendulum-v1'):
    fastpbrl.train('seeds', env='gymnax:Pendulum-v1', agent='dqn')
  try:
    import brax  # noqa: F401
  except ImportError:
    with pytest.raises(ConfigError, match=r"--env 'brax:hopper' needs Brax "
                       r".*pip install 'fastpbrl\[brax\]'"):
      fastpbrl.train('seeds', env='brax:hopper')
  else:
    with pytest.raises(ConfigError, match="Brax has no 'nope'"):
      fastpbrl.train('seeds', env='brax:nope')


def test_gymnasium_view_plays_the_jax_env():
  env = envs.make_env(PENDULUM)
  obs, _ = env.reset(seed=3)
  assert obs.shape == (3,) and env.action_space.shape == (1,)
  steps = 0
  while True:
    obs, reward, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
    steps += 1
    assert not terminated and reward <= 0
    if truncated:
      break
  assert steps == 200


TINY = dict(env=PENDULUM, population_size=2, env_steps=600, warmup_steps=100,
            hidden_sizes=(32, 32), batch_size=16, steps_per_call=10,
            eval_every=200, eval_episodes=2, progress=False, track='none')


@pytest.mark.slow
def test_pbt_runs_on_device_and_logs_like_the_actor_path(tmp_path):
  result = fastpbrl.train('pbt', run_dir=str(tmp_path / 'run'),
                          ready_after=200, **TINY)
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert len(run.final_returns) == 2
  assert all(math.isfinite(x) for x in run.final_returns)
  evaluations = run.evaluations
  assert set(evaluations['env_steps']) >= {200, 400}
  assert (run.episodes['episode_length'] == 200).all()
  with open(tmp_path / 'run' / 'lineage.jsonl') as f:
    assert len(f.readlines()) >= 1  # PBT decided at 200 and 400 steps
  assert result.best_member in (0, 1)


def without_wall_time(path):
  """A member CSV's rows without the wall time (which a resume changes)."""
  with open(path) as f:
    return [line.split(',', 1)[1] for line in f]


def final_checkpoint(run_dir):
  from fastpbrl.run.checkpoint import Checkpointer
  checkpointer = Checkpointer(str(run_dir))
  try:
    step = checkpointer.latest_step()
    restored = checkpointer._manager.restore(step)
    return step, jax.tree.map(np.asarray, dict(restored.state))
  finally:
    checkpointer.close()


@pytest.mark.slow
def test_same_seed_same_run_and_a_resume_is_the_run_bit_for_bit(tmp_path):
  """On the device everything is a function of the seed: two runs take the
  same decisions and end with the same returns. A run stopped at 400 steps
  and resumed to 600 with its replay (env states, keys and counters are in
  every checkpoint) is the run never stopped, bit for bit: the same
  episodes, hyperparameters, decisions, final returns and parameters."""
  kw = dict(TINY, ready_after=200, checkpoint_replay=True,
            checkpoint_every=100)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'a'), **kw)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'b'), **kw)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'c'), **dict(kw,
                                                              env_steps=400))
  fastpbrl.train(resume=str(tmp_path / 'c'), env_steps=600)
  for run in 'bc':
    for name in ('final_returns.json', 'lineage.jsonl', 'hparams.csv'):
      assert (open(tmp_path / 'a' / name).read()
              == open(tmp_path / run / name).read()), (run, name)
    for member in ('member_000.csv', 'member_001.csv'):
      assert (without_wall_time(tmp_path / 'a' / 'members' / member)
              == without_wall_time(tmp_path / run / 'members' / member))
  step, state = final_checkpoint(tmp_path / 'a')
  assert final_checkpoint(tmp_path / 'c')[0] == step
  jax.tree.map(np.testing.assert_array_equal, state,
               final_checkpoint(tmp_path / 'c')[1])
  with open(tmp_path / 'a' / 'lineage.jsonl') as f:
    assert any(json.loads(line)['event'] == 'exploit' for line in f)


@pytest.mark.slow
def test_shared_replay_runs_on_device_and_resumes(tmp_path, monkeypatch):
  """--shared-replay: the pipeline keeps one ring for all members, in the
  run and in its resume from a checkpoint that holds that ring."""
  layouts = []
  init = DevicePipeline.__init__

  def recording_init(self, *args, **kwargs):
    layouts.append(args[4].layout == 'shared')  # its PipelineConfig
    init(self, *args, **kwargs)

  monkeypatch.setattr(DevicePipeline, '__init__', recording_init)
  kw = dict(TINY, shared_replay=True, checkpoint_replay=True,
            ready_after=200)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'run'),
                 **dict(kw, env_steps=400))
  fastpbrl.train(resume=str(tmp_path / 'run'), env_steps=600)
  assert layouts == [True, True]
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert run.episodes['env_steps'].max() == 600
  assert all(math.isfinite(x) for x in run.final_returns)


@pytest.mark.slow
@pytest.mark.parametrize('shared_replay', [False, True])
def test_population_sharded_over_two_devices(tmp_path, shared_replay):
  """The envs, rings and members split over 2 (CPU) devices: the run is
  the one-device run's (same seed, same returns, to float tolerance of a
  partitioned program); a shared ring is replicated on both."""
  code = (
      'import json, fastpbrl\n'
      f'kw = {dict(TINY, shared_replay=shared_replay)!r}\n'
      "kw['hidden_sizes'] = tuple(kw['hidden_sizes'])\n"
      "for d in ('1', '2'):\n"
      f"  fastpbrl.train('seeds', run_dir='{tmp_path}/d' + d, devices=d, **kw)\n"
      f"print(json.dumps([json.load(open('{tmp_path}/d' + d + "
      "'/final_returns.json'))['final_returns'] for d in '12']))\n")
  env = {**os.environ, 'XLA_FLAGS': os.environ.get('XLA_FLAGS', '') +
         ' --xla_force_host_platform_device_count=2'}
  import subprocess
  import sys
  out = subprocess.run([sys.executable, '-c', code], env=env,
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-3000:]
  one, two = json.loads(out.stdout.strip().splitlines()[-1])
  np.testing.assert_allclose(one, two, rtol=0.05)


def test_a_buffer_held_twice_is_copied_before_it_is_donated():
  """Brax's reset returns one array as both reward and done: donating
  both would fail, so the driver copies the repeat."""
  from fastpbrl.datapath.device_family import unaliased
  zero = jnp.zeros((2, 1))
  envs = collect.EnvsState({'reward': zero, 'done': zero}, zero, zero, zero,
                           jnp.zeros(2), jnp.zeros(2), None, jnp.zeros(2))
  out = unaliased(envs)
  pointers = [x.unsafe_buffer_pointer() for x in jax.tree.leaves(out)]
  assert len(set(pointers)) == len(pointers)
  kept = [x is zero for x in jax.tree.leaves(out)]
  assert sum(kept) == 1  # the first use is kept, the others copied


@pytest.mark.slow
def test_cemrl_shared_critic_runs_on_device(tmp_path):
  """The shared-critic learner (CEM-RL, DvD) compiles its fused call too:
  the members act with the policies of the one shared state."""
  kw = dict(TINY, population_size=4)
  del kw['env_steps']
  fastpbrl.train('cemrl', run_dir=str(tmp_path / 'run'),
                 total_env_steps=2400, **kw)
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert len(run.final_returns) == 4
  assert set(run.evaluations['env_steps']) >= {200, 400}


@pytest.mark.slow
def test_pb2_is_reproducible_and_resumes_with_its_history(tmp_path):
  """PBT with --explore pb2 on the device: a run stopped after its first
  decisions and resumed (the GP's data in its checkpoint) decides again,
  and chooses what the run never stopped chose: the same hyperparameters
  for the same seed, decision for decision."""
  kw = dict(TINY, population_size=4, env_steps=1_000, explore='pb2',
            ready_after=200, fraction=0.25, checkpoint_replay=True)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'a'), **kw)
  fastpbrl.train('pbt', run_dir=str(tmp_path / 'c'), **dict(kw,
                                                              env_steps=600))
  stopped = open(tmp_path / 'c' / 'lineage.jsonl').read().splitlines()
  fastpbrl.train(resume=str(tmp_path / 'c'), env_steps=1_000)
  lineage = [open(tmp_path / name / 'lineage.jsonl').read().splitlines()
             for name in ('a', 'c')]
  exploits = [json.loads(line) for line in lineage[0]
              if json.loads(line)['event'] == 'exploit']
  assert len(exploits) >= 2
  assert any(e['step'] <= 600 for e in exploits)  # before the stop
  assert max(e['step'] for e in exploits) > 600  # and after the resume
  assert len(stopped) < len(lineage[1])
  assert lineage[0] == lineage[1]
  for name in ('final_returns.json', 'hparams.csv'):
    assert (open(tmp_path / 'a' / name).read()
            == open(tmp_path / 'c' / name).read()), name


@pytest.mark.slow
def test_hypertrick_evicts_and_restarts_slots_on_device(tmp_path):
  """HyperTrick on the device: losing slots are evicted and start new
  configurations from scratch (an empty ring and a new warm-up, through
  ``DevicePipeline.restart_members``), and the run goes on to its end."""
  kw = dict(TINY, population_size=2, env_steps=1_200)
  fastpbrl.train('hypertrick', run_dir=str(tmp_path / 'run'), num_workers=4,
                 num_phases=2, phase_env_steps=200, **kw)
  with open(tmp_path / 'run' / 'rule.csv') as f:
    launched = [float(line.split(',')[3]) for line in f.readlines()[1:]
                if line.split(',')[2] == 'workers_launched']
  assert max(launched) >= 3  # a slot took a third configuration
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert len(run.final_returns) == 2
  assert all(math.isfinite(x) for x in run.final_returns)


@pytest.mark.slow
@pytest.mark.parametrize('rule', ['cemrl', 'dvd'])
def test_rules_that_query_the_data_path_run_on_device(tmp_path, rule):
  """CEM-RL's mean-policy evaluation and DvD's probe states come from the
  on-device data path (``Observation.data``): both run on a gymnax env
  and end with finite returns."""
  kw = dict(TINY, population_size=4)
  if rule == 'cemrl':
    del kw['env_steps']
    kw['total_env_steps'] = 2400
  else:
    kw.update(env_steps=600, lambda_mode='schedule')
  fastpbrl.train(rule, run_dir=str(tmp_path / 'run'), **kw)
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  assert len(run.final_returns) == 4
  assert np.isfinite(np.asarray(run.final_returns, float)).all()
  if rule == 'cemrl':
    rows = open(tmp_path / 'run' / 'mean_policy.csv').read().splitlines()
    assert len(rows) >= 2  # header and a generation
    assert all(math.isfinite(float(r.split(',')[-1])) for r in rows[1:])
