"""Declared config bounds (``config.bounded``) against ``check_bounds``: every
declared bound of every built-in rule's config is found and refuses a value
just outside it with one line naming the flag, generated from the
declarations; a few fields against messages written out by hand."""

import dataclasses
import math
import re

import pytest

from fastpbrl.config.bounds import bounded, check_bounds, declared_bounds
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.rules import registry

RULE_CONFIGS = [rule.config_class for rule in registry.builtins()]


def outside(bounds, kind):
  """Values just outside ``bounds`` for a field of type ``kind``."""
  step = 1 if kind is int else 1e-6
  values = []
  if bounds.low is not None:
    values.append(bounds.low if bounds.low_open else bounds.low - step)
  if bounds.high is not None:
    values.append(bounds.high if bounds.high_open else bounds.high + step)
  if kind is float:
    values += [math.nan, math.inf]
  return values


def inside(bounds, kind):
  """Values just inside ``bounds``."""
  step = 1 if kind is int else 1e-6
  values = []
  if bounds.low is not None:
    values.append(bounds.low + step if bounds.low_open else bounds.low)
  if bounds.high is not None:
    values.append(bounds.high - step if bounds.high_open else bounds.high)
  return [kind(v) for v in values]


def kind_of(config_class, name):
  annotation = str({f.name: f.type for f in
                    dataclasses.fields(config_class)}[name])
  return float if 'float' in annotation else int


def declared_cases():
  for config_class in RULE_CONFIGS:
    for name, bounds in declared_bounds(config_class).items():
      yield pytest.param(config_class, name, bounds,
                         id=f'{config_class.__name__}.{name}')


@pytest.mark.parametrize('config_class,name,bounds', list(declared_cases()))
def test_every_declared_bound_is_checked(config_class, name, bounds):
  kind = kind_of(config_class, name)
  flag = '--' + name.replace('_', '-')
  for value in outside(bounds, kind):
    config = dataclasses.replace(config_class(), **{name: kind(value)})
    with pytest.raises(ConfigError) as error:
      check_bounds(config)
    message = str(error.value)
    assert '\n' not in message
    assert message.startswith(f'{flag} must be {bounds.describe()}')
    assert message.endswith(f', got {kind(value)}')
  for value in inside(bounds, kind):
    check_bounds(dataclasses.replace(config_class(), **{name: value}))


def test_the_defaults_and_unset_settings_pass():
  for config_class in RULE_CONFIGS:
    check_bounds(config_class())  # None (derived later) is allowed


# Hand-written: the messages users saw before the bounds were declared.
@pytest.mark.parametrize('rule,name,value,expected', [
    ('pbt', 'eval_episodes', 0, '--eval-episodes must be >= 1, got 0'),
    ('pbt', 'update_to_data_ratio', 65.0,
     '--update-to-data-ratio must be in (0, 64], got 65.0'),
    ('pbt', 'actor_timeout', 0.0, '--actor-timeout must be > 0 seconds, got 0.0'),
    ('pbt', 'ready_after', -1, '--ready-after must be >= 0 env steps, got -1'),
    ('pbt', 'fraction', 0.7, '--fraction must be in (0, 0.5] so that the '
     'bottom and top sets do not overlap, got 0.7'),
    ('cemrl', 'noise_decay', 1.0, '--noise-decay must be in (0, 1), got 1.0'),
    ('dvd', 'bandit_window', -1,
     '--bandit-window must be >= 0 (0: all rounds), got -1'),
    ('dvd', 'embedding_states', 1, '--embedding-states must be >= 2, got 1'),
    ('hypertrick', 'quantile', 0.0, '--quantile must be in (0, 1], got 0.0'),
])
def test_messages_as_written_by_hand(rule, name, value, expected):
  config = dataclasses.replace(registry.get(rule).config_class(),
                               **{name: value})
  with pytest.raises(ConfigError, match=f'^{re.escape(expected)}$'):
    check_bounds(config)


def test_each_rule_declares_its_own_fields():
  expected = {'pbt': {'fraction', 'ready_after', 'significance',
                      'resample_probability', 'fitness_window'},
              'cemrl': {'rl_fraction', 'elite_fraction', 'noise_decay',
                        'total_env_steps', 'mean_eval_episodes'},
              'dvd': {'kernel_sigma', 'bandit_every', 'lambda_start',
                      'lambda_end', 'embedding_states'},
              'hypertrick': {'num_workers', 'num_phases', 'quantile',
                             'phase_env_steps'}}
  for rule, names in expected.items():
    assert names <= set(declared_bounds(registry.get(rule).config_class))


def test_a_redeclared_field_keeps_its_base_bound():
  # PBT redeclares eval_every (its own default and docstring).
  pbt = registry.get('pbt').config_class
  assert (declared_bounds(pbt)['eval_every']
          == declared_bounds(RunConfig)['eval_every'])


@pytest.mark.parametrize('rule,settings,expected', [
    ('pbt', dict(fitness_window=0), '--fitness-window must be >= 1, got 0'),
    ('cemrl', dict(rl_fraction=0.0), '--rl-fraction must be in (0, 1], got 0.0'),
    ('dvd', dict(lambda_end=-1.0), '--lambda-end must be >= 0, got -1.0'),
    ('hypertrick', dict(num_workers=0), '--num-workers must be >= 1, got 0'),
])
def test_rules_check_their_declared_bounds(rule, settings, expected):
  rule_cls = registry.get(rule)
  config = dataclasses.replace(rule_cls.config_class(), **settings)
  with pytest.raises(ConfigError) as error:
    rule_cls.from_config(config)
  assert str(error.value) == expected


def test_bounded_refuses_two_bounds_on_one_side():
  with pytest.raises(ValueError):
    bounded(1, ge=0, gt=0)
  with pytest.raises(ValueError):
    bounded(1)
