"""Pieces shared by deterministic-policy actor-critics (DDPG, TD3), as pure
functions over one member's state.

DDPG (Lillicrap et al. 2016) and TD3 (Fujimoto et al. 2018) share the
training state (an online and a target policy and critic, two Adam states),
the deterministic policy gradient objective ``-E[Q(s, pi(s))]`` (DDPG eq. 6),
and acting with clipped Gaussian exploration noise (the TD3 paper's DDPG
baseline; the DDPG paper's Ornstein-Uhlenbeck noise is not used here). What
differs, the critic's target, stays in each agent. ``examples/ddpg.py``
builds DDPG from these pieces.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.agents.networks import Network
from fastpbrl.core.types import Params, PRNGKey


class ActorCriticState(NamedTuple):
  """One member's full training state (what PBT's exploit copies)."""

  policy: Params
  critic: Params  # one Q-network (DDPG) or both (TD3)
  target_policy: Params
  target_critic: Params
  policy_opt: optax.OptState
  critic_opt: optax.OptState
  key: PRNGKey
  step: jax.Array  # int32 scalar, update steps taken


def continuous_action_dim(env_spec: specs.EnvironmentSpec, agent: str) -> int:
  """The action dimension of a Box action space; a ``ValueError`` naming
  ``agent`` for any other."""
  if not isinstance(env_spec.actions, specs.BoundedArray) or isinstance(
      env_spec.actions, specs.DiscreteArray):
    raise ValueError(f'{agent} needs a continuous (Box) action space; use DQN '
                     'for discrete actions')
  return int(env_spec.actions.shape[0])


def adam_init(params: Params) -> optax.OptState:
  """A fresh Adam state. The learning rate only scales Adam's update, not its
  state, so the state fits ``adam_step`` with any traced rate."""
  return optax.adam(1.0).init(params)


def adam_step(params: Params, opt_state: optax.OptState, grads: Params,
              learning_rate: jax.Array) -> tuple[Params, optax.OptState]:
  """One Adam step with a traced ``learning_rate``; returns (params, state)."""
  updates, opt_state = optax.adam(learning_rate).update(grads, opt_state)
  return optax.apply_updates(params, updates), opt_state


def init_params(policy: Network, critic: Network, obs_shape: tuple,
                action_dim: int, key: PRNGKey) -> tuple[Params, Params]:
  """Fresh policy and critic parameters for one member."""
  k_pi, k_q = jax.random.split(key)
  obs = jnp.zeros((1, *obs_shape), jnp.float32)
  act = jnp.zeros((1, action_dim), jnp.float32)
  return policy.init(k_pi, obs), critic.init(k_q, obs, act)


def init_state(policy: Network, critic: Network, obs_shape: tuple,
               action_dim: int, key: PRNGKey) -> ActorCriticState:
  """A fresh member: targets equal to the online networks, fresh Adam states."""
  k_params, k_state = jax.random.split(key)
  pi, q = init_params(policy, critic, obs_shape, action_dim, k_params)
  return ActorCriticState(
      policy=pi, critic=q, target_policy=pi, target_critic=q,
      policy_opt=adam_init(pi), critic_opt=adam_init(q), key=k_state,
      step=jnp.zeros((), jnp.int32))


def policy_loss(policy_apply: Callable, q_apply: Callable, policy: Params,
                critic: Params, observation: jax.Array) -> jax.Array:
  """Deterministic policy gradient objective ``-E[Q(s, pi(s))]``, with
  ``q_apply(critic, obs, action) -> [B]`` (TD3: its first critic)."""
  return -jnp.mean(q_apply(critic, observation,
                           policy_apply(policy, observation)))


def make_act(policy_apply: Callable) -> Callable:
  """``act`` of the agent contract: ``pi(s)`` plus Gaussian noise of std
  ``hparams.exploration_noise`` when exploring, clipped to ``[-1, 1]``;
  noise-free for evaluation."""

  def act(policy: Params, observation: jax.Array, key: PRNGKey, hparams,
          explore: bool) -> jax.Array:
    action = policy_apply(policy, observation)
    if explore:
      noise = hparams.exploration_noise * jax.random.normal(key, action.shape)
      action = jnp.clip(action + noise, -1.0, 1.0)
    return action

  return act
