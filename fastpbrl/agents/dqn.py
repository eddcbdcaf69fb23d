"""DQN (Mnih et al. 2015, "Human-level control through deep reinforcement
learning"), as pure functions over one member's state.

Nature CNN on ``84x84x4`` uint8 frames (an MLP for vector observations),
a target network refreshed every ``target_update_period`` update steps,
the Huber loss on the one-step TD error, and the Nature paper's centred
RMSProp (step size 2.5e-4, decay 0.95, epsilon 0.01), batch 32, gamma 0.99,
target refresh every 10,000 frames = 2,500 updates at one update per four
frames. Epsilon-greedy acting with a traced epsilon (the actor anneals it).

The population is stacked with ``jax.vmap``: JAX's batching rule for a
convolution whose kernel is batched emits ONE grouped convolution
(``feature_group_count = N``), the same program as a hand-written grouped
conv with haiku's ``feature_group_count`` (see
``tests/agents/test_dqn.py::test_vmapped_conv_is_one_grouped_convolution``).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.agents import networks as nets_lib
from fastpbrl.agents.base import Agent, scalar_hparams, select_tree, td_target
from fastpbrl.types import Params, PRNGKey, Transition


@dataclasses.dataclass(frozen=True)
class DQNConfig:
  """Static DQN settings (changing one recompiles)."""

  batch_size: int = 32  # transitions per member per update step
  steps_per_call: int = 10  # update steps compiled into one learner call
  mlp_hidden_sizes: Sequence[int] = (256, 256)  # for vector observations
  rmsprop_decay: float = 0.95
  rmsprop_eps: float = 0.01
  huber_delta: float = 1.0


class DQNHParams(NamedTuple):
  """Traced DQN hyperparameters, each a float32 scalar per member."""

  lr: jax.Array  # RMSProp step size
  discount: jax.Array  # gamma
  target_update_period: jax.Array  # update steps between target refreshes
  epsilon: jax.Array  # epsilon-greedy exploration rate when acting


def default_hparams() -> DQNHParams:
  return scalar_hparams(DQNHParams, lr=2.5e-4, discount=0.99,
                        target_update_period=2500.0, epsilon=0.1)


class DQNState(NamedTuple):
  """One member's full training state."""

  params: Params
  target_params: Params
  opt: optax.OptState
  key: PRNGKey
  step: jax.Array  # int32 scalar


def make_agent(env_spec: specs.EnvironmentSpec,
               config: DQNConfig = DQNConfig()) -> Agent:
  """Builds the DQN agent's pure functions for ``env_spec``."""
  if not isinstance(env_spec.actions, specs.DiscreteArray):
    raise ValueError('DQN needs a Discrete action space; use TD3 or SAC for '
                     'continuous actions')
  num_actions = int(env_spec.actions.num_values)
  obs_shape = tuple(env_spec.observations.shape)
  obs_dtype = env_spec.observations.dtype
  if len(obs_shape) == 3:
    if obs_shape != (84, 84, 4):
      raise ValueError(f'image observations must be 84x84x4 stacked frames '
                       f'(gymnasium AtariPreprocessing + FrameStackObservation)'
                       f', got {obs_shape}')
    net = nets_lib.nature_q_network(num_actions)
  elif len(obs_shape) == 1:
    net = nets_lib.mlp_q_network(num_actions, config.mlp_hidden_sizes)
  else:
    raise ValueError(f'observation shape {obs_shape} is neither a vector nor '
                     '84x84x4 frames')

  def optimizer(lr) -> optax.GradientTransformation:
    return optax.rmsprop(lr, decay=config.rmsprop_decay, eps=config.rmsprop_eps,
                         centered=True)

  def init(key: PRNGKey, hparams: DQNHParams) -> DQNState:
    del hparams
    k_params, k_state = jax.random.split(key)
    params = net.init(k_params, nets_lib.dummy_input(obs_shape, obs_dtype))
    return DQNState(params=params, target_params=params,
                    opt=optimizer(1.0).init(params), key=k_state,
                    step=jnp.zeros((), jnp.int32))

  def act(params: Params, observation: jax.Array, key: PRNGKey,
          hparams: DQNHParams, explore: bool) -> jax.Array:
    greedy = jnp.argmax(net.apply(params, observation), axis=-1).astype(jnp.int32)
    if not explore:
      return greedy
    k_coin, k_action = jax.random.split(key)
    random_action = jax.random.randint(k_action, greedy.shape, 0, num_actions)
    coin = jax.random.uniform(k_coin, greedy.shape) < hparams.epsilon
    return jnp.where(coin, random_action, greedy)

  def loss_fn(params, target_params, batch: Transition, hp: DQNHParams):
    q = net.apply(params, batch.observation)
    q_taken = jnp.take_along_axis(
        q, batch.action.astype(jnp.int32)[:, None], axis=-1)[:, 0]
    next_q = jnp.max(net.apply(target_params, batch.next_observation), axis=-1)
    target = jax.lax.stop_gradient(
        td_target(batch.reward, batch.terminated, hp.discount, next_q))
    loss = jnp.mean(optax.huber_loss(q_taken, target, delta=config.huber_delta))
    return loss, jnp.mean(q_taken)

  def update(state: DQNState, hp: DQNHParams, batch: Transition):
    (loss, q), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params, state.target_params, batch, hp)
    updates, opt = optimizer(hp.lr).update(grads, state.opt, state.params)
    params = optax.apply_updates(state.params, updates)
    step = state.step + 1
    period = jnp.maximum(jnp.round(hp.target_update_period), 1.0).astype(jnp.int32)
    refresh = jnp.mod(step, period) == 0
    target_params = select_tree(refresh, params, state.target_params)
    new_state = DQNState(params=params, target_params=target_params, opt=opt,
                         key=state.key, step=step)
    return new_state, {'loss': loss, 'q': q,
                       'target_refreshed': refresh.astype(jnp.float32)}

  return Agent(
      name='dqn', env_spec=env_spec, config=config,
      default_hparams=default_hparams, init=init, act=act, update=update,
      policy_params=lambda state: state.params)
