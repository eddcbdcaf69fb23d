"""The end of a run: each member's final evaluation, the result and the
summary (host-side; not jittable)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import math
import os
from typing import Optional

import numpy as np

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.devices.distributed import Processes
from fastpbrl.logs.logging import (FINAL_RETURNS, evaluation_points,
                                   plot_returns, read_final_returns,
                                   read_member_csvs, summary_table,
                                   write_json_atomic)
from fastpbrl.rules.base import Rule
from fastpbrl.run import plots
from fastpbrl.run.callbacks import Loop

log = logging.getLogger('fastpbrl')


@dataclasses.dataclass
class RunResult:
  run_dir: str
  best_return: float  # best evaluation mean of any member during the run
  env_steps: int
  update_steps: int
  calls: int
  hparams: list  # final per-member hyperparameters (dicts)
  wall_time: float
  # Per member: mean return of --eval-episodes noise-free episodes of its
  # final policy, played after the budget (``final_evaluation``).
  final_returns: list = dataclasses.field(default_factory=list)
  rule_scalars: dict = dataclasses.field(default_factory=dict)  # at the end
  diverged: int = 0  # member divergences (NaN/Inf) replaced during the run
  # The member with the highest final return (None without a final
  # evaluation), as ``fastpbrl.load_policy(run_dir)`` picks it.
  best_member: Optional[int] = None
  # The population's env steps (env_steps x members) per second of
  # wall_time (a resumed run's included).
  env_steps_per_second: float = 0.0


def final_evaluation(loop: Loop, rule: Rule, logger, data, processes=None
                     ) -> tuple[list[float], Optional[list[float]]]:
  """Evaluates every member's final policy (``--eval-episodes`` noise-free
  episodes each, seeded from the run seed), logs the episodes as one whole
  evaluation per member at the budget's env steps, and returns the means of
  the returns and of the true objective (None where the env reports no
  objective).

  The periodic evaluations run in the actors alongside training and end
  wherever the budget cuts them; this one always exists, so a run whose
  budget holds no ``--eval-every`` boundary still reports a result. The
  data path plays them (``DataPath.evaluate``: on the host for gymnasium
  envs, every episode at once on the device for a JAX env); it may be
  closed already.
  """
  config = loop.config
  if processes is None:
    processes = Processes(None, config.population_size)
  # Each process plays its own members (seeded by their population index);
  # every process then has everyone's returns.
  params = processes.local_view(loop.learner.policy_params(loop.state))
  hparams = processes.local_view(rule.actor_hparams(loop.hparams))
  returns, lengths, objectives = data.evaluate(
      params, hparams, config.eval_episodes, config.seed)
  logger.drop_partial_evaluations()
  logger.episodes(
      [EpisodeRecord(member=m, episode_return=float(returns[m, k]),
                     episode_length=int(lengths[m, k]), evaluation=True,
                     env_steps=loop.env_steps, policy_version=-1,
                     start_policy_version=-1,
                     true_objective=float(objectives[m, k]))
       for m in range(returns.shape[0]) for k in range(returns.shape[1])],
      loop.env_steps, loop.update_steps)
  logger.finish_progress(loop.env_steps * config.population_size,
                         final='evaluated')
  means = [float(x) for x in returns.mean(axis=1)]
  log.info('final evaluation (%d episodes per member at %d env steps): %s',
           config.eval_episodes, loop.env_steps,
           ', '.join(f'{x:.1f}' for x in means))
  objectives = np.asarray(objectives, np.float64)
  if np.isnan(objectives).all():
    return means, None
  objective_means = [float(x) for x in objectives.mean(axis=1)]
  log.info('final true objective: %s',
           ', '.join(f'{x:.1f}' for x in objective_means))
  return means, objective_means


def write_final_returns(loop: Loop, run_dir: str, checkpoint_step,
                        final_returns: list[float],
                        final_objectives: Optional[list[float]] = None
                        ) -> None:
  """``final_returns.json``: each member's final evaluation, with what
  produced it; ``final_true_objectives`` too where the env reports its
  true objective (a shaped env's returns are the shaped ones)."""
  config = loop.config
  final = {'env_steps': loop.env_steps, 'eval_episodes': config.eval_episodes,
           'seed': config.seed, 'checkpoint_step': checkpoint_step,
           'final_returns': final_returns}
  if final_objectives is not None:
    final['final_true_objectives'] = final_objectives
  write_json_atomic(os.path.join(run_dir, FINAL_RETURNS), final)


def result(loop: Loop, rule: Rule, rule_state, logger, run_dir: str,
           final_returns: list[float]) -> RunResult:
  """The run's ``RunResult``. Over several processes every process must
  call it (the hyperparameters are gathered)."""
  wall_time = logger.wall_time
  population_steps = loop.env_steps * loop.config.population_size
  return RunResult(run_dir=run_dir, best_return=logger.best_return,
                   env_steps=loop.env_steps, update_steps=loop.update_steps,
                   calls=loop.calls, hparams=rule.hparam_rows(loop.hparams),
                   wall_time=wall_time, final_returns=final_returns,
                   rule_scalars=rule.scalars(rule_state),
                   diverged=loop.diverged,
                   best_member=best_of(final_returns),
                   env_steps_per_second=throughput(population_steps,
                                                   wall_time))


def best_of(final_returns: list[float]) -> Optional[int]:
  """The member with the highest final return (None without any)."""
  if not final_returns:
    return None
  return max(range(len(final_returns)), key=final_returns.__getitem__)


def throughput(population_steps: int, wall_time: float) -> float:
  """The population's env steps per second of ``wall_time``."""
  return population_steps / wall_time if wall_time > 0 else 0.0


def totals(outcome: RunResult, population_size: int,
           eval_episodes: int = 1, member_update_steps=None) -> str:
  """The summary's lines under the member table: the best member (by its
  final evaluation, else by its best evaluation), env and update steps,
  wall time and throughput."""
  points = [evaluation_points(rows, eval_episodes)
            for rows in read_member_csvs(outcome.run_dir)]
  best_eval = [max((p[2] for p in member), default=float('nan'))
               for member in points]
  lines = []
  best = outcome.best_member
  if best is None and any(p for p in points):
    best = max((i for i, p in enumerate(points) if p),
               key=best_eval.__getitem__)
  if best is not None:
    returns = ([f'final evaluation {outcome.final_returns[best]:.1f}']
               if outcome.final_returns else [])
    if best < len(best_eval) and math.isfinite(best_eval[best]):
      returns.append(f'best evaluation {best_eval[best]:.1f}')
    hparams = (json.dumps({k: float(f'{v:.4g}')
                           for k, v in outcome.hparams[best].items()})
               if best < len(outcome.hparams) and outcome.hparams[best]
               else '')
    lines.append(f'best member: {best} ({", ".join(returns)}) '
                 f'{hparams}'.rstrip())
  lines.append(f'env steps: {outcome.env_steps} per member (least over '
               f'members), {outcome.env_steps * population_size} in all')
  kept = ('' if member_update_steps is None
          or len(set(member_update_steps)) <= 1 else
          f'; kept by each: {list(member_update_steps)}')
  lines.append(f'update steps: {outcome.update_steps} per member in '
               f'{outcome.calls} learner calls{kept}')
  # Written at the end, named by learner call (``resume.Saver``).
  lines.append(f'last checkpoint: checkpoints/{outcome.calls} (learner call '
               f'{outcome.calls}, {outcome.env_steps} env steps per member)')
  clock = datetime.timedelta(seconds=round(outcome.wall_time))
  lines.append(f'wall time: {outcome.wall_time:.1f} s ({clock})')
  lines.append(f'env steps per second: {outcome.env_steps_per_second:.1f} '
               '(the population\'s, over the wall time)')
  return '\n'.join(lines)


def summarize(loop: Loop, rule: Rule, rule_state, run_dir: str,
              outcome: RunResult) -> None:
  """Writes ``summary.txt`` and the pictures (``fastpbrl.run.plots``) of the
  finished run and prints the summary (process 0 only: ``outcome``, with
  the final hyperparameters, is gathered beforehand by every process)."""
  eval_episodes = loop.config.eval_episodes
  table = summary_table(run_dir, outcome.hparams, eval_episodes=eval_episodes)
  kept = loop.member_update_steps
  table += '\n' + totals(outcome, loop.config.population_size, eval_episodes,
                         None if kept is None else [int(x) for x in kept])
  extra = rule.summary(rule_state, run_dir)
  if loop.diverged:
    extra = (extra + '\n' if extra else '') + (
        f'{loop.diverged} member divergences (NaN/Inf) were replaced')
  with open(os.path.join(run_dir, 'summary.txt'), 'w') as f:
    f.write(table + '\n' + (extra + '\n' if extra else ''))
  plot = plot_returns(run_dir, eval_episodes=eval_episodes)
  pictures = [os.path.basename(p) for p in [plot] + plots.plot_run(
      run_dir, space=rule.space, outputs=rule.outputs())]
  print(table)
  if extra:
    print(extra)
  print(f'logs, checkpoints and {", ".join(pictures)} in {run_dir}')


def finished_before(config, rule: Rule, start, run_dir: str,
                    checkpoint_step) -> RunResult | None:
  """The result of a resumed run that has nothing left to train: its budget
  (``--env-steps``, which a resume may raise) spent, or its rule done, and
  its final evaluation written at its last checkpoint. None otherwise.

  ``start`` is the ``fastpbrl.run.resume.Restored`` run. Nothing is started:
  the result is read from the run's files, and a line says so.
  """
  counters = start.counters
  spent = (counters['env_steps'] >= config.env_steps
           or rule.finished(start.rule_state))
  try:
    final = read_final_returns(run_dir)
  except FileNotFoundError:
    return None
  if not spent or final.get('checkpoint_step') != checkpoint_step:
    return None
  n = config.population_size
  log.warning('%s is finished (%d of --env-steps %d per member): nothing '
              'left to train; resume with a larger --env-steps to train '
              'longer', run_dir, counters['env_steps'], config.env_steps)
  means = [p[2] for rows in read_member_csvs(run_dir)
           for p in evaluation_points(rows, config.eval_episodes)]
  returns, wall_time = final['final_returns'], counters['wall_time']
  return RunResult(
      run_dir=run_dir, best_return=max(means, default=float('nan')),
      env_steps=counters['env_steps'], update_steps=counters['update_steps'],
      calls=counters['calls'], hparams=rule.hparam_rows(start.hparams)[:n],
      wall_time=wall_time, final_returns=returns,
      rule_scalars=rule.scalars(start.rule_state),
      diverged=counters.get('diverged', 0), best_member=best_of(returns),
      env_steps_per_second=throughput(counters['env_steps'] * n, wall_time))
