"""A2C (Mnih et al. 2016, Algorithm S3), synchronous as Stable-Baselines3's
``A2C``: an agent that learns from its own rollouts, from user code
(``--agent examples.a2c:A2C``). Each iteration a member acts ``rollout_length``
(T) steps in each of its ``num_envs`` (E) envs, then takes ONE gradient step
on the whole rollout (``batch_size = T x E``; no epochs, no minibatches) on
``-A log pi(a|s) + value_coef (R - V(s))^2 - entropy_coef H``, ``R = A +
V(s)``, ``A`` by GAE (``gae_lambda`` 1: the paper's n-step returns), which
bootstraps from ``V(next_observation)``, never through a termination. RMSprop
(decay 0.99, eps 1e-5 outside the root, as PyTorch's): the paper's optimizer
and SB3's default. SB3's defaults too: lr 7e-4, T 5, E 1, gamma 0.99, value
0.5, entropy 0, grad norm 0.5, its MlpPolicy (separate 64x64 tanh MLPs,
orthogonal init, a state-independent log-std from 0: PPO's networks).
Departure: no importance ratio, so a rollout one learner call old is
learned as on-policy (as A3C's workers do).
"""

import dataclasses
import math
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl import agents
from fastpbrl.agents import networks as nets_lib, ppo
from fastpbrl.agents.base import Agent, rollout_steps, scalar_hparams
from fastpbrl.core import search_space as ss

LOG_2PI = math.log(2.0 * math.pi)  # a Python float: float64 tests stay so


@dataclasses.dataclass(frozen=True)
class A2CConfig:
  """Static A2C settings (changing one recompiles)."""
  hidden_sizes: Sequence[int] = (64, 64)  # policy and value MLP widths
  rollout_length: int = 5  # T: steps per env per iteration
  num_envs: int = 1  # E: envs each member acts in at once
  batch_size: Optional[int] = None  # must be T x E (None: T x E)
  steps_per_call: Optional[int] = None  # env steps per call (None: T x E)

  def __post_init__(self):
    whole = rollout_steps(self)
    for name in ('batch_size', 'steps_per_call'):
      if getattr(self, name) is None:
        object.__setattr__(self, name, whole)
    if self.batch_size != whole:
      raise ValueError(f'batch_size {self.batch_size}: A2C takes one step on '
                       f'the whole rollout, rollout_length x num_envs = '
                       f'{whole}')


class A2CHParams(NamedTuple):
  """Traced A2C hyperparameters, each a float32 scalar per member."""
  learning_rate: jax.Array  # RMSprop step size
  discount: jax.Array  # gamma
  gae_lambda: jax.Array  # lambda of GAE (1: n-step returns)
  value_coef: jax.Array  # weight of the value loss
  entropy_coef: jax.Array  # weight of the entropy bonus
  max_grad_norm: jax.Array  # global norm the gradient is clipped to


class A2CState(NamedTuple):
  params: dict  # {'pi': policy (a Gaussian's log-std in it), 'v': value}
  opt_state: optax.OptState  # RMSprop's over all of params
  step: jax.Array  # iterations learned, int32


def default_hparams() -> A2CHParams:
  return scalar_hparams(A2CHParams, learning_rate=7e-4, discount=0.99,
                        gae_lambda=1.0, value_coef=0.5, entropy_coef=0.0,
                        max_grad_norm=0.5)


def optimizer(hp: A2CHParams) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm),
                     optax.rmsprop(hp.learning_rate, decay=0.99, eps=1e-5,
                                   eps_in_sqrt=False))


def log_prob_entropy(dist, action):
  """Log-probability of ``action`` and entropy: ``dist`` is a categorical's
  ``(logits, None)`` or a diagonal Gaussian's ``(mean, log_std)``."""
  out, log_std = dist
  if log_std is None:
    logp = jax.nn.log_softmax(out)
    return (jnp.take_along_axis(logp, action[..., None], -1)[..., 0],
            -jnp.sum(jnp.exp(logp) * logp, -1))
  z = (action - out) * jnp.exp(-log_std)
  return (jnp.sum(-0.5 * z ** 2 - log_std - 0.5 * LOG_2PI, -1),
          jnp.sum(0.5 + 0.5 * LOG_2PI + log_std, -1))


def make_agent(env_spec, config: A2CConfig = A2CConfig()) -> Agent:
  if len(env_spec.observations.shape) != 1:
    raise ValueError('A2C\'s MLPs need vector observations')
  discrete = isinstance(env_spec.actions, specs.DiscreteArray)
  # SB3's MlpPolicy, as PPO's: tanh, orthogonal init, separate MLPs.
  pi = (nets_lib.categorical_policy(env_spec.actions.num_values,
                                    config.hidden_sizes) if discrete else
        nets_lib.diagonal_gaussian_policy(env_spec.actions.shape[0],
                                          config.hidden_sizes))
  v = nets_lib.state_value(config.hidden_sizes)

  def dist(pp, obs):
    return (pi.apply(pp, obs), None) if discrete else pi.apply(pp, obs)

  def init(key, hp):
    obs = nets_lib.dummy_input(env_spec.observations.shape, jnp.float32)
    k_pi, k_v = jax.random.split(key)
    params = {'pi': pi.init(k_pi, obs), 'v': v.init(k_v, obs)}
    return A2CState(params, optimizer(hp).init(params), jnp.int32(0))

  def sample(pp, obs, key):
    out, log_std = d = dist(pp, obs)
    if discrete:
      return d, jax.random.categorical(key, out)
    return d, out + jnp.exp(log_std) * jax.random.normal(key, out.shape)

  def behave(pp, obs, key, hp):
    d, action = sample(pp, obs, key)
    return action, log_prob_entropy(d, action)[0]

  def act(pp, obs, key, hp, explore):
    d, action = sample(pp, obs, key)
    if not explore:
      action = jnp.argmax(d[0], -1) if discrete else d[0]
    return action if discrete else jnp.clip(action, -1.0, 1.0)

  def loss(params, batch, advantage, returns, hp):
    logp, entropy = log_prob_entropy(dist(params['pi'], batch.observation),
                                     batch.action)
    policy_loss = -jnp.mean(advantage * logp)
    value_loss = jnp.mean(jnp.square(returns - v.apply(params['v'],
                                                       batch.observation)))
    total = (policy_loss + hp.value_coef * value_loss
             - hp.entropy_coef * jnp.mean(entropy))
    return total, {'policy_loss': policy_loss, 'value_loss': value_loss,
                   'entropy': jnp.mean(entropy)}

  def update(state: A2CState, hp: A2CHParams, rollout):
    t, e = rollout.reward.shape
    # [T, E, ...] -> [T x E, ...]: the networks take one batch axis.
    batch = jax.tree.map(lambda x: x.reshape((t * e, *x.shape[2:])), rollout)
    v_obs = v.apply(state.params['v'], batch.observation).reshape(t, e)
    v_next = v.apply(state.params['v'], batch.next_observation).reshape(t, e)
    # PPO's GAE (public in fastpbrl.agents.ppo): it bootstraps from
    # V(next_observation), truncations included, never through a termination.
    advantage = ppo.gae(rollout.reward, v_obs, v_next, rollout.terminated,
                        rollout.truncated, hp.discount, hp.gae_lambda)
    (total, metrics), grads = jax.value_and_grad(loss, has_aux=True)(
        state.params, batch, advantage.reshape(-1),
        (advantage + v_obs).reshape(-1), hp)
    updates, opt_state = optimizer(hp).update(grads, state.opt_state)
    new = A2CState(optax.apply_updates(state.params, updates), opt_state,
                   state.step + 1)
    return new, {**metrics, 'loss': total, 'grad_norm': optax.tree.norm(grads)}

  return Agent(name='a2c', env_spec=env_spec, config=config,
               default_hparams=default_hparams, init=init, act=act,
               update=update, policy_params=lambda state: state.params['pi'],
               learns_from='rollout', behave=behave)


SEARCH_SPACE = {'learning_rate': ss.LogUniform(1e-4, 3e-3),
                'entropy_coef': ss.Uniform(0.0, 0.01),
                'gae_lambda': ss.Uniform(0.9, 1.0)}
DOMAINS = {  # each hyperparameter's meaning and valid range (fastpbrl info)
    'learning_rate': ss.positive('RMSprop step size', 'step size'),
    'discount': ss.HParamDomain('discount gamma', 'per env step', 0.0, 1.0),
    'gae_lambda': ss.HParamDomain('lambda of GAE', '', 0.0, 1.0),
    'value_coef': ss.non_negative('weight of the value loss'),
    'entropy_coef': ss.non_negative('weight of the entropy bonus'),
    'max_grad_norm': ss.positive('global norm the gradient is clipped to')}

A2C = agents.register('a2c', make_agent=make_agent, config=A2CConfig,
                      default_search_space=SEARCH_SPACE,
                      hparam_domains=DOMAINS, learns_from='rollout',
                      example_env='CartPole-v1')
