"""The training commands' grouped --help, choice flags, and the one unit of
every interval flag (env steps per member)."""

import dataclasses
import json
import re

import pytest

from fastpbrl.agents.networks import NETWORK_INITS
from fastpbrl.cli import commands
from fastpbrl.cli import help as cli_help
from fastpbrl.cli import parse as cli
from fastpbrl.config.derived import as_learner_calls, as_update_steps
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.config.saved import INTERVAL_UNIT, file_config, saved_config
from fastpbrl.logs import tracking
from fastpbrl.replay.device import LOCATIONS
from fastpbrl.rules import hypertrick, pbt, registry
from fastpbrl.rules.dvd import bandit as bandit_lib
from fastpbrl.rules.dvd import rule as dvd
from fastpbrl.rules.pbt import exploit as pbt_lib


def help_of(name, capsys, *flags):
  assert commands.main([name, *flags, '--help']) == 0
  return capsys.readouterr().out


def test_every_shared_setting_is_in_one_help_group():
  grouped = [name for _, names in cli_help.GROUPS for name in names]
  assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(RunConfig))


@pytest.mark.parametrize('rule', registry.builtins(), ids=lambda r: r.name)
def test_help_lists_every_flag_once_with_its_default_once(rule, capsys):
  text = help_of(rule.name, capsys)
  config = next(iter(rule.presets.values()))
  for field in dataclasses.fields(config):
    flag = '--' + field.name.replace('_', '-')
    assert len(re.findall(rf'^  {re.escape(flag)}[ ,]', text, re.M)) == 1, flag
  assert text.count('Default:') <= len(dataclasses.fields(config)) + 1
  assert '``' not in text and '{None}' not in text
  assert max(len(line) for line in text.splitlines()
             if not line.startswith('    ')) <= 100


def test_help_shows_enumeration_choices_and_the_presets_defaults(capsys):
  text = help_of('pbt', capsys, '--preset', 'paper')
  assert '--exploit {truncation,tournament,ttest}' in text
  assert '--init-hparams {near-defaults,prior,defaults}' in text
  assert '--network-init {haiku,torch}' in text
  assert '--preset {small,paper,atari}' in text
  # The paper preset's values are the defaults shown.
  entry = text[text.index('  --population-size'):].split('\n  --')[0]
  assert 'Default: 80.' in ' '.join(entry.split())
  assert 'Defaults now: --preset paper.' in text
  # Groups, the rule's own settings last.
  titles = [line for line in text.splitlines() if line.endswith(':')
            and not line.startswith(' ')]
  assert titles[-1] == 'fastpbrl pbt, its own settings:'
  assert 'what to train:' in titles and 'processes and devices:' in titles


def test_a_none_default_the_text_explains_is_not_printed_twice(capsys):
  text = help_of('seeds', capsys)
  entry = text[text.index('  --num-actors'):].split('\n  --')[0]
  assert 'default: CPU cores minus one' in ' '.join(entry.split())
  assert 'Default: None' not in entry


def test_choices_are_the_values_the_checks_accept():
  shared = cli_help.choices(RunConfig)
  assert shared['network_init'] == NETWORK_INITS
  assert shared['replay_location'] == LOCATIONS
  assert shared['track'] == tracking.TRACKS
  assert cli_help.choices(pbt.PBTRunConfig)['exploit'] == pbt_lib._EXPLOITS
  own = cli_help.choices(dvd.DvDRunConfig)
  assert own['bandit_reward'] == bandit_lib.BANDIT_REWARDS
  assert own['bandit_score'] == dvd._SCORES


@pytest.mark.parametrize('argv, message', [
    (['pbt', '--network-init', 'xavier'],
     "error: --network-init must be one of haiku, torch, got 'xavier'"),
    (['pbt', '--exploit=roulette'],
     "error: --exploit must be one of truncation, tournament, ttest, got "
     "'roulette'"),
    (['dvd', '--bandit-score', 'median'],
     "error: --bandit-score must be one of mean, best, got 'median'"),
    (['seeds', '--track', 'neptune'],
     "error: --track must be one of tensorboard, wandb, mlflow, none, got "
     "'neptune'"),
])
def test_a_value_outside_an_enumeration_is_one_line(argv, message, capsys):
  assert commands.main(argv) == 2
  err = capsys.readouterr().err
  assert err.strip() == message


def test_a_settings_file_value_outside_an_enumeration_is_refused(tmp_path):
  path = tmp_path / 'settings.json'
  path.write_text(json.dumps({'exploit': 'roulette'}))
  with pytest.raises(ConfigError, match='exploit must be'):
    file_config(str(path), pbt.PBTRunConfig())
  path.write_text(json.dumps({'exploit': 'tournament'}))
  assert file_config(str(path), pbt.PBTRunConfig()).exploit == (
      'tournament')


# --- One unit: env steps per member -------------------------------------


def test_intervals_convert_at_the_ratio_and_steps_per_call():
  td3 = RunConfig(update_to_data_ratio=1.0)
  assert as_update_steps(2_500, td3) == 2_500
  assert as_learner_calls(5_000, td3) == 100  # 50 steps a call
  dqn = RunConfig(agent='dqn', update_to_data_ratio=0.25)
  assert as_update_steps(500_000, dqn) == 125_000
  assert as_learner_calls(100_000, dqn) == 2_500  # 10 a call
  assert as_learner_calls(10, td3) == 1  # at least one call
  assert as_update_steps(0, td3) == 0  # 0 stays "never"
  assert as_learner_calls(0, td3) == 0


def test_rules_count_their_intervals_from_env_steps():
  ratio = 2.0
  rule = pbt.PBT(pbt.PBTRunConfig(ready_after=1_000, no_mutation_before=500,
                                  update_to_data_ratio=ratio, eval_every=500))
  assert rule.pbt_config.ready_after == 2_000
  assert rule.pbt_config.no_mutation_before == 1_000
  ht = hypertrick.HyperTrick(hypertrick.HyperTrickRunConfig(
      phase_env_steps=1_000, eval_every=500, update_to_data_ratio=ratio))
  assert ht.phase_update_steps == 2_000
  rule = dvd.DvD(dvd.DvDRunConfig(bandit_every=1_000, eval_every=500,
                                  steps_per_call=10, lambda_decay_steps=300,
                                  update_to_data_ratio=ratio))
  assert rule.round_calls == 200  # 1,000 env steps x 2 / 10 per call
  assert rule.schedule.knots[-1][0] == 600


def old_run(tmp_path, settings):
  (tmp_path / 'config.json').write_text(json.dumps(settings))
  return str(tmp_path)


def test_a_config_json_saved_before_the_unit_change_is_converted(tmp_path):
  # Saved by fastpbrl 0.1: checkpoints every 100 learner calls of 10 DQN
  # steps at 0.25 updates per env step; PBT every 125,000 update steps.
  run_dir = old_run(tmp_path, {
      'rule': 'pbt', 'agent': 'dqn', 'update_to_data_ratio': 0.25,
      'steps_per_call': None, 'checkpoint_every': 100,
      'ready_after': 125_000, 'no_mutation_before': 0})
  config = saved_config(run_dir, pbt.PBTRunConfig())
  assert config.checkpoint_every == 4_000  # 100 x 10 / 0.25
  assert config.ready_after == 500_000
  again = file_config(str(tmp_path / 'config.json'),
                                 pbt.PBTRunConfig())
  assert again.ready_after == 500_000


def test_hypertricks_renamed_phase_length_is_read_from_an_old_run(tmp_path):
  run_dir = old_run(tmp_path, {'rule': 'hypertrick', 'agent': 'td3',
                               'update_to_data_ratio': 2.0,
                               'phase_update_steps': 4_000})
  config = saved_config(run_dir,
                                   hypertrick.HyperTrickRunConfig())
  assert config.phase_env_steps == 2_000


def test_a_config_json_in_todays_unit_is_read_as_it_is(tmp_path):
  run_dir = old_run(tmp_path, {
      'rule': 'pbt', 'interval_unit': INTERVAL_UNIT,
      'update_to_data_ratio': 0.5, 'checkpoint_every': 100,
      'ready_after': 300})
  config = saved_config(run_dir, pbt.PBTRunConfig())
  assert (config.checkpoint_every, config.ready_after) == (100, 300)


def test_the_main_command_parses_to_the_small_preset():
  config = cli.parse(pbt.PRESETS, 'x', [])
  assert config == pbt.PRESETS['small']
  assert config.env_steps == 10_000


@pytest.mark.parametrize('argv, message', [
    (['pbt', '--population-size', 'abc'],
     "error: --population-size must be an integer, got 'abc'"),
    (['pbt', '--fraction=lots'], "error: --fraction must be a number, got 'lots'"),
    (['seeds', '--hidden-sizes', '64', 'wide'],
     "error: --hidden-sizes must be an integer, got 'wide'"),
    (['seeds', '--batch-size', 'x'], "error: --batch-size must be an integer, got 'x'"),
])
def test_a_value_of_the_wrong_type_is_one_line(argv, message, capsys):
  assert commands.main(argv) == 2
  assert capsys.readouterr().err.strip() == message


def test_values_of_the_right_type_pass_the_check():
  argv = ['--population-size', '8', '--fraction', '0.25', '--hidden-sizes',
          '64', '64', '--num-actors', 'None', '--seed', '-3',
          '--exploit=tournament']
  assert cli_help.check_values(pbt.PBTRunConfig, argv) is None
