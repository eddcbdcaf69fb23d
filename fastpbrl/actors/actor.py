"""The actor: steps the environments of the members one process hosts.

Host-side module (gymnasium environments, numpy, one jitted CPU policy call
per step; the loop itself is not jittable).

:class:`Actor` holds one training environment per hosted member (and,
lazily, one evaluation environment per member) and fills transition chunks
``[M, T, ...]``. Every step it evaluates the policies of all ``M`` hosted
members in ONE vectorized call, ``jit(vmap(agent.act))`` on CPU, with each
member's newest parameters from the param store; the first
``warmup_steps`` steps of a member use uniform random actions instead.

The training envs are one :class:`~fastpbrl.actors.env_batch.EnvBatch`:
``make_batch`` (``fastpbrl.actors.vector_envs``) gives a vectorized batch,
one numpy step for all hosted members, for the envs it knows (MuJoCo
HalfCheetah, Hopper, Walker2d v5 and Pendulum-v1) and serially stepped
``gymnasium.make`` instances for every other env (and with
``vectorized_envs=False``). Either way the batch never auto-resets:
``terminated`` and ``truncated`` are kept apart, and on either one
``next_observation`` is the real final observation returned by the step
before the actor resets that env.

Evaluation: every ``eval_interval`` training env steps of a member, its
``eval_episodes`` separate evaluation environments each play one episode
without exploration noise, all at once and stepped in lockstep with
training (the evaluation envs of all hosted members are one more
``EnvBatch``, vectorized where the training envs are, which steps only
the envs whose episode is under way) (the same vectorized call returns both kinds of action), so
collection never pauses and an evaluation lasts as long as its longest
episode, not the sum of its episodes: 5 episodes of 1,000 steps fit in an
``eval_interval`` of 2,500 steps, where one after another they would take
5,000 and every other evaluation would be skipped. All episodes of one
evaluation play ONE policy version, the member's newest at the
evaluation's start, frozen while training goes on with newer ones; their
records carry that version as ``start_policy_version`` and the member's
training env steps at the evaluation's start as ``env_steps``. The next
evaluation starts at the first multiple of ``eval_interval`` after the
start of this one, once all of its episodes have ended. Evaluation
transitions are not sent to the replay. Both kinds of episode are reported
with their return and length.

Seeding (all from the run seed, never global state): member ``m`` on its
``r``-th (re)start uses ``np.random.SeedSequence(seed, spawn_key=(1, m, r))``
for its env reset seeds, its warm-up action generator, its exploration key
and its evaluation key; ``fold_in(key, env_step)`` gives the key of each
step. The layout of members over processes does not change any member's
stream.

Step-dependent exploration (DQN's annealed epsilon): when the agent has
``acting_hparams``, each member's exploratory action uses
``acting_hparams(hparams, env_step)`` with its own training env step count,
computed in the same jitted call.

:func:`run_actor` is the body of an actor process (see ``pool.py``).

**On-policy mode** (``on_policy=True``, the actors of
``fastpbrl.datapath.actor_rollouts.ActorRollouts``, for agents that learn from
their own rollouts): synchronous iterations, as Stable-Baselines3's and the
PPO paper's. Before each chunk (``T = rollout_length`` steps of every
hosted member, one env each) the actor waits, polling its stop flag, until
a policy version newer than the one of its last chunk is published; it then
acts with that version alone for the whole chunk (no per-step refresh, no
warm-up of random actions), with ``agent.behave``, whose log-probabilities
go into the chunk's ``log_prob`` field. So every rollout a member learns
from was collected entirely by the version it learns with (zero staleness:
PPO's clipped ratio starts at exactly 1). Evaluation episodes, episode
records and restarts work as in the off-policy mode.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
import traceback
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

# Only the actor process entry point configures JAX (see _configure_process);
# importing jax does not initialise a backend.
import jax
from acme import specs

from fastpbrl.actors.channel import Channel, ChannelHandle
from fastpbrl.actors.param_store import ParamStore, ParamStoreHandle
from fastpbrl.actors.vector_envs import make_batch
from fastpbrl.core.types import make_env_spec, scale_action
from fastpbrl.envs.params import ActorHParams

ACTOR_STREAM = 1  # spawn_key[0] of the actors' seed sequences

# XLA flags of an actor process (each unless XLA_FLAGS already sets it):
# Eigen's matmuls on one thread, and the compiled program's steps run one
# after another on the calling thread. XLA:CPU's default scheduler orders
# independent steps to run concurrently, handing them between threads: for
# a policy call of a few µs of arithmetic those hand-offs cost most of the
# call (PPO's, two HalfCheetah members: about 130 µs against 40 µs in
# order; benchmarks/results/cpu/policy_call.md). The JAX FAQ's
# `intra_op_parallelism_threads=1` is left out: it is no XLA flag, and XLA
# reads no flag after it.
ACTOR_XLA_FLAGS = (
    ('--xla_cpu_multi_thread_eigen', 'false'),
    ('--xla_cpu_enable_concurrency_optimized_scheduler', 'false'),
)


class MemberSeeds(NamedTuple):
  env: int  # seed of the training env's first reset
  eval_env: int  # seed of the first evaluation env's first reset
  key: int  # seed of the exploration key
  rng: np.random.Generator  # warm-up actions
  eval_key: int  # seed of the evaluation actions' key (DQN's epsilon 0.05)


def member_seeds(seed: int, member: int, restart: int = 0) -> MemberSeeds:
  """Seeds of member ``member`` on its ``restart``-th start, from the run
  seed."""
  seq = np.random.SeedSequence(seed, spawn_key=(ACTOR_STREAM, member, restart))
  # The first words of generate_state do not depend on how many are asked
  # for: the 4th (eval key) leaves the other three what 3 words give.
  words = seq.generate_state(4, np.uint32)
  return MemberSeeds(int(words[0]), int(words[1]), int(words[2]),
                     np.random.default_rng(seq.spawn(1)[0]), int(words[3]))


def eval_env_seed(eval_env: int, k: int) -> int:
  """Seed of the first reset of a member's ``k``-th evaluation env, from
  its ``MemberSeeds.eval_env`` (env 0 takes that seed itself)."""
  if k == 0:
    return int(eval_env)
  seq = np.random.SeedSequence(int(eval_env), spawn_key=(k,))
  return int(seq.generate_state(1, np.uint32)[0])


class _ChunkViews(NamedTuple):
  """The chunk fields (``chunk_layout``) ``Actor._fill`` writes each step."""

  observation: np.ndarray  # [M, T, ...]
  action: np.ndarray  # [M, T, ...]
  reward: np.ndarray  # [M, T]
  next_observation: np.ndarray  # [M, T, ...]
  terminated: np.ndarray  # [M, T]
  truncated: np.ndarray  # [M, T]
  episode_member: np.ndarray  # [E], one row per episode ended in the chunk
  episode_return: np.ndarray  # [E]
  episode_length: np.ndarray  # [E]
  episode_evaluation: np.ndarray  # [E]
  episode_env_steps: np.ndarray  # [E]
  episode_policy_version: np.ndarray  # [E]
  episode_start_version: np.ndarray  # [E]
  episode_objective: np.ndarray  # [E]


class ActorStopped(Exception):
  """Raised inside the loop when a stop was requested while waiting."""


class Actor:
  """Steps the hosted members' environments and fills transition chunks."""

  def __init__(self, *, members: Sequence[int], env_fn: Callable[[], Any],
               agent_fn: Callable[[specs.EnvironmentSpec], Any],
               store: ParamStore, seed: int, restart: int = 0,
               env_steps: Sequence[int] | None = None,
               warmup_steps: int | Sequence[int] = 0, eval_interval: int = 0,
               eval_episodes: int = 1, prng_impl: str = 'threefry2x32',
               should_stop: Callable[[], bool] = lambda: False,
               random_until: Sequence[int] | None = None,
               vectorized_envs: bool = True, on_policy: bool = False):
    """Args:
      members: population indices hosted here, in store order.
      env_fn: builds one gymnasium environment (called once per member, and
        ``eval_episodes`` more times per member, at the first evaluation).
      agent_fn: ``env_spec -> Agent``; its ``act`` selects actions.
      store: the param store holding ``(policy_params, actor_hparams)``.
      seed: the run seed.
      restart: how many times these members' actor was restarted (a restart
        gets fresh seeds so it does not replay the same episodes).
      env_steps: training env steps already collected per member (restarts
        resume the warm-up and evaluation schedule from there).
      warmup_steps: random-action steps per member before using the policy.
      eval_interval: training env steps between evaluations (0: never).
      eval_episodes: episodes per evaluation, played at once by as many
        evaluation environments per member.
      prng_impl: ``jax.random`` implementation of the exploration keys.
      should_stop: polled while waiting; a true value ends ``fill`` early.
      random_until: per member, the training env step count below which it
        acts randomly (default ``warmup_steps``); a resumed run passes its
        restored counts, so its members act with their restored policies
        from the first step. ``warmup_steps`` stays the length of the
        warm-up of a member restarted as a new experiment.
      vectorized_envs: step the training envs as one vectorized batch where
        ``fastpbrl.actors.vector_envs`` has one for the env (False: one
        after another, as for any other env).
      on_policy: synchronous on-policy collection (see the module): each
        chunk waits for a new policy version and is collected with it and
        ``agent.behave``; the chunk layout then has a ``log_prob`` field.
    """
    self.members = np.asarray(members, np.int64)
    m = self.members.size
    if m < 1:
      raise ValueError('members must not be empty')
    if eval_interval < 0:
      raise ValueError(f'eval_interval must be >= 0, got {eval_interval}')
    if eval_episodes < 1:
      raise ValueError(f'eval_episodes must be >= 1, got {eval_episodes}')
    lo = int(self.members[0])
    contiguous = np.array_equal(self.members, np.arange(lo, lo + m))
    self._rows = slice(lo, lo + m) if contiguous else self.members
    self._store = store
    self._should_stop = should_stop
    self._on_policy = bool(on_policy)
    # On-policy: the version the last chunk was collected with, and whether
    # a chunk is being filled (its policy is frozen until it is sent).
    self._rollout_version = 0
    self._frozen = False
    self._env_fn = env_fn
    self._seeds = [member_seeds(seed, int(i), restart) for i in self.members]
    self._make_envs(env_fn, agent_fn, vectorized_envs)
    self._init_counters(env_steps, warmup_steps, random_until)
    if self._on_policy and (self._warmup_length.any()
                            or (self._warmup > self._steps).any()):
      # A random action has no log-prob of the behaviour policy.
      raise ValueError('on-policy actors take no warm-up: warmup_steps and '
                       'random_until must be 0')
    self._init_evaluation(eval_interval, eval_episodes)
    self._init_policy(prng_impl)

  def _make_envs(self, env_fn: Callable[[], Any],
                 agent_fn: Callable[[specs.EnvironmentSpec], Any],
                 vectorized: bool) -> None:
    """Builds the training envs and the agent, and resets each env with
    its member's seed."""
    m = self.members.size
    self._vectorized = vectorized
    self._batch = make_batch(env_fn, m, vectorized)
    self.env_spec = make_env_spec(self._batch.envs[0])
    self._agent = agent_fn(self.env_spec)
    actions = self.env_spec.actions
    self._discrete = isinstance(actions, specs.DiscreteArray)
    self._num_actions = int(actions.num_values) if self._discrete else 0
    self._action_shape = () if self._discrete else tuple(actions.shape)
    obs_spec = self.env_spec.observations
    self._obs = np.zeros((m, *obs_spec.shape), obs_spec.dtype)
    for j in range(m):
      self._obs[j] = self._batch.reset(j, self._seeds[j].env)

  def _init_counters(self, env_steps: Sequence[int] | None,
                     warmup_steps: int | Sequence[int],
                     random_until: Sequence[int] | None) -> None:
    """Sets the per-member step, warm-up, restart and episode counters."""
    m = self.members.size
    self._steps = np.zeros(m, np.int64) if env_steps is None else np.asarray(
        env_steps, np.int64).copy()
    warmup = np.broadcast_to(np.asarray(warmup_steps, np.int64), (m,))
    self._warmup = (warmup.copy() if random_until is None else
                    np.asarray(random_until, np.int64).reshape(m).copy())
    self._warmup_length = warmup.copy()  # a restarted member warms up anew
    # Restarts (``Pipeline.restart_members``): the count each member's data
    # belongs to, and the chunk step from which it does.
    self._restart_count = None
    self._restart_at = np.zeros(m, np.int64)
    self._t = 0  # step within the chunk being filled
    self._returns = np.zeros(m, np.float64)
    self._lengths = np.zeros(m, np.int64)
    self._start_version = np.zeros(m, np.int64)

  def _init_evaluation(self, eval_interval: int, eval_episodes: int) -> None:
    """Sets the evaluation state (its envs are made at the first one)."""
    m = self.members.size
    obs_spec = self.env_spec.observations
    self._eval_interval = int(eval_interval)
    self._eval_episodes = int(eval_episodes)
    k = self._eval_episodes
    # Made at the first evaluation: one batch of M * K envs (member j's
    # k-th is env j * K + k), and the same envs as [M][K] lists.
    self._eval_batch = None
    self._eval_envs = None
    self._eval_running = np.zeros((m, k), bool)  # episodes under way
    self._eval_obs = np.zeros((m, k, *obs_spec.shape), obs_spec.dtype)
    self._eval_returns = np.zeros((m, k), np.float64)
    self._eval_lengths = np.zeros((m, k), np.int64)
    self._eval_start_version = [0] * m
    self._eval_start_steps = np.zeros(m, np.int64)
    self._eval_params = None  # [M] policies frozen at evaluation starts
    if self._eval_interval:
      self._next_eval = (self._steps // self._eval_interval + 1) * (
          self._eval_interval)

  def _init_policy(self, prng_impl: str) -> None:
    """Sets the policy state, the members' keys and the jitted policy calls."""
    self._version = 0
    self._params = None
    self._hparams = None
    self._env_values = {}  # {name: [M]} env parameters (fastpbrl.envs.params)
    # On the device once, not converted from numpy at every policy call.
    self._key_data = jax.device_put(np.stack(
        [key_data_of(s.key, prng_impl) for s in self._seeds]))
    self._eval_key_data = jax.device_put(np.stack(
        [key_data_of(s.eval_key, prng_impl) for s in self._seeds]))
    self._policy, self._policy_and_eval = make_policy_fns(
        self._agent, prng_impl, behave=self._on_policy)
    self._freeze_rows = jax.jit(_select_rows)

  # ----------------------------------------------------------------- state

  @property
  def env_steps(self) -> np.ndarray:
    """Training env steps collected per hosted member (a copy)."""
    return self._steps.copy()

  @property
  def policy_version(self) -> int:
    return self._version

  def close(self) -> None:
    self._batch.close()
    if self._eval_batch is not None:
      self._eval_batch.close()

  # ---------------------------------------------------------------- policy

  def _refresh_params(self) -> None:
    if self._frozen or self._store.version == self._version:
      return
    got = self._store.read(self._rows)
    if got is None:
      return
    self._version, tree = got
    params, acting = tree[0], tree[1]
    # ``env_params.ActorHParams`` from the data paths; a store written with
    # the agent's hyperparameters alone holds no env parameters.
    hparams, env_values = (acting if isinstance(acting, ActorHParams)
                           else (acting, {}))
    self._params = jax.device_put(params)
    self._hparams = jax.device_put(hparams)
    self._env_values = {k: np.asarray(v) for k, v in env_values.items()}
    self._batch.set_env_params(self._env_values)
    if len(tree) > 2:  # per-member restart counters (pipeline layout)
      self._adopt_restarts(np.asarray(tree[2], np.int64))

  def _adopt_restarts(self, counts: np.ndarray) -> None:
    """A member whose restart counter went up starts a new experiment: a
    fresh episode, its own warm-up of random actions, and its data from this
    step on marked as the new restart's (the pipeline empties its replay
    before inserting it)."""
    if self._restart_count is None:
      # First read (also of a restarted actor process): take the counters
      # as they are; data from the chunk's start belongs to them.
      self._restart_count = counts.copy()
      return
    for j in np.flatnonzero(counts != self._restart_count):
      self._restart_count[j] = counts[j]
      self._restart_at[j] = self._t
      self._warmup[j] = self._steps[j] + self._warmup_length[j]
      self._returns[j], self._lengths[j] = 0.0, 0
      self._obs[j] = self._batch.reset(j)

  def _wait_for_params(self) -> None:
    while self._params is None:
      self._refresh_params()
      if self._params is not None:
        return
      if self._should_stop():
        raise ActorStopped
      time.sleep(0.01)

  def _wait_for_new_version(self) -> None:
    """On-policy: waits until a version newer than the last chunk's is
    published and takes it (polling the stop flag, which also beats the
    heartbeat: waiting for the learner is not a hang)."""
    while self._store.version <= self._rollout_version:
      if self._should_stop():
        raise ActorStopped
      time.sleep(0.002)
    self._refresh_params()
    self._wait_for_params()
    self._rollout_version = self._version

  def _random_actions(self, which: np.ndarray) -> list:
    out = []
    for j in which:
      rng = self._seeds[j].rng
      if self._discrete:
        out.append((j, np.int32(rng.integers(self._num_actions))))
      else:
        out.append((j, rng.uniform(-1.0, 1.0, self._action_shape).astype(
            np.float32)))
    return out

  def _to_env(self, actions: np.ndarray) -> np.ndarray:
    if self._discrete:
      return actions.astype(np.int64)
    return scale_action(actions, self.env_spec.actions)

  # ------------------------------------------------------------ evaluation

  def _start_evaluations(self) -> None:
    due = (self._steps >= self._next_eval) & ~self._eval_running.any(axis=1)
    if not due.any():
      return
    if self._eval_batch is None:
      m, k = self.members.size, self._eval_episodes
      self._eval_batch = make_batch(self._env_fn, m * k, self._vectorized)
      envs = self._eval_batch.envs
      self._eval_envs = [envs[j * k:(j + 1) * k] for j in range(m)]
      self._eval_seeded = [False] * m
    # Freeze the evaluated members' newest policies for the whole evaluation.
    self._refresh_params()
    self._wait_for_params()
    if self._eval_params is None:
      self._eval_params = self._params
    else:
      self._eval_params = self._freeze_rows(due, self._params,
                                            self._eval_params)
    k = self._eval_episodes
    self._eval_batch.set_env_params(
        {n: np.repeat(v, k) for n, v in self._env_values.items()},
        [j * k + i for j in np.flatnonzero(due) for i in range(k)])
    for j in np.flatnonzero(due):
      self._eval_start_version[j] = self._version
      self._eval_start_steps[j] = self._steps[j]
      self._eval_running[j] = True
      # The first reset of each evaluation env takes its seed; later ones
      # continue the env's own generator.
      first = not self._eval_seeded[j]
      self._eval_seeded[j] = True
      for k in range(self._eval_episodes):
        seed = eval_env_seed(self._seeds[j].eval_env, k) if first else None
        self._eval_obs[j, k] = self._eval_batch.reset(
            j * self._eval_episodes + k, seed)
      self._eval_returns[j] = 0.0
      self._eval_lengths[j] = 0
      interval = self._eval_interval
      self._next_eval[j] = (self._steps[j] // interval + 1) * interval

  # ------------------------------------------------------------------ loop

  def fill(self, out: dict[str, np.ndarray]) -> bool:
    """Steps every hosted member ``T`` times into the chunk views ``out``.

    ``out`` holds the fields of ``fastpbrl.actors.channel.chunk_layout``.

    Returns:
      True when the chunk is complete; False if a stop was requested while
      waiting for parameters (the chunk is then incomplete and must not be
      sent).
    """
    try:
      self._fill(out)
      return True
    except ActorStopped:
      return False

  def _fill(self, out: dict[str, np.ndarray]) -> None:
    """:meth:`fill`'s loop; raises ActorStopped on a stop request."""
    views = _ChunkViews(*(out[name] for name in _ChunkViews._fields))
    m, t_steps = views.action.shape[0], views.action.shape[1]
    if m != self.members.size:
      raise ValueError(f'chunk has {m} member rows, actor hosts '
                       f'{self.members.size}')
    evaluating = self._eval_interval > 0
    n_ep = 0
    self._restart_at[:] = 0
    if self._on_policy:  # one version for the whole chunk
      self._t = 0
      self._wait_for_new_version()
      self._frozen = True
    try:
      for t in range(t_steps):
        self._t = t
        # Every step, so that a restart reaches a member that is warming
        # up (on-policy: frozen, a no-op).
        self._refresh_params()
        if evaluating:
          self._start_evaluations()
        eval_active = evaluating and bool(self._eval_running.any())
        actions, log_probs, eval_actions = self._step_actions(eval_active)
        if log_probs is not None:
          out['log_prob'][:, t] = log_probs
        n_ep = self._step_envs(views, t, actions, eval_actions, out, n_ep)
        self._steps += 1
    finally:
      self._frozen = False
    out['env_steps'][:] = self._steps
    out['meta'][:] = (t_steps, n_ep, self._version, 0)
    out['restart_count'][:] = (0 if self._restart_count is None
                               else self._restart_count)
    out['restart_at'][:] = self._restart_at

  def _step_actions(self, eval_active: bool) -> tuple[np.ndarray, Any, Any]:
    """This step's actions ``[M, ...]`` (random for members warming up),
    their ``[M]`` log-probabilities (on-policy mode; else None) and the
    evaluation envs' ``[M, K, ...]`` (None when none evaluates)."""
    m = self.members.size
    warm = self._steps < self._warmup
    eval_actions = log_probs = None
    if warm.all() and not eval_active:
      actions = np.zeros((m, *self._action_shape),
                         np.int32 if self._discrete else np.float32)
    else:
      self._refresh_params()
      self._wait_for_params()
      step_ids = self._steps.astype(np.uint32)
      if eval_active:
        actions, eval_actions = self._policy_and_eval(
            self._params, self._eval_params, self._hparams, self._obs,
            self._eval_obs, self._key_data, self._eval_key_data, step_ids)
        eval_actions = self._to_env(np.asarray(eval_actions))
      else:
        actions = self._policy(self._params, self._hparams, self._obs,
                               self._key_data, step_ids)
      if self._on_policy:
        actions, log_probs = actions
        log_probs = np.asarray(log_probs)
      actions = np.array(actions)
    if warm.any():
      # Never on-policy: its actors have no warm-up (log_probs would lie).
      for j, a in self._random_actions(np.flatnonzero(warm)):
        actions[j] = a
    return actions, log_probs, eval_actions

  def _step_envs(self, views: _ChunkViews, t: int, actions: np.ndarray,
                 eval_actions, out: dict[str, np.ndarray], n_ep: int) -> int:
    """Steps every member's training env (and running evaluation envs) with
    ``actions`` into chunk step ``t``; returns the episode rows used."""
    views.action[:, t] = actions
    views.observation[:, t] = self._obs
    step = self._batch.step(self._to_env(actions))
    views.next_observation[:, t] = step.observation
    views.reward[:, t] = step.reward
    views.terminated[:, t] = step.terminated
    views.truncated[:, t] = step.truncated
    self._start_version[self._lengths == 0] = self._version
    self._returns += step.reward
    self._lengths += 1
    self._obs[:] = step.observation
    for j in (step.terminated | step.truncated).nonzero()[0]:
      views.episode_member[n_ep] = int(self.members[j])
      views.episode_return[n_ep] = self._returns[j]
      views.episode_length[n_ep] = self._lengths[j]
      views.episode_evaluation[n_ep] = 0
      views.episode_env_steps[n_ep] = self._steps[j] + 1
      views.episode_policy_version[n_ep] = self._version
      views.episode_start_version[n_ep] = self._start_version[j]
      views.episode_objective[n_ep] = step.true_objective[j]
      n_ep += 1
      self._returns[j], self._lengths[j] = 0.0, 0
      self._obs[j] = self._batch.reset(j)
    if eval_actions is not None:
      n_ep = self._eval_step(eval_actions, out, n_ep)
    return n_ep

  def _eval_step(self, actions: np.ndarray, out, n_ep: int) -> int:
    """One step of every evaluation episode under way (``actions``:
    ``[M, K, ...]``); each evaluation env plays one episode per
    evaluation."""
    running = self._eval_running.copy()
    m, k = running.shape
    step = self._eval_batch.step(
        actions.reshape(m * k, *actions.shape[2:]), running.reshape(-1))
    shape = (m, k)
    self._eval_returns += np.where(running, step.reward.reshape(shape), 0.0)
    self._eval_lengths += running
    self._eval_obs[running] = step.observation.reshape(
        m, k, *step.observation.shape[1:])[running]
    ended = running & (step.terminated | step.truncated).reshape(shape)
    for j, e in zip(*np.nonzero(ended)):
      out['episode_member'][n_ep] = self.members[j]
      out['episode_return'][n_ep] = self._eval_returns[j, e]
      out['episode_length'][n_ep] = self._eval_lengths[j, e]
      out['episode_evaluation'][n_ep] = 1
      # The training env steps of the policy it played (as a return curve
      # wants), not the steps trained while it was played.
      out['episode_env_steps'][n_ep] = self._eval_start_steps[j]
      # The frozen version played the whole episode.
      out['episode_policy_version'][n_ep] = self._eval_start_version[j]
      out['episode_start_version'][n_ep] = self._eval_start_version[j]
      out['episode_objective'][n_ep] = step.true_objective[j * k + e]
      n_ep += 1
    self._eval_running &= ~ended
    return n_ep


def key_data_of(seed: int, prng_impl: str) -> np.ndarray:
  """The raw data of the ``prng_impl`` key seeded with ``seed``."""
  key = jax.random.key(seed, impl=prng_impl)
  return np.asarray(jax.random.key_data(key))


def _select_rows(rows, new, old):
  """``new``'s rows where ``rows`` (bool ``[M]``) is set, ``old``'s elsewhere."""
  return jax.tree.map(
      lambda a, b: jax.numpy.where(
          rows.reshape(rows.shape + (1,) * (a.ndim - 1)), a, b), new, old)


def make_policy_fns(agent, prng_impl: str, behave: bool = False):
  """The two jitted CPU policy calls over all hosted members.

  ``behave``: the exploratory actions come from ``agent.behave`` (a rollout
  agent's on-policy collection) and are returned with their
  log-probabilities, as ``(actions[M, ...], log_probs[M])``.

  ``policy(params[M], hparams[M], obs[M], key_data[M], steps[M])`` returns
  exploratory actions ``[M, ...]``; ``policy_and_eval`` also takes the
  frozen evaluation policies, the evaluation observations ``[M, K, ...]``
  (``K`` evaluation envs per member) and keys and returns (exploratory
  ``[M, ...]``, evaluation ``[M, K, ...]``) actions. ``steps`` are the members'
  training env steps: they pick each step's key and, through
  ``agent.acting_hparams``, the exploration schedule. This jit is the
  outermost call of the actor, as the learner's is of the learner.
  """
  return tuple(jax.jit(fn) for fn in policy_fns(agent, prng_impl, behave))


def policy_fns(agent, prng_impl: str, behave: bool = False):
  """:func:`make_policy_fns`'s two functions before compiling: pure,
  vmapped over the members, returning jax arrays."""

  def key_of(key_data, step):
    key = jax.random.wrap_key_data(key_data, impl=prng_impl)
    return jax.random.fold_in(key, step)

  def explore(params, hparams, obs, key_data, step):
    if agent.acting_hparams is not None:
      hparams = agent.acting_hparams(hparams, step)
    if behave:
      action, log_prob = agent.behave(params, obs[None],
                                      key_of(key_data, step), hparams)
      return action[0], log_prob[0]
    return agent.act(params, obs[None], key_of(key_data, step), hparams,
                     True)[0]

  def one_with_eval(params, eval_params, hparams, obs, eval_obs, key_data,
                    eval_key_data, step):
    # eval_obs: [K, ...], one row per evaluation env; env k's key is the
    # step's evaluation key folded with k.
    key = key_of(eval_key_data, step)

    def evaluate(o, k):
      return agent.act(eval_params, o[None], jax.random.fold_in(key, k),
                       hparams, False)[0]

    ks = jax.numpy.arange(eval_obs.shape[0], dtype=jax.numpy.uint32)
    return (explore(params, hparams, obs, key_data, step),
            jax.vmap(evaluate)(eval_obs, ks))

  return jax.vmap(explore), jax.vmap(one_with_eval)


# ---------------------------------------------------------------- process


@dataclasses.dataclass(frozen=True)
class ActorSpec:
  """Everything an actor process needs; pickled once at spawn."""

  actor_id: int
  members: tuple[int, ...]
  env_fn: Callable[[], Any]
  agent_fn: Callable[[specs.EnvironmentSpec], Any]
  seed: int
  restart: int
  env_steps: tuple[int, ...]
  warmup_steps: tuple[int, ...]
  random_until: tuple[int, ...]
  eval_interval: int
  eval_episodes: int
  prng_impl: str
  vectorized_envs: bool
  params: ParamStoreHandle
  channel: ChannelHandle
  parent_pid: int
  on_policy: bool = False  # see Actor (synchronous on-policy collection)


def configure_actor_process() -> None:
  """Pins JAX to the CPU with one thread, synchronous dispatch and a
  program's steps run in order (``ACTOR_XLA_FLAGS``; call before any JAX
  computation).

  Synchronous: the actor needs each policy call's actions at once, and
  JAX's asynchronous CPU dispatch would hand every call to a worker
  thread and wake this one when it is done; two thread hand-offs per env
  step, each a wait for a core when the machine is busy (the learner runs
  beside the actors). On a busy 2-core machine that wait was most of a
  small policy call's time (``benchmarks/results/cpu/actor_throughput.md``
  against ``actor_throughput_async.md``, the actors before this).

  The first thing an actor process does. It works because importing
  fastpbrl (and jax) initialises no backend: only the first computation
  does, and it reads ``XLA_FLAGS`` and the ``jax_platforms`` setting then.
  The parent's environment is never changed for its children: other
  threads of the learner process (its JAX among them) read it. A script
  whose top level (outside ``if __name__ == '__main__':``) computes with
  JAX would initialise a backend while an actor re-imports it.
  """
  os.environ['JAX_PLATFORMS'] = 'cpu'
  flags = os.environ.get('XLA_FLAGS', '')
  # First: XLA stops reading flags at a word that is none.
  extra = [f'{name}={value}' for name, value in ACTOR_XLA_FLAGS
           if name not in flags]
  os.environ['XLA_FLAGS'] = ' '.join([*extra, flags]).strip()
  jax.config.update('jax_platforms', 'cpu')
  jax.config.update('jax_cpu_enable_async_dispatch', False)


def run_actor(spec: ActorSpec) -> None:
  """Body of an actor process: fill and commit chunks until told to stop.

  Stops when the pool raises the channel's stop flag or the parent process
  dies. Any exception is written to the channel's error area (with the
  hosted members) before the process exits with it, so the pool can report
  the traceback.
  """
  # Ctrl-C reaches the whole process group, and a batch system's SIGTERM
  # every process of the job: the learner process decides when actors stop
  # (it checkpoints first), and they also stop when it is gone.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  configure_actor_process()
  channel = Channel.attach(spec.channel)
  store = actor = out = None

  def should_stop() -> bool:
    # Polled while waiting (for parameters, for room in the channel):
    # waiting is a sign of life, not a hang.
    channel.beat()
    return channel.stop_requested or os.getppid() != spec.parent_pid

  try:
    channel.mark_started()
    store = ParamStore.attach(spec.params)
    actor = Actor(
        members=spec.members, env_fn=spec.env_fn, agent_fn=spec.agent_fn,
        store=store, seed=spec.seed, restart=spec.restart,
        env_steps=spec.env_steps, warmup_steps=spec.warmup_steps,
        random_until=spec.random_until,
        eval_interval=spec.eval_interval, eval_episodes=spec.eval_episodes,
        prng_impl=spec.prng_impl, should_stop=should_stop,
        vectorized_envs=spec.vectorized_envs, on_policy=spec.on_policy)
    while not should_stop():
      out = channel.acquire_slot(should_stop)
      if out is None or not actor.fill(out):
        break
      channel.commit()
  except BaseException:
    channel.set_error(
        f'actor {spec.actor_id} (members {list(spec.members)}, pid '
        f'{os.getpid()}) failed:\n{traceback.format_exc()}')
    raise
  finally:
    out = None  # drop the slot views before unmapping the channel
    if actor is not None:
      actor.close()
    if store is not None:
      store.close()
    channel.close()
