"""Shared-memory helpers: the sweep of segments left by dead runs."""

import os
import subprocess
import sys

from fastpbrl.actors import shm


def dead_pid() -> int:
  """The pid of a process that has exited (and been reaped)."""
  proc = subprocess.Popen([sys.executable, '-c', 'pass'])
  proc.wait()
  return proc.pid


def test_sweep_removes_only_segments_of_dead_processes(tmp_path):
  dead = dead_pid()
  live_other = subprocess.Popen([sys.executable, '-c',
                                 'import time; time.sleep(600)'])
  try:
    names = {
        'dead': f'fpbrl_{dead}_params_0a1b2c3d',
        'dead_channel': f'fpbrl_{dead}_chan_ffffffff',
        'ours': f'fpbrl_{os.getpid()}_params_00000000',
        'live': f'fpbrl_{live_other.pid}_chan_12345678',
        'not_fastpbrl': f'psm_{dead}',
        'unparsable': 'fpbrl_x_params_1',
    }
    for name in names.values():
      (tmp_path / name).write_bytes(b'\0' * 64)
    removed = shm.sweep_stale_segments(str(tmp_path))
    assert sorted(removed) == sorted([names['dead'], names['dead_channel']])
    left = set(os.listdir(tmp_path))
    assert left == {names[k] for k in ('ours', 'live', 'not_fastpbrl',
                                       'unparsable')}
  finally:
    live_other.kill()
    live_other.wait()


def test_sweep_of_a_missing_directory_is_a_no_op(tmp_path):
  assert shm.sweep_stale_segments(str(tmp_path / 'absent')) == []
