"""The actor explores on each member's own schedule (DQN's annealed epsilon,
from the member's env steps) and evaluates with the evaluation epsilon and
its own keys."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl import agents
from fastpbrl.actors import Actor, ParamStore, member_seeds
from fastpbrl.agents import dqn
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests.actors.test_actor import make_step_env, new_chunk

CONFIG = dqn.DQNConfig(mlp_hidden_sizes=(8,))


def _dqn_population(n, **hparams):
  spec = make_env_spec(make_step_env(discrete=True))
  agent = agents.make_agent('dqn', spec, CONFIG)
  hp = population_hparams(agent, n, **hparams)
  state = PopulationLearner(agent).init(jax.random.PRNGKey(0), hp)
  tree = jax.device_get((PopulationLearner(agent).policy_params(state), hp))
  return spec, agent, tree


def _actor(store, members, **kwargs):
  return Actor(members=members, env_fn=functools.partial(make_step_env, True),
               agent_fn=functools.partial(agents.make_agent, 'dqn',
                                          config=CONFIG),
               store=store, seed=5, **kwargs)


def _greedy(agent, params, obs):
  hp = agent.default_hparams()._replace(eval_epsilon=jnp.float32(0.0))
  return np.asarray(agent.act(params, obs, jax.random.key(0), hp, False))


def test_each_member_explores_at_its_own_annealed_epsilon():
  """Member 0 anneals to epsilon 0 in 8 steps, then acts greedily; member 1
  (restarted at env step 1,000) anneals over 10^6 steps, so it is still
  almost uniformly random. Every action is the per-member reference
  ``act(..., acting_hparams(hparams, env_step), explore=True)``."""
  steps, offsets = 40, [0, 1_000]
  spec, agent, tree = _dqn_population(2, epsilon=[0.0, 0.0],
                                      epsilon_decay_steps=[8, 1e6])
  params, hparams = tree
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = _actor(store, [0, 1], env_steps=offsets)
    out = new_chunk(spec, 2, steps)
    assert actor.fill(out)
    actor.close()
  actions = out['action']
  for m in range(2):
    p_m = jax.tree.map(lambda x: x[m], params)
    h_m = jax.tree.map(lambda x: x[m], hparams)
    key = jax.random.key(member_seeds(5, m).key)
    obs = out['observation'][m]
    for t in range(steps):
      env_step = offsets[m] + t
      expected = agent.act(p_m, obs[t][None], jax.random.fold_in(key, env_step),
                           dqn.acting_hparams(h_m, env_step), True)
      assert actions[m, t] == int(expected[0]), (m, t)
    greedy = _greedy(agent, p_m, obs)
    if m == 0:  # epsilon(t >= 8) = 0: greedy from step 8 on
      np.testing.assert_array_equal(actions[m, 8:], greedy[8:])
      assert (actions[m, :8] != greedy[:8]).any()  # epsilon ~ 1 before
    else:  # epsilon ~ 0.999: 2/3 of the actions differ from the greedy one
      assert np.mean(actions[m] != greedy) > 0.4


def test_evaluation_episodes_act_at_the_evaluation_epsilon():
  """eval_epsilon 0 gives greedy evaluation actions; eval_epsilon 1 random
  ones, while training acts with epsilon 0 (the evaluation's coin flips
  are not the training's)."""
  spec, agent, tree = _dqn_population(
      2, epsilon=[0.0, 0.0], epsilon_decay_steps=[0, 0],
      eval_epsilon=[0.0, 1.0])
  params, _ = tree
  with ParamStore.create(tree) as store:
    store.write(tree)
    actor = _actor(store, [0, 1], eval_interval=2, eval_episodes=1)
    out = new_chunk(spec, 2, 48)
    assert actor.fill(out)
    histories = [actor._eval_envs[j][0].unwrapped.history for j in range(2)]
    train = [actor._batch.envs[j].unwrapped.history for j in range(2)]
    actor.close()
  for m in range(2):
    p_m = jax.tree.map(lambda x: x[m], params)
    obs = np.stack([o for o, _ in histories[m]])
    taken = np.array([int(a) for _, a in histories[m]])
    assert len(taken) >= 20
    differ = np.mean(taken != _greedy(agent, p_m, obs))
    if m == 0:
      assert differ == 0.0
    else:  # uniform over 3 actions: about 2/3 differ
      assert differ > 0.4
    # Training actions are greedy (epsilon 0) for both members.
    obs = np.stack([o for o, _ in train[m]])
    np.testing.assert_array_equal([int(a) for _, a in train[m]],
                                  _greedy(agent, p_m, obs))
