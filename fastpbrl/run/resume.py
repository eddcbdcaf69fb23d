"""A run's checkpoints: what is saved, and how a resume restores it
(host-side; not jittable).

A checkpoint (``fastpbrl.run.checkpoint.Checkpointer``: orbax, written once
for the whole population) holds the stacked training state, the
hyperparameters, the rule's state (a pytree of arrays, its key among
them), the counters, the byte sizes of the append-only logs and, with
``--checkpoint-replay``, the replay. Checkpoints written before rules kept
their state as a pytree (``RULE_FORMAT``) are refused with a message. ``restore`` reads it back into the
shapes of a freshly built run; ``Saver.save`` writes one from the loop.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.config.agent_settings import agent_spec
from fastpbrl.config.derived import path_kind
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.datapath.protocol import DataPath
from fastpbrl.logs.logging import HPARAMS_CSV, RULE_CSV
from fastpbrl.replay.buffers import (format_bytes, state_template,
                                     transition_fields)
from fastpbrl.rules.base import Rule
from fastpbrl.run.build import shard_state
from fastpbrl.run.callbacks import Loop
from fastpbrl.run.checkpoint import Checkpointer

log = logging.getLogger('fastpbrl')

# The layout of the rule's part of a checkpoint: 2 since the rule contract
# (a rule state pytree under 'rule'); before it, a driver's arrays and
# host values (no 'rule_format' in the meta).
RULE_FORMAT = 2


def state_version(meta: dict) -> int:
  """The rule state's layout (``Rule.state_version``) a checkpoint's
  ``meta`` was written with (1 before checkpoints recorded it)."""
  return int(meta.get('rule_state_version', 1))


# The counters of a run that has not taken a learner call yet.
FRESH_COUNTERS = {'calls': 0, 'update_steps': 0, 'env_steps': 0,
                  'wall_time': 0.0}


def carried_env_steps(config: RunConfig, counters: dict) -> np.ndarray:
  """``[N]``: each member's env steps before a resume that earned update
  steps the run had not taken yet at its checkpoint (in env steps: the
  rate limiter's ``carried_env_steps``).

  The learner keeps ``--update-to-data-ratio`` update steps per env step
  (less the warm-up's without ``--warmup-counts-as-data``); batches it had
  prefetched are lost with the stop. The resumed run takes those update
  steps after its refill, so that it ends with the update steps (and so
  the rule decisions) of a run never stopped.

  Counted from the loop's env steps at the checkpoint, from which the
  resumed loop counts its budget, not from the members' own counts
  (``member_env_steps``, where the actors go on from), which are a little
  ahead: the steps between are never counted toward the budget, so they
  earn nothing either, or the resumed run would end that many update
  steps past one never stopped.
  """
  n = config.population_size
  uncounted = 0 if config.warmup_counts_as_data else config.warmup_steps
  earned = np.full(n, counters['env_steps'] - uncounted, np.float64)
  taken = counters['update_steps'] / config.update_to_data_ratio
  return np.maximum(earned - taken, 0.0)


def log_sizes(run_dir: str, rule_files: tuple = ()) -> dict:
  """Byte sizes of the run's append-only logs (member CSVs, the
  hyperparameter and rule CSVs, the files the rule appends to), stored in
  each checkpoint."""
  members = os.path.join(run_dir, 'members')
  names = [os.path.join('members', f) for f in sorted(
      os.listdir(members))] if os.path.isdir(members) else []
  names += [HPARAMS_CSV, RULE_CSV, *rule_files]
  return {name: os.path.getsize(os.path.join(run_dir, name)) for name in names
          if os.path.exists(os.path.join(run_dir, name))}


def truncate_logs(run_dir: str, sizes: dict) -> None:
  """Cuts the logs back to their sizes at the checkpoint being resumed: what
  a killed run wrote after it is redone by the resumed run, not kept twice."""
  for name, size in sizes.items():
    path = os.path.join(run_dir, name)
    if os.path.exists(path) and os.path.getsize(path) > size:
      with open(path, 'r+b') as f:
        f.truncate(size)


def own_log_sizes(meta: dict, index: int) -> dict:
  """The sizes of process ``index``'s logs at a checkpoint with ``meta``
  (before several processes had their own, only process 0's were kept)."""
  sizes = meta.get('process_log_sizes')
  if sizes is not None and index < len(sizes):
    return sizes[index]
  return meta.get('log_sizes', {}) if index == 0 else {}


class Restored(NamedTuple):
  """A run as its last checkpoint left it."""

  state: Any  # stacked training state, on the learner's mesh
  hparams: Any  # stacked hyperparameters, on the learner's mesh
  rule_state: Any  # the rule's state (its key among it)
  counters: dict  # calls, update_steps, env_steps, wall_time, per member
  replay_state: Optional[Any]  # the replay, if the checkpoint holds it
  # This process's log sizes at the checkpoint (``truncate_logs``).
  log_sizes: Optional[dict] = None
  # The data path's own state (``DevicePipeline.checkpoint_state``), if
  # the checkpoint holds it.
  data_path_state: Optional[dict] = None


def restore(checkpointer: Checkpointer, config: RunConfig, rule: Rule,
            env_spec, learner, fresh: Restored, processes) -> Restored:
  """The last checkpoint of ``config.resume``, read into the shapes of
  ``fresh`` (the newly built run), with the sizes this process's logs had
  then (the run cuts them back with ``truncate_logs`` once it knows it
  trains on: a finished run's final evaluation is kept)."""
  if checkpointer.latest_step() is None:
    raise ConfigError(
        f'--resume {config.resume!r}: no complete checkpoint there (the run '
        'was stopped before its first one); start it again without --resume')
  saved_meta = checkpointer.restore_meta()
  if (saved_meta.get('rule_format') != RULE_FORMAT
      or state_version(saved_meta) != rule.state_version):
    raise ConfigError(
        f'--resume {config.resume!r}: its checkpoint was written by an '
        f'earlier fastpbrl, whose {rule.name} rule kept its state another '
        'way; start a new run (or finish this one with that version)')
  replay_template = process_replay = None
  if config.checkpoint_replay and saved_meta.get('has_replay'):
    process_replay = restore_process_replay(checkpointer, config, saved_meta,
                                            processes)
    if process_replay is None:
      replay_template = state_template(
          'shared' if rule.shares_replay() else 'per_member',
          transition_fields(env_spec), config.population_size,
          saved_meta['replay_rows'])
  try:
    state, extra, meta = checkpointer.restore(
        fresh.state, {'hparams': fresh.hparams, 'rule': fresh.rule_state},
        replay_template=replay_template)
  except ValueError as e:  # orbax: "Structure mismatch: ... 'policy_delay'"
    check_renamed_hparams(config, str(e))
    raise
  if process_replay is not None:
    meta['replay'] = process_replay
  state = jax.tree.map(jnp.asarray, state)
  hparams = jax.tree.map(jnp.asarray, extra['hparams'])
  state, hparams = shard_state(learner, state, hparams)
  rule_state = rule.resumed(like(fresh.rule_state, extra['rule']))
  counters = meta['counters']
  replay_state = meta.get('replay')
  # The data path decides whether its state continues it exactly: the
  # replay path's needs its replay too, a path without one does not.
  data_path_state = (checkpointer.restore_data_path()
                     if meta.get('has_data_path') else None)
  # A path without a replay (rollouts) has none to refill.
  keeps_replay = path_kind(config).has_replay
  log.info('resumed %s at call %d (%d env steps per member)%s', config.resume,
           counters['calls'], counters['env_steps'],
           '' if replay_state is not None or not keeps_replay else
           (', replay refilled by the restored policies'
            + (' (this checkpoint holds no replay)'
               if config.checkpoint_replay else '')))
  return Restored(state, hparams, rule_state, counters, replay_state,
                  own_log_sizes(meta, processes.index), data_path_state)


def check_renamed_hparams(config: RunConfig, error: str) -> None:
  """Raises ``ConfigError`` if ``error`` (orbax's refusal of a checkpoint
  whose structure differs) names a hyperparameter the agent has renamed
  since (``register(..., renamed_hparams=...)``: TD3's ``policy_delay``)."""
  renamed = agent_spec(config.agent).renamed_hparams
  old = [name for name in renamed if f"'{name}'" in error]
  if old:
    raise ConfigError(
        f'--resume {config.resume!r}: its checkpoint was written before '
        f'hyperparameter {old[0]} was renamed (fastpbrl info '
        f'{config.agent}); start a new run, or finish this one with the '
        'fastpbrl that began it')


def restore_process_replay(checkpointer: Checkpointer, config: RunConfig,
                           saved_meta: dict, processes) -> Optional[dict]:
  """This process's replay of a checkpoint written over several processes
  (None for one written by one process, whose replay orbax restores);
  refused unless the run resumes over as many processes, each with the
  members it had."""
  # None: in the orbax checkpoint, saved by one process.
  files = saved_meta.get('replay_processes')
  saved = files or 1
  if saved != processes.count:
    raise ConfigError(
        f'--resume {config.resume!r}: its replay was saved by {saved} '
        f'process{"es" if saved > 1 else ""} and this run has '
        f'{processes.count}; resume over {saved}, or add '
        '--no-checkpoint-replay to refill the replay instead')
  if files is None:
    return None
  try:
    return checkpointer.restore_process_replay(processes.local)
  except (OSError, ValueError) as e:
    raise ConfigError(f'--resume {config.resume!r}: {e}; resume with the '
                      'processes and devices of the saving run, or add '
                      '--no-checkpoint-replay to refill the replay') from None


def like(template: Any, restored: Any) -> Any:
  """``restored`` with each leaf the kind of array ``template``'s is
  (numpy stays numpy, jax stays jax, same dtype)."""

  def cast(want, got):
    if isinstance(want, jax.Array):
      return jnp.asarray(got, want.dtype)
    return np.asarray(got, np.asarray(want).dtype)

  return jax.tree.map(cast, template, restored)


@dataclasses.dataclass
class Saver:
  """Writes the run's checkpoints from the loop.

  ``resumed_env_steps`` is each member's env steps at the start of this
  process's data path (zero for a new run): the data path counts from
  zero.
  """

  checkpointer: Checkpointer
  config: RunConfig
  rule_run: Any  # fastpbrl.run.loop.RuleRun
  data: DataPath  # the replay view, env steps and checkpoint_state
  logger: Any  # fastpbrl.logs.logging.RunLogger (its wall time)
  processes: Any  # fastpbrl.devices.distributed.Processes
  run_dir: str  # the run's folder, where the checkpoints go
  own_dir: str  # where this process writes its logs
  resumed_env_steps: np.ndarray  # [N]

  def save(self, loop: Loop) -> None:
    """A checkpoint at call ``loop.calls``, unless one exists already."""
    if self.checkpointer.latest_step() == loop.calls:
      return  # already saved at this call (e.g. the last call, or resumed
              # from a finished run): orbax refuses a step twice
    self.checkpointer.check_space()
    replay = (self.data.replay.state_dict()
              if self.config.checkpoint_replay else None)
    if replay is not None and not self.data.replay.state_rows(replay):
      replay = None  # empty (checkpoint 0): orbax saves no empty array
    start = time.monotonic()
    member_steps = (self.resumed_env_steps
                    + self.processes.members(self.data.env_steps))
    # Each process's own logs (process p's copies in processes/<p>).
    sizes = [json.loads(text) for text in self.processes.gather_text(
        json.dumps(log_sizes(self.own_dir,
                             self.rule_run.rule.outputs().files)))]
    self.checkpointer.save(
        loop.calls, loop.state,
        {'hparams': loop.hparams, 'rule': self.rule_run.state},
        {'counters': {'calls': loop.calls, 'update_steps': loop.update_steps,
                      'member_update_steps': loop.member_update_steps.tolist(),
                      'env_steps': loop.env_steps,
                      'member_env_steps': member_steps.tolist(),
                      'diverged': loop.diverged,
                      'wall_time': self.logger.wall_time,
                      # The policy versions the rule's marks refer to
                      # (kept by a data path that restores its versions).
                      'first_version': self.rule_run.first_version.tolist(),
                      'marked_at': self.rule_run.marked_at.tolist()},
         'rule_format': RULE_FORMAT, 'rule': self.rule_run.rule.name,
         'rule_state_version': self.rule_run.rule.state_version,
         'log_sizes': sizes[0], 'process_log_sizes': sizes,
         'replay_rows': (None if replay is None else
                         self.data.replay.state_rows(replay))},
        replay=replay,
        replay_members=(self.processes.local if self.processes.several
                        else None),
        data_path=self.data.checkpoint_state())
    # Named by learner call; the env steps are in its meta's counters.
    log.info('checkpoint %d (learner call) at %d env steps per member%s '
             'written in %.1f s', loop.calls, loop.env_steps,
             '' if replay is None else ' with replay ({})'.format(
                 format_bytes(sum(x.nbytes for x in jax.tree.leaves(replay)))),
             time.monotonic() - start)
