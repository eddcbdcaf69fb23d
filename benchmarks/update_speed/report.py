"""Output (host-side): ``update_speed.json``, ``update_speed.csv``, the
Figure 2 style plot ``update_speed.png`` and the tables of ``summary.md``.
"""

from __future__ import annotations

import csv
import json
import os
from typing import Sequence

from benchmarks.update_speed.config import (AGENTS, COLUMNS, IMPLEMENTATIONS,
                                            LABELS)


def _reference(rows: Sequence[dict], agent: str):
  """Per-N member-step times of the speed-up reference, and its label.

  Torch sequential with the fewest steps per call (1), as in the paper's
  Figure 2; JAX sequential when torch was not measured.
  """
  for impl in ('torch-sequential', 'jax-sequential'):
    cands = [r for r in rows if r['mode'] == 'independent'
             and r['agent'] == agent and r['implementation'] == impl
             and r['status'] == 'ok']
    if cands:
      steps = min(r['steps_per_call'] for r in cands)
      label = f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}/call'
      return {r['population_size']: r['time_per_member_step_ms']
              for r in cands if r['steps_per_call'] == steps}, label
  return {}, None


def _series(rows: Sequence[dict], mode: str, agent: str):
  """``{(implementation, steps): [(N, row)]}`` of the ok rows."""
  series: dict = {}
  for r in rows:
    if r['mode'] == mode and r['agent'] == agent and r['status'] == 'ok':
      series.setdefault((r['implementation'], r['steps_per_call']), []).append(
          (r['population_size'], r))
  order = {impl: i for i, impl in enumerate(IMPLEMENTATIONS)}
  return {key: sorted(series[key], key=lambda t: t[0])
          for key in sorted(series, key=lambda k: (order[k[0]], k[1]))}


_MARKERS = {'jax-vectorized': 'o', 'jax-sequential': 's', 'jax-parallel': '^',
            'torch-sequential': 'D', 'torch-vectorized': 'v',
            'torch-parallel': 'x'}
_COLORS = {'jax-vectorized': 'tab:blue', 'jax-sequential': 'tab:orange',
           'jax-parallel': 'tab:green', 'torch-sequential': 'tab:red',
           'torch-vectorized': 'tab:purple', 'torch-parallel': 'tab:brown'}


def _log2_axes(ax, sizes: Sequence[int]) -> None:
  ax.set_xscale('log', base=2)
  ax.set_xticks(sizes)
  ax.set_xticklabels([str(n) for n in sizes])
  ax.minorticks_off()


def plot(rows: Sequence[dict], meta: dict, path: str) -> None:
  """Figure 2 style: speed-up over torch sequential (1 step per call) vs N,
  one panel per agent, plus a Figure 4 panel for the shared critic."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  sizes = sorted({r['population_size'] for r in rows if r['status'] == 'ok'})
  agents = [a for a in AGENTS if _series(rows, 'independent', a)]
  shared = _series(rows, 'shared-critic', 'td3')
  panels = len(agents) + bool(shared)
  fig, axes = plt.subplots(1, max(panels, 1), figsize=(5.2 * max(panels, 1), 4.4),
                           squeeze=False)
  axes = list(axes[0])
  references = []
  for ax, agent in zip(axes, agents):
    ref, ref_label = _reference(rows, agent)
    references.append(ref_label)
    for (impl, steps), points in _series(rows, 'independent', agent).items():
      if ref:
        pts = [(n, ref[n] / r['time_per_member_step_ms']) for n, r in points
               if n in ref]
      else:
        pts = [(n, r['time_per_member_step_ms']) for n, r in points]
      if not pts:
        continue
      ax.plot(*zip(*pts), marker=_MARKERS[impl], color=_COLORS[impl],
              linestyle='-' if steps == 1 else '--',
              label=f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}')
    _log2_axes(ax, sizes)
    if ref:
      ax.axhline(1.0, color='grey', linewidth=0.8)
      ax.set_yscale('log', base=2)
      ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter('%g'))
      ax.set_ylabel(f'speed-up over {ref_label}')
    else:
      ax.set_yscale('log')
      ax.set_ylabel('ms per member-step')
    ax.set_xlabel('population size N')
    ax.set_title(f'{agent.upper()} (batch {points[0][1]["batch_size"]})')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  if shared:
    ax = axes[len(agents)]
    for (impl, steps), points in shared.items():
      ax.plot([n for n, _ in points],
              [r['time_per_update_step_ms'] for _, r in points],
              marker=_MARKERS[impl], color=_COLORS[impl],
              linestyle='-' if steps == 1 else '--',
              label=f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}')
    _log2_axes(ax, sizes)
    ax.set_yscale('log')
    ax.set_xlabel('population size N')
    ax.set_ylabel('ms per population update step')
    ax.set_title('TD3, one shared critic (CEM-RL / DvD)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  if not panels:
    axes[0].text(0.5, 0.5, 'no successful measurement', ha='center')
  title = f'Update speed on {meta["machine"]["device"]}'
  if any(r and not r.startswith('torch') for r in references):
    title += ('\n(torch sequential not measured: speed-ups are over JAX '
              'sequential)')
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _fmt_ms(value: float) -> str:
  return f'{value:.3g}' if value < 100 else f'{value:.0f}'


def summary_markdown(rows: Sequence[dict], meta: dict) -> str:
  """Markdown tables: ms per member-step (speed-up over the reference) per
  configuration and N, compile times, fraction of the matmul peak."""
  peak = meta.get('matmul_run_peak_flop_per_s',
                  meta['matmul']['peak_flop_per_s'])
  lines = [f'Device: {meta["machine"]["device"]}; matmul peak '
           f'{peak / 1e9:.0f} GFLOP/s ({meta["matmul"]["size"]}x'
           f'{meta["matmul"]["size"]} f32, best measurement of the run).', '']
  sizes = sorted({r['population_size'] for r in rows})
  for mode in ('independent', 'shared-critic'):
    for agent in AGENTS:
      series = _series(rows, mode, agent)
      if not series:
        continue
      ref, ref_label = (_reference(rows, agent) if mode == 'independent'
                        else ({}, None))
      unit = ('ms per member-step' if mode == 'independent'
              else 'ms per population update step')
      what = (f'speed-up over {ref_label}' if ref else None)
      lines.append(f'### {agent.upper()}{" shared critic" if mode != "independent" else ""}: '
                   f'{unit}' + (f' ({what})' if what else ''))
      lines.append('')
      lines.append('| implementation | steps/call | '
                   + ' | '.join(f'N={n}' for n in sizes)
                   + ' | compile (s) | % of matmul peak |')
      lines.append('|---|---:|' + '---:|' * len(sizes) + '---:|---:|')
      for (impl, steps), points in series.items():
        by_n = dict(points)
        cells = []
        for n in sizes:
          r = by_n.get(n)
          if r is None:
            cells.append('')
            continue
          key = ('time_per_member_step_ms' if mode == 'independent'
                 else 'time_per_update_step_ms')
          cell = _fmt_ms(r[key])
          if ref and n in ref:
            cell += f' ({ref[n] / r["time_per_member_step_ms"]:.2g}x)'
          cells.append(cell)
        compiles = [r['compile_s'] for _, r in points
                    if r['compile_s'] is not None]
        compile_cell = (f'{min(compiles):.1f}-{max(compiles):.1f}'
                        if compiles else 'eager')
        fractions = [r['fraction_of_matmul_peak'] for _, r in points
                     if r['fraction_of_matmul_peak'] is not None]
        frac_cell = (f'{100 * min(fractions):.0f}-{100 * max(fractions):.0f}'
                     if fractions else '')
        lines.append(f'| {LABELS[impl]} | {steps} | ' + ' | '.join(cells)
                     + f' | {compile_cell} | {frac_cell} |')
      lines.append('')
  not_ok = [r for r in rows if r['status'] != 'ok']
  if not_ok:
    lines.append('Not measured:')
    lines.append('')
    seen = set()
    for r in not_ok:
      key = (r['mode'], r['agent'], r['implementation'], r['steps_per_call'],
             r['reason'])
      if key in seen:
        continue
      seen.add(key)
      ns = [x['population_size'] for x in not_ok
            if (x['mode'], x['agent'], x['implementation'],
                x['steps_per_call'], x['reason']) == key]
      lines.append(f'- {r["mode"]} {r["agent"]} {r["implementation"]} '
                   f'steps={r["steps_per_call"]} N={",".join(map(str, ns))}: '
                   f'{r["status"]}: {r["reason"]}')
    lines.append('')
  return '\n'.join(lines)


def apply_run_peak(meta: dict, rows: Sequence[dict]) -> None:
  """Sets every row's fraction of the matmul peak against the best matmul
  measurement of the run (``meta['matmul_run_peak_flop_per_s']``)."""
  peaks = [meta['matmul']['peak_flop_per_s']] + [
      r['matmul_peak_flop_per_s'] for r in rows
      if r.get('matmul_peak_flop_per_s')]
  peak = max(peaks)
  meta['matmul_run_peak_flop_per_s'] = peak
  for r in rows:
    if r.get('achieved_flop_per_s'):
      r['fraction_of_matmul_peak'] = r['achieved_flop_per_s'] / peak


def write_results(out: str, meta: dict, rows: Sequence[dict]) -> dict:
  """Writes JSON, CSV, PNG and summary.md to ``out``; returns their paths."""
  apply_run_peak(meta, rows)
  os.makedirs(out, exist_ok=True)
  paths = {name: os.path.join(out, name) for name in (
      'update_speed.json', 'update_speed.csv', 'update_speed.png',
      'summary.md')}
  with open(paths['update_speed.json'], 'w') as f:
    json.dump({'meta': meta, 'rows': list(rows)}, f, indent=1)
  with open(paths['update_speed.csv'], 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: ('' if row.get(k) is None else row[k])
                       for k in COLUMNS})
  plot(rows, meta, paths['update_speed.png'])
  with open(paths['summary.md'], 'w') as f:
    f.write(summary_markdown(rows, meta))
  return paths
