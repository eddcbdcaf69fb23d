"""The PPO actor-speed benchmark runs both sides and writes its record
(``--smoke``: tiny settings, no measurement)."""

import json

import pytest

from benchmarks import ppo_actor_speed

SMOKE_MEMBERS = ppo_actor_speed.SMOKE['population_size']


@pytest.mark.slow
def test_smoke_writes_the_record_with_its_provenance(tmp_path):
  pytest.importorskip('stable_baselines3')  # the SB3 side: the torch extra
  out = tmp_path / 'actor_speed.json'
  record = ppo_actor_speed.main(['--smoke', '--out', str(out)])
  saved = json.loads(out.read_text())
  assert saved['wall_time_ratio'] == pytest.approx(record['wall_time_ratio'])
  for key in ('command', 'date', 'commit', 'machine'):
    assert saved[key]
  steps = ppo_actor_speed.SMOKE['env_steps']
  assert saved['fastpbrl']['env_steps_per_member'] == steps
  # --num-actors unset: the on-policy default, an actor per core, at most N.
  assert 1 <= saved['fastpbrl']['actor_processes'] <= SMOKE_MEMBERS
  assert saved['sb3']['env_steps'] >= steps
