"""Learning benchmark: each population rule against N default seeds.

For every task of the suite, every method and every benchmark seed, one run
at a fixed env-step budget per member; then a table (per task and method:
the best member's final evaluation and the population's mean final
evaluation, mean and spread over seeds, wall time) and a plot of the best
member's evaluation return against env steps per member.

Methods:

* ``seeds-td3``, ``seeds-sac``: the baseline, ``--population-size``
  independent members at the agent's published defaults
  (``experiments.seeds``): what N default runs give at once;
* ``seeds-td3-no-catch-up``: the TD3 baseline with
  ``--no-warmup-counts-as-data``: updates start at zero when the warm-up
  ends, one per env step after it, as in the reference TD3 and SB3 loops,
  where the default lets the learner catch up right after the warm-up on
  its random-action data;
* ``seeds-td3-no-catch-up-low-lag``: the same with ``--steps-per-call 10``,
  so the actors act with a policy fewer update steps old (a policy is
  published after each learner call, and the actors run at most
  ``(prefetch depth + 2) x steps per call + 32`` env steps ahead of the
  learner): the policy-lag half of the comparison with SB3's synchronous
  loop;
* ``pbt-td3``, ``pbt-sac``: PBT over the same number of members;
  ``pbt-ttest-td3``: PBT whose exploit is Jaderberg et al.'s T-test
  selection (a member copies the one it drew only where Welch's test
  separates their returns), which keeps lineages apart while their
  returns are within noise of each other; ``pbt-no-copy-td3``: PBT's whole
  path (its rule, decisions and lineage log) with every member at the
  defaults and no copy (``--min-gap-absolute 1e9``), so that it differs
  from the baseline only in the path, never in what it decides: a gap
  between it and ``seeds-td3`` is the path's, a gap between it and
  ``pbt-td3`` the decisions';
* ``cemrl``: CEM-RL (its score is the CEM mean policy's return, reported in
  its own column; the members' finals are reported like the others');
* ``dvd``, ``dvd-no-diversity``: DvD-TD3 and the same shared-critic TD3
  with the diversity weight fixed at 0 (the diversity figure compares them);
  ``dvd-best-round``: DvD-TD3 whose lambda bandit scores a round by its
  best evaluation episode instead of the population mean;
  ``dvd-relative-gain``: DvD-TD3 whose bandit rewards a round's gain above
  the recent median gain instead of the paper's improvement;
  ``dvd-sigma-0.3``: DvD-TD3 with the kernel length scale 0.3 instead of
  1, so the term relaxes once members act about as far apart as freshly
  initialised policies do;
* ``hypertrick``: HyperTrick's search over the same slots;
* ``random-td3``, ``random-ppo``: random search from the prior, PBT's
  control arm in Jaderberg et al. 2017 (``experiments.random``): each
  member's hyperparameters drawn once from the agent's search space, the
  draws ``pbt --init-hparams prior`` starts from, and never changed; its
  baseline is ``seeds-<agent>``, and its final values give the share at
  the edges that draws alone put there;
* ``sync-td3``: our TD3 agent in a plain synchronous loop (one env step
  per member, then one update, from the warm-up's end; no actor
  processes, rate limiter or prefetch), to tell a gap to SB3 in the data
  path from one in the agent;
* ``sb3-td3``, ``sb3-sac`` (``.[torch]`` extra, which installs
  Stable-Baselines3): the single-agent reference, one SB3 agent per member
  slot with the same seeds, budget, warm-up, network sizes and evaluation
  episodes as the baseline, so "best of N SB3 seeds" is comparable to "best
  of N of our seeds";
* ``sb3-td3-own-defaults``: SB3's TD3 with SB3's own defaults, to tell a gap
  in the implementation from one in the settings;
* ``seeds-ppo``, ``pbt-ppo``, ``pbt-pb2-ppo``: on-policy members (PPO at
  Stable-Baselines3's defaults), through the actors on gymnasium tasks and
  on the device on JAX ones; ``sb3-ppo``: SB3's PPO at the same defaults,
  one agent per member slot, as ``sb3-td3``. A method whose agent cannot
  act in a task (TD3 on CartPole's discrete actions) is skipped there;
* ``random-ppo``, ``pbt-prior-ppo``, ``pbt-pb2-prior-ppo``: random search
  from the prior, and PBT and PB2 started from the same prior draws.

The report ends with the papers' comparison at larger populations
(``population_summary``): per cell of ``POPULATION_CELLS``, PBT and PB2
from the same prior against random search and against default seeds, a
sentence per task on what wins and the goal's line; then the same for
PBT and PB2 from near the defaults.

Every result lands in ``--out`` as one JSON per run
(``runs/<task>/<method>/seed<k>.json``), so an interrupted benchmark
continues where it stopped (existing results are kept unless ``--redo``;
a result that a later fix superseded is run again, and moved to
``superseded/`` beside it rather than overwritten); ``report`` rebuilds
the table and plot from them. Each run's own folder
(logs, TensorBoard events, per-member returns) is kept for inspection in a
new folder under ``--run-root`` (default: the system's temporary
directory); nothing there is needed by the table.

Usage::

  python -m benchmarks.learning                          # the whole suite
  python -m benchmarks.learning --tasks Pendulum-v1 --methods seeds-td3 pbt-td3 --seeds 0 1
  python -m benchmarks.learning --report-only

Host-side code: subprocesses, files, the table and the plot. Each run is a
fresh process (``python -m benchmarks.learning --one ...``), so one run's
actors, memory and JIT caches never touch the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple, Optional

import gymnasium
import jax
import numpy as np

from benchmarks import stats
from fastpbrl import agents as agents_lib
from fastpbrl import build, jax_envs
from fastpbrl.config import ConfigError, agent_spec
from fastpbrl.rules.pbt import pb2
from fastpbrl.rules.pbt.lineage import LINEAGE, founders


@dataclasses.dataclass(frozen=True)
class Task:
  """A task of the suite and the budgets it is run at."""

  env_steps: int  # per member
  warmup_steps: int  # random-action steps per member first
  eval_every: int  # env steps per member between evaluations
  ready_after: int  # PBT: env steps per member between decisions
  phase_env_steps: int  # HyperTrick: env steps per member per phase


TASKS = {
    'Pendulum-v1': Task(20_000, 1_000, 2_000, 2_500, 5_000),
    # The same task in JAX (gymnax), stepped on the device inside the
    # learner call: its rows check that the two data paths learn alike.
    'gymnax:Pendulum-v1': Task(20_000, 1_000, 2_000, 2_500, 5_000),
    'InvertedPendulum-v5': Task(10_000, 1_000, 1_000, 1_250, 2_500),
    'Hopper-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    'HalfCheetah-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    # Held-out: no default of an agent or a rule was chosen on these; they
    # take Hopper's and HalfCheetah's budgets, untuned.
    'Walker2d-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    'Ant-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
}
HELD_OUT = ('Walker2d-v5', 'Ant-v5', 'gymnax:MountainCarContinuous-v0')
# Members per run unless --population-size says otherwise; runs at another
# size are stored and reported apart (``result_path``, ``cell_of``).
DEFAULT_POPULATION = 4
# Discrete-action tasks for the on-policy rows (PPO): no warm-up, and
# evaluations and PBT decisions at whole multiples of PPO's default
# iteration of 2,048 env steps per member.
TASKS.update({
    'CartPole-v1': Task(100_000, 0, 10_240, 20_480, 25_600),
    'gymnax:CartPole-v1': Task(500_000, 0, 20_480, 61_440, 122_880),
    # Brax (the brax extra), on the device; its rollout-agent rows act as
    # Brax's own PPO does (ROLLOUT_SETTINGS), at multiples of that
    # iteration's 2,048 env steps per member.
    'brax:inverted_pendulum': Task(524_288, 0, 65_536, 131_072, 131_072),
    # The larger on-device populations (16 PPO members, 2^20 env steps
    # each): gymnax:Pendulum-v1 above at --env-steps 1048576 (its
    # evaluations every 104,857 steps, decisions every 131,072), and these
    # two with the same decisions. MountainCarContinuous is held out.
    'gymnax:Acrobot-v1': Task(1_048_576, 0, 65_536, 131_072, 262_144),
    'gymnax:MountainCarContinuous-v0': Task(1_048_576, 0, 65_536, 131_072,
                                            262_144),
})
# Static settings of rollout agents (PPO) per task, where the agent's own
# defaults (SB3's: one env, 2,048-step rollouts) do not fit how the task's
# users run it. Brax's PPO steps thousands of envs at once in short unrolls
# over normalised observations (brax/training/agents/ppo); this is that
# layout scaled to a CPU (64 envs x 32 steps, 4 epochs of minibatches of
# 512). The hyperparameters stay the agent's defaults: nothing is tuned to
# the task.
ROLLOUT_SETTINGS = {
    'brax:inverted_pendulum': (
        'num_envs=64', 'rollout_length=32', 'batch_size=512', 'epochs=4',
        'normalize_observations=True'),
}
# Reward shaping searched as an env parameter (fastpbrl.shaping): gymnax's
# MountainCar-v0 with an energy bonus whose weight is env_energy_bonus
# (default 0: no shaping), scored on the unshaped return. Fixed before its
# runs.
TASKS['shaped:MountainCar-v0'] = Task(196_608, 0, 16_384, 32_768, 65_536)
# PureJaxRL's layout for gymnax tasks (its ppo.py: 4 envs x 128 steps,
# 4 epochs of 4 minibatches), the way gymnax's users run PPO; fixed before
# the 16-member runs. gymnax:CartPole-v1 keeps SB3's, as its rows were run.
GYMNAX_LAYOUT = ('num_envs=4', 'rollout_length=128', 'batch_size=128',
                 'epochs=4')
ROLLOUT_SETTINGS.update({name: GYMNAX_LAYOUT for name in (
    'gymnax:Pendulum-v1', 'gymnax:Acrobot-v1',
    'gymnax:MountainCarContinuous-v0')})
# MountainCar's velocity is about a hundredth of its position's scale: its
# PPO users normalise observations (rl-baselines3-zoo's MountainCar entry).
ROLLOUT_SETTINGS['shaped:MountainCar-v0'] = GYMNAX_LAYOUT + (
    'normalize_observations=True',)

# rl-baselines3-zoo's tuned PPO settings (``hyperparams/ppo.yml``, its
# HalfCheetah and Hopper entries, written for v3/v4 and taken unchanged for
# v5), as SB3's
# keyword arguments; ``normalize`` is VecNormalize of observations and
# rewards with the agent's gamma, as the zoo wraps it. A method whose flags
# hold ``ZOO`` takes these for its task (``zoo_flags``, ``sb3_zoo_model``).
ZOO = '@zoo'
ZOO_PPO = {
    'HalfCheetah-v5': dict(
        normalize=True, n_steps=512, batch_size=64, gamma=0.98,
        learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
        n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
        log_std_init=-2.0, ortho_init=False, activation='relu',
        net_arch=(256, 256)),
    'Hopper-v5': dict(
        normalize=True, n_steps=512, batch_size=32, gamma=0.999,
        learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
        n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671,
        log_std_init=-2.0, ortho_init=False, activation='relu',
        net_arch=(256, 256)),
}
# SB3 keyword -> our PPO's traced hyperparameter, and -> its static setting.
ZOO_HPARAMS = {'learning_rate': 'learning_rate', 'gamma': 'discount',
               'ent_coef': 'ent_coef', 'clip_range': 'clip_range',
               'gae_lambda': 'gae_lambda', 'max_grad_norm': 'max_grad_norm',
               'vf_coef': 'vf_coef'}
ZOO_SETTINGS = {'n_steps': 'rollout_length', 'batch_size': 'batch_size',
                'n_epochs': 'epochs', 'log_std_init': 'log_std_init',
                'ortho_init': 'ortho_init', 'activation': 'activation'}


def zoo_flags(task_name: str) -> list:
  """Our CLI flags for ``ZOO_PPO[task_name]``."""
  zoo = ZOO_PPO[task_name]
  hparams = [f'{ours}={zoo[theirs]!r}' for theirs, ours in ZOO_HPARAMS.items()]
  settings = [f'{ours}={zoo[theirs]}' for theirs, ours in ZOO_SETTINGS.items()]
  settings += [f'normalize_observations={zoo["normalize"]}',
               f'normalize_rewards={zoo["normalize"]}']
  return (['--hparams', *hparams, '--agent-settings', *settings,
           '--hidden-sizes', *map(str, zoo['net_arch'])])


METHODS = {
    # name: (experiment module, extra flags)
    'seeds-td3': ('seeds', ['--agent', 'td3']),
    'pbt-td3': ('pbt', ['--agent', 'td3']),
    # The 2022 paper's explore: every hyperparameter of a copy redrawn.
    'pbt-resample-td3': ('pbt', ['--agent', 'td3', '--explore', 'resample']),
    # PB2 (Parker-Holder et al. 2020): a GP bandit chooses a copy's values.
    'pbt-pb2-td3': ('pbt', ['--agent', 'td3', '--explore', 'pb2']),
    # Jaderberg et al.'s T-test selection instead of truncation.
    'pbt-ttest-td3': ('pbt', ['--agent', 'td3', '--exploit', 'ttest']),
    # PBT's path with nothing decided: every member at the defaults, and a
    # fitness gap no member reaches, so no copy and no explore.
    'pbt-no-copy-td3': ('pbt', ['--agent', 'td3', '--init-hparams',
                                'defaults', '--min-gap-absolute', '1e9']),
    # Today's PBT with one replay for all members: each learns from every
    # member's transitions (as CEM-RL's and DvD's shared critic does).
    'pbt-shared-td3': ('pbt', ['--agent', 'td3', '--shared-replay']),
    # The baseline with one replay for all members: what sharing alone gives.
    'seeds-shared-td3': ('seeds', ['--agent', 'td3', '--shared-replay']),
    # The baseline with the update accounting of TD3's and SB3's reference
    # loops: no catch-up on the warm-up's data (see ``sb3-td3``).
    'seeds-td3-no-catch-up': ('seeds', ['--agent', 'td3',
                                        '--no-warmup-counts-as-data']),
    # The same with a tenth of the policy lag: 10 update steps per learner
    # call (a policy published every 10 updates, actors at most 72 env steps
    # ahead of the learner's needs) instead of 50 (every 50, 232 ahead).
    'seeds-td3-no-catch-up-low-lag': ('seeds', [
        '--agent', 'td3', '--no-warmup-counts-as-data',
        '--steps-per-call', '10']),
    # The baseline with PyTorch's initialisation (SB3's) instead of haiku's
    # (Acme's): the one difference left between our TD3 and SB3's.
    'seeds-td3-torch-init': ('seeds', ['--agent', 'td3',
                                       '--network-init', 'torch']),
    'seeds-sac': ('seeds', ['--agent', 'sac']),
    'pbt-sac': ('pbt', ['--agent', 'sac']),
    'cemrl': ('cemrl', []),
    'dvd': ('dvd', []),
    # A round scored by its best evaluation episode, not the population mean.
    'dvd-best-round': ('dvd', ['--bandit-score', 'best']),
    # A round rewarded for a gain above the recent median gain, not for
    # beating the recent rounds' return (the paper's).
    'dvd-relative-gain': ('dvd', ['--bandit-reward', 'relative-gain']),
    # A shorter kernel length scale: members whose actions differ by more
    # than ~2 sigma (root mean square) look distinct and stop being pushed.
    'dvd-sigma-0.3': ('dvd', ['--kernel-sigma', '0.3']),
    'dvd-no-diversity': ('dvd', ['--lambda-mode', 'schedule',
                                 '--lambda-start', '0', '--lambda-end', '0']),
    'hypertrick': ('hypertrick', []),
    # Random search from the prior (Jaderberg et al. 2017's control arm):
    # the members' draws of PBT's --init-hparams prior, never exploited.
    'random-td3': ('random', ['--agent', 'td3']),
    # Our TD3 agent (the same pure functions) in a plain synchronous loop:
    # no actor processes, no rate limiter, no prefetch; one env step per
    # member, then one update on a batch sampled from everything so far, as
    # SB3 does; so a gap to SB3 is either in the data path (if this closes
    # it) or in the agent (if it does not).
    'sync-td3': ('sync', ['td3']),
    'sb3-td3': ('sb3', ['td3']),
    'sb3-sac': ('sb3', ['sac']),
    # SB3's own defaults (TD3: Adam 1e-3, 400x300, learning starts after 100
    # steps, no exploration noise), to tell a gap in the implementation from
    # one in the settings.
    'sb3-td3-own-defaults': ('sb3', ['td3', 'own-defaults']),
    'seeds-ppo': ('seeds', ['--agent', 'ppo']),
    'pbt-ppo': ('pbt', ['--agent', 'ppo']),
    'pbt-pb2-ppo': ('pbt', ['--agent', 'ppo', '--explore', 'pb2']),
    'random-ppo': ('random', ['--agent', 'ppo']),
    # The papers' comparison with random-ppo: PBT and PB2 started from the
    # same prior draws as random search (Jaderberg et al. 2017 and PB2 start
    # every member at random from the search space), exploring over the
    # whole of it. pbt-ppo and pbt-pb2-ppo start near the defaults instead.
    'pbt-prior-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams', 'prior']),
    'pbt-pb2-prior-ppo': ('pbt', ['--agent', 'ppo', '--explore', 'pb2',
                                  '--init-hparams', 'prior']),
    # PBT from the prior, selecting on the env's true objective (Sample
    # Factory's PBT with reward shaping), and the trap beside it: selecting
    # on the shaped return, which the searched bonus itself feeds.
    'pbt-objective-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams',
                                  'prior', '--true-objective']),
    'pbt-shaped-return-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams',
                                      'prior']),
    # SB3's PPO at its own defaults, which are our PPO's defaults.
    'sb3-ppo': ('sb3', ['ppo']),
    # The parity pair at rl-baselines3-zoo's tuned PPO settings for the task
    # (ZOO_PPO; a task without an entry is skipped): ours, and SB3's.
    'seeds-ppo-zoo': ('seeds', ['--agent', 'ppo', ZOO]),
    'sb3-ppo-zoo': ('sb3', ['ppo', ZOO]),
}

DEFAULT_OUT = os.path.join('benchmarks', 'results', 'learning')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--tasks', nargs='+', default=list(TASKS),
                      help=f'tasks of the suite, from {list(TASKS)}')
  parser.add_argument('--methods', nargs='+', default=list(METHODS),
                      help=f'methods, from {list(METHODS)}')
  parser.add_argument('--seeds', nargs='+', type=int, default=[0, 1, 2],
                      help='benchmark seeds (each a whole population run)')
  parser.add_argument('--population-size', type=int,
                      default=DEFAULT_POPULATION,
                      help='members per run (rules need 2 or more, '
                      'CEM-RL an even number; 1 suits seeds-* and sb3-* '
                      'parity rows)')
  parser.add_argument('--eval-episodes', type=int, default=5)
  parser.add_argument('--env-steps', type=int, default=None,
                      help="override every task's budget per member")
  parser.add_argument('--out', default=DEFAULT_OUT)
  parser.add_argument('--redo', action='store_true',
                      help='run again even where a result exists')
  parser.add_argument('--report-only', action='store_true')
  parser.add_argument('--run-root', default=None,
                      help="folder for each run's own logs (default: the "
                      "system's temporary directory)")
  parser.add_argument('--one', nargs=3, metavar=('TASK', 'METHOD', 'SEED'),
                      help=argparse.SUPPRESS)  # one run, in a subprocess
  args = parser.parse_args(argv)
  for name in args.tasks:
    if name not in TASKS:
      parser.error(f'--tasks: unknown task {name!r}; choose from {list(TASKS)}')
  for name in args.methods:
    if name not in METHODS:
      parser.error(f'--methods: unknown method {name!r}; choose from '
                   f'{list(METHODS)}')
  if args.population_size < 1:
    parser.error(f'--population-size must be >= 1, got {args.population_size}')
  if args.eval_episodes < 1:
    parser.error(f'--eval-episodes must be >= 1, got {args.eval_episodes}')
  if args.env_steps is not None and args.env_steps < 2:
    parser.error(f'--env-steps must be >= 2, got {args.env_steps}')
  if args.run_root is not None and not os.path.isdir(args.run_root):
    parser.error(f'--run-root: {args.run_root!r} is not a folder')
  return args


# PB2's own setting (Parker-Holder et al. 2020, its PPO runs): 1M env steps
# per member and a decision every 50,000; here every 49,152, a whole number
# (24) of PPO's 2,048-step iterations, so decisions fall between learner
# calls at the same points in every run. Evaluations at the same points.
# Fixed before its runs (``POPULATION_CELLS``).
BUDGETS = {(name, 1_000_000): Task(1_000_000, 0, 49_152, 49_152, 245_760)
           for name in ('HalfCheetah-v5', 'Hopper-v5')}


def task_budget(args, task_name: str) -> Task:
  """The task's budget; at ``--env-steps``, its ``BUDGETS`` entry if it
  has one, else every count scaled to that budget."""
  task = TASKS[task_name]
  if args.env_steps is None:
    return task
  if (task_name, args.env_steps) in BUDGETS:
    return BUDGETS[(task_name, args.env_steps)]
  scale = args.env_steps / task.env_steps
  return Task(args.env_steps, max(1, int(task.warmup_steps * scale)),
              max(1, int(task.eval_every * scale)),
              max(1, int(task.ready_after * scale)),
              max(1, int(task.phase_env_steps * scale)))


def result_path(out: str, task: str, method: str, seed: int,
                env_steps: Optional[int] = None,
                population_size: int = DEFAULT_POPULATION) -> str:
  """``runs/<task>/<method>/seed<k>.json`` at the task's budget and the
  default population size; a run at another budget (``--env-steps``) goes
  under ``runs/<task>@<steps>/``, one at another size
  (``--population-size``) under ``runs/<task>[@<steps>]_pop<n>/``, so that
  results at different budgets or sizes never stand in for each other."""
  folder = task
  if env_steps is not None and env_steps != TASKS[task].env_steps:
    folder = f'{folder}@{env_steps}'
  if population_size != DEFAULT_POPULATION:
    folder = f'{folder}_pop{population_size}'
  return os.path.join(out, 'runs', folder, method, f'seed{seed}.json')


# --------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------


def _curve(run_dir: str, eval_episodes: int, eval_every: int,
           field: str = 'episode_return') -> list:
  """``[(env_steps, best member's evaluation mean, population mean)]`` with
  evaluations binned to the ``eval_every`` grid (the final one at the
  budget), of ``field`` (``'true_objective'``: the env's own score)."""
  from fastpbrl.logging import evaluation_points, read_member_csvs  # noqa: PLC0415

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
  return, ``fastpbrl.env_params``), else ``'episode_return'``."""
  from fastpbrl.logging import read_member_csvs  # noqa: PLC0415

  rows = [r for member in read_member_csvs(run_dir) for r in member
          if r['evaluation'] == 'True']
  if rows and all(r.get('true_objective') not in (None, '') for r in rows):
    return 'true_objective'
  return 'episode_return'


def final_scores(run_dir: str, eval_episodes: int, field: str) -> list:
  """Each member's final evaluation (its last one) as the mean of
  ``field``."""
  from fastpbrl.logging import evaluation_points, read_member_csvs  # noqa: PLC0415

  return [evaluation_points(rows, eval_episodes, field)[-1][2]
          for rows in read_member_csvs(run_dir)]


def run_fastpbrl(args, task_name: str, method: str, seed: int) -> dict:
  import importlib  # noqa: PLC0415

  from fastpbrl.logging import read_rule_csv  # noqa: PLC0415

  task = task_budget(args, task_name)
  module_name, extra = METHODS[method]
  if ZOO in extra:
    i = extra.index(ZOO)
    extra = extra[:i] + zoo_flags(task_name) + extra[i + 1:]
  module = importlib.import_module(f'experiments.{module_name}')
  run_dir = tempfile.mkdtemp(prefix=f'fpbrl-bench-{method}-',
                             dir=args.run_root)
  argv = ['--env', task_name, '--seed', str(seed),
          '--population-size', str(args.population_size),
          '--env-steps', str(task.env_steps),
          '--eval-every', str(task.eval_every),
          '--eval-episodes', str(args.eval_episodes),
          '--checkpoint-every', '0', '--no-progress',
          '--run-dir', os.path.join(run_dir, 'run')] + extra
  if agent_spec(_agent_of(extra)).learns_from == 'replay':
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
  start = time.monotonic()
  result = module.main(argv)
  wall = time.monotonic() - start
  field = scored_field(os.path.join(run_dir, 'run'))
  finals = (result.final_returns if field == 'episode_return' else
            final_scores(os.path.join(run_dir, 'run'), args.eval_episodes,
                         field))
  out = {
      # A shaped env's runs are scored on its true objective (``scored``);
      # their shaped returns are ``final_shaped_returns``.
      'final_returns': finals,
      'scored': field,
      'wall_time_s': wall,
      'env_steps': result.env_steps,
      'update_steps': result.update_steps,
      'hparams': result.hparams,
      'curve': _curve(os.path.join(run_dir, 'run'), args.eval_episodes,
                      task.eval_every, field),
      'command': f'python -m experiments.{module_name} ' + ' '.join(argv),
      'rule_scalars': getattr(result, 'rule_scalars', {}) or {},
      # The rule's scalars over the run (rule.csv): DvD's lambda and action
      # distance, whose last value alone depends on the bandit's last arm.
      'rule_curves': read_rule_csv(os.path.join(run_dir, 'run')),
  }
  if field != 'episode_return':
    out['final_shaped_returns'] = result.final_returns
  lineages = lineages_at_end(os.path.join(run_dir, 'run'))
  if lineages is not None:
    out['lineages_at_end'] = lineages
  mean_csv = os.path.join(run_dir, 'run', 'mean_policy.csv')
  if os.path.exists(mean_csv):
    curve = cem_mean_policy_curve(mean_csv, args.population_size)
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


def sb3_zoo_ppo(sb3, task_name: str, seed: int):
  """SB3's PPO at ``ZOO_PPO[task_name]`` as rl-zoo builds it (one env,
  VecNormalize with the agent's gamma when ``normalize``), and the function
  that maps a raw observation to what its policy sees (the training
  statistics, frozen while it evaluates, as rl-zoo's evaluation does)."""
  import gymnasium as gym  # noqa: PLC0415
  import torch  # noqa: PLC0415
  from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: PLC0415

  zoo = dict(ZOO_PPO[task_name])
  venv = DummyVecEnv([lambda: gym.make(task_name)])
  if zoo.pop('normalize'):
    venv = VecNormalize(venv, gamma=zoo['gamma'])
  activation = {'relu': torch.nn.ReLU, 'tanh': torch.nn.Tanh}[
      zoo.pop('activation')]
  arch = list(zoo.pop('net_arch'))
  policy_kwargs = dict(log_std_init=zoo.pop('log_std_init'),
                       ortho_init=zoo.pop('ortho_init'),
                       activation_fn=activation,
                       net_arch=dict(pi=arch, vf=arch))
  model = sb3.PPO('MlpPolicy', venv, seed=seed, verbose=0, device='cpu',
                  policy_kwargs=policy_kwargs, **zoo)
  if isinstance(venv, VecNormalize):
    return model, venv.normalize_obs
  return model, lambda obs: obs


def run_sb3(args, task_name: str, algo: str, seed: int,
            own_defaults: bool = False, zoo: bool = False) -> dict:
  """``--population-size`` Stable-Baselines3 agents, one after the other,
  each with the Fujimoto et al. / Haarnoja et al. defaults that our agents
  use (256x256, Adam 3e-4, batch 256, tau 0.005, gamma 0.99, one update
  per env step, TD3 exploration noise 0.1), our warm-up length, and the
  same evaluation (noise-free, ``--eval-episodes`` episodes); with
  ``zoo``, SB3's PPO at rl-zoo's settings for the task
  (``sb3_zoo_ppo``)."""
  try:
    import gymnasium as gym  # noqa: PLC0415
    import stable_baselines3 as sb3  # noqa: PLC0415
    from stable_baselines3.common.logger import Logger  # noqa: PLC0415
    from stable_baselines3.common.noise import NormalActionNoise  # noqa: PLC0415
  except ImportError as e:
    raise SystemExit(f'{algo}: Stable-Baselines3 is not installed ({e}); '
                     "install the torch extra: pip install -e '.[torch]'") from None
  import torch  # noqa: PLC0415

  from fastpbrl.evaluation import evaluation_seeds  # noqa: PLC0415

  torch.set_num_threads(1)
  task = task_budget(args, task_name)
  finals, curves, start = [], [], time.monotonic()
  for member in range(args.population_size):
    member_seed = seed * 1000 + member
    env = gym.make(task_name)
    kwargs = dict(learning_rate=3e-4, buffer_size=1_000_000,
                  learning_starts=task.warmup_steps, batch_size=256,
                  tau=0.005, gamma=0.99, train_freq=1, gradient_steps=1,
                  policy_kwargs={'net_arch': [256, 256]}, seed=member_seed,
                  verbose=0, device='cpu')
    observe = lambda obs: obs  # noqa: E731 (what the policy sees)
    if zoo:
      env.close()
      model, observe = sb3_zoo_ppo(sb3, task_name, member_seed)
    elif algo == 'ppo':  # SB3's defaults are our PPO's
      model = sb3.PPO('MlpPolicy', env, seed=member_seed, verbose=0,
                      device='cpu')
    elif own_defaults:
      model = (sb3.TD3 if algo == 'td3' else sb3.SAC)(
          'MlpPolicy', env, seed=member_seed, verbose=0, device='cpu')
    elif algo == 'td3':
      dim = env.action_space.shape[0]
      model = sb3.TD3('MlpPolicy', env, action_noise=NormalActionNoise(
          np.zeros(dim), 0.1 * np.ones(dim)), **kwargs)
    else:
      model = sb3.SAC('MlpPolicy', env, **kwargs)
    # Without a logger of its own, every learn() call makes an empty
    # SB3-<date> folder in the system's temporary directory.
    model.set_logger(Logger(folder=None, output_formats=[]))
    eval_env = gym.make(task_name)

    def evaluate():
      returns = []
      for reset_seed in evaluation_seeds(seed, member, args.eval_episodes):
        obs, _ = eval_env.reset(seed=reset_seed)
        total, done = 0.0, False
        while not done:
          action, _ = model.predict(observe(obs), deterministic=True)
          obs, r, term, trunc, _ = eval_env.step(action)
          total += float(r)
          done = term or trunc
        returns.append(total)
      return float(np.mean(returns))

    curve, done_steps = [], 0
    while done_steps < task.env_steps:
      chunk = min(task.eval_every, task.env_steps - done_steps)
      model.learn(total_timesteps=chunk, reset_num_timesteps=False)
      done_steps += chunk
      curve.append((done_steps, evaluate()))
    finals.append(curve[-1][1])
    curves.append(curve)
    env.close()
    eval_env.close()
  grid = sorted({s for c in curves for s, _ in c})
  merged = []
  for s in grid:
    values = [v for c in curves for t, v in c if t == s]
    merged.append((s, max(values), float(np.mean(values))))
  return {'final_returns': finals, 'wall_time_s': time.monotonic() - start,
          'env_steps': task.env_steps, 'curve': merged,
          'sb3_version': sb3.__version__, 'torch_version': torch.__version__,
          'command': f'stable_baselines3.{algo.upper()} x '
                     f'{args.population_size}, see benchmarks/learning.py'}


def run_sync(args, task_name: str, agent_name: str, seed: int) -> dict:
  """``--population-size`` members of our agent at its defaults, stepped
  together in one process: each loop iteration takes one env step per
  member (uniform random actions during the warm-up, then the agent's
  exploring ``act``) and, once the warm-up is over, one update per member
  (``jax.vmap`` of the agent's ``update``) on a batch sampled uniformly
  from all of that member's transitions so far. Updates start at zero when
  the warm-up ends, as in SB3's loop; evaluations are the baseline's
  (``evaluate_population``, the same reset seeds)."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from fastpbrl import agents as agents_lib  # noqa: PLC0415
  from fastpbrl.agents.base import POPULATION_AXIS  # noqa: PLC0415
  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.evaluation import evaluate_population  # noqa: PLC0415
  from fastpbrl.types import Transition, make_env_spec, scale_action  # noqa: PLC0415

  task = task_budget(args, task_name)
  n = args.population_size
  envs = [make_env(task_name) for _ in range(n)]
  env_spec = make_env_spec(envs[0])
  agent = agents_lib.make_agent(agent_name, env_spec)
  batch_size = agent.config.batch_size
  hparams = jax.tree.map(lambda x: jnp.broadcast_to(x, (n,)),
                         agent.default_hparams())
  key = jax.random.PRNGKey(seed)
  key, init_key = jax.random.split(key)
  state = jax.jit(jax.vmap(agent.init))(jax.random.split(init_key, n), hparams)
  # Named like the learner's population axis, so TD3's delayed policy step
  # stays a real cond (``any_member``), as in the learner.
  update = jax.jit(jax.vmap(lambda st, hp, b: agent.update(st, hp, b)[0],
                            axis_name=POPULATION_AXIS))
  act = jax.jit(jax.vmap(
      lambda p, o, k, h: agent.act(p, o[None], k, h, True)[0]))
  policy_params = jax.jit(jax.vmap(agent.policy_params))

  obs_dim = env_spec.observations.shape
  act_dim = env_spec.actions.shape
  cap = task.env_steps
  replay = dict(
      observation=np.zeros((n, cap, *obs_dim), np.float32),
      action=np.zeros((n, cap, *act_dim), np.float32),
      reward=np.zeros((n, cap), np.float32),
      next_observation=np.zeros((n, cap, *obs_dim), np.float32),
      terminated=np.zeros((n, cap), np.float32),
      truncated=np.zeros((n, cap), np.float32))
  seqs = [np.random.SeedSequence(seed, spawn_key=(1, m)) for m in range(n)]
  rngs = [np.random.default_rng(s) for s in seqs]
  sampler = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
  obs = np.stack([env.reset(seed=int(s.generate_state(1)[0]))[0]
                  for env, s in zip(envs, seqs)]).astype(np.float32)
  rows = np.arange(n)[:, None]
  curve, start = [], time.monotonic()
  for t in range(cap):
    if t < task.warmup_steps:
      actions = np.stack([r.uniform(-1.0, 1.0, act_dim) for r in rngs]
                         ).astype(np.float32)
    else:
      step_keys = jax.random.split(jax.random.fold_in(key, t), n)
      actions = np.asarray(act(state.policy, jnp.asarray(obs), step_keys,
                               hparams))
    env_actions = scale_action(actions, env_spec.actions)
    for m, env in enumerate(envs):
      o, r, term, trunc, _ = env.step(env_actions[m])
      for name, value in (('observation', obs[m]), ('action', actions[m]),
                          ('reward', r), ('next_observation', o),
                          ('terminated', float(term)),
                          ('truncated', float(trunc))):
        replay[name][m, t] = value
      if term or trunc:
        o, _ = env.reset(seed=int(rngs[m].integers(2**31)))
      obs[m] = o
    if t + 1 > task.warmup_steps:
      idx = sampler.integers(0, t + 1, (n, batch_size))
      batch = Transition(**{k: jnp.asarray(v[rows, idx])
                            for k, v in replay.items()})
      state = update(state, hparams, batch)
    if (t + 1) % task.eval_every == 0 or t + 1 == cap:
      returns, _, _ = evaluate_population(
          agent, lambda: make_env(task_name), policy_params(state), hparams,
          args.eval_episodes, seed)
      means = returns.mean(axis=1)
      curve.append((t + 1, float(means.max()), float(means.mean())))
      finals = [float(v) for v in means]
      print(f'{task_name} sync-{agent_name} seed {seed}: {t + 1} env steps '
            f'per member, returns {np.round(means).tolist()}', flush=True)
  for env in envs:
    env.close()
  return {'final_returns': finals, 'wall_time_s': time.monotonic() - start,
          'env_steps': task.env_steps, 'curve': curve,
          # Counted by the agent's own step counter, not by a formula.
          'update_steps': int(np.asarray(state.step)[0]),
          'command': f'our {agent_name} agent in a synchronous loop, '
                     'see benchmarks/learning.py (run_sync)'}


@functools.lru_cache(maxsize=None)
def fits(task_name: str, method: str) -> Optional[str]:
  """None if ``method``'s agent can act in ``task_name``, else why not
  (its ``make_agent``'s refusal, e.g. TD3 on a discrete action space)."""
  module_name, extra = METHODS[method]
  agent = extra[0] if module_name in ('sb3', 'sync') else _agent_of(extra)
  if module_name in ('sb3', 'sync') and jax_envs.is_jax_env(task_name):
    return f'{module_name} steps gymnasium envs only'
  if ZOO in extra and task_name not in ZOO_PPO:
    return f'no rl-zoo PPO settings for it (ZOO_PPO has {list(ZOO_PPO)})'
  try:
    agents_lib.make_agent(agent, build.make_env_spec(task_name))
  except (ValueError, ConfigError) as e:
    return str(e).splitlines()[0]
  return None


def run_one(args, task_name: str, method: str, seed: int) -> None:
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


def is_current(path: str) -> bool:
  """Whether ``path`` holds a result that no later fix superseded (a
  superseded one is run again, and set aside then)."""
  if not os.path.exists(path):
    return False
  with open(path) as f:
    return not superseded_by(json.load(f))


def set_aside_superseded(path: str) -> Optional[str]:
  """Moves the result at ``path``, if a later fix superseded it, to
  ``superseded/seed<k>@<code>.json`` beside it, where the report still
  shows it apart, instead of letting the new run overwrite it; returns
  where it went (None: nothing there, or a result of current code)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    old = json.load(f)
  if not superseded_by(old):
    return None
  name = os.path.basename(path)[:-len('.json')]
  code = str(old.get('code', 'unknown')).replace('+', '-')
  target = os.path.join(os.path.dirname(path), 'superseded',
                        f'{name}@{code}.json')
  os.makedirs(os.path.dirname(target), exist_ok=True)
  os.replace(path, target)
  return target


def code_version() -> str:
  """The commit the run's code came from (``+changes`` if the checkout had
  uncommitted changes to tracked code; results and new files do not
  count), so a table says which code each row measured."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=root,
                          capture_output=True, text=True, timeout=30)
    dirty = subprocess.run(['git', 'status', '--porcelain',
                            '--untracked-files=no', '--', 'fastpbrl',
                            'experiments', 'benchmarks',
                            ':!benchmarks/results'],
                           cwd=root, capture_output=True, text=True,
                           timeout=30)
  except (OSError, subprocess.TimeoutExpired):
    return 'unknown'
  if head.returncode != 0:
    return 'unknown'
  return head.stdout.strip() + ('+changes' if dirty.stdout.strip() else '')


def machine() -> str:
  cpu = platform.processor() or platform.machine()
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          cpu = line.split(':', 1)[1].strip()
          break
  except OSError:
    pass
  return f'{cpu}, {os.cpu_count()} cores, {platform.system()}'


def learner_device() -> Optional[str]:
  """The accelerator JAX runs the learner on (``'NVIDIA H200 (learner)'``),
  or None where it runs on the CPU: a row's ``device``, since the CPU model
  of its ``machine`` does not say whether a GPU was there."""
  device = jax.devices()[0]
  return None if device.platform == 'cpu' else f'{device.device_kind} (learner)'


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _fmt(values: list) -> str:
  """``mean ± sample std`` (ddof 1) of the finite values."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return '-'
  if len(values) == 1:
    return stats.fmt_value(values[0])
  return (f'{stats.fmt_value(np.mean(values))} ± '
          f'{stats.fmt_value(stats.sample_std(values))}')


RULE_MODULES = ('pbt', 'cemrl', 'dvd', 'hypertrick', 'random')

# Fixes that changed what a method's runs measure: (commit, experiment
# module, the flags that select the fixed path among that module's methods
# (none: all of them), what it fixed). A run on code without the fix is
# superseded; the report shows it apart instead of pooling it with runs
# of the fixed code.
FIXES = (
    ('ef3bee1', 'pbt', (), 'PBT decides for the whole population once '
     'every member is evaluated'),
    ('a2f8eb2', 'hypertrick', (), 'HyperTrick restarts no worker its '
     'budget cannot train'),
    ('69a4018', 'pbt', ('--explore', 'pb2'), "PB2's GP sees each "
     "interval's starting fitness, as in its authors' implementation"),
)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def has_commit(code: str, commit: str) -> bool:
  """Whether code version ``code`` (a commit, maybe with ``+changes``)
  contains ``commit``; True where git cannot tell (no repository, an
  unknown version), so that a run is left out only on evidence."""
  done = subprocess.run(
      ['git', 'merge-base', '--is-ancestor', commit, code.split('+')[0]],
      cwd=REPO, capture_output=True)
  return done.returncode != 1


def superseded_by(result: dict) -> Optional[str]:
  """The fix a run's code lacks (``'COMMIT: what it fixed'``), or None."""
  module, flags = METHODS.get(result['method'], (None, []))
  code = str(result.get('code', 'unknown'))
  for commit, fixed, needs, what in FIXES:
    if (module == fixed and _has_flags(flags, needs)
        and not has_commit(code, commit)):
      return f'{commit}: {what}'
  return None


def _has_flags(flags: list, needs: tuple) -> bool:
  """Whether ``needs`` appears in ``flags``, its items in a row."""
  return any(tuple(flags[i:i + len(needs)]) == needs
             for i in range(len(flags) - len(needs) + 1))


def _agent_of(flags: list) -> str:
  return flags[flags.index('--agent') + 1] if '--agent' in flags else 'td3'


def baseline_of(method: str) -> Optional[str]:
  """The ``seeds`` row a rule's row is compared with: ``seeds-<agent>``
  of the rule's agent (``--agent``, else TD3); None for baselines and
  reference implementations."""
  module, flags = METHODS.get(method, (None, []))
  if module not in RULE_MODULES:
    return None
  return f'seeds-{_agent_of(flags)}'


# Rules that choose hyperparameters (random search: by its draws alone).
SEARCHING_MODULES = ('pbt', 'hypertrick', 'random')
# Hyperparameters renamed since runs were recorded: old name -> new. The
# result files under benchmarks/results/ are history and keep the old names
# (TD3's policy_delay, a fraction, is policy_update_fraction now, same
# values); code reading their 'hparams' maps them through recorded_hparams.
RENAMED_HPARAMS = {'policy_delay': 'policy_update_fraction'}


def recorded_hparams(hparams: dict) -> dict:
  """One member's recorded hyperparameters under today's names."""
  return {RENAMED_HPARAMS.get(k, k): v for k, v in hparams.items()}
EDGE = 0.1  # "at an edge": in the outer tenth of a range, at either end


def edge_share(result: dict) -> Optional[float]:
  """The share of a run's final searched hyperparameter values (every
  member, every continuous field of the agent's default search space)
  that lie at an edge of their range, each range scaled as the space
  draws from it (log for learning rates, log(1 - gamma) for the
  discount: ``fastpbrl.rules.pbt.pb2.encode``). None for a method that
  chooses no hyperparameters, or a run with a search space of its own.

  Uniform draws put ``2 x EDGE`` (20%) of their values there."""
  module, flags = METHODS.get(result['method'], (None, []))
  if (module not in SEARCHING_MODULES or not result.get('hparams')
      or '--search-space' in result.get('command', '')):
    return None
  space = agent_spec(_agent_of(flags)).default_search_space
  names = pb2.continuous_fields(space)
  recorded = [recorded_hparams(h) for h in result['hparams']]
  unit = pb2.encode(space, {name: [h[name] for h in recorded]
                            for name in names})
  return float(np.mean((unit < EDGE) | (unit > 1 - EDGE)))


@functools.cache
def compare(rule: tuple, baseline: tuple) -> tuple[stats.Interval, str]:
  """A rule's probability of improving on its baseline (best finals over
  seeds), with its interval and verdict; each pair's bootstrap once, for
  the table over seeds and the matrix alike."""
  poi = stats.improvement_interval(rule, baseline)
  return poi, stats.verdict(poi, min(len(rule), len(baseline)))


def control_of(method: str) -> Optional[str]:
  """The random-search row a searching rule's row is also compared with,
  the control arm of Jaderberg et al. 2017 and of HyperTrick:
  ``random-<agent>`` of a PBT or HyperTrick row's agent, where the suite
  has one; None otherwise."""
  module, flags = METHODS.get(method, (None, []))
  if module not in ('pbt', 'hypertrick'):
    return None
  control = f'random-{_agent_of(flags)}'
  return control if control in METHODS else None


# Our baseline rows and the Stable-Baselines3 rows that are their
# single-agent references, at the same settings.
REFERENCE_OF = {'seeds-td3': 'sb3-td3', 'seeds-sac': 'sb3-sac',
                'seeds-ppo': 'sb3-ppo', 'seeds-ppo-zoo': 'sb3-ppo-zoo'}


def _versus(finals: dict, method: str, other: Optional[str]) -> list[str]:
  """``[P [CI], verdict]`` of ``method`` over ``other``; blanks where
  either has no runs."""
  if other not in finals:
    return ['', '']
  poi, verdict = compare(tuple(finals[method]), tuple(finals[other]))
  return [stats.fmt_interval(poi, 2), verdict]


def cell_of(result: dict) -> tuple[str, int, int]:
  """The report's group of a run: its task, env steps per member and
  members. Runs are compared only within one group: a population of 16
  does not stand in for one of 4."""
  return (result['task'], result['budget']['env_steps'],
          result['population_size'])


def _cell_columns(cell: tuple) -> str:
  task, steps, members = cell
  return f'| {task} | {steps:,} | {members} |'


def _best_finals(by: dict, cell: tuple) -> dict:
  """Each method's best member's final return per seed in ``cell`` (none
  where ``by`` has no run of it)."""
  return {method: [max(r['final_returns']) for r in runs]
          for method, runs in by.get(cell, {}).items()}


def seed_statistics(by: dict, tasks: list, order: dict) -> list[str]:
  """Markdown rows over seeds of the best member's final return: IQM with
  its 95% bootstrap interval, and each rule's probability of improving on
  its ``seeds`` baseline and, for PBT and HyperTrick, on random search
  from the same prior (``control_of``), each with its interval and
  verdict (``benchmarks/stats.py``)."""
  lines = ['| task | env steps per member | members | method | seeds | '
           'best member, final: IQM [95% CI] | P(better than seeds) [95% CI] '
           '| verdict | P(better than random search) [95% CI] | verdict |',
           '|---|---:|---:|---|---:|---:|---:|---|---:|---|']
  for cell in tasks:
    finals = _best_finals(by, cell)
    for method in sorted(finals, key=order.get):
      cells = [stats.fmt_interval(stats.iqm_interval(finals[method]))]
      cells += _versus(finals, method, baseline_of(method))
      cells += _versus(finals, method, control_of(method))
      lines.append(f'{_cell_columns(cell)} {method} | '
                   f'{len(finals[method])} | ' + ' | '.join(cells) + ' |')
  return lines


REFERENCE_NOTE = (
    'Our agents against Stable-Baselines3 at the same settings, per task: '
    'the probability that a seed of ours ends above a seed of SB3\'s (best '
    'member\'s final return), with its interval and verdict as above.')


def reference_statistics(by: dict, tasks: list) -> list[str]:
  """Markdown rows, one per task and pair of ``REFERENCE_OF`` where both
  sides have runs: each side's IQM and seeds, and ours' probability of
  ending above SB3's. Empty when no pair has runs."""
  lines = []
  for cell in tasks:
    finals = _best_finals(by, cell)
    for ours, theirs in REFERENCE_OF.items():
      if ours not in finals or theirs not in finals:
        continue
      cells = [ours, theirs, str(len(finals[ours])), str(len(finals[theirs])),
               stats.fmt_interval(stats.iqm_interval(finals[ours])),
               stats.fmt_interval(stats.iqm_interval(finals[theirs])),
               *_versus(finals, ours, theirs)]
      lines.append(f'{_cell_columns(cell)} ' + ' | '.join(cells) + ' |')
  if not lines:
    return []
  return ['| task | env steps per member | members | ours | SB3 | seeds '
          '(ours) | seeds (SB3) | ours: IQM [95% CI] | SB3: IQM [95% CI] | '
          'P(ours better) [95% CI] | verdict |',
          '|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|'] + lines


# The question the benchmark is for: does PBT, with each of its explores
# (and with a shared replay), end ahead of as many members at the agent's
# defaults? Asked on every task of the suite at the budget it is run at on
# the 2-core machine, held-out tasks included.
MATRIX_TASKS = (('Pendulum-v1', 20_000), ('Hopper-v5', 50_000),
                ('HalfCheetah-v5', 50_000), ('Walker2d-v5', 50_000),
                ('Ant-v5', 50_000))
MATRIX_BASELINE = 'seeds-td3'
MATRIX_RULES = ('pbt-td3', 'pbt-resample-td3', 'pbt-pb2-td3',
                'pbt-shared-td3')
MATRIX_NOTE = (
    f'PBT against {MATRIX_BASELINE}, per task: each variant\'s verdict, its '
    'probability of ending above a default seed with the 95% interval, and '
    'its seeds ("not run": no run yet).')


def _seeds(count: int) -> str:
  return f'{count} seed' + ('' if count == 1 else 's')


def _matrix_cell(rule: Optional[list], baseline: Optional[list]) -> str:
  if rule is None:
    return 'not run'
  if baseline is None:
    return f'no baseline yet, {_seeds(len(rule))}'
  poi, verdict = compare(tuple(rule), tuple(baseline))
  return f'{verdict}: P {stats.fmt_interval(poi, 2)}, {_seeds(len(rule))}'


def matrix_summary(by: dict) -> list[str]:
  """Markdown: a row per task of ``MATRIX_TASKS``, a column per PBT
  variant with its verdict against ``MATRIX_BASELINE``, then a line naming
  the tasks where one of them is better and those where one is worse.
  Empty when no run of the matrix is in ``by``."""
  methods = (MATRIX_BASELINE,) + MATRIX_RULES
  if not any(m in by.get((*key, DEFAULT_POPULATION), {})
             for key in MATRIX_TASKS for m in methods):
    return []
  lines = ['| task | ' + ' | '.join(methods) + ' |',
           '|---|' + '---|' * len(methods)]
  found = {'better': [], 'worse': []}
  complete = 0  # tasks where every method has its MIN_SEEDS
  for task, steps in MATRIX_TASKS:
    finals = {m: [max(r['final_returns']) for r in runs]
              for m, runs in by.get((task, steps, DEFAULT_POPULATION),
                                    {}).items()}
    baseline = finals.get(MATRIX_BASELINE)
    cells = [_seeds(len(baseline)) if baseline else 'not run']
    cells += [_matrix_cell(finals.get(m), baseline) for m in MATRIX_RULES]
    complete += all(len(finals.get(m, [])) >= stats.MIN_SEEDS
                    for m in methods)
    name = f'{task} at {steps:,} env steps' + (
        ' (held out)' if task in HELD_OUT else '')
    for verdict, names in found.items():
      if any(cell.startswith(verdict + ':') for cell in cells[1:]):
        names.append(name)
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  count = len(MATRIX_TASKS)
  lines += ['', f'A PBT variant better than {MATRIX_BASELINE} on '
            f'{len(found["better"])} of {count} tasks'
            + (f' ({"; ".join(found["better"])})' if found['better'] else '')
            + f'; worse on {len(found["worse"])}'
            + (f' ({"; ".join(found["worse"])})' if found['worse'] else '')
            + f'. Every method has {stats.MIN_SEEDS} seeds or more on '
            f'{complete} of {count} tasks.', '', power_note()]
  return lines


def power_note() -> str:
  """What "better" takes at ``MIN_SEEDS`` seeds a side, so that "not
  distinguishable" reads as "no gain that large", not "no gain"."""
  n = stats.MIN_SEEDS
  p = stats.smallest_decisive_probability(n, n)
  return (f'With {n} seeds a side, a variant is called better only from P = '
          f'{p:.2f} ({round(p * n * n)} of the {n * n} pairs of seeds), '
          f'whatever the returns: for normally distributed returns of one '
          f'spread, a gap of {stats.normal_gap(p):.1f} standard deviations '
          f'between the means (P = Phi(gap / sqrt 2)). A smaller gain reads '
          f'"not distinguishable" at these seed counts.')


# The papers' comparison at the sizes where rules should pay off (Jaderberg
# et al. 2017 and HyperTrick compare with random search over the same
# prior; PB2 with PBT at 4 members): per cell (task, env steps per member,
# members, whether it counts toward the goal), the four arms below. The
# 16-member cells run on the device; the 4-member ones are PB2's own setting
# through the actors. Fixed before their runs.
POPULATION_CELLS = (
    ('gymnax:Pendulum-v1', 1_048_576, 16, True),
    ('gymnax:Acrobot-v1', 1_048_576, 16, True),
    ('gymnax:MountainCarContinuous-v0', 1_048_576, 16, True),
    ('HalfCheetah-v5', 1_000_000, 4, False),
    ('Hopper-v5', 1_000_000, 4, False),
)
POPULATION_BASELINE = 'seeds-ppo'
POPULATION_CONTROL = 'random-ppo'
# The papers' comparison, which the goal counts: PBT and PB2 started from
# the same prior draws as random search (POPULATION_CONTROL).
POPULATION_RULES = ('pbt-prior-ppo', 'pbt-pb2-prior-ppo')
# The library's default start (``--init-hparams near-defaults``): members
# within a factor 1.25 of the published defaults, a head start random
# search does not get; shown against the same two arms, not counted.
POPULATION_NEAR_RULES = ('pbt-ppo', 'pbt-pb2-ppo')
POPULATION_GOAL = 2  # tasks where PBT or PB2 beats random search
POPULATION_NOTE = (
    f'PBT and PB2 against random search from the same prior '
    f'({POPULATION_CONTROL}, the papers\' control arm) and against default '
    f'seeds ({POPULATION_BASELINE}), at the larger populations: per task, '
    f'each arm\'s best member\'s final IQM [95% CI] and seeds, and each '
    f'rule\'s verdict and probability of improvement with its interval; '
    f'then a sentence per task on what wins, and the goal\'s count over the '
    f'16-member tasks. In the first table PBT and PB2 start from the same '
    f'prior draws as random search ({", ".join(POPULATION_RULES)}), as the '
    f'papers do; the second shows the library\'s default start, near the '
    f'published defaults ({", ".join(POPULATION_NEAR_RULES)}), against the '
    f'same two arms: a head start random search does not get, so it does '
    f'not count toward the goal.')


# Providers whose envs port gymnasium's, rewards included (gymnax's
# classic-control envs), so that gymnasium's registry states their
# reward threshold.
GYMNASIUM_PORTS = ('gymnax:',)


def reward_threshold(task: str) -> Optional[float]:
  """gymnasium's ``reward_threshold`` for ``task``, the return at which its
  registry calls the env solved; None where it states none."""
  env_id = task
  for prefix in GYMNASIUM_PORTS:
    env_id = env_id.removeprefix(prefix)
  try:
    return gymnasium.spec(env_id).reward_threshold
  except gymnasium.error.Error:
    return None


def _arms(rules: tuple) -> tuple:
  """The arms of a population table: default seeds, random search, then
  ``rules``."""
  return (POPULATION_BASELINE, POPULATION_CONTROL) + tuple(rules)


def _reached(finals: dict, threshold: Optional[float], arms: tuple) -> dict:
  """Per arm of ``arms``, how many seeds' best member ends at ``threshold``
  or above (empty without a threshold)."""
  if threshold is None:
    return {}
  return {m: sum(v >= threshold for v in finals.get(m, [])) for m in arms}


def _arm_cell(finals: Optional[list]) -> str:
  if not finals:
    return 'not run'
  return (f'{stats.fmt_interval(stats.iqm_interval(finals))}, '
          f'{_seeds(len(finals))}')


def _versus_cell(rule: Optional[list], other: Optional[list]) -> str:
  if rule is not None and other is None:
    return f'nothing to compare with yet, {_seeds(len(rule))}'
  return _matrix_cell(rule, other)


def _short_arms(finals: dict, arms: tuple) -> list[str]:
  """``'<arm> <seeds>'`` of each of ``arms`` with fewer than
  ``MIN_SEEDS`` seeds in ``finals``."""
  return [f'{m} {len(finals.get(m, []))}' for m in arms
          if len(finals.get(m, [])) < stats.MIN_SEEDS]


def population_sentence(name: str, finals: dict, short: list[str],
                        threshold: Optional[float] = None,
                        reached: Optional[dict] = None,
                        rules: tuple = POPULATION_RULES
                        ) -> tuple[str, bool, bool]:
  """One sentence on what wins in a cell of ``POPULATION_CELLS`` among
  ``rules`` and the two control arms, whether a rule beats random search
  there, and whether one is worse than default seeds (both False while an
  arm is ``short``, ``_short_arms``). With the task's ``threshold``
  (``reward_threshold``), it also gives ``reached``, per arm the seeds
  whose best member reaches it (``_reached``): a verdict where every arm
  or none does compares policies that all solve the task, or none."""
  if not finals:
    return f'{name}: not run yet.', False, False
  if short:
    return (f'{name}: no verdict yet, too few seeds ({", ".join(short)}; '
            f'{stats.MIN_SEEDS} an arm needed).', False, False)
  vs_control = {r: compare(tuple(finals[r]), tuple(finals[POPULATION_CONTROL]))
                for r in rules}
  vs_seeds = {r: compare(tuple(finals[r]), tuple(finals[POPULATION_BASELINE]))
              for r in rules + (POPULATION_CONTROL,)}
  wins = [r for r in rules if vs_control[r][1] == 'better']
  worse = [r for r in rules if vs_seeds[r][1] == 'worse']
  head = (' and '.join(wins) + (' beats' if len(wins) == 1 else ' beat')
          if wins else 'no rule beats')
  parts = [f'{r} against random search: {v} (P '
           f'{stats.fmt_interval(poi, 2)})' for r, (poi, v) in
           vs_control.items()]
  poi, verdict = vs_seeds[POPULATION_CONTROL]
  parts.append(f'random search against default seeds: {verdict} (P '
               f'{stats.fmt_interval(poi, 2)})')
  parts.append(' and '.join(worse) + ' worse than default seeds' if worse
               else 'no rule worse than default seeds')
  if reached:
    parts.append(f'best member at gymnasium\'s reward threshold '
                 f'({threshold:g}) or above: ' + ', '.join(
                     f'{m} {n} of {len(finals[m])} seeds'
                     for m, n in reached.items()))
  iqm = {m: stats.iqm(finals[m]) for m in _arms(rules)}
  top = max(iqm, key=iqm.get)
  return (f'{name}: {head} random search ({POPULATION_CONTROL}); '
          + '; '.join(parts)
          + f'; highest IQM: {top} ({stats.fmt_value(iqm[top])}).',
          bool(wins), bool(worse))


def _population_name(task: str, steps: int, members: int) -> str:
  return (f'{task}, {members} members, {steps:,} env steps each'
          + (' (held out)' if task in HELD_OUT else ''))


class GoalCell(NamedTuple):
  """A cell of ``POPULATION_CELLS`` that counts toward the goal, as
  ``population_goal`` reads it."""
  name: str
  won: bool  # a rule beats random search
  lost: bool  # a rule is worse than default seeds
  complete: bool  # every arm has ``stats.MIN_SEEDS`` seeds or more
  unsolved: bool  # no seed of any arm reaches the reward threshold


def population_table(by: dict, rules: tuple
                     ) -> tuple[list[str], list[GoalCell]]:
  """Markdown: a row per cell of ``POPULATION_CELLS`` (each control arm's
  IQM, each of ``rules`` against random search and default seeds) and a
  sentence per cell (``population_sentence``); and a ``GoalCell`` per cell
  that counts toward the goal."""
  columns = [POPULATION_BASELINE, POPULATION_CONTROL]
  for rule in rules:
    columns += [f'{rule} vs {POPULATION_CONTROL}',
                f'{rule} vs {POPULATION_BASELINE}']
  lines = ['| task | ' + ' | '.join(columns) + ' |',
           '|---|' + '---|' * len(columns)]
  sentences, counted = [], []
  for task, steps, members, goal in POPULATION_CELLS:
    finals = _best_finals(by, (task, steps, members))
    short = _short_arms(finals, _arms(rules))
    name = _population_name(task, steps, members)
    cells = [_arm_cell(finals.get(POPULATION_BASELINE)),
             _arm_cell(finals.get(POPULATION_CONTROL))]
    for rule in rules:
      cells += [_versus_cell(finals.get(rule), finals.get(other))
                for other in (POPULATION_CONTROL, POPULATION_BASELINE)]
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
    threshold = reward_threshold(task)
    reached = _reached(finals, threshold, _arms(rules))
    sentence, won, lost = population_sentence(name, finals, short,
                                              threshold, reached, rules)
    sentences.append(f'- {sentence}')
    if goal:
      unsolved = bool(reached) and not any(reached.values())
      counted.append(GoalCell(name, won, lost, not short, unsolved))
  return lines + [''] + sentences, counted


def population_goal(counted: list[GoalCell]) -> str:
  """The goal's line over the cells ``population_table`` counted: how many
  tasks a rule beats random search on and is worse than default seeds on,
  and whether the goal is met, missed, or not decided while an arm has too
  few seeds; a goal met only with a win where every arm fails the task
  (policies none of which solves it) says so."""
  wins = [c.name + (', where no seed of any arm reaches the reward '
                    'threshold' if c.unsolved else '')
          for c in counted if c.won]
  worse = [c.name for c in counted if c.lost]
  complete = sum(c.complete for c in counted)
  met = len(wins) >= POPULATION_GOAL and not worse
  solved_wins = sum(c.won and not c.unsolved for c in counted)
  if complete < len(counted):
    outcome = 'not decided yet'
  elif not met:
    outcome = 'not met'
  elif solved_wins < POPULATION_GOAL:
    outcome = ('met, but only by counting a task where no seed of any arm '
               'reaches the reward threshold')
  else:
    outcome = 'met'
  return (f'Goal (PBT or PB2 from the same prior better than random search '
          f'on at least {POPULATION_GOAL} of the {len(counted)} 16-member '
          f'tasks, worse than default seeds on none): {outcome}. Better on '
          f'{len(wins)}' + (f' ({"; ".join(wins)})' if wins else '')
          + f', worse on {len(worse)}'
          + (f' ({"; ".join(worse)})' if worse else '')
          + f'; every arm has {stats.MIN_SEEDS} seeds or more on '
          f'{complete} of {len(counted)}.')


def population_summary(by: dict) -> list[str]:
  """Markdown: the papers' comparison (``population_table`` of
  ``POPULATION_RULES``) and the goal's line (``population_goal``), then
  the same table of ``POPULATION_NEAR_RULES``, the library's default
  start. Empty when no run of these cells is in ``by``."""
  if not any(cell[:3] in by for cell in POPULATION_CELLS):
    return []
  same_prior, counted = population_table(by, POPULATION_RULES)
  near, _ = population_table(by, POPULATION_NEAR_RULES)
  return (same_prior + ['', population_goal(counted), '',
                        'From near the defaults (the library\'s default '
                        'start; not counted toward the goal):', '']
          + near)


SUPERSEDED_NOTE = (
    'Left out, run on code without a later fix (what was tried before it): '
    'each row\'s best member\'s final return over its seeds, and its '
    'probability of ending above a seed of the current `seeds` row of its '
    'agent, with the 95% interval and verdict as above.')


def superseded_summary(dropped: list, by: dict) -> list[str]:
  """Markdown: a row per task, method and missing fix of the runs left out
  as superseded (``[(run, fix)]``), with their figures and their verdict
  against today's baseline; empty if none."""
  groups = {}
  for r, fix in dropped:
    key = (*cell_of(r), r['method'], fix)
    groups.setdefault(key, []).append(r)
  if not groups:
    return []
  lines = ['', SUPERSEDED_NOTE, '',
           '| task | env steps per member | members | method | seeds | code | '
           'lacks | best member, final | P(better than seeds) [95% CI] | '
           'verdict | final hparams at an edge of their range |',
           '|---|---:|---:|---|---|---|---|---:|---:|---|---:|']
  order = {m: i for i, m in enumerate(METHODS)}
  for key in sorted(groups, key=lambda k: (list(TASKS).index(k[0]), k[1],
                                           k[2], order.get(k[3], len(order)),
                                           k[4])):
    cell, method, fix = key[:3], key[3], key[4]
    runs = sorted(groups[key], key=lambda r: r['seed'])
    best = [max(r['final_returns']) for r in runs]
    baseline = by.get(cell, {}).get(baseline_of(method) or '')
    poi = verdict = ''
    if baseline:
      interval, verdict = compare(
          tuple(best), tuple(max(r['final_returns']) for r in baseline))
      poi = stats.fmt_interval(interval, 2)
    lines.append(
        f'{_cell_columns(cell)} {method} | '
        + ', '.join(str(r['seed']) for r in runs) + ' | '
        + ', '.join(sorted({str(r.get('code')) for r in runs}))
        + f' | {fix} | {_fmt(best)} | {poi} | {verdict} | '
        + _share_cell([edge_share(r) for r in runs]) + ' |')
  return lines


def load_results(out: str) -> list[dict]:
  results = []
  root = os.path.join(out, 'runs')
  for dirpath, _, files in os.walk(root):
    for name in sorted(files):
      if name.endswith('.json'):
        with open(os.path.join(dirpath, name)) as f:
          results.append(json.load(f))
  return results


def _run_mean(result: dict, name: str) -> Optional[float]:
  """The mean of a rule scalar over its measurements in the run (``None``
  for runs stored before ``rule_curves`` was recorded, or without it). The
  measurements are evenly spaced in learner calls (every 10th)."""
  points = result.get('rule_curves', {}).get(name)
  return float(np.mean([v for _, v in points])) if points else None


def _diversity_cell(final: list, run_mean: list) -> str:
  """``final (run mean)``, each averaged over the seeds that have it."""
  if not any(d is not None for d in final):
    return ''
  cell = f'{np.mean([d for d in final if d is not None]):.3f}'
  known = [d for d in run_mean if d is not None]
  if known:
    cell += f' ({np.mean(known):.3f}' + (
        f', {len(known)} of {len(run_mean)} seeds)' if len(known) < len(
            run_mean) else ')')
  return cell


def _share_cell(shares: list) -> str:
  """The mean share over the seeds that have one, as a percentage."""
  known = [s for s in shares if s is not None]
  return f'{np.mean(known):.0%}' if known else ''


def _lineages_cell(counts: list) -> str:
  """The mean number of lineages at the end over the seeds that recorded
  it (runs of a lineage-keeping rule since the benchmark records it), with
  how many did where not all."""
  known = [c for c in counts if c is not None]
  if not known:
    return ''
  cell = f'{np.mean(known):.1f}'
  return (cell if len(known) == len(counts)
          else f'{cell} ({len(known)} of {len(counts)} seeds)')


LATE_FRACTION = 0.2  # "late": the evaluations in the last fifth of the budget


def late_best(result: dict) -> Optional[float]:
  """The best member's evaluation averaged over the evaluation points in
  the last ``LATE_FRACTION`` of the run's budget (env steps per member at
  least ``(1 - LATE_FRACTION) x budget``), the final one included; ``None``
  for a run without a curve.

  One final evaluation of a few episodes swings by hundreds on Hopper-v5
  and HalfCheetah-v5 (a run whose best member stayed below 430 for 47,500
  steps scored 956 at its last one), so this late mean says more about
  where a run ended up.
  The best member may differ between points (the envelope of the members'
  curves, which is all the stored curve keeps)."""
  curve = result.get('curve') or []
  budget = result['budget']['env_steps']
  late = [best for steps, best, _ in curve
          if steps >= (1 - LATE_FRACTION) * budget and math.isfinite(best)]
  return float(np.mean(late)) if late else None


STATISTICS_NOTE = (
    'Over seeds (benchmarks/stats.py): the interquartile mean of the best '
    'member\'s final return with a 95% percentile-bootstrap interval, and, '
    'for a rule, the probability that a seed of it ends above a seed of the '
    '`seeds` row of its agent (P(X > Y) + P(X = Y) / 2) and, for PBT and '
    'HyperTrick, above a seed of random search (the `random` row of its '
    'agent, the papers\' control arm, drawn from the whole prior; a '
    '`pbt-*` row without `-prior` starts near the defaults instead, so '
    'only a `-prior` row compares with it from the same prior), with a 95% '
    'bootstrap '
    'interval resampling each side\'s seeds; "better" or "worse" only where '
    f'that interval excludes 1/2 and each side has {stats.MIN_SEEDS} seeds '
    'or more. Runs on code without a later fix of their rule are left out '
    'of these tables (shown apart, last); rows with different code versions '
    'that no fix separates (the code column above) are pooled.')


def report(out: str) -> str:
  """Writes ``results.md``, ``results.csv`` and ``learning.png`` from the
  run JSONs in ``out``; returns the markdown table."""
  results = load_results(out)
  if not results:
    return 'no results yet'
  dropped = [(r, superseded_by(r)) for r in results]
  dropped = [(r, fix) for r, fix in dropped if fix]
  results = [r for r in results if not superseded_by(r)]
  by = {}  # (task, env steps per member, members) -> method -> runs
  for r in results:
    by.setdefault(cell_of(r), {}).setdefault(r['method'], []).append(r)
  lines = ['| task | env steps per member | members | method | seeds | best '
           'member, final | best member, last fifth | population mean, final '
           '| CEM mean policy | mean pairwise '
           'action distance: final (mean over the run) | final hparams at '
           'an edge of their range | lineages at the end | wall time per '
           'run | code |',
           '|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:'
           '|---|']
  csv_rows = ['task,env_steps_per_member,members,method,seed,best_final,'
              'best_late,mean_final,'
              'cem_mean_policy,diversity,diversity_run_mean,edge_share,'
              'lineages_at_end,wall_time_s']
  order = {m: i for i, m in enumerate(METHODS)}
  tasks = sorted(by, key=lambda k: (list(TASKS).index(k[0]), k[1], k[2]))
  for cell in tasks:
    task, steps, members = cell
    for method in sorted(by[cell], key=order.get):
      runs = sorted(by[cell][method], key=lambda r: r['seed'])
      best = [max(r['final_returns']) for r in runs]
      late = [late_best(r) for r in runs]
      mean = [float(np.mean(r['final_returns'])) for r in runs]
      cem = [r.get('cem_mean_policy_return') for r in runs]
      div = [r.get('rule_scalars', {}).get('mean_pairwise_action_distance')
             for r in runs]
      div_mean = [_run_mean(r, 'mean_pairwise_action_distance') for r in runs]
      edges = [edge_share(r) for r in runs]
      lineages = [r.get('lineages_at_end') for r in runs]
      wall = [r['wall_time_s'] for r in runs]
      lines.append(
          f'{_cell_columns(cell)} {method} | {len(runs)} | {_fmt(best)} | '
          f'{_fmt(late)} | {_fmt(mean)} | '
          f'{_fmt(cem) if any(c is not None for c in cem) else ""} | '
          + _diversity_cell(div, div_mean) + ' | ' + _share_cell(edges)
          + ' | ' + _lineages_cell(lineages)
          + f' | {np.mean(wall) / 60:.1f} min | '
          + ', '.join(sorted({r.get('code', 'not recorded') for r in runs}))
          + ' |')
      for r, b, bl, m, c, d, dm, e, g in zip(runs, best, late, mean, cem,
                                             div, div_mean, edges, lineages):
        csv_rows.append(f'{task},{steps},{members},{method},{r["seed"]},{b},'
                        f'{"" if bl is None else bl},{m},'
                        f'{"" if c is None else c},{"" if d is None else d},'
                        f'{"" if dm is None else dm},'
                        f'{"" if e is None else e},'
                        f'{"" if g is None else g},'
                        f'{r["wall_time_s"]:.1f}')
  machines = sorted({r['machine'] for r in results})
  dates = sorted({r['date'] for r in results})
  header = ('Members: the population size of each run (runs are '
            'compared only with runs of the same task, budget and size); '
            f'final = mean of '
            f'{results[0]["eval_episodes"]} noise-free episodes of each '
            f'member\'s final policy; "best member" is the best final of a '
            f'run, then mean ± sample std (ddof 1) over seeds; "last fifth" '
            f'is the best '
            f'member\'s evaluation averaged over the evaluation points in the '
            f'last {LATE_FRACTION:.0%} of the budget (the final one included; '
            f'the best member may differ between points). Machine: {"; ".join(machines)}. '
            f'Dates: {", ".join(dates)}. Held-out tasks (no default was '
            f'chosen on them, every method runs there untuned): '
            f'{", ".join(HELD_OUT)}.\n\n')
  matrix = matrix_summary(by)
  population = population_summary(by)
  reference = reference_statistics(by, tasks)
  table = (header + '\n'.join(lines) + '\n\n' + STATISTICS_NOTE + '\n\n'
           + '\n'.join(seed_statistics(by, tasks, order)) + '\n'
           + ('\n' + REFERENCE_NOTE + '\n\n' + '\n'.join(reference) + '\n'
              if reference else '')
           + ('\n' + MATRIX_NOTE + '\n\n' + '\n'.join(matrix) + '\n'
              if matrix else '')
           + ('\n' + POPULATION_NOTE + '\n\n' + '\n'.join(population)
              + '\n' if population else '')
           + '\n'.join(superseded_summary(dropped, by))
           + ('\n' if dropped else ''))
  with open(os.path.join(out, 'results.md'), 'w') as f:
    f.write(table)
  with open(os.path.join(out, 'results.csv'), 'w') as f:
    f.write('\n'.join(csv_rows) + '\n')
  _plot(out, by, tasks, order)
  return table


def _mean_of_curves(curves: list) -> tuple[np.ndarray, np.ndarray]:
  """The mean of ``[(step, value)]`` curves sampled at different steps:
  each interpolated linearly at every step of any of them, over the span
  that all of them cover."""
  grid = np.array(sorted({s for c in curves for s, _ in c}), np.float64)
  lo = max(c[0][0] for c in curves)
  hi = min(c[-1][0] for c in curves)
  grid = grid[(grid >= lo) & (grid <= hi)]
  ys = [np.interp(grid, [s for s, _ in c], [v for _, v in c]) for c in curves]
  return grid, np.mean(ys, axis=0)


def _plot(out: str, by: dict, tasks: list, order: dict) -> None:
  import matplotlib  # noqa: PLC0415

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415

  fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4),
                           squeeze=False)
  colors = plt.get_cmap('tab20')
  for ax, cell in zip(axes[0], tasks):
    task, budget, members = cell
    for method in sorted(by[cell], key=order.get):
      runs = by[cell][method]
      color = colors(2 * order[method] % 20 + (order[method] >= 10))
      if method == 'cemrl':
        # Its score is the mean policy, not the best of its samples; its
        # generations end at different env steps in different seeds.
        curves = [r['cem_mean_policy_curve'] for r in runs
                  if r.get('cem_mean_policy_curve')]
        if curves:
          steps, ys = _mean_of_curves(curves)
          ax.plot(steps, ys, marker='.', lw=1.2, color=color,
                  label=f'cemrl mean policy ({len(curves)} of {len(runs)} '
                        'seeds)')
        continue
      steps = sorted({p[0] for r in runs for p in r['curve']})
      ys = []
      for s in steps:
        vals = [p[1] for r in runs for p in r['curve'] if p[0] == s]
        ys.append(np.mean(vals))
      ax.plot(steps, ys, marker='.', lw=1.2, label=method, color=color)
    ax.set_title(f'{task}, {members} x {budget:,} env steps')
    ax.set_xlabel('env steps per member')
    ax.grid(alpha=0.3)
    ax.legend(fontsize='small', loc='lower right')
  axes[0][0].set_ylabel('best member\'s evaluation return (mean over seeds)')
  fig.tight_layout()
  fig.savefig(os.path.join(out, 'learning.png'), dpi=100)
  plt.close(fig)


# --------------------------------------------------------------------------


def main(argv: Optional[list] = None) -> None:
  args = parse_args(argv)
  if args.one:
    task, method, seed = args.one
    run_one(args, task, method, int(seed))
    return
  if not args.report_only:
    for task in args.tasks:
      for seed in args.seeds:
        for method in args.methods:
          why_not = fits(task, method)
          if why_not is not None:
            print(f'{task} {method}: skipped ({why_not})', flush=True)
            continue
          path = result_path(args.out, task, method, seed, args.env_steps,
                             args.population_size)
          if is_current(path) and not args.redo:
            print(f'{task} {method} seed {seed}: kept {path}', flush=True)
            continue
          print(f'{task} {method} seed {seed}: running', flush=True)
          command = [sys.executable, '-m', 'benchmarks.learning', '--one',
                     task, method, str(seed), '--out', args.out,
                     '--population-size', str(args.population_size),
                     '--eval-episodes', str(args.eval_episodes)]
          if args.env_steps is not None:
            command += ['--env-steps', str(args.env_steps)]
          if args.run_root is not None:
            command += ['--run-root', args.run_root]
          done = subprocess.run(command, check=False)
          if done.returncode != 0:
            print(f'{task} {method} seed {seed}: FAILED (exit '
                  f'{done.returncode})', flush=True)
  print(report(args.out))


if __name__ == '__main__':
  main()
