"""HyperTrick's rule through its contract (``decide`` driven by
``fastpbrl.rules.testing.Harness``, no run): slots report at the end of
their own phases, evicted slots restart as new experiments, no experiment
starts that the budget cannot train, and the state (the report order's
generator included) checkpoints as a pytree."""

import copy
import dataclasses

import jax
import numpy as np
import pytest

from fastpbrl.config.errors import ConfigError
from fastpbrl.core.rng import pcg64_generator, pcg64_state
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.learner.population import PopulationLearner
from fastpbrl.rules import registry
from fastpbrl.rules.base import Observation, Population
from fastpbrl.rules.hypertrick import PRESETS, HyperTrick, HyperTrickRunConfig
from fastpbrl.rules.hypertrick import scheduler as ht
from fastpbrl.rules.testing import Harness
from fastpbrl.run.checkpoint import Checkpointer
from fastpbrl.run.resume import like
from tests.rules.conftest import tiny_td3

N = 2


def assert_same(a, b):
  """The same pytree structure and the same values, leaf by leaf (NaN
  where NaN: an empty entry)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(np.testing.assert_array_equal, a, b)


class Run(Harness):
  """A ``Harness`` over a HyperTrick rule of 2 tiny TD3 slots, whose calls
  end evaluations of given returns."""

  def __init__(self, config: HyperTrickRunConfig):
    rule = HyperTrick(config)
    agent = tiny_td3()
    rule.prepare(agent)
    hparams = rule.initial_hparams(jax.random.PRNGKey(0), agent, N)
    state = PopulationLearner(agent).init(jax.random.PRNGKey(1), hparams)
    rule_state, state = rule.init(
        jax.random.PRNGKey(2),
        Population(agent, state, hparams, jax.random.PRNGKey(3)))
    super().__init__(rule, rule_state, state=state, hparams=hparams)

  def episodes(self, returns) -> tuple:
    """Member ``m``'s evaluation returned ``returns[m]`` (None: no
    evaluation of ``m``), played under the newest weights."""
    v = self.policy_version
    return tuple(EpisodeRecord(m, float(r), 10, True, 0, v, v)
                 for m, r in enumerate(returns) if r is not None)

  def next_observation(self, steps: int, returns) -> Observation:
    """The observation after a call of ``steps`` update steps in which
    these evaluations ended (``episodes``)."""
    return self.observation(self.episodes(returns),
                            update_steps=self.update_steps + steps)

  def call(self, steps: int, returns):
    """One call of ``steps`` update steps (``next_observation``'s), its
    decision carried out; returns it."""
    return self.observe(self.episodes(returns),
                        update_steps=self.update_steps + steps)


def test_restarts_evicted_slots_as_new_experiments():
  # The evicted slot's replay must start empty with its own warm-up: the
  # decision asks for that (Decision.restart, which the loop hands to
  # Pipeline.restart_members, whose effect on the replay
  # tests/test_pipeline.py checks); its older episodes score nobody
  # (Decision.renewed); its phases count the slot's own update steps,
  # which stop while it warms up.
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=2, phase_env_steps=100,
      eval_every=50, eviction_rate=0.25)
  run = Run(config)
  restarted_total = 0
  for call in range(1, 40):
    # Member 0 always scores higher than member 1.
    hparams_before = jax.tree.map(np.asarray, run.hparams)
    decision = run.call(50, [100.0 - 50 * m + call for m in range(N)])
    if decision.restart is not None:
      members = np.flatnonzero(decision.restart)
      restarted_total += len(members)
      np.testing.assert_array_equal(run.restarts[-1], decision.restart)
      np.testing.assert_array_equal(decision.renewed, decision.restart)
      scheduler = run.rule_state.scheduler
      for m in members:  # its phase starts at its current update count
        assert run.rule_state.phase_start[m] == run.member_update_steps[m]
        assert scheduler.slot_phase[m] == 1
        # The new worker's hyperparameters are the slot's new ones: exact,
        # the same float32 values widened to float64.
        np.testing.assert_array_equal(
            scheduler.hparams[scheduler.slot_worker[m]],
            [float(np.asarray(v)[m]) for v in run.hparams])
      # One reset event per restarted slot, with its new hyperparameters.
      assert [(e['event'], e['member'], e['step']) for e in decision.events
              ] == [('reset', int(m), run.update_steps) for m in members]
      for m in np.flatnonzero(~decision.restart):  # the others keep theirs
        jax.tree.map(lambda a, b, m=m: np.testing.assert_array_equal(
            np.asarray(a)[m], b[m]), run.hparams, hparams_before)
    else:
      assert decision.events == () and decision.state is None
    if run.rule.finished(run.rule_state):
      break
  assert run.rule.finished(run.rule_state)
  assert restarted_total >= 1
  assert restarted_total == int(run.rule_state.scheduler.launched) - N
  assert run.rule.scalars(run.rule_state) == {'workers_launched': 6}


def test_starts_no_experiment_the_budget_cannot_train():
  # A slot restarted when the budget left holds less than its warm-up and
  # one phase would be evaluated untrained at the end: it keeps its worker
  # instead (the slot goes idle in the scheduler). With one phase, every
  # report completes a worker and asks for a new one.
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=1, phase_env_steps=100,
      eval_every=50, env_steps=1000, warmup_steps=100, eviction_rate=0.25)
  run = Run(config)

  def phase_ends(env_steps):
    run.env_steps = env_steps
    return run.call(100, [10.0 * m for m in range(N)])

  # 300 env steps left >= warm-up 100 + one phase of 100 update steps.
  decision = phase_ends(700)
  assert decision.restart.tolist() == [True, True]
  assert int(run.rule_state.scheduler.launched) == 4
  # 100 left: no new experiment; both slots keep their (completed) workers.
  decision = phase_ends(900)
  assert decision.restart is None and decision.events == ()
  assert int(run.rule_state.scheduler.launched) == 4
  assert run.rule_state.scheduler.slot_worker.tolist() == [-1, -1]
  # Not done (2 configurations never launched): the env-step budget ends it.
  assert not run.rule.finished(run.rule_state)


def test_metric_is_the_mean_of_the_phase_last_ten_returns():
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=2, phase_env_steps=100,
      eval_every=10, eviction_rate=0.25)
  run = Run(config)
  returns = [float(v) for v in range(12)]
  for value in returns[:-1]:  # 11 calls of 9 update steps: no phase ends
    assert run.call(9, [value, -value]).events == ()
  assert run.rule_state.returns_count.tolist() == [11, 11]
  run.call(1, [returns[-1], -returns[-1]])  # 100 steps: both report
  scheduler = run.rule_state.scheduler
  # The same float64 mean of the same ten values in the same order: exact.
  np.testing.assert_array_equal(ht.phase_metrics(scheduler, 1),
                                [-np.mean(returns[-10:]),
                                 np.mean(returns[-10:])])
  assert run.rule_state.returns_count.tolist() == [0, 0]
  assert run.rule_state.phase_start.tolist() == [100, 100]
  # A slot with no evaluation in its phase reports -inf, and a NaN return
  # (kept, not taken for an empty entry) makes the metric NaN: -inf too.
  run.call(99, [None, np.nan])
  run.call(1, [None, None])
  np.testing.assert_array_equal(ht.phase_metrics(run.rule_state.scheduler, 2),
                                [-np.inf, -np.inf])


def test_report_order_continues_one_numpy_stream():
  # The slots that finish a phase in one call report in the order of
  # np.random.default_rng(seed).permutation, one stream over the run:
  # the generator's state is part of the rule state.
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=2, phase_env_steps=100,
      eval_every=50, eviction_rate=0.25, seed=5)
  run = Run(config)
  reference = np.random.default_rng(5)
  for _ in range(3):
    run.call(100, [1.0, 2.0])
    reference.permutation([0, 1])
    assert (pcg64_generator(run.rule_state.rng).bit_generator.state
            == reference.bit_generator.state)


def test_generator_state_as_arrays_round_trips():
  rng = np.random.default_rng(11)
  rng.random(dtype=np.float32)  # leaves half a 64-bit draw buffered
  state = pcg64_state(rng)
  assert int(state.has_uint32) == 1
  again = pcg64_generator(state)
  assert again.bit_generator.state == rng.bit_generator.state
  np.testing.assert_array_equal(again.permutation(50), rng.permutation(50))
  np.testing.assert_array_equal(  # the buffered half is used the same way
      again.random(3, dtype=np.float32), rng.random(3, dtype=np.float32))


def test_decide_changes_neither_its_inputs_nor_the_rule():
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=2, phase_env_steps=100,
      eval_every=50, eviction_rate=0.25)
  run = Run(config)
  for call in range(3):  # a state with reports in it
    run.call(100, [1.0 + call, 2.0])
  observation = run.next_observation(100, [5.0, -5.0])
  attributes = dict(run.rule.__dict__)
  before = copy.deepcopy((run.rule.__dict__, run.rule_state, observation))
  first = run.rule.decide(run.rule_state, observation)
  second = run.rule.decide(run.rule_state, observation)
  assert first[1].restart is not None  # a decision that restarts a slot
  assert_same(first[0], second[0])
  assert first[1].events == second[1].events
  assert_same((first[1].hparams, first[1].restart),
              (second[1].hparams, second[1].restart))
  # The rule: the same attributes, each the same object, equal to its copy
  # (the compiled reset is compared by identity: a deep copy of a jitted
  # function is another object).
  assert run.rule.__dict__.keys() == before[0].keys()
  for name, value in run.rule.__dict__.items():
    assert value is attributes[name], name
    if name != 'reset_slots':
      assert value == before[0][name], name
  # Its inputs, leaf by leaf (the exact values: nothing is recomputed).
  assert_same(run.rule_state, before[1])
  assert_same(observation, before[2])


def test_state_round_trips_through_a_checkpoint(tmp_path):
  config = HyperTrickRunConfig(
      population_size=N, num_workers=6, num_phases=2, phase_env_steps=100,
      eval_every=50, eviction_rate=0.25)
  run = Run(config)
  for call in range(3):
    run.call(100, [1.0 + call, 2.0])
  run.call(50, [3.0, 4.0])  # returns of an unfinished phase
  assert int(run.rule_state.scheduler.launched) > N  # a restart happened
  checkpointer = Checkpointer(str(tmp_path))
  try:
    checkpointer.save(1, run.state, {'hparams': run.hparams,
                                     'rule': run.rule_state}, {})
    template = Run(config)
    _, extra, _ = checkpointer.restore(
        template.state, {'hparams': template.hparams,
                         'rule': template.rule_state})
  finally:
    checkpointer.close()
  restored = run.rule.resumed(like(template.rule_state, extra['rule']))
  leaves, treedef = jax.tree.flatten(run.rule_state)
  got_leaves, got_treedef = jax.tree.flatten(restored)
  assert got_treedef == treedef
  for got, want in zip(got_leaves, leaves):
    assert type(got) is type(want) and got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)  # stored exactly
  # And the restored state decides as the original does.
  observation = run.next_observation(100, [5.0, -5.0])
  want = run.rule.decide(run.rule_state, observation)
  got = run.rule.decide(restored, observation)
  assert_same(got[0], want[0])
  assert got[1].events == want[1].events


def test_summary_names_the_best_configuration():
  config = HyperTrickRunConfig(
      population_size=N, num_workers=2, num_phases=1, phase_env_steps=100,
      eval_every=50, eviction_rate=0.25)
  run = Run(config)
  assert run.rule.summary(run.rule_state, '') == (
      'HyperTrick: no configuration finished a phase')
  run.call(100, [1.0, 2.0])
  assert run.rule.finished(run.rule_state)
  row = {k: float(np.asarray(v)[1]) for k, v in run.hparams._asdict().items()}
  assert run.rule.summary(run.rule_state, '') == (
      'HyperTrick: 2 configurations launched; eviction rate per phase [] '
      '(target 0.25); best: configuration 1, mean evaluation return 2.0 at '
      f'the end of phase 1, hyperparameters {row}')


def test_registered_with_the_command_presets():
  assert registry.get('hypertrick') is HyperTrick
  assert list(HyperTrick.presets) == ['small', 'paper'] and (
      HyperTrick.presets is PRESETS)
  assert HyperTrick.multi_process


@pytest.mark.parametrize('overrides, message', [
    (dict(phase_env_steps=0), '--phase-env-steps must be >= 1'),
    (dict(eval_every=5000),
     '--eval-every 5000 is longer than one --phase-env-steps span'),
    (dict(init_hparams='near-defaults'),
     "--init-hparams must be prior or defaults, got 'near-defaults'"),
    (dict(eviction_rate=0.6), '--eviction-rate must be in'),
    (dict(num_phases=0), '--num-phases must be >= 1'),
])
def test_config_errors_name_the_flag(overrides, message):
  config = dataclasses.replace(HyperTrickRunConfig(), **overrides)
  with pytest.raises(ConfigError, match=message):
    HyperTrick(config)
