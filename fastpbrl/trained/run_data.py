"""A run folder's results as pandas tables (host-side; nothing here is
jittable).

    run = fastpbrl.load_run('runs/pbt-td3-Pendulum-v1-20260101-120000')
    run.evaluations.pivot(index='env_steps', columns='member',
                          values='mean_return').plot()
    run.hparam_schedule()    # the best member's hyperparameters over time

``load_run`` reads what a run writes under its folder (``fastpbrl.logs.logging``
writes and reads each file; its readers are reused here, so that a table
says what the run's own summary and plot say): ``members/member_XXX.csv``
(every episode), ``hparams.csv``, ``rule.csv``, ``final_returns.json`` and
``config.json``; and the outputs its rule declares (``Rule.outputs``, the
rule ``config.json`` names): its tables (``tables``; PBT's lineage), its
lineage (``lineage_events``) and schedule (``hparam_schedule``). A run
stopped before its final evaluation (killed, or not finished yet) loads as
well: its ``final_returns`` is empty and its best member is the one whose
last evaluation is best.

pandas is a core dependency rather than an extra: ``load_run`` exists to
hand back DataFrames (as Ray Tune's ``ResultGrid.get_dataframe()`` does),
an extra would make it fail on a default install, and pandas is a
well-kept library with wheels for every platform fastpbrl runs on.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Optional

import numpy as np
import pandas as pd

from fastpbrl.config.errors import ConfigError
from fastpbrl.config.saved import saved_settings
from fastpbrl.logs.logging import (EPISODE_FIELDS, FINAL_RETURNS, HPARAMS_CSV,
                                   evaluation_points, read_final_returns,
                                   read_member_csvs, read_rule_csv)
from fastpbrl.rules.base import RuleOutputs
from fastpbrl.rules.registry import run_outputs

# Columns of ``RunData.episodes``: the member CSVs' (``EPISODE_FIELDS``:
# wall_time, env_steps, update_steps, member, episode_return,
# episode_length, evaluation, true_objective: NaN where the env reports
# none, and in CSVs written before the column was).
EPISODE_DTYPES = dict(zip(EPISODE_FIELDS, ('float64', 'int64', 'int64',
                                           'int64', 'float64', 'int64',
                                           'bool', 'float64')))
EVALUATION_DTYPES = {'member': 'int64', 'env_steps': 'int64',
                     'wall_time': 'float64', 'mean_return': 'float64'}
KEYS = ('env_steps', 'update_steps', 'member')  # hparams.csv's first columns



def best_member(run_dir: str) -> int:
  """The member with the highest final-evaluation mean in ``run_dir``'s
  ``final_returns.json``.

  Raises:
    ConfigError: the run has no final evaluation (unfinished, or killed).
  """
  try:
    returns = read_final_returns(run_dir)['final_returns']
  except FileNotFoundError:
    raise ConfigError(
        f'{run_dir!r} has no {FINAL_RETURNS} (the run has not finished): '
        'pass a member index instead of best') from None
  return int(np.argmax(returns))


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class RunData:
  """A run folder's results (``load_run``). Steps are env steps per member
  (each member's own for its episodes), as everywhere in fastpbrl.

  The tables are plain DataFrames: change them on a copy
  (``run.hparams.copy()``), as this object hands the same ones to every
  caller (``hparam_schedule`` reads ``hparams``).
  """

  run_dir: str
  """The run folder, as given."""
  config: dict
  """The settings the run saved (``config.json``; its rule under ``rule``)."""
  episodes: pd.DataFrame
  """Every training and evaluation episode of every member, in the order
  written: ``wall_time``, ``env_steps``, ``update_steps``, ``member``,
  ``episode_return``, ``episode_length``, ``evaluation`` (bool),
  ``true_objective`` (the env's own score of the episode; NaN where the
  env reports none)."""
  evaluations: pd.DataFrame
  """One row per evaluation of a member: ``member``, ``env_steps`` (where
  its policy was frozen), ``wall_time``, ``mean_return`` (the mean of its
  ``eval_episodes`` episodes), as the run's return curve
  (``fastpbrl.logs.logging.evaluation_points``); a finished run's last row per
  member is its final evaluation."""
  hparams: pd.DataFrame
  """``hparams.csv``: every member's hyperparameters at chosen learner calls
  (``env_steps``, ``update_steps``, ``member``, one float column per
  hyperparameter)."""
  lineage: pd.DataFrame
  """The table its rule declares as ``'lineage'`` (``tables['lineage']``;
  PBT's: one row per event, ``fastpbrl.rules.pbt.lineage.lineage_table``
  gives the columns); an empty DataFrame for a rule that declares none."""
  rule: pd.DataFrame
  """``rule.csv``: the rule's scalars (PBT's exploits, DvD's lambda, ...),
  one column each, indexed by ``env_steps``; no columns when the rule has
  none."""
  final_returns: pd.Series
  """Each member's final evaluation (``final_returns.json``), indexed by
  ``member``; empty when the run stopped before it."""
  best_member: Optional[int]
  """The member with the best final evaluation (``fastpbrl.best_member``);
  for a run stopped before it, the member whose last evaluation is best;
  ``None`` when no member was evaluated yet."""
  lineage_events: list
  """The events of the lineage its rule declares (``RuleOutputs.lineage``;
  PBT's as written); ``[]`` for a rule that declares none."""
  tables: dict = dataclasses.field(default_factory=dict)
  """Every table its rule declares (``RuleOutputs.tables``), by name:
  ``{}`` for a rule that declares none."""
  outputs: RuleOutputs = RuleOutputs()
  """What its rule declares (``Rule.outputs``; the rule named in
  ``config.json``)."""

  def __repr__(self) -> str:
    return (f'RunData({self.run_dir!r}, rule={self.config.get("rule")!r}, '
            f'members={self.population_size}, '
            f'episodes={len(self.episodes)}, '
            f'evaluations={len(self.evaluations)}, '
            f'lineage={len(self.lineage)}, finished={self.finished}, '
            f'best_member={self.best_member})')

  @property
  def finished(self) -> bool:
    """Whether the run wrote its final evaluation."""
    return not self.final_returns.empty

  @property
  def population_size(self) -> int:
    return int(self.config['population_size'])

  def hparam_schedule(self, member: Optional[int] = None) -> pd.DataFrame:
    """The hyperparameters behind ``member``'s final weights over time.

    PBT: when ``member`` copied member ``s`` at env step ``t``, its weights
    were trained with ``s``'s hyperparameters before ``t``, and so on back
    through ``s``'s own copies: the schedule its rule declares
    (``RuleOutputs.schedule``; PBT's ``fastpbrl.rules.pbt.schedule``, which
    ``fastpbrl pbt --rerun-lineage`` re-runs). Other rules (no lineage or
    no schedule declared): the member's own rows of ``hparams.csv`` where
    they change.

    Args:
      member: a member index; default: ``best_member``.

    Returns:
      One row per change, indexed by ``env_steps`` (in force from there to
      the next row): ``update_steps``, then one column per hyperparameter.

    Raises:
      ConfigError: ``member`` is out of range, or no member was evaluated
        yet and none was given.
    """
    member = self._member(member)
    names = [c for c in self.hparams.columns if c not in KEYS]
    if not self.lineage_events or self.outputs.schedule is None:
      own = self.hparams[self.hparams['member'] == member]
      changed = own[names].ne(own[names].shift()).any(axis=1) | (
          np.arange(len(own)) == 0)
      return own.loc[changed, ['env_steps', 'update_steps', *names]
                     ].set_index('env_steps')
    try:
      entries = self.outputs.schedule(self.lineage_events, member)
    except (KeyError, ValueError) as e:
      raise ConfigError(f'{self._lineage_name()}: {e}') from None
    env_steps = self._env_steps_of_update_steps()
    missing = [step for step, _ in entries if step not in env_steps]
    if missing:
      raise ConfigError(
          f'{self._lineage_name()} has no env steps for update step '
          f'{missing[0]} (a run older than env steps in the lineage): the '
          "rule's schedule(events, member) gives it in update steps")
    table = pd.DataFrame(
        [{'env_steps': env_steps[step], 'update_steps': step, **values}
         for step, values in entries])
    if set(names) != set(entries[0][1]):
      names = sorted(entries[0][1])
    return table[['env_steps', 'update_steps', *names]].astype(
        {'env_steps': 'int64', 'update_steps': 'int64',
         **{n: 'float64' for n in names}}).set_index('env_steps')

  def _member(self, member: Optional[int]) -> int:
    if member is None:
      if self.best_member is None:
        raise ConfigError(f'{self.run_dir!r} has no evaluation yet: pass '
                          'the member, hparam_schedule(member=0)')
      return self.best_member
    n = self.population_size
    if not (isinstance(member, (int, np.integer)) and 0 <= member < n):
      raise ConfigError(f'member {member!r} is out of range: the run has '
                        f'{n} members (0..{n - 1})')
    return int(member)

  def _lineage_name(self) -> str:
    """The lineage's file, for messages (the rule's first declared file)."""
    return os.path.join(self.run_dir, *self.outputs.files[:1])

  def _env_steps_of_update_steps(self) -> dict[int, int]:
    """Update steps -> env steps per member, from the lineage's events and
    ``hparams.csv`` (whose rows are written at every decision)."""
    out = dict(zip(self.hparams['update_steps'].tolist(),
                   self.hparams['env_steps'].tolist()))
    out.update({int(e['step']): int(e['env_steps'])
                for e in self.lineage_events if 'env_steps' in e})
    return out


def load_run(run_dir: str | os.PathLike) -> RunData:
  """Reads a run folder (finished, stopped or still running) into tables.

      run = fastpbrl.load_run('runs/pbt-td3-Pendulum-v1-20260101-120000')
      run.evaluations.groupby('member')['mean_return'].max()

  Args:
    run_dir: the folder of a run (``runs/<rule>-<agent>-<env>-<time>``, or
      ``--run-dir``).

  Raises:
    ConfigError: ``run_dir`` is not a fastpbrl run folder (it has no
      ``config.json``).
  """
  run_dir = os.fspath(run_dir)
  if not os.path.isdir(run_dir):
    raise ConfigError(f'no folder {run_dir!r} (a run folder is '
                      'runs/<rule>-<agent>-<env>-<time>, or --run-dir)')
  config = saved_settings(run_dir, flag='run folder')
  eval_episodes = int(config.get('eval_episodes') or 1)
  members = _member_rows(run_dir)
  episodes = _table([row for rows in members for row in rows],
                    EPISODE_DTYPES)
  evaluations = _table(
      [{'member': member, 'env_steps': steps, 'wall_time': wall,
        'mean_return': mean}
       for member, rows in _by_member(members)
       for steps, wall, mean in evaluation_points(rows, eval_episodes)],
      EVALUATION_DTYPES)
  final = _final_returns(run_dir)
  outputs = run_outputs(config)
  tables = {name: read(run_dir) for name, read in outputs.tables.items()}
  return RunData(
      run_dir=run_dir, config=config, episodes=episodes,
      evaluations=evaluations, hparams=_hparams(run_dir),
      lineage=tables.get('lineage', pd.DataFrame()), rule=_rule(run_dir),
      final_returns=final,
      best_member=(best_member(run_dir) if not final.empty
                   else _best_last_evaluation(evaluations)),
      lineage_events=(outputs.lineage(run_dir) if outputs.lineage else []),
      tables=tables, outputs=outputs)


def _member_rows(run_dir: str) -> list[list[dict]]:
  """Each member CSV's rows, less a last line a crash cut short (fewer
  fields than the header)."""
  if not os.path.isdir(os.path.join(run_dir, 'members')):
    return []
  return [[r for r in rows if None not in r.values()]
          for rows in read_member_csvs(run_dir)]


def _by_member(members: list[list[dict]]):
  """``(member index, rows)`` for each member CSV that has rows."""
  for rows in members:
    if rows:
      yield int(rows[0]['member']), rows


def _table(rows: list[dict], dtypes: dict) -> pd.DataFrame:
  """``rows`` (strings as the CSVs hold them, or numbers) as a DataFrame with
  exactly ``dtypes``' columns and types; numbers are parsed by Python
  (``float(repr(x)) == x``)."""
  columns = {name: [_PARSE[dtype](r.get(name, '')) for r in rows]
             for name, dtype in dtypes.items()}
  return pd.DataFrame(columns, columns=list(dtypes)).astype(dtypes)


_PARSE = {'int64': int,
          'float64': lambda v: math.nan if v == '' else float(v),
          'bool': lambda v: v == 'True' if isinstance(v, str) else bool(v)}


def _hparams(run_dir: str) -> pd.DataFrame:
  path = os.path.join(run_dir, HPARAMS_CSV)
  fields, rows = list(KEYS), []
  if os.path.exists(path):
    with open(path, newline='') as f:
      reader = csv.DictReader(f)
      fields = list(reader.fieldnames or KEYS)
      rows = [r for r in reader if None not in r.values()]  # none cut short
  # An empty field (a hyperparameter a resumed run's rows lack) is NaN.
  return _table(rows, {name: 'int64' if name in KEYS else 'float64'
                       for name in fields})


def _rule(run_dir: str) -> pd.DataFrame:
  # dict(points): one value per scalar and env step, the last written
  # should a step repeat.
  table = pd.DataFrame({name: pd.Series(dict(points), dtype='float64')
                        for name, points in read_rule_csv(run_dir).items()})
  table = table.sort_index()
  table.index = table.index.astype('int64').rename('env_steps')
  return table


def _final_returns(run_dir: str) -> pd.Series:
  if os.path.exists(os.path.join(run_dir, FINAL_RETURNS)):
    values = read_final_returns(run_dir)['final_returns']
  else:
    values = []
  return pd.Series(values, dtype='float64', name='final_return',
                   index=pd.RangeIndex(len(values), name='member'))


def _best_last_evaluation(evaluations: pd.DataFrame) -> Optional[int]:
  """The member whose last evaluation has the highest mean (the first on a
  tie, as ``np.argmax``); ``None`` without evaluations."""
  if evaluations.empty:
    return None
  last = evaluations.groupby('member')['mean_return'].last()
  return int(last.idxmax())
