"""The installed ``fastpbrl`` command: dispatch, one-line errors (status 2),
run-folder names, custom env modules, and the atomic JSON writer."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import tomllib

import pytest

from examples import ddpg
from fastpbrl import agents, rules
from fastpbrl.cli import commands
from fastpbrl.cli.commands import bench
from fastpbrl.config.errors import ConfigError
from fastpbrl.rules import builtin, registry
from fastpbrl.rules.hypertrick import PRESETS as PRESETS_HT
from fastpbrl.rules.pbt import PRESETS as PBT_PRESETS
from fastpbrl.rules.seeds import Seeds
from fastpbrl.run.build import make_env_spec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_console_script_is_declared_and_resolves():
  with open(os.path.join(ROOT, 'pyproject.toml'), 'rb') as f:
    scripts = tomllib.load(f)['project']['scripts']
  module, function = scripts['fastpbrl'].split(':')
  assert (module, function) == ('fastpbrl.cli.commands', 'console_script')
  assert callable(getattr(sys.modules[module], function))


def test_help_lists_every_command(capsys):
  assert commands.main(['--help']) == 0
  out = capsys.readouterr().out
  for name in ('pbt', 'cemrl', 'dvd', 'hypertrick', 'seeds', 'random',
               'evaluate', 'bench'):
    assert re.search(rf'^  {name} ', out, re.M), name


@pytest.mark.parametrize('name', ['pbt', 'cemrl', 'dvd', 'hypertrick',
                                  'seeds', 'random'])
def test_rule_help_is_the_scripts_help(name, capsys):
  """``fastpbrl X --help`` has the flags of ``python -m experiments.X``."""
  import importlib
  assert commands.main([name, '--help']) == 0
  text = capsys.readouterr().out
  assert text.startswith(f'usage: fastpbrl {name} ')
  alias = importlib.import_module(f'experiments.{name}')
  assert alias.RULE is rules.get(name)  # the same rule, the same flags
  for flag in ('--env', '--population-size', '--env-steps', '--resume',
               '--run-dir'):
    assert flag in text


def test_a_users_rule_is_a_command(capsys):
  """``fastpbrl module:Rule --help``: the flags of its config class."""
  assert commands.main(['examples.halving:Halving', '--help']) == 0
  text = capsys.readouterr().out
  assert text.startswith('usage: fastpbrl examples.halving:Halving ')
  assert '--rung-update-steps' in text and '--env-steps' in text
  err = _one_line_error(['examples.nothing_here:Rule'], capsys)
  assert "cannot import examples.nothing_here" in err


def _one_line_error(argv, capsys):
  assert commands.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: ') and '\n' not in err, err
  return err


@pytest.mark.parametrize('argv, message', [
    (['nope'], "unknown command 'nope'"),
    (['evaluate', 'RUN', '--episodes', '0'], '--episodes must be >= 1, got 0'),
    (['evaluate', 'RUN', '--episodes', 'x'], "--episodes must be an integer, got 'x'"),
    (['evaluate', 'RUN', '--seed', '-1'], '--seed must be >= 0'),
    (['evaluate', 'RUN', '--frobnicate'], 'unrecognized arguments: --frobnicate'),
    (['evaluate'], 'the following arguments are required: RUN_DIR'),
    (['evaluate', 'no/such/run'], "RUN_DIR 'no/such/run' has no config.json"),
    (['pbt', '--population-size', '1', '--no-progress'],
     '--population-size must be >= 2'),
    (['pbt', '--preset', 'huge'],
     "--preset 'huge' is not one of small, paper, atari"),
    (['pbt', '--preset'], 'argument --preset: expected one argument'),
    (['pbt', '--populaton-size', '3'],
     'unknown flag --populaton-size; did you mean --population-size?'),
    (['seeds', '--no-progres'], 'unknown flag --no-progres; did you mean '
     '--no-progress or --progress?'),
    (['dvd', '--learning-rate=3'], 'unknown flag --learning-rate; fastpbrl '
     'dvd --help lists the flags; an agent\'s hyperparameter is set with '
     '--hparams NAME=VALUE'),
    (['seeds', '--hparams', 'learning_rate=1', '--no-progress'],
     "--hparams: td3 has no hyperparameter 'learning_rate'"),
    (['seeds', '--hparams', 'policy_lr'],
     "--hparams 'policy_lr': expected NAME=VALUE"),
    (['seeds', '--hparams', 'discount=x'], "'x' is not a finite number"),
    (['pbt', '--hparams', 'policy_lr=0.5', '--no-progress'],
     '--hparams policy_lr=0.5 is outside the search space'),
    (['pbt', '--resume', 'no/such/run'],
     "--resume 'no/such/run': no config.json there"),
    (['info', 'nope'], "'nope' is neither an agent (td3, sac, dqn"),
    (['pbt', '--config', 'no/such.json'],
     '--config no/such.json: cannot read it'),
    (['pbt', '--config', 'x.json', '--resume', 'y'],
     '--config and --resume: a resume takes the run\'s saved settings'),
    (['info', '--bogus'], 'unknown argument --bogus'),
    (['info', 'dqn', '--env', 'Pendulum-v1'],
     '--env Pendulum-v1: DQN needs a Discrete action space'),
    # Values and search spaces outside a hyperparameter's declared domain.
    (['seeds', '--hparams', 'policy_lr=-1', '--no-progress'],
     '--hparams policy_lr=-1 is outside its valid range (0, inf)'),
    (['seeds', '--hparams', 'policy_delay=2', '--no-progress'],
     '--hparams policy_delay was renamed policy_update_fraction'),
    (['seeds', '--hparams', 'policy_delay=2', '--no-progress'],
     'policy_delay=2 -> policy_update_fraction=0.5'),
    (['seeds', '--agent', 'dqn', '--env', 'CartPole-v1', '--hparams',
      'target_update_period=2500.5', '--no-progress'],
     '--hparams target_update_period=2500.5 is not an integer (valid range: '
     '[1, inf) integers)'),
    (['pbt', '--no-progress', '--search-space',
      '{"policy_lr": {"kind": "uniform", "low": -1e-3, "high": 1e-3}}'],
     "--search-space: search space field 'policy_lr': low -0.001 is outside "
     'its valid range (0, inf)'),
    (['pbt', '--no-progress', '--search-space',
      '{"policy_delay": {"kind": "categorical", "values": [2, 4]}}'],
     '--search-space: policy_delay was renamed policy_update_fraction'),
])
def test_bad_input_is_one_line_with_status_2(argv, message, capsys):
  assert message in _one_line_error(argv, capsys)


def test_custom_env_module_that_does_not_import_names_the_flag(capsys):
  err = _one_line_error(['seeds', '--env', 'no_such_module_x:Point-v0',
                         '--no-progress'], capsys)
  assert ("--env 'no_such_module_x:Point-v0': module 'no_such_module_x' "
          'cannot be imported') in err


def test_custom_env_from_a_user_module(tmp_path, monkeypatch):
  """``--env mymod:Point-v0`` imports mymod, which registers the env."""
  (tmp_path / 'fastpbrl_test_point.py').write_text(
      'import gymnasium as gym\n'
      "gym.register('FastpbrlTestPoint-v0', "
      "entry_point='gymnasium.envs.classic_control:PendulumEnv', "
      'max_episode_steps=50)\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  spec = make_env_spec('fastpbrl_test_point:FastpbrlTestPoint-v0')
  assert spec.observations.shape == (3,)


def test_evaluate_of_an_unfinished_run_names_the_member_flag(tmp_path, capsys):
  (tmp_path / 'config.json').write_text(json.dumps({'rule': 'seeds'}))
  from fastpbrl.api import resolve_member
  from fastpbrl.config.errors import ConfigError
  with pytest.raises(ConfigError, match='no final_returns.json .* pass a member'):
    resolve_member(str(tmp_path), 'best', 4)
  with pytest.raises(ConfigError, match=r'--member 4 is out of range: .* 4 members'):
    resolve_member(str(tmp_path), 4, 4)
  with pytest.raises(ConfigError, match="--member must be best or a member index, got 'top'"):
    resolve_member(str(tmp_path), 'top', 4)
  (tmp_path / 'final_returns.json').write_text(
      json.dumps({'final_returns': [-5.0, 3.0, 1.0, 2.9]}))
  assert resolve_member(str(tmp_path), 'best', 4) == 1
  assert resolve_member(str(tmp_path), '2', 4) == 2


def test_bench_outside_a_checkout_says_where_to_run_it(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, 'benchmarks', None)  # not importable
  monkeypatch.setitem(sys.modules, 'benchmarks.update_speed', None)
  with pytest.raises(SystemExit) as info:
    bench.load_benchmark(cwd=str(tmp_path))
  assert info.value.code == bench.NOT_HERE
  assert 'python -m benchmarks.update_speed' in bench.NOT_HERE


def test_bench_dispatches_to_the_update_speed_benchmark(capsys):
  assert commands.main(['bench', '--help']) == 0
  assert '--population-sizes' in capsys.readouterr().out


def test_console_script_runs_from_another_folder(tmp_path):
  """What the installed script does, from a folder that is not the repo."""
  env = {**os.environ, 'PYTHONPATH': ROOT}
  out = subprocess.run(
      [sys.executable, '-c', 'from fastpbrl.cli.commands import console_script; '
       'console_script()', 'evaluate', 'nowhere'],
      cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr.strip() == ("error: RUN_DIR 'nowhere' has no config.json "
                                '(is it a fastpbrl run folder?)')


def test_default_run_dir_is_rule_agent_env_time(tmp_path):
  from fastpbrl.run.build import default_run_dir
  root = str(tmp_path / 'runs')
  path = default_run_dir('pbt', 'td3', 'Pendulum-v1', root)
  assert re.fullmatch(re.escape(root) + r'/pbt-td3-Pendulum-v1-\d{8}-\d{6}',
                      path), path
  assert os.path.isdir(path)
  path = default_run_dir('seeds', 'dqn', 'ALE/Pong-v5', root)
  assert re.fullmatch(re.escape(root) + r'/seeds-dqn-ALE_Pong-v5-\d{8}-\d{6}',
                      path), path
  assert os.sep not in os.path.basename(
      default_run_dir('dvd', 'td3', 'mymod:Point-v0', root))


def test_runs_started_in_the_same_second_get_folders_of_their_own(
    tmp_path, monkeypatch):
  from fastpbrl.run import build
  monkeypatch.setattr(build.time, 'strftime', lambda _: '20261123-050000')
  root = str(tmp_path / 'runs')
  paths = [build.default_run_dir('pbt', 'td3', 'Hopper-v5', root)
           for _ in range(3)]
  base = os.path.join(root, 'pbt-td3-Hopper-v5-20261123-050000')
  assert paths == [base, base + '-2', base + '-3']
  assert all(os.path.isdir(p) for p in paths)


def test_write_json_atomic_replaces_whole_files(tmp_path):
  from fastpbrl.logs.logging import write_json_atomic
  path = str(tmp_path / 'final_returns.json')
  write_json_atomic(path, {'final_returns': [1.0]})
  write_json_atomic(path, {'final_returns': [2.0, 3.0]})
  with open(path) as f:
    assert json.load(f) == {'final_returns': [2.0, 3.0]}
  assert os.listdir(tmp_path) == ['final_returns.json']  # no temp file left
  with pytest.raises(TypeError):
    write_json_atomic(path, {'x': object()})
  with open(path) as f:  # a failed write leaves the old file whole
    assert json.load(f) == {'final_returns': [2.0, 3.0]}
  assert os.listdir(tmp_path) == ['final_returns.json']


def test_info_lists_every_agent_and_rule(capsys):
  assert commands.main(['info']) == 0
  out = capsys.readouterr().out
  for name in (*agents.known(), *registry.BUILTIN):
    assert f'\n  {name} ' in out, name


def test_info_of_an_agent_is_its_defaults_and_search_space(capsys):
  # Without --env: the example env DQN registered (a discrete one).
  assert commands.main(['info', 'dqn']) == 0
  assert capsys.readouterr().out.startswith('dqn (fastpbrl.agents.dqn) on '
                                            'CartPole-v1')
  assert commands.main(['info', 'dqn', '--env', 'CartPole-v1']) == 0
  out = capsys.readouterr().out.splitlines()
  # Last, after a blank line: the static config --agent-settings sets.
  assert out[-2] == '' and out[-1].startswith(
      'static settings (--agent-settings NAME=VALUE')
  assert 'mlp_hidden_sizes=256,256' in out[-1] and 'batch_size=32' in out[-1]
  lines = out[2:-2]
  rows, meanings = [line.split(None, 2) for line in lines[::2]], lines[1::2]
  spec = agents.get('dqn')
  defaults = spec.make_agent(make_env_spec('CartPole-v1'),
                             spec.config()).default_hparams()
  space = dict(spec.default_search_space.distributions)
  assert [r[0] for r in rows] == list(defaults._fields)
  for (field, default, rest), meaning in zip(rows, meanings):
    assert float(default) == pytest.approx(float(getattr(defaults, field)),
                                           rel=1e-5), field  # printed %g
    domain = spec.hparam_domains[field]
    assert rest.startswith(f'{domain}  '), field
    assert domain.unit in rest and meaning == f'    {domain.meaning}', field
    if field in space:
      dist = space[field]
      assert rest.endswith(f'[{dist.low:g}, {dist.high:g}]'), field
    else:
      assert rest.endswith('fixed'), field


def test_info_of_td3_gives_each_hyperparameters_meaning_unit_and_range(
    capsys):
  assert commands.main(['info', 'td3']) == 0
  out = capsys.readouterr().out
  row = next(line for line in out.splitlines()
             if line.startswith('policy_update_fraction '))
  assert row.split()[1:4] == ['0.5', '(0,', '1]']
  assert 'policy updates per critic update' in row
  assert row.endswith('uniform [0.2, 1]')
  assert "0.5 = TD3's delay d=2" in out
  assert 'Adam step size of the actor' in out and 'step size' in out


def test_a_users_agent_without_domains_is_unchecked_and_info_says_so(
    capsys):
  spec = agents.register('nodomain-ddpg', make_agent=ddpg.make_agent,
                         config=ddpg.DDPGConfig,
                         default_search_space=ddpg.SEARCH_SPACE)
  assert spec.hparam_domains == {}
  spec.check_hparams({'policy_lr': -1.0})  # unchecked: nothing declared
  assert commands.main(['info', 'nodomain-ddpg']) == 0
  out = capsys.readouterr().out
  assert 'undeclared: unchecked' in out
  assert 'no meaning or range registered (hparam_domains)' in out


def test_a_refused_hyperparameter_makes_no_run_folder(tmp_path, monkeypatch,
                                                       capsys):
  monkeypatch.chdir(tmp_path)
  _one_line_error(['pbt', '--no-progress', '--hparams', 'discount=1.5'],
                  capsys)
  _one_line_error(['pbt', '--no-progress', '--search-space',
                   '{"tau": {"kind": "uniform", "low": 0, "high": 0.1}}'],
                  capsys)
  assert os.listdir(tmp_path) == []


def test_info_of_a_rule_is_how_its_presets_differ(capsys):
  assert commands.main(['info', 'hypertrick']) == 0
  lines = capsys.readouterr().out.splitlines()
  paper = PRESETS_HT['paper']
  line = next(x for x in lines if x.startswith('  paper: '))
  assert f'--population-size {paper.population_size}' in line
  assert f'--env {paper.env}' in line
  assert '--agent' not in line  # the same in both presets


def print_config(argv, capsys) -> dict:
  assert commands.main(argv) == 0
  return json.loads(capsys.readouterr().out)


def test_config_file_then_flags_then_print(tmp_path, capsys):
  """``--config`` (YAML here) overrides the preset, flags override it, and
  ``--print-config`` prints the result without running."""
  path = tmp_path / 'run.yaml'
  path.write_text('env: Hopper-v5\npopulation-size: 6\n'
                  'hparams: [tau=0.01]\nhidden_sizes: [64, 64]\n')
  got = print_config(['pbt', '--preset', 'paper', '--config', str(path),
                      '--env-steps', '5000', '--print-config'], capsys)
  paper = dataclasses.asdict(PBT_PRESETS['paper'])
  want = {**paper, 'env': 'Hopper-v5', 'population_size': 6,
          'hparams': ['tau=0.01'], 'hidden_sizes': [64, 64],
          'env_steps': 5000}
  assert got == json.loads(json.dumps(want))


def test_a_runs_config_json_is_a_config_file(tmp_path, capsys):
  """What a run saves (its settings, its rule's ref, its folder) starts a
  new run with the same settings, in a folder of its own."""
  from fastpbrl.config.derived import resolved  # a run saves resolved settings
  settings = dataclasses.asdict(resolved(dataclasses.replace(
      PBT_PRESETS['small'], seed=7, fraction=0.5, hidden_sizes=(32, 32),
      run_dir='runs/old', progress=False)))
  (tmp_path / 'config.json').write_text(json.dumps(
      {**settings, 'rule': 'pbt', 'not_resumable': '',
       'interval_unit': 'env steps per member'}))
  got = print_config(['pbt', '--config', str(tmp_path / 'config.json'),
                      '--print-config'], capsys)
  assert got == json.loads(json.dumps({**settings, 'run_dir': None}))


@pytest.mark.parametrize('text, message', [
    ('{"populaton_size": 3}',
     "no setting 'populaton_size'; did you mean population_size?"),
    ('{"population_size": "six"}', "population_size must be int, got 'six'"),
    ('{"seed": true}', 'seed must be int, got True'),
    ('{"hidden_sizes": [16, "x"]}',
     'hidden_sizes must be Optional[tuple[int, ...]]'),
    ('[1, 2]', 'expected a mapping of settings to values, got list'),
    ('{"env": ', 'not valid JSON'),
])
def test_a_bad_config_file_is_one_line(tmp_path, capsys, text, message):
  path = tmp_path / 'bad.json'
  path.write_text(text)
  assert message in _one_line_error(['pbt', '--config', str(path)], capsys)


def test_resuming_a_run_stopped_before_its_first_checkpoint_is_one_line(
    tmp_path, capsys):
  """A run killed before it saved anything leaves config.json and an
  empty checkpoints/ folder: a resume says so in one line."""
  settings = dataclasses.asdict(dataclasses.replace(
      Seeds.presets['small'], run_dir=str(tmp_path), progress=False,
      hidden_sizes=(8,), num_actors=1))
  (tmp_path / 'config.json').write_text(json.dumps(
      {**settings, 'rule': 'seeds', 'not_resumable': '',
       'interval_unit': 'env steps per member'}))
  (tmp_path / 'checkpoints').mkdir()
  assert commands.main(['seeds', '--resume', str(tmp_path)]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == (f'error: --resume {str(tmp_path)!r}: no complete '
                     'checkpoint there (the run was stopped before its first '
                     'one); start it again without --resume'), err
  # (A 'Logging error' may precede it here: an earlier test's handler
  # writing to a captured stream pytest has closed.)
  assert not any('FileNotFoundError' in line for line in err), err


def test_an_env_module_in_the_current_folder_is_found(tmp_path, monkeypatch):
  """``--env mymod:Env-v0`` imports mymod from where the command runs, as
  ``--agent mymod:X`` does; a space it cannot serve is one ConfigError."""
  (tmp_path / 'cwd_env_mod.py').write_text(
      'import gymnasium as gym\n'
      'gym.register("CwdPendulum-v0", entry_point='
      '"gymnasium.envs.classic_control.pendulum:PendulumEnv",'
      ' max_episode_steps=20)\n'
      'gym.register("CwdDict-v0", entry_point="cwd_env_mod:DictEnv")\n'
      'class DictEnv(gym.Env):\n'
      '  observation_space = gym.spaces.Dict({"a": gym.spaces.Discrete(2)})\n'
      '  action_space = gym.spaces.Discrete(2)\n')
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'path', [p for p in sys.path
                                    if p not in ('', str(tmp_path))])
  spec = make_env_spec('cwd_env_mod:CwdPendulum-v0')
  assert spec.observations.shape == (3,)
  with pytest.raises(ConfigError,
                     match="--env 'cwd_env_mod:CwdDict-v0': observation "
                           'space .* is not supported'):
    make_env_spec('cwd_env_mod:CwdDict-v0')


def test_help_imports_nothing_of_jax():
  """``fastpbrl --help`` lists the commands without importing JAX, the run
  loop or a rule (seconds of start-up); ``-X importtime`` in a fresh
  process shows what it imports."""
  code = ('import sys; from fastpbrl.cli.commands import main; '
          'assert main(["--help"]) == 0; '
          'heavy = [m for m in sys.modules if m.split(".")[0] in '
          '("jax", "jaxlib", "numpy", "haiku", "optax", "orbax", "gymnasium")'
          ' or m in ("fastpbrl.run.main", "fastpbrl.cli.parse", "fastpbrl.rules.base")]; '
          'print(heavy, file=sys.stderr)')
  out = subprocess.run([sys.executable, '-c', code], cwd=ROOT, text=True,
                       capture_output=True, check=True,
                       env={**os.environ, 'PYTHONPATH': ROOT})
  assert 'train a population with a rule:' in out.stdout
  assert out.stderr.strip() == '[]', out.stderr


def test_help_lines_read_from_source_are_the_rules_own():
  assert builtin.help_lines() == {rule.name: rule.help
                                  for rule in registry.builtins()}
