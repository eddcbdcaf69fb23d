"""--track: W&B (offline) and MLflow (a local file store) get the run's
config and scalars, read back from what they wrote; a missing library is a
one-line error naming the flag and the pip extra."""

import glob
import json
import os
import struct

import pytest

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.logs import tracking
from fastpbrl.logs.logging import RunLogger

CONFIG = {'rule': 'pbt', 'agent': 'td3', 'population_size': 2}


def _log_a_little(run_dir, track):
  logger = RunLogger(run_dir, 2, total_env_steps=100, progress=False,
                     track=track, config=CONFIG)
  logger.scalars({'learner/critic_loss': 0.5, 'rule/best_fitness': None,
                  'pipeline/population_env_steps': 200}, 100)
  # Member 1's episode ends at fewer env steps than the scalars above:
  # logged all the same, against its own env steps.
  logger.episodes([EpisodeRecord(1, -7.0, 10, False, 90, 1)], env_steps=100,
                  update_steps=100)
  logger.close()


def _wandb_records(run_dir):
  """The history and config records of an offline W&B run, read from its
  ``.wandb`` file (LevelDB log format: 32 KiB blocks of records with a
  7-byte header: crc32, length, type) as wandb's protobuf ``Record``s."""
  from wandb.proto import wandb_internal_pb2 as pb
  path, = glob.glob(os.path.join(run_dir, 'wandb', 'offline-run-*', '*.wandb'))
  with open(path, 'rb') as f:
    data = f.read()
  raw, buffer, pos = [], b'', 7  # past the file's own 7-byte header
  while pos + 7 <= len(data):
    if 32768 - pos % 32768 < 7:  # a block's tail too short for a header
      pos += 32768 - pos % 32768
      continue
    _, length, kind = struct.unpack('<IHB', data[pos:pos + 7])
    buffer += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # a full record, or the last piece of one
      raw.append(buffer)
      buffer = b''
    elif kind not in (2, 3):
      break
  history, config = [], {}
  for r in raw:
    record = pb.Record()
    record.ParseFromString(r)
    kind = record.WhichOneof('record_type')
    if kind == 'history':
      history.append({i.key or '/'.join(i.nested_key): json.loads(i.value_json)
                      for i in record.history.item})
    elif kind in ('run', 'config'):
      items = (record.run.config if kind == 'run' else record.config).update
      config.update({i.key: json.loads(i.value_json) for i in items})
  return history, config


def test_wandb_offline_gets_config_and_scalars(tmp_path, monkeypatch):
  pytest.importorskip('wandb')
  monkeypatch.setenv('WANDB_MODE', 'offline')
  monkeypatch.setenv('WANDB_DIR', str(tmp_path))
  monkeypatch.setenv('WANDB_SILENT', 'true')
  run_dir = str(tmp_path / 'run')
  _log_a_little(run_dir, 'wandb')
  # The run's records reach its file through W&B's service process: stop
  # it, so that everything is written before the file is read.
  import wandb
  wandb.teardown()
  history, config = _wandb_records(str(tmp_path))
  steps = {k: h[tracking.X_AXIS] for h in history for k in h
           if not k.startswith('_') and k != tracking.X_AXIS}
  assert steps == {'learner/critic_loss': 100,
                   'pipeline/population_env_steps': 100,
                   'member_001/train_return': 90}
  values = {k: v for h in history for k, v in h.items()}
  assert values['learner/critic_loss'] == 0.5
  assert values['member_001/train_return'] == -7.0
  assert {k: config[k]['value'] if isinstance(config[k], dict) else config[k]
          for k in CONFIG} == CONFIG
  with open(os.path.join(run_dir, 'tracking.json')) as f:
    assert json.load(f)['wandb']
  assert os.listdir(os.path.join(run_dir, 'tensorboard'))  # as well


def test_mlflow_file_store_gets_config_and_scalars(tmp_path, monkeypatch):
  pytest.importorskip('mlflow')
  from mlflow.tracking import MlflowClient
  uri = f'file:{tmp_path / "mlruns"}'
  monkeypatch.setenv('MLFLOW_TRACKING_URI', uri)
  monkeypatch.setenv('MLFLOW_ALLOW_FILE_STORE', 'true')
  run_dir = str(tmp_path / 'run')
  _log_a_little(run_dir, 'mlflow')
  with open(os.path.join(run_dir, 'tracking.json')) as f:
    run_id = json.load(f)['mlflow']
  client = MlflowClient(tracking_uri=uri)
  run = client.get_run(run_id)
  assert run.info.status == 'FINISHED'
  assert {k: json.loads(run.data.params[k]) for k in CONFIG} == CONFIG
  assert [(m.step, m.value) for m in client.get_metric_history(
      run_id, 'learner/critic_loss')] == [(100, 0.5)]
  assert [(m.step, m.value) for m in client.get_metric_history(
      run_id, 'member_001/train_return')] == [(90, -7.0)]
  assert 'rule/best_fitness' not in run.data.metrics  # None is left out
  # A resumed run logs to the same MLflow run.
  logger = RunLogger(run_dir, 2, total_env_steps=100, progress=False,
                     track='mlflow', config={**CONFIG, 'env_steps': 5})
  logger.scalars({'learner/critic_loss': 0.25}, 200)
  logger.close()
  assert [(m.step, m.value) for m in client.get_metric_history(
      run_id, 'learner/critic_loss')] == [(100, 0.5), (200, 0.25)]


def test_track_none_writes_no_tensorboard_files(tmp_path):
  _log_a_little(str(tmp_path), 'none')
  assert not os.path.exists(tmp_path / 'tensorboard')
  assert os.path.exists(tmp_path / 'members' / 'member_001.csv')


def test_missing_library_or_bad_value_names_the_flag(tmp_path, monkeypatch):
  from experiments import pbt
  find_spec = tracking.importlib.util.find_spec
  monkeypatch.setattr(tracking.importlib.util, 'find_spec',
                      lambda name: None if name in ('wandb', 'mlflow')
                      else find_spec(name))
  for argv, message in [
      (['--track', 'wandb'],
       "--track wandb needs the wandb package: pip install 'fastpbrl[wandb]'"),
      (['--track', 'mlflow'],
       "--track mlflow needs the mlflow package: pip install "
       "'fastpbrl[mlflow]'"),
      (['--track', 'neptune'], '--track must be one of tensorboard, wandb, '
                               "mlflow, none, got 'neptune'")]:
    with pytest.raises(SystemExit) as info:
      pbt.main(argv + ['--run-dir', str(tmp_path), '--no-progress'])
    assert str(info.value.code) == f'error: {message}'
