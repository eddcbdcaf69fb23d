"""The actor-throughput benchmark's split of a step into its parts."""

from unittest import mock

import mujoco
import pytest

from benchmarks import actor_throughput
from benchmarks.pages import step_split_table
from fastpbrl.actors import actor as actor_module
from fastpbrl.actors.actor import make_policy_fns


def row(physics_us):
  return {'env': 'E', 'members': 8, 'serial_per_cpu_s': 8_000.0,
          'vectorized_per_cpu_s': 10_000.0, 'physics_us': physics_us,
          'policy_us': 100.0}


def test_step_split_is_the_rates_per_step_of_all_members():
  # 8 members at 8,000 steps per CPU-second: 1,000 µs per step of all 8;
  # at 10,000: 800 µs.
  split = actor_throughput.step_split(row(400.0))
  assert split == pytest.approx({
      'serial_us': 1_000.0, 'vectorized_us': 800.0,
      'rest_serial_us': 500.0, 'rest_vectorized_us': 300.0, 'bound': 2.0})
  # An env without MuJoCo physics: only the policy is shared.
  assert actor_throughput.step_split(row(None))['bound'] == pytest.approx(10.0)


def test_the_table_shows_rows_that_timed_their_parts():
  timed = {**row(400.0), **actor_throughput.step_split(row(400.0))}
  table = step_split_table({'rows': [timed, row(400.0)]})
  assert table.count('| E | 8 |') == 1
  assert '| 1,000 | 800 | 400 (40%) | 100 (10%) | 500 | 300 | 2.00x |' in table
  assert step_split_table({'rows': [row(400.0)]}) == ''


def test_the_parts_are_timed_on_the_envs_they_apply_to():
  assert actor_throughput.physics_us('Pendulum-v1', 2, 0.01, 0) is None
  assert actor_throughput.physics_us('HalfCheetah-v5', 2, 0.01, 0) > 0
  assert actor_throughput.policy_us((8,), 'Pendulum-v1', 2, 0.01, 0) > 0


def test_the_rest_beyond_the_actors_own_work_is_the_extra_in_turn():
  timed = {**row(400.0), 'bookkeeping_us': 120.0}
  split = actor_throughput.step_split(timed)
  # 800 µs vectorized - 500 shared = 300 of rest, 120 of it own work.
  assert split['extra_in_turn_us'] == pytest.approx(180.0)
  table = step_split_table({'rows': [{**timed, **split}]})
  assert '| 500 | 300 | 120 | 180 | 2.00x |' in table
  assert 'own work alone' in table


def test_the_actors_own_work_runs_without_physics_or_policy():
  policy_calls = []

  def counting_policy_fns(agent, prng_impl, **kwargs):
    explore, with_eval = make_policy_fns(agent, prng_impl, **kwargs)
    return (lambda *a: policy_calls.append(1) or explore(*a)), with_eval

  with mock.patch.object(mujoco, 'mj_step',
                         side_effect=mujoco.mj_step) as mj_step, \
      mock.patch.object(actor_module, 'make_policy_fns', counting_policy_fns):
    own = actor_throughput.bookkeeping_us((8,), 'HalfCheetah-v5', 2, 0.01, 0)
  assert own > 0
  # The actor stepped (its loop ran) without MuJoCo's step or its policy.
  assert mj_step.call_count == 0 and policy_calls == []
  # The probe's stand-in is gone afterwards: the real physics is back.
  assert actor_throughput.vector_envs.mujoco is mujoco
