"""What every data path shares, whichever family runs it (host-side; not
jittable): the data path's settings (``PipelineConfig``, one mapping from
a run's flags in ``fastpbrl.datapath.factory.pipeline_config``), the
replay of a path without one (``NoReplay``) and the learner's call on a
batch with its members' kept updates (``replay_call``).

The two families build on it: gymnasium envs stepped by actor processes
(``fastpbrl.datapath.actor_family``) and JAX envs stepped inside the
learner's compiled call (``fastpbrl.datapath.device_family``).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fastpbrl.core.types import LearnerCall
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import LAYOUTS


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Static settings of a data path (every path reads the ones that apply
  to it; each path's constructor says which)."""

  num_steps: int = 50
  """Update steps per learner call ``S`` (the learner's ``num_steps``)."""
  batch_size: int = 256
  """Transitions per member per update step ``B``."""
  layout: str = 'per_member'
  """Replay layout: ``per_member`` (PBT, seeds) or ``shared`` (CEM-RL, DvD)."""
  replay_capacity: int = 1_000_000
  """Transitions per ring (per member, or in total for ``shared``)."""
  update_to_data_ratio: float = 1.0
  """Update steps per collected env step, per member (the limiter's cap)."""
  warmup_steps: int | tuple[int, ...] = 10_000
  """Random-action env steps per member before learning (int or N ints)."""
  warmup_counts_as_data: bool = True
  """Whether the warm-up's env steps count toward the update-to-data ratio
  (True: the learner catches up right after the warm-up; False: updates
  start at zero there, as in TD3's and SB3's reference loops)."""
  refill_steps: int | None = None
  """A resume without its replay: env steps per member the restored
  policies collect before learning goes on (None: ``warmup_steps``; the
  run passes what is left of its budget when that is less)."""
  max_env_steps_ahead: int | None = None
  """Env steps a member's actor may run ahead of the learner's needs before
  its data is held back and it blocks; None: ``(prefetch_depth + 2) *
  ceil(num_steps / update_to_data_ratio) + chunk_steps``. At least
  ``ceil(num_steps / update_to_data_ratio) + chunk_steps``."""
  num_actor_processes: int | None = None
  """Actor processes ``P``; default: ``fastpbrl.actors.default_num_processes``
  (available cores minus one; every core on the on-policy path), at most N."""
  chunk_steps: int = 32
  """Env steps per member an actor sends in one chunk."""
  queue_chunks: int = 8
  """Chunks an actor's channel holds before the actor blocks."""
  prefetch_depth: int = 2
  """Learner calls' batches sampled ahead."""
  eval_interval: int = 0
  """Training env steps per member between evaluations (0: none)."""
  eval_episodes: int = 1
  """Noise-free episodes per evaluation."""
  max_actor_restarts: int = 3
  """Restarts per actor process before its death stops the run."""
  stall_timeout_s: float = 300.0
  """``next_batch`` raises if no transitions arrived for this long."""
  prng_impl: str = 'threefry2x32'
  """``jax.random`` implementation of the actors' exploration keys."""
  vectorized_envs: bool = True
  """Actors step their envs as one vectorized batch where
  ``fastpbrl.actors.vector_envs`` has one."""
  max_episode_records: int = 100_000
  """Undrained episode records kept (the oldest are dropped beyond)."""
  shutdown_grace_s: float = 5.0
  """Seconds actors get to stop on ``close`` before SIGKILL."""
  actor_hang_timeout_s: float | None = 120.0
  """An actor alive but without a heartbeat for this long is killed and
  restarted like a dead one (None: never)."""
  replay_location: str = 'auto'
  """``host`` (numpy, sampled by the prefetch thread), ``device`` (sampled
  inside the learner call) or ``auto`` (``choose_replay_location``)."""

  def validate(self, num_members: int) -> None:
    """Raises ValueError naming the first setting out of its range."""

    def need(ok: bool, name: str, allowed: str):
      if not ok:
        raise ValueError(f'{name} must be {allowed}; got '
                         f'{getattr(self, name)!r}')

    need(self.num_steps >= 1, 'num_steps', '>= 1')
    need(self.batch_size >= 1, 'batch_size', '>= 1')
    need(self.layout in LAYOUTS, 'layout', f'one of {LAYOUTS}')
    need(self.replay_location in device_replay.LOCATIONS, 'replay_location',
         f'one of {device_replay.LOCATIONS}')
    need(self.replay_capacity >= 1, 'replay_capacity', '>= 1')
    need(np.isfinite(self.update_to_data_ratio)
         and self.update_to_data_ratio > 0, 'update_to_data_ratio',
         'in (0, inf)')
    warmup = np.asarray(self.warmup_steps)
    need(warmup.ndim == 0 or warmup.shape == (num_members,), 'warmup_steps',
         f'an int or {num_members} ints (one per member)')
    need(bool((warmup >= 0).all()), 'warmup_steps', '>= 0')
    need(self.num_actor_processes is None
         or 1 <= self.num_actor_processes <= num_members,
         'num_actor_processes', f'None or in [1, {num_members}]')
    need(self.chunk_steps >= 1, 'chunk_steps', '>= 1')
    need(self.queue_chunks >= 1, 'queue_chunks', '>= 1')
    need(self.prefetch_depth >= 1, 'prefetch_depth', '>= 1')
    need(self.eval_interval >= 0, 'eval_interval', '>= 0')
    need(self.eval_episodes >= 1, 'eval_episodes', '>= 1')
    need(self.max_actor_restarts >= 0, 'max_actor_restarts', '>= 0')
    need(self.stall_timeout_s > 0, 'stall_timeout_s', '> 0')
    need(self.max_episode_records >= 1, 'max_episode_records', '>= 1')
    need(self.shutdown_grace_s >= 0, 'shutdown_grace_s', '>= 0')
    need(self.actor_hang_timeout_s is None or self.actor_hang_timeout_s > 0,
         'actor_hang_timeout_s', 'None or > 0')
    least = self.steps_per_call_in_env_steps() + self.chunk_steps
    need(self.max_env_steps_ahead is None or self.max_env_steps_ahead >= least,
         'max_env_steps_ahead',
         f'None or >= ceil(num_steps / update_to_data_ratio) + chunk_steps = '
         f'{least} (else the learner could starve)')

  def steps_per_call_in_env_steps(self) -> int:
    """Env steps per member one learner call needs at the target ratio."""
    return int(np.ceil(self.num_steps / self.update_to_data_ratio))

  def env_steps_ahead(self) -> int:
    """``max_env_steps_ahead`` with the default resolved."""
    if self.max_env_steps_ahead is not None:
      return self.max_env_steps_ahead
    return ((self.prefetch_depth + 2) * self.steps_per_call_in_env_steps()
            + self.chunk_steps)


class NoReplay:
  """The replay of a path without one: nothing to checkpoint."""

  layout = 'none'

  def state_dict(self) -> dict:
    return {}

  @staticmethod
  def state_rows(state: dict) -> int:
    del state
    return 0


def replay_call(learner, state, hparams, batch,
                active: np.ndarray | None) -> LearnerCall:
  """The learner's call on ``batch`` (a replay's batch, a device replay's
  key, or the actors' rollout), for every path that does not step its envs
  inside the call: ``active`` (``[N]`` bool) members keep their update
  (those warming up after a restart keep their state), or ``None``: the
  shared critic's population update, which counts as no member's own."""
  if active is None:
    state, metrics = learner.update(state, hparams, batch)
    n = len(jax.tree.leaves(hparams)[0])
    return LearnerCall(state, metrics, np.zeros(n, np.int64))
  state, metrics = learner.update(state, hparams, batch, active)
  return LearnerCall(state, metrics, learner.num_steps * active)
