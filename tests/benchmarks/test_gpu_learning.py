"""benchmarks/gpu_learning.sh: rows side by side, each pinned to two cores,
stopped at a deadline. Runs here on the CPU (the script needs no GPU)."""

import json
import os
import subprocess
import sys

import pytest

# Each import binds its module as learning.<module>.
import benchmarks.learning.store  # noqa: F401
from benchmarks import learning

SCRIPT = os.path.join(learning.store.REPO, 'benchmarks', 'gpu_learning.sh')


def _run(tmp_path, deadline_s: int, *rows: str,
         members: int = 4) -> subprocess.CompletedProcess:
  env = dict(os.environ, RESULTS=str(tmp_path / 'rows'),
             DEADLINE_S=str(deadline_s), PYTHON=sys.executable,
             MEMBERS=str(members))
  return subprocess.run(['bash', SCRIPT, *rows], cwd=learning.store.REPO,
                        env=env, capture_output=True, text=True, timeout=900)


def test_a_row_past_the_deadline_is_never_started(tmp_path):
  done = _run(tmp_path, 0, 'Pendulum-v1:400:seeds-td3:0')
  assert done.returncode == 1, done.stderr
  assert 'slot' not in done.stdout  # no row was given a slot
  assert 'left out Pendulum-v1:400:seeds-td3:0' in done.stdout
  assert not (tmp_path / 'rows' / 'runs').exists()


@pytest.mark.slow
def test_a_task_with_colons_and_another_size_finds_its_result(tmp_path):
  """``gymnax:Acrobot-v1`` holds a colon: the row's last three fields are
  read from the right, and MEMBERS=16 looks where the benchmark writes a
  16-member run (``_pop16``); a row whose JSON exists counts as kept."""
  row = 'gymnax:Acrobot-v1:1048576:pbt-prior-ppo:3'
  path = learning.store.result_path(str(tmp_path / 'rows'), 'gymnax:Acrobot-v1',
                                    'pbt-prior-ppo', 3, 1_048_576, 16)
  assert '_pop16' in path
  os.makedirs(os.path.dirname(path))
  with open(path, 'w') as f:
    f.write('{}')
  done = _run(tmp_path, 0, row, members=16)
  assert done.returncode == 0, done.stdout + done.stderr
  assert f'kept {path}' in done.stdout
  # At the default size the same row's JSON would be elsewhere: left out.
  done = _run(tmp_path, 0, row)
  assert done.returncode == 1 and f'left out {row}' in done.stdout


@pytest.mark.slow
def test_rows_run_to_their_result_files(tmp_path):
  done = _run(tmp_path, 800, 'Pendulum-v1:400:seeds-td3:0',
              'Pendulum-v1:400:pbt-td3:1')
  assert done.returncode == 0, done.stderr
  for method, seed in (('seeds-td3', 0), ('pbt-td3', 1)):
    path = learning.store.result_path(str(tmp_path / 'rows'), 'Pendulum-v1',
                                      method, seed, 400)
    with open(path) as f:
      result = json.load(f)
    assert result['method'] == method and result['seed'] == seed
    assert result['budget']['env_steps'] == 400
    assert len(result['final_returns']) == 4  # the benchmark's default size
    assert f'kept {path}' in done.stdout
