"""PBT's lineage file (``lineage.jsonl``): the events of each decision,
and the readers that rebuild a member's history from them (host-side;
numpy and files, not jittable).

One JSON object per line, written by the rule (``fastpbrl.rules.pbt.rule``)
through the run loop:

* ``{"event": "init", "step", "member", "hparams"}`` for each member of
  the initial population (``init_events``), or of a slot restarted from
  scratch (event ``"reset"``);
* ``{"event": "exploit", "step", "member", "parent", "old_hparams",
  "new_hparams", "fitness", "parent_fitness"}`` for each replaced member
  (``exploit_events``), with ``"reason": "diverged"`` for a member
  replaced because its loss or parameters became NaN or infinite.

``step`` counts update steps per member; events also carry ``env_steps``
(per member) when the caller gives it (the run loop does; the lineage
picture, ``fastpbrl.run.plots``, draws against it).

``read_lineage`` reads the file back; ``schedule(path, member)`` rebuilds
the hyperparameters that produced a member's current weights, following
copies back through its ancestors; ``founders`` names the line of weights
each member descends from.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from typing import Any, Iterable, Optional, Sequence

import numpy as np

from fastpbrl.devices.sharding import whole_value
from fastpbrl.rules.base import hparam_rows
from fastpbrl.rules.pbt.exploit import PBTResult

HParams = Any  # a NamedTuple of [N] hyperparameter arrays

LINEAGE = 'lineage.jsonl'  # the file's name in a run directory


def init_events(step: int, hparams: HParams,
                members: Optional[Iterable[int]] = None, event: str = 'init',
                env_steps: Optional[int] = None) -> list[dict]:
  """Host-side. The lineage events that start ``members``' lines of weights
  (all members by default): ``init``, or ``reset`` for slots restarted
  from scratch."""
  rows = hparam_rows(hparams)
  members = range(len(rows)) if members is None else members
  extra = {} if env_steps is None else {'env_steps': int(env_steps)}
  return [{'event': event, 'step': int(step), 'member': int(i),
           'hparams': rows[int(i)], **extra} for i in members]


def exploit_events(step: int, result: PBTResult, old_hparams: HParams,
                   fitness: Optional[Sequence[float]] = None,
                   env_steps: Optional[int] = None) -> list[dict]:
  """Host-side. The lineage events of ``result``: one per replaced member."""
  replaced = whole_value(result.replaced)  # gathered over processes
  parent = whole_value(result.parent)
  old_rows = hparam_rows(old_hparams)
  new_rows = hparam_rows(result.hparams)
  fit = None if fitness is None else np.asarray(fitness, np.float64)
  events = []
  for i in np.flatnonzero(replaced):
    p = int(parent[i])
    event = {'event': 'exploit', 'step': int(step), 'member': int(i),
             'parent': p, 'old_hparams': old_rows[i],
             'new_hparams': new_rows[i]}
    if env_steps is not None:
      event['env_steps'] = int(env_steps)
    if fit is not None:
      event['fitness'] = _json_float(fit[i])
      event['parent_fitness'] = _json_float(fit[p])
    events.append(event)
  return events


def _json_float(x: float) -> Optional[float]:
  return float(x) if math.isfinite(x) else None


def read_lineage(path: str | os.PathLike) -> list[dict]:
  """Host-side. All events of a lineage file, in the order written."""
  with open(path, encoding='utf-8') as f:
    return [json.loads(line) for line in f if line.strip()]


def founders(path_or_events) -> dict[int, tuple[int, int]]:
  """Host-side. The start of each member's current line of weights, as
  ``(member, step)`` of the ``init`` or ``reset`` event it descends from:
  the number of distinct values is the number of lineages still alive.

  The copies of one decision read the population as it was before it
  (consecutive copies with the same step and ``reason`` are one
  decision), as ``exploit_explore`` makes them.

  Raises:
    ValueError: if a copy's parent has no line of weights yet.
  """
  events = (read_lineage(path_or_events)
            if isinstance(path_or_events, (str, os.PathLike))
            else list(path_or_events))
  origin: dict[int, tuple[int, int]] = {}
  for _, decision in itertools.groupby(
      events, key=lambda e: (e['step'], e.get('reason'),
                             e['event'] == 'exploit')):
    before = dict(origin)
    for e in decision:
      if e['event'] != 'exploit':  # init / reset: a line of weights starts
        origin[e['member']] = (e['member'], e['step'])
      elif e['parent'] in before:
        origin[e['member']] = before[e['parent']]
      else:
        raise ValueError(f'lineage: member {e["member"]} copies member '
                         f'{e["parent"]} at step {e["step"]}, which has no '
                         'init event before it')
  return origin


def schedule(path_or_events, member: int,
             until_step: Optional[int] = None) -> list[tuple[int, dict]]:
  """Host-side. The hyperparameter schedule behind ``member``'s weights.

  Follows copies backwards: if ``member`` copied ``parent`` at step ``t``,
  its weights were trained by ``parent``'s schedule before ``t`` (events of
  ``parent`` AT step ``t`` are excluded: copies read the population as it
  was before the call) and by its own new hyperparameters from ``t`` on.

  Args:
    path_or_events: a lineage file path, or the list from ``read_lineage``.
    member: the member whose current weights to explain.
    until_step: consider only events at or before this step (default: all).

  Returns:
    ``[(step, hparams), ...]`` in increasing step order: run with
    ``hparams`` from ``step`` until the next entry's step. Re-running these
    alone reproduces the member's hyperparameter history.

  Raises:
    ValueError: if the file has no ``init``/``reset`` event for an ancestor.
  """
  events = (read_lineage(path_or_events)
            if isinstance(path_or_events, (str, os.PathLike))
            else list(path_or_events))
  out: list[tuple[int, dict]] = []
  current, limit, strict = int(member), until_step, False
  while True:
    own = [e for e in events if e['member'] == current
           and (limit is None or e['step'] < limit
                or (not strict and e['step'] == limit))]
    if not own:
      raise ValueError(f'lineage has no init event for member {current}'
                       + ('' if limit is None else f' before step {limit}'))
    last = own[-1]
    if last['event'] == 'exploit':
      out.append((last['step'], last['new_hparams']))
      current, limit, strict = last['parent'], last['step'], True
    else:  # init / reset: the start of this line of weights
      out.append((last['step'], last['hparams']))
      break
  return out[::-1]


def read_run_lineage(run_dir: str) -> list[dict]:
  """Host-side. ``run_dir``'s lineage events (``read_lineage``), ``[]``
  where the run wrote none yet: PBT's ``RuleOutputs.lineage``."""
  path = os.path.join(run_dir, LINEAGE)
  return read_lineage(path) if os.path.exists(path) else []


# Columns of ``lineage_table`` before the hyperparameters.
LINEAGE_DTYPES = {'event': 'object', 'env_steps': 'int64',
                  'update_steps': 'int64', 'member': 'int64',
                  'parent': 'Int64', 'fitness': 'float64',
                  'parent_fitness': 'float64', 'reason': 'object'}


def lineage_table(run_dir: str):
  """Host-side. ``run_dir``'s lineage as a DataFrame, one row per event
  (``load_run(run_dir).lineage``): ``event``, ``env_steps``,
  ``update_steps`` (the file's ``step``), ``member``, ``parent`` (exploits;
  else missing), ``fitness`` and ``parent_fitness`` (exploits), ``reason``
  (``diverged`` or missing), then the hyperparameters the member holds
  after the event; no rows, the same columns, without a file."""
  import pandas as pd  # noqa: PLC0415 (only readers of a run need it)

  events = read_run_lineage(run_dir)

  def after(e):  # the hyperparameters the member holds after the event
    return e.get('hparams', e.get('new_hparams', {}))

  names = sorted({name for e in events for name in after(e)})
  dtypes = {**LINEAGE_DTYPES, **{n: 'float64' for n in names}}
  if any('env_steps' not in e for e in events):  # from before events
    dtypes['env_steps'] = 'Int64'  # carried env steps: missing there
  nan = float('nan')
  rows = [{'event': e['event'], 'env_steps': e.get('env_steps'),
           'update_steps': e['step'], 'member': e['member'],
           'parent': e.get('parent'),
           # JSON has no NaN: the lineage writes a missing fitness as null.
           'fitness': _or(e.get('fitness'), nan),
           'parent_fitness': _or(e.get('parent_fitness'), nan),
           'reason': e.get('reason'),
           **{n: _or(after(e).get(n), nan) for n in names}} for e in events]
  return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def _or(value, default):
  return default if value is None else value
