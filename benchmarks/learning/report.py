"""The learning report: ``results.md`` (every run's row, the statistics
over seeds, the TD3 matrix, the papers' comparison, the runs a later fix
left out), ``results.csv`` and ``learning.png``, rebuilt from the result
files alone."""

from __future__ import annotations

import math
import os
from typing import Optional

import numpy as np

from benchmarks.learning.matrix import MATRIX_NOTE, matrix_summary
from benchmarks.learning.population import (
    POPULATION_NOTE, population_summary)
from benchmarks.learning.store import load_results, superseded_by
from benchmarks.learning.suite import HELD_OUT, METHODS, TASKS
from benchmarks.learning.tables import (
    REFERENCE_NOTE, STATISTICS_NOTE, cell_columns, cell_of, edge_share,
    mean_spread, reference_statistics, seed_statistics, share_cell,
    superseded_summary)


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


MEANS_HEADER = (
    '| task | env steps per member | members | method | seeds | best '
    'member, final | best member, last fifth | population mean, final '
    '| CEM mean policy | mean pairwise '
    'action distance: final (mean over the run) | final hparams at '
    'an edge of their range | lineages at the end | wall time per '
    'run | code |\n'
    '|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:'
    '|---|')
CSV_HEADER = ('task,env_steps_per_member,members,method,seed,best_final,'
              'best_late,mean_final,'
              'cem_mean_policy,diversity,diversity_run_mean,edge_share,'
              'lineages_at_end,wall_time_s')


def _blank_if_none(value) -> str:
  return '' if value is None else str(value)


def means_rows(cell: tuple, method: str, runs: list) -> tuple[str, list]:
  """The table of means' row of ``method``'s ``runs`` in ``cell`` (mean
  and spread over seeds), and its CSV rows, one per seed."""
  runs = sorted(runs, key=lambda r: r['seed'])
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
  row = (f'{cell_columns(cell)} {method} | {len(runs)} | '
         f'{mean_spread(best)} | {mean_spread(late)} | {mean_spread(mean)} | '
         f'{mean_spread(cem) if any(c is not None for c in cem) else ""} | '
         + _diversity_cell(div, div_mean) + ' | ' + share_cell(edges)
         + ' | ' + _lineages_cell(lineages)
         + f' | {np.mean(wall) / 60:.1f} min | '
         + ', '.join(sorted({r.get('code', 'not recorded') for r in runs}))
         + ' |')
  task, steps, members = cell
  csv = [','.join([task, str(steps), str(members), method, str(r['seed']),
                   str(b), _blank_if_none(bl), str(m),
                   *map(_blank_if_none, (c, d, dm, e, g)),
                   f'{r["wall_time_s"]:.1f}'])
         for r, b, bl, m, c, d, dm, e, g in zip(runs, best, late, mean, cem,
                                                div, div_mean, edges,
                                                lineages)]
  return row, csv


def _header(results: list) -> str:
  """The report's opening paragraph: what the columns mean, and the
  machines, dates and held-out tasks of ``results``."""
  machines = sorted({r['machine'] for r in results})
  dates = sorted({r['date'] for r in results})
  return ('Members: the population size of each run (runs are '
          'compared only with runs of the same task, budget and size); '
          f'final = mean of '
          f'{results[0]["eval_episodes"]} noise-free episodes of each '
          f'member\'s final policy; "best member" is the best final of a '
          f'run, then mean ± sample std (ddof 1) over seeds; "last fifth" '
          f'is the best '
          f'member\'s evaluation averaged over the evaluation points in the '
          f'last {LATE_FRACTION:.0%} of the budget (the final one included; '
          f'the best member may differ between points). Machine: '
          f'{"; ".join(machines)}. '
          f'Dates: {", ".join(dates)}. Held-out tasks (no default was '
          f'chosen on them, every method runs there untuned): '
          f'{", ".join(HELD_OUT)}.\n\n')


def _section(note: str, lines: list) -> str:
  """A section of the report after the table over seeds: its note and its
  lines; empty where it has none."""
  return f'\n{note}\n\n' + '\n'.join(lines) + '\n' if lines else ''


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
  order = {m: i for i, m in enumerate(METHODS)}
  tasks = sorted(by, key=lambda k: (list(TASKS).index(k[0]), k[1], k[2]))
  lines, csv_rows = [MEANS_HEADER], [CSV_HEADER]
  for cell in tasks:
    for method in sorted(by[cell], key=order.get):
      row, csv = means_rows(cell, method, by[cell][method])
      lines.append(row)
      csv_rows += csv
  table = (_header(results) + '\n'.join(lines) + '\n\n' + STATISTICS_NOTE
           + '\n\n' + '\n'.join(seed_statistics(by, tasks, order)) + '\n'
           + _section(REFERENCE_NOTE, reference_statistics(by, tasks))
           + _section(MATRIX_NOTE, matrix_summary(by))
           + _section(POPULATION_NOTE, population_summary(by))
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
