"""DDPG (Lillicrap et al. 2016) from user code, one ``register`` call:
``python -m experiments.pbt --agent examples.ddpg:DDPG``. Algorithm 1: the
critic regresses on ``y = r + gamma Q'(s', mu'(s'))`` (eq. 5), the actor
follows the deterministic policy gradient (eq. 6), both targets move by
``tau`` every step. Sec. 7's defaults: Adam 1e-4 (actor), 1e-3 (critic), L2
1e-2 on the critic, gamma 0.99, tau 0.001, 400x300, batch 64. Departures:
Gaussian action noise (std 0.1), not Ornstein-Uhlenbeck (as the TD3 paper's
DDPG); no batch norm; haiku's default initialisation; the action enters the
critic's input layer; the L2 term covers biases too. No shared-critic update
is registered, so CEM-RL and DvD refuse it.
"""

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp

from fastpbrl import agents
from fastpbrl.agents import deterministic as det, networks as nets_lib
from fastpbrl.agents.base import Agent, polyak, scalar_hparams, td_target
from fastpbrl.core import search_space as ss


@dataclasses.dataclass(frozen=True)
class DDPGConfig:
  """Static DDPG settings (changing one recompiles)."""
  hidden_sizes: Sequence[int] = (400, 300)  # policy and critic MLP widths
  batch_size: int = 64  # transitions per member per update step
  steps_per_call: int = 50  # update steps compiled into one learner call


class DDPGHParams(NamedTuple):
  """Traced DDPG hyperparameters, each a float32 scalar per member."""
  policy_lr: jax.Array  # Adam step size of the actor
  critic_lr: jax.Array  # Adam step size of the critic
  weight_decay: jax.Array  # L2 coefficient on the critic's parameters
  discount: jax.Array  # gamma
  tau: jax.Array  # Polyak rate of both targets, every step
  exploration_noise: jax.Array  # std of the Gaussian action noise


def default_hparams() -> DDPGHParams:
  return scalar_hparams(DDPGHParams, policy_lr=1e-4, critic_lr=1e-3,
                        weight_decay=1e-2, discount=0.99, tau=1e-3,
                        exploration_noise=0.1)


def critic_loss(q_apply, pi_apply, critic, state: det.ActorCriticState,
                batch, hp: DDPGHParams):
  """``mean((Q(s, a) - y)^2) + weight_decay/2 |critic|^2``, and mean Q."""
  next_q = q_apply(state.target_critic, batch.next_observation,
                   pi_apply(state.target_policy, batch.next_observation))
  y = jax.lax.stop_gradient(
      td_target(batch.reward, batch.terminated, hp.discount, next_q))
  q = q_apply(critic, batch.observation, batch.action)
  l2 = sum(jnp.sum(jnp.square(w)) for w in jax.tree.leaves(critic))
  return jnp.mean(jnp.square(q - y)) + 0.5 * hp.weight_decay * l2, jnp.mean(q)


def make_agent(env_spec, config: DDPGConfig = DDPGConfig()) -> Agent:
  action_dim = det.continuous_action_dim(env_spec, 'DDPG')
  obs_shape = tuple(env_spec.observations.shape)
  pi = nets_lib.deterministic_policy(action_dim, config.hidden_sizes)
  q = nets_lib.critic(config.hidden_sizes)

  def update(state: det.ActorCriticState, hp: DDPGHParams, batch):
    (c_loss, mean_q), c_grads = jax.value_and_grad(critic_loss, argnums=2,
                                                   has_aux=True)(
        q.apply, pi.apply, state.critic, state, batch, hp)
    critic, critic_opt = det.adam_step(state.critic, state.critic_opt,
                                       c_grads, hp.critic_lr)
    p_loss, p_grads = jax.value_and_grad(det.policy_loss, argnums=2)(
        pi.apply, q.apply, state.policy, critic, batch.observation)
    policy, policy_opt = det.adam_step(state.policy, state.policy_opt,
                                       p_grads, hp.policy_lr)
    new_state = det.ActorCriticState(
        policy=policy, critic=critic,
        target_policy=polyak(state.target_policy, policy, hp.tau),
        target_critic=polyak(state.target_critic, critic, hp.tau),
        policy_opt=policy_opt, critic_opt=critic_opt, key=state.key,
        step=state.step + 1)
    return new_state, {'critic_loss': c_loss, 'policy_loss': p_loss,
                       'q': mean_q}

  return Agent(
      name='ddpg', env_spec=env_spec, config=config,
      default_hparams=default_hparams, update=update,
      init=lambda key, _: det.init_state(pi, q, obs_shape, action_dim, key),
      act=det.make_act(pi.apply), policy_params=lambda state: state.policy)


SEARCH_SPACE = {'policy_lr': ss.LogUniform(1e-5, 1e-3),
                'critic_lr': ss.LogUniform(1e-4, 1e-2),
                'tau': ss.LogUniform(1e-4, 1e-2), 'discount': ss.PAPER_DISCOUNT,
                'exploration_noise': ss.Uniform(0.0, 0.5)}

# Each hyperparameter's meaning, unit and valid range (fastpbrl info): the
# CLI and train() refuse a value or a search space outside it. An agent that
# leaves this out still runs, unchecked.
DOMAINS = {
    'policy_lr': ss.positive('Adam step size of the actor', 'step size'),
    'critic_lr': ss.positive('Adam step size of the critic', 'step size'),
    'weight_decay': ss.non_negative('L2 coefficient on the critic',
                                    'loss per squared weight'),
    'discount': ss.HParamDomain('discount gamma of the TD target',
                                'per env step', low=0.0, high=1.0),
    'tau': ss.HParamDomain('Polyak rate of both targets, every step',
                           'fraction per update', low=0.0, high=1.0,
                           low_open=True),
    'exploration_noise': ss.non_negative('std of the Gaussian action noise',
                                         'action units'),
}

DDPG = agents.register('ddpg', make_agent=make_agent, config=DDPGConfig,
                       default_search_space=SEARCH_SPACE,
                       hparam_domains=DOMAINS)
