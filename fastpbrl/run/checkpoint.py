"""Checkpoints of a whole run (host-side; not jittable).

Built on orbax-checkpoint's ``CheckpointManager``: each save is written to a
temporary directory and renamed into place only once complete, so a run
killed mid-save leaves the previous checkpoint intact, and ``--resume`` always
finds a whole one. A checkpoint holds

* ``state``: the stacked training state (every member's parameters, targets,
  optimizer states, keys, step counters) — any pytree;
* ``extra``: further array pytrees (hyperparameters, rule state, RNG keys);
* ``meta``: JSON (counters, config, host-side rule bookkeeping).

* ``data_path`` (where the data path can give it: the on-device envs of
  one process): the envs' states, keys and counters as numpy
  (``DevicePipeline.checkpoint_state``), so a resume with the replay
  continues the run exactly;
* ``replay`` (only with ``--checkpoint-replay``): the replay's contents
  (``Replay.state_dict``), in the same atomic step as the rest, so a resumed
  run continues with the data the killed run had at that call. Over several
  processes each holds only its own members' replay, which orbax (writing
  host numpy from process 0 alone) cannot save, so each process writes its
  own file beside the checkpoint instead (:class:`ProcessReplayFiles`).

Replay is off by default: a population of 80 members with 1M transitions
each would be tens of GB per checkpoint. Without it a resumed run refills
the replay with its restored policies before learning again.

Temporary directories of a save that was killed (``*.orbax-checkpoint-tmp*``)
are removed when the next run opens the folder; they never count as a
checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Optional, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from fastpbrl.devices.sharding import whole_value

# Beside ``checkpoints``: each process's replay of each kept checkpoint
# (``ProcessReplayFiles``), in a folder orbax does not manage.
REPLAY_FILES = 'checkpoint_replays'


class CheckpointError(RuntimeError):
  """A checkpoint could not be written (e.g. the disk is full); the
  previous one is intact (orbax renames a save into place only when whole)."""


def describe_io_error(error: BaseException) -> str:
  """A short reason for an I/O failure (tensorstore's messages run to
  kilobytes): the errno's text when there is one."""
  text = str(error)
  for errno_text in ('No space left on device', 'Disk quota exceeded',
                     'Read-only file system', 'Permission denied'):
    if errno_text in text:
      return errno_text
  first = text.splitlines()[0] if text else type(error).__name__
  return first[:200]


def remove_unfinished_saves(directory: str) -> list[str]:
  """Deletes the temporary directories of saves that never completed (a
  run killed mid-save); returns their names. Done here rather than by
  orbax's ``cleanup_tmp_directories``, which runs in the background with no
  public way to wait for it; one run owns its checkpoint folder."""
  if not os.path.isdir(directory):
    return []
  removed = []
  for name in sorted(os.listdir(directory)):
    if ocp.utils.TMP_DIR_SUFFIX in name:
      shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
      removed.append(name)
  return removed


def _flat(tree: dict, prefix: str = '') -> dict[str, np.ndarray]:
  """``{'data': {'reward': x}, 'pos': y}`` as ``{'data/reward': x, 'pos': y}``."""
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flat(value, f'{prefix}{key}/'))
    else:
      out[f'{prefix}{key}'] = np.asarray(value)
  return out


def _nested(flat: dict[str, np.ndarray]) -> dict:
  """The inverse of ``_flat``."""
  out: dict = {}
  for key, value in flat.items():
    *parents, leaf = key.split('/')
    node = out
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  return out


class ProcessReplayFiles:
  """Each process's replay for each checkpoint of a run over several
  processes, as ``<run>/checkpoint_replays/<step>/process_<p>.npz``
  (host-side).

  A process writes its file (to a temporary name, then renamed, so a file
  is always whole) before the checkpoint's orbax save, and all processes
  meet at a barrier between the two: a checkpoint that orbax completed
  has every process's file. A file records the members it holds, so a
  resume over another split of the population is refused rather than
  given the wrong rings. Files of steps that orbax no longer keeps, or
  whose save never completed, are removed after each save.

  numpy's ``.npz`` rather than orbax here: orbax's multi-process saving
  writes host arrays from one process, while each process's replay is
  its own data.
  """

  def __init__(self, run_dir: str, index: int):
    self.root = os.path.join(os.path.abspath(run_dir), REPLAY_FILES)
    self.index = index

  def path(self, step: int) -> str:
    return os.path.join(self.root, str(step), f'process_{self.index}.npz')

  def write(self, step: int, replay: dict, members: slice) -> None:
    """Writes ``replay`` (a ``Replay.state_dict()``) of the members
    ``members`` for checkpoint ``step``."""
    path = self.path(step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + '.partial'
    with open(partial, 'wb') as f:
      np.savez(f, members=np.asarray([members.start, members.stop],
                                     np.int64), **_flat(replay))
    os.replace(partial, path)

  def read(self, step: int, members: slice) -> dict:
    """This process's replay of checkpoint ``step``.

    Raises:
      FileNotFoundError: if the checkpoint has no file for this process.
      ValueError: if the file holds other members than ``members``.
    """
    with np.load(self.path(step)) as f:
      flat = {k: f[k] for k in f.files}
    saved = flat.pop('members').tolist()
    if saved != [members.start, members.stop]:
      raise ValueError(
          f'the replay this process saved at checkpoint {step} holds '
          f'members {saved[0]}-{saved[1] - 1}, this process runs '
          f'{members.start}-{members.stop - 1}')
    return _nested(flat)

  def prune(self, keep: Sequence[int]) -> None:
    """Removes this process's files of the steps not in ``keep``, and the
    step folders left empty."""
    if not os.path.isdir(self.root):
      return
    for name in os.listdir(self.root):
      if name.isdigit() and int(name) in keep:
        continue
      folder = os.path.join(self.root, name)
      for suffix in ('', '.partial'):
        path = os.path.join(folder, f'process_{self.index}.npz{suffix}')
        if os.path.exists(path):
          os.remove(path)
      try:
        os.rmdir(folder)
      except OSError:
        pass  # another process's file is still there

  def nbytes(self, step: int) -> int:
    """Bytes of this process's file of checkpoint ``step`` (0 if none)."""
    path = self.path(step)
    return os.path.getsize(path) if os.path.exists(path) else 0


class Checkpointer:
  """Saves and restores run checkpoints under ``directory/checkpoints``."""

  def __init__(self, directory: str, max_to_keep: int = 2):
    self.directory = os.path.abspath(os.path.join(directory, 'checkpoints'))
    self.removed_tmp = remove_unfinished_saves(self.directory)
    self._failed = False
    self.replay_files = ProcessReplayFiles(directory, jax.process_index())
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep,
                                             create=True))

  def save(self, step: int, state: Any, extra: Any, meta: dict,
           replay: Optional[dict] = None,
           replay_members: Optional[slice] = None,
           data_path: Optional[dict] = None) -> None:
    """Writes checkpoint ``step`` and waits until it is complete on disk.

    ``replay``: a ``Replay.state_dict()`` to store with it (or None).
    ``replay_members``: over several processes, the members this process's
    ``replay`` holds; it then goes to this process's own file
    (``ProcessReplayFiles``) rather than into the orbax checkpoint.
    ``data_path``: a nested dict of numpy arrays (``DevicePipeline.
    checkpoint_state``), read back by :meth:`restore_data_path`.
    """
    # Host copies: the learner donates the device state on its next call.
    # Over several processes each gathers the whole population (a rule's
    # state is small) and orbax writes it once, from process 0.
    state, extra = jax.tree.map(whole_value, (state, extra))
    files = replay is not None and replay_members is not None
    items = dict(state=ocp.args.StandardSave(state),
                 extra=ocp.args.StandardSave(extra),
                 meta=ocp.args.JsonSave({
                     **meta, 'has_replay': replay is not None,
                     'has_data_path': data_path is not None,
                     # Set where each process saved its own file.
                     **({'replay_processes': jax.process_count()} if files
                        else {})}))
    if replay is not None and not files:
      items['replay'] = ocp.args.StandardSave(replay)
    if data_path is not None:
      items['data_path'] = ocp.args.StandardSave(data_path)
    try:
      if files:
        self.replay_files.write(step, replay, replay_members)
        # Every process's file is in place before orbax completes the step.
        multihost_utils.sync_global_devices(f'fastpbrl replay files {step}')
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
      self._manager.wait_until_finished()
      if files:
        self.replay_files.prune(self._manager.all_steps())
    except Exception as e:  # orbax/tensorstore report I/O errors as ValueError
      self._failed = True
      # orbax's writer tasks that failed too are reported by asyncio when
      # collected, after the run's own message: the same error, many times.
      logging.getLogger('asyncio').setLevel(logging.CRITICAL)
      raise CheckpointError(
          f'writing checkpoint {step} under {self.directory} failed '
          f'({describe_io_error(e)}); the checkpoint of call '
          f'{self.latest_step()} is intact') from e

  def check_space(self, margin: float = 1.5, extra: int = 1 << 20) -> None:
    """Raises ``CheckpointError`` before a save that would not fit: less
    free space than ``margin`` times the latest checkpoint plus ``extra``
    bytes (nothing to compare with before the first save)."""
    step = self.latest_step()
    if step is None:
      return
    size = self.replay_files.nbytes(step)
    for root, _, files in os.walk(os.path.join(self.directory, str(step))):
      size += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    free = shutil.disk_usage(self.directory).free
    if free < margin * size + extra:
      raise CheckpointError(
          f'only {free / 2**20:.1f} MiB free under {self.directory}, a '
          f'checkpoint takes about {size / 2**20:.1f} MiB (No space left on '
          f'device); the checkpoint of call {step} is intact')

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def restore_meta(self, step: Optional[int] = None) -> dict:
    """The JSON part of checkpoint ``step`` (the latest by default)."""
    step = self._step(step)
    return self._manager.restore(step, args=ocp.args.Composite(
        meta=ocp.args.JsonRestore())).meta

  def restore(self, state_template: Any, extra_template: Any,
              step: Optional[int] = None,
              replay_template: Optional[dict] = None) -> tuple[Any, Any, dict]:
    """Restores ``(state, extra, meta)`` shaped like the templates; with
    ``replay_template`` (``Replay.state_template``) also the replay, as
    ``meta['replay']``.

    Raises:
      FileNotFoundError: if the directory holds no complete checkpoint.
    """
    step = self._step(step)

    def as_abstract(tree):
      return jax.tree.map(
          lambda x: x if isinstance(x, jax.ShapeDtypeStruct) else
          ocp.utils.to_shape_dtype_struct(  # shape and dtype, no copy
              np.broadcast_to(np.zeros((), np.asarray(x).dtype
                                       if not hasattr(x, 'dtype') else
                                       x.dtype), np.shape(x))), tree)

    items = dict(state=ocp.args.StandardRestore(as_abstract(state_template)),
                 extra=ocp.args.StandardRestore(as_abstract(extra_template)),
                 meta=ocp.args.JsonRestore())
    if replay_template is not None:
      items['replay'] = ocp.args.StandardRestore(as_abstract(replay_template))
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    meta = dict(restored.meta)
    if replay_template is not None:
      meta['replay'] = jax.tree.map(np.asarray, restored.replay)
    return restored.state, restored.extra, meta

  def restore_data_path(self, step: Optional[int] = None) -> dict:
    """The ``data_path`` item of checkpoint ``step`` (the latest by
    default), as the numpy arrays it was saved as."""
    restored = self._manager.restore(self._step(step), args=ocp.args.Composite(
        data_path=ocp.args.StandardRestore()))
    return jax.tree.map(np.asarray, restored.data_path)

  def restore_process_replay(self, members: slice,
                             step: Optional[int] = None) -> dict:
    """This process's replay of checkpoint ``step`` (the latest by
    default), saved with ``replay_members`` (``ProcessReplayFiles.read``)."""
    return self.replay_files.read(self._step(step), members)

  def _step(self, step: Optional[int]) -> int:
    step = self.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(
          f'no complete checkpoint under {self.directory}: nothing to resume '
          'from (start a new run without --resume)')
    return step

  def close(self) -> None:
    try:
      self._manager.close()
    except Exception:
      if not self._failed:
        raise
      # close() re-raises the failed save's error, reported already.

