"""benchmarks/policy_call.py: both routes run, agree, and are recorded."""

import json

from benchmarks import policy_call


def test_smoke_writes_a_row_per_agent_and_call(tmp_path):
  out = tmp_path / 'policy_call.json'
  record = policy_call.main(['--smoke', '--out', str(out)])
  assert json.loads(out.read_text()) == record
  rows = {(r['agent'], r['call']): r for r in record['rows']}
  assert set(rows) == {(a, c) for a in ('ppo', 'td3')
                       for c in ('policy', 'policy_and_eval')}
  # PPO's call returns actions and log-probabilities, TD3's actions; each
  # with the evaluation envs' actions beside.
  assert [rows['ppo', 'policy']['outputs'], rows['td3', 'policy']['outputs'],
          rows['ppo', 'policy_and_eval']['outputs'],
          rows['td3', 'policy_and_eval']['outputs']] == [2, 1, 3, 2]
  for r in record['rows']:
    assert r['us_one_buffer'] > 0 and r['us_array_per_output'] > 0
  assert '| ppo | `policy` | 2 | 2 |' in (tmp_path / 'policy_call.md').read_text()
