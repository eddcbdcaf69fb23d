"""Environment parameters searched as hyperparameters
(``fastpbrl.envs.params``), on both data paths: each member's values reach
its own envs (the shaped rewards equal the shaping formula worked out from
the observations), its episodes report the true objective, the rules
search and copy them with the agent's hyperparameters, and bad values are
refused in one line."""

import functools
import os

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastpbrl
from fastpbrl import agents
from fastpbrl.actors import Actor, ParamStore, chunk_layout
from fastpbrl.config.errors import ConfigError
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.core.types import make_env_spec
from fastpbrl.datapath.actor_rollouts import rollout_fields
from fastpbrl.envs import jax_envs
from fastpbrl.envs import params as env_params
from fastpbrl.envs import shaping
from fastpbrl.learner import collect
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.logs.logging import read_final_returns
from fastpbrl.rules.base import Population
from fastpbrl.rules.pbt import PBT, PBTRunConfig, pb2
from fastpbrl.rules.random_search import RandomSearch, RandomSearchRunConfig
from fastpbrl.rules.testing import Harness
from fastpbrl.run import build

GYM_ID = 'fastpbrl.envs.shaping:ShapedMountainCar-v0'
JAX_ID = 'shaped:MountainCar-v0'
BONUS = 'env_energy_bonus'
PPO = dict(rollout_length=16, num_envs=2, batch_size=16, epochs=1,
           hidden_sizes=(8,))


def energy(obs):
  """``phi`` from observations ``[..., (position, velocity)]``, in float64
  numpy: the shaping's potential worked out apart from the env's code."""
  obs = np.asarray(obs, np.float64)
  position, velocity = obs[..., 0], obs[..., 1]
  scale = 0.5 * 0.07**2 + 0.0025 * np.sin(1.5) / 3
  return (0.5 * velocity**2 + 0.0025 * np.sin(3 * position) / 3) / scale


def ppo_population(env_id, n, bonus):
  """A PPO population whose hyperparameters carry the env's parameter,
  member ``i`` at ``bonus[i]``."""
  params = (env_params.declared(jax_envs.make(env_id))
            if jax_envs.is_jax_env(env_id) else
            env_params.declared(gym.make(env_id)))
  spec = (jax_envs.make(env_id).env_spec if jax_envs.is_jax_env(env_id)
          else make_env_spec(gym.make(env_id)))
  config = agents.get('ppo').config(**PPO)
  agent = env_params.with_env_params(agents.make_agent('ppo', spec, config),
                                     params)
  hparams = population_hparams(agent, n)._replace(
      **{BONUS: jnp.asarray(bonus, jnp.float32)})
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  return agent, learner, state, hparams


# ------------------------------------------------------------ declarations


def test_a_declaration_that_contradicts_itself_is_refused():
  domain = ss.HParamDomain('a weight', low=0.0)
  with pytest.raises(ValueError, match="'w': default -1 "):
    env_params.EnvParam(-1.0, domain, ss.Uniform(0.0, 1.0)).check('w')
  with pytest.raises(ValueError, match='env_w'):
    env_params.EnvParam(0.0, domain, ss.Uniform(-1.0, 1.0)).check('w')

  class NoSetter(gym.Wrapper):
    env_params = {'w': env_params.EnvParam(0.0, domain, ss.Uniform(0, 1))}

  with pytest.raises(ValueError, match='needs set_env_params'):
    env_params.declared(NoSetter(gym.make('CartPole-v1')))
  assert env_params.declared(gym.make('CartPole-v1')) == {}


def test_env_fields_follow_the_agents_and_split_apart_for_the_actors():
  agent, _, _, hparams = ppo_population(JAX_ID, 3, [0.0, 10.0, 50.0])
  base = agents.make_agent('ppo', agent.env_spec,
                           agents.get('ppo').config(**PPO))
  defaults = agent.default_hparams()
  assert defaults._fields == base.default_hparams()._fields + (BONUS,)
  assert float(getattr(defaults, BONUS)) == 0.0
  # The same class for the same agent and env: equal pytree structures
  # (a checkpoint of one build restores into another).
  again = env_params.with_env_params(base, shaping.ENV_PARAMS)
  assert (jax.tree.structure(again.default_hparams())
          == jax.tree.structure(defaults))
  acting = env_params.for_actors(hparams)
  assert type(acting.agent) is type(base.default_hparams())
  np.testing.assert_array_equal(acting.env['energy_bonus'], [0, 10, 50])
  assert env_params.for_actors(acting.agent).env == {}
  with pytest.raises(ValueError, match='clash'):
    env_params.with_env_params(again, {'energy_bonus': env_params.EnvParam(
        0.0, ss.HParamDomain('x'), ss.Uniform(0, 1))})


# ------------------------------------------------------------- the device


def test_each_members_value_reaches_its_envs_on_the_device():
  pytest.importorskip('gymnax')
  env = jax_envs.make(JAX_ID)
  bonus = np.asarray([0.0, 10.0, 50.0])
  agent, learner, state, hparams = ppo_population(JAX_ID, 3, bonus)
  envs = collect.init(env, 3, 2, None, 0, jax.random.PRNGKey(1))
  step = jax.jit(functools.partial(collect.rollout_step, env, agent))
  rewards, objective = [], None
  for _ in range(5):
    before = envs
    envs, rollout, episodes = step(learner.policy_params(state), hparams,
                                   envs)
    expected = -1.0 + bonus[:, None] * (
        energy(rollout.next_observation) - energy(before.observation))
    # float32 states and observations: phi's rounding is ~1e-6 of its
    # unit, times a bonus of at most 50.
    np.testing.assert_allclose(rollout.reward, expected, rtol=0, atol=1e-3)
    rewards.append(np.asarray(rollout.reward))
    objective = episodes.true_objective
  np.testing.assert_array_equal(envs.env_state.energy_bonus,
                                np.repeat(bonus[:, None], 2, axis=1))
  np.testing.assert_array_equal(envs.env_state.true_return, -5.0)
  assert np.isnan(np.asarray(objective)).sum() == 0
  # Member 0 is unshaped; the others are not.
  np.testing.assert_array_equal(rewards[0][0], -1.0)
  assert np.abs(np.asarray(rewards)[:, 1:] + 1.0).max() > 0
  # Evaluations play in each member's envs and report the unshaped return.
  returns, lengths, objectives = collect.evaluate(
      env, agent, learner.policy_params(state), hparams,
      jax.random.PRNGKey(2), 2)
  np.testing.assert_array_equal(objectives, -np.asarray(lengths, np.float32))
  np.testing.assert_array_equal(returns[0], objectives[0])


def test_an_env_without_an_objective_reports_nan():
  pytest.importorskip('gymnax')
  env = jax_envs.make('gymnax:CartPole-v1')
  assert env.env_params == () and env.objective is None
  spec = env.env_spec
  agent = agents.make_agent('ppo', spec, agents.get('ppo').config(**PPO))
  hparams = population_hparams(agent, 2)
  state = PopulationLearner(agent).init(jax.random.PRNGKey(0), hparams)
  envs = collect.init(env, 2, 2, None, 0, jax.random.PRNGKey(1))
  _, _, episodes = collect.rollout_step(
      env, agent, PopulationLearner(agent).policy_params(state), hparams,
      envs)
  assert np.isnan(np.asarray(episodes.true_objective)).all()


# ------------------------------------------------------------- the actors


def test_each_members_value_reaches_its_envs_through_the_actors():
  bonus = np.asarray([5.0, 40.0])
  agent, learner, state, hparams = ppo_population(GYM_ID, 2, bonus)
  tree = (jax.device_get(learner.policy_params(state)),
          jax.device_get(env_params.for_actors(hparams)),
          np.zeros(2, np.int64))
  layout = chunk_layout(rollout_fields(agent.env_spec), 2, 32)
  out = layout.views(bytearray(layout.nbytes))
  config = agents.get('ppo').config(**{**PPO, 'num_envs': 1})
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = Actor(members=[0, 1], env_fn=functools.partial(gym.make, GYM_ID),
                  agent_fn=functools.partial(agents.make_agent, 'ppo',
                                             config=config),
                  store=store, seed=0, on_policy=True)
    try:
      assert actor.fill(out)
      assert [env.get_wrapper_attr('energy_bonus')
              for env in actor._batch.envs] == [5.0, 40.0]
      obs, next_obs = out['observation'], out['next_observation']
      expected = -1.0 + bonus[:, None] * (energy(next_obs) - energy(obs))
      # float32 observations, as on the device (see there).
      np.testing.assert_allclose(out['reward'], expected, rtol=0, atol=1e-3)
      # A new version with new values: the envs take them.
      changed = tree[:1] + (tree[1]._replace(
          env={'energy_bonus': np.asarray([7.0, 0.0], np.float32)}),) + (
              tree[2],)
      store.write(changed)
      assert actor.fill(out)
      assert [env.get_wrapper_attr('energy_bonus')
              for env in actor._batch.envs] == [7.0, 0.0]
      np.testing.assert_array_equal(out['reward'][1], -1.0)
    finally:
      actor.close()


def test_the_gymnasium_env_reports_its_unshaped_return():
  env = gym.make(GYM_ID)
  env.get_wrapper_attr('set_env_params')({'energy_bonus': 30.0})
  env.reset(seed=0)
  total, info, steps = 0.0, {}, 0
  done = False
  while not done:
    _, reward, terminated, truncated, info = env.step(2)
    total += reward
    steps += 1
    done = terminated or truncated
  assert info['true_objective'] == -steps
  assert total != -steps  # the bonus changed the return, not the objective


# -------------------------------------------------------------- the rules


def pbt_on_the_objective(explore: str):
  """PBT with ``explore`` over 4 PPO members of the shaped task, from the
  prior, through one decision where the true objective ranks the members
  0 > 1 > 2 > 3 and the shaped return the other way. Returns the rule,
  the exploit rows, and each member's bonus and policy weights before and
  after."""
  config = PBTRunConfig(
      agent='ppo', env=JAX_ID, population_size=4, init_hparams='prior',
      true_objective=True, ready_after=64, fraction=0.5, explore=explore,
      resample_probability=0.0, env_steps=1024, eval_every=64,
      eval_episodes=1, hidden_sizes=(8,),
      agent_settings=('rollout_length=16', 'num_envs=2', 'batch_size=16',
                      'epochs=1'))
  rule = PBT(config)
  agent = build.make_agent(rule.config, build.make_env_spec(config.env))
  rule.prepare(agent)
  hparams = rule.initial_hparams(jax.random.PRNGKey(0), agent, 4)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(1), hparams)
  rule_state, state = rule.init(jax.random.PRNGKey(2), Population(
      agent, state, hparams, jax.random.PRNGKey(3)))
  run = Harness(rule, rule_state, state=state, hparams=hparams)
  bonus = np.asarray(getattr(run.hparams, BONUS))
  run.observe((), update_steps=64, env_steps=64)  # scores the initial ones
  weights = jax.device_get(learner.policy_params(run.state))
  v = run.policy_version
  run.observe(tuple(EpisodeRecord(
      m, episode_return=100.0 * m, episode_length=200, evaluation=True,
      env_steps=128, policy_version=v, start_policy_version=v,
      true_objective=-50.0 * m) for m in range(4)),
      update_steps=128, env_steps=128)
  exploits = [row for _, row in run.logs if row.get('event') == 'exploit']
  return (rule, exploits, bonus, np.asarray(getattr(run.hparams, BONUS)),
          weights, jax.device_get(learner.policy_params(run.state)))


def assert_copied(exploits, weights, new_weights):
  """The objective's two worst (2, 3) were replaced, each by one of its
  two best, whose policy weights it now has."""
  assert sorted(e['member'] for e in exploits) == [2, 3]
  for e in exploits:
    m, p = e['member'], e['parent']
    assert p in (0, 1)
    jax.tree.map(lambda a, b, m=m, p=p: np.testing.assert_array_equal(
        a[m], b[p]), new_weights, weights)


def test_pbt_selects_on_the_objective_and_copies_env_parameters():
  """The true objective ranks the members one way and the shaped return
  the other: PBT replaces the two worst by the objective, each copy taking
  its parent's weights and bonus, explored (times 0.8 or 1.2)."""
  pytest.importorskip('gymnax')
  _, exploits, bonus, new_bonus, weights, new_weights = (
      pbt_on_the_objective('perturb'))
  assert len(set(bonus.tolist())) == 4 and ((0 <= bonus) & (bonus <= 100)).all()
  assert_copied(exploits, weights, new_weights)
  for e in exploits:
    m, p = e['member'], e['parent']
    options = [0.8 * bonus[p], 1.2 * bonus[p]]
    options += [200.0 - o for o in options if o > 100]  # reflected
    assert np.isclose(new_bonus[m], options, rtol=1e-5, atol=1e-4).any()
  np.testing.assert_array_equal(new_bonus[:2], bonus[:2])


def test_pb2_models_env_parameters_and_chooses_a_copys_bonus():
  """PB2's explore: the bonus is one of the inputs its GP models, and each
  copy gets the parent's weights with a bonus PB2 chose inside the bonus's
  range; the members kept keep theirs."""
  pytest.importorskip('gymnax')
  rule, exploits, bonus, new_bonus, weights, new_weights = (
      pbt_on_the_objective('pb2'))
  assert BONUS in pb2.continuous_fields(rule.space)
  assert_copied(exploits, weights, new_weights)
  low, high = 0.0, 100.0  # the bonus's prior (shaping.py)
  for e in exploits:
    m = e['member']
    assert low <= new_bonus[m] <= high
    assert new_bonus[m] not in bonus  # chosen, not the parent's copied
  np.testing.assert_array_equal(new_bonus[:2], bonus[:2])


def test_random_search_draws_the_env_parameters_pbt_starts_from():
  pytest.importorskip('gymnax')
  common = dict(agent='ppo', env=JAX_ID, population_size=3, env_steps=64,
                eval_every=32, hidden_sizes=(8,),
                agent_settings=('rollout_length=16', 'num_envs=2',
                                'batch_size=16', 'epochs=1'))
  draws = []
  for rule in (RandomSearch(RandomSearchRunConfig(**common)),
               PBT(PBTRunConfig(**common, init_hparams='prior',
                                ready_after=32))):
    agent = build.make_agent(rule.config, build.make_env_spec(JAX_ID))
    rule.prepare(agent)
    draws.append(getattr(rule.initial_hparams(
        jax.random.PRNGKey(4), agent, 3), BONUS))
  np.testing.assert_array_equal(draws[0], draws[1])
  assert len(set(np.asarray(draws[0]).tolist())) == 3


# ------------------------------------------------------------ bad input


@pytest.mark.parametrize('hparams, message', [
    (('env_energy_bonus=-1',),
     r'env_energy_bonus=-1 is outside its valid range \[0, inf\)'),
    (('env_gravity=2',), 'env_gravity: not parameters of --env'),
])
def test_bad_env_values_are_refused_in_one_line(tmp_path, hparams, message):
  pytest.importorskip('gymnax')
  with pytest.raises(ConfigError, match=message) as e:
    fastpbrl.train('seeds', env=JAX_ID, agent='ppo', population_size=2,
                   env_steps=32, hparams=hparams,
                   run_dir=str(tmp_path / 'run'), progress=False,
                   track='none')
  assert '\n' not in str(e.value)
  assert not os.path.exists(tmp_path / 'run')


def assert_reports_the_true_objective(run_dir):
  """Checks a random-search run on the shaped MountainCar: each member's
  drawn bonus shapes its returns, every episode's objective is the
  unshaped return (-1 a step), and the final evaluation's objective is
  what ``final_returns.json`` and the summary report."""
  run = fastpbrl.load_run(run_dir)
  episodes = run.episodes
  assert len(episodes) > 0
  np.testing.assert_array_equal(episodes['true_objective'],
                                -episodes['episode_length'])
  bonus = run.hparams.groupby('member').first()[BONUS]
  assert (bonus > 0).all() and bonus.nunique() == 2  # one draw a member
  assert (episodes['episode_return'] != episodes['true_objective']).all()
  # The final evaluation's objective, beside its shaped return, in
  # final_returns.json and the summary: each member's last evaluation row.
  last = episodes[episodes['evaluation']].groupby('member').last()
  final = read_final_returns(run_dir)
  assert final['final_true_objectives'] == list(last['true_objective'])
  assert final['final_returns'] == list(last['episode_return'])
  with open(os.path.join(run_dir, 'summary.txt')) as f:
    lines = f.read().splitlines()
  assert lines[0].split()[:5] == ['member', 'episodes', 'eval_last',
                                  'eval_best', 'objective_last']
  assert [float(line.split()[4]) for line in lines[1:3]] == list(
      last['true_objective'])


@pytest.mark.slow
def test_a_run_through_the_actors_reports_the_true_objective(tmp_path):
  """Random search through the actor processes (gymnasium envs)."""
  run_dir = str(tmp_path / 'run')
  fastpbrl.train('random', env=GYM_ID, agent='ppo', population_size=2,
                 seed=2, env_steps=256, eval_every=128, eval_episodes=1,
                 hidden_sizes=(8,), agent_settings=(
                     'rollout_length=64', 'batch_size=32', 'epochs=1'),
                 run_dir=run_dir, progress=False, track='none')
  assert_reports_the_true_objective(run_dir)


@pytest.mark.slow
def test_a_run_on_the_device_reports_the_true_objective(tmp_path):
  """Random search on the device path (the JAX env inside the compiled
  call)."""
  run_dir = str(tmp_path / 'run')
  fastpbrl.train('random', env=JAX_ID, agent='ppo', population_size=2,
                 seed=2, env_steps=256, eval_every=128, eval_episodes=1,
                 hidden_sizes=(8,), agent_settings=(
                     'rollout_length=64', 'num_envs=2', 'batch_size=32',
                     'epochs=1'),
                 run_dir=run_dir, progress=False, track='none')
  assert_reports_the_true_objective(run_dir)
