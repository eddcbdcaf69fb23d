"""End-of-run pictures of a population's history (host-side; matplotlib Agg).

Besides ``returns.png`` (``fastpbrl.logs.logging.plot_returns``), a run ends with

* ``lineage.png`` (runs whose rule declares a lineage,
  ``RuleOutputs.lineage``: PBT's): the family tree of exploits. One horizontal line per member over env steps, coloured by the
  initial member whose weights it carries at that moment, and an arrow from
  the source member to the destination at every copy.
* ``hparams.png`` (every run, from ``hparams.csv``): each hyperparameter's
  value per member against env steps, one subplot per hyperparameter that
  varied (the fixed ones are named in the title), on a log axis where the
  search space draws it log-uniformly, with a marker on a member's line
  wherever it took another member's weights (PBT's exploits).

and the pictures its rule draws itself (``RuleOutputs.pictures``).

Both stay readable from 4 to 80 members: a legend and thick lines up to
``LEGEND_MEMBERS`` members, thin lines coloured along a colormap beyond.
The data each picture draws comes from a pure helper (``lineage_lines``,
``hparam_panels``) that the tests compare with the records; the pictures are
written atomically (a temporary file, then ``os.replace``).
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import os
import tempfile
from types import SimpleNamespace
from typing import Any, Collection, NamedTuple, Optional, Sequence

from fastpbrl.config.errors import ConfigError
from fastpbrl.config.saved import saved_settings
from fastpbrl.core.search_space import LogUniform
from fastpbrl.rules.base import RuleOutputs
from fastpbrl.rules.common import search_space_of
from fastpbrl.rules.registry import run_outputs

LEGEND_MEMBERS = 10  # members up to which lines get a legend entry each


class Segment(NamedTuple):
  """A stretch of one member's line in the lineage picture."""

  member: int  # the row (destination member)
  start: float  # env steps (or update steps, see ``LineageLines.x``)
  end: float
  root: int  # initial member whose weights this member carries here


class Copy(NamedTuple):
  """One exploit: ``member`` took ``parent``'s weights at ``at``."""

  at: float
  parent: int
  member: int


class LineageLines(NamedTuple):
  x: str  # 'env_steps' when every event has it, else 'step' (update steps)
  segments: list[Segment]
  copies: list[Copy]
  members: int


def lineage_lines(events: Sequence[dict], end: Optional[float] = None
                  ) -> LineageLines:
  """What ``lineage.png`` draws, from a lineage's events (in file order).

  Args:
    events: ``fastpbrl.rules.pbt.read_lineage``'s list: ``init`` /
      ``reset`` and ``exploit`` events.
    end: where the lines stop (default: the last event's position).
  """
  x = 'env_steps' if events and all('env_steps' in e for e in events) else 'step'
  members = 1 + max((int(e['member']) for e in events), default=-1)
  start = {}  # member -> start of its current segment
  root = {}  # member -> initial member its weights come from
  segments, copies = [], []
  last = max((float(e[x]) for e in events), default=0.0)
  end = last if end is None else max(float(end), last)
  # Copies at one step read the population as it was before that step
  # (``pbt.schedule``): resolve each step's roots from the previous ones.
  i = 0
  while i < len(events):
    at, call = float(events[i][x]), events[i]['step']
    batch = []
    while i < len(events) and events[i]['step'] == call:
      batch.append(events[i])
      i += 1
    before = dict(root)
    for e in batch:
      m = int(e['member'])
      if m in start and start[m] < at:
        segments.append(Segment(m, start[m], at, root[m]))
      if e['event'] == 'exploit':
        parent = int(e['parent'])
        copies.append(Copy(at, parent, m))
        root[m] = before.get(parent, parent)
      else:  # init / reset: a line of weights of its own
        root[m] = m
      start[m] = at
  for m in sorted(start):
    segments.append(Segment(m, start[m], end, root[m]))
  segments.sort(key=lambda s: (s.member, s.start))
  return LineageLines(x, segments, copies, members)


def read_hparams_csv(run_dir: str) -> list[dict]:
  """``hparams.csv``'s rows, numbers as floats (``member`` as int)."""
  with open(os.path.join(run_dir, 'hparams.csv'), newline='') as f:
    rows = list(csv.DictReader(f))
  return [{k: int(v) if k == 'member' else float(v) for k, v in r.items()}
          for r in rows]


def hparam_lines(rows: Sequence[dict]
                 ) -> dict[str, dict[int, tuple[list[float], list[float]]]]:
  """What ``hparams.png`` draws: ``{name: {member: (env_steps, values)}}``
  from ``hparams.csv``'s rows, in row order."""
  names = [k for k in (rows[0] if rows else {})
           if k not in ('env_steps', 'update_steps', 'member')]
  lines: dict[str, dict[int, tuple[list[float], list[float]]]] = {
      name: {} for name in names}
  for r in rows:
    for name in names:
      xs, ys = lines[name].setdefault(int(r['member']), ([], []))
      xs.append(float(r['env_steps']))
      ys.append(float(r[name]))
  return lines


class Panel(NamedTuple):
  """One subplot of ``hparams.png``."""

  name: str  # the hyperparameter
  log: bool  # a log y-axis
  lines: dict[int, tuple[list[float], list[float]]]  # member -> (x, values)
  exploits: list[tuple[int, float, float]]  # (member, env steps, new value)


class HParamPanels(NamedTuple):
  panels: list[Panel]  # the hyperparameters that varied, in column order
  fixed: dict[str, float]  # the others: the one value all members kept


def varies(values: Sequence[float], rel_tol: float = 1e-6) -> bool:
  """Whether ``values`` hold two that differ beyond ``rel_tol`` of their
  magnitude (float32 hyperparameters round-trip through the CSV)."""
  return any(not math.isclose(v, values[0], rel_tol=rel_tol, abs_tol=1e-12)
             for v in values)


def hparam_panels(rows: Sequence[dict],
                  log_fields: Optional[Collection[str]] = None,
                  exploits: Sequence[Copy] = ()) -> HParamPanels:
  """What ``hparams.png`` draws, from ``hparams.csv``'s rows.

  Args:
    rows: ``read_hparams_csv``'s rows.
    log_fields: the fields the search space draws log-uniformly (their
      axis is logarithmic); None when unknown: then a positive field
      spanning over 20x gets one.
    exploits: copies (``lineage_lines(...).copies`` in env steps): each
      marks the destination member's line at its env steps, at the value
      it had from there on.
  """
  panels, fixed = [], {}
  for name, lines in hparam_lines(rows).items():
    values = [v for _, ys in lines.values() for v in ys]
    if not varies(values):
      fixed[name] = values[0]
      continue
    positive = min(values) > 0
    log = positive and (name in log_fields if log_fields is not None
                        else max(values) > 20 * min(values))
    marks = []
    for c in exploits:
      xs, ys = lines.get(c.member, ([], []))
      k = bisect.bisect_right(xs, c.at) - 1  # the row in force at c.at
      if k >= 0:
        marks.append((c.member, c.at, ys[k]))
    panels.append(Panel(name, log, lines, marks))
  return HParamPanels(panels, fixed)


def log_uniform_fields(space) -> set[str]:
  """The fields a ``fastpbrl.core.search_space.SearchSpace`` draws
  log-uniformly."""
  return {name for name, dist in space.distributions
          if isinstance(dist, LogUniform)}


def saved_log_fields(run_dir: str) -> Optional[set[str]]:
  """``log_uniform_fields`` of the search space a run used, from its
  ``config.json``: its ``--search-space``, else its agent's default
  space (as ``rules.common.search_space_of`` resolves them for the run).
  None when the folder does not say: no config.json, a search-space file
  gone since, an agent not registered in this process."""
  try:
    saved = saved_settings(run_dir)
    return log_uniform_fields(search_space_of(SimpleNamespace(
        search_space=saved.get('search_space'),
        agent=saved.get('agent', 'td3'))))
  except (ConfigError, OSError, ValueError):
    return None


def _pyplot():
  import matplotlib  # noqa: PLC0415

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415
  return plt


def _style(members: int) -> dict:
  """Line width and colours for ``members`` lines."""
  plt = _pyplot()
  if members <= LEGEND_MEMBERS:
    cmap = plt.get_cmap('tab10')
    return {'lw': 1.6, 'color': lambda i: cmap(i % 10), 'legend': True}
  cmap = plt.get_cmap('viridis')
  return {'lw': max(0.3, 8.0 / members),
          'color': lambda i: cmap(i / max(1, members - 1)), 'legend': False}


def _save(fig, path: str) -> str:
  """Saves ``fig`` to ``path`` atomically and closes it."""
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)),
                             prefix='.tmp-', suffix='.png')
  os.close(fd)
  try:
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)
  finally:
    _pyplot().close(fig)
    if os.path.exists(tmp):
      os.remove(tmp)
  return path


def plot_lineage(events: Sequence[dict], path: str,
                 end: Optional[float] = None, title: str = '') -> str:
  """Draws ``lineage_lines(events, end)`` to ``path``; returns ``path``."""
  plt = _pyplot()
  data = lineage_lines(events, end)
  n = max(1, data.members)
  style = _style(n)
  fig, ax = plt.subplots(figsize=(10, min(16.0, 1.5 + 0.35 * n)))
  labelled = set()
  for s in data.segments:
    label = None
    if style['legend'] and s.root not in labelled:
      label = f'weights of member {s.root}'
      labelled.add(s.root)
    ax.plot([s.start, s.end], [s.member, s.member], color=style['color'](s.root),
            lw=style['lw'] * 2, solid_capstyle='butt', label=label)
  for c in data.copies:
    ax.annotate('', xy=(c.at, c.member), xytext=(c.at, c.parent),
                arrowprops={'arrowstyle': '->', 'lw': style['lw'],
                            'color': 'k', 'alpha': 0.7 if style['legend'] else 0.4,
                            'shrinkA': 0, 'shrinkB': 0})
  ax.set_xlabel('env steps per member' if data.x == 'env_steps'
                else 'update steps per member')
  ax.set_ylabel('member')
  ax.set_ylim(-0.7, n - 0.3)
  ax.invert_yaxis()
  if n <= 20:
    ax.set_yticks(range(n))
  ax.grid(alpha=0.3, axis='x')
  ax.set_title(title or f'lineage: {len(data.copies)} copies '
               '(arrow: source -> destination)')
  if style['legend'] and labelled:
    ax.legend(loc='upper left', bbox_to_anchor=(1.01, 1), fontsize='small')
  fig.tight_layout()
  return _save(fig, path)


def hparams_figure(data: HParamPanels, members: int, title: str = ''):
  """The figure of ``hparam_panels``: one subplot per panel (an ``axis`` of
  its own, titled by the hyperparameter), exploits as triangles."""
  plt = _pyplot()
  style = _style(members)
  panels = data.panels
  cols = max(1, min(3, len(panels)))
  nrows = max(1, math.ceil(len(panels) / cols))
  fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.9 * nrows),
                           squeeze=False)
  for k, panel in enumerate(panels):
    ax = axes[k // cols][k % cols]
    for member, (xs, ys) in sorted(panel.lines.items()):
      ax.plot(xs, ys, drawstyle='steps-post', lw=style['lw'],
              color=style['color'](member),
              label=f'member {member}' if style['legend'] else None)
    if panel.exploits:
      member, x, y = zip(*panel.exploits)
      ax.scatter(x, y, marker='v', s=24, zorder=3, edgecolors='k',
                 linewidths=0.5, c=[style['color'](m) for m in member],
                 label='took weights (exploit)')
    if panel.log:
      ax.set_yscale('log')
    ax.set_title(panel.name, fontsize='medium')
    ax.set_xlabel('env steps per member')
    ax.grid(alpha=0.3)
  for k in range(len(panels), nrows * cols):
    axes[k // cols][k % cols].axis('off')
  if not panels:
    axes[0][0].text(0.5, 0.5, 'no hyperparameter varied', ha='center',
                    va='center', transform=axes[0][0].transAxes)
  elif style['legend'] or any(p.exploits for p in panels):
    axes[0][0].legend(fontsize='x-small', loc='best')
  fixed = ', '.join(f'{k}={v:.4g}' for k, v in data.fixed.items())
  fig.suptitle((title or f'hyperparameters of {members} members')
               + (f'\nfixed: {fixed}' if fixed else ''))
  fig.tight_layout()
  return fig


def plot_hparams(rows: Sequence[dict], path: str, title: str = '',
                 log_fields: Optional[Collection[str]] = None,
                 exploits: Sequence[Copy] = ()) -> str:
  """Draws ``hparam_panels(rows, log_fields, exploits)`` to ``path``;
  returns ``path``."""
  members = 1 + max((int(r['member']) for r in rows), default=0)
  return _save(hparams_figure(hparam_panels(rows, log_fields, exploits),
                              members, title), path)


def plot_run(run_dir: str, space=None, outputs=None) -> list[str]:
  """Writes ``lineage.png`` (if the run's rule declares a lineage and it has
  events), ``hparams.png`` (if the run has ``hparams.csv``) and the rule's
  own pictures (``RuleOutputs.pictures``) in ``run_dir``; returns their
  paths.

  ``space``: the run's ``SearchSpace`` (its rule's, at the end of a run);
  by default read back from the folder (``saved_log_fields``).
  ``outputs``: the ``RuleOutputs`` its rule declares; by default those of
  the rule its ``config.json`` names (none without one).
  """
  if outputs is None:
    outputs = _saved_outputs(run_dir)
  written, copies = [], []
  title = os.path.basename(os.path.abspath(run_dir))
  end = None
  hparams = os.path.join(run_dir, 'hparams.csv')
  rows: list[dict[str, Any]] = read_hparams_csv(run_dir) if os.path.exists(
      hparams) else []
  if rows:
    end = max(r['env_steps'] for r in rows)
  events = outputs.lineage(run_dir) if outputs.lineage else []
  if events:
    x = 'env_steps' if all('env_steps' in e for e in events) else 'step'
    if x == 'env_steps':  # older lineages have update steps only
      copies = lineage_lines(events).copies
    written.append(plot_lineage(
        events, os.path.join(run_dir, 'lineage.png'),
        end=end if x == 'env_steps' else None,
        title=f'{title}: lineage (arrow: source -> destination)'))
  if rows:
    log_fields = (log_uniform_fields(space) if space is not None
                  else saved_log_fields(run_dir))
    written.append(plot_hparams(rows, os.path.join(run_dir, 'hparams.png'),
                                title=f'{title}: hyperparameters',
                                log_fields=log_fields, exploits=copies))
  written += [p for p in (draw(run_dir) for draw in outputs.pictures) if p]
  return written


def _saved_outputs(run_dir: str):
  """The ``RuleOutputs`` of the rule ``run_dir/config.json`` names."""
  path = os.path.join(run_dir, 'config.json')
  if not os.path.exists(path):
    return RuleOutputs()
  with open(path, encoding='utf-8') as f:
    return run_outputs(json.load(f))
