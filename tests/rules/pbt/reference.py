"""Test-only stand-ins for what the package no longer carries: an
independent reference for PBT's fitness bookkeeping, and a lineage writer.

``FitnessTracker`` keeps each member's last ``window`` evaluation returns
in deques, as a reader would write it from the 2022 paper's "mean of the
last 10 episode returns"; the rule (``fastpbrl.rules.pbt.rule``) keeps the
same history as one ``[N, window]`` array (``record``, ``fitness_of``,
``inherit``). ``tests/rules/pbt/test_exploit.py`` drives both with the same
events and compares them. It was ``fastpbrl.population.pbt.FitnessTracker``
(with ``mean_of_last``), which nothing in the package used.

``write_lineage`` appends events to a lineage file as the run loop does
(one sorted JSON object per line); it replaces
``fastpbrl.population.pbt.Lineage``, which only tests used.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Iterable, Optional, Sequence

import numpy as np


def mean_of_last(history: Sequence[Sequence[float]],
                 window: int = 10) -> np.ndarray:
  """Host-side. ``[N]`` fitness: the mean of each member's last ``window``
  values (NaN for a member with none)."""
  if window < 1:
    raise ValueError(f'window must be >= 1, got {window}')
  out = np.full((len(history),), np.nan, np.float64)
  for i, values in enumerate(history):
    values = list(values)[-window:]
    if values:
      out[i] = float(np.mean(values))
  return out


class FitnessTracker:
  """Host-side per-member fitness: mean of the last ``window`` evaluation
  returns (the 2022 paper's PBT uses the last 10 episode returns), or of a
  user-given "true objective" (Sample Factory's ``true_objective``: e.g. a
  sparse win/loss score while training on a shaped reward).

  After ``exploit_explore``, call ``on_exploit(parent, replaced)``: a replaced
  member now runs its parent's weights, so it takes over its parent's
  history.
  """

  def __init__(self, population_size: int, window: int = 10,
               use_true_objective: bool = False):
    if population_size < 1:
      raise ValueError(f'population_size must be >= 1, got {population_size}')
    if window < 1:
      raise ValueError(f'window must be >= 1, got {window}')
    self.window = window
    self.use_true_objective = use_true_objective
    self._history = [collections.deque(maxlen=window)
                     for _ in range(population_size)]

  def record(self, member: int, episode_return: float,
             true_objective: Optional[float] = None) -> None:
    """Adds one evaluation episode of ``member``."""
    if self.use_true_objective:
      if true_objective is None:
        raise ValueError('FitnessTracker(use_true_objective=True) needs a '
                         'true_objective for every record')
      value = true_objective
    else:
      value = episode_return
    self._history[member].append(float(value))

  def fitness(self) -> np.ndarray:
    """``[N]`` float32, NaN for members not evaluated yet (never replaced,
    never parents)."""
    return mean_of_last(self._history, self.window).astype(np.float32)

  def on_exploit(self, parent: np.ndarray, replaced: np.ndarray) -> None:
    parent, replaced = np.asarray(parent), np.asarray(replaced)
    old = [list(h) for h in self._history]
    for i in np.flatnonzero(replaced):
      self._history[i] = collections.deque(old[int(parent[i])],
                                           maxlen=self.window)

  def reset(self, members: Iterable[int]) -> None:
    """Forgets the history of ``members`` (e.g. slots restarted afresh)."""
    for i in members:
      self._history[int(i)].clear()

  def history(self) -> list[list[float]]:
    """Each member's recorded values (at most ``window``), oldest first;
    JSON-friendly, for checkpoints."""
    return [list(h) for h in self._history]

  def set_history(self, history: Sequence[Sequence[float]]) -> None:
    """Restores ``history()`` output (e.g. from a checkpoint)."""
    if len(history) != len(self._history):
      raise ValueError(f'history has {len(history)} members, the tracker '
                       f'{len(self._history)}')
    self._history = [collections.deque((float(v) for v in values),
                                       maxlen=self.window)
                     for values in history]


def write_lineage(path: str | os.PathLike, events: Iterable[dict]) -> int:
  """Appends ``events`` (``fastpbrl.rules.pbt.lineage``'s ``init_events``
  or ``exploit_events``) to the lineage file ``path``; returns how many."""
  events = list(events)
  with open(path, 'a', encoding='utf-8') as f:
    for event in events:
      f.write(json.dumps(event, sort_keys=True) + '\n')
  return len(events)
