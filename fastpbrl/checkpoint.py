"""Checkpoints of a whole run (host-side; not jittable).

Built on orbax-checkpoint's ``CheckpointManager``: each save is written to a
temporary directory and renamed into place only once complete, so a run
killed mid-save leaves the previous checkpoint intact, and ``--resume`` always
finds a whole one. A checkpoint holds

* ``state``: the stacked training state (every member's parameters, targets,
  optimizer states, keys, step counters) — any pytree;
* ``extra``: further array pytrees (hyperparameters, rule state, RNG keys);
* ``meta``: JSON (counters, config, host-side rule bookkeeping).

Replay buffers are not part of a checkpoint (a population of 80 members with
1M transitions each would be tens of GB); a resumed run refills them with a
fresh warm-up. The README says so.
"""

from __future__ import annotations

import os
from typing import Any, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves and restores run checkpoints under ``directory/checkpoints``."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(os.path.join(directory, 'checkpoints'))
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                             create=True))

  def save(self, step: int, state: Any, extra: Any, meta: dict) -> None:
    """Writes checkpoint ``step`` and waits until it is complete on disk."""
    # Host copies: the learner donates the device state on its next call.
    state, extra = jax.tree.map(np.asarray, (state, extra))
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        extra=ocp.args.StandardSave(extra),
        meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def restore(self, state_template: Any, extra_template: Any,
              step: Optional[int] = None) -> tuple[Any, Any, dict]:
    """Restores ``(state, extra, meta)`` shaped like the templates.

    Raises:
      FileNotFoundError: if the directory holds no complete checkpoint.
    """
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(
          f'no complete checkpoint under {self.directory}: nothing to resume '
          'from (start a new run without --resume)')
    as_abstract = lambda t: jax.tree.map(ocp.utils.to_shape_dtype_struct, t)  # noqa: E731
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(as_abstract(jax.tree.map(np.asarray, state_template))),
        extra=ocp.args.StandardRestore(as_abstract(jax.tree.map(np.asarray, extra_template))),
        meta=ocp.args.JsonRestore()))
    return restored.state, restored.extra, restored.meta

  def close(self) -> None:
    self._manager.close()
