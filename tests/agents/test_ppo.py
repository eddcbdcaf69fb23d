"""PPO: GAE and the clipped surrogate against hand-worked values, the
population update against a per-member loop, traced hyperparameters,
observation statistics, reward normalisation against a numpy
re-implementation of SB3's VecNormalize, acting, for discrete and
continuous actions."""

import dataclasses
import os
import subprocess
import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.agents import ppo
from fastpbrl.core.types import Rollout, random_transitions
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests import numerics
from tests.agents.helpers import env_spec, member

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

# T=8 steps in E=2 envs, minibatches of 8: 2 minibatch steps per epoch, 3
# epochs, so an iteration is 6 Adam steps.
SMALL = ppo.PPOConfig(hidden_sizes=(16, 16), rollout_length=8, num_envs=2,
                      epochs=3, batch_size=8, normalize_observations=True,
                      normalize_rewards=True)
ENVS = ('CartPole-v1', 'Pendulum-v1')  # discrete, continuous


def make(env_id, config=SMALL):
  return agents.make_agent('ppo', env_spec(env_id), config)


def random_rollout(agent, leading, seed=0) -> Rollout:
  """A rollout ``[*leading, T, E]`` of random steps whose ``log_prob`` is
  within a few nats of any small network's (ratios stay moderate)."""
  t = random_transitions(agent.env_spec, leading, seed=seed,
                         terminated_fraction=0.1, truncated_fraction=0.1)
  rng = np.random.default_rng(seed + 1)
  log_prob = (-1.0 + 0.3 * rng.standard_normal(leading)).astype(np.float32)
  obs = (3.0 + 2.0 * t.observation).astype(np.float32)  # not standardised
  return Rollout(observation=obs, action=t.action, reward=t.reward,
                 next_observation=t.next_observation, terminated=t.terminated,
                 truncated=t.truncated, log_prob=log_prob)


def test_gae_by_hand_with_a_truncation_and_a_termination():
  # gamma = lambda = 0.5, so gamma lambda = 0.25; one env of T = 4 steps:
  # step 1 was cut by a time limit, step 2 ended in a terminal state.
  reward = np.array([1.0, 2.0, 3.0, 4.0])[:, None]
  value = np.array([1.0, 2.0, 1.0, 2.0])[:, None]  # V(obs_t)
  next_value = np.array([2.0, 4.0, 8.0, 2.0])[:, None]  # V(next_obs_t)
  terminated = np.array([0.0, 0.0, 1.0, 0.0])[:, None]
  truncated = np.array([0.0, 1.0, 0.0, 0.0])[:, None]
  adv = ppo.gae(reward, value, next_value, terminated, truncated, 0.5, 0.5)
  # delta_0 = 1 + 0.5 x 2 - 1 = 1
  # delta_1 = 2 + 0.5 x 4 - 2 = 2   (a truncation bootstraps from V(next))
  # delta_2 = 3 + 0       - 1 = 2   (a termination does not: 8 is unused)
  # delta_3 = 4 + 0.5 x 2 - 2 = 3   (the last step bootstraps)
  # A_3 = 3; A_2 = 2 (done); A_1 = 2 (done: A_2 does not flow back);
  # A_0 = 1 + 0.25 x 2 = 1.5. Every number is a dyadic rational: exact.
  np.testing.assert_array_equal(adv[:, 0], [1.5, 2.0, 2.0, 3.0])
  # Returns = A + V = [2.5, 4, 3, 5].
  np.testing.assert_array_equal((adv + value)[:, 0], [2.5, 4.0, 3.0, 5.0])


def test_gae_envs_are_independent_and_lambda_one_is_monte_carlo():
  rng = np.random.default_rng(0)
  reward = rng.standard_normal((5, 3))
  value = rng.standard_normal((5, 3))
  # No episode ends: obs[t + 1] is next_obs[t], so V(next_obs_t) = V_{t+1}.
  next_value = np.concatenate([value[1:], rng.standard_normal((1, 3))])
  zeros = np.zeros((5, 3))
  adv = ppo.gae(reward, value, next_value, zeros, zeros, 0.9, 1.0)
  # lambda = 1 without episode ends: the discounted return bootstrapped
  # from the last next value, minus V(obs_t), in each env on its own.
  expected = np.zeros((5, 3))
  for e in range(3):
    g = next_value[-1, e]
    for t in reversed(range(5)):
      g = reward[t, e] + 0.9 * g
      expected[t, e] = g - value[t, e]
  # float32 scan of 5 steps vs float64 numpy: a few roundings per step.
  np.testing.assert_allclose(adv, expected, rtol=numerics.rounding_rtol(30),
                             atol=numerics.rounding_rtol(30) * 10)


def test_clipped_surrogate_by_hand():
  ratio = jnp.array([0.5, 1.5, 1.1, 0.7])
  advantage = jnp.array([1.0, 1.0, -1.0, -1.0])
  # r A              = [0.5, 1.5, -1.1, -0.7]
  # clip(r, .8, 1.2) = [0.8, 1.2,  1.1,  0.8], times A = [0.8, 1.2, -1.1, -0.8]
  # min              = [0.5, 1.2, -1.1, -0.8], mean -0.05, negated: 0.05
  loss = ppo.clipped_surrogate(ratio, advantage, 0.2)
  np.testing.assert_allclose(loss, 0.05, rtol=numerics.rounding_rtol(10))


def test_config_checks_the_minibatch_size_and_fills_steps_per_call():
  with pytest.raises(ValueError, match='batch_size 24 must divide'):
    ppo.PPOConfig(rollout_length=16, num_envs=2, batch_size=24)
  assert ppo.PPOConfig(rollout_length=16, num_envs=2,
                       batch_size=16).steps_per_call == 32
  assert ppo.PPOConfig(rollout_length=16, num_envs=2, batch_size=16,
                       steps_per_call=64).steps_per_call == 64
  assert ppo.PPOConfig().steps_per_call == 2048  # SB3: one 2048-step rollout
  with pytest.raises(ValueError, match='activation'):
    ppo.PPOConfig(activation='gelu')


@pytest.mark.parametrize('env_id', ENVS)
def test_act_and_behave(env_id):
  agent = make(env_id, ppo.PPOConfig(hidden_sizes=(16,), rollout_length=8,
                                     batch_size=8, log_std_init=-0.5))
  hp = agent.default_hparams()
  state = agent.init(jax.random.PRNGKey(0), hp)
  nets = ppo.make_networks(agent.env_spec, agent.config)
  params = agent.policy_params(state)
  obs = jnp.asarray(random_transitions(agent.env_spec, (64,)).observation)
  action, log_prob = agent.behave(params, obs, jax.random.PRNGKey(1), hp)
  chex.assert_shape(log_prob, (64,))
  # behave's log-probability is the policy's at what it sampled.
  expected, entropy = ppo.log_prob_and_entropy(nets, state.policy, obs,
                                               action)
  np.testing.assert_allclose(log_prob, expected,
                             rtol=numerics.rounding_rtol(20), atol=1e-6)
  greedy = agent.act(params, obs, jax.random.PRNGKey(1), hp, False)
  sampled = agent.act(params, obs, jax.random.PRNGKey(1), hp, True)
  if nets.discrete:
    chex.assert_type(action, jnp.int32)
    logits = nets.policy.apply(state.policy, obs)
    np.testing.assert_array_equal(greedy, np.argmax(logits, axis=-1))
    np.testing.assert_array_equal(sampled, action)  # same key, same draw
  else:
    # Orthogonal head of gain 0.01: the mean is near 0, and the Gaussian's
    # entropy is sum(0.5 + 0.5 log(2 pi) + log_std) at log_std = -0.5.
    mean, _ = nets.policy.apply(state.policy, obs)
    np.testing.assert_array_equal(greedy, mean)
    np.testing.assert_array_equal(sampled, np.clip(action, -1, 1))
    np.testing.assert_allclose(entropy, 0.5 * np.log(2 * np.pi),
                               rtol=numerics.rounding_rtol(10))


@pytest.mark.parametrize('env_id,normalize_rewards', [
    ('CartPole-v1', True), ('Pendulum-v1', True), ('Pendulum-v1', False)])
def test_population_call_matches_per_member_loop(env_id, normalize_rewards):
  agent = make(env_id, dataclasses.replace(
      SMALL, normalize_rewards=normalize_rewards))
  n, iterations = 3, 2
  hparams = population_hparams(
      agent, n, learning_rate=[1e-4, 3e-4, 1e-3], clip_range=[0.1, 0.2, 0.3],
      ent_coef=[0.0, 0.01, 0.005], gae_lambda=[0.9, 0.95, 1.0],
      discount=[0.99, 0.9, 0.95], max_grad_norm=[0.5, 10.0, 0.1])
  rollout = random_rollout(agent, (n, iterations, 8, 2))
  learner = PopulationLearner(agent, iterations * 16)
  key = jax.random.PRNGKey(0)
  with numerics.float64():
    hparams, rollout = numerics.as_float64((hparams, rollout))
    population = numerics.as_float64(learner.init(key, hparams))
    initial = jax.tree.map(np.array, population)  # the call donates it
    population, metrics = learner.update(population, hparams, rollout)
    single_update = jax.jit(agent.update)
    for i in range(n):
      state = member(initial, i)
      member_metrics = []
      for it in range(iterations):
        state, m = single_update(state, member(hparams, i),
                                 jax.tree.map(lambda x: x[i, it], rollout))
        member_metrics.append(m)
      # 12 Adam steps of at most 1e-3 (tests/numerics.py, rule 2).
      chex.assert_trees_all_close(state, member(population, i),
                                  **numerics.TRAJECTORY)
      for name in member_metrics[0]:
        np.testing.assert_allclose(
            metrics[name][i], [m[name] for m in member_metrics],
            err_msg=f'metric {name} of member {i}', **numerics.TRAJECTORY)
  assert set(metrics) >= {'policy_loss', 'value_loss', 'entropy', 'approx_kl',
                          'clip_fraction', 'explained_variance'}
  chex.assert_shape(metrics['policy_loss'], (n, iterations))
  np.testing.assert_array_equal(population.step, [iterations] * n)
  # Each member moved: different keys and hyperparameters, and learning.
  for leaf_new, leaf_old in zip(jax.tree.leaves(population.value),
                                jax.tree.leaves(initial.value)):
    assert not np.allclose(leaf_new, leaf_old)


def test_hyperparameter_changes_never_recompile():
  agent = make('Pendulum-v1')
  learner = PopulationLearner(agent, 16)
  hparams = population_hparams(agent, 2)
  rollout = random_rollout(agent, (2, 1, 8, 2))
  state = learner.init(jax.random.PRNGKey(0), hparams)
  for lr, clip in ((1e-4, 0.1), (1e-3, 0.3), (3e-4, 0.2)):
    state, _ = learner.update(state, population_hparams(
        agent, 2, learning_rate=lr, clip_range=clip, gae_lambda=[0.9, 1.0]),
        rollout)
  assert learner.compilations == 1


def test_observation_statistics_are_those_of_every_observation_seen():
  agent = make('Pendulum-v1')
  hp = agent.default_hparams()
  state = agent.init(jax.random.PRNGKey(0), hp)
  np.testing.assert_array_equal(state.obs_stats.mean, 0.0)
  np.testing.assert_array_equal(state.obs_stats.var, 1.0)
  update = jax.jit(agent.update)
  seen = []
  with numerics.float64():
    state = numerics.as_float64(state)
    for seed in range(3):
      rollout = numerics.as_float64(random_rollout(agent, (8, 2), seed=seed))
      state, _ = update(state, numerics.as_float64(hp), rollout)
      seen.append(np.asarray(rollout.observation).reshape(-1, 3))
  seen = np.concatenate(seen)
  assert float(state.obs_stats.count) == len(seen)
  # Three merges of 16 observations in float64: a few dozen roundings.
  rtol = numerics.rounding_rtol(200, np.float64)
  np.testing.assert_allclose(state.obs_stats.mean, seen.mean(axis=0),
                             rtol=rtol)
  np.testing.assert_allclose(state.obs_stats.var, seen.var(axis=0),
                             rtol=rtol)
  # The actors get the statistics with the policy.
  policy, stats = agent.policy_params(state)
  chex.assert_trees_all_equal(stats, state.obs_stats)


class NumpyVecNormalizeRewards:
  """SB3's ``VecNormalize`` reward path (``vec_normalize.py``: ``step_wait``,
  ``_update_reward``, ``normalize_reward``; ``RunningMeanStd``), written
  again in float64 numpy, with the prior count 0 (SB3's is 1e-4)."""

  def __init__(self, num_envs, gamma):
    self.returns = np.zeros(num_envs)
    self.mean, self.var, self.count = 0.0, 1.0, 0.0
    self.gamma = gamma

  def step(self, reward, done):
    """One vector step: the scaled rewards ``[E]``."""
    self.returns = self.returns * self.gamma + reward
    # RunningMeanStd.update on the batch of E returns.
    batch_mean, batch_var, n = self.returns.mean(), self.returns.var(), len(
        self.returns)
    delta = batch_mean - self.mean
    total = self.count + n
    self.mean = self.mean + delta * n / total
    self.var = (self.var * self.count + batch_var * n
                + delta**2 * self.count * n / total) / total
    self.count = total
    scaled = np.clip(reward / np.sqrt(self.var + 1e-8), -10.0, 10.0)
    self.returns[done] = 0.0  # dones: terminated or truncated
    return scaled


def _reward_rollouts(seed=0):
  """Two consecutive rollouts [T=6, E=3] of rewards and episode ends."""
  rng = np.random.default_rng(seed)
  reward = rng.normal(1.0, 2.0, (2, 6, 3))
  # The first step: equal returns in every env, variance 0, so the scale
  # is 1e4 and the clip at 10 decides.
  reward[0, 0] = 0.5
  terminated = np.zeros((2, 6, 3))
  truncated = np.zeros((2, 6, 3))
  terminated[0, 2, 0] = terminated[1, 0, 1] = 1.0
  truncated[0, 4, 1] = truncated[1, 3, 2] = 1.0
  truncated[0, 5, 2] = 1.0  # at the end of a rollout: reset before the next
  return reward, terminated, truncated


def test_reward_scaling_is_vecnormalizes_across_two_rollouts():
  reward, terminated, truncated = _reward_rollouts()
  gamma = 0.9
  reference = NumpyVecNormalizeRewards(3, gamma)
  expected = [[reference.step(r, np.maximum(te, tr) > 0)
               for r, te, tr in zip(*rollout)]
              for rollout in zip(reward, terminated, truncated)]
  with numerics.float64():
    norm = ppo.RewardNorm(
        returns=np.zeros(3), stats=ppo.ObsStats(
            mean=np.float64(0), var=np.float64(1), count=np.float64(0)))
    scale = jax.jit(ppo.scale_rewards)
    for i in range(2):
      scaled, norm = scale(norm, reward[i],
                           np.maximum(terminated[i], truncated[i]), gamma)
      # Dozens of float64 operations per step (rule 1 of tests/numerics.py).
      np.testing.assert_allclose(scaled, expected[i],
                                 rtol=numerics.rounding_rtol(200, np.float64))
      if i == 0:
        # Env 2's episode ended at the rollout's last step: its return
        # restarts at 0; the others carry theirs into the next rollout.
        assert norm.returns[2] == 0.0
        assert np.all(np.asarray(norm.returns[:2]) != 0.0)
  assert np.all(np.asarray(expected[0][0]) == 10.0)  # the clip was reached
  np.testing.assert_allclose(
      [norm.stats.mean, norm.stats.var],
      [reference.mean, reference.var],
      rtol=numerics.rounding_rtol(200, np.float64))
  assert float(norm.stats.count) == reference.count == 36
  np.testing.assert_allclose(norm.returns, reference.returns,
                             rtol=numerics.rounding_rtol(200, np.float64))


def test_update_learns_from_the_scaled_rewards_and_keeps_raw_ones_out():
  # An update with reward normalisation equals one without it on the
  # rewards the numpy VecNormalize scaled: the scaled rewards are those of
  # GAE and the value targets, and nothing else changes.
  on = make('Pendulum-v1', dataclasses.replace(
      SMALL, rollout_length=6, num_envs=3, batch_size=6, steps_per_call=None))
  off = make('Pendulum-v1', dataclasses.replace(on.config,
                                                normalize_rewards=False))
  reward, terminated, truncated = _reward_rollouts(seed=1)
  hp = on.default_hparams()
  reference = NumpyVecNormalizeRewards(3, 0.95)
  with numerics.float64():
    # gamma 0.95 in float64 on both sides (not float32's 0.949999988).
    hp = numerics.as_float64(hp)._replace(discount=jnp.float64(0.95))
    state_on = state_off = numerics.as_float64(
        on.init(jax.random.PRNGKey(0), hp))
    for i in range(2):
      rollout = numerics.as_float64(random_rollout(on, (6, 3), seed=i))
      rollout = rollout._replace(reward=reward[i], terminated=terminated[i],
                                 truncated=truncated[i])
      scaled = np.stack([reference.step(r, np.maximum(te, tr) > 0)
                         for r, te, tr in zip(reward[i], terminated[i],
                                              truncated[i])])
      state_on, metrics_on = jax.jit(on.update)(state_on, hp, rollout)
      state_off, metrics_off = jax.jit(off.update)(
          state_off, hp, rollout._replace(reward=scaled))
      # Scaled rewards equal to rounding; 6 Adam steps (rule 2).
      chex.assert_trees_all_close(
          (state_on.policy, state_on.value, state_on.obs_stats),
          (state_off.policy, state_off.value, state_off.obs_stats),
          **numerics.TRAJECTORY)
      for name in metrics_off:
        np.testing.assert_allclose(metrics_on[name], metrics_off[name],
                                   err_msg=name, **numerics.TRAJECTORY)
  np.testing.assert_allclose(metrics_on['reward_scale'],
                             1 / np.sqrt(reference.var + 1e-8),
                             rtol=numerics.rounding_rtol(200, np.float64))
  assert 'reward_scale' not in metrics_off
  # Off: the accumulator and statistics never move.
  np.testing.assert_array_equal(state_off.reward_norm.returns, 0.0)
  np.testing.assert_array_equal(state_off.reward_norm.stats.var, 1.0)
  np.testing.assert_array_equal(state_off.reward_norm.stats.count, 0.0)
  assert float(state_on.reward_norm.stats.count) == 36


def test_without_normalisation_the_statistics_stay_the_identity():
  agent = make('CartPole-v1', ppo.PPOConfig(
      hidden_sizes=(8,), rollout_length=8, num_envs=2, batch_size=16,
      epochs=1))
  hp = agent.default_hparams()
  state = agent.init(jax.random.PRNGKey(0), hp)
  state, _ = jax.jit(agent.update)(state, hp, random_rollout(agent, (8, 2)))
  np.testing.assert_array_equal(state.obs_stats.mean, 0.0)
  np.testing.assert_array_equal(state.obs_stats.var, 1.0)
  np.testing.assert_array_equal(state.obs_stats.count, 0.0)


def test_networks_start_as_sb3s_mlp_policy():
  agent = make('Pendulum-v1', ppo.PPOConfig(
      hidden_sizes=(32, 32), rollout_length=8, batch_size=8,
      log_std_init=-0.7))
  state = agent.init(jax.random.PRNGKey(0), agent.default_hparams())
  # Orthogonal weights (w [in, out]: orthonormal rows or columns, whichever
  # are fewer) times the gain: sqrt(2) hidden, 0.01 policy head, 1 value
  # head; zero biases; the log-std parameter at log_std_init.
  for params, prefix, head_gain in ((state.policy, 'policy', 0.01),
                                    (state.value, 'value', 1.0)):
    for i, gain in enumerate((np.sqrt(2), np.sqrt(2), head_gain)):
      layer = params[f'{prefix}/~/linear_{i}']
      w = np.asarray(layer['w'], np.float64)
      gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
      # float32 entries: a dot of at most 32 terms (rule 1), times gain^2.
      np.testing.assert_allclose(gram, gain**2 * np.eye(len(gram)),
                                 atol=gain**2 * numerics.rounding_rtol(64))
      np.testing.assert_array_equal(layer['b'], 0.0)
  np.testing.assert_array_equal(state.policy['~']['log_std'],
                                np.float32(-0.7))
  # ortho_init=False: PyTorch's nn.Linear default, biases not zero.
  plain = make('Pendulum-v1', ppo.PPOConfig(
      hidden_sizes=(32, 32), rollout_length=8, batch_size=8,
      ortho_init=False, activation='relu'))
  layer = plain.init(jax.random.PRNGKey(0), plain.default_hparams()).value[
      'value/~/linear_1']
  assert np.abs(layer['w']).max() <= 1 / np.sqrt(32)
  assert np.abs(layer['b']).max() > 0


# A child process, so that a deadlock fails the test instead of hanging the
# suite: 70 members' initial states (PPO's four orthogonal initialisers at
# more than 64 members, the case XLA's CPU scheduler deadlocked on when
# vmapped: fastpbrl.learner.population.init_members) against one-member inits.
INIT_MANY = """
import jax, numpy as np
from fastpbrl import agents
from fastpbrl.learner.population import PopulationLearner, population_hparams
from tests.agents.helpers import env_spec
n = 70
agent = agents.make_agent('ppo', env_spec('CartPole-v1'))
hparams = population_hparams(agent, n)
state = PopulationLearner(agent).init(jax.random.PRNGKey(3), hparams)
keys = jax.random.split(jax.random.PRNGKey(3), n)
one = jax.jit(agent.init)
for i in range(n):
  alone = one(keys[i], jax.tree.map(lambda x: x[i], hparams))
  for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(state)):
    np.testing.assert_allclose(np.asarray(b[i]), np.asarray(a), atol=1e-6)
print('equal')
"""


def test_init_of_70_members_finishes_and_equals_one_member_inits():
  # Tolerance: both sides run the same one-member init; the bound only
  # allows float32 rounding of entries below 1 between two compilations.
  done = subprocess.run([sys.executable, '-c', INIT_MANY], timeout=600,
                        capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(
                            os.path.dirname(os.path.abspath(__file__)))))
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip() == 'equal'
