"""A tiny on-policy agent for the data-path tests (not a package agent):
a categorical MLP policy learning by a ratio-weighted policy gradient
(jittable; pure functions over pytrees).

It exists so that the rollout data paths can be tested without PPO:
``behave`` samples and returns its log-probability, ``update`` is one
iteration on a ``Rollout[T, E]`` and reports the largest ``|ratio - 1|``
of its first gradient step (0 up to float32 rounding when the rollout was
collected by the parameters being updated: nothing stale). Registered as
``rollout_test``; select it with ``--agent
tests.rollout_agent_for_tests:ROLLOUT_TEST`` (spawned actors re-import
this module by that name).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from acme import specs

from fastpbrl import agents
from fastpbrl.agents.base import Agent, scalar_hparams
from fastpbrl.core import search_space as ss


@dataclasses.dataclass(frozen=True)
class RolloutTestConfig:
  hidden_sizes: tuple[int, ...] = (16, 16)
  batch_size: int = 16  # unused: one full-batch step per iteration
  rollout_length: int = 16
  num_envs: int = 1
  steps_per_call: int = 16


class RolloutTestHParams(NamedTuple):
  lr: jax.Array


class RolloutTestState(NamedTuple):
  params: list  # [(w, b)] per layer
  key: jax.Array
  step: jax.Array


def logits(params, obs):
  """``[B, A]`` logits of the MLP ``params`` at ``obs[B, ...]``."""
  x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
  for i, (w, b) in enumerate(params):
    x = x @ w + b
    if i < len(params) - 1:
      x = jnp.tanh(x)
  return x


def log_prob(params, obs, action):
  """``[B]`` log-probabilities of ``action[B]`` under ``params``."""
  logp = jax.nn.log_softmax(logits(params, obs))
  return jnp.take_along_axis(logp, action[:, None].astype(jnp.int32), 1)[:, 0]


def make_agent(env_spec: specs.EnvironmentSpec,
               config: RolloutTestConfig = RolloutTestConfig()) -> Agent:
  if not isinstance(env_spec.actions, specs.DiscreteArray):
    raise ValueError('rollout_test needs a discrete action space')
  obs_size = int(jnp.prod(jnp.asarray(env_spec.observations.shape)))
  sizes = (obs_size, *config.hidden_sizes, int(env_spec.actions.num_values))

  def init(key, hparams):
    del hparams
    keys = jax.random.split(key, len(sizes))
    params = [(jax.random.normal(k, (a, b)) / jnp.sqrt(a), jnp.zeros(b))
              for k, a, b in zip(keys[1:], sizes[:-1], sizes[1:])]
    return RolloutTestState(params, keys[0], jnp.zeros((), jnp.int32))

  def behave(params, obs, key, hparams):
    del hparams
    action = jax.random.categorical(key, logits(params, obs)).astype(
        jnp.int32)
    return action, log_prob(params, obs, action)

  def act(params, obs, key, hparams, explore):
    if explore:
      return behave(params, obs, key, hparams)[0]
    return jnp.argmax(logits(params, obs), -1).astype(jnp.int32)

  def update(state, hparams, rollout):
    obs = rollout.observation.reshape(-1, *rollout.observation.shape[2:])
    action = rollout.action.reshape(-1)
    behaviour = rollout.log_prob.reshape(-1)
    reward = rollout.reward.reshape(-1)
    advantage = (reward - reward.mean()) / (reward.std() + 1e-8) + (
        1.0 - rollout.terminated.reshape(-1))

    def loss_fn(params):
      ratio = jnp.exp(log_prob(params, obs, action) - behaviour)
      return -jnp.mean(ratio * advantage), ratio

    (loss, ratio), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params)
    params = jax.tree.map(lambda p, g: p - hparams.lr * g, state.params,
                          grads)
    metrics = {'loss': loss,
               'stale_ratio': jnp.max(jnp.abs(ratio - 1.0))}
    return state._replace(params=params, step=state.step + 1), metrics

  return Agent(
      name='rollout_test', env_spec=env_spec, config=config,
      default_hparams=lambda: scalar_hparams(RolloutTestHParams, lr=1e-2),
      init=init, act=act, update=update,
      policy_params=lambda state: state.params, learns_from='rollout',
      behave=behave)


ROLLOUT_TEST = agents.register(
    'rollout_test', make_agent=make_agent, config=RolloutTestConfig,
    default_search_space={'lr': ss.LogUniform(1e-3, 1e-1)},
    hparam_domains={'lr': ss.positive('step size')},
    example_env='CartPole-v1', learns_from='rollout')
