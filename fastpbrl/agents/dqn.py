"""DQN (Mnih et al. 2015, "Human-level control through deep reinforcement
learning"), as pure functions over one member's state.

Nature CNN on ``84x84x4`` uint8 frames (an MLP for vector observations),
a target network refreshed every ``target_update_period`` update steps,
the Huber loss on the one-step TD error, and the Nature paper's centred
RMSProp (step size 2.5e-4, decay 0.95, epsilon 0.01), batch 32, gamma 0.99.

Exploration follows the paper's Extended Data Table 1: epsilon-greedy with
epsilon annealed linearly from 1.0 to its final value 0.1 over the first
1,000,000 agent steps ("final exploration frame"), then held; evaluation
episodes act epsilon-greedily with epsilon 0.05. The schedule is a pure
function of a member's own training env steps (:func:`epsilon_at`); the
actor applies it per member and per step through ``Agent.acting_hparams``,
so the final epsilon, the length of the anneal and the evaluation epsilon
are traced hyperparameters like the others (PBT's DQN search space tunes
the final epsilon). ``act(..., explore=False)`` is the evaluation policy:
epsilon-greedy at ``eval_epsilon``, not the greedy one.

The rest of Nature's schedule are run settings, :data:`NATURE_ATARI_RUN`:
one update per 4 agent steps (``--update-to-data-ratio 0.25``), 50,000
random-action steps before learning (``--warmup-steps 50000``), the first
update only after them (``--no-warmup-counts-as-data``) and a replay
of ``--replay-capacity 100000`` transitions per member. ``fastpbrl pbt
--preset atari`` uses them, with the Atari preprocessing
that ``fastpbrl.envs.gym`` gives any ``ALE/...`` id; ``fastpbrl.run.build`` warns when
a DQN run on frames uses other values.

Departures from the paper:

* the "frames" of Extended Data Table 1 are agent steps (4 emulator frames
  each), as in DeepMind's released code, where every such count is of
  agent steps;
* the target network is refreshed every 2,500 update steps, which is the
  table's "10,000" counted, as the released code counts it, in agent steps
  (``numSteps % target_q``) at one update per 4 of them; the table's
  caption says parameter updates, which would be 4x fewer refreshes;
* epsilon anneals from the member's first env step, as the paper's text
  says, while the released code starts annealing after the 50,000 steps
  of replay start (a difference of at most 0.045 in epsilon);
* the replay holds 100,000 transitions per member, not 1,000,000: each
  stores its observation and next observation apart (55 KiB on frames),
  so a million would take 53 GiB per member;
* on vector observations (CartPole-like tasks, not in the paper) the anneal
  lasts 10,000 env steps by default, as a million would outlast such runs;
* a run resumed from a checkpoint (``--resume``) starts its actors' env
  step counts at zero again, so epsilon re-anneals from 1.0.

The population is stacked with ``jax.vmap``: JAX's batching rule for a
convolution whose kernel is batched emits ONE grouped convolution
(``feature_group_count = N``), the same program as a hand-written grouped
conv with haiku's ``feature_group_count`` (see
``tests/agents/test_dqn.py::test_vmapped_conv_is_one_grouped_convolution``).
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
from fastpbrl.agents.base import Agent, scalar_hparams, select_tree, td_target
from fastpbrl.agents.registry import register
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import Params, PRNGKey, Transition


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
  # update steps between target refreshes, a whole number >= 1 (SB3's
  # target_update_interval counts env steps: 4x this at train_freq 4)
  target_update_period: jax.Array
  # epsilon-greedy exploration rate when acting; the actor anneals it from
  # EPSILON_START down to this value (see epsilon_at)
  epsilon: jax.Array
  epsilon_decay_steps: jax.Array  # member env steps of the linear anneal
  eval_epsilon: jax.Array  # exploration rate of act(..., explore=False)


EPSILON_START = 1.0  # epsilon at a member's first env step (Nature: 1.0)

# Nature DQN's run settings on Atari (Extended Data Table 1), as the flags of
# ``fastpbrl.config.fields.RunConfig`` (``image_run_settings`` of the
# registration): ``--preset atari`` of ``fastpbrl pbt``.
NATURE_ATARI_RUN = {
    # One update step (batch 32) per 4 agent steps ("update frequency").
    'update_to_data_ratio': 0.25,
    # Uniform random actions before learning starts ("replay start size").
    'warmup_steps': 50_000,
    # Updates start at zero when the replay start ends, one per 4 agent
    # steps from there, as in Nature's loop; the run's default would count
    # the 50,000 random steps as data and take 12,500 updates at once on
    # them.
    'warmup_counts_as_data': False,
    # Transitions per member's replay. Nature keeps 1,000,000; a frame
    # transition here stores observation and next observation, 2 x 84 x 84
    # x 4 bytes = 55 KiB, so 1,000,000 would be 53 GiB per member, while
    # 100,000 is 5.3 GiB per member, 21 GiB for a population of 4.
    'replay_capacity': 100_000,
}


def default_hparams(*, frames: bool = True) -> DQNHParams:
  """Nature DQN's hyperparameters; ``frames=False`` (vector observations)
  shortens the epsilon anneal to 10,000 env steps."""
  return scalar_hparams(DQNHParams, lr=2.5e-4, discount=0.99,
                        target_update_period=2500.0, epsilon=0.1,
                        epsilon_decay_steps=1e6 if frames else 1e4,
                        eval_epsilon=0.05)


def epsilon_at(hparams: DQNHParams, env_step: jax.Array) -> jax.Array:
  """Exploration rate after ``env_step`` training env steps of a member.

  ``epsilon + (EPSILON_START - epsilon) * max(0, 1 - env_step /
  epsilon_decay_steps)``: linear from ``EPSILON_START`` at step 0 to
  ``hparams.epsilon`` at ``epsilon_decay_steps``, constant after (Mnih et al.
  2015, Extended Data Table 1). A decay of 0 steps gives ``epsilon`` at once.
  """
  step = jnp.asarray(env_step).astype(jnp.float32)
  decay = jnp.asarray(hparams.epsilon_decay_steps, jnp.float32)
  left = jnp.where(decay > 0, jnp.clip(1.0 - step / jnp.maximum(decay, 1.0),
                                       0.0, 1.0), 0.0)
  return hparams.epsilon + (EPSILON_START - hparams.epsilon) * left


def acting_hparams(hparams: DQNHParams, env_step: jax.Array) -> DQNHParams:
  """``hparams`` with ``epsilon`` at its value of the schedule after
  ``env_step`` env steps: what ``act(..., explore=True)`` uses in the actor."""
  return hparams._replace(epsilon=epsilon_at(hparams, env_step))


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
  frames = len(obs_shape) == 3
  if frames:
    if obs_shape != (84, 84, 4):
      raise ValueError(f'image observations must be 84x84x4 stacked frames '
                       f'(what fastpbrl.envs.gym.make_env gives ALE/... ids), got '
                       f'{obs_shape}')
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
    """Epsilon-greedy at ``hparams.epsilon`` (``explore``) or at
    ``hparams.eval_epsilon`` (evaluation, Nature's 0.05)."""
    greedy = jnp.argmax(net.apply(params, observation), axis=-1).astype(jnp.int32)
    epsilon = hparams.epsilon if explore else hparams.eval_epsilon
    k_coin, k_action = jax.random.split(key)
    random_action = jax.random.randint(k_action, greedy.shape, 0, num_actions)
    coin = jax.random.uniform(k_coin, greedy.shape) < epsilon
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
      default_hparams=functools.partial(default_hparams, frames=frames),
      init=init, act=act, update=update,
      policy_params=lambda state: state.params, acting_hparams=acting_hparams)


# Not in the 2022 paper (it does not tune DQN): bounds around the Nature-DQN
# defaults (RMSProp 2.5e-4, acting epsilon 0.01-0.1, gamma 0.99).
SEARCH_SPACE = {
    'lr': ss.LogUniform(1e-5, 1e-3),
    'epsilon': ss.Uniform(0.001, 0.1),
    'discount': ss.PAPER_DISCOUNT,
}

# Meaning, unit and valid range of each hyperparameter (``fastpbrl info dqn``).
DOMAINS = {
    'lr': ss.positive('RMSProp step size', 'step size'),
    'discount': ss.HParamDomain('discount gamma of the TD target',
                                'per env step', low=0.0, high=1.0),
    # SB3's target_update_interval counts env steps: with train_freq 4 and
    # one gradient step per update, SB3's 10,000 is 2,500 here.
    'target_update_period': ss.HParamDomain(
        'update steps between target-network refreshes (SB3\'s '
        'target_update_interval counts env steps: at train_freq 4, SB3\'s '
        '10,000 = 2,500 here)', 'update steps', low=1.0, integer=True),
    'epsilon': ss.HParamDomain(
        'final epsilon-greedy exploration rate when acting', 'probability',
        low=0.0, high=1.0),
    'epsilon_decay_steps': ss.non_negative(
        'member env steps of the linear anneal from 1.0 to epsilon',
        'env steps'),
    'eval_epsilon': ss.HParamDomain(
        'exploration rate of evaluation episodes', 'probability', low=0.0,
        high=1.0),
}

register('dqn', make_agent=make_agent, config=DQNConfig,
         default_search_space=SEARCH_SPACE, hidden_sizes_field='mlp_hidden_sizes',
         image_run_settings=NATURE_ATARI_RUN, hparam_domains=DOMAINS,
         example_env='CartPole-v1')
