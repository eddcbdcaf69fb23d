"""Networks for fastpbrl's agents: the only module that imports haiku.

Every network is exposed as a ``Network(init, apply)`` pair of pure functions
(``hk.without_apply_rng(hk.transform(...))``), so agents never touch haiku
themselves and could swap it out behind this seam.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np


class Network(NamedTuple):
  """``init(key, *inputs) -> params`` and ``apply(params, *inputs) -> out``."""

  init: Callable
  apply: Callable


def _pure(fn) -> Network:
  transformed = hk.without_apply_rng(hk.transform(fn))
  return Network(transformed.init, transformed.apply)


# How MLP parameters start (``network_init`` of the TD3 and SAC configs).
NETWORK_INITS = ('haiku', 'torch')


class _TorchInitMLP(hk.Module):
  """``hk.nets.MLP`` (ReLU between layers, none after the last) with
  PyTorch's ``nn.Linear`` default initialisation: weights and biases uniform
  in ``+-1/sqrt(fan_in)``, as in Stable-Baselines3 and the TD3 and SAC
  reference code. Its layers are made in the constructor, as
  ``hk.nets.MLP`` makes them, so the parameters have the same names
  (``mlp/~/linear_<i>``) and tree as the haiku-initialised network."""

  def __init__(self, sizes: Sequence[int], input_size: int,
               name: str | None = None):
    super().__init__(name=name or 'mlp')
    fan_ins = [input_size, *sizes[:-1]]
    self.layers = []
    for i, (size, fan_in) in enumerate(zip(sizes, fan_ins)):
      uniform = hk.initializers.RandomUniform(-1.0 / np.sqrt(fan_in),
                                              1.0 / np.sqrt(fan_in))
      self.layers.append(hk.Linear(size, w_init=uniform, b_init=uniform,
                                   name=f'linear_{i}'))

  def __call__(self, x):
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if i < len(self.layers) - 1:
        x = jax.nn.relu(x)
    return x


def _check_init(init: str) -> None:
  if init not in NETWORK_INITS:
    raise ValueError(f'network_init must be one of {NETWORK_INITS}, got '
                     f'{init!r}')


def _mlp(sizes: Sequence[int], name: str | None = None, init: str = 'haiku'):
  """ReLU hidden activations as in the TD3 and SAC papers. ``init='haiku'``
  (the default) is haiku's default initialisation, which Acme uses for its
  TD3/SAC MLPs: weights from a normal of scale ``1/sqrt(fan_in)`` truncated
  at two scales, zero biases. ``'torch'``: PyTorch's (``_TorchInitMLP``).
  The public constructors below check ``init`` when they are called."""
  if init == 'haiku':
    return hk.nets.MLP(list(sizes), activation=jax.nn.relu, name=name)
  return lambda x: _TorchInitMLP(list(sizes), x.shape[-1], name=name)(x)


def deterministic_policy(action_dim: int, hidden: Sequence[int],
                         init: str = 'haiku') -> Network:
  """TD3 actor: MLP then ``tanh``, actions in ``[-1, 1]``."""
  _check_init(init)

  def forward(obs):
    return jnp.tanh(_mlp([*hidden, action_dim], init=init)(obs))

  return _pure(forward)


def critic(hidden: Sequence[int], init: str = 'haiku') -> Network:
  """One Q-network on ``concat(obs, action)``; returns ``q`` of shape ``[B]``
  (DDPG)."""
  _check_init(init)

  def forward(obs, action):
    return _mlp([*hidden, 1], init=init)(
        jnp.concatenate([obs, action], axis=-1))[..., 0]

  return _pure(forward)


def twin_critic(hidden: Sequence[int], init: str = 'haiku') -> Network:
  """Two independent Q-networks on ``concat(obs, action)``; returns ``(q1, q2)``
  each of shape ``[B]`` (TD3 / SAC clipped double-Q)."""
  _check_init(init)

  def forward(obs, action):
    x = jnp.concatenate([obs, action], axis=-1)
    q1 = _mlp([*hidden, 1], name='q1', init=init)(x)[..., 0]
    q2 = _mlp([*hidden, 1], name='q2', init=init)(x)[..., 0]
    return q1, q2

  return _pure(forward)


def gaussian_policy(action_dim: int, hidden: Sequence[int],
                    init: str = 'haiku') -> Network:
  """SAC actor: MLP giving the mean and log-std of a Gaussian before ``tanh``.

  The log-std is clipped to ``[-20, 2]`` as in the SAC reference code.
  """
  _check_init(init)

  def forward(obs):
    out = _mlp([*hidden, 2 * action_dim], init=init)(obs)
    mean, log_std = jnp.split(out, 2, axis=-1)
    return mean, jnp.clip(log_std, -20.0, 2.0)

  return _pure(forward)


def nature_q_network(num_actions: int) -> Network:
  """The Nature-DQN torso and head (Mnih et al. 2015) on ``[B, 84, 84, 4]``
  uint8 frames; returns Q-values ``[B, num_actions]``."""

  def forward(frames):
    # JAX's default float: float32, float64 under jax_enable_x64 (where
    # the convolutions' parameters are float64 too).
    x = frames.astype(jax.dtypes.canonicalize_dtype(jnp.float64)) / 255.0
    x = hk.Conv2D(32, 8, stride=4, padding='VALID')(x)
    x = jax.nn.relu(x)
    x = hk.Conv2D(64, 4, stride=2, padding='VALID')(x)
    x = jax.nn.relu(x)
    x = hk.Conv2D(64, 3, stride=1, padding='VALID')(x)
    x = jax.nn.relu(x)
    x = hk.Flatten()(x)
    x = jax.nn.relu(hk.Linear(512)(x))
    return hk.Linear(num_actions)(x)

  return _pure(forward)


def mlp_q_network(num_actions: int, hidden: Sequence[int]) -> Network:
  """Q-network for discrete actions on vector observations (CartPole-like)."""

  def forward(obs):
    return _mlp([*hidden, num_actions])(obs.astype(jnp.float32))

  return _pure(forward)


def dummy_input(shape: Sequence[int], dtype) -> jnp.ndarray:
  """A batch of one zero input of the given per-example shape."""
  return jnp.zeros((1, *shape), dtype=np.dtype(dtype))


# --------------------------------------------------------------------------
# PPO (Stable-Baselines3's MlpPolicy): separate policy and value MLPs
# --------------------------------------------------------------------------

# Hidden activations of the PPO networks (``PPOConfig.activation``).
ACTIVATIONS = {'tanh': jnp.tanh, 'relu': jax.nn.relu}


class _ActorCriticMLP(hk.Module):
  """Linear layers with ``activation`` between them (none after the last),
  initialised as Stable-Baselines3's ``ActorCriticPolicy``: with
  ``ortho_init``, orthogonal weights of gain ``sqrt(2)`` in the hidden
  layers and ``head_gain`` in the last one (0.01 for the policy head, 1 for
  the value head), zero biases; without it, PyTorch's ``nn.Linear`` default
  (weights and biases uniform in ``+-1/sqrt(fan_in)``), which SB3 keeps
  then. Layers are named ``linear_<i>`` in order."""

  def __init__(self, sizes: Sequence[int], input_size: int, activation: str,
               ortho_init: bool, head_gain: float, name: str | None = None):
    super().__init__(name=name)
    self.activation = ACTIVATIONS[activation]
    fan_ins = [input_size, *sizes[:-1]]
    self.layers = []
    for i, (size, fan_in) in enumerate(zip(sizes, fan_ins)):
      if ortho_init:
        gain = head_gain if i == len(sizes) - 1 else float(np.sqrt(2.0))
        w_init, b_init = (hk.initializers.Orthogonal(scale=gain),
                          hk.initializers.Constant(0.0))
      else:
        w_init = b_init = hk.initializers.RandomUniform(
            -1.0 / np.sqrt(fan_in), 1.0 / np.sqrt(fan_in))
      self.layers.append(hk.Linear(size, w_init=w_init, b_init=b_init,
                                   name=f'linear_{i}'))

  def __call__(self, x):
    for i, layer in enumerate(self.layers):
      x = layer(x)
      if i < len(self.layers) - 1:
        x = self.activation(x)
    return x


def _check_activation(activation: str) -> None:
  if activation not in ACTIVATIONS:
    raise ValueError(f'activation must be one of {tuple(ACTIVATIONS)}, got '
                     f'{activation!r}')


def _flat(obs):
  """Observations as one float vector per example (JAX's default float)."""
  x = obs.reshape(obs.shape[:1] + (-1,)) if obs.ndim > 2 else obs
  return x.astype(jax.dtypes.canonicalize_dtype(jnp.float64)) if not (
      jnp.issubdtype(x.dtype, jnp.floating)) else x


def categorical_policy(num_actions: int, hidden: Sequence[int],
                       activation: str = 'tanh',
                       ortho_init: bool = True) -> Network:
  """PPO's discrete policy: an MLP giving the logits ``[B, num_actions]``
  of a categorical (SB3's ``mlp_extractor.policy_net`` + ``action_net``,
  head gain 0.01)."""
  _check_activation(activation)

  def forward(obs):
    x = _flat(obs)
    return _ActorCriticMLP([*hidden, num_actions], x.shape[-1], activation,
                           ortho_init, 0.01, name='policy')(x)

  return _pure(forward)


def diagonal_gaussian_policy(action_dim: int, hidden: Sequence[int],
                             activation: str = 'tanh',
                             ortho_init: bool = True,
                             log_std_init: float = 0.0) -> Network:
  """PPO's continuous policy: an MLP giving the mean ``[B, action_dim]`` of
  a diagonal Gaussian whose log-std is a state-independent parameter
  ``log_std [action_dim]`` starting at ``log_std_init`` (SB3's
  ``DiagGaussianDistribution``); returns ``(mean, log_std)``, the log-std
  broadcast to the mean's shape. No tanh: actions are the Gaussian's
  samples (the env side clips them)."""
  _check_activation(activation)

  def forward(obs):
    x = _flat(obs)
    mean = _ActorCriticMLP([*hidden, action_dim], x.shape[-1], activation,
                           ortho_init, 0.01, name='policy')(x)
    log_std = hk.get_parameter('log_std', [action_dim], mean.dtype,
                               init=hk.initializers.Constant(log_std_init))
    return mean, jnp.broadcast_to(log_std, mean.shape)

  return _pure(forward)


def state_value(hidden: Sequence[int], activation: str = 'tanh',
                ortho_init: bool = True) -> Network:
  """PPO's value function ``V(s)``, shape ``[B]``: an MLP apart from the
  policy's (SB3's ``mlp_extractor.value_net`` + ``value_net``, head gain
  1)."""
  _check_activation(activation)

  def forward(obs):
    x = _flat(obs)
    return _ActorCriticMLP([*hidden, 1], x.shape[-1], activation, ortho_init,
                           1.0, name='value')(x)[..., 0]

  return _pure(forward)
