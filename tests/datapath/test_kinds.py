"""The kind of a run's data path (``fastpbrl.datapath.kinds``): the one
place outside the agents that reads what an agent learns from. Checked
against the table of the four paths worked out by hand, against the
settings it decides (``--warmup-steps``, the replay-only flags), and by a
scan of the package: no generic code or rule reads ``learns_from``."""

import ast
import pathlib
import types

import pytest

from fastpbrl.config.checks import validate
from fastpbrl.config.derived import path_kind, resolved, restart_warmup_steps
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.datapath.kinds import kind_of

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / 'fastpbrl'
REPLAY = types.SimpleNamespace(learns_from='replay')
ROLLOUT = types.SimpleNamespace(learns_from='rollout')


@pytest.mark.parametrize('agent, env, name, has_replay, lives_here', [
    (REPLAY, 'Pendulum-v1', 'actor_replay', True, 'their actors and replay'),
    (ROLLOUT, 'Pendulum-v1', 'actor_rollouts', False, 'their actors'),
    (REPLAY, 'gymnax:Pendulum-v1', 'device_replay', True,
     'their envs and replay rings'),
    (ROLLOUT, 'gymnax:Pendulum-v1', 'device_rollouts', False, 'their envs'),
])
def test_the_four_kinds(agent, env, name, has_replay, lives_here):
  kind = kind_of(agent, env)
  assert kind.name == name
  assert kind.jax_env == env.startswith('gymnax:')
  assert kind.has_replay == has_replay
  assert kind.random_warmup == has_replay  # only replay paths warm up
  assert kind.lives_here == lives_here
  assert kind.warmup_steps(700) == (700 if has_replay else 0)


def test_the_settings_ask_the_kind():
  td3 = RunConfig(agent='td3', env='gymnax:Pendulum-v1', env_steps=4_000)
  ppo = RunConfig(agent='ppo', env='gymnax:Pendulum-v1', env_steps=4_000)
  assert path_kind(td3).name == 'device_replay'
  assert path_kind(ppo).name == 'device_rollouts'
  # The budget sets TD3's warm-up (half of it, at most 1,000); PPO has none.
  assert resolved(td3).warmup_steps == 1_000 == restart_warmup_steps(td3)
  assert resolved(ppo).warmup_steps == 0 == restart_warmup_steps(ppo)
  # A set warm-up is kept in the settings but never played by PPO's path.
  ppo_set = RunConfig(agent='ppo', env='gymnax:Pendulum-v1',
                      env_steps=4_000, warmup_steps=300)
  assert resolved(ppo_set).warmup_steps == 300
  assert restart_warmup_steps(ppo_set) == 0
  # Replay-only settings are refused on a path without a replay, and only
  # there.
  with pytest.raises(ConfigError, match='^--replay-capacity 5000:'):
    validate(RunConfig(agent='ppo', env='gymnax:Pendulum-v1',
                       replay_capacity=5000, run_dir='/nonexistent/x'))
  with pytest.raises(ConfigError, match='^--warmup-steps'):
    validate(RunConfig(agent='td3', env='Pendulum-v1', env_steps=100,
                       warmup_steps=100, run_dir='/nonexistent/x'))


def _reads_of_learns_from(path: pathlib.Path) -> list[int]:
  tree = ast.parse(path.read_text())
  return [node.lineno for node in ast.walk(tree)
          if isinstance(node, ast.Attribute) and node.attr == 'learns_from']


def test_only_agents_and_data_paths_read_what_an_agent_learns_from():
  allowed = {'agents', 'datapath'}
  found = []
  for path in sorted(PACKAGE.rglob('*.py')):
    part = path.relative_to(PACKAGE).parts[0]
    if part in allowed:
      continue
    found += [f'{path.relative_to(PACKAGE)}:{line}'
              for line in _reads_of_learns_from(path)]
  assert not found, f'generic code reads learns_from: {found}'
  # The scan sees a read where there is one.
  assert _reads_of_learns_from(PACKAGE / 'datapath' / 'kinds.py')
