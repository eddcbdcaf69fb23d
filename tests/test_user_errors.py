"""What a user did wrong is one line, before any process or folder (issue
60, items 6-8), and the default intervals fit any budget."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import pytest

import fastpbrl
from fastpbrl.cli import commands
from fastpbrl.config.derived import resolved
from fastpbrl.config.errors import ConfigError, SettingTypeError
from fastpbrl.config.fields import RunConfig
from fastpbrl.rules import registry
from fastpbrl.run import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _one_line_error(argv, capsys):
  assert commands.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: ') and '\n' not in err, err
  return err


def test_a_run_dir_that_is_a_file(tmp_path, capsys):
  path = tmp_path / 'taken'
  path.write_text('x')
  err = _one_line_error(['seeds', '--run-dir', str(path), '--no-progress'],
                        capsys)
  assert f"--run-dir '{path}' is a file, not a folder" in err
  err = _one_line_error(['seeds', '--run-dir', str(path / 'run'),
                         '--no-progress'], capsys)
  assert f'{path} is a file, not a folder' in err


def test_a_run_dir_that_is_not_writable(tmp_path, capsys, monkeypatch):
  # Simulated: root may write anywhere, whatever the permissions say.
  monkeypatch.setattr(os, 'access', lambda path, mode: False)
  err = _one_line_error(['seeds', '--run-dir', str(tmp_path / 'run'),
                         '--no-progress'], capsys)
  assert f'{tmp_path} is not writable' in err
  assert not (tmp_path / 'run').exists()


@pytest.mark.skipif(os.geteuid() == 0, reason='root ignores permissions')
def test_a_read_only_folder(tmp_path, capsys):
  os.chmod(tmp_path, 0o500)
  try:
    err = _one_line_error(['seeds', '--run-dir', str(tmp_path / 'run'),
                           '--no-progress'], capsys)
  finally:
    os.chmod(tmp_path, 0o700)
  assert 'is not writable' in err


def test_a_setting_of_the_wrong_type_names_it():
  with pytest.raises(SettingTypeError,
                     match=r"^population_size must be int, got '2' \(a str\)$"):
    fastpbrl.train('pbt', population_size='2', progress=False)
  with pytest.raises(TypeError, match=r'^hidden_sizes must be Optional\[tuple\[int'):
    fastpbrl.train('pbt', hidden_sizes=(16, 'a'), progress=False)


def test_an_env_object_says_to_pass_its_id():
  env = gym.make('Pendulum-v1')
  with pytest.raises(ConfigError) as e:
    fastpbrl.train('pbt', env=env, progress=False)
  env.close()
  message = str(e.value)
  assert message.startswith('env must be an env id string')
  assert 'TimeLimit object' in message and 'docs/guides/own-env.md' in message
  assert '\n' not in message


def _script(tmp_path, body):
  path = tmp_path / 'script.py'
  path.write_text(textwrap.dedent(body))
  env = {**os.environ, 'PYTHONPATH': ROOT, 'JAX_PLATFORMS': 'cpu'}
  return subprocess.run([sys.executable, str(path)], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=120)


def test_a_script_without_the_main_guard_is_refused_at_once(tmp_path):
  done = _script(tmp_path, """\
      import fastpbrl
      fastpbrl.train('seeds', env_steps=2000, population_size=2,
                     progress=False)
      """)
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith(
      'fastpbrl.config.errors.ConfigError: script.py starts the run at its '
      'top level (line 2) without'), last
  assert done.stderr.count('at its top level') == 1
  assert os.listdir(tmp_path) == ['script.py']  # no runs/ folder


def test_a_guarded_script_is_not_refused(tmp_path):
  # It stops at a later check: an invalid budget.
  done = _script(tmp_path, """\
      import fastpbrl

      def main():
        fastpbrl.train('seeds', env_steps=0, progress=False)

      if __name__ == '__main__':
        main()
      """)
  assert '--env-steps must be > 0, got 0' in done.stderr.strip().splitlines()[-1]


def test_print_config_of_a_small_budget_shows_the_derived_intervals(capsys):
  assert commands.main(['pbt', '--env-steps', '2000', '--population-size',
                        '2', '--print-config']) == 0
  got = json.loads(capsys.readouterr().out)
  assert (got['ready_after'], got['eval_every'], got['warmup_steps']) == (
      500, 500, 1000)


@pytest.mark.parametrize('name, argv', [
    ('pbt', ['--env-steps', '2000']), ('pbt', ['--env-steps', '600']),
    ('seeds', ['--env-steps', '1000']), ('hypertrick', ['--env-steps', '2000']),
    ('dvd', ['--env-steps', '2000']), ('cemrl', ['--total-env-steps', '4000']),
])
def test_small_budgets_are_accepted(name, argv):
  """Every rule runs at a small budget with its default intervals."""
  rule_cls = registry.get(name)
  config = dataclasses.replace(
      rule_cls.config_class(), population_size=2, **{
          argv[0][2:].replace('-', '_'): int(argv[1])})
  rule = rule_cls.from_config(config)  # validates
  assert rule.config.eval_every <= rule.config.env_steps
  assert rule.config.warmup_steps < rule.config.env_steps


def test_the_default_budget_keeps_the_defaults_of_before():
  want = {'pbt': dict(ready_after=2_500, eval_every=2_500, warmup_steps=1_000),
          'seeds': dict(eval_every=5_000, warmup_steps=1_000),
          'hypertrick': dict(phase_env_steps=2_500, eval_every=1_000),
          'dvd': dict(bandit_every=5_000, eval_every=5_000),
          'cemrl': dict(eval_every=5_000, warmup_steps=1_000)}
  for name, values in want.items():
    config = registry.get(name).from_config(
        registry.get(name).config_class()).config
    assert {k: getattr(config, k) for k in values} == values, name
  paper = registry.get('pbt').presets['paper']
  assert resolved(paper) == paper  # presets keep their values


def test_a_set_interval_that_does_not_fit_is_still_refused(capsys):
  err = _one_line_error(['pbt', '--env-steps', '2000', '--ready-after',
                         '2500', '--no-progress'], capsys)
  assert '--ready-after 2500' in err
  assert resolved(RunConfig(env_steps=2000, eval_every=7)).eval_every == 7


@pytest.mark.slow
def test_the_first_small_run_runs(tmp_path):
  """``fastpbrl pbt --env-steps 2000 --population-size 2``, as typed (a
  smaller network and one actor to stay quick): no flag errors, PBT
  exploits, and config.json holds the derived intervals."""
  run_dir = tmp_path / 'run'
  assert commands.main(['pbt', '--env-steps', '2000', '--population-size',
                        '2', '--no-progress', '--num-actors', '1',
                        '--hidden-sizes', '32', '32', '--track', 'none',
                        '--run-dir', str(run_dir)]) in (0, None)
  saved = json.loads((run_dir / 'config.json').read_text())
  assert (saved['ready_after'], saved['eval_every']) == (500, 500)
  assert (run_dir / 'final_returns.json').exists()


def test_a_population_too_large_for_memory(tmp_path, capsys, monkeypatch):
  """``--population-size 100000`` on a small machine: one line, before any
  folder (simulated with a device of 1 MiB)."""
  monkeypatch.setattr(build, 'device_memory_bytes', lambda: 2**20)
  assert commands.main(['seeds', '--population-size', '100', '--run-dir',
                        str(tmp_path / 'run'), '--no-progress']) == 2
  # After the INFO line of the devices, the one line of the error.
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith('error: ')
  assert '--population-size 100: the members\' parameters and optimizer ' \
         'states alone need' in err
  assert 'than the 1.0 MiB of memory' in err
  assert not (tmp_path / 'run').exists()


def test_an_error_making_the_run_folder_is_one_line(tmp_path, capsys,
                                                    monkeypatch):
  """What ``os.access`` cannot see (root in a read-only folder, a race)."""
  target = str(tmp_path / 'run')
  makedirs = os.makedirs

  def refuse(path, *args, **kwargs):
    if str(path) == target:
      raise PermissionError(13, 'Permission denied', target)
    return makedirs(path, *args, **kwargs)

  monkeypatch.setattr(os, 'makedirs', refuse)
  assert commands.main(['seeds', '--run-dir', target, '--no-progress']) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err == (f"error: --run-dir '{target}': cannot make the folder "
                 '(Permission denied); choose another directory')


@pytest.mark.parametrize('rule, name', [('cemrl', 'CEM-RL'), ('dvd', 'DvD')])
def test_shared_critic_rules_refuse_an_on_policy_agent(tmp_path, capsys,
                                                       monkeypatch, rule,
                                                       name):
  """CEM-RL and DvD train deterministic policies through one shared
  critic; PPO has neither: one line naming --agent, on either data path,
  before any folder (the default runs/ one included)."""
  monkeypatch.chdir(tmp_path)
  for env in ('CartPole-v1', 'gymnax:CartPole-v1'):
    err = _one_line_error([rule, '--agent', 'ppo', '--env', env,
                           '--no-progress'], capsys)
    assert err == (f'error: {name} needs deterministic policies trained '
                   'through one shared critic: --agent ppo registers no '
                   'shared_critic update (of the built-in agents only td3 '
                   'does)'), err
    assert os.listdir(tmp_path) == []
