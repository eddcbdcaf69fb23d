"""The learning benchmark's result files: where a run's lives, which later
fixes supersede it (set aside, not overwritten), and reading them back."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from typing import Optional

from benchmarks.learning.suite import DEFAULT_POPULATION, METHODS, TASKS


DEFAULT_OUT = os.path.join('benchmarks', 'results', 'learning')


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
REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


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


def load_results(out: str) -> list[dict]:
  results = []
  root = os.path.join(out, 'runs')
  for dirpath, _, files in os.walk(root):
    for name in sorted(files):
      if name.endswith('.json'):
        with open(os.path.join(dirpath, name)) as f:
          results.append(json.load(f))
  return results
