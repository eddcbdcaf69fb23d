"""Acting in JAX environments on the device: pure functions over the
population's envs (``fastpbrl.envs.jax_envs``), what the on-device data path
scans inside the learner's compiled call.

One step of :func:`step` does, for every member ``i`` and each of its ``E``
envs, what an actor process does for one member on the host
(``fastpbrl.actors.actor``):

1. act with member ``i``'s current policy and exploration
   (``agent.act(..., explore=True)``, with ``agent.acting_hparams`` at the
   member's env step), or uniformly at random while it warms up;
2. step the env with the action scaled to the env's bounds;
3. end the episode on a termination, or as a truncation once it has
   ``max_episode_steps`` steps (gymnasium's ``TimeLimit``); the transition
   keeps the real next observation either way, and the env resets;
4. append the ``E`` transitions to the member's replay ring
   (``fastpbrl.replay.device.insert``, the same rings and order as the
   actors' inserts).

:func:`rollout_step` is the step of an agent that learns from its own
rollouts (``Agent.learns_from == 'rollout'``): 1. is ``agent.behave`` (no
warm-up), 2. and 3. are the same code (``_step_envs``), and 4. stores
nothing: the step's ``Rollout`` fields come back, for the learner to scan
into a ``[T, E]`` rollout (:func:`rollout`). Its envs have no ring
(``EnvsState.replay`` is None).

Every array is ``[N, E, ...]``; the members' keys, envs and rings are
independent, so the functions are ``vmap``-ed over members and envs and
nothing couples members. :func:`evaluate` plays whole noise-free episodes
for every member at once.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from acme import specs

from fastpbrl.core.types import Rollout
from fastpbrl.envs import params as env_params
from fastpbrl.envs.jax_envs import JaxEnv
from fastpbrl.replay import device as device_replay


class EnvsState(NamedTuple):
  """The population's envs and replay on the device (a pytree)."""

  env_state: Any  # the env's own state, [N, E, ...] on every leaf
  observation: jax.Array  # [N, E, *obs]
  episode_return: jax.Array  # [N, E] float32, of the episode under way
  episode_length: jax.Array  # [N, E] int32
  env_steps: jax.Array  # [N] int32 training env steps collected per member
  warmup_left: jax.Array  # [N] int32 random-action steps still to take
  # The members' rings; None for agents that learn from their own
  # rollouts (``rollout_step``), which store nothing.
  replay: device_replay.DeviceReplayState | None
  key: jax.Array  # PRNG key of acting, env randomness and resets


def per_member_leaves(state: EnvsState) -> EnvsState:
  """Which leaves of ``state`` have the population axis (a tree of bools,
  for ``fastpbrl.devices.sharding``): all but the key and a shared ring."""
  flags = jax.tree.map(lambda _: True, state)
  if state.replay is None:  # a rollout agent's envs: no ring
    return flags._replace(key=False)
  per_member_replay = state.replay.size.ndim == 1
  return flags._replace(key=False, replay=jax.tree.map(
      lambda _: per_member_replay, state.replay))


class Episodes(NamedTuple):
  """What one :func:`step` tells about episodes, ``[N, E]`` each."""

  done: jax.Array  # bool: an episode ended at this step
  episode_return: jax.Array  # float32: its return (where done)
  episode_length: jax.Array  # int32: its length (where done)
  # float32: the env's ``objective`` of it (where done); NaN for an env
  # that reports none
  true_objective: jax.Array


def split_grid(key: jax.Array, shape: tuple[int, int]) -> jax.Array:
  """``shape`` independent keys (``[n, e]`` of keys)."""
  keys = jax.random.split(key, shape[0] * shape[1])
  return keys.reshape(shape + keys.shape[1:])


def _reset_many(env: JaxEnv, key: jax.Array, shape: tuple[int, int]):
  return jax.vmap(jax.vmap(env.reset))(split_grid(key, shape))


def init(env: JaxEnv, num_members: int, envs_per_member: int,
         replay: device_replay.DeviceReplayState | None,
         warmup_steps: jax.Array, key: jax.Array) -> EnvsState:
  """Fresh episodes in ``num_members x envs_per_member`` envs; each member
  starts with ``warmup_steps`` (``[N]`` or a scalar) random-action steps.
  ``replay`` None: the envs of a rollout agent (no ring, no warm-up:
  ``warmup_steps`` 0)."""
  key, reset_key = jax.random.split(key)
  shape = (num_members, envs_per_member)
  env_state, obs = _reset_many(env, reset_key, shape)
  return EnvsState(
      env_state=env_state, observation=obs,
      episode_return=jnp.zeros(shape, jnp.float32),
      episode_length=jnp.zeros(shape, jnp.int32),
      env_steps=jnp.zeros((num_members,), jnp.int32),
      warmup_left=jnp.broadcast_to(jnp.asarray(warmup_steps, jnp.int32),
                                   (num_members,)),
      replay=replay, key=key)


def scale_actions(actions: jax.Array, spec: specs.Array) -> jax.Array:
  """Agents' actions in the env's units: ``[-1, 1]`` mapped to the bounds
  of a continuous spec (as ``fastpbrl.core.types.scale_action``), discrete ones
  unchanged."""
  if isinstance(spec, specs.DiscreteArray):
    return actions
  low, high = jnp.asarray(spec.minimum), jnp.asarray(spec.maximum)
  return low + (jnp.clip(actions, -1.0, 1.0) + 1.0) * 0.5 * (high - low)


def _random_actions(key: jax.Array, spec: specs.Array, num: int) -> jax.Array:
  """Warm-up actions: uniform over the discrete actions, or over ``[-1,
  1]`` (normalised units), as the actors draw them."""
  if isinstance(spec, specs.DiscreteArray):
    return jax.random.randint(key, (num,), 0, spec.num_values, jnp.int32)
  return jax.random.uniform(key, (num, *spec.shape), jnp.float32, -1.0, 1.0)


def _member_actions(agent, params, hparams, observation, env_steps,
                    warmup_left, key) -> jax.Array:
  """One member's ``[E]`` actions (normalised): its exploring policy, or
  random ones while it warms up."""
  policy_key, random_key = jax.random.split(key)
  if agent.acting_hparams is not None:
    hparams = agent.acting_hparams(hparams, env_steps)
  acted = agent.act(params, observation, policy_key, hparams, True)
  spec = agent.env_spec.actions
  random = _random_actions(random_key, spec, observation.shape[0])
  return jnp.where(warmup_left > 0, random.astype(acted.dtype), acted)


def member_params(env: JaxEnv, hparams) -> dict:
  """``{name: [N] values}`` of the env's parameters in the members'
  ``hparams`` (``fastpbrl.envs.params``); ``{}`` for an env without."""
  return env_params.values_of(hparams, [n for n, _ in env.env_params])


def with_member_params(env: JaxEnv, env_state, values: dict):
  """``env_state`` (``[N, E, ...]``) acting with member ``i``'s ``values``
  in each of its ``E`` envs (``env.with_params``); as it was for an env
  without parameters."""
  if not values:
    return env_state
  return jax.vmap(jax.vmap(env.with_params, in_axes=(0, None)))(
      env_state, values)


def objectives(env: JaxEnv, env_state, like: jax.Array) -> jax.Array:
  """``env.objective`` of every env (``[N, E]``), NaN where the env has
  none."""
  if env.objective is None:
    return jnp.full(like.shape, jnp.nan, jnp.float32)
  return jax.vmap(jax.vmap(env.objective))(env_state).astype(jnp.float32)


def _step_envs(env: JaxEnv, spec: specs.Array, state: EnvsState,
               actions: jax.Array, keys: jax.Array, values: dict):
  """Steps every env with the members' ``[N, E]`` (normalised) ``actions``
  and keeps the episodes going: what :func:`step` and
  :func:`rollout_step` share.

  Args:
    spec: the agent's action spec (``scale_actions``).
    keys: ``(next key, env step key, reset key)``, split from ``state.key``.
    values: the members' env parameters (``member_params``).

  Returns:
    ``(state, transitions, episodes)``: the envs after the step (the
    episodes that ended reset, ``env_steps`` counted, the key advanced;
    ``warmup_left`` and ``replay`` as they were), the step's transitions
    (``Transition`` fields, ``[N, E, ...]``, ``next_observation`` the real
    next state), and the :class:`Episodes` of the step.
  """
  n, e = state.episode_length.shape
  key, step_key, reset_key = keys
  env_state, next_obs, reward, terminated = jax.vmap(jax.vmap(env.step))(
      with_member_params(env, state.env_state, values),
      scale_actions(actions, spec), split_grid(step_key, (n, e)))
  objective = objectives(env, env_state, reward)
  length = state.episode_length + 1
  episode_return = state.episode_return + reward
  truncated = (length >= env.max_episode_steps) & ~terminated
  done = terminated | truncated
  transitions = {
      'observation': state.observation, 'action': actions, 'reward': reward,
      'next_observation': next_obs,
      'terminated': terminated.astype(jnp.float32),
      'truncated': truncated.astype(jnp.float32)}
  fresh_state, fresh_obs = _reset_many(env, reset_key, (n, e))
  pick = lambda fresh, old: jnp.where(
      done.reshape(done.shape + (1,) * (old.ndim - 2)), fresh, old)
  new = state._replace(
      env_state=jax.tree.map(pick, fresh_state, env_state),
      observation=pick(fresh_obs, next_obs),
      episode_return=jnp.where(done, 0.0, episode_return),
      episode_length=jnp.where(done, 0, length),
      env_steps=state.env_steps + e, key=key)
  return new, transitions, Episodes(done, episode_return, length, objective)


def step(env: JaxEnv, agent, policy_params, hparams,
         state: EnvsState) -> tuple[EnvsState, Episodes]:
  """One action in every env of every member, its transitions appended to
  the members' rings (see the module docstring).

  Args:
    policy_params: ``[N]`` members' policies (``agent.policy_params``).
    hparams: ``[N]`` hyperparameters ``agent.act`` reads.
  """
  n, e = state.episode_length.shape
  key, act_key, step_key, reset_key = jax.random.split(state.key, 4)
  actions = jax.vmap(_member_actions, in_axes=(None, 0, 0, 0, 0, 0, 0))(
      agent, policy_params, hparams, state.observation, state.env_steps,
      state.warmup_left, jax.random.split(act_key, n))
  new, transitions, episodes = _step_envs(
      env, agent.env_spec.actions, state, actions, (key, step_key, reset_key),
      member_params(env, hparams))
  replay = device_replay.insert_every_member(state.replay, transitions, e)
  return new._replace(warmup_left=jnp.maximum(state.warmup_left - e, 0),
                      replay=replay), episodes


def rollout_step(env: JaxEnv, agent, policy_params, hparams,
                 state: EnvsState) -> tuple[EnvsState, Rollout, Episodes]:
  """One action in every env of every member for an agent that learns
  from its own rollouts: each member ``behave`` s (its exploring policy,
  with the log-probability of what it sampled; no warm-up of random
  actions, and ``agent.acting_hparams`` is not applied: ``behave`` reads
  ``hparams`` as they are), the envs step with the actions clipped and
  scaled (``scale_actions``), and the episodes go on as in :func:`step`.
  Nothing is stored: the step's ``Rollout`` fields come back.

  Args:
    policy_params: ``[N]`` members' policies (``agent.policy_params``).
    hparams: ``[N]`` hyperparameters ``agent.behave`` reads.

  Returns:
    ``(state, rollout, episodes)``: ``rollout`` a ``Rollout`` of ``[N,
    E, ...]`` (``action`` as sampled, not clipped), ``episodes`` ``[N, E]``.
  """
  n = state.episode_length.shape[0]
  key, act_key, step_key, reset_key = jax.random.split(state.key, 4)
  actions, log_prob = jax.vmap(agent.behave)(
      policy_params, state.observation, jax.random.split(act_key, n), hparams)
  new, transitions, episodes = _step_envs(
      env, agent.env_spec.actions, state, actions, (key, step_key, reset_key),
      member_params(env, hparams))
  return new, Rollout(**transitions, log_prob=log_prob), episodes


def rollout(env: JaxEnv, agent, policy_params, hparams, state: EnvsState,
            rollout_length: int) -> tuple[EnvsState, tuple[Rollout, Episodes]]:
  """``rollout_length`` :func:`rollout_step` s with fixed policies: the
  ``Rollout`` and ``Episodes`` come back time first, ``[T, N, E, ...]``."""
  def one(s, _):
    s, steps, episodes = rollout_step(env, agent, policy_params, hparams, s)
    return s, (steps, episodes)

  return jax.lax.scan(one, state, None, length=rollout_length)


def run(env: JaxEnv, agent, policy_params, hparams, state: EnvsState,
        num_steps: int) -> tuple[EnvsState, Episodes]:
  """``num_steps`` :func:`step` s with fixed policies; ``Episodes`` come
  back ``[num_steps, N, E]``."""
  return jax.lax.scan(
      lambda s, _: step(env, agent, policy_params, hparams, s), state, None,
      length=num_steps)


def restart(env: JaxEnv, state: EnvsState, members: jax.Array,
            warmup_steps: jax.Array) -> EnvsState:
  """Members flagged in ``members`` (``[N]`` bool) start over as new
  experiments (HyperTrick's restarted slots): new episodes, an empty ring
  (if they have one), and ``warmup_steps`` random-action steps."""
  n, e = state.episode_length.shape
  key, reset_key = jax.random.split(state.key)
  fresh_state, fresh_obs = _reset_many(env, reset_key, (n, e))
  pick = lambda fresh, old: jnp.where(
      members.reshape((n,) + (1,) * (old.ndim - 1)), fresh, old)
  return state._replace(
      env_state=jax.tree.map(pick, fresh_state, state.env_state),
      observation=pick(fresh_obs, state.observation),
      episode_return=pick(jnp.zeros_like(state.episode_return),
                          state.episode_return),
      episode_length=pick(jnp.zeros_like(state.episode_length),
                          state.episode_length),
      warmup_left=jnp.where(members, jnp.asarray(warmup_steps, jnp.int32),
                            state.warmup_left),
      replay=(None if state.replay is None
              else device_replay.clear(state.replay, members)), key=key)


def evaluate(env: JaxEnv, agent, policy_params, hparams, key: jax.Array,
             episodes: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """``episodes`` noise-free episodes of every member (``act(...,
  explore=False)``), each played to its end or its time limit, in envs
  acting with the member's env parameters.

  Returns:
    ``(returns, lengths, objectives)``, ``[N, episodes]`` each; the
    objectives are the env's ``objective`` of each episode (NaN for an env
    without one).
  """
  n = jax.tree.leaves(hparams)[0].shape[0]
  key, reset_key = jax.random.split(key)
  env_state, obs = _reset_many(env, reset_key, (n, episodes))
  values = member_params(env, hparams)

  def member_actions(params, member_hparams, observation, member_key):
    return agent.act(params, observation, member_key, member_hparams, False)

  def one_step(carry, step_key):
    env_state, obs, returns, lengths, objective, running = carry
    act_key, env_key = jax.random.split(step_key)
    actions = jax.vmap(member_actions)(policy_params, hparams, obs,
                                       jax.random.split(act_key, n))
    env_state, obs, reward, terminated = jax.vmap(jax.vmap(env.step))(
        with_member_params(env, env_state, values),
        scale_actions(actions, agent.env_spec.actions),
        split_grid(env_key, (n, episodes)))
    returns = returns + jnp.where(running, reward, 0.0)
    objective = jnp.where(running, objectives(env, env_state, reward),
                          objective)
    lengths = lengths + running.astype(jnp.int32)
    running = running & ~terminated & (lengths < env.max_episode_steps)
    return (env_state, obs, returns, lengths, objective, running), None

  shape = (n, episodes)
  carry = (env_state, obs, jnp.zeros(shape, jnp.float32),
           jnp.zeros(shape, jnp.int32), jnp.zeros(shape, jnp.float32),
           jnp.ones(shape, bool))
  (_, _, returns, lengths, objective, _), _ = jax.lax.scan(
      one_step, carry, jax.random.split(key, env.max_episode_steps))
  return returns, lengths, objective


def random_states(env: JaxEnv, key: jax.Array,
                  num_states: int) -> jax.Array:
  """``[num_states, *obs]`` float32 observations of one env, visited by
  uniformly random actions (``_random_actions``, in the env's units) from
  a reset, each episode reset again at its end or its time limit; keys
  split from ``key``."""
  reset_key, key = jax.random.split(key)
  env_state, obs = env.reset(reset_key)
  spec = env.env_spec.actions

  def one_step(carry, step_key):
    env_state, obs, length = carry
    act_key, env_key, new_key = jax.random.split(step_key, 3)
    action = scale_actions(_random_actions(act_key, spec, 1)[0], spec)
    next_state, next_obs, _, terminated = env.step(env_state, action,
                                                   env_key)
    length = length + 1
    done = terminated | (length >= env.max_episode_steps)
    fresh_state, fresh_obs = env.reset(new_key)
    pick = lambda fresh, old: jnp.where(done, fresh, old)
    carry = (jax.tree.map(pick, fresh_state, next_state),
             pick(fresh_obs, next_obs), jnp.where(done, 0, length))
    return carry, obs.astype(jnp.float32)

  _, states = jax.lax.scan(one_step, (env_state, obs, jnp.int32(0)),
                           jax.random.split(key, num_states))
  return states


class Plan(NamedTuple):
  """How one learner call splits into groups (see the module docstring)."""

  groups: int  # G
  env_steps: int  # K: batched env steps per group
  updates: int  # U: update steps per group

  @classmethod
  def of(cls, num_steps: int, update_to_data_ratio: float,
         envs_per_member: int, interleave: int = 1) -> 'Plan':
    """The plan for ``num_steps`` updates per call at the ratio: the env
    steps per member the call needs, in batches of ``envs_per_member``,
    in ``interleave`` groups, each followed by its share of the updates.

    Raises:
      ValueError: ``interleave`` does not divide both the env-step batches
        and the updates of a call (the message names ``--interleave`` and
        the values that fit).
    """
    needed = math.ceil(num_steps / update_to_data_ratio)
    batches = math.ceil(needed / envs_per_member)
    most = math.gcd(batches, num_steps)
    if interleave < 1 or most % interleave:
      fits = [k for k in range(1, most + 1) if most % k == 0]
      raise ValueError(
          f'--interleave {interleave}: a learner call of {num_steps} update '
          f'steps and {batches} env-step batches splits into '
          f'{", ".join(map(str, fits))} groups')
    return cls(interleave, batches // interleave, num_steps // interleave)

  def env_steps_per_call(self, envs_per_member: int) -> int:
    return self.groups * self.env_steps * envs_per_member
