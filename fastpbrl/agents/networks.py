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
