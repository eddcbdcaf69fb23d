"""fastpbrl: population-based reinforcement learning on a single machine.

The Python API (``fastpbrl/api.py``, imported on first use so that
``import fastpbrl`` stays light):

* ``train(rule='pbt', *, config=None, **settings) -> TrainResult``: train a
  population; ``config`` is the rule's typed settings (``PBTRunConfig``,
  ``RunConfig``, ...: the dataclasses the commands' flags come from);
* ``load_policy(run_dir, member='best') -> Policy``: ``policy(obs) -> action``,
  ``policy.predict(obs, deterministic=True)`` (Stable-Baselines3's),
  ``policy.save(path)`` (one member alone; ``load_policy(path)`` reads it);
* ``evaluate(run_dir, member='best', episodes=10, video_dir=None, seed=0)``;
* ``load_run(run_dir) -> RunData``: a run's results as pandas tables
  (episodes, evaluations, hyperparameters, lineage, rule scalars, final
  returns) and ``hparam_schedule(member)``, the hyperparameters behind a
  member's weights over time (``fastpbrl/trained/run_data.py``);
* ``Callback``: hooks ``after_call(loop)`` and ``after_rule_decision(loop,
  event)`` for ``train(..., callbacks=[...])`` and ``run``; ``loop.stop()``
  ends a run early, as ``StopAtReturn(threshold)`` and ``TimeLimit(seconds)``
  do;
* ``fastpbrl.run.run(config, rule, callbacks=())``: the loop itself;
* ``fastpbrl.rules``: the rule contract and registry (``register``);
* ``fastpbrl.envs.register``: adds a family of JAX envs (``--env
  prefix:NAME``, stepped on the device; ``fastpbrl/envs/jax_envs.py``).
"""

import importlib

__version__ = '0.1.0'

_API = {
    'train': 'fastpbrl.api', 'load_policy': 'fastpbrl.api',
    'evaluate': 'fastpbrl.api', 'best_member': 'fastpbrl.trained.run_data',
    'TrainResult': 'fastpbrl.api', 'Policy': 'fastpbrl.trained.policy',
    'Evaluation': 'fastpbrl.api', 'Callback': 'fastpbrl.run.callbacks',
    'StopAtReturn': 'fastpbrl.run.callbacks',
    'TimeLimit': 'fastpbrl.run.callbacks',
    'ConfigError': 'fastpbrl.config.errors',
    'RunConfig': 'fastpbrl.config.fields',
    'PBTRunConfig': 'fastpbrl.rules.pbt.rule',
    'CEMRLRunConfig': 'fastpbrl.rules.cemrl.rule',
    'DvDRunConfig': 'fastpbrl.rules.dvd.rule',
    'HyperTrickRunConfig': 'fastpbrl.rules.hypertrick.rule',
    'load_run': 'fastpbrl.trained.run_data',
    'RunData': 'fastpbrl.trained.run_data',
}

__all__ = sorted(_API)


def __getattr__(name):
  if name == 'run':
    # ``fastpbrl.run`` is the run's package; its ``run`` function is
    # ``fastpbrl.run.run`` (an attribute lookup here returns the package).
    return importlib.import_module('fastpbrl.run')
  if name in _API:
    return getattr(importlib.import_module(_API[name]), name)
  if name in ('agents', 'envs', 'rules'):  # fastpbrl.rules.register, ...
    return importlib.import_module(f'fastpbrl.{name}')
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
