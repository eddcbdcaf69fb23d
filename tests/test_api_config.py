"""``fastpbrl.train``'s settings: a typed config, keyword overrides, dicts
for hyperparameters and search spaces; checked before anything runs."""

import json

import pytest

import fastpbrl
from fastpbrl import api


class Ran(Exception):
  """Raised by the stand-in for the run loop, carrying what it was given."""


def capture_run(monkeypatch):
  def run(config, rule, callbacks=()):
    raise Ran(config, rule)
  monkeypatch.setattr(api, 'run', run)


def run_config(**kwargs):
  with pytest.raises(Ran) as info:
    fastpbrl.train(**kwargs)
  return info.value.args


def test_a_typed_config_picks_its_rule_and_keywords_override_it(monkeypatch):
  capture_run(monkeypatch)
  typed = fastpbrl.PBTRunConfig(env='Hopper-v5', population_size=6,
                                fraction=0.5)
  config, rule = run_config(config=typed, population_size=8,
                            hparams={'policy_lr': 1e-3})
  assert rule.name == 'pbt'
  assert (config.env, config.population_size, config.fraction) == (
      'Hopper-v5', 8, 0.5)
  assert config.hparams == ('policy_lr=0.001',)
  config, rule = run_config(config=fastpbrl.RunConfig(env_steps=2_000))
  assert rule.name == 'seeds' and config.env_steps == 2_000


def test_a_dict_search_space_reaches_the_rule(monkeypatch):
  capture_run(monkeypatch)
  space = {'policy_lr': {'kind': 'loguniform', 'low': 1e-4, 'high': 1e-3}}
  config, rule = run_config(rule='hypertrick', search_space=space)
  assert json.loads(config.search_space) == space
  assert rule.space.fields == ('policy_lr',)


def test_a_config_of_another_rule_or_with_resume_is_refused(tmp_path):
  with pytest.raises(fastpbrl.ConfigError,
                     match='config is a PBTRunConfig; rule dvd takes a '
                           'DvDRunConfig'):
    fastpbrl.train('dvd', config=fastpbrl.PBTRunConfig())
  with pytest.raises(fastpbrl.ConfigError, match='config and resume'):
    fastpbrl.train(config=fastpbrl.PBTRunConfig(), resume=str(tmp_path))


def test_hparams_outside_their_domain_are_refused_before_the_run(
    monkeypatch):
  capture_run(monkeypatch)
  with pytest.raises(fastpbrl.ConfigError) as info:
    fastpbrl.train('seeds', hparams={'policy_lr': -1})
  message = str(info.value)
  assert message == ('--hparams policy_lr=-1 is outside its valid range '
                     '(0, inf) (Adam step size of the actor)')
  with pytest.raises(fastpbrl.ConfigError, match='--hparams policy_delay was '
                     'renamed policy_update_fraction'):
    fastpbrl.train('seeds', hparams={'policy_delay': 2})
  with pytest.raises(fastpbrl.ConfigError, match="search space field "
                     "'policy_lr': low -0.001 is outside its valid range"):
    fastpbrl.train('pbt', search_space={
        'policy_lr': {'kind': 'uniform', 'low': -1e-3, 'high': 1e-3}})
  with pytest.raises(fastpbrl.ConfigError, match='target_update_period=10.5 '
                     'is not an integer'):
    fastpbrl.train('seeds', agent='dqn', env='CartPole-v1',
                   hparams={'target_update_period': 10.5})
  # Inside the domains: it reaches the run.
  with pytest.raises(Ran):
    fastpbrl.train('seeds', hparams={'policy_lr': 1e-3,
                                     'policy_update_fraction': 1.0})
