"""One run of the learning benchmark: a method of the suite on a task at
one seed, in this process, recorded as a result file (its returns, curve,
hyperparameters and lineages, with the command, machine, date and code
version it ran with)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
import tempfile
import time
from typing import Optional

import jax
import numpy as np

from benchmarks.learning.references import run_sb3, run_sync
from benchmarks.learning.store import result_path, set_aside_superseded
from benchmarks.learning.suite import (
    METHODS, ROLLOUT_SETTINGS, ZOO, agent_of, task_budget, zoo_flags)
from benchmarks.provenance import code_version, machine
from fastpbrl.config.agent_settings import agent_spec
from fastpbrl.logs.logging import (evaluation_points, read_member_csvs,
                                   read_rule_csv)
from fastpbrl.rules.pbt.lineage import LINEAGE, founders


def _curve(run_dir: str, eval_episodes: int, eval_every: int,
           field: str = 'episode_return') -> list:
  """``[(env_steps, best member's evaluation mean, population mean)]`` with
  evaluations binned to the ``eval_every`` grid (the final one at the
  budget), of ``field`` (``'true_objective'``: the env's own score)."""
  bins: dict[int, list[float]] = {}
  for rows in read_member_csvs(run_dir):
    seen = {}
    for steps, _, value in evaluation_points(rows, eval_episodes, field):
      seen[int(round(steps / eval_every) * eval_every)] = value
    for steps, value in seen.items():
      bins.setdefault(steps, []).append(value)
  return [(s, max(v), float(np.mean(v))) for s, v in sorted(bins.items())]


def scored_field(run_dir: str) -> str:
  """What a run's results are scored on: ``'true_objective'`` where every
  evaluation episode reports the env's own score (a shaped env's unshaped
  return, ``fastpbrl.envs.params``), else ``'episode_return'``."""
  rows = [r for member in read_member_csvs(run_dir) for r in member
          if r['evaluation'] == 'True']
  if rows and all(r.get('true_objective') not in (None, '') for r in rows):
    return 'true_objective'
  return 'episode_return'


def final_scores(run_dir: str, eval_episodes: int, field: str) -> list:
  """Each member's final evaluation (its last one) as the mean of
  ``field``."""
  return [evaluation_points(rows, eval_episodes, field)[-1][2]
          for rows in read_member_csvs(run_dir)]


def experiment_argv(args, task_name: str, method: str, seed: int,
                    run_dir: str) -> tuple[str, list]:
  """The experiment module a method of the suite runs
  (``experiments.<module>``) and its command line for ``task_name``'s
  budget (``task_budget``) and ``seed``, writing to ``run_dir``."""
  task = task_budget(args, task_name)
  module_name, extra = METHODS[method]
  if ZOO in extra:
    i = extra.index(ZOO)
    extra = extra[:i] + zoo_flags(task_name) + extra[i + 1:]
  argv = ['--env', task_name, '--seed', str(seed),
          '--population-size', str(args.population_size),
          '--env-steps', str(task.env_steps),
          '--eval-every', str(task.eval_every),
          '--eval-episodes', str(args.eval_episodes),
          '--checkpoint-every', '0', '--no-progress',
          '--run-dir', run_dir] + extra
  if agent_spec(agent_of(extra)).learns_from == 'replay':
    argv += ['--warmup-steps', str(task.warmup_steps)]
  elif task_name in ROLLOUT_SETTINGS and '--agent-settings' not in extra:
    argv += ['--agent-settings', *ROLLOUT_SETTINGS[task_name]]
  if module_name == 'cemrl':  # CEM-RL states its budget for the population
    i = argv.index('--env-steps')
    argv[i:i + 2] = ['--total-env-steps',
                     str(task.env_steps * args.population_size)]
  if module_name == 'pbt':
    argv += ['--ready-after', str(task.ready_after)]
  if module_name == 'hypertrick':
    argv += ['--phase-env-steps', str(task.phase_env_steps),
             '--num-phases', '4', '--num-workers',
             str(2 * args.population_size)]
  if module_name == 'dvd' and '--lambda-mode' not in extra:
    argv += ['--bandit-every', str(task.eval_every)]
  return module_name, argv


def run_fastpbrl(args, task_name: str, method: str, seed: int) -> dict:
  """One run of a method of ours (``experiment_argv``) in this process:
  the record of its result file, but for what ``run_one`` adds."""
  run_dir = os.path.join(tempfile.mkdtemp(prefix=f'fpbrl-bench-{method}-',
                                          dir=args.run_root), 'run')
  module_name, argv = experiment_argv(args, task_name, method, seed, run_dir)
  module = importlib.import_module(f'experiments.{module_name}')
  start = time.monotonic()
  result = module.main(argv)
  wall = time.monotonic() - start
  field = scored_field(run_dir)
  finals = (result.final_returns if field == 'episode_return' else
            final_scores(run_dir, args.eval_episodes, field))
  out = {
      # A shaped env's runs are scored on its true objective (``scored``);
      # their shaped returns are ``final_shaped_returns``.
      'final_returns': finals,
      'scored': field,
      'wall_time_s': wall,
      'env_steps': result.env_steps,
      'update_steps': result.update_steps,
      'hparams': result.hparams,
      'curve': _curve(run_dir, args.eval_episodes,
                      task_budget(args, task_name).eval_every, field),
      'command': f'python -m experiments.{module_name} ' + ' '.join(argv),
      'rule_scalars': getattr(result, 'rule_scalars', {}) or {},
      # The rule's scalars over the run (rule.csv): DvD's lambda and action
      # distance, whose last value alone depends on the bandit's last arm.
      'rule_curves': read_rule_csv(run_dir),
  }
  if field != 'episode_return':
    out['final_shaped_returns'] = result.final_returns
  out.update(_population_records(run_dir, args.population_size))
  return out


def _population_records(run_dir: str, population_size: int) -> dict:
  """What a rule's own logs add to a run's record: the lineages left at
  the end (``lineages_at_end``) and CEM-RL's mean policy's returns
  (``cem_mean_policy_curve``), where the run kept them."""
  out = {}
  lineages = lineages_at_end(run_dir)
  if lineages is not None:
    out['lineages_at_end'] = lineages
  mean_csv = os.path.join(run_dir, 'mean_policy.csv')
  if os.path.exists(mean_csv):
    curve = cem_mean_policy_curve(mean_csv, population_size)
    if curve:
      out['cem_mean_policy_return'] = curve[-1][1]
      out['cem_mean_policy_curve'] = curve
  return out


def lineages_at_end(run_dir: str) -> Optional[int]:
  """How many initial members' lines of weights a run's final population
  still holds (PBT's exploit ends lineages; 4 seeds keep 4), from the
  run's lineage file; None for a rule that keeps none, or a lineage it
  cannot follow (reported, so that the run's results are kept)."""
  path = os.path.join(run_dir, LINEAGE)
  if not os.path.exists(path):
    return None
  try:
    return len(set(founders(path).values()))
  except ValueError as e:
    print(f'{path}: lineages not counted: {e}', file=sys.stderr)
    return None


def cem_mean_policy_curve(path: str, population_size: int) -> list:
  """``[(env steps per member, return)]`` of CEM-RL's mean policy, one per
  generation, from the run's ``mean_policy.csv`` (its env steps count the
  whole population)."""
  with open(path) as f:
    header, *rows = f.read().splitlines()
  names = header.split(',')
  steps, ret = names.index('total_env_steps'), names.index('mean_policy_return')
  curve = []
  for row in rows:
    values = row.split(',')
    curve.append((int(values[steps]) // population_size, float(values[ret])))
  return curve


def run_one(args, task_name: str, method: str, seed: int) -> None:
  """Runs ``method`` on ``task_name`` at ``seed`` in this process (ours,
  SB3's or the synchronous loop) and writes its result file at
  ``result_path``, atomically, a superseded result set aside first."""
  path = result_path(args.out, task_name, method, seed, args.env_steps,
                     args.population_size)
  code = code_version()  # at the start: the code the run imports
  module_name, extra = METHODS[method]
  if module_name == 'sb3':
    out = run_sb3(args, task_name, extra[0], seed,
                  own_defaults='own-defaults' in extra, zoo=ZOO in extra)
  elif module_name == 'sync':
    out = run_sync(args, task_name, extra[0], seed)
  else:
    out = run_fastpbrl(args, task_name, method, seed)
  out.update(task=task_name, method=method, seed=seed,
             population_size=args.population_size,
             eval_episodes=args.eval_episodes,
             budget=dataclasses.asdict(task_budget(args, task_name)),
             machine=machine(), date=time.strftime('%Y-%m-%d'),
             code=code)
  device = learner_device()
  if device:
    out['device'] = device
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = path + '.tmp'
  with open(tmp, 'w') as f:
    json.dump(out, f, indent=1)
  set_aside_superseded(path)
  os.replace(tmp, path)  # atomic: a killed run leaves no half result


def learner_device() -> Optional[str]:
  """The accelerator JAX runs the learner on (``'NVIDIA H200 (learner)'``),
  or None where it runs on the CPU: a row's ``device``, since the CPU model
  of its ``machine`` does not say whether a GPU was there."""
  device = jax.devices()[0]
  return None if device.platform == 'cpu' else f'{device.device_kind} (learner)'


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------
