"""A run's saved settings: resuming it, and settings files.

A run writes its resolved settings to ``run_dir/config.json``;
``saved_config`` reads them back (intervals of an older fastpbrl in
today's units), ``check_resume`` refuses a ``--resume`` that would continue
another kind of run, and ``file_config`` reads a ``--config`` JSON or YAML
file. Host-side; not jittable.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex

from fastpbrl.config.agent_settings import agent_spec, hidden_sizes_of
from fastpbrl.config.checks import fits
from fastpbrl.config.errors import ConfigError, check
from fastpbrl.config.fields import C, RunConfig
from fastpbrl.core import settings_file


# Settings that fix the shapes of a checkpoint: a resume cannot change them.
# ``hidden_sizes`` compares the widths the agent gets (``hidden_sizes_of``),
# so a config.json that wrote the old default [256, 256] resumes unset.
SHAPE_SETTINGS = ('env', 'agent', 'population_size', 'hidden_sizes',
                  'agent_settings')


def check_resume(config: RunConfig, rule_ref: str) -> None:
  """Raises ``ConfigError`` if ``--resume`` would continue another kind of
  run (another rule, env, agent, population or network size), or one that
  cannot be resumed."""
  saved = saved_settings(config.resume)
  saved_ref = saved.get('rule')
  check(saved_ref is not None,
        f'--resume {config.resume!r}: its config.json names no rule (a run '
        'of an earlier fastpbrl, which kept its rules\' state another '
        'way); start a new run')
  check(not saved.get('not_resumable'),
        f'--resume {config.resume!r}: {saved.get("not_resumable")}')
  check(saved_ref == rule_ref,
        f'--resume {config.resume!r} is a {saved_ref!r} run; '
        f'continue it with: {resume_command(saved_ref, config.resume)}')
  before_config = saved_config(config.resume, config)
  for name in SHAPE_SETTINGS:
    now, before = getattr(config, name), saved.get(name)
    if name == 'hidden_sizes':
      now, before = hidden_sizes_of(config), hidden_sizes_of(before_config)
    elif isinstance(now, tuple):
      before = tuple(before or ())
    check(now == before,
          f'--{name.replace("_", "-")} {now} differs from the resumed run\'s '
          f'{before}; a resume cannot change it')


def saved_settings(run_dir: str, flag: str = '--resume') -> dict:
  """The settings a run saved in ``run_dir/config.json`` (its rule's ref
  under ``rule``)."""
  path = os.path.join(run_dir, 'config.json')
  try:
    with open(path) as f:
      return json.load(f)
  except FileNotFoundError:
    raise ConfigError(f'{flag} {run_dir!r}: no config.json there (is it a '
                      'fastpbrl run folder?)') from None


def saved_config(run_dir: str, like: C) -> C:
  """``like`` (a ``RunConfig`` of the run's rule) with the settings saved
  in ``run_dir``; saved names that are not ``like``'s fields (the rule's
  ref) are left out."""
  names = {f.name for f in dataclasses.fields(like)}
  saved = in_todays_units(saved_settings(run_dir), type(like))
  values = {k: tuple(v) if isinstance(v, list) else v
            for k, v in saved.items() if k in names}
  return dataclasses.replace(like, **values)


# What a run's config.json holds besides the settings.
RUN_RECORD_KEYS = ('rule', 'not_resumable', 'interval_unit')
# ``interval_unit`` of a config.json whose intervals are env steps per member.
INTERVAL_UNIT = 'env steps per member'


def in_todays_units(saved: dict, config_class: type) -> dict:
  """A run's saved settings with the intervals of a config.json written
  before they were all env steps per member (no ``interval_unit`` in it)
  converted: learner calls x steps per call / ratio, update steps / ratio
  (``config_class.legacy_intervals`` names them)."""
  if saved.get('interval_unit') == INTERVAL_UNIT or 'rule' not in saved:
    return saved
  saved = dict(saved)
  ratio = float(saved.get('update_to_data_ratio') or 1.0)
  steps_per_call = saved.get('steps_per_call') or (
      agent_spec(saved.get('agent', 'td3')).config.steps_per_call)
  for name, (old_name, unit) in config_class.legacy_intervals.items():
    if old_name not in saved:
      continue
    value = saved.pop(old_name)
    per = steps_per_call if unit == 'calls' else 1
    saved[name] = int(round(value * per / ratio))
  saved['interval_unit'] = INTERVAL_UNIT
  return saved


def file_config(path: str, like: C) -> C:
  """``like`` with the settings of a JSON or YAML file (``--config``): a
  mapping of setting names (as the flags, ``-`` or ``_``) to values; a
  run's ``config.json`` is one. A name ``like`` has not is refused."""
  try:
    values = settings_file.read(path)
  except ValueError as e:
    raise ConfigError(f'--config {path}: {e}') from None
  check(isinstance(values, dict),
        f'--config {path}: expected a mapping of settings to values, got '
        f'{type(values).__name__}')
  values = in_todays_units(values, type(like))  # an older run's config.json
  types = {f.name: f.type for f in dataclasses.fields(like)}
  names = list(types)
  settings = {}
  for key, value in values.items():
    name = str(key).lstrip('-').replace('-', '_')
    if name in RUN_RECORD_KEYS or name in ('run_dir', 'resume'):
      continue  # a run's record, or its folder: not carried to a new run
    if name not in names:
      near = difflib.get_close_matches(name, names, n=1)
      raise ConfigError(f'--config {path}: no setting {key!r}'
                        + (f'; did you mean {near[0]}?' if near else ''))
    value = tuple(value) if isinstance(value, list) else value
    check(fits(types[name], value),
          f'--config {path}: {key} must be {types[name]}, got {value!r}')
    settings[name] = value
  return dataclasses.replace(like, **settings)


def resume_command(rule_ref: str, run_dir: str) -> str:
  """The command line that continues the run in ``run_dir``."""
  return f'fastpbrl {rule_ref} --resume {shlex.quote(run_dir)}'
