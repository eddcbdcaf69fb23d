"""benchmarks/policy_call.py: a call timed under both schedulers, each in a
process of its own, and recorded."""

import json

import pytest

from benchmarks import policy_call


@pytest.mark.slow
def test_smoke_times_the_call_under_both_schedulers(tmp_path):
  out = tmp_path / 'policy_call.json'
  record = policy_call.main(['--smoke', '--out', str(out)])
  assert json.loads(out.read_text()) == record
  assert [(r['agent'], r['call']) for r in record['rows']] == [
      ('ppo', 'policy')]
  for r in record['rows']:
    assert r['us_in_order'] > 0 and r['us_concurrent'] > 0
    # Each process ran with the actor's flags and the scheduler asked for.
    assert r['xla_flags'] == {
        'in order': '--xla_cpu_multi_thread_eigen=false '
                    '--xla_cpu_enable_concurrency_optimized_scheduler=false',
        'concurrent': '--xla_cpu_multi_thread_eigen=false '
                      '--xla_cpu_enable_concurrency_optimized_scheduler=true'}
  assert '| ppo | `policy` | 2 |' in (tmp_path / 'policy_call.md').read_text()
