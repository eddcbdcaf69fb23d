"""What both on-device data paths share (host-side driver; not
jittable): the population's JAX envs on the device and the host's view of
them.

:class:`DeviceEnvs` is the base of both: the off-policy
``fastpbrl.datapath.device_replay.DevicePipeline`` (envs, rings and acting
inside the learner's compiled call) and the on-policy
``fastpbrl.datapath.device_rollouts.DeviceRollouts`` (envs, rollouts and
updates inside it). It holds what they do alike: the counters in env
steps, episode records, evaluations and random states on the device,
restarts, checkpoints of the envs and counters, and wait statistics.
Beside it, :func:`host_key` (a key the jitted calls take as numpy) and
:func:`unaliased` (envs safe to donate).
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.devices import distributed
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import format_bytes


class DeviceEnvs:
  """What both on-device data paths share (host-side driver, not
  jittable): the population's JAX envs on the device, and the host's view
  of them: counters in env steps, episode records, evaluations, restarts,
  checkpoints of the envs and counters, and wait statistics.
  ``DevicePipeline`` (``fastpbrl.datapath.device_replay``) adds a replay
  (agents that learn from replay), ``DeviceRollouts``
  (``fastpbrl.datapath.device_rollouts``) rollouts (agents that learn from
  their own); each compiles its learner call (``_compile_learner``),
  builds its envs (``_initial_envs``) and says when a resume continues it
  exactly (``_resumes_exactly``)."""

  def __init__(self, env: jax_envs.JaxEnv, agent, learner, num_members: int,
               config, *, envs_per_member: int, seed: int,
               resume_env_steps: Sequence[int] | None,
               replay_state: dict | None, processes,
               carried_env_steps: float | Sequence[float],
               saved_state: dict | None):
    """Args: as ``DevicePipeline``'s."""
    config.validate(num_members)
    self.config, self.env, self.agent = config, env, agent
    self.num_members, self.envs_per_member = num_members, envs_per_member
    # One process: Processes hands every value back as it is.
    self._processes = processes or distributed.Processes(None, num_members)
    self._local = self._processes.local
    self._mesh = getattr(learner, 'mesh', None)
    _check_memory(self.replay_bytes(), config, num_members)
    self._compile_learner(learner)
    self.publish_every_version = False
    self._seed = int(seed)
    self._warmup_length = np.broadcast_to(
        np.asarray(config.warmup_steps, np.int64), (num_members,)).copy()
    self._start_counters(resume_env_steps, replay_state is not None,
                         carried_env_steps)
    self._episodes: list[EpisodeRecord] = []
    self._params = self._actor_hparams = None
    self._busy = self._idle = 0.0
    self._idle_since: float | None = None
    self._busy_since: float | None = None
    self.envs = unaliased(self._initial_envs(replay_state))
    self.restored_exactly = self._resumes_exactly(saved_state, replay_state)
    if self.restored_exactly:
      self._restore(saved_state)
    self._compile_host_calls()

  # ------------------------------------------------ what a path defines

  def _compile_learner(self, learner) -> None:
    """Compiles the learner's call that steps the envs."""
    raise NotImplementedError

  def _initial_envs(self, replay_state: dict | None) -> collect.EnvsState:
    """The envs of a new run (a resume's are restored over them), built
    by one jitted call placed on the mesh."""
    raise NotImplementedError

  def _resumes_exactly(self, saved_state: dict | None,
                       replay_state: dict | None) -> bool:
    """True when ``saved_state`` (and ``replay_state``) continue this path
    exactly (``restored_exactly``)."""
    raise NotImplementedError

  def replay_bytes(self) -> int:
    """Bytes of the replay on the device (refused over the memory's
    ``DEVICE_MEMORY_FRACTION``)."""
    raise NotImplementedError

  # ----------------------------------------------------------- building

  def _start_counters(self, resume_env_steps, has_replay: bool,
                      carried_env_steps) -> None:
    """Every member's counters (the same in every process; the loop reads
    this process's rows: ``env_steps``, ``last_active``), in env steps of
    the whole run: a resumed run's continue from ``resume_env_steps``."""
    n, config = self.num_members, self.config
    resumed = resume_env_steps is not None
    warmup = self._warmup_length
    self._steps = (np.zeros(n, np.int64) if not resumed else np.broadcast_to(
        np.asarray(resume_env_steps, np.int64), (n,)).copy())
    # Where this pipeline started: the loop counts from there.
    self._origin = self._steps.copy()
    # Env steps before the learner may start, and the data the
    # update-to-data ratio counts from: a resume's refill is data, and so
    # are the steps before it that earned update steps not taken yet
    # (``carried_env_steps``). Every member takes the same env steps.
    start = int(self._steps.min())
    refill = (warmup if not resumed or config.refill_steps is None
              else config.refill_steps)
    self._learn_after = self._steps + (0 if has_replay else refill)
    self._data_from = (
        start - float(np.min(carried_env_steps)) if resumed else
        0 if config.warmup_counts_as_data else int(self._learn_after.max()))
    self._random_left = np.zeros(n, np.int64) if resumed else warmup.copy()
    self._active = np.ones(n, bool)
    self.update_steps = 0
    self.calls = 0
    self.policy_version = 0
    self._start_version = np.zeros((n, self.envs_per_member), np.int64)
    interval = config.eval_interval
    # The next --eval-every boundary after the start.
    self._next_eval = (start // interval + 1) * interval if interval else None

  # The host counters a checkpoint keeps (``checkpoint_state``).
  _SAVED_COUNTERS = ('_steps', '_learn_after', '_random_left', '_active',
                     '_start_version')

  def checkpoint_state(self) -> dict:
    """What a resume needs, beside the replay, to continue this data
    path exactly: the envs' states and keys, and the counters, as whole
    numpy arrays (gathered over several processes: every process must
    call it)."""
    leaves = jax.tree.leaves(self.envs._replace(replay=None))
    return {'envs': {f'{i:04d}': sharding.whole_value(x)
                     for i, x in enumerate(leaves)},
            **{name.lstrip('_'): np.asarray(getattr(self, name)).copy()
               for name in self._SAVED_COUNTERS},
            'data_from': np.asarray(self._data_from, np.float64),
            'counts': np.asarray([
                self.update_steps, self.calls, self.policy_version,
                -1 if self._next_eval is None else self._next_eval,
                self._seed], np.int64)}

  def _restore(self, saved: dict) -> None:
    """The envs and counters of ``checkpoint_state`` (see ``__init__``)."""
    envs = self.envs._replace(replay=None)
    leaves, treedef = jax.tree.flatten(envs)
    saved_leaves = [saved['envs'][k] for k in sorted(saved['envs'])]
    if len(saved_leaves) != len(leaves) or any(
        np.shape(a) != np.shape(b) for a, b in zip(saved_leaves, leaves)):
      raise ValueError('--resume: the checkpoint\'s env states do not fit '
                       'this env and population; resume with the settings '
                       'of the saving run')
    # Each leaf placed as the fresh one is (over several processes each
    # places its own members' rows).
    restored = jax.tree.unflatten(treedef, [
        sharding.placed_like(np.asarray(x, like.dtype), like)
        for x, like in zip(saved_leaves, leaves)])
    self.envs = unaliased(restored._replace(replay=self.envs.replay))
    for name in self._SAVED_COUNTERS:
      setattr(self, name, np.asarray(saved[name.lstrip('_')]).copy())
    self._origin = self._steps.copy()
    self._data_from = float(saved['data_from'])
    (self.update_steps, self.calls, version, next_eval,
     self._seed) = (int(x) for x in saved['counts'])
    # The run publishes the restored policies once before its first call:
    # that publish gives them the version they had.
    self.policy_version = version - 1
    self._next_eval = None if next_eval < 0 else next_eval

  def _placed(self, envs: collect.EnvsState) -> collect.EnvsState:
    """Inside a jitted call: ``envs`` pinned to the learner's mesh (the
    layout ``update_with_envs`` gives them), unchanged without one."""
    if self._mesh is None:
      return envs
    return sharding.constrain(envs, self._mesh, self.num_members,
                              collect.per_member_leaves(envs))

  def _compile_host_calls(self) -> None:
    env, agent = self.env, self.agent
    self._evaluate = jax.jit(functools.partial(collect.evaluate, env, agent),
                             static_argnums=3)
    self._restart = jax.jit(
        lambda envs, flags, warmup: self._placed(collect.restart(
            env, envs, flags, warmup)), donate_argnums=0)
    self._random_states = jax.jit(
        functools.partial(collect.random_states, env), static_argnums=1)

  def _placed_first(self, pair):
    envs, rest = pair
    return self._placed(envs), rest

  # ------------------------------------------------- this process's rows

  @property
  def env_steps(self) -> np.ndarray:
    """Env steps collected per member of this process (its rows), since
    this pipeline started (a resumed run's count from zero again)."""
    return (self._steps - self._origin)[self._local]

  @property
  def last_active(self) -> np.ndarray:
    """Per member of this process: True where the last call kept its
    updates (it was not warming up after a restart)."""
    return self._active[self._local]

  @property
  def population_active(self) -> np.ndarray:
    """``last_active`` of every member: the same in every process, so the
    loop needs no gather for it."""
    return self._active.copy()

  # ------------------------------------------------------------ the loop

  def publish(self, policy_params: Any, actor_hparams: Any) -> int:
    """The policies and acting hyperparameters of the next calls' warm-up
    and evaluations (the fused call acts with the state it updates)."""
    self._params, self._actor_hparams = policy_params, actor_hparams
    self.policy_version += 1
    return self.policy_version

  def publish_async(self, policy_params: Any, actor_hparams: Any) -> None:
    self.publish(policy_params, actor_hparams)

  def wait_published(self, timeout: float | None = None) -> bool:
    del timeout  # nothing is published in the background
    return True

  def _fused_call(self, call, learner, state, hparams, actor_hparams,
                  env_steps: int):
    """Runs a fused learner call (``learner.update_with_envs`` or
    ``update_with_rollouts``, acting with ``actor_hparams``) on the envs;
    keeps the new envs, the counters (``env_steps`` per member) and the
    finished episodes, and evaluates when due. Returns ``(state,
    metrics)``."""
    self._mark_busy()
    (state, metrics), envs, episodes = call(
        state, hparams, actor_hparams, self.envs, self._active)
    self.envs = unaliased(envs)
    self._take_episodes(self._processes.host(episodes))
    self._advance(env_steps)
    self._evaluate_due(state, learner, actor_hparams)
    self._mark_idle()
    return state, metrics

  def _advance(self, steps: int, updated: bool = True) -> None:
    """Counts ``steps`` env steps per member, and a learner call when
    the call also ``updated``."""
    self._steps += steps
    self._random_left = np.maximum(self._random_left - steps, 0)
    if updated:
      self.update_steps += self.config.num_steps
      self.calls += 1

  def _take_episodes(self, episodes: collect.Episodes) -> None:
    """Records of this process's members' episodes from ``[T, N, E]``
    flags and returns (``T`` env steps, the first one right after
    ``self._steps``), numbered from 0 as its rows."""
    shape = (-1, self.num_members, self.envs_per_member)
    first = self._local.start
    done, returns, lengths, objectives = (
        np.asarray(x).reshape(shape)[:, self._local]
        for x in (episodes.done, episodes.episode_return,
                  episodes.episode_length, episodes.true_objective))
    for t, m, e in zip(*np.nonzero(done)):
      self._episodes.append(EpisodeRecord(
          member=int(m), episode_return=float(returns[t, m, e]),
          episode_length=int(lengths[t, m, e]), evaluation=False,
          env_steps=int(self._steps[first + m]
                        + (t + 1) * self.envs_per_member),
          policy_version=self.policy_version,
          start_policy_version=int(self._start_version[first + m, e]),
          true_objective=_objective(objectives[t, m, e])))
      self._start_version[first + m, e] = self.policy_version
    del self._episodes[:-100_000]  # undrained records kept at most

  def _evaluate_due(self, state, learner, actor_hparams) -> None:
    """Every member's evaluation, on the device, once the members passed
    the next ``--eval-every`` boundary."""
    if self._next_eval is None or self._steps.min() < self._next_eval:
      return
    at = self._next_eval
    while self._next_eval <= self._steps.min():
      self._next_eval += self.config.eval_interval
    key = host_key(self._seed, at)
    returns, lengths, objectives = (
        x[self._local] for x in self._processes.host(self._evaluate(
            learner.policy_params(state), actor_hparams, key,
            self.config.eval_episodes)))
    for m in range(returns.shape[0]):
      for k in range(returns.shape[1]):
        self._episodes.append(EpisodeRecord(
            member=m, episode_return=float(returns[m, k]),
            episode_length=int(lengths[m, k]), evaluation=True, env_steps=at,
            policy_version=self.policy_version,
            start_policy_version=self.policy_version,
            true_objective=_objective(objectives[m, k])))

  def evaluate(self, policy_params, actor_hparams, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[N, episodes]`` returns, lengths and true objectives of noise-free
    episodes of ``policy_params`` (this process's rows, as published),
    played on the device (the final evaluation); every member's, in every
    process."""
    key = host_key(seed, 2**30)
    rows = self._processes.global_rows
    return self._processes.host(self._evaluate(
        rows(policy_params), rows(actor_hparams), key, episodes))

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations of one env visited by
    uniformly random actions from resets, on the device, every key derived
    from ``PRNGKey(seed)`` (``collect.random_states``): the same states for
    the same env and seed."""
    return np.asarray(self._random_states(host_key(seed), num_states))

  def drain_episodes(self) -> list[EpisodeRecord]:
    records, self._episodes = self._episodes, []
    return records

  # ------------------------------------------------------- rule actions

  def restart_members(self, members: Sequence[int] | np.ndarray) -> None:
    """Starts ``members`` (this process's rows) over as new experiments:
    new episodes, an empty ring (if the path has one), the warm-up of
    random actions (if it has one); their updates are discarded until it
    is over. Over several processes every process calls it (with its own
    rows, maybe none)."""
    local = np.zeros(self._local.stop - self._local.start, bool)
    local[np.asarray(members, np.int64).reshape(-1)] = True
    flags = self._processes.members(local)
    if not flags.any():
      return
    self.envs = unaliased(self._restart(
        self.envs, flags, self._warmup_length.astype(np.int32)))
    self._random_left[flags] = self._warmup_length[flags]
    self._start_version[flags] = self.policy_version + 1

  # ---------------------------------------------------------------- stats

  def env_steps_per_member(self) -> int:
    return int((self._steps - self._origin).min())

  def _mark_busy(self) -> None:
    now = time.monotonic()
    if self._idle_since is not None:
      self._idle += now - self._idle_since
      self._idle_since = None
    self._busy_since = now

  def _mark_idle(self) -> None:
    now = time.monotonic()
    if self._idle_since is None and self._busy_since is not None:
      self._busy += now - self._busy_since
    self._idle_since = now

  def wait_fraction(self) -> float:
    """Fraction of wall time the device had no call to run (the host was
    logging, checkpointing or deciding), since the first call."""
    total = self._busy + self._idle
    return self._idle / total if total else 0.0

  def reset_wait_stats(self) -> None:
    """Restarts ``wait_fraction`` from now."""
    self._busy = self._idle = 0.0
    self._idle_since = None
    self._busy_since = time.monotonic()

  def close(self) -> None:
    self.envs = None  # frees the device arrays


def _check_memory(nbytes: int, config: PipelineConfig, n: int) -> None:
  """Refuses (a ValueError naming the flag) a replay larger than
  ``DEVICE_MEMORY_FRACTION`` of the device's memory (of the machine's, on
  the CPU backend), before anything is allocated."""
  memory = device_replay.device_memory_bytes()
  if memory is None:
    try:
      memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError):
      return
  limit = int(memory * device_replay.DEVICE_MEMORY_FRACTION)
  if nbytes > limit:
    rings = (f'{n} members x {config.replay_capacity}' if
             config.layout == 'per_member' else f'{config.replay_capacity}')
    raise ValueError(
        f'--replay-capacity {config.replay_capacity}: the on-device replay '
        f'({rings} transitions) needs {format_bytes(nbytes)}, more than '
        f'{device_replay.DEVICE_MEMORY_FRACTION:.0%} of the device\'s '
        f'{format_bytes(memory)}; lower --replay-capacity')


def unaliased(envs: collect.EnvsState) -> collect.EnvsState:
  """``envs`` with no buffer in two leaves. An env's state may hold one
  array twice (Brax's reset returns the same zero as reward and done), and
  XLA may return one buffer for two equal outputs; a buffer donated twice
  to the next call would fail, so a repeated one is copied (a check of a
  few dozen pointers per call)."""
  seen = set()

  def own(x):
    if not isinstance(x, jax.Array):
      return x
    pointer = x.addressable_shards[0].data.unsafe_buffer_pointer()
    if pointer in seen:
      return jnp.copy(x)
    seen.add(pointer)
    return x

  return jax.tree.map(own, envs)


def host_key(seed: int, data: int | None = None) -> np.ndarray:
  """``PRNGKey(seed)`` (folded with ``data``) as numpy."""
  key = jax.random.PRNGKey(seed)
  if data is not None:
    key = jax.random.fold_in(key, data)
  return np.asarray(key)


def _objective(value) -> float:
  """An episode's true objective as its record holds it: the record's own
  default (one NaN object, so that records of an env without one compare
  equal) where the env reports none."""
  value = float(value)
  return value if math.isfinite(value) else (
      EpisodeRecord._field_defaults['true_objective'])
