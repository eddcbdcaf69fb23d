"""The data path: what the run loop may ask of a source of data
(host-side; not jittable).

A data path turns the members' policies into what the learner learns
from, and tells the loop what happened on the way: finished episodes and
env steps. The loop (``fastpbrl.run.loop``), the rules, the logs and the
checkpoints talk to it only through :class:`DataPath`, so they never know
which path runs. ``fastpbrl.datapath.factory.create`` builds one.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from fastpbrl.core.types import EpisodeRecord, LearnerCall


class ReplayView(Protocol):
  """The replay as ``resume.Saver`` checkpoints it."""

  def state_dict(self) -> dict:
    """This process's rings, cut to the rows written."""

  @staticmethod
  def state_rows(state: dict) -> int:
    """Transitions a ``state_dict`` holds (0: nothing worth saving)."""


@runtime_checkable
class DataPath(Protocol):
  """What the run loop may ask of a source of data (see the module).

  Members are this process's rows, numbered from 0, unless a method says
  the whole population. A data path is built by :func:`create`, used by
  one thread (the loop's) and closed once with :meth:`close`.
  """

  replay: ReplayView
  """The replay as ``resume.Saver`` saves it (``state_dict``,
  ``state_rows``); a path without a replay gives an empty one."""

  restored_exactly: bool
  """True when a resume continued this path exactly (its envs, keys and
  policy versions: the rule's version marks stay valid)."""

  policy_version: int
  """The version of the newest policies written (read only)."""

  # --------------------------------------------------------- learning

  def learn(self, learner, state, hparams, actor_hparams, *,
            shared_critic: bool,
            should_stop: Optional[Callable[[], bool]] = None
            ) -> Optional[LearnerCall]:
    """Gets the next learner call's data, however this path gets it
    (waits for the replay, or steps the envs inside the call), and runs
    ``learner``'s call on ``state``; returns None, in every process, when
    ``should_stop()`` turned True in any while it waited.

    Args:
      learner: the run's learner (``fastpbrl.learner.population``).
      state, hparams: the population's training state and hyperparameters.
      actor_hparams: the hyperparameters ``agent.act`` reads (a path that
        acts inside the call acts with them).
      shared_critic: the rule's learner updates the population as a whole
        (CEM-RL, DvD): no member keeps or loses its own updates.
      should_stop: polled while waiting.
    """

  # --------------------------------------------------- what happened

  def drain_episodes(self) -> list[EpisodeRecord]:
    """Every episode finished since the last drain, oldest first."""

  @property
  def env_steps(self) -> np.ndarray:
    """``[local members]`` env steps collected per member since this path
    started (a resumed run's count from zero)."""

  def env_steps_per_member(self) -> int:
    """The fewest env steps any of this process's members collected."""

  def update_steps_owed(self, env_steps: int) -> int:
    """Update steps per member that the first ``env_steps`` env steps of
    each member (this path's count) earn at ``--update-to-data-ratio``
    and that the learner has not taken yet: at the end of the budget the
    loop takes them before it stops, so that a run ends with the update
    steps its data earned (a resumed run's refill and carried steps
    included)."""

  # -------------------------------------------------------- policies

  def publish(self, policy_params: Any, actor_hparams: Any) -> int:
    """The members' newest policies (this process's rows) for acting;
    waits until they are written, returns their version."""

  def publish_async(self, policy_params: Any, actor_hparams: Any) -> None:
    """:meth:`publish` off the caller's critical path."""

  def wait_published(self, timeout: Optional[float] = None) -> bool:
    """Waits until the newest ``publish_async`` is written (True), or
    ``timeout`` seconds passed (False)."""

  # ---------------------------------------------------- rule actions

  def copy_member_data(self, dst_indices: Sequence[int],
                       src_indices: Sequence[int]) -> None:
    """Member ``dst[k]`` gets member ``src[k]``'s data (PBT's exploit)."""

  def restart_members(self, members: Sequence[int]) -> None:
    """``members`` start over as new experiments: new episodes, no data,
    a warm-up; their updates are not kept until it is over."""

  # ------------------------------------------------- asked by rules

  def evaluate(self, policy_params: Any, actor_hparams: Any, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(returns, lengths, objectives)``, ``[N, episodes]`` each over the
    whole population: noise-free episodes of ``policy_params`` (this
    process's rows, acting with ``actor_hparams``, env parameters
    included), seeded from ``seed``; ``objectives`` are the env's true
    objective of each episode (NaN where it reports none). Works after :meth:`close` (the final
    evaluation)."""

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations visited by uniformly
    random actions from resets seeded by ``seed``: the same states for
    the same env and seed."""

  # --------------------------------------------- stats, checkpoints

  def wait_fraction(self) -> float:
    """Fraction of wall time the learner waited for data."""

  def checkpoint_state(self) -> Optional[dict]:
    """What a resume needs beside the replay to continue exactly (None:
    nothing)."""

  def close(self) -> None:
    """Stops everything the path started (idempotent)."""
