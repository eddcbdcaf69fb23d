"""The learning benchmark's statistics over seeds (``benchmarks/stats.py``)
and the table cells they are built of: each rule's IQM, its probability of
improving on default seeds and on random search, our agents against
Stable-Baselines3's, the runs a later fix left out, and the share of
searched values at the edges of their ranges."""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np

from benchmarks import stats
from benchmarks.learning.suite import (
    METHODS, SEARCHING_MODULES, TASKS, agent_of, baseline_of, control_of)
from fastpbrl.config.agent_settings import agent_spec
from fastpbrl.rules.pbt import pb2


def mean_spread(values: list) -> str:
  """``mean ± sample std`` (ddof 1) of the finite values."""
  values = [v for v in values if v is not None and math.isfinite(v)]
  if not values:
    return '-'
  if len(values) == 1:
    return stats.fmt_value(values[0])
  return (f'{stats.fmt_value(np.mean(values))} ± '
          f'{stats.fmt_value(stats.sample_std(values))}')


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
  space = agent_spec(agent_of(flags)).default_search_space
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


# Our baseline rows and the Stable-Baselines3 rows that are their
# single-agent references, at the same settings.
REFERENCE_OF = {'seeds-td3': 'sb3-td3', 'seeds-sac': 'sb3-sac',
                'seeds-ppo': 'sb3-ppo', 'seeds-ppo-zoo': 'sb3-ppo-zoo'}


def versus(finals: dict, method: str, other: Optional[str]) -> list[str]:
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


def cell_columns(cell: tuple) -> str:
  task, steps, members = cell
  return f'| {task} | {steps:,} | {members} |'


def best_finals(by: dict, cell: tuple) -> dict:
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
    finals = best_finals(by, cell)
    for method in sorted(finals, key=order.get):
      cells = [stats.fmt_interval(stats.iqm_interval(finals[method]))]
      cells += versus(finals, method, baseline_of(method))
      cells += versus(finals, method, control_of(method))
      lines.append(f'{cell_columns(cell)} {method} | '
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
    finals = best_finals(by, cell)
    for ours, theirs in REFERENCE_OF.items():
      if ours not in finals or theirs not in finals:
        continue
      cells = [ours, theirs, str(len(finals[ours])), str(len(finals[theirs])),
               stats.fmt_interval(stats.iqm_interval(finals[ours])),
               stats.fmt_interval(stats.iqm_interval(finals[theirs])),
               *versus(finals, ours, theirs)]
      lines.append(f'{cell_columns(cell)} ' + ' | '.join(cells) + ' |')
  if not lines:
    return []
  return ['| task | env steps per member | members | ours | SB3 | seeds '
          '(ours) | seeds (SB3) | ours: IQM [95% CI] | SB3: IQM [95% CI] | '
          'P(ours better) [95% CI] | verdict |',
          '|---|---:|---:|---|---|---:|---:|---:|---:|---:|---|'] + lines


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
        f'{cell_columns(cell)} {method} | '
        + ', '.join(str(r['seed']) for r in runs) + ' | '
        + ', '.join(sorted({str(r.get('code')) for r in runs}))
        + f' | {fix} | {mean_spread(best)} | {poi} | {verdict} | '
        + share_cell([edge_share(r) for r in runs]) + ' |')
  return lines


def share_cell(shares: list) -> str:
  """The mean share over the seeds that have one, as a percentage."""
  known = [s for s in shares if s is not None]
  return f'{np.mean(known):.0%}' if known else ''


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


def n_seeds(count: int) -> str:
  return f'{count} seed' + ('' if count == 1 else 's')


def verdict_cell(rule: Optional[list], baseline: Optional[list]) -> str:
  if rule is None:
    return 'not run'
  if baseline is None:
    return f'no baseline yet, {n_seeds(len(rule))}'
  poi, verdict = compare(tuple(rule), tuple(baseline))
  return f'{verdict}: P {stats.fmt_interval(poi, 2)}, {n_seeds(len(rule))}'
