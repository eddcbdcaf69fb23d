"""The population learner: every member's update steps as one compiled call.

``PopulationLearner`` stacks ``N`` members on a leading axis and compiles
``jit(vmap(scan(agent.update, num_steps)))`` once per (population size,
shapes). ``SharedCriticLearner`` does the same for the shared-critic mode of
CEM-RL and DvD, where the population update is not a vmap of a per-member one.

Batches are shaped ``[N, num_steps, batch_size, ...]``; metrics come back
``[N, num_steps]`` as device arrays, so nothing inside a call waits for the
host. ``PopulationLearner`` also returns ``metrics['finite']`` (``[N]``
bool): False for a member whose loss or parameters became NaN or infinite
in the call, which then keeps its state from before the call. The state argument is donated: after ``update`` the old state's buffers
are invalid, use the returned one.

``update_from_replay`` runs the same step with the batch sampled inside the
compiled call from a device replay (``fastpbrl.replay.device``), so the call
takes no batch from the host. ``update_with_envs`` goes one step further for
environments written in JAX (``fastpbrl.envs.jax_envs``): the members act in
their envs, the envs step, the transitions go into the device replay and
the members update, all inside one compiled call (``compile_with_envs``).
``update_with_rollouts`` is its counterpart for agents that learn from
their own rollouts: each iteration of the call collects a ``[T, E]``
rollout with the members' current policies and runs ``agent.update`` on it
(``compile_with_rollouts``); there is no replay.

The jit boundary is here and only here: agents never call ``jax.jit``.

Both learners take an optional ``mesh`` (``fastpbrl.devices.sharding``): the
population axis is then split over its devices, one program partitioned by
XLA, every output pinned to that layout (see ``_CompiledPopulationStep``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from fastpbrl.agents.base import (POPULATION_AXIS, Agent, SharedCritic,
                                  rollout_steps, stack_hparams,
                                  steps_per_update)
from fastpbrl.core.types import PRNGKey, ReplaySample, Transition
from fastpbrl.devices import sharding
from fastpbrl.learner import collect
from fastpbrl.replay import device as device_replay


def multi_step(update: Callable, num_steps: int) -> Callable:
  """``update(state, hparams, batch[B])`` scanned over ``batch[num_steps, B]``."""

  def run(state, hparams, batch: Transition):
    leading = {x.shape[0] for x in jax.tree.leaves(batch)}
    if leading != {num_steps}:
      raise ValueError(
          f'batch has leading step axes {sorted(leading)}, expected '
          f'{num_steps} (num_steps): batches are [N, num_steps, batch, ...]')
    return jax.lax.scan(lambda s, b: update(s, hparams, b), state, batch)

  return run


def _population_size(tree: Any, what: str) -> int:
  sizes = {x.shape[0] if x.ndim else None for x in jax.tree.leaves(tree)}
  if len(sizes) != 1 or None in sizes:
    raise ValueError(
        f'{what} must have one leading population axis on every leaf; got '
        f'leading sizes {sorted(s for s in sizes if s is not None)}'
        + (' and scalars' if None in sizes else ''))
  return sizes.pop()


class _CompiledPopulationStep:
  """Host-side wrapper (not jittable) around one jitted population step.

  Counts how many times the step was traced, so tests and users can check
  that changing hyperparameters never recompiles.

  With a ``mesh`` (``fastpbrl.devices.sharding``) the population axis is split over
  its devices: ``update`` places its arguments that way (a no-op for those
  already placed so) and the step's outputs are pinned to the same
  shardings, so the donated state stays sharded call after call and XLA
  partitions the one program (GSPMD). ``mesh=None``: one device, the
  program of an unsharded learner.
  """

  def __init__(self, step: Callable, num_steps: int, mesh=None,
               batch_size: int | None = None):
    self.num_steps = num_steps
    self.batch_size = batch_size
    self.compilations = 0
    self.mesh = mesh

    def traced(state, hparams, batch):
      self.compilations += 1  # runs once per trace, never at run time
      return self._pinned(step(state, hparams, batch), hparams)

    self._step = jax.jit(traced, donate_argnums=0)
    self._inner_step = step

  def _pinned(self, out, hparams):
    """Inside a jitted step: ``(state, metrics)`` pinned to the mesh."""
    if self.mesh is None:
      return out
    new_state, metrics = out
    n = _population_size(hparams, 'hparams')
    return (self._constrain_state(new_state, hparams),
            sharding.constrain(metrics, self.mesh, n))

  def _compile_from_replay(self, step_input: Callable) -> None:
    """Jits ``step(state, hparams, step_input(replay_state, key, extra,
    n))``: the same inner step as ``update``, its input sampled inside the
    program. ``replay_state`` is not donated. Traces count in
    ``compilations`` too."""

    def traced(state, hparams, replay_state, key, extra):
      self.compilations += 1  # runs once per trace, never at run time
      n = _population_size(hparams, 'hparams')
      return self._pinned(self._inner_step(
          state, hparams, step_input(replay_state, key, extra, n)), hparams)

    self._step_from_replay = jax.jit(traced, donate_argnums=0)

  def compile_with_envs(self, agent: Agent, env, groups: int,
                        env_steps: int, updates: int) -> None:
    """Jits one learner call that also collects its data: ``groups`` times,
    every member acts for ``env_steps`` steps in each of its envs with its
    current policy (``fastpbrl.learner.collect.run``), then takes ``updates``
    update steps on batches sampled from its ring. Run it with
    :meth:`update_with_envs`; traces count in ``compilations``."""
    inner = self._step_of(updates)
    batch_size = self.batch_size

    def group(state, hparams, actor_hparams, active, envs):
      n = _population_size(hparams, 'hparams')
      envs, episodes = collect.run(env, agent, self._policy_fn(state),
                                   actor_hparams, envs, env_steps)
      key, sample_key = jax.random.split(envs.key)
      envs = envs._replace(key=key)
      batch = device_replay.sample(envs.replay, sample_key, updates,
                                   batch_size, num_members=n)
      state, metrics = inner(state, hparams, self._step_input(batch, active))
      return state, envs, episodes, metrics

    self._step_with_envs = self._fused(group, groups)

  def _fused(self, part: Callable, repeats: int) -> Callable:
    """The jitted call of ``part(state, hparams, actor_hparams, active,
    envs) -> (state, envs, episodes, metrics)`` scanned ``repeats`` times:
    metrics ``[N, repeats x steps]`` (``finite``: ``[N]``, over all),
    episodes ``[repeats, steps, N, E]``, the state and envs pinned to the
    mesh. State and envs are donated."""

    def traced(state, hparams, actor_hparams, envs, active):
      self.compilations += 1  # runs once per trace, never at run time
      n = _population_size(hparams, 'hparams')

      def one(carry, _):
        state, envs = carry
        state, envs, episodes, metrics = part(state, hparams, actor_hparams,
                                              active, envs)
        return (state, envs), (episodes, metrics)

      (state, envs), (episodes, metrics) = jax.lax.scan(
          one, (state, envs), None, length=repeats)
      metrics = {k: (v.all(axis=0) if k == 'finite' else
                     jnp.swapaxes(v, 0, 1).reshape(n, -1))
                 for k, v in metrics.items()}
      if self.mesh is not None:
        envs = sharding.constrain(envs, self.mesh, n,
                                  collect.per_member_leaves(envs))
      return self._pinned((state, metrics), hparams), envs, episodes

    return jax.jit(traced, donate_argnums=(0, 3))

  def update_with_envs(self, state, hparams, actor_hparams, envs, active=None):
    """Runs the :meth:`compile_with_envs` call.

    Args:
      state: the stacked training state (donated).
      hparams: the stacked hyperparameters.
      actor_hparams: ``[N]`` what the members act with
        (``Rule.actor_hparams``).
      envs: the ``fastpbrl.learner.collect.EnvsState`` (donated).
      active: ``[N]`` bool, members whose updates are kept (default all;
        ignored by the shared-critic learner, which has no such mask).

    Returns:
      ``((state, metrics), envs, episodes)``: metrics ``[N, groups *
      updates]``, episodes ``fastpbrl.learner.collect.Episodes`` of ``[groups,
      env_steps, N, E]``.
    """
    return self._call_fused(self._step_with_envs, state, hparams,
                            actor_hparams, envs, active)

  def _call_fused(self, call, state, hparams, actor_hparams, envs, active):
    """``call`` (a :meth:`_fused` program) with its arguments placed on
    the mesh."""
    n = _population_size(hparams, 'hparams')
    active = (jnp.ones((n,), bool) if active is None
              else jnp.asarray(active, bool))
    state, hparams, _ = self.shard(state, hparams)
    if self.mesh is not None:
      envs = sharding.shard_population(envs, self.mesh, n,
                                       collect.per_member_leaves(envs))
    return call(state, hparams, actor_hparams, envs, active)

  def _step_of(self, num_steps: int) -> Callable:
    """The unjitted step of ``num_steps`` updates (what ``update`` runs at
    ``self.num_steps``)."""
    raise NotImplementedError

  def _step_input(self, batch, active):
    """The inner step's input for a sampled ``batch``."""
    del active
    return batch

  def _shard_replay(self, state, hparams, replay_state, key):
    """``update_from_replay``'s arguments placed on the mesh: a per-member
    replay's rings split with their members, a shared ring and the key
    replicated."""
    state, hparams, _ = self.shard(state, hparams)
    if self.mesh is not None:
      key = jax.device_put(key, sharding.replicated(self.mesh))
      n = _population_size(hparams, 'hparams')
      per_member = replay_state.size.ndim == 1
      replay_state = sharding.shard_population(
          replay_state, self.mesh, n,
          jax.tree.map(lambda _: per_member, replay_state))
    return state, hparams, replay_state, key

  def _call_from_replay(self, state, hparams, replay_state, key, extra):
    """Checks, places on the mesh and runs the ``_compile_from_replay``
    program."""
    self._check_replay_args(replay_state)
    n = _population_size(hparams, 'hparams')
    if replay_state.size.ndim == 1 and replay_state.size.shape != (n,):
      raise ValueError(f'replay_state has {replay_state.size.shape[0]} '
                       f'member rings but hparams {n} members')
    state, hparams, replay_state, key = self._shard_replay(
        state, hparams, replay_state, key)
    return self._step_from_replay(state, hparams, replay_state, key, extra)

  def _check_replay_args(self, replay_state) -> None:
    if self.batch_size is None:
      raise ValueError('update_from_replay needs the learner built with '
                       'batch_size=...')
    if not hasattr(replay_state, 'size') or not hasattr(replay_state, 'data'):
      raise ValueError('replay_state must be a fastpbrl.replay.device.'
                       f'DeviceReplayState; got {type(replay_state).__name__}')

  def _state_per_member(self, hparams) -> Any:
    """Which state leaves have a population axis (a tree of bools), or
    None: every leaf whose leading size is the population's."""
    del hparams
    return None

  def _constrain_state(self, state, hparams) -> Any:
    """Inside a jitted function: ``state`` pinned to the mesh's layout."""
    if self.mesh is None:
      return state
    return sharding.constrain(state, self.mesh,
                              _population_size(hparams, 'hparams'),
                              self._state_per_member(hparams))

  def shard(self, state, hparams, batch=None):
    """Host-side: ``(state, hparams, batch)`` placed on the mesh (the
    population axis split over its devices, the rest replicated); leaves
    already placed so are not copied. Unchanged without a mesh."""
    if self.mesh is None:
      return state, hparams, batch
    n = _population_size(hparams, 'hparams')
    state = sharding.shard_population(state, self.mesh, n,
                                      self._state_per_member(hparams))
    hparams = sharding.shard_population(hparams, self.mesh, n)
    if batch is not None:
      batch = sharding.shard_population(batch, self.mesh, n)
    return state, hparams, batch

  def update(self, state, hparams, batch: Transition):
    """Runs ``num_steps`` update steps for every member.

    Args:
      state: the stacked training state (donated: do not reuse it).
      hparams: the stacked hyperparameters, leading axis ``N``.
      batch: a ``Transition`` of ``[N, num_steps, batch_size, ...]`` arrays,
        or a ``ReplaySample`` (a device replay and a key: the batch is
        sampled inside the call, ``update_from_replay``).

    Returns:
      ``(new_state, metrics)`` with metrics ``[N, num_steps]`` device arrays.
    """
    if isinstance(batch, ReplaySample):  # the replay lives on the device
      return self.update_from_replay(state, hparams, batch.replay, batch.key)
    n = _population_size(hparams, 'hparams')
    n_batch = _population_size(batch, 'batch')
    if n_batch != n:
      raise ValueError(f'batch has population axis {n_batch} but hparams {n}')
    state, hparams, batch = self.shard(state, hparams, batch)
    return self._step(state, hparams, batch)


# Members' initial states are built one member after another (a scan): on
# the CPU, XLA's concurrency-optimized scheduler deadlocks, every thread
# idle, running a population's vmapped init that holds several batched
# orthogonal initialisers (QRs; PPO's networks at 65 or more members on 2
# cores, jaxlib 0.10.2), and chunks of 64 members did not avoid it in
# every program. Initialising is once per member and cheap; each member's
# values are those of its own init.


def init_members(init: Callable, keys: jax.Array, hparams: Any) -> Any:
  """``vmap(init)(keys, hparams)``, computed one member at a time
  (jittable)."""
  return jax.lax.map(lambda args: init(*args), (keys, hparams))


class PopulationLearner(_CompiledPopulationStep):
  """``N`` independent members of one agent, updated as one program."""

  def __init__(self, agent: Agent, num_steps: int | None = None,
               batch_size: int | None = None, *, mesh=None):
    """Args:
      agent: the agent whose ``update`` every member runs.
      num_steps: update steps per call; the agent config's
        ``steps_per_call`` by default (50 for TD3/SAC, 10 for DQN).
      batch_size: transitions per member per step that
        ``update_from_replay`` samples; the agent config's ``batch_size``
        by default.
      mesh: a ``fastpbrl.devices.sharding.make_mesh`` mesh to split the population
        over (``init``, ``update``, ``policy_params`` and
        ``reinit_members`` then return population-sharded arrays); None:
        one device.
    """
    self.agent = agent
    num_steps = num_steps or agent.config.steps_per_call
    batch_size = batch_size or getattr(agent.config, 'batch_size', None)
    if num_steps < 1:
      raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    self._policy_fn = jax.vmap(agent.policy_params)
    super().__init__(self._step_of(num_steps), num_steps, mesh, batch_size)
    self._compile_from_replay(
        lambda replay_state, key, active, n: (device_replay.sample(
            replay_state, key, num_steps, self.batch_size, ~active,
            num_members=n), active))
    if mesh is None:
      self._init = jax.jit(lambda keys, hparams: init_members(
          agent.init, keys, hparams))
      self._policy_params = jax.jit(jax.vmap(agent.policy_params))
    else:  # every output leaf is per member: pin it to the mesh
      self._init = jax.jit(lambda keys, hparams: sharding.constrain(
          init_members(agent.init, keys, hparams), mesh))
      self._policy_params = jax.jit(lambda state: sharding.constrain(
          jax.vmap(agent.policy_params)(state), mesh))
    self._reinit = jax.jit(
        lambda key, state, hparams, rows: self._constrain_state(
            select_members(rows, init_members(
                agent.init, jax.random.split(key, rows.shape[0]), hparams),
                state),
            hparams))

  def _step_of(self, num_steps: int) -> Callable:
    population_step = jax.vmap(
        multi_step(self.agent.update, self.iterations(num_steps)),
        axis_name=POPULATION_AXIS)

    def masked_step(state, hparams, batch_and_active):
      # Members flagged inactive (a restarted experiment still warming up)
      # keep their state: their update on this batch is discarded. So does
      # a member whose loss or parameters became NaN or infinite during the
      # call (metrics['finite'] is False for it): the host then resets or
      # replaces it (``fastpbrl.run.main``), and no NaN parameters ever reach
      # the actors.
      batch, active = batch_and_active
      new_state, metrics = population_step(state, hparams, batch)
      finite = member_finite(new_state) & member_finite(metrics)
      keep = active & finite
      new_state = select_members(keep, new_state, state)
      return new_state, {**metrics, 'finite': finite}

    return masked_step

  def _step_input(self, batch, active):
    return batch, active

  def iterations(self, num_steps: int) -> int:
    """What one call of ``num_steps`` update steps scans ``agent.update``
    over: ``num_steps`` gradient steps of a replay agent, or the
    ``num_steps / (rollout_length x num_envs)`` iterations of a rollout
    agent, whose update steps are the env steps it learns from
    (``fastpbrl.agents.base``)."""
    per_iteration = steps_per_update(self.agent)
    if num_steps % per_iteration:
      raise ValueError(f'num_steps {num_steps} is not a multiple of an '
                       f'iteration\'s {per_iteration} env steps')
    return num_steps // per_iteration

  def compile_with_rollouts(self, agent: Agent, env, iterations: int) -> None:
    """Jits one learner call of an agent that learns from its own rollouts
    (``agent.learns_from == 'rollout'``): ``iterations`` times, every
    member acts ``T = rollout_length`` steps in each of its ``E =
    num_envs`` envs with its current policy (``fastpbrl.learner.collect.rollout``:
    the policy that learns is the one that acted), then runs one
    iteration of ``agent.update`` on that ``[T, E]`` rollout (members not
    ``active``, or whose update is not finite, keep their state). Only the
    episode statistics leave the device. Run it with
    :meth:`update_with_rollouts`; traces count in ``compilations``."""
    length = int(agent.config.rollout_length)
    inner = self._step_of(rollout_steps(agent.config))

    def iteration(state, hparams, actor_hparams, active, envs):
      envs, (steps, episodes) = collect.rollout(
          env, agent, self._policy_fn(state), actor_hparams, envs, length)
      # [T, N, E, ...] -> [N, 1, T, E, ...]: one iteration per member.
      steps = jax.tree.map(lambda x: jnp.moveaxis(x, 1, 0)[:, None], steps)
      state, metrics = inner(state, hparams, self._step_input(steps, active))
      return state, envs, episodes, metrics

    self._step_with_rollouts = self._fused(iteration, iterations)

  def update_with_rollouts(self, state, hparams, actor_hparams, envs,
                           active=None):
    """Runs the :meth:`compile_with_rollouts` call; arguments as
    :meth:`update_with_envs`'s (``actor_hparams``: what ``behave`` reads;
    ``envs`` hold no replay).

    Returns:
      ``((state, metrics), envs, episodes)``: metrics ``[N, iterations]``
      (``finite``: ``[N]``), episodes ``fastpbrl.learner.collect.Episodes`` of
      ``[iterations, T, N, E]``.
    """
    return self._call_fused(self._step_with_rollouts, state, hparams,
                            actor_hparams, envs, active)

  def update(self, state, hparams, batch: Transition, active=None):
    """As ``_CompiledPopulationStep.update``; ``active`` (``[N]`` bool,
    default all) marks the members whose update is kept, the others keep
    their state. Traced, so any mask runs the same compiled program. A
    rollout agent's ``batch`` is a ``fastpbrl.core.types.Rollout`` of ``[N, I,
    T, E, ...]`` (``I = iterations(num_steps)``)."""
    if isinstance(batch, ReplaySample):  # the replay lives on the device
      return self.update_from_replay(state, hparams, batch.replay, batch.key,
                                     active)
    active = self._active(_population_size(hparams, 'hparams'), active)
    return super().update(state, hparams, (batch, active))

  def update_from_replay(self, state, hparams, replay_state, key: PRNGKey,
                         active=None):
    """As :meth:`update`, the ``[N, num_steps, batch_size]`` batch sampled
    inside the same compiled program from a device replay
    (``fastpbrl.replay.device.sample``; members not ``active`` are sampled
    as inactive and keep their state). ``state`` is donated,
    ``replay_state`` is not. ``key`` is the sampling key: a new one every
    call."""
    active = self._active(_population_size(hparams, 'hparams'), active)
    return self._call_from_replay(state, hparams, replay_state, key, active)

  @staticmethod
  def _active(n: int, active) -> jax.Array:
    active = (jnp.ones((n,), bool) if active is None
              else jnp.asarray(active, bool))
    if active.shape != (n,):
      raise ValueError(f'active must be [{n}] bools, got shape {active.shape}')
    return active

  def init(self, key: PRNGKey, hparams) -> Any:
    """A fresh population, one member per row of ``hparams``."""
    n = _population_size(hparams, 'hparams')
    return self._init(jax.random.split(key, n), hparams)

  def policy_params(self, state) -> Any:
    """The members' policies, as new arrays (jitted): they stay valid after
    ``state`` is donated to the next ``update``."""
    return self._policy_params(state)

  def reinit_members(self, key: PRNGKey, state, hparams, rows) -> Any:
    """``state`` with the members flagged in ``rows`` (``[N]`` bool)
    freshly initialised (new parameters and optimizer states), the others
    unchanged."""
    return self._reinit(key, state, hparams, jnp.asarray(rows, bool))


class SharedCriticLearner(_CompiledPopulationStep):
  """CEM-RL / DvD population: per-member policies and one shared critic."""

  def __init__(self, shared: SharedCritic, num_steps: int,
               batch_size: int | None = None, *, mesh=None):
    """Args:
      shared: the population update (``Agent.shared_critic``, or a rule's
        wrapping of it).
      num_steps: update steps per call.
      batch_size: transitions per member per step that
        ``update_from_replay`` samples (needed only for it).
      mesh: as ``PopulationLearner``'s: the per-member leaves (policies,
        their targets and optimizer states, keys) are split over it, the
        shared critic and the step counter replicated; the critic loss's
        mean over members then becomes a cross-device reduction that XLA
        inserts.
    """
    if num_steps < 1:
      raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    self.shared = shared
    self._policy_fn = shared.policy_params
    super().__init__(self._step_of(num_steps), num_steps, mesh, batch_size)
    self._compile_from_replay(
        lambda replay_state, key, _, n: device_replay.sample(
            replay_state, key, num_steps, self.batch_size, num_members=n))
    self._per_member = {}  # population size -> tree of bools
    if mesh is None:
      self._init = jax.jit(shared.init)
      self._policy_params = jax.jit(shared.policy_params)
    else:
      self._init = jax.jit(lambda key, hparams: self._constrain_state(
          shared.init(key, hparams), hparams))
      self._policy_params = jax.jit(lambda state: sharding.constrain(
          shared.policy_params(state), mesh))

  def _step_of(self, num_steps: int) -> Callable:
    shared = self.shared

    def step(state, hparams, batch):
      # The scan runs over steps, so put the step axis first: [S, N, B, ...].
      per_step = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), batch)
      state, metrics = multi_step(shared.update, num_steps)(
          state, hparams, per_step)
      return state, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), metrics)

    return step

  def _state_per_member(self, hparams) -> Any:
    # A leaf is per member if its leading size follows the population's:
    # the state's shapes for N and N + 2 members, without running init
    # (a shared leaf whose size happens to be N is not mistaken for one).
    n = _population_size(hparams, 'hparams')
    if n not in self._per_member:
      def shapes(size):
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
            (size,) + tuple(x.shape[1:]), x.dtype), hparams)
        return jax.eval_shape(
            lambda h: self.shared.init(jax.random.PRNGKey(0), h), abstract)
      self._per_member[n] = jax.tree.map(
          lambda a, b: a.ndim > 0 and a.shape[0] != b.shape[0],
          shapes(n), shapes(n + 2))
    return self._per_member[n]

  def update_from_replay(self, state, hparams, replay_state, key: PRNGKey):
    """As :meth:`update`, the ``[N, num_steps, batch_size]`` batch sampled
    inside the same compiled program from a device replay (usually the
    shared layout). ``state`` is donated, ``replay_state`` is not."""
    return self._call_from_replay(state, hparams, replay_state, key, None)

  def init(self, key: PRNGKey, hparams) -> Any:
    _population_size(hparams, 'hparams')
    return self._init(key, hparams)

  def policy_params(self, state) -> Any:
    """The members' policies, as new arrays (jitted): they stay valid after
    ``state`` is donated to the next ``update``, so they can be published
    while that call runs (``Pipeline.publish_async``)."""
    return self._policy_params(state)


def member_finite(tree: Any) -> jax.Array:
  """``[N]`` bool: every float entry of member ``i``'s leaves is finite.
  Integer leaves (step counters, keys) are skipped."""
  flags = [jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1)
           for x in jax.tree.leaves(tree)
           if jnp.issubdtype(x.dtype, jnp.inexact)]
  if not flags:
    raise ValueError('member_finite needs at least one float leaf')
  return jnp.stack(flags).all(axis=0)


def select_members(rows: jax.Array, new: Any, old: Any) -> Any:
  """``new``'s members where ``rows`` (``[N]`` bool) is set, ``old``'s
  elsewhere."""
  return jax.tree.map(
      lambda a, b: jnp.where(rows.reshape(rows.shape + (1,) * (a.ndim - 1)),
                             a, b), new, old)


def population_hparams(agent: Agent, population_size: int, **overrides) -> Any:
  """The agent's defaults for every member, with per-field overrides.

  An override is a scalar (same for all) or a length-``N`` sequence.
  """
  if population_size < 1:
    raise ValueError(f'population_size must be >= 1, got {population_size}')
  hparams = stack_hparams(agent.default_hparams(), population_size)
  unknown = set(overrides) - set(hparams._fields)
  if unknown:
    raise ValueError(f'unknown {agent.name} hyperparameters {sorted(unknown)}; '
                     f'known: {list(hparams._fields)}')
  values = {k: jnp.broadcast_to(jnp.asarray(v, jnp.float32), (population_size,))
            for k, v in overrides.items()}
  return hparams._replace(**values)


