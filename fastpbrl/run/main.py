"""Running a population: ``run(config, rule)`` (host-side; not jittable).

    actors --transitions--> replay --prefetch--> learner call --params--> actors
                                                      |
                                              rule.decide  (PBT, CEM-RL, DvD,
                                                            HyperTrick, yours)

``run`` builds the run (``fastpbrl.run.build``), restores it on a resume
(``fastpbrl.run.resume``), opens the logs and the data path, hands them to the
loop (``fastpbrl.run.loop``), and ends with each member's final evaluation and
the summary (``fastpbrl.run.finish``). Whatever it opened is closed on the way
out, whatever fails: every actor process stopped, every shared-memory
segment released. The settings and their checks are ``fastpbrl.config``
(``checks.validate``); the rule contract is ``fastpbrl.rules.base``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging as std_logging
import os
import signal
from typing import Any, NamedTuple, Sequence

import numpy as np

from fastpbrl.actors.pool import exit_if_spawned_import, missing_main_guard
from fastpbrl.config.checks import validate
from fastpbrl.config.derived import resolved
from fastpbrl.config.errors import ConfigError, StorageError
from fastpbrl.config.fields import RunConfig
from fastpbrl.config.saved import INTERVAL_UNIT, check_resume, resume_command
from fastpbrl.datapath import factory as datapath
from fastpbrl.datapath.protocol import DataPath
from fastpbrl.logs.logging import (HParamsLog, RuleLog, RunLogger,
                                   write_json_atomic)
from fastpbrl.rules import registry
from fastpbrl.rules.base import Rule
from fastpbrl.run import build
from fastpbrl.run import finish
from fastpbrl.run import loop as loop_lib
from fastpbrl.run import resume
from fastpbrl.run.callbacks import Callback, Loop
from fastpbrl.run.checkpoint import CheckpointError, Checkpointer
from fastpbrl.run.signals import ForcedExit, RunInterrupted, StopRequest

log = std_logging.getLogger('fastpbrl')


class Built(NamedTuple):
  """A run's parts that exist before anything is opened."""

  config: RunConfig
  rule: Rule
  agent: Any
  env_spec: Any
  learner: Any
  processes: Any  # fastpbrl.devices.distributed.Processes
  run_dir: str


def run(config: RunConfig, rule: Rule,
        callbacks: Sequence[Callback] = ()) -> finish.RunResult:
  """Trains a population under ``rule``; returns the outcome.

  ``callbacks`` (``Callback`` instances) see the loop after every learner
  call and every rule decision. Besides the logs, the run writes
  ``final_returns.json`` (each member's final evaluation) and, at the end,
  the pictures of ``fastpbrl.run.plots``.

  With ``config.resume`` set, the run continues from the last checkpoint in
  that directory: the training state, the hyperparameters (as PBT left
  them, not the initial ones), the counters, the rule's state (its key
  among it) and, if it was checkpointed (``--checkpoint-replay``), the replay.
  The actors act with the restored policies from the first step; without a
  restored replay the learner waits until ``warmup_steps`` new steps per
  member refilled it, then takes the update steps the run had earned
  (``resume.carried_env_steps``), so that a resumed run ends with the update
  steps of a run never stopped. On the device, with the replay, the envs
  continue too: the resumed run is the run never stopped, bit for bit.

  SIGINT and SIGTERM (``fastpbrl.run.signals``) finish the call under way,
  write a checkpoint and raise ``RunInterrupted``; a second one raises
  ``ForcedExit`` at once. Either way every process is stopped and every
  shared-memory segment released.
  """
  exit_if_spawned_import('fastpbrl.run.main was called')
  problem = missing_main_guard()
  if problem is not None:
    raise ConfigError(problem)
  ref = registry.ref_of(type(rule))
  config = resolved(config)
  if config.resume:
    check_resume(config, ref)
  validate(config, rule.min_population)
  env_spec = build.make_env_spec(config.env)
  agent = build.make_agent(config, env_spec)
  rule.prepare(agent)
  mesh = build.population_mesh(config)
  processes = build.check_processes(config, rule, mesh)
  build.check_population_memory(config, agent, mesh)
  # Process 0 names the folder (claiming a new default one); the others
  # wait here, so they have all validated --run-dir before it is written.
  try:
    run_dir = processes.broadcast_text(
        (config.resume or config.run_dir or build.default_run_dir(
            rule.name, config.agent, config.env)) if processes.main else '')
    os.makedirs(run_dir, exist_ok=True)
  except OSError as e:  # what validate's os.access cannot see (root, races)
    raise ConfigError(f'--run-dir {e.filename!r}: cannot make the folder '
                      f'({e.strerror}); choose another directory') from None
  learner = rule.make_learner(agent, agent.config.steps_per_call,
                              **({} if mesh is None else {'mesh': mesh}))
  state, hparams, rule_state = build.initial_population(config, rule, agent,
                                                        learner)
  start = resume.Restored(state, hparams, rule_state, resume.FRESH_COUNTERS,
                          None)
  built = Built(config, rule, agent, env_spec, learner, processes, run_dir)
  try:
    return _train(built, start, callbacks)
  except ForcedExit as e:  # everything is closed by now
    raise ForcedExit(e.signum, (
        f'the earlier checkpoints in {run_dir}/checkpoints are intact; '
        f'resume with: {resume_command(ref, run_dir)}')) from None
  except CheckpointError as e:
    raise StorageError(f'{e}; free space, then resume with: '
                       f'{resume_command(ref, run_dir)}') from e
  except OSError as e:
    if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
      raise
    raise StorageError(
        f'writing {e.filename or "a log"} failed ({e.strerror}); the '
        f'checkpoints in {run_dir}/checkpoints are intact; free space, then '
        f'resume with: {resume_command(ref, run_dir)}') from e

def _train(built: Built, start: resume.Restored,
           callbacks: Sequence[Callback]) -> finish.RunResult:
  """``run`` from the initial population on.

  Over several processes (``processes.several``) this process runs the
  actors and replay of its own members (``processes.local``), turns its
  batches into global arrays for the one sharded learner call, and
  gathers from every process what a rule decision reads (episodes, env
  steps, a stop request), so every process takes the same decisions.
  Process 0 writes the run's logs in ``run_dir``; process ``p`` writes its
  own copy (lineage included, to check that they agree) in
  ``run_dir/processes/<p>``. Checkpoints are the whole population's,
  written once, in ``run_dir``.
  """
  config, rule, processes, run_dir = (built.config, built.rule,
                                      built.processes, built.run_dir)
  own_dir = run_dir if processes.main else os.path.join(
      run_dir, 'processes', str(processes.index))
  os.makedirs(own_dir, exist_ok=True)
  # Everything opened from here on is closed on the way out, whatever fails.
  with contextlib.ExitStack() as stack:
    stop = stack.enter_context(StopRequest())  # restored last
    checkpointer = Checkpointer(run_dir)
    stack.push(_closing(checkpointer.close))
    if config.resume:
      start = resume.restore(checkpointer, config, rule, built.env_spec,
                             built.learner, start, processes)
      done = finish.finished_before(config, rule, start, own_dir,
                                    checkpointer.latest_step())
      if done is not None:
        return done
      # What a stopped run wrote after its checkpoint is redone, not kept
      # twice.
      resume.truncate_logs(own_dir, start.log_sizes)
    write_config(built, own_dir)
    logger, hparams_log, rule_log = open_logs(stack, built, own_dir,
                                              start.counters)
    data = open_data_path(stack, built, start)
    start = start._replace(replay_state=None)  # the data path holds it now
    loop = make_loop(built, own_dir, start)
    rule_run = loop_lib.RuleRun(rule, start.rule_state,
                                config.population_size, own_dir)
    if data.restored_exactly:  # its policy versions continue
      rule_run.first_version[:] = start.counters['first_version']
      rule_run.marked_at[:] = start.counters['marked_at']
    saver = resume.Saver(checkpointer, config, rule_run, data, logger,
                         processes, run_dir, own_dir,
                         resumed_env_steps(built, start))
    data.publish(
        processes.local_view(built.learner.policy_params(loop.state)),
        processes.local_view(rule.actor_hparams(loop.hparams)))
    # Checkpoint 0 (a new run's): a run killed in its first learner call,
    # compiling, can be resumed too.
    saver.save(loop)
    parts = loop_lib.Parts(rule_run, built.learner, data, processes,
                           stop, logger, hparams_log, rule_log, saver,
                           callbacks)
    loop_lib.train(parts, loop)
    saver.save(loop)
    # After the checkpoint: a resume cuts them off and writes its own.
    loop_lib.write_last_rows(parts, loop)
    if processes.any(stop.requested):
      stack.callback(stop.disarm)  # runs first: the clean-up is not cut
      raise RunInterrupted(
          stop.signum or signal.SIGTERM, run_dir, loop.calls, loop.env_steps,
          resume_command(registry.ref_of(type(rule)), run_dir))
    stack.callback(stop.disarm)
    data.close()  # frees the cores for the final evaluation
    final_returns, final_objectives = finish.final_evaluation(
        loop, rule, logger, data, processes)
    finish.write_final_returns(loop, own_dir, checkpointer.latest_step(),
                               final_returns, final_objectives)
  outcome = finish.result(loop, rule, rule_run.state, logger, run_dir,
                          final_returns)
  if processes.main:  # process 0 summarises and draws
    finish.summarize(loop, rule, rule_run.state, run_dir, outcome)
  return outcome


def write_config(built: Built, own_dir: str) -> None:
  """``config.json`` (on a resume too, so that flags changed at the resume,
  a larger --env-steps, are what the next resume starts from), and the
  resolved settings in the log."""
  config, rule = built.config, built.rule
  write_json_atomic(os.path.join(own_dir, 'config.json'),
                    {'rule': registry.ref_of(type(rule)),
                     'not_resumable': rule.not_resumable,
                     'interval_unit': INTERVAL_UNIT,
                     **dataclasses.asdict(config)}, default=str)
  log.info('run %s: %s', built.run_dir,
           json.dumps(dataclasses.asdict(config), default=str))


def open_logs(stack: contextlib.ExitStack, built: Built, own_dir: str,
              counters: dict):
  """The run's ``RunLogger``, ``HParamsLog`` and ``RuleLog``, closed by
  ``stack``."""
  config, processes = built.config, built.processes
  n = config.population_size
  logger = RunLogger(own_dir, n, total_env_steps=config.env_steps * n,
                     initial_env_steps=counters['env_steps'] * n,
                     wall_time_offset=counters['wall_time'],
                     progress=config.progress and processes.main,
                     eval_episodes=config.eval_episodes,
                     purge_step=counters['env_steps'] if config.resume
                     else None,
                     track=config.track if processes.main else 'none',
                     config={'rule': built.rule.name,
                             **dataclasses.asdict(config)})
  stack.push(_closing(logger.close))
  hparams_log = HParamsLog(own_dir)
  stack.push(_closing(hparams_log.close))
  rule_log = RuleLog(own_dir)
  stack.push(_closing(rule_log.close))
  return logger, hparams_log, rule_log


def resumed_env_steps(built: Built, start: resume.Restored) -> np.ndarray:
  """``[N]`` env steps each member had at the checkpoint (0: a new run)."""
  counters = start.counters
  return np.asarray(counters.get(
      'member_env_steps',
      [counters['env_steps']] * built.config.population_size))


def open_data_path(stack: contextlib.ExitStack, built: Built,
                   start: resume.Restored) -> DataPath:
  """This process's data path (``datapath.create``: actors and replay, or
  JAX envs on the device), closed by ``stack``; a restored replay goes
  into it."""
  config = built.config
  # A run resumed before its first learner call starts as a new one would.
  resumed = bool(config.resume) and start.counters['calls'] > 0
  try:
    data = datapath.create(
        config, built.agent, built.learner,
        shared_replay=built.rule.shares_replay(),
        calls=start.counters['calls'], processes=built.processes,
        resume_env_steps=resumed_env_steps(built, start) if resumed else None,
        carried_env_steps=(resume.carried_env_steps(config, start.counters)
                           if resumed else 0.0),
        # The refill does not run past the budget (at least one step: the
        # replay is not empty): the learner then takes what the refilled
        # and the carried steps earned (loop.finished).
        refill_steps=min(config.warmup_steps, max(
            1, config.env_steps - start.counters['env_steps'])),
        replay_state=start.replay_state, saved_state=start.data_path_state)
  except ValueError as e:
    if str(e).startswith('--'):  # a setting refused once sizes are known
      raise ConfigError(str(e)) from None
    raise
  stack.callback(data.close)
  return data


def make_loop(built: Built, own_dir: str, start: resume.Restored) -> Loop:
  """The ``Loop`` (counters, state, hyperparameters) at the start's
  counters."""
  counters, n = start.counters, built.config.population_size
  loop = Loop(config=built.config, run_dir=own_dir, agent=built.agent,
              learner=built.learner, state=start.state,
              hparams=start.hparams, calls=counters['calls'],
              update_steps=counters['update_steps'],
              env_steps=counters['env_steps'],
              member_update_steps=np.asarray(counters.get(
                  'member_update_steps', [counters['update_steps']] * n),
                                             np.int64))
  loop.diverged = counters.get('diverged', 0)
  return loop


def _closing(close):
  """An ``ExitStack`` exit callback running ``close``; an I/O error of
  ``close`` while another exception is on its way out (a full disk fails
  every writer) does not replace that first, more telling one."""

  def callback(exc_type, exc, tb) -> bool:
    del exc_type, tb
    try:
      close()
    except OSError:
      if exc is None:
        raise
    return False

  return callback
