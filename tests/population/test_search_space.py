"""Search spaces: sampling, perturbation, constraints and validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.population import search_space as ss

N = 4000


def test_sample_within_bounds_and_untouched_fields():
  space = ss.default_search_space('td3')
  template = td3.default_hparams()
  hp = jax.jit(ss.sample, static_argnums=(1, 3))(
      jax.random.PRNGKey(0), space, template, N)
  for name, dist in space.distributions:
    x = np.asarray(getattr(hp, name))
    assert x.shape == (N,) and x.dtype == np.float32
    assert x.min() >= np.float32(dist.low) and x.max() <= np.float32(dist.high)
  # Fields outside the space keep the template's values.
  for name in ('tau', 'noise_clip', 'reward_scale'):
    np.testing.assert_array_equal(getattr(hp, name),
                                  np.full(N, getattr(template, name)))
  assert bool(jnp.all(ss.within_bounds(space, hp)))


def test_log_uniform_spreads_evenly_over_decades():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(1e-5, 1e-2),
                          'critic_lr': ss.Uniform(1e-5, 1e-2)})
  hp = ss.sample(jax.random.PRNGKey(1), space, td3.default_hparams(), N)
  logs = np.log10(np.asarray(hp.policy_lr))
  counts = np.histogram(logs, bins=[-5, -4, -3, -2])[0] / N
  np.testing.assert_allclose(counts, [1 / 3] * 3, atol=0.03)
  # The uniform prior puts ~90% of its mass in the top decade instead.
  top = np.mean(np.asarray(hp.critic_lr) > 1e-3)
  assert abs(top - 0.9) < 0.03


def test_categorical_sample_and_adjacent_moves():
  values = (0.9, 0.95, 0.99, 0.995)
  space = ss.SearchSpace({'discount': ss.Categorical(values)})
  hp = ss.sample(jax.random.PRNGKey(2), space, td3.default_hparams(), N)
  x = np.asarray(hp.discount)
  grid = np.asarray(values, np.float32)
  assert set(np.unique(x)) == set(grid)
  moved = ss.perturb(jax.random.PRNGKey(3), space, hp, resample_probability=0.0)
  i_old = np.searchsorted(grid, x)
  i_new = np.searchsorted(grid, np.asarray(moved.discount))
  assert np.all(np.abs(i_new - i_old) == 1)  # always exactly one step
  # Both directions are used from interior values.
  interior = (i_old > 0) & (i_old < len(values) - 1)
  steps = (i_new - i_old)[interior]
  assert 0.4 < np.mean(steps == 1) < 0.6
  # Ends move to their only neighbour.
  assert np.all(i_new[i_old == 0] == 1)
  assert np.all(i_new[i_old == len(values) - 1] == len(values) - 2)


def test_perturb_multiplies_by_factors_then_clips():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3),
                          'discount': ss.Uniform(0.9, 1.0)})
  hp = ss.sample(jax.random.PRNGKey(4), space, td3.default_hparams(), N)
  out = ss.perturb(jax.random.PRNGKey(5), space, hp, factors=(0.8, 1.2),
                   resample_probability=0.0)
  x, y = np.asarray(hp.policy_lr), np.asarray(out.policy_lr)
  down = np.clip(x * np.float32(0.8), 3e-5, 3e-3)
  up = np.clip(x * np.float32(1.2), 3e-5, 3e-3)
  is_down = np.isclose(y, down, rtol=1e-6)
  is_up = np.isclose(y, up, rtol=1e-6)
  assert np.all(is_down | is_up)
  assert 0.45 < np.mean(is_up & ~is_down) / np.mean(is_up ^ is_down) < 0.55
  d = np.asarray(out.discount)
  assert d.min() >= 0.9 and d.max() <= 1.0
  assert np.mean(d == np.float32(1.0)) > 0.1  # clipped values exist
  # Fields outside the space are untouched.
  np.testing.assert_array_equal(out.tau, hp.tau)
  np.testing.assert_array_equal(out.critic_lr, hp.critic_lr)


def test_resample_probability():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3)})
  hp = ss.sample(jax.random.PRNGKey(6), space, td3.default_hparams(), N)
  out = ss.perturb(jax.random.PRNGKey(7), space, hp, resample_probability=0.25)
  x, y = np.asarray(hp.policy_lr), np.asarray(out.policy_lr)
  perturbed = (np.isclose(y, np.clip(x * np.float32(0.8), 3e-5, 3e-3))
               | np.isclose(y, np.clip(x * np.float32(1.2), 3e-5, 3e-3)))
  assert abs(np.mean(~perturbed) - 0.25) < 0.03
  out1 = ss.perturb(jax.random.PRNGKey(7), space, hp, resample_probability=1.0)
  assert np.all(np.asarray(ss.within_bounds(space, out1)))


def test_constraint_applied_after_sample_and_perturb():
  def lr_order(h):
    return h._replace(critic_lr=jnp.maximum(h.critic_lr, h.policy_lr))

  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3),
                          'critic_lr': ss.LogUniform(3e-5, 3e-3)},
                         constraint=lr_order)
  hp = ss.sample(jax.random.PRNGKey(8), space, td3.default_hparams(), 500)
  assert np.all(np.asarray(hp.critic_lr) >= np.asarray(hp.policy_lr))
  out = ss.perturb(jax.random.PRNGKey(9), space, hp)
  assert np.all(np.asarray(out.critic_lr) >= np.asarray(out.policy_lr))


@pytest.mark.parametrize('dists, message', [
    ({'policy_lr': ss.LogUniform(0.0, 1e-3)}, "'policy_lr'.*positive"),
    ({'policy_lr': ss.LogUniform(-1.0, 1e-3)}, "'policy_lr'.*positive"),
    ({'discount': ss.Uniform(1.0, 0.9)}, "'discount'.*low < high"),
    ({'discount': ss.Uniform(0.9, 0.9)}, "'discount'.*low < high"),
    ({'discount': ss.Uniform(0.9, float('inf'))}, "'discount'.*finite"),
    ({'epsilon': ss.Categorical(())}, "'epsilon'.*at least one"),
    ({'epsilon': ss.Categorical((0.1, 0.1))}, "'epsilon'.*distinct"),
    ({'tau': (0.0, 1.0)}, "'tau'.*LogUniform, Uniform or Categorical"),
])
def test_invalid_distributions_name_the_field(dists, message):
  with pytest.raises(ValueError, match=message):
    ss.SearchSpace(dists)


def test_unknown_field_and_agent():
  space = ss.SearchSpace({'learning_rate': ss.LogUniform(1e-5, 1e-3)})
  with pytest.raises(ValueError, match=r"\['learning_rate'\].*TD3HParams"):
    ss.sample(jax.random.PRNGKey(0), space, td3.default_hparams(), 2)
  with pytest.raises(ValueError, match='no default search space.*ppo'):
    ss.default_search_space('ppo')
  with pytest.raises(ValueError, match='resample_probability'):
    ss.perturb(jax.random.PRNGKey(0), ss.default_search_space('td3'),
               ss.sample(jax.random.PRNGKey(0), ss.default_search_space('td3'),
                         td3.default_hparams(), 2), resample_probability=1.5)


def test_default_spaces_match_the_paper():
  t = dict(ss.default_search_space('td3').distributions)
  assert t['policy_lr'] == ss.LogUniform(3e-5, 3e-3) == t['critic_lr']
  assert t['policy_delay'] == ss.Uniform(0.2, 1.0)
  assert t['exploration_noise'] == ss.Uniform(0.0, 1.0) == t['target_noise']
  assert t['discount'] == ss.Uniform(0.9, 1.0)
  s = dict(ss.default_search_space('sac').distributions)
  assert set(s) == {'policy_lr', 'critic_lr', 'alpha_lr',
                    'target_entropy_scale', 'reward_scale', 'discount'}
  assert s['target_entropy_scale'] == ss.Uniform(0.2, 2.0)
  d = dict(ss.default_search_space('dqn').distributions)
  assert set(d) == {'lr', 'epsilon', 'discount'}
  assert d['discount'] == ss.Uniform(0.9, 0.999)
  # Hashable, so usable as a static jit argument.
  hash(ss.default_search_space('sac'))


@pytest.mark.parametrize('agent', ['td3', 'sac', 'dqn'])
def test_default_spaces_fit_the_agents(agent):
  module = pytest.importorskip(f'fastpbrl.agents.{agent}')
  template = module.default_hparams()
  space = ss.default_search_space(agent)
  hp = ss.sample(jax.random.PRNGKey(0), space, template, 64)
  assert type(hp) is type(template)
  assert np.asarray(ss.within_bounds(space, hp)).all()
  out = ss.perturb(jax.random.PRNGKey(1), space, hp)
  assert np.asarray(ss.within_bounds(space, out)).all()
