"""Which data path a run takes, and what that path means for the run's
settings (host-side; imports no path).

The one place that reads what an agent learns from
(``AgentSpec.learns_from``, ``Agent.learns_from``) together with the env's
kind. Generic code asks a :class:`PathKind` instead: whether the path keeps
a replay, whether members act at random for ``--warmup-steps`` first (and
again after a restart), and what a process holds of its members. The
factory (``fastpbrl.datapath.factory``) builds the path of the same kind;
the settings (``fastpbrl.config``) ask the kind which of them mean
something, so they sit above this module and below the paths.

==================  ==========  ==========  ================================
kind                env         learns      path
==================  ==========  ==========  ================================
``actor_replay``    gymnasium   replay      ``actor_replay.Pipeline``
``actor_rollouts``  gymnasium   rollout     ``actor_rollouts.ActorRollouts``
``device_replay``   JAX         replay      ``device_replay.DevicePipeline``
``device_rollouts`` JAX         rollout     ``device_rollouts.DeviceRollouts``
==================  ==========  ==========  ================================
"""

from __future__ import annotations

from typing import NamedTuple

from fastpbrl.envs.jax_envs import is_jax_env


class PathKind(NamedTuple):
  """What a data path is, as the rest of a run needs to know it."""

  name: str  # one of the table's kinds
  jax_env: bool  # envs stepped inside the learner's compiled call
  # Keeps a replay: refilled on resume, copied by an exploit, checkpointed
  # with --checkpoint-replay; --replay-capacity and --update-to-data-ratio
  # mean something. A path without one learns from rollouts of its newest
  # policies, one update step per env step.
  has_replay: bool

  @property
  def random_warmup(self) -> bool:
    """Whether members act at random for ``--warmup-steps`` env steps
    before they learn, and a restarted member again: the warm-up fills a
    replay, so the paths with one."""
    return self.has_replay

  @property
  def lives_here(self) -> str:
    """What a process holds of its members, for the log line."""
    where = 'their envs' if self.jax_env else 'their actors'
    if not self.has_replay:
      return where
    return where + (' and replay rings' if self.jax_env else ' and replay')

  def warmup_steps(self, warmup_steps: int) -> int:
    """The env steps of random actions a (re)started member takes, of the
    run's ``--warmup-steps``: none on a path without a random warm-up."""
    return int(warmup_steps) if self.random_warmup else 0


def kind_of(agent, env: str) -> PathKind:
  """The kind of the path that runs ``agent`` (an ``Agent`` or its
  ``AgentSpec``: anything with ``learns_from``) on ``env`` (an ``--env``
  id)."""
  jax_env = is_jax_env(env)
  replay = agent.learns_from != 'rollout'
  name = ('device_' if jax_env else 'actor_') + (
      'replay' if replay else 'rollouts')
  return PathKind(name=name, jax_env=jax_env, has_replay=replay)
