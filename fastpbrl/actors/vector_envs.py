"""Vectorized env batches: one numpy step for all of an actor's envs.

Host-side module (MuJoCo's C step, numpy; nothing here is jittable).

An actor steps one env per hosted member. Stepped in turn, each of
gymnasium's MuJoCo locomotion envs spends about 40% of its ``step`` in
Python (the reward, health check, observation and ``info`` of one env,
and the wrappers), and a classic-control env almost all of it. The
batches here keep the physics per env (MuJoCo's ``mj_step`` on each
env's own ``MjData``, or Pendulum's equations) and compute everything
else once for the ``[M, ...]`` batch with numpy, with gymnasium's
formulas and gymnasium's float types, so the results are gymnasium's
(``tests/test_env_batch.py`` compares them step by step).

Why not a library: EnvPool (C++ envs stepped by a thread pool) is not in
the package index this project installs from, so it cannot be a
dependency; gymnasium's vector API steps MuJoCo and
Pendulum envs one after another (``SyncVectorEnv``) or in one process
each (``AsyncVectorEnv``, which is what the actor processes already are);
only CartPole has a vectorized implementation there.

Which env gets which batch: :func:`make_batch` looks the unwrapped env's
class up in :data:`BATCHES`. An env with a wrapper other than those of
``gymnasium.make`` (time limit, order enforcing, env checker), or with a
render mode, gets :class:`~fastpbrl.actors.env_batch.SerialEnvs`, as
does every env without a batch. Adding one: subclass ``EnvBatch``, follow
the env's own ``step`` and add its class to ``BATCHES``; the contract
test then runs on it.

Departure from gymnasium, with no effect on what the agent sees: the
MuJoCo batches skip ``mj_rnePostConstraint`` after the physics step.
It fills the contact forces (``cfrc_ext``) that HalfCheetah, Hopper and
Walker2d neither observe nor reward, and no later step reads them.
Envs that do use them (Ant, Humanoid) have no batch here.
"""

from __future__ import annotations

from typing import Callable, Sequence

import gymnasium as gym
import mujoco
import numpy as np
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.envs.mujoco.half_cheetah_v5 import HalfCheetahEnv
from gymnasium.envs.mujoco.hopper_v5 import HopperEnv
from gymnasium.envs.mujoco.walker2d_v5 import Walker2dEnv

from fastpbrl.actors.env_batch import EnvBatch, EnvStep, SerialEnvs, stepped
from fastpbrl.envs import params as env_params

# The wrappers gymnasium.make adds; any other one may change what the env
# returns, so such an env is stepped serially.
_MAKE_WRAPPERS = (gym.wrappers.TimeLimit, gym.wrappers.OrderEnforcing,
                  gym.wrappers.PassiveEnvChecker)


def time_limit(env: gym.Env) -> int | None:
  """The ``max_episode_steps`` of ``env``'s ``TimeLimit`` wrapper (None
  without one)."""
  while isinstance(env, gym.Wrapper):
    if isinstance(env, gym.wrappers.TimeLimit):
      return int(env._max_episode_steps)  # noqa: SLF001 (no public getter)
    env = env.env
  return None


def _plain(env: gym.Env) -> bool:
  """Whether ``env`` has only ``gymnasium.make``'s wrappers and no render
  mode."""
  if env.render_mode is not None:
    return False
  while isinstance(env, gym.Wrapper):
    if not isinstance(env, _MAKE_WRAPPERS):
      return False
    env = env.env
  return True


class _TimeLimited(EnvBatch):
  """A vectorized batch: counts each env's steps for the time limit and
  reloads an env's state after its reset."""

  def __init__(self, envs: Sequence[gym.Env]):
    super().__init__(envs)
    self._raw = [env.unwrapped for env in self.envs]
    self._max_steps = time_limit(self.envs[0])
    self._elapsed = np.zeros(self.size, np.int64)

  def reset(self, j: int, seed: int | None = None) -> np.ndarray:
    obs = super().reset(j, seed)
    self._elapsed[j] = 0
    self._load(j)
    return obs

  def _load(self, j: int) -> None:
    """Copies env ``j``'s state into the batch's arrays after a reset."""
    raise NotImplementedError

  def _truncated(self, active: np.ndarray | None) -> np.ndarray:
    """Counts this step of the ``active`` envs (all by default); True
    where it reached the time limit (as ``TimeLimit``: also on a terminal
    step)."""
    self._elapsed += 1 if active is None else active
    if self._max_steps is None:
      return np.zeros(self.size, bool)
    return self._elapsed >= self._max_steps


class Locomotion(_TimeLimited):
  """gymnasium's MuJoCo runners (``*_v5``): reward = forward weight x
  forward velocity + healthy reward - control cost; the observation is
  ``qpos`` (without x unless asked) and ``qvel``, clipped for some."""

  velocity_clip: float | None = None  # bound of the observed qvel
  has_health = False  # a healthy reward and termination (Hopper, Walker2d)

  def __init__(self, envs: Sequence[gym.Env]):
    super().__init__(envs)
    u = self._raw[0]
    self._frame_skip, self._dt = u.frame_skip, u.dt
    self._skip = int(u._exclude_current_positions_from_observation)  # noqa: SLF001
    self._forward_weight = u._forward_reward_weight  # noqa: SLF001
    self._ctrl_weight = u._ctrl_cost_weight  # noqa: SLF001
    # Views of each env's MjData (a reset writes into the same MjData).
    self._ctrl = [r.data.ctrl for r in self._raw]
    self._qpos_views = [r.data.qpos for r in self._raw]
    self._qvel_views = [r.data.qvel for r in self._raw]
    self._qpos = np.stack(self._qpos_views)
    self._qvel = np.stack(self._qvel_views)
    # Flat views of the two, which one ``np.concatenate`` of the envs'
    # arrays fills (a C call; ``np.stack`` is Python around it).
    self._qpos_flat = self._qpos.reshape(-1)
    self._qvel_flat = self._qvel.reshape(-1)
    self._no_objective = np.full(self.size, np.nan)
    self._no_objective.flags.writeable = False

  def _load(self, j: int) -> None:
    self._qpos[j] = self._qpos_views[j]
    self._qvel[j] = self._qvel_views[j]

  def step(self, actions: np.ndarray,
           active: np.ndarray | None = None) -> EnvStep:
    x_before = self._qpos[:, 0].copy()
    for j in stepped(self.size, active):
      self._ctrl[j][:] = actions[j]
      mujoco.mj_step(self._raw[j].model, self._raw[j].data,
                     nstep=self._frame_skip)
    np.concatenate(self._qpos_views, out=self._qpos_flat)
    np.concatenate(self._qvel_views, out=self._qvel_flat)
    x_velocity = (self._qpos[:, 0] - x_before) / self._dt
    # As the envs' control_cost: in the actions' float type.
    ctrl_cost = self._ctrl_weight * np.square(actions).sum(axis=-1)
    reward = self._forward_weight * x_velocity
    terminated = np.zeros(self.size, bool)
    if self.has_health:
      healthy = self._healthy()
      reward = reward + healthy * self._raw[0]._healthy_reward  # noqa: SLF001
      terminated = ~healthy & self._raw[0]._terminate_when_unhealthy  # noqa: SLF001
    reward = reward - ctrl_cost
    return EnvStep(self._observation(), reward, terminated,
                   self._truncated(active), self._no_objective)

  def _observation(self) -> np.ndarray:
    velocity = self._qvel
    if self.velocity_clip is not None:
      velocity = np.clip(velocity, -self.velocity_clip, self.velocity_clip)
    return np.concatenate((self._qpos[:, self._skip:], velocity), axis=1)

  def _healthy(self) -> np.ndarray:
    raise NotImplementedError


class HalfCheetah(Locomotion):
  """``HalfCheetah-v5``: no health, no termination."""


class Hopper(Locomotion):
  """``Hopper-v5``: healthy while the state, height and angle are in
  their (open) ranges."""

  velocity_clip = 10.0
  has_health = True

  def _healthy(self) -> np.ndarray:
    u = self._raw[0]
    z, angle = self._qpos[:, 1], self._qpos[:, 2]
    state = np.concatenate((self._qpos, self._qvel), axis=1)[:, 2:]
    min_state, max_state = u._healthy_state_range  # noqa: SLF001
    min_z, max_z = u._healthy_z_range  # noqa: SLF001
    min_angle, max_angle = u._healthy_angle_range  # noqa: SLF001
    return (np.all((min_state < state) & (state < max_state), axis=1)
            & (min_z < z) & (z < max_z)
            & (min_angle < angle) & (angle < max_angle))


class Walker2d(Locomotion):
  """``Walker2d-v5``: healthy while the height and angle are in their
  (open) ranges."""

  velocity_clip = 10.0
  has_health = True

  def _healthy(self) -> np.ndarray:
    u = self._raw[0]
    z, angle = self._qpos[:, 1], self._qpos[:, 2]
    min_z, max_z = u._healthy_z_range  # noqa: SLF001
    min_angle, max_angle = u._healthy_angle_range  # noqa: SLF001
    return (min_z < z) & (z < max_z) & (min_angle < angle) & (angle < max_angle)


class Pendulum(_TimeLimited):
  """``Pendulum-v1``: gymnasium's equations on ``[M]`` angles and angular
  velocities."""

  def __init__(self, envs: Sequence[gym.Env]):
    super().__init__(envs)
    self._state = np.zeros((self.size, 2))  # set by each env's reset

  def _load(self, j: int) -> None:
    self._state[j] = self._raw[j].state

  def step(self, actions: np.ndarray,
           active: np.ndarray | None = None) -> EnvStep:
    u = self._raw[0]
    g, m, length, dt = u.g, u.m, u.l, u.dt
    th, thdot = self._state[:, 0], self._state[:, 1]
    torque = np.clip(actions, -u.max_torque, u.max_torque)[:, 0]
    costs = (_angle_normalize(th) ** 2 + 0.1 * thdot**2
             + 0.001 * (torque**2))
    new_thdot = thdot + (3 * g / (2 * length) * np.sin(th)
                         + 3.0 / (m * length**2) * torque) * dt
    new_thdot = np.clip(new_thdot, -u.max_speed, u.max_speed)
    new_th = th + new_thdot * dt
    state = np.stack([new_th, new_thdot], axis=1)
    self._state = (state if active is None else
                   np.where(active[:, None], state, self._state))
    obs = np.stack([np.cos(new_th), np.sin(new_th), new_thdot],
                   axis=1).astype(np.float32)
    return EnvStep(obs, -costs, np.zeros(self.size, bool),
                   self._truncated(active), np.full(self.size, np.nan))


def _angle_normalize(x: np.ndarray) -> np.ndarray:
  return ((x + np.pi) % (2 * np.pi)) - np.pi


# The unwrapped env classes that have a vectorized batch.
BATCHES: dict[type, Callable[[Sequence[gym.Env]], EnvBatch]] = {
    HalfCheetahEnv: HalfCheetah,
    HopperEnv: Hopper,
    Walker2dEnv: Walker2d,
    PendulumEnv: Pendulum,
}


def batch_kind(env: gym.Env, size: int, vectorized: bool = True
               ) -> Callable[[Sequence[gym.Env]], EnvBatch]:
  """The batch class for ``size`` envs like ``env``: its vectorized one
  from :data:`BATCHES` when ``vectorized`` is set and there are several
  envs, else ``SerialEnvs``. A batch of one env gains nothing: its numpy
  calls cost what the env's own Python does
  (``benchmarks/actor_throughput.py`` measured 0.85-0.9x)."""
  kind = BATCHES.get(type(env.unwrapped))
  if kind is None or not vectorized or size < 2 or not _plain(env) or (
      env_params.declared(env)):  # its parameters live in each env
    return SerialEnvs
  return kind


def make_batch(env_fn: Callable[[], gym.Env], size: int,
               vectorized: bool = True) -> EnvBatch:
  """``size`` envs from ``env_fn`` as one batch of :func:`batch_kind`."""
  envs = [env_fn() for _ in range(size)]
  return batch_kind(envs[0], size, vectorized)(envs)
