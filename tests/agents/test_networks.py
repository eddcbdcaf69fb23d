"""The MLPs' two initialisations (``network_init``): same parameter tree,
each with its own distribution, and the run flag that selects it."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.agents import networks
from fastpbrl.agents import sac, td3
from fastpbrl.config.checks import validate
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.run import build

# Rule 3: a sample std over n draws has relative standard error
# sqrt((kurtosis - 1) / (4 n)); the checks below allow 4 of them.
UNIFORM_KURTOSIS = 1.8
TRUNCATED_NORMAL_KURTOSIS = 2.366  # a normal truncated at two scales
TRUNCATED_NORMAL_STD = 0.8796  # of that truncated unit normal


def _std_rtol(n, kurtosis):
  return 4 * np.sqrt((kurtosis - 1) / (4 * n))


def _critic_params(init):
  net = networks.twin_critic((256, 256), init)
  return net.init(jax.random.PRNGKey(0), jnp.zeros((1, 11)), jnp.zeros((1, 3)))


def test_torch_init_draws_weights_and_biases_uniform_in_one_over_sqrt_fan_in():
  haiku, torch = _critic_params('haiku'), _critic_params('torch')
  # The same tree (names and shapes): a checkpoint does not depend on it.
  assert jax.tree.structure(haiku) == jax.tree.structure(torch)
  assert jax.tree.map(jnp.shape, haiku) == jax.tree.map(jnp.shape, torch)
  for module, layer in torch.items():
    fan_in = layer['w'].shape[0]
    bound = 1 / np.sqrt(fan_in)
    for name in ('w', 'b'):
      values = np.asarray(layer[name]).ravel()
      assert np.abs(values).max() <= bound, (module, name)
      if values.size >= 256:  # uniform in +-bound: std bound / sqrt(3)
        # 4 standard errors: 11% at 256 draws, 0.7% at 65536; a normal
        # instead of a uniform, or another fan-in, is off by more.
        assert np.std(values) == pytest.approx(
            bound / np.sqrt(3), rel=_std_rtol(values.size, UNIFORM_KURTOSIS))
    # haiku's: zero biases, a normal of scale 1/sqrt(fan_in) truncated at
    # two scales (std 0.88 / sqrt(fan_in)).
    assert not np.asarray(haiku[module]['b']).any()
    weights = np.asarray(haiku[module]['w'])
    if weights.size >= 256:
      # 4 standard errors: 15% at 256 draws, 0.9% at 65536; a uniform
      # (std 0.58 / sqrt(fan_in)) is 34% off.
      assert np.std(weights) == pytest.approx(
          TRUNCATED_NORMAL_STD * bound,
          rel=_std_rtol(weights.size, TRUNCATED_NORMAL_KURTOSIS))


def test_agents_build_their_networks_with_the_configured_init():
  spec = build.make_env_spec('Pendulum-v1')
  for module, config in ((td3, td3.TD3Config), (sac, sac.SACConfig)):
    agent = module.make_agent(spec, config(hidden_sizes=(32, 32),
                                           network_init='torch'))
    state = agent.init(jax.random.PRNGKey(1), agent.default_hparams())
    biases = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(
        state.critic) if path[-1].key == 'b']
    assert biases and all(np.asarray(b).any() for b in biases), module
  with pytest.raises(ValueError, match='network_init'):
    td3.make_agent(spec, td3.TD3Config(network_init='xavier'))


def test_network_init_flag_is_checked_and_reaches_the_agent():
  config = RunConfig(env='Pendulum-v1', agent='td3',
                             network_init='torch', hidden_sizes=(8,))
  agent = build.make_agent(config, build.make_env_spec('Pendulum-v1'))
  assert agent.config.network_init == 'torch'
  with pytest.raises(ConfigError, match='--network-init must be one'):
    validate(dataclasses.replace(config, network_init='xavier'))
  with pytest.raises(ConfigError,
                     match='--network-init torch: --agent dqn has no'):
    build.make_agent(dataclasses.replace(config, agent='dqn',
                                           env='CartPole-v1'),
                       build.make_env_spec('CartPole-v1'))
