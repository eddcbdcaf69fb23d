"""The on-policy actor path (``fastpbrl.datapath.actor_rollouts``): each rollout is
``T`` consecutive steps of one env collected by the newest published
policy, runs through ``fastpbrl.train`` finish and resume, and nothing
leaks."""

import csv
import functools
import os
import signal

import gymnasium as gym
import jax
import numpy as np
import pytest

import fastpbrl
from fastpbrl import agents
from fastpbrl.actors import (Actor, ParamStore, chunk_layout,
                             default_num_processes)
from fastpbrl.agents import ppo
from fastpbrl.config.derived import resolved
from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import Rollout, make_env_spec
from fastpbrl.datapath import factory as datapath
from fastpbrl.datapath import protocol
from fastpbrl.datapath.actor_rollouts import (ActorRollouts,
                                              check_rollout_settings,
                                              rollout_fields)
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import rollout_agent_for_tests as test_agent
from tests.test_preemption import LINE, last_line, stopped_by_sigterm

REF = 'tests.rollout_agent_for_tests:ROLLOUT_TEST'
T = 16


def our_segments():
  return [f for f in os.listdir('/dev/shm')
          if f.startswith(f'fpbrl_{os.getpid()}_')]


def population(n=2, seed=0):
  agent = agents.make_agent(REF, make_env_spec(gym.make('CartPole-v1')))
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(seed), hparams)
  return agent, learner, state, hparams


def open_rollouts(agent, learner, state, hparams, processes=1, **config):
  path = ActorRollouts(
      'CartPole-v1', functools.partial(agents.make_agent, REF),
      # Layouts only: the actors wait for the first publish.
      jax.eval_shape(learner.policy_params, state),
      jax.eval_shape(lambda h: h, hparams),
      PipelineConfig(num_steps=T, num_actor_processes=processes,
                     stall_timeout_s=60.0, **config),
      rollout_length=T, seed=3, agent=agent)
  return path


def check_consecutive(rollout):
  """Each member's steps follow one another in its env."""
  obs, next_obs = rollout.observation, rollout.next_observation
  done = np.maximum(rollout.terminated, rollout.truncated) > 0
  for m in range(obs.shape[0]):
    for t in range(obs.shape[1] - 1):
      if not done[m, t]:
        np.testing.assert_array_equal(next_obs[m, t], obs[m, t + 1])
      else:  # the env reset: a new episode's first observation
        assert not np.array_equal(next_obs[m, t], obs[m, t + 1])


def behave_log_probs(params, rollout):
  """``[N, T]`` log-probs of the rollout's actions, recomputed here from
  the published ``params`` of each member."""
  return np.stack([
      np.asarray(test_agent.log_prob(
          jax.tree.map(lambda x: x[m], params), rollout.observation[m],
          rollout.action[m]))
      for m in range(rollout.action.shape[0])])


@pytest.mark.parametrize('processes', [1, 2])
def test_each_rollout_is_consecutive_steps_of_the_version_it_learns(
    processes):
  agent, learner, state, hparams = population()
  with open_rollouts(agent, learner, state, hparams, processes) as path:
    for version in (1, 2, 3):
      params = learner.policy_params(state)
      assert path.publish(params, hparams) == version
      rollout = path.next_rollout(timeout=60)
      assert rollout.observation.shape == (2, T, 4)
      check_consecutive(rollout)
      # Exactly the published version's log-probs: nothing stale. The
      # actor's jitted CPU call and this one round alike up to float32.
      np.testing.assert_allclose(rollout.log_prob,
                                 behave_log_probs(params, rollout),
                                 rtol=0, atol=1e-5)
      np.testing.assert_array_equal(path.env_steps, [T * version] * 2)
      # The learner's call on this very rollout: its first step's ratio
      # is the behaviour's, 1 (float32 recomputation as above).
      state, metrics = learner.update(
          state, hparams, jax.tree.map(lambda x: x[:, None, :, None],
                                       rollout))
      assert float(np.max(metrics['stale_ratio'])) < 1e-5
  assert not our_segments()


def test_learn_needs_a_publish_between_calls():
  agent, learner, state, hparams = population()
  with open_rollouts(agent, learner, state, hparams) as path:
    path.publish(learner.policy_params(state), hparams)
    call = path.learn(learner, state, hparams, hparams, shared_critic=False)
    np.testing.assert_array_equal(call.member_update_steps, [T, T])
    assert float(np.max(call.metrics['stale_ratio'])) < 1e-5
    with pytest.raises(RuntimeError, match='publish after every learner'):
      path.learn(learner, call.state, hparams, hparams, shared_critic=False)
  assert not our_segments()


def test_the_actor_path_refuses_what_it_cannot_do_in_one_line():
  config = test_agent.RolloutTestConfig
  with pytest.raises(ValueError, match='^--steps-per-call must be'):
    check_rollout_settings(config(steps_per_call=2 * T), 2 * T)
  with pytest.raises(ValueError, match='^--agent ppo: num_envs must be 1'):
    check_rollout_settings(config(num_envs=2, steps_per_call=2 * T), 2 * T,
                           'ppo')


def test_datapath_create_picks_the_actor_rollouts():
  agent, learner, _, _ = population()
  config = RunConfig(env='CartPole-v1', agent=REF, population_size=2,
                     num_actors=1, env_steps=10 * T)
  path = datapath.create(resolved(config), agent, learner,
                         shared_replay=False)
  try:
    assert isinstance(path, ActorRollouts)
    assert isinstance(path, protocol.DataPath)
    assert path.replay.state_rows(path.replay.state_dict()) == 0
    assert path.checkpoint_state() is None and not path.restored_exactly
  finally:
    path.close()
  assert not our_segments()


TINY = dict(agent=REF, env='CartPole-v1', population_size=2,
            hidden_sizes=(16, 16), steps_per_call=T, batch_size=16,
            num_actors=1, eval_every=10 * T, eval_episodes=1,
            progress=False)


@pytest.mark.parametrize('rule, settings', [
    ('seeds', {}), ('pbt', {'ready_after': 10 * T, 'fraction': 0.5})])
def test_a_run_through_train_finishes_and_writes_its_logs(
    tmp_path, rule, settings):
  run_dir = str(tmp_path / rule)
  result = fastpbrl.train(rule, env_steps=20 * T, run_dir=run_dir, seed=1,
                          **TINY, **settings)
  # Every call learns one rollout of T env steps per member: the update
  # steps are the env steps, exactly.
  assert result.run.calls == 20
  assert result.run.env_steps == result.run.update_steps == 20 * T
  assert os.path.exists(os.path.join(run_dir, 'summary.txt'))
  assert os.path.exists(os.path.join(run_dir, 'hparams.csv'))
  assert len(result.run.final_returns) == 2
  for m in range(2):  # training and evaluation episodes, as the actors'
    with open(os.path.join(run_dir, 'members', f'member_00{m}.csv')) as f:
      kinds = {row['evaluation'] for row in csv.DictReader(f)}
    assert kinds == {'False', 'True'}
  if rule == 'pbt':
    events = [e['event'] for e in result.lineage]
    assert events.count('init') == 2 and 'exploit' in events
  assert not our_segments()


@pytest.mark.parametrize('cores, members, off_policy, on_policy', [
    (2, 4, 1, 2), (16, 4, 4, 4), (8, 16, 7, 8), (1, 4, 1, 1), (4, 1, 1, 1)])
def test_on_policy_actors_default_to_every_core(monkeypatch, cores, members,
                                                off_policy, on_policy):
  # Synchronous collection: the learner waits while the actors step, so
  # no core is kept for it; off-policy, the learner runs beside them.
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: set(range(cores)))
  assert default_num_processes(members) == off_policy
  assert default_num_processes(members, on_policy=True) == on_policy


def test_the_on_policy_path_starts_an_actor_per_core(monkeypatch):
  monkeypatch.setattr(os, 'sched_getaffinity', lambda pid: {0, 1})
  agent, learner, state, hparams = population()
  with open_rollouts(agent, learner, state, hparams, processes=None) as path:
    assert path._pool.num_processes == 2
  assert not our_segments()


def episodes_of(run_dir, member):
  """A member's training and evaluation episodes, without wall times."""
  with open(os.path.join(run_dir, 'members', f'member_00{member}.csv')) as f:
    return [{k: v for k, v in row.items() if k != 'wall_time'}
            for row in csv.DictReader(f)]


@pytest.mark.slow
def test_the_split_of_members_over_actor_processes_changes_no_result(
    tmp_path):
  # Each member's env seeds and sampling keys are its own and each rollout
  # is collected by the version it learns (synchronous): one process for
  # both members or one each gives the same episodes, hence the same
  # updates. CartPole's returns count steps, so they compare exactly.
  episodes_1, final_1 = _seeds_run(str(tmp_path / 'p1'), num_actors=1)
  episodes_2, final_2 = _seeds_run(str(tmp_path / 'p2'), num_actors=2)
  assert all(len(e) > 3 for e in episodes_1)  # several episodes a member
  assert episodes_1 == episodes_2
  np.testing.assert_array_equal(final_1, final_2)
  assert not our_segments()


def _seeds_run(run_dir: str, num_actors: int):
  """Each member's episodes and the final returns of a tiny seeds run."""
  result = fastpbrl.train('seeds', env_steps=12 * T, run_dir=run_dir,
                          seed=2, **{**TINY, 'num_actors': num_actors,
                                     'eval_every': 6 * T})
  return ([episodes_of(run_dir, m) for m in range(2)],
          result.run.final_returns)


@pytest.mark.slow
def test_the_actors_xla_scheduler_changes_no_result(tmp_path, monkeypatch):
  # The actors run a policy call's steps in order (ACTOR_XLA_FLAGS), for
  # speed only: under XLA's default, concurrent scheduler (set in
  # XLA_FLAGS, which the actor processes inherit and keep) the same
  # arithmetic runs, so the episodes are the same.
  episodes, final = _seeds_run(str(tmp_path / 'in_order'), num_actors=1)
  # Beside the suite's own flags (conftest), which both runs keep.
  monkeypatch.setenv('XLA_FLAGS', os.environ.get('XLA_FLAGS', '') +
                     ' --xla_cpu_enable_concurrency_optimized_scheduler=true')
  concurrent, final_concurrent = _seeds_run(str(tmp_path / 'concurrent'),
                                            num_actors=1)
  assert all(len(e) > 3 for e in episodes)
  assert episodes == concurrent
  np.testing.assert_array_equal(final, final_concurrent)


@pytest.mark.slow
def test_sigterm_checkpoints_and_the_resumed_run_continues(tmp_path):
  run_dir = str(tmp_path / 'run')
  flags = ['--agent', REF, '--env', 'CartPole-v1', '--population-size', '2',
           '--hidden-sizes', '16', '16', '--steps-per-call', str(T),
           '--batch-size', '16', '--num-actors', '1', '--eval-every',
           str(10 * T), '--checkpoint-every', str(2 * T), '--no-progress',
           '--env-steps', '10000000',
           # No warm-up on this path; the setting's check still reads it.
           '--warmup-steps', str(T)]
  err = stopped_by_sigterm(flags, run_dir)
  match = LINE.match(last_line(err))
  assert match, err
  assert 'Traceback' not in err and 'leaked' not in err
  calls, env_steps = int(match.group(2)), int(match.group(3))
  assert env_steps == calls * T  # whole rollouts, one per call
  result = fastpbrl.train(resume=run_dir, env_steps=env_steps + 4 * T,
                          progress=False)
  assert result.run.calls == calls + 4
  assert result.run.env_steps == env_steps + 4 * T
  assert not our_segments()



def test_a_killed_actor_is_restarted_and_rollouts_stay_on_version():
  agent, learner, state, hparams = population()
  with open_rollouts(agent, learner, state, hparams) as path:
    path.publish(learner.policy_params(state), hparams)
    rollout = path.next_rollout(timeout=60)
    os.kill(path.pool.pids()[0], signal.SIGKILL)  # waiting for version 2
    state, _ = learner.update(
        state, hparams, jax.tree.map(lambda x: x[:, None, :, None], rollout))
    params = learner.policy_params(state)
    assert path.publish(params, hparams) == 2
    rollout = path.next_rollout(timeout=120)
    check_consecutive(rollout)
    np.testing.assert_allclose(rollout.log_prob,
                               behave_log_probs(params, rollout),
                               rtol=0, atol=1e-5)
    assert [f.restarted for f in path.pool.failures] == [True]
  assert not our_segments()


def test_rollouts_continue_the_episodes_and_a_restart_starts_new_ones():
  agent, learner, state, hparams = population()
  params = learner.policy_params(state)
  with open_rollouts(agent, learner, state, hparams) as path:
    path.publish(params, hparams)
    first = path.next_rollout(timeout=60)
    path.drain_episodes()
    path.restart_members([0])  # goes out with the next publish
    path.publish(params, hparams)
    second = path.next_rollout(timeout=60)
    # Seed 3's first rollouts end no episode on their last step, so the
    # envs' next observations are mid-episode.
    assert not (np.maximum(first.terminated, first.truncated)[:, -1]).any()
    # Member 1 goes on where its last rollout stopped; member 0 starts a
    # new episode.
    np.testing.assert_array_equal(second.observation[1, 0],
                                  first.next_observation[1, -1])
    assert not np.array_equal(second.observation[0, 0],
                              first.next_observation[0, -1])
    # Its cut episode is not reported: member 0's training episodes all
    # started in the second rollout.
    records = [r for r in path.drain_episodes()
               if r.member == 0 and not r.evaluation]
    assert all(r.episode_length <= T for r in records)
  assert not our_segments()


def test_an_on_policy_actor_waits_for_each_new_version_and_can_stop():
  agent, learner, state, hparams = population()
  params = learner.policy_params(state)
  tree = (jax.device_get(params), jax.device_get(hparams),
          np.zeros(2, np.int64))
  layout = chunk_layout(rollout_fields(agent.env_spec), 2, T)
  out = layout.views(bytearray(layout.nbytes))
  stop = []
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = Actor(members=[0, 1], env_fn=functools.partial(
        gym.make, 'CartPole-v1'), agent_fn=functools.partial(
            agents.make_agent, REF), store=store, seed=0,
        should_stop=lambda: bool(stop), on_policy=True)
    try:
      assert actor.fill(out)
      assert out['meta'][2] == 1  # the version it collected with
      np.testing.assert_allclose(
          out['log_prob'], behave_log_probs(params, Rollout(**{
              k: out[k] for k in Rollout._fields})), rtol=0, atol=1e-5)
      # Version 1 again: it waits, and a stop ends the wait (no chunk).
      stop.append(True)
      assert not actor.fill(out)
      stop.clear()
      store.write(tree)
      assert actor.fill(out) and out['meta'][2] == 2
      np.testing.assert_array_equal(actor.env_steps, [2 * T, 2 * T])
    finally:
      actor.close()
  with pytest.raises(ValueError, match='no warm-up'):
    Actor(members=[0], env_fn=functools.partial(gym.make, 'CartPole-v1'),
          agent_fn=functools.partial(agents.make_agent, REF), store=None,
          seed=0, warmup_steps=5, on_policy=True)


def test_ppo_rollouts_carry_raw_samples_and_each_versions_log_probs():
  config = ppo.PPOConfig(rollout_length=T, batch_size=8, hidden_sizes=(16,),
                         normalize_observations=True, epochs=2)
  spec = make_env_spec(gym.make('Pendulum-v1'))
  agent = agents.make_agent('ppo', spec, config)
  nets = ppo.make_networks(spec, config)
  hparams = population_hparams(agent, 2)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  with ActorRollouts(
      'Pendulum-v1', functools.partial(agents.make_agent, 'ppo',
                                       config=config),
      jax.eval_shape(learner.policy_params, state),
      jax.eval_shape(lambda h: h, hparams),
      PipelineConfig(num_steps=T, num_actor_processes=1,
                     stall_timeout_s=60.0),
      rollout_length=T, seed=1, agent=agent) as path:
    for version in (1, 2):
      policy, stats = params = learner.policy_params(state)
      assert path.publish(params, hparams) == version
      rollout = path.next_rollout(timeout=60)
      check_consecutive(rollout)
      # The Gaussian's raw samples (the env got them clipped).
      assert (np.abs(rollout.action) > 1).any()
      # The version's own network and observation statistics (the second
      # version's moved with the first iteration's rollout).
      expected = [ppo.log_prob_and_entropy(
          nets, jax.tree.map(lambda x: x[m], policy),
          ppo.normalize(jax.tree.map(lambda x: x[m], stats),
                        rollout.observation[m]), rollout.action[m])[0]
                  for m in range(2)]
      np.testing.assert_allclose(rollout.log_prob, np.stack(expected),
                                 rtol=0, atol=1e-5)
      state, metrics = learner.update(
          state, hparams, jax.tree.map(lambda x: x[:, None, :, None],
                                       rollout))
      assert np.asarray(metrics['finite']).all()
    assert float(np.abs(stats.mean).max()) > 0  # used moved statistics
  assert not our_segments()


@pytest.mark.slow
def test_ppo_members_learn_cartpole_through_pbt(tmp_path):
  run_dir = str(tmp_path / 'ppo')
  result = fastpbrl.train(
      'pbt', agent='ppo', env='CartPole-v1', population_size=2,
      env_steps=3 * 2048, hidden_sizes=(16, 16), num_actors=1,
      # SB3's n_steps; steps_per_call is given because the run's config
      # reads PPOConfig's class default (None) for it.
      steps_per_call=2048, eval_every=2048, eval_episodes=1,
      warmup_steps=1, ready_after=2048, fraction=0.5, run_dir=run_dir,
      progress=False, seed=1)
  assert result.run.calls == 3 and result.run.env_steps == 3 * 2048
  assert 'exploit' in [e['event'] for e in result.lineage]
  # A random CartPole policy lasts ~22 steps; three PPO iterations of
  # 2,048 steps take the best member past 100 (seed 1: 270).
  assert result.best_final_return > 100
  assert not our_segments()
