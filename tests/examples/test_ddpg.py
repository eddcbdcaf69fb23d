"""The DDPG of examples/ddpg.py: its update against an independent
computation, its registration, and a PBT of DDPG members through the CLI."""

import os
import textwrap

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from examples import ddpg
from fastpbrl import agents
from tests import numerics
from tests.agents.helpers import env_spec, random_batch

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SMALL = ddpg.DDPGConfig(hidden_sizes=(8,), batch_size=6)


def _mlp(params, x, out=None):
  """A haiku MLP written out by hand: ReLU between layers, ``out`` last."""
  names = sorted(params, key=lambda k: int(k.rsplit('_', 1)[1]))
  for i, name in enumerate(names):
    x = x @ params[name]['w'] + params[name]['b']
    if i < len(names) - 1:
      x = jnp.maximum(x, 0.0)
  return out(x) if out else x


def _pi(params, obs):
  return _mlp(params, obs, jnp.tanh)


def _q(params, obs, action):
  return _mlp(params, jnp.concatenate([obs, action], -1))[:, 0]


def _first_adam_step(params, grads, lr):
  # From a fresh Adam state, the bias-corrected moments are g and g^2, so
  # the first step is -lr g / (|g| + eps) (Kingma & Ba, Algorithm 1).
  return jax.tree.map(lambda p, g: p - lr * g / (jnp.abs(g) + 1e-8),
                      params, grads)


def test_update_matches_an_independent_computation():
  agent = agents.make_agent('examples.ddpg:DDPG', env_spec('Pendulum-v1'),
                            SMALL)
  # In float64 (rule 2): Adam's first step, lr g / (|g| + 1e-8), turns a
  # float32 rounding of a gradient entry near zero into a step of up to lr.
  with numerics.float64():
    # Set in float64: their float32 roundings would be 1e-8 off the
    # literals of the independent computation below.
    f64 = lambda x: jnp.asarray(x, jnp.float64)  # noqa: E731
    hp = numerics.as_float64(ddpg.default_hparams())._replace(
        policy_lr=f64(1e-4), critic_lr=f64(1e-3), weight_decay=f64(0.1),
        tau=f64(0.25), discount=f64(0.9))
    state = numerics.as_float64(agent.init(jax.random.PRNGKey(0), hp))
    # Targets apart from the online networks, so that the test tells them apart.
    state = state._replace(
        target_policy=jax.tree.map(lambda x: 0.5 * x, state.policy),
        target_critic=jax.tree.map(lambda x: 0.9 * x, state.critic))
    batch = jax.tree.map(jnp.asarray, numerics.as_float64(
        random_batch(agent.env_spec, (6,), seed=1)))
    new, metrics = jax.jit(agent.update)(state, hp, batch)

    def critic_loss(critic):
      next_q = _q(state.target_critic, batch.next_observation,
                  _pi(state.target_policy, batch.next_observation))
      y = batch.reward + 0.9 * (1.0 - batch.terminated) * next_q
      l2 = sum(jnp.sum(w ** 2) for w in jax.tree.leaves(critic))
      return jnp.mean((_q(critic, batch.observation, batch.action) - y) ** 2) + (
          0.05 * l2)

    critic = _first_adam_step(state.critic,
                              jax.grad(critic_loss)(state.critic), 1e-3)
    policy_objective = lambda p: -jnp.mean(  # noqa: E731
        _q(critic, batch.observation, _pi(p, batch.observation)))
    policy = _first_adam_step(
        state.policy, jax.grad(policy_objective)(state.policy), 1e-4)
    expected_critic_loss = critic_loss(state.critic)
    expected_policy_loss = policy_objective(state.policy)
    polyak = lambda t, o: 0.75 * t + 0.25 * o  # noqa: E731
    target_critic = jax.tree.map(polyak, state.target_critic, critic)
    target_policy = jax.tree.map(polyak, state.target_policy, policy)
  # Rule 1 in float64: target policy and critic (3 + 9 and 4 + 9 terms), the
  # squared errors' mean and the 49 squares of the L2 term: <= 100 roundings
  # of a sum of squares (no cancellation).
  np.testing.assert_allclose(metrics['critic_loss'], expected_critic_loss,
                             rtol=numerics.rounding_rtol(100, np.float64))
  # After the critic's Adam step (rule 2): the objective reads the new critic.
  np.testing.assert_allclose(metrics['policy_loss'], expected_policy_loss,
                             **numerics.TRAJECTORY)
  # Rule 2: one Adam step each; a wrong learning rate moves a parameter by
  # >= 1e-4, a wrong tau a target by ~0.25 |online - target|.
  chex.assert_trees_all_close(new.critic, critic, **numerics.TRAJECTORY)
  chex.assert_trees_all_close(new.policy, policy, **numerics.TRAJECTORY)
  chex.assert_trees_all_close(new.target_critic, target_critic,
                              **numerics.TRAJECTORY)
  chex.assert_trees_all_close(new.target_policy, target_policy,
                              **numerics.TRAJECTORY)
  assert int(new.step) == 1


def test_registered_through_one_call(tmp_path, monkeypatch):
  spec = agents.get('examples.ddpg:DDPG')
  assert spec is ddpg.DDPG and agents.get('ddpg') is spec
  assert spec.shared_critic is None and spec.config is ddpg.DDPGConfig
  agent = agents.make_agent('examples.ddpg:DDPG', env_spec('Pendulum-v1'))
  assert agent.name == 'ddpg' and agent.config == ddpg.DDPGConfig()
  # A user module given as a file: importing it registers the agent, which
  # '<file>:<name>' and '<module>:<name>' then find.
  (tmp_path / 'my_agents.py').write_text(textwrap.dedent('''
      from examples import ddpg
      from fastpbrl import agents
      MINE = agents.register('mine', make_agent=ddpg.make_agent,
                             config=ddpg.DDPGConfig,
                             default_search_space=ddpg.SEARCH_SPACE)
  '''))
  monkeypatch.setattr('sys.path', list(__import__('sys').path))
  assert agents.get(f'{tmp_path}/my_agents.py:MINE').name == 'mine'
  assert agents.get('my_agents:mine').name == 'mine'
  with pytest.raises(ValueError, match="'ddpg' is already registered by"):
    agents.register('ddpg', make_agent=lambda spec, config: None,
                    config=ddpg.DDPGConfig,
                    default_search_space=ddpg.SEARCH_SPACE)


def test_cemrl_refuses_an_agent_without_a_shared_critic(tmp_path):
  from experiments import cemrl
  with pytest.raises(SystemExit) as info:
    cemrl.main(['--agent', 'examples.ddpg:DDPG', '--no-progress',
                '--run-dir', str(tmp_path)])
  assert ('CEM-RL needs deterministic policies trained through one shared '
          'critic: --agent examples.ddpg:DDPG registers no shared_critic'
          in str(info.value.code))


@pytest.mark.slow
def test_pbt_of_ddpg_members_through_the_cli(tmp_path):
  from experiments import pbt
  from fastpbrl.logs.logging import read_member_csvs
  run_dir = str(tmp_path / 'run')
  result = pbt.main([
      '--agent', 'examples.ddpg:DDPG', '--population-size', '2',
      '--env', 'Pendulum-v1', '--env-steps', '600', '--warmup-steps', '200',
      '--hidden-sizes', '16', '16', '--batch-size', '16',
      '--steps-per-call', '10', '--eval-every', '200', '--ready-after', '200',
      '--num-actors', '1', '--replay-capacity', '2000', '--eval-episodes', '1',
      '--no-progress', '--run-dir', run_dir])
  assert result.env_steps >= 600 and len(result.final_returns) == 2
  assert all(np.isfinite(result.final_returns))
  assert set(result.hparams[0]) == set(ddpg.DDPGHParams._fields)
  assert len(read_member_csvs(run_dir)) == 2
  assert os.path.exists(os.path.join(run_dir, 'lineage.jsonl'))
  # Every scalar is logged against env steps per member, returns included;
  # the population's total is a scalar of its own.
  accumulator = pytest.importorskip(
      'tensorboard.backend.event_processing.event_accumulator')
  events = accumulator.EventAccumulator(os.path.join(run_dir, 'tensorboard'))
  events.Reload()
  totals = events.Scalars('pipeline/population_env_steps')
  assert totals and all(t.value == 2 * t.step for t in totals)
  for tag in ('learner/critic_loss', 'member_000/hparams/tau',
              'member_001/train_return'):
    steps = [e.step for e in events.Scalars(tag)]
    assert steps and max(steps) <= result.env_steps + 200, (tag, steps)
