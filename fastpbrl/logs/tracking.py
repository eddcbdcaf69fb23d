"""Experiment trackers the run's scalars go to (host-side; not jittable):
``--track tensorboard|wandb|mlflow|none``.

* ``tensorboard`` (default): event files under ``run_dir/tensorboard``,
  written by ``tensorboardX`` (a core dependency, no TensorFlow); view them
  with ``tensorboard --logdir runs`` (the ``tensorboard`` extra).
* ``wandb``: Weights & Biases (the ``wandb`` extra), as well as the
  TensorBoard files. ``WANDB_PROJECT`` (default ``fastpbrl``), ``WANDB_MODE``
  (``offline`` writes only local files), ``WANDB_DIR`` (default: the run
  directory) and the other ``WANDB_*`` variables apply as usual.
* ``mlflow``: MLflow (the ``mlflow`` extra, the tracking client
  ``mlflow-skinny``), as well as the TensorBoard files, to the server or
  store ``MLFLOW_TRACKING_URI`` names, in the experiment
  ``MLFLOW_EXPERIMENT_NAME`` (default ``fastpbrl``).
* ``none``: nothing beyond the members' CSV files.

Every scalar goes against one x-axis, the env steps per member; W&B gets it
as the custom step metric ``env_steps_per_member`` (members' episodes end
out of order, which W&B's own monotonic step would drop). The resolved run
config is logged once. A resumed run continues the same W&B or MLflow run:
its id is kept in ``run_dir/tracking.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from typing import Any, Mapping, Optional

TRACKS = ('tensorboard', 'wandb', 'mlflow', 'none')
# --track value -> (module it imports, pip extra that installs it)
LIBRARIES = {'wandb': ('wandb', 'wandb'), 'mlflow': ('mlflow', 'mlflow')}
X_AXIS = 'env_steps_per_member'  # W&B's step metric


def check(track: str) -> Optional[str]:
  """Why ``--track track`` cannot run here (one line), or ``None``."""
  if track not in TRACKS:
    return f'--track must be one of {", ".join(TRACKS)}, got {track!r}'
  if track in LIBRARIES:
    module, extra = LIBRARIES[track]
    if importlib.util.find_spec(module) is None:
      return (f"--track {track} needs the {module} package: pip install "
              f"'fastpbrl[{extra}]'")
  if track == 'mlflow' and not os.environ.get('MLFLOW_TRACKING_URI') and (
      importlib.util.find_spec('sqlalchemy') is None):
    return ('--track mlflow needs MLFLOW_TRACKING_URI: a tracking server '
            "(http://...) or a local store (file:/path, with "
            'MLFLOW_ALLOW_FILE_STORE=true); mlflow-skinny, the fastpbrl[mlflow] '
            "extra, has no local database for MLflow's default sqlite store")
  return None


class TensorBoard:
  """Event files under ``run_dir/tensorboard``."""

  def __init__(self, run_dir: str, purge_step: int | None = None):
    from tensorboardX import SummaryWriter  # noqa: PLC0415 (heavy import)

    # purge_step: a resumed run's env steps per member at its checkpoint;
    # TensorBoard drops what the killed run wrote at or after it.
    self._writer = SummaryWriter(os.path.join(run_dir, 'tensorboard'),
                                 purge_step=purge_step)

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    for name, value in values.items():
      self._writer.add_scalar(name, value, step)

  def close(self) -> None:
    self._writer.close()


class WandB:
  """A Weights & Biases run (resumed if ``tracking.json`` names one)."""

  def __init__(self, run_dir: str, config: Mapping[str, Any]):
    import wandb  # noqa: PLC0415 (optional)

    state = _read_state(run_dir)
    run_id = state.get('wandb')  # None: a new run, W&B picks its id
    self._run = wandb.init(
        project=os.environ.get('WANDB_PROJECT', 'fastpbrl'),
        name=os.path.basename(os.path.abspath(run_dir)), id=run_id,
        resume='allow' if run_id else None, config=dict(config),
        dir=os.environ.get('WANDB_DIR') or run_dir)
    self._run.define_metric(X_AXIS)
    self._run.define_metric('*', step_metric=X_AXIS)
    if run_id is None:
      _write_state(run_dir, {**state, 'wandb': self._run.id})

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    self._run.log({**values, X_AXIS: step})

  def close(self) -> None:
    self._run.finish()


class MLflow:
  """An MLflow run (resumed if ``tracking.json`` names one)."""

  def __init__(self, run_dir: str, config: Mapping[str, Any]):
    from mlflow.entities import Param  # noqa: PLC0415 (optional)
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    self._client = client = MlflowClient()
    name = os.environ.get('MLFLOW_EXPERIMENT_NAME', 'fastpbrl')
    experiment = client.get_experiment_by_name(name)
    experiment_id = (experiment.experiment_id if experiment is not None
                     else client.create_experiment(name))
    state = _read_state(run_dir)
    self._run_id = state.get('mlflow')
    if self._run_id is None:
      self._run_id = client.create_run(
          experiment_id,
          run_name=os.path.basename(os.path.abspath(run_dir))).info.run_id
      # Parameters are logged once: MLflow refuses to change one, and a
      # resume may change budgets.
      params = [Param(k, json.dumps(v, default=str)[:500])
                for k, v in config.items()]
      for i in range(0, len(params), 100):  # log_batch takes 100 at most
        client.log_batch(self._run_id, params=params[i:i + 100])
      _write_state(run_dir, {**state, 'mlflow': self._run_id})

  def scalars(self, values: Mapping[str, float], step: int) -> None:
    from mlflow.entities import Metric  # noqa: PLC0415

    now = int(time.time() * 1000)
    metrics = [Metric(k, float(v), now, int(step)) for k, v in values.items()]
    for i in range(0, len(metrics), 1000):  # log_batch takes 1000 at most
      self._client.log_batch(self._run_id, metrics=metrics[i:i + 1000])

  def close(self) -> None:
    self._client.set_terminated(self._run_id)


def open_trackers(track: str, run_dir: str, config: Mapping[str, Any],
                  purge_step: int | None = None) -> list:
  """The trackers ``--track track`` writes to, each with ``scalars(values,
  step)`` and ``close()``."""
  message = check(track)
  if message:
    raise ValueError(message)
  if track == 'none':
    return []
  trackers = [TensorBoard(run_dir, purge_step)]
  try:
    if track == 'wandb':
      trackers.append(WandB(run_dir, config))
    elif track == 'mlflow':
      trackers.append(MLflow(run_dir, config))
  except BaseException:
    trackers[0].close()
    raise
  return trackers


def _read_state(run_dir: str) -> dict:
  path = os.path.join(run_dir, 'tracking.json')
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def _write_state(run_dir: str, state: dict) -> None:
  """Atomically: a temporary file, then ``os.replace``."""
  path = os.path.join(run_dir, 'tracking.json')
  tmp = f'{path}.tmp.{os.getpid()}'
  with open(tmp, 'w') as f:
    json.dump(state, f, indent=2)
  os.replace(tmp, path)
