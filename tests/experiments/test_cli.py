"""Invalid settings fail before any process starts, naming the flag."""

import pytest

from experiments import cemrl, dvd, hypertrick, pbt


@pytest.mark.parametrize('module, argv, message', [
    (pbt, ['--population-size', '1'], '--population-size must be >= 2'),
    (pbt, ['--fraction', '0.7'], r'--fraction must be in \(0, 0.5\]'),
    (pbt, ['--fraction', '0'], r'--fraction must be in \(0, 0.5\]'),
    (pbt, ['--agent', 'trpo'], "--agent 'trpo' is unknown"),
    (pbt, ['--exploit', 'roulette'], '--exploit must be one of'),
    (pbt, ['--env', 'NoSuchEnv-v0'], "--env 'NoSuchEnv-v0' cannot be made"),
    (pbt, ['--warmup-steps', '50000'], '--warmup-steps .* must be below'),
    (pbt, ['--init-hparams', 'zeros'], '--init-hparams must be one of near-defaults, prior, defaults'),
    (pbt, ['--agent', 'dqn'], 'DQN needs a Discrete action space'),
    (pbt, ['--ready-after', '40000'],
     '--ready-after 40000 .* beyond the budget .* PBT would never exploit'),
    (pbt, ['--eval-every', '5000'],
     '--eval-every 5000 is longer than one --ready-after span'),
    (pbt, ['--agent', 'no_such_pkg.mod:Agent'],
     "--agent 'no_such_pkg.mod:Agent': cannot import no_such_pkg.mod: "
     "ModuleNotFoundError"),
    (pbt, ['--agent', 'fastpbrl.agents.td3:NoSuchSpec'],
     "--agent 'fastpbrl.agents.td3:NoSuchSpec': module fastpbrl.agents.td3 "
     "has no AgentSpec 'NoSuchSpec'"),
    (dvd, ['--agent', 'sac'],
     'DvD needs .* one shared critic: --agent sac registers no shared_critic'),
    (cemrl, ['--agent', 'sac'],
     'CEM-RL needs .* --agent sac registers no shared_critic'),
    (dvd, ['--kernel-sigma', '0'], '--kernel-sigma must be > 0'),
    (hypertrick, ['--eviction-rate', '0.6'], '--eviction-rate must be in'),
    (hypertrick, ['--num-phases', '0'], '--num-phases must be >= 1'),
    (hypertrick, ['--search-space', 'no/such/space.json'],
     '--search-space no/such/space.json: cannot read it'),
    (hypertrick, ['--eval-every', '5000'],
     '--eval-every 5000 is longer than one --phase-env-steps span'),
    (dvd, ['--bandit-every', '10'],
     '--eval-every 5000 is longer than one --bandit-every span'),
])
def test_bad_flag_exits_with_a_message_naming_it(module, argv, message,
                                                  tmp_path, monkeypatch):
  # Any process start would need the pipeline: make it fail loudly instead.
  import fastpbrl.run.main as run_lib
  monkeypatch.setattr(run_lib, 'RunLogger', _no_start)
  with pytest.raises(SystemExit) as info:
    module.main(argv + ['--run-dir', str(tmp_path), '--no-progress'])
  assert info.value.code != 0
  import re
  assert re.search(message, str(info.value.code)), info.value.code


def _no_start(*args, **kwargs):
  raise AssertionError('a run started despite an invalid setting')


def test_preset_paper_sets_the_papers_population(monkeypatch):
  from fastpbrl.cli import parse as cli
  config = cli.parse(pbt.PRESETS, 'x', ['--preset', 'paper'])
  assert (config.env, config.population_size) == ('HalfCheetah-v5', 80)
  config = cli.parse(pbt.PRESETS, 'x', ['--preset', 'paper',
                                        '--population-size', '8'])
  assert (config.env, config.population_size) == ('HalfCheetah-v5', 8)
  config = cli.parse(dvd.PRESETS, 'x', ['--preset', 'paper'])
  assert (config.env, config.population_size) == ('Humanoid-v5', 5)


def test_setup_logging_shows_fastpbrl_info_even_if_root_is_configured(capsys):
  import logging
  from fastpbrl.logs.logging import setup_logging
  root_handler = logging.NullHandler()
  logging.getLogger().addHandler(root_handler)  # what absl does on import
  log = logging.getLogger('fastpbrl')
  saved = list(log.handlers)
  for handler in saved:  # earlier tests' runs installed one on their stderr
    log.removeHandler(handler)
  try:
    setup_logging()
    logging.getLogger('fastpbrl.replay.buffers').info('replay: 1.0 GiB')
    assert 'fastpbrl.replay.buffers INFO replay: 1.0 GiB' in capsys.readouterr().err
  finally:
    logging.getLogger().removeHandler(root_handler)
    for handler in list(log.handlers):
      log.removeHandler(handler)
    for handler in saved:
      log.addHandler(handler)


def _pbt_error(argv, monkeypatch):
  import fastpbrl.run.main as run_lib
  monkeypatch.setattr(run_lib, 'RunLogger', _no_start)
  with pytest.raises(SystemExit) as info:
    pbt.main(argv + ['--no-progress'])
  return str(info.value.code)


def test_non_empty_run_dir_without_resume_is_refused(tmp_path, monkeypatch):
  (tmp_path / 'members').mkdir()
  message = _pbt_error(['--run-dir', str(tmp_path)], monkeypatch)
  assert f'--run-dir {str(tmp_path)!r} is not empty: pass --resume' in message


def test_resume_cannot_change_shapes_or_rule(tmp_path, monkeypatch):
  import json
  (tmp_path / 'checkpoints').mkdir()
  config = {'rule': 'pbt', 'env': 'Pendulum-v1', 'agent': 'td3',
            'population_size': 4, 'hidden_sizes': [256, 256]}
  (tmp_path / 'config.json').write_text(json.dumps(config))
  message = _pbt_error(['--resume', str(tmp_path), '--population-size', '8'],
                       monkeypatch)
  assert "--population-size 8 differs from the resumed run's 4" in message
  (tmp_path / 'config.json').write_text(json.dumps({**config, 'rule': 'dvd'}))
  message = _pbt_error(['--resume', str(tmp_path)], monkeypatch)
  assert (f"is a 'dvd' run; continue it with: fastpbrl dvd --resume {tmp_path}"
          in message)
  (tmp_path / 'config.json').write_text(json.dumps(
      {k: v for k, v in config.items() if k != 'rule'}))
  message = _pbt_error(['--resume', str(tmp_path)], monkeypatch)
  assert 'names no rule' in message and 'earlier fastpbrl' in message


def test_rerun_of_a_missing_member_names_the_flags(tmp_path, monkeypatch):
  lineage = tmp_path / 'lineage.jsonl'
  lineage.write_text('{"event": "init", "member": 0, "step": 0, '
                     '"hparams": {}}\n')
  message = _pbt_error(['--rerun-lineage', str(lineage), '--rerun-member', '5',
                        '--run-dir', str(tmp_path / 'rerun')], monkeypatch)
  assert '--rerun-member 5' in message and 'no init event for member 5' in message


def test_resumed_pipeline_seeds_are_not_other_runs_seeds():
  from fastpbrl.datapath.factory import pipeline_seed
  assert pipeline_seed(3, 0) == 3  # a fresh run uses its own seed
  resumed = {pipeline_seed(0, calls) for calls in range(1, 50)}
  assert len(resumed) == 49 and not resumed & set(range(1000))
