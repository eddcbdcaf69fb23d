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


def _mlp(sizes: Sequence[int], name: str | None = None) -> hk.nets.MLP:
  # Default haiku init (truncated normal, fan-in scaled) is what Acme uses for
  # its TD3/SAC MLPs; ReLU hidden activations as in the TD3 and SAC papers.
  return hk.nets.MLP(list(sizes), activation=jax.nn.relu, name=name)


def deterministic_policy(action_dim: int, hidden: Sequence[int]) -> Network:
  """TD3 actor: MLP then ``tanh``, actions in ``[-1, 1]``."""

  def forward(obs):
    return jnp.tanh(_mlp([*hidden, action_dim])(obs))

  return _pure(forward)


def critic(hidden: Sequence[int]) -> Network:
  """One Q-network on ``concat(obs, action)``; returns ``q`` of shape ``[B]``
  (DDPG)."""

  def forward(obs, action):
    return _mlp([*hidden, 1])(jnp.concatenate([obs, action], axis=-1))[..., 0]

  return _pure(forward)


def twin_critic(hidden: Sequence[int]) -> Network:
  """Two independent Q-networks on ``concat(obs, action)``; returns ``(q1, q2)``
  each of shape ``[B]`` (TD3 / SAC clipped double-Q)."""

  def forward(obs, action):
    x = jnp.concatenate([obs, action], axis=-1)
    q1 = _mlp([*hidden, 1], name='q1')(x)[..., 0]
    q2 = _mlp([*hidden, 1], name='q2')(x)[..., 0]
    return q1, q2

  return _pure(forward)


def gaussian_policy(action_dim: int, hidden: Sequence[int]) -> Network:
  """SAC actor: MLP giving the mean and log-std of a Gaussian before ``tanh``.

  The log-std is clipped to ``[-20, 2]`` as in the SAC reference code.
  """

  def forward(obs):
    out = _mlp([*hidden, 2 * action_dim])(obs)
    mean, log_std = jnp.split(out, 2, axis=-1)
    return mean, jnp.clip(log_std, -20.0, 2.0)

  return _pure(forward)


def nature_q_network(num_actions: int) -> Network:
  """The Nature-DQN torso and head (Mnih et al. 2015) on ``[B, 84, 84, 4]``
  uint8 frames; returns Q-values ``[B, num_actions]``."""

  def forward(frames):
    x = frames.astype(jnp.float32) / 255.0
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
