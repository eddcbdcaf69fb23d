"""Run logs (host-side; not jittable): a CSV per member, the trackers of
``--track`` (TensorBoard files by default; W&B or MLflow, see
``fastpbrl.logs.tracking``), a progress bar, the end-of-run summary table and plot.

Library choices: ``tensorboardX`` writes TensorBoard event files without
TensorFlow; ``tqdm`` draws the progress bar; ``matplotlib`` (Agg, no display)
draws the plot; the CSV files are plain ``csv`` (one per member, so a member
can be read or plotted alone). Everything lands under the run directory and
is appended to, so a resumed run continues the same files.
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import tempfile
import time
from typing import Iterable, Mapping, Optional, Sequence

from tqdm.auto import tqdm

from fastpbrl.logs.tracking import open_trackers

# ``true_objective``: the env's own score of the episode where it reports
# one (``info['true_objective']``, a shaped env's ``objective``), else empty.
EPISODE_FIELDS = ('wall_time', 'env_steps', 'update_steps', 'member',
                  'episode_return', 'episode_length', 'evaluation',
                  'true_objective')
FINAL_RETURNS = 'final_returns.json'  # each member's final evaluation
HPARAMS_CSV = 'hparams.csv'  # every member's hyperparameters over time
RULE_CSV = 'rule.csv'  # the population rule's scalars over time


def write_json_atomic(path: str, value, default=None) -> None:
  """Writes ``value`` as JSON to ``path`` through a temporary file in the
  same folder and ``os.replace``: a reader sees the old file or the new
  one, never a part."""
  directory = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=directory, prefix='.tmp-',
                             suffix=os.path.basename(path))
  try:
    with os.fdopen(fd, 'w') as f:
      json.dump(value, f, indent=2, default=default)
      f.flush()
      os.fsync(f.fileno())
    # mkstemp makes it readable by its owner only; a run's files are not
    # secret (the other files of a run folder are 0644 under umask 022).
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def read_final_returns(run_dir: str) -> dict:
  """``final_returns.json`` of a finished run (``run`` writes it after the
  final evaluation).

  Raises:
    FileNotFoundError: the run has not finished (or predates the file).
  """
  with open(os.path.join(run_dir, FINAL_RETURNS)) as f:
    return json.load(f)


class CsvLog:
  """An append-only CSV under the run directory whose columns are fixed by
  its first row (a resumed run keeps the file's columns; a field a later row
  lacks stays empty, one it adds is left out). Flushed at each write, like
  the member CSVs: a resumed run cuts it back to its size at the checkpoint
  (``run.truncate_logs``)."""

  def __init__(self, path: str):
    self.path = path
    self._file = None
    self._writer = None

  def write_rows(self, rows: Sequence[Mapping[str, float]]) -> None:
    if not rows:
      return
    if self._writer is None:
      fields = list(rows[0])
      resumed = os.path.exists(self.path) and os.path.getsize(self.path)
      if resumed:
        with open(self.path, newline='') as f:
          fields = next(csv.reader(f))
      self._file = open(self.path, 'a' if resumed else 'w', newline='')  # noqa: SIM115
      self._writer = csv.DictWriter(self._file, fieldnames=fields,
                                    extrasaction='ignore')
      if not resumed:
        self._writer.writeheader()
    self._writer.writerows(rows)
    self._file.flush()

  def close(self) -> None:
    if self._file is not None:
      self._file.close()


class HParamsLog(CsvLog):
  """``hparams.csv``: every member's hyperparameters at chosen learner
  calls, one row per member (``env_steps``, ``update_steps``, ``member``,
  then one column per hyperparameter). The run loop writes a row set at its
  first call, every 10 calls, at every call where the rule made a decision
  (so PBT's copies show at the call they happened) and at the end."""

  def __init__(self, run_dir: str):
    super().__init__(os.path.join(run_dir, HPARAMS_CSV))

  def write(self, env_steps: int, update_steps: int,
            rows: Sequence[Mapping[str, float]]) -> None:
    self.write_rows([{'env_steps': int(env_steps),
                      'update_steps': int(update_steps), 'member': member,
                      **row} for member, row in enumerate(rows)])


class RuleLog(CsvLog):
  """``rule.csv``: the population rule's own scalars (``rule.scalars``:
  DvD's lambda and mean pairwise action distance, CEM-RL's generation, ...)
  every 10 learner calls and at the end, in long form: one row per scalar
  (``env_steps``, ``update_steps``, ``name``, ``value``), so a scalar that
  first appears later in the run (a distance before its first measurement,
  CEM-RL's mean-policy return before its first generation) needs no column
  fixed in advance. ``None`` values are left out. The same values go to
  the trackers as ``rule/<name>``; this file lets a script read their
  history without a TensorBoard reader. Rules without scalars write no
  file."""

  def __init__(self, run_dir: str):
    super().__init__(os.path.join(run_dir, RULE_CSV))

  def write(self, env_steps: int, update_steps: int,
            scalars: Mapping[str, Optional[float]]) -> None:
    self.write_rows([{'env_steps': int(env_steps),
                      'update_steps': int(update_steps), 'name': name,
                      'value': float(value)}
                     for name, value in scalars.items() if value is not None])


def append_rows(run_dir: str, rows) -> None:
  """Appends a rule's ``Decision.logs`` (``(file name, row dict)`` pairs)
  to the files in ``run_dir``: ``.jsonl`` one JSON object per line (keys
  sorted), ``.csv`` comma-separated values, under a header of the first
  row's keys when the file is new."""
  for name, row in rows:
    path = os.path.join(run_dir, name)
    with open(path, 'a', encoding='utf-8') as f:
      if name.endswith('.jsonl'):
        f.write(json.dumps(row, sort_keys=True) + '\n')
      elif name.endswith('.csv'):
        if f.tell() == 0:
          f.write(','.join(row) + '\n')
        f.write(','.join(str(v) for v in row.values()) + '\n')
      else:
        raise ValueError(f'a rule log must be .jsonl or .csv, got {name!r}')


def read_rule_csv(run_dir: str) -> dict[str, list[tuple[int, float]]]:
  """``rule.csv`` as ``{name: [(env steps per member, value), ...]}`` in
  the order written; ``{}`` when the run wrote none."""
  path = os.path.join(run_dir, RULE_CSV)
  out: dict[str, list[tuple[int, float]]] = {}
  if os.path.exists(path):
    with open(path, newline='') as f:
      for row in csv.DictReader(f):
        out.setdefault(row['name'], []).append(
            (int(row['env_steps']), float(row['value'])))
  return out


class RunLogger:
  """Writes everything a run reports under ``run_dir``.

  Args:
    run_dir: the run's directory (created if needed).
    population_size: number of members (one CSV each).
    total_env_steps: budget shown by the progress bar.
    initial_env_steps: where the bar starts (a resumed run).
    wall_time_offset: seconds already spent before a resume, so curves of a
      resumed run continue the killed run's time axis.
    progress: draw the progress bar (off in tests).
    eval_episodes: episodes per evaluation; the bar's "best" is the best
      evaluation mean, as in the summary table and the plot.
    purge_step: a resumed run's env steps per member at its checkpoint:
      TensorBoard drops the events a killed run wrote at or after it
      (tensorboardX's ``purge_step``), as the CSVs are cut back.
    track: where scalars go besides the CSVs (``fastpbrl.logs.tracking``):
      tensorboard, wandb, mlflow (both with the TensorBoard files too) or
      none.
    config: the resolved run config, logged once to W&B or MLflow.

  Every scalar, returns included, is logged against the env steps per
  member (a member's own for its returns).
  """

  def __init__(self, run_dir: str, population_size: int, total_env_steps: int,
               initial_env_steps: int = 0, wall_time_offset: float = 0.0,
               progress: bool = True, eval_episodes: int = 1,
               purge_step: Optional[int] = None,
               track: str = 'tensorboard',
               config: Optional[Mapping] = None):

    self.run_dir = run_dir
    os.makedirs(os.path.join(run_dir, 'members'), exist_ok=True)
    self._trackers = open_trackers(track, run_dir, config or {},
                                   purge_step=purge_step)
    # A member's CSV is opened only to append a call's rows and closed
    # again: a population of any size holds no file open between calls.
    self._paths = [os.path.join(run_dir, 'members', f'member_{i:03d}.csv')
                   for i in range(population_size)]
    self._rows: dict[int, list[dict]] = {}  # member -> rows to append
    for member in range(population_size):
      self._append(member, [])  # the header, if the file is empty
    self._start = time.monotonic() - wall_time_offset
    self._bar = tqdm(total=total_env_steps, initial=initial_env_steps,
                     unit='step', dynamic_ncols=True, disable=not progress)
    self._last_steps = initial_env_steps
    self._eval_episodes = eval_episodes
    # Per member, the episodes of the evaluation under way: an evaluation is
    # written to the CSV only once all its episodes are in, so that the CSV
    # holds whole evaluations (see ``evaluation_points``).
    self._eval_group = [[] for _ in range(population_size)]
    self.best_return = -math.inf  # best evaluation mean so far

  @property
  def wall_time(self) -> float:
    return time.monotonic() - self._start

  def episodes(self, records: Iterable[Mapping], env_steps: int,
               update_steps: int) -> None:
    """Appends finished episodes (``EpisodeRecord``s or dicts with member,
    episode_return, episode_length, evaluation and optionally the member's
    own env_steps and start_policy_version) to the members' CSVs and
    TensorBoard.

    Evaluation episodes are held back until their evaluation is complete
    (``eval_episodes`` episodes of one policy version) and then written
    together; an evaluation cut short (its actor restarted, or the run's
    budget ended first) is dropped when an episode of another version
    arrives, or by ``drop_partial_evaluations``.
    """
    wall = self.wall_time
    for r in records:
      member = int(r['member'])
      keys = _keys(r)
      steps = int(r['env_steps']) if 'env_steps' in keys else env_steps
      row = {'wall_time': round(wall, 3), 'env_steps': steps,
             'update_steps': update_steps, 'member': member,
             'episode_return': float(r['episode_return']),
             'episode_length': int(r['episode_length']),
             'evaluation': bool(r['evaluation']),
             'true_objective': _objective(r, keys)}
      if not row['evaluation']:
        self._write(row)
        continue
      version = (int(r['start_policy_version'])
                 if 'start_policy_version' in keys else None)
      group = self._eval_group[member]
      if group and group[0][1] != version:
        group.clear()  # the evaluation under way was cut short
      group.append((row, version))
      if len(group) == self._eval_episodes:
        for done, _ in group:
          self._write(done)
        mean = sum(done['episode_return'] for done, _ in group) / len(group)
        self.best_return = max(self.best_return, mean)
        self._log({f'member_{member:03d}/eval_mean_return': mean},
                  group[-1][0]['env_steps'])
        group.clear()
    self._flush()

  def drop_partial_evaluations(self) -> None:
    """Forgets evaluations under way (before the final evaluation)."""
    for group in self._eval_group:
      group.clear()

  def _write(self, row: dict) -> None:
    member = row['member']
    self._rows.setdefault(member, []).append(row)
    tag = 'eval_return' if row['evaluation'] else 'train_return'
    self._log({f'member_{member:03d}/{tag}': row['episode_return']},
              row['env_steps'])

  def _flush(self) -> None:
    """Appends the rows ``_write`` kept to their members' CSVs."""
    rows, self._rows = self._rows, {}
    for member, member_rows in rows.items():
      self._append(member, member_rows)

  def _append(self, member: int, rows: list[dict]) -> None:
    path = self._paths[member]
    # A resumed run's CSV keeps the columns it was started with.
    fields = _header(path) or EPISODE_FIELDS
    with open(path, 'a', newline='') as f:
      writer = csv.DictWriter(f, fieldnames=fields, extrasaction='ignore')
      if f.tell() == 0:  # new, or cut back to before its header by a resume
        writer.writeheader()  # (a checkpoint's log sizes count it)
      writer.writerows(rows)

  def _log(self, values: Mapping[str, float], env_steps: int) -> None:
    for tracker in self._trackers:
      tracker.scalars(values, env_steps)

  def scalars(self, values: Mapping[str, float], env_steps: int) -> None:
    """Logs ``values`` (``None`` and non-finite ones left out) at
    ``env_steps``, the env steps per member."""
    self._log({name: float(value) for name, value in values.items()
               if value is not None and math.isfinite(float(value))},
              env_steps)

  def progress(self, env_steps: int, **postfix) -> None:
    """Moves the bar to ``env_steps`` (the population's: per member, least
    over members, times the population size); cheap enough for every call
    (tqdm redraws at most every 0.1 s). The last learner call may overshoot
    the budget by part of a call: the bar stops at its total."""
    if self._bar.total:
      env_steps = min(env_steps, self._bar.total)
    self._bar.update(max(0, env_steps - self._last_steps))
    self._last_steps = env_steps
    best = self.best_return
    self._bar.set_postfix(best=f'{best:.1f}' if math.isfinite(best) else '-',
                          **postfix, refresh=False)

  def finish_progress(self, env_steps: int, **postfix) -> None:
    """``progress``, redrawn now: where training (or the final evaluation)
    ended, the total once the budget is spent."""
    self.progress(env_steps, **postfix)
    self._bar.refresh()

  def close(self) -> None:
    """Closes every file and tracker, all of them even when one fails
    (a full disk): the first error is raised once everything is closed."""
    self._bar.close()
    error = None
    for close in [self._flush] + [t.close for t in self._trackers]:
      try:
        close()
      except OSError as e:
        error = error or e
    if error is not None:
      raise error


def _keys(record) -> tuple:
  return getattr(record, '_fields', None) or tuple(record)


def _objective(record: Mapping, keys) -> float | str:
  """An episode's ``true_objective`` for its CSV row ('' for none)."""
  value = float(record['true_objective']) if 'true_objective' in keys else (
      math.nan)
  return value if math.isfinite(value) else ''


def _header(path: str) -> Optional[tuple]:
  """The columns of the CSV at ``path`` (None: no file, or an empty one)."""
  try:
    with open(path, newline='') as f:
      first = f.readline()
  except FileNotFoundError:
    return None
  return tuple(next(csv.reader([first]))) if first.strip() else None


def read_member_csvs(run_dir: str) -> list[list[dict]]:
  """Reads every member's CSV back (for summaries, plots and tests)."""
  folder = os.path.join(run_dir, 'members')
  rows = []
  for name in sorted(os.listdir(folder)):
    with open(os.path.join(folder, name), newline='') as f:
      rows.append(list(csv.DictReader(f)))
  return rows


def evaluation_points(rows: Sequence[Mapping], eval_episodes: int = 1,
                      field: str = 'episode_return'
                      ) -> list[tuple[float, float, float]]:
  """One member's evaluations as ``(env_steps, wall_time, mean return)``
  (the mean of ``field``: ``'true_objective'`` for the env's own score,
  NaN in rows without it).

  An evaluation is ``eval_episodes`` consecutive evaluation episodes (the
  logger writes only whole evaluations); its point sits at their
  ``env_steps`` (the actors record an evaluation's start, where its policy
  was frozen; runs made before they did recorded where its last episode
  ended).
  """
  evals = [r for r in rows if r['evaluation'] == 'True']
  points = []
  for k in range(0, len(evals) - eval_episodes + 1, eval_episodes):
    group = evals[k:k + eval_episodes]
    points.append((float(group[-1]['env_steps']),
                   float(group[-1]['wall_time']),
                   sum(_number(r.get(field)) for r in group) / len(group)))
  return points


def _number(text) -> float:
  return math.nan if text in (None, '') else float(text)


def summary_table(run_dir: str, hparams: Optional[Sequence[Mapping]] = None,
                  eval_episodes: int = 1) -> str:
  """A text table: per member, episodes, its last and best evaluation (each
  the mean of ``eval_episodes`` episodes), where the env reports a true
  objective (a shaped env) the last evaluation's objective
  (``objective_last``), and its final hyperparameters."""
  members = read_member_csvs(run_dir)
  objective = any(row.get('true_objective') not in (None, '')
                  for rows in members for row in rows)
  header = f'{"member":>6} {"episodes":>8} {"eval_last":>10} {"eval_best":>10}'
  header += f' {"objective_last":>14}' if objective else ''
  lines = [header + ('  hyperparameters' if hparams else '')]
  for i, rows in enumerate(members):
    means = [p[2] for p in evaluation_points(rows, eval_episodes)]
    last = means[-1] if means else float('nan')
    best = max(means) if means else float('nan')
    line = f'{i:>6} {len(rows):>8} {last:>10.1f} {best:>10.1f}'
    if objective:
      scores = evaluation_points(rows, eval_episodes, 'true_objective')
      line += f' {scores[-1][2] if scores else math.nan:>14.1f}'
    if hparams:
      line += '  ' + json.dumps({k: float(f'{v:.4g}') for k, v in hparams[i].items()})
    lines.append(line)
  return '\n'.join(lines)


def plot_returns(run_dir: str, path: Optional[str] = None,
                 eval_episodes: int = 1) -> str:
  """PNG of evaluation return (mean of each evaluation's episodes) against
  env steps and wall time, one line per member, with the population's best
  evaluation so far in bold. Returns the file's path."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # noqa: PLC0415

  path = path or os.path.join(run_dir, 'returns.png')
  fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
  axis_of = {'env_steps': 0, 'wall_time': 1}
  everything = {x: [] for x in axis_of}
  for i, rows in enumerate(read_member_csvs(run_dir)):
    points = evaluation_points(rows, eval_episodes)
    for x, column in axis_of.items():
      xs = [p[column] for p in points]
      ys = [p[2] for p in points]
      axes[column].plot(xs, ys, lw=0.8, alpha=0.6, marker='.',
                        label=f'member {i}' if i < 10 else None)
      everything[x].extend(zip(xs, ys))
  for x, column in axis_of.items():
    ax = axes[column]
    points = sorted(everything[x])
    if points:
      running, best = [], -math.inf
      for _, y in points:
        best = max(best, y)
        running.append(best)
      # A step: the best so far changes only at an evaluation.
      ax.plot([p[0] for p in points], running, color='k', lw=2,
              drawstyle='steps-post', label='best so far')
      ax.legend(loc='lower right', fontsize='small')
    ax.set_xlabel('env steps per member' if x == 'env_steps' else 'wall time (s)')
    ax.grid(alpha=0.3)
  axes[0].set_ylabel(f'evaluation return (mean of {eval_episodes})')
  fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


def setup_logging(process: Optional[int] = None) -> None:
  """fastpbrl's INFO logs to stderr (``run`` then logs the resolved config);
  each line names its process (``process``) in a multi-process run.

  Configures the ``fastpbrl`` logger itself rather than the root logger:
  libraries imported earlier (absl, through orbax) may already have given
  the root logger a handler, which makes ``logging.basicConfig`` a no-op.
  """
  log = logging.getLogger('fastpbrl')
  if not log.handlers:
    handler = logging.StreamHandler()
    where = '' if process is None else f' [process {process}]'
    handler.setFormatter(logging.Formatter(
        f'%(asctime)s %(name)s{where} %(levelname)s %(message)s'))
    log.addHandler(handler)
  log.setLevel(logging.INFO)
  log.propagate = False
