"""``fastpbrl.rules.testing.Harness`` carries out a decision exactly as the
loop's ``apply`` does: same state, hyperparameters, versions, and the
copies and restarts the loop asks of the data path."""

import json

import numpy as np

from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.devices.distributed import Processes
from fastpbrl.rules.base import Decision, Rule, RuleOutputs
from fastpbrl.rules.pbt.rule import PBT
from fastpbrl.rules.testing import Harness
from fastpbrl.run import loop as loop_lib
from fastpbrl.run.callbacks import Loop
from fastpbrl.trained.run_data import load_run

N = 3


class Learner:
  def reinit_members(self, key, state, hparams, members):
    return np.where(members, 100.0 + key + hparams, state)


class Data:
  """Version 6 written, 7 once the publisher thread is waited for."""

  policy_version = 6

  def __init__(self):
    self.copies, self.restarts = [], []

  def wait_published(self, timeout=None):
    self.policy_version = 7
    return True

  def copy_member_data(self, members, sources):
    self.copies.append((list(members), list(sources)))

  def restart_members(self, members):
    self.restarts.append(list(members))


def test_harness_carries_out_a_decision_as_the_loop_does(tmp_path):
  rule = Rule(RunConfig(population_size=N))
  state, hparams = np.zeros(N), np.arange(N, dtype=float)
  decision = Decision(
      state=np.array([1.0, 2.0, 3.0]), hparams=np.array([5.0, 6.0, 7.0]),
      reinit=(np.array([False, True, False]), 0.5),
      copy_data=(np.array([2]), np.array([0])),
      restart=np.array([False, True, False]),
      renewed=np.array([False, True, True]),
      mark=np.array([True, False, False]),
      events=({'event': 'x', 'step': 1, 'env_steps': 2},))
  parts = loop_lib.Parts(loop_lib.RuleRun(rule, None, N, str(tmp_path)),
                         Learner(), Data(), Processes(None, N), None, None,
                         None, None, None)
  loop = Loop(config=rule.config, run_dir=str(tmp_path), agent=None,
              learner=None, state=state, hparams=hparams,
              member_update_steps=np.zeros(N, np.int64), episodes=[])
  loop_lib.apply(parts, loop, decision)

  harness = Harness(rule, None, state=state, hparams=hparams,
                    learner=Learner(), policy_version=7)
  harness.apply(decision)
  np.testing.assert_array_equal(harness.state, loop.state)
  np.testing.assert_array_equal(harness.hparams, loop.hparams)
  np.testing.assert_array_equal(harness.first_version,
                                parts.rule_run.first_version)
  np.testing.assert_array_equal(harness.marked_at, parts.rule_run.marked_at)
  assert [(m.tolist(), s.tolist()) for m, s in harness.copies
          ] == parts.data.copies
  assert [np.flatnonzero(r).tolist() for r in harness.restarts
          ] == parts.data.restarts
  assert harness.events == parts.rule_run.take_events()


def test_harness_leaves_out_episodes_of_replaced_weights():
  rule = Rule(RunConfig(population_size=N))
  harness = Harness(rule, None, state=np.zeros(N), hparams=np.zeros(N))
  harness.apply(Decision(renewed=np.array([False, True, False])))
  episodes = [EpisodeRecord(1, -1.0, 10, True, 10, 1, start_policy_version=1),
              EpisodeRecord(1, -1.0, 10, True, 10, 2, start_policy_version=2),
              EpisodeRecord(0, -1.0, 10, True, 10, 1, start_policy_version=1)]
  observation = harness.observation(episodes, update_steps=10)
  assert [(e.member, e.start_policy_version)
          for e in observation.episodes] == [(1, 2), (0, 1)]
  assert observation.member_update_steps.tolist() == [10] * N


def test_outputs_declare_the_log_files():
  assert Rule.outputs() == RuleOutputs()
  assert PBT.outputs().files == PBT.log_files == ('lineage.jsonl',)
  assert set(PBT.outputs().tables) == {'lineage'}


def test_a_rule_without_outputs_loads_empty_tables(tmp_path):
  with open(tmp_path / 'config.json', 'w') as f:
    json.dump({'rule': 'seeds', 'population_size': 2}, f)
  (tmp_path / 'lineage.jsonl').write_text(  # not the rule's: not read
      '{"event": "init", "step": 0, "member": 0, "hparams": {}}\n')
  run = load_run(tmp_path)
  assert run.tables == {} and run.lineage.empty and run.lineage_events == []
  assert run.outputs == RuleOutputs()
