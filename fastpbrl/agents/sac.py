"""SAC (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and
Applications"), as pure functions over one member's state.

Tanh-squashed Gaussian policy, twin critics with the clipped double-Q soft
target (eq. 3 with the min of two targets), Polyak-averaged target critics
every step, and a learned temperature ``alpha`` trained towards a target
entropy (sec. 5, eq. 18). Defaults follow the authors' v2 settings: 256x256
ReLU MLPs, Adam 3e-4 for all three losses, batch 256, tau 0.005, gamma 0.99,
target entropy ``-dim(A)``, initial ``alpha = 1``.

Departures: the target entropy is ``-target_entropy_scale * dim(A)`` with a
traced scale (the 2022 paper's PBT searches it in ``[0.2, 2]`` times the
default), and the optimizers are built inside ``update`` from the traced
learning rates.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.agents import networks as nets_lib
from fastpbrl.agents.base import Agent, polyak, scalar_hparams, td_target
from fastpbrl.agents.registry import register
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import Params, PRNGKey, Transition


@dataclasses.dataclass(frozen=True)
class SACConfig:
  """Static SAC settings (changing one recompiles)."""

  hidden_sizes: Sequence[int] = (256, 256)  # policy and critic MLP widths
  batch_size: int = 256  # transitions per member per update step
  steps_per_call: int = 50  # update steps compiled into one learner call
  initial_log_alpha: float = 0.0  # log temperature at init (alpha = 1)
  # 'haiku' (Acme's) or 'torch' (SB3's and the reference code's), see
  # fastpbrl.agents.networks._mlp.
  network_init: str = 'haiku'


class SACHParams(NamedTuple):
  """Traced SAC hyperparameters, each a float32 scalar per member."""

  policy_lr: jax.Array  # Adam step size of the actor
  critic_lr: jax.Array  # Adam step size of both critics
  alpha_lr: jax.Array  # Adam step size of the log temperature
  discount: jax.Array  # gamma
  tau: jax.Array  # Polyak rate of the target critics
  target_entropy_scale: jax.Array  # target entropy = -scale * action_dim
  reward_scale: jax.Array  # rewards are multiplied by this in the TD target


def default_hparams() -> SACHParams:
  return scalar_hparams(
      SACHParams, policy_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4,
      discount=0.99, tau=0.005, target_entropy_scale=1.0, reward_scale=1.0)


class SACState(NamedTuple):
  """One member's full training state (what PBT's exploit copies)."""

  policy: Params
  critic: Params
  target_critic: Params
  log_alpha: jax.Array  # float32 scalar, log temperature
  policy_opt: optax.OptState
  critic_opt: optax.OptState
  alpha_opt: optax.OptState
  key: PRNGKey
  step: jax.Array  # int32 scalar


def sample_tanh_gaussian(mean: jax.Array, log_std: jax.Array,
                         key: PRNGKey) -> tuple[jax.Array, jax.Array]:
  """Samples ``a = tanh(u)``, ``u ~ N(mean, std)``; returns ``(a, log pi(a))``.

  The change-of-variables term uses the stable form
  ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))`` (SAC appendix C).
  """
  std = jnp.exp(log_std)
  u = mean + std * jax.random.normal(key, mean.shape)
  gaussian_logp = jnp.sum(
      -0.5 * jnp.square((u - mean) / std) - log_std - 0.5 * jnp.log(2 * jnp.pi),
      axis=-1)
  log_det = jnp.sum(2.0 * (jnp.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)
  return jnp.tanh(u), gaussian_logp - log_det


class SACNetworks(NamedTuple):
  """SAC's networks and the shapes they are built for."""

  policy: nets_lib.Network  # observation -> (mean, log_std) of u
  critic: nets_lib.Network  # (observation, action) -> (Q1, Q2)
  obs_shape: tuple
  action_dim: int


def _init(nets: SACNetworks, initial_log_alpha: float, key: PRNGKey,
          hparams: SACHParams) -> SACState:
  """``Agent.init``: one member's initial state."""
  del hparams
  k_pi, k_q, k_state = jax.random.split(key, 3)
  obs = jnp.zeros((1, *nets.obs_shape), jnp.float32)
  policy = nets.policy.init(k_pi, obs)
  critic = nets.critic.init(k_q, obs,
                            jnp.zeros((1, nets.action_dim), jnp.float32))
  log_alpha = jnp.asarray(initial_log_alpha, jnp.float32)
  adam = optax.adam(1.0)  # Adam's state does not depend on the step size
  return SACState(
      policy=policy, critic=critic, target_critic=critic,
      log_alpha=log_alpha, policy_opt=adam.init(policy),
      critic_opt=adam.init(critic), alpha_opt=adam.init(log_alpha),
      key=k_state, step=jnp.zeros((), jnp.int32))


def _act(nets: SACNetworks, policy: Params, observation: jax.Array,
         key: PRNGKey, hparams: SACHParams, explore: bool) -> jax.Array:
  """``Agent.act``: a sampled action (``explore``) or the mean's ``tanh``."""
  del hparams
  mean, log_std = nets.policy.apply(policy, observation)
  if explore:
    return sample_tanh_gaussian(mean, log_std, key)[0]
  return jnp.tanh(mean)


def critic_loss(nets: SACNetworks, critic: Params, state: SACState,
                batch: Transition, key: PRNGKey,
                hp: SACHParams) -> tuple[jax.Array, jax.Array]:
  """Twin soft-Q loss against the clipped double-Q soft target (eq. 3);
  returns (loss, mean Q1)."""
  alpha = jnp.exp(state.log_alpha)
  mean, log_std = nets.policy.apply(state.policy, batch.next_observation)
  next_action, next_logp = sample_tanh_gaussian(mean, log_std, key)
  next_q1, next_q2 = nets.critic.apply(state.target_critic,
                                       batch.next_observation, next_action)
  soft_value = jnp.minimum(next_q1, next_q2) - alpha * next_logp
  target = jax.lax.stop_gradient(td_target(
      hp.reward_scale * batch.reward, batch.terminated, hp.discount,
      soft_value))
  q1, q2 = nets.critic.apply(critic, batch.observation, batch.action)
  loss = 0.5 * (jnp.mean(jnp.square(q1 - target))
                + jnp.mean(jnp.square(q2 - target)))
  return loss, jnp.mean(q1)


def policy_loss(nets: SACNetworks, policy: Params, critic: Params,
                log_alpha: jax.Array, observation: jax.Array,
                key: PRNGKey) -> tuple[jax.Array, jax.Array]:
  """``E[alpha log pi(a|s) - min(Q1, Q2)(s, a)]``; returns (loss, log pi)."""
  mean, log_std = nets.policy.apply(policy, observation)
  action, logp = sample_tanh_gaussian(mean, log_std, key)
  q1, q2 = nets.critic.apply(critic, observation, action)
  alpha = jax.lax.stop_gradient(jnp.exp(log_alpha))
  return jnp.mean(alpha * logp - jnp.minimum(q1, q2)), logp


def _update(nets: SACNetworks, state: SACState, hp: SACHParams,
            batch: Transition):
  """``Agent.update``: one step of the critics, the policy and alpha."""
  key, k_critic, k_policy = jax.random.split(state.key, 3)
  (c_loss, q1), c_grads = jax.value_and_grad(
      functools.partial(critic_loss, nets), has_aux=True)(
          state.critic, state, batch, k_critic, hp)
  c_updates, critic_opt = optax.adam(hp.critic_lr).update(
      c_grads, state.critic_opt)
  critic = optax.apply_updates(state.critic, c_updates)

  (p_loss, logp), p_grads = jax.value_and_grad(
      functools.partial(policy_loss, nets), has_aux=True)(
          state.policy, critic, state.log_alpha, batch.observation, k_policy)
  p_updates, policy_opt = optax.adam(hp.policy_lr).update(
      p_grads, state.policy_opt)
  policy = optax.apply_updates(state.policy, p_updates)

  # Temperature loss -log_alpha * (log pi + target entropy) (SAC eq. 18 on
  # log alpha, as in the authors' code).
  target_entropy = -hp.target_entropy_scale * nets.action_dim
  entropy_gap = jax.lax.stop_gradient(jnp.mean(logp) + target_entropy)
  a_loss, a_grad = jax.value_and_grad(lambda la: -la * entropy_gap)(
      state.log_alpha)
  a_update, alpha_opt = optax.adam(hp.alpha_lr).update(a_grad, state.alpha_opt)
  log_alpha = optax.apply_updates(state.log_alpha, a_update)

  new_state = SACState(
      policy=policy, critic=critic,
      target_critic=polyak(state.target_critic, critic, hp.tau),
      log_alpha=log_alpha, policy_opt=policy_opt, critic_opt=critic_opt,
      alpha_opt=alpha_opt, key=key, step=state.step + 1)
  metrics = {'critic_loss': c_loss, 'policy_loss': p_loss, 'q1': q1,
             'alpha': jnp.exp(log_alpha), 'alpha_loss': a_loss,
             'entropy': -jnp.mean(logp)}
  return new_state, metrics


def make_agent(env_spec: specs.EnvironmentSpec,
               config: SACConfig = SACConfig()) -> Agent:
  """Builds the SAC agent's pure functions for ``env_spec``."""
  if not isinstance(env_spec.actions, specs.BoundedArray) or isinstance(
      env_spec.actions, specs.DiscreteArray):
    raise ValueError('SAC needs a continuous (Box) action space; use DQN for '
                     'discrete actions')
  action_dim = int(env_spec.actions.shape[0])
  obs_shape = tuple(env_spec.observations.shape)
  nets = SACNetworks(
      policy=nets_lib.gaussian_policy(action_dim, config.hidden_sizes,
                                      config.network_init),
      critic=nets_lib.twin_critic(config.hidden_sizes, config.network_init),
      obs_shape=obs_shape, action_dim=action_dim)
  return Agent(
      name='sac', env_spec=env_spec, config=config,
      default_hparams=default_hparams,
      init=functools.partial(_init, nets, config.initial_log_alpha),
      act=functools.partial(_act, nets),
      update=functools.partial(_update, nets),
      policy_params=lambda state: state.policy)


# The 2022 paper's PBT search space (Flajolet et al., appendix B.1), with the
# discount in horizon space (see fastpbrl.core.search_space).
SEARCH_SPACE = {
    'policy_lr': ss.PAPER_LR,
    'critic_lr': ss.PAPER_LR,
    'alpha_lr': ss.PAPER_LR,
    # "between 0.2 and 2 times the default" target entropy -dim(A).
    'target_entropy_scale': ss.Uniform(0.2, 2.0),
    # The paper's text reads "uniform values between 0.1 and 10"; a
    # log-uniform prior puts as much mass below 1 as above it, which is
    # what a multiplicative scale around the default 1 calls for.
    'reward_scale': ss.LogUniform(0.1, 10.0),
    'discount': ss.PAPER_DISCOUNT,
}

# Meaning, unit and valid range of each hyperparameter (``fastpbrl info sac``).
DOMAINS = {
    'policy_lr': ss.positive('Adam step size of the actor', 'step size'),
    'critic_lr': ss.positive('Adam step size of both critics', 'step size'),
    'alpha_lr': ss.positive('Adam step size of the log temperature',
                            'step size'),
    'discount': ss.HParamDomain('discount gamma of the TD target',
                                'per env step', low=0.0, high=1.0),
    'tau': ss.HParamDomain('Polyak rate of the target critics, every step',
                           'fraction per update', low=0.0, high=1.0,
                           low_open=True),
    'target_entropy_scale': ss.non_negative(
        'target entropy = -scale * dim(A)', 'nats per action dimension'),
    'reward_scale': ss.positive('rewards are multiplied by this in the TD '
                                'target', 'multiplier'),
}

register('sac', make_agent=make_agent, config=SACConfig,
         default_search_space=SEARCH_SPACE, hparam_domains=DOMAINS)
