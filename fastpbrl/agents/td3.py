"""TD3 (Fujimoto et al. 2018, "Addressing Function Approximation Error in
Actor-Critic Methods"), as pure functions over one member's state.

Twin critics with the clipped double-Q target (eq. 10), target policy
smoothing with clipped Gaussian noise (eq. 14), delayed policy and target
updates, Polyak-averaged targets. Defaults follow the authors' reference
implementation: 256x256 ReLU MLPs, Adam 3e-4, batch 256, tau 0.005,
gamma 0.99, policy noise 0.2 clipped at 0.5, exploration noise 0.1, delay 2.

Departures, each because hyperparameters are traced per member:

* the policy delay is a *fraction* of critic steps followed by a policy
  and target update, ``policy_update_fraction = 1 / d`` (``0.5`` is the
  paper's ``d=2``; see ``periodic_flag``), as in the 2022 paper's PBT
  search space; it was called ``policy_delay`` before, a name that reads
  as the paper's ``d`` and is refused now;
* the optimizers are built inside ``update`` from the traced learning rates.

Also here: the shared-critic population update of CEM-RL and DvD
(``make_shared_critic``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.agents import deterministic as det
from fastpbrl.agents import networks as nets_lib
from fastpbrl.agents.base import (Agent, SharedCritic, any_member,
                                  periodic_flag, polyak, scalar_hparams,
                                  select_tree, td_target)
from fastpbrl.agents.registry import register
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import Params, PRNGKey, Transition


@dataclasses.dataclass(frozen=True)
class TD3Config:
  """Static TD3 settings (changing one recompiles)."""

  hidden_sizes: Sequence[int] = (256, 256)  # policy and critic MLP widths
  batch_size: int = 256  # transitions per member per update step
  steps_per_call: int = 50  # update steps compiled into one learner call
  # 'haiku' (Acme's) or 'torch' (SB3's and the reference code's), see
  # fastpbrl.agents.networks._mlp.
  network_init: str = 'haiku'


class TD3HParams(NamedTuple):
  """Traced TD3 hyperparameters, each a float32 scalar per member."""

  policy_lr: jax.Array  # Adam step size of the actor
  critic_lr: jax.Array  # Adam step size of both critics
  discount: jax.Array  # gamma
  tau: jax.Array  # Polyak rate of the target networks
  # fraction of critic steps followed by a policy and target update, in
  # (0, 1]: 0.5 is TD3's delay d=2 (1 / d)
  policy_update_fraction: jax.Array
  exploration_noise: jax.Array  # std of the Gaussian action noise when acting
  target_noise: jax.Array  # std of the target policy smoothing noise
  noise_clip: jax.Array  # target smoothing noise is clipped to +-noise_clip
  reward_scale: jax.Array  # rewards are multiplied by this in the TD target


def default_hparams() -> TD3HParams:
  return scalar_hparams(
      TD3HParams, policy_lr=3e-4, critic_lr=3e-4, discount=0.99, tau=0.005,
      policy_update_fraction=0.5, exploration_noise=0.1, target_noise=0.2,
      noise_clip=0.5, reward_scale=1.0)


# One member's full training state (what PBT's exploit copies): policy, both
# Q-networks, their targets, two Adam states, key and step.
TD3State = det.ActorCriticState


class TD3Networks(NamedTuple):
  policy: nets_lib.Network
  critic: nets_lib.Network
  obs_shape: tuple
  action_dim: int


def make_networks(env_spec: specs.EnvironmentSpec,
                  config: TD3Config) -> TD3Networks:
  action_dim = det.continuous_action_dim(env_spec, 'TD3')
  return TD3Networks(
      policy=nets_lib.deterministic_policy(action_dim, config.hidden_sizes,
                                           config.network_init),
      critic=nets_lib.twin_critic(config.hidden_sizes, config.network_init),
      obs_shape=tuple(env_spec.observations.shape),
      action_dim=action_dim)


def _init_params(nets: TD3Networks, key: PRNGKey):
  return det.init_params(nets.policy, nets.critic, nets.obs_shape,
                         nets.action_dim, key)


def critic_loss(nets: TD3Networks, critic: Params, target_critic: Params,
                target_policy: Params, batch: Transition, key: PRNGKey,
                hp: TD3HParams) -> tuple[jax.Array, jax.Array]:
  """Clipped double-Q loss, ``mse(Q1, y) + mse(Q2, y)``; returns (loss, mean Q1)."""
  noise = jnp.clip(
      hp.target_noise * jax.random.normal(key, batch.action.shape),
      -hp.noise_clip, hp.noise_clip)
  next_action = jnp.clip(
      nets.policy.apply(target_policy, batch.next_observation) + noise, -1.0, 1.0)
  next_q1, next_q2 = nets.critic.apply(target_critic, batch.next_observation,
                                       next_action)
  target = td_target(hp.reward_scale * batch.reward, batch.terminated,
                     hp.discount, jnp.minimum(next_q1, next_q2))
  target = jax.lax.stop_gradient(target)
  q1, q2 = nets.critic.apply(critic, batch.observation, batch.action)
  loss = jnp.mean(jnp.square(q1 - target)) + jnp.mean(jnp.square(q2 - target))
  return loss, jnp.mean(q1)


def policy_loss(nets: TD3Networks, policy: Params, critic: Params,
                observation: jax.Array) -> jax.Array:
  """Deterministic policy gradient objective ``-E[Q1(s, pi(s))]``."""
  return det.policy_loss(nets.policy.apply,
                         lambda c, o, a: nets.critic.apply(c, o, a)[0],
                         policy, critic, observation)


def make_agent(env_spec: specs.EnvironmentSpec,
               config: TD3Config = TD3Config()) -> Agent:
  """Builds the TD3 agent's pure functions for ``env_spec``."""
  nets = make_networks(env_spec, config)

  def init(key: PRNGKey, hparams: TD3HParams) -> TD3State:
    del hparams  # TD3's initial state does not depend on hyperparameters
    return det.init_state(nets.policy, nets.critic, nets.obs_shape,
                          nets.action_dim, key)

  def update(state: TD3State, hp: TD3HParams, batch: Transition):
    key, k_noise = jax.random.split(state.key)
    (c_loss, q1), c_grads = jax.value_and_grad(
        lambda c: critic_loss(nets, c, state.target_critic, state.target_policy,
                              batch, k_noise, hp), has_aux=True)(state.critic)
    critic, critic_opt = det.adam_step(state.critic, state.critic_opt,
                                       c_grads, hp.critic_lr)

    # Delayed policy and target updates. ``any_member`` keeps this a real
    # cond under the learner's vmap: steps on which no member updates its
    # policy skip the policy work for the whole population; on the others
    # each member keeps or drops its step by its own flag.
    do_policy = periodic_flag(state.step, hp.policy_update_fraction)
    current = (state.policy, state.policy_opt, state.target_policy,
               state.target_critic, jnp.zeros((), c_loss.dtype))

    def policy_step(_):
      p_loss, p_grads = jax.value_and_grad(
          lambda p: policy_loss(nets, p, critic, batch.observation))(state.policy)
      policy, policy_opt = det.adam_step(state.policy, state.policy_opt,
                                         p_grads, hp.policy_lr)
      stepped = (policy, policy_opt, polyak(state.target_policy, policy, hp.tau),
                 polyak(state.target_critic, critic, hp.tau), p_loss)
      return select_tree(do_policy, stepped, current)

    policy, policy_opt, target_policy, target_critic, p_loss = jax.lax.cond(
        any_member(do_policy), policy_step, lambda _: current, None)
    new_state = TD3State(
        policy=policy, critic=critic, target_policy=target_policy,
        target_critic=target_critic, policy_opt=policy_opt,
        critic_opt=critic_opt, key=key, step=state.step + 1)
    metrics = {'critic_loss': c_loss, 'policy_loss': p_loss, 'q1': q1,
               'policy_updated': do_policy.astype(jnp.float32)}
    return new_state, metrics

  return Agent(
      name='td3', env_spec=env_spec, config=config,
      default_hparams=default_hparams, init=init,
      act=det.make_act(nets.policy.apply), update=update,
      policy_params=lambda state: state.policy,
      shared_critic=make_shared_critic(nets))


# --------------------------------------------------------------------------
# Shared-critic population update (CEM-RL, DvD)
# --------------------------------------------------------------------------


class SharedTD3State(NamedTuple):
  """A population with per-member policies and one shared twin critic."""

  policy: Params  # [N, ...]
  target_policy: Params  # [N, ...]
  policy_opt: optax.OptState  # [N, ...]
  critic: Params  # shared, no population axis
  target_critic: Params
  critic_opt: optax.OptState
  key: PRNGKey  # [N] member keys (target smoothing noise)
  step: jax.Array  # int32 scalar


PolicyTerm = Callable[[Params, jax.Array], jax.Array]


def make_shared_critic(nets: TD3Networks,
                       extra_policy_loss: Optional[PolicyTerm] = None
                      ) -> SharedCritic:
  """TD3 with one critic shared by the population (2022 paper, sec. 4.2).

  Each member's batch goes through every member's target policy in parallel;
  the critic loss is the population mean of the members' TD3 critic losses.
  Each member's policy then takes its own TD3 step against the updated
  critic; ``extra_policy_loss(policies[N], observations[N, B, ...])`` adds a
  population-level term (DvD's diversity loss) to the summed policy losses.

  Critic-side settings that are per member in ``TD3HParams`` (discount,
  target noise, reward scale) enter each member's own TD target; the ones
  that act on the single critic (``critic_lr``, ``tau``, and the rate of
  target-critic refreshes ``policy_update_fraction``) are the population
  mean.
  """
  return SharedCritic(
      init=functools.partial(_shared_init, nets),
      update=functools.partial(_shared_update, nets, extra_policy_loss),
      policy_params=lambda state: state.policy,
      with_policy_loss=lambda extra: make_shared_critic(nets, extra),
      policy_apply=nets.policy.apply)


def _shared_init(nets: TD3Networks, key: PRNGKey,
                 hparams: TD3HParams) -> SharedTD3State:
  """``SharedCritic.init``: ``N`` policies and one critic."""
  n = hparams.policy_lr.shape[0]
  k_pi, k_q, k_state = jax.random.split(key, 3)
  policies = jax.vmap(lambda k: _init_params(nets, k)[0])(
      jax.random.split(k_pi, n))
  critic = _init_params(nets, k_q)[1]
  return SharedTD3State(
      policy=policies, target_policy=policies,
      policy_opt=jax.vmap(det.adam_init)(policies), critic=critic,
      target_critic=critic, critic_opt=det.adam_init(critic),
      key=jax.random.split(k_state, n), step=jnp.zeros((), jnp.int32))


def _shared_critic_step(nets: TD3Networks, state: SharedTD3State,
                        hp: TD3HParams, batch: Transition,
                        noise_keys: PRNGKey):
  """The shared critic's Adam step on the population mean of the members'
  critic losses; returns (critic, critic_opt, losses[N], q1[N])."""

  def population_critic_loss(critic):
    losses, q1 = jax.vmap(
        lambda tp, b, k, h: critic_loss(nets, critic, state.target_critic,
                                        tp, b, k, h))(
            state.target_policy, batch, noise_keys, hp)
    return jnp.mean(losses), (losses, q1)

  (_, (c_losses, q1)), c_grads = jax.value_and_grad(
      population_critic_loss, has_aux=True)(state.critic)
  critic, critic_opt = det.adam_step(state.critic, state.critic_opt,
                                     c_grads, jnp.mean(hp.critic_lr))
  return critic, critic_opt, c_losses, q1


def _shared_policy_step(nets: TD3Networks,
                        extra_policy_loss: Optional[PolicyTerm],
                        state: SharedTD3State, hp: TD3HParams,
                        batch: Transition, critic: Params,
                        do_policy: jax.Array, current: tuple) -> tuple:
  """Each flagged member's policy step against ``critic`` (``current``,
  the kept values, for the others); returns (policy, policy_opt,
  target_policy, losses[N])."""

  def total_policy_loss(policies):
    losses = jax.vmap(lambda p, o: policy_loss(nets, p, critic, o))(
        policies, batch.observation)
    total = jnp.sum(losses)
    if extra_policy_loss is not None:
      total = total + extra_policy_loss(policies, batch.observation)
    return total, losses

  def policy_step(_):
    (_, p_losses), p_grads = jax.value_and_grad(
        total_policy_loss, has_aux=True)(state.policy)
    stepped, stepped_opt = jax.vmap(det.adam_step)(
        state.policy, state.policy_opt, p_grads, hp.policy_lr)
    stepped = (stepped, stepped_opt,
               jax.vmap(polyak)(state.target_policy, stepped, hp.tau),
               p_losses)
    return jax.vmap(select_tree)(do_policy, stepped, current)

  # Steps on which no member updates its policy skip the policy work.
  return jax.lax.cond(jnp.any(do_policy), policy_step, lambda _: current,
                      None)


def _shared_update(nets: TD3Networks, extra_policy_loss: Optional[PolicyTerm],
                   state: SharedTD3State, hp: TD3HParams, batch: Transition):
  """``SharedCritic.update``: one step of the shared critic, then of each
  member's policy, then the target critic."""
  keys = jax.vmap(jax.random.split)(state.key)  # [N, 2]
  new_keys, noise_keys = keys[:, 0], keys[:, 1]
  critic, critic_opt, c_losses, q1 = _shared_critic_step(
      nets, state, hp, batch, noise_keys)

  do_policy = jax.vmap(periodic_flag, in_axes=(None, 0))(
      state.step, hp.policy_update_fraction)  # [N]
  # The skipped step's losses take the critic losses' dtype, so that the
  # update also runs in float64 (the suite's exact comparisons).
  current = (state.policy, state.policy_opt, state.target_policy,
             jnp.zeros(do_policy.shape, c_losses.dtype))
  policy, policy_opt, target_policy, p_losses = _shared_policy_step(
      nets, extra_policy_loss, state, hp, batch, critic, do_policy, current)
  tau = jnp.mean(hp.tau)
  do_critic_target = periodic_flag(state.step, jnp.mean(hp.policy_update_fraction))
  target_critic = select_tree(do_critic_target,
                              polyak(state.target_critic, critic, tau),
                              state.target_critic)
  new_state = SharedTD3State(
      policy=policy, target_policy=target_policy, policy_opt=policy_opt,
      critic=critic, target_critic=target_critic, critic_opt=critic_opt,
      key=new_keys, step=state.step + 1)
  metrics = {'critic_loss': c_losses, 'policy_loss': p_losses, 'q1': q1,
             'policy_updated': do_policy.astype(jnp.float32)}
  return new_state, metrics


def shared_critic(env_spec: specs.EnvironmentSpec,
                  config: TD3Config = TD3Config()) -> SharedCritic:
  """The shared-critic population update for ``env_spec`` (the registry's
  ``shared_critic`` capability)."""
  return make_shared_critic(make_networks(env_spec, config))


# The 2022 paper's PBT search space (Flajolet et al., appendix B.1), with the
# discount in horizon space (see fastpbrl.core.search_space).
SEARCH_SPACE = {
    'policy_lr': ss.PAPER_LR,
    'critic_lr': ss.PAPER_LR,
    # Fraction of critic steps with a policy update (TD3's d = 1 / fraction).
    'policy_update_fraction': ss.Uniform(0.2, 1.0),
    # "the noise parameters (sampling uniform values between 0 and 1)":
    # exploration noise, target smoothing noise and its clip, as the
    # paper's code searches all three.
    'exploration_noise': ss.Uniform(0.0, 1.0),
    'target_noise': ss.Uniform(0.0, 1.0),
    'noise_clip': ss.Uniform(0.0, 1.0),
    'discount': ss.PAPER_DISCOUNT,
}

# Meaning, unit and valid range of each hyperparameter (``fastpbrl info td3``).
DOMAINS = {
    'policy_lr': ss.positive('Adam step size of the actor', 'step size'),
    'critic_lr': ss.positive('Adam step size of both critics', 'step size'),
    'discount': ss.HParamDomain('discount gamma of the TD target',
                                'per env step', low=0.0, high=1.0),
    'tau': ss.HParamDomain('Polyak rate of the targets at each target update',
                           'fraction per update', low=0.0, high=1.0,
                           low_open=True),
    'policy_update_fraction': ss.HParamDomain(
        'fraction of critic update steps followed by a policy and target '
        "update; 0.5 = TD3's delay d=2", 'policy updates per critic update',
        low=0.0, high=1.0, low_open=True),
    'exploration_noise': ss.non_negative(
        'std of the Gaussian action noise when acting',
        'action units (actions in [-1, 1])'),
    'target_noise': ss.non_negative('std of the target policy smoothing noise',
                                    'action units'),
    'noise_clip': ss.non_negative(
        'target smoothing noise is clipped to +-noise_clip', 'action units'),
    'reward_scale': ss.positive('rewards are multiplied by this in the TD '
                                'target', 'multiplier'),
}

# The old name of policy_update_fraction: it read as the paper's delay d.
RENAMED = {'policy_delay': (
    'was renamed policy_update_fraction (the fraction of critic steps '
    "followed by a policy update, 1 / TD3's delay d): policy_delay=2 -> "
    'policy_update_fraction=0.5; an old fraction such as 0.5 carries over '
    'as is')}

register('td3', make_agent=make_agent, config=TD3Config,
         default_search_space=SEARCH_SPACE, shared_critic=shared_critic,
         hparam_domains=DOMAINS, renamed_hparams=RENAMED)
