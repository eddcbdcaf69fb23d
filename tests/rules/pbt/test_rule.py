"""PBT's rule through its contract (``decide`` on hand-built observations,
no run): a member is ready only once an evaluation of the policy it trained
since its last decision has come in, however fast its update steps pass;
the whole population decides at once; the state checkpoints as a pytree."""

import copy
import dataclasses

import jax
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.config.errors import ConfigError
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.rules import pbt as pbt_lib
from fastpbrl.rules.base import Observation
from fastpbrl.rules.pbt import pb2
from fastpbrl.rules.pbt.rule import (LINEAGE, PRESETS, PBT, PBTRunConfig,
                                     fitness_of, record)
from fastpbrl.rules.testing import Harness
from fastpbrl.run import resume
from fastpbrl.run.build import initial_population, make_agent, make_env_spec
from fastpbrl.run.checkpoint import Checkpointer
from fastpbrl.run.resume import like

N = 4


class Run:
  """A rule driven by ``fastpbrl.rules.testing.Harness``: the state,
  hparams and policy versions as the loop keeps them."""

  def __init__(self, **overrides):
    config = PBTRunConfig(env='Pendulum-v1', population_size=N,
                          hidden_sizes=(8, 8), batch_size=4, steps_per_call=10,
                          env_steps=10_000, warmup_steps=100, ready_after=20,
                          eval_every=20, fraction=0.25, **overrides)
    self.rule = PBT(config)
    self.agent = make_agent(config, make_env_spec(config.env))
    self.rule.prepare(self.agent)
    learner = self.rule.make_learner(self.agent, 1)
    state, hparams, rule_state = initial_population(
        config, self.rule, self.agent, learner)
    self.harness = Harness(self.rule, rule_state, state=state,
                           hparams=hparams, learner=learner)

  def __getattr__(self, name):  # rule_state, state, hparams, events, ...
    return getattr(self.__dict__['harness'], name)

  def __setattr__(self, name, value):
    if name in ('rule', 'agent', 'harness'):
      object.__setattr__(self, name, value)
    else:
      setattr(self.harness, name, value)

  @property
  def version(self):
    return self.harness.policy_version

  def call(self, update_steps, evaluations=(), started_under=None):
    """One learner call: ``evaluations`` are (member, return) pairs of
    evaluations that started under ``started_under`` (default: the version
    now acted with)."""
    version = self.version if started_under is None else started_under
    episodes = tuple(
        EpisodeRecord(m, float(r), 200, True, 100, version,
                      start_policy_version=version)
        for m, r in evaluations)
    return self.harness.observe(
        episodes, update_steps=self.harness.update_steps + update_steps,
        env_steps=100, calls=0)

  def diverge(self, diverged):
    """The loop's call of ``replace_diverged`` for ``diverged`` members."""
    return self.harness.replace_diverged(diverged, env_steps=100, calls=0)


def test_no_exploit_on_evaluations_of_untrained_policies():
  run = Run()
  # Right after the warm-up the limiter grants its burst: one call holds
  # far more than --ready-after update steps, and the only evaluations are
  # the warm-up's, of the initial policies (version 1).
  first = run.call(200, [(0, -900.0), (1, -100.0), (2, -900.0), (3, -900.0)],
                   started_under=1)
  assert first.renewed.all() and first.mark.all()  # they score nobody
  assert int(run.rule_state.exploits) == 0
  assert not run.rule_state.evaluated.any()
  assert np.isnan(run.rule_state.history).all()
  # Still no evaluation of a trained policy: no decision, however many steps.
  run.call(200)
  assert int(run.rule_state.exploits) == 0
  # Evaluations of trained policies come in: now PBT decides.
  run.call(10, [(0, -900.0), (1, -100.0), (2, -500.0), (3, -400.0)])
  assert int(run.rule_state.exploits) == 1  # the bottom 25%, 0, copies 1
  assert not run.rule_state.evaluated.any()
  # The next decision waits for evaluations that start after this one.
  run.call(50, [(m, -100.0) for m in range(N)], started_under=run.version - 1)
  assert int(run.rule_state.exploits) == 1


def test_the_whole_population_decides_at_once():
  run = Run()
  run.call(200)  # the first call: warm-up evaluations score nobody
  # Members 0 and 1 are evaluated first; member 0 is the worst so far, but
  # nobody decides before every member has an evaluation.
  run.call(30, [(0, -900.0), (1, -100.0)])
  assert int(run.rule_state.exploits) == 0
  assert run.rule_state.evaluated[:2].all()
  run.call(10, [(2, -50.0)])
  assert int(run.rule_state.exploits) == 0 and run.events == []
  # Member 3 comes in last and is the worst: the one decision replaces it
  # (the bottom 25% of four) by the best, member 2, which it inherits the
  # fitness history of.
  decision = run.call(10, [(3, -1000.0)])
  assert int(run.rule_state.exploits) == 1
  assert [(e['member'], e['parent']) for e in run.events] == [(3, 2)]
  assert decision.renewed.tolist() == [False, False, False, True]
  assert decision.mark.all() and not run.rule_state.evaluated.any()
  assert [e[1]['event'] for e in decision.logs] == ['exploit']
  np.testing.assert_array_equal(run.rule_state.history[3],
                                run.rule_state.history[2])  # copied values


def test_ttest_copies_only_where_the_returns_differ_significantly():
  # Returns within noise of each other (means -180 to -195, spread ~90;
  # Welch's p > 0.9 for every pair): nobody copies, where a tournament
  # would surely replace member 0, whose mean is below every other one.
  overlapping = {0: [-100, -300, -210, -170], 1: [-120, -280, -210, -160],
                 2: [-110, -290, -190, -170], 3: [-100, -300, -200, -150]}
  run = Run(exploit='ttest')
  run.call(200)  # the first call: warm-up evaluations score nobody
  run.call(30, [(m, r) for m in range(N) for r in overlapping[m]])
  assert int(run.rule_state.decisions) == 1
  assert int(run.rule_state.exploits) == 0
  # Member 3 far below the others (p < 0.001 against each): whichever
  # it draws, it copies; whichever they draw, they keep their own.
  run = Run(exploit='ttest')
  run.call(200)
  run.call(30, [(m, r) for m in range(N)
                for r in {**overlapping, 3: [-900, -905, -895, -910]}[m]])
  assert int(run.rule_state.exploits) == 1
  assert [e['member'] for e in run.events] == [3]
  assert run.events[0]['parent'] in (0, 1, 2)


def test_lineage_starts_once_per_run_not_per_resume():
  run = Run()
  first = run.call(10)
  assert [e['event'] for _, e in first.logs] == ['init'] * N
  assert [e['member'] for _, e in first.logs] == list(range(N))
  # A resume: versions restart, the first call marks again, but the
  # lineage already holds the init events.
  run.rule_state = run.rule.resumed(run.rule_state)
  again = run.call(10)
  assert again.mark.all() and again.logs == ()


def test_fitness_is_the_mean_of_the_last_window_values_oldest_first():
  history = np.full((2, 3), np.nan)
  for value in (1.0, 2.0, 3.0, 4.0):
    history = record(history, 0, value)
  assert history[0].tolist() == [2.0, 3.0, 4.0]  # the oldest dropped
  fitness = fitness_of(history)
  # The same float32 mean a list of [2, 3, 4] gives: exact.
  assert fitness[0] == np.float32(np.mean([2.0, 3.0, 4.0]))
  assert np.isnan(fitness[1])  # never evaluated


def test_decide_changes_neither_its_inputs_nor_the_rule():
  run = Run()
  run.call(200)
  run.call(30, [(m, -100.0 * (m + 1)) for m in range(N)])
  attributes = dict(run.rule.__dict__)
  before = copy.deepcopy(run.rule_state)
  settings = copy.deepcopy(run.rule.config)
  observation = Observation(
      calls=3, update_steps=run.update_steps + 30,
      member_update_steps=np.full(N, run.update_steps + 30), env_steps=100,
      episodes=tuple(EpisodeRecord(m, -1.0, 200, True, 100, run.version,
                                   start_policy_version=run.version)
                     for m in range(N)),
      marked_at=run.marked_at.copy(), state=run.state, hparams=run.hparams)
  kept = copy.deepcopy((observation.episodes, observation.marked_at))
  first = run.rule.decide(run.rule_state, observation)
  second = run.rule.decide(run.rule_state, observation)
  same = lambda a, b: np.array_equal(a, b, equal_nan=True)  # noqa: E731
  assert jax.tree.all(jax.tree.map(same, first[0], second[0]))
  assert [e for e in first[1].events] == [e for e in second[1].events]
  assert run.rule.config == settings
  assert run.rule.__dict__.keys() == attributes.keys()
  assert all(run.rule.__dict__[k] is v for k, v in attributes.items())
  assert jax.tree.all(jax.tree.map(same, run.rule_state, before))
  assert (observation.episodes, observation.marked_at.tolist()) == (
      kept[0], kept[1].tolist())


def round_trip(run, template, tmp_path):
  """``run``'s rule state saved in a checkpoint and restored into
  ``template``'s."""
  checkpointer = Checkpointer(str(tmp_path))
  try:
    checkpointer.save(1, run.state, {'hparams': run.hparams,
                                     'rule': run.rule_state}, {})
    _, extra, _ = checkpointer.restore(
        template.state, {'hparams': template.hparams,
                         'rule': template.rule_state})
  finally:
    checkpointer.close()
  return like(template.rule_state, extra['rule'])


def test_state_round_trips_through_a_checkpoint(tmp_path):
  run = Run()
  run.call(200)
  run.call(30, [(m, -100.0 * (m + 1)) for m in range(N)])
  assert int(run.rule_state.exploits) == 1
  restored = round_trip(run, Run(), tmp_path)
  assert type(restored) is type(run.rule_state)
  for name, value in run.rule_state._asdict().items():
    got = getattr(restored, name)
    assert type(got) is type(value), name
    np.testing.assert_array_equal(got, value, err_msg=name)  # stored exactly


def test_explore_resamples_where_the_population_started():
  run = Run()
  near = ss.near(run.rule.space, run.agent.default_hparams())
  assert run.rule.exploit.resample_space == near
  prior = PBT(dataclasses.replace(run.rule.config, init_hparams='prior'))
  prior.prepare(run.agent)
  assert prior.exploit.resample_space is None  # the whole search space


def test_explore_resample_redraws_every_field_and_the_paper_preset_uses_it():
  """``--explore resample`` (the 2022 paper's explore) is perturb's
  resampling taken for every field: a replaced member's values are fresh
  draws from the prior, not its parent's times 0.8 or 1.2."""
  config = PBTRunConfig(explore='resample', init_hparams='prior')
  rule = PBT(config)
  assert rule.pbt_config.resample_probability == 1.0
  assert PBT(PBTRunConfig()).pbt_config.resample_probability == 0.25
  paper = PRESETS['paper']
  assert (paper.explore, paper.init_hparams) == ('resample', 'prior')
  space = rule.space
  n = 200
  hparams = ss.sample(jax.random.PRNGKey(0), space,
                      td3.default_hparams(), n)
  out = ss.perturb(jax.random.PRNGKey(1), space, hparams,
                   resample_probability=rule.pbt_config.resample_probability)
  for name in ('policy_lr', 'critic_lr', 'exploration_noise'):
    x, y = np.asarray(getattr(hparams, name)), np.asarray(getattr(out, name))
    near = np.isclose(y, x * 0.8, rtol=1e-5) | np.isclose(y, x * 1.2,
                                                          rtol=1e-5)
    assert not near.any(), name  # continuous draws: equality has measure 0
  assert np.all(np.asarray(ss.within_bounds(space, out)))
  # Draws of the whole prior: log10 of a LogUniform(3e-5, 3e-3) learning
  # rate is uniform on [-4.52, -2.52]; its mean over 200 draws is within
  # 0.2 of -3.52 (sd 0.58 / sqrt(200) = 0.04, so 0.2 is 5 sd).
  assert abs(np.mean(np.log10(np.asarray(out.policy_lr))) + 3.52) < 0.2


def pb2_run():
  """A PB2 run through two decisions: member m's evaluations return
  -100 (m + 1) at the first, and gain 10 (m + 1) by the second."""
  run = Run(explore='pb2')
  run.call(200)
  run.call(30, [(m, -100.0 * (m + 1)) for m in range(N)])
  first = np.asarray(run.rule_state.pb2_rows)
  hparams = jax.device_get(run.hparams)
  run.call(30, [(m, -100.0 * (m + 1) + 10.0 * (m + 1)) for m in range(N)])
  return run, first, hparams


def test_pb2_learns_from_each_interval_and_chooses_within_the_bounds():
  run, first, before = pb2_run()
  # The first decision knows no member's fitness at an interval's start.
  assert np.isnan(first).all()
  t, start_got, x, change = pb2.data(np.asarray(run.rule_state.pb2_rows))
  # The second: one row per member, its interval (decision 1), the fitness
  # it started from (a replaced member's, its parent's), its gain in
  # fitness (the mean of its two evaluations rose by half the new one's
  # gain, as the window averages them) and its hyperparameters then.
  fitness_1 = np.array([-100.0 * (m + 1) for m in range(N)])
  parent = {e['member']: e['parent'] for e in run.events[:1]}
  start = np.array([fitness_1[parent.get(m, m)] for m in range(N)])
  mean_2 = np.array([np.mean([fitness_1[parent.get(m, m)],
                              -100.0 * (m + 1) + 10.0 * (m + 1)])
                     for m in range(N)])
  np.testing.assert_array_equal(t, np.ones(N))
  np.testing.assert_allclose(start_got, start, rtol=1e-6)
  np.testing.assert_allclose(change, mean_2 - start, rtol=1e-6)
  fields = pb2.continuous_fields(run.rule.space)
  np.testing.assert_allclose(
      x, pb2.encode(run.rule.space, {f: np.asarray(getattr(before, f))
                                     for f in fields}), rtol=1e-6)
  # The replaced members' new values: not their parent's times 0.8 or 1.2
  # (perturb) and within the search space.
  assert int(run.rule_state.exploits) == 2
  assert np.all(np.asarray(ss.within_bounds(run.rule.space, run.hparams)))
  second = run.events[-1]
  for name in fields:
    old = second['old_hparams'][name]
    new = second['new_hparams'][name]
    assert not np.isclose(new, old * 0.8) and not np.isclose(new, old * 1.2)
  assert int(run.rule_state.decisions) == 2


def test_pb2_chooses_at_the_parents_context_beside_the_kept_members(
    monkeypatch):
  calls = []
  explore = pb2.explore

  def recording(space, rows, t_next, starts, seed, running=None):
    calls.append((np.asarray(starts), running))
    return explore(space, rows, t_next, starts, seed, running)

  monkeypatch.setattr(pb2, 'explore', recording)
  run, _, _ = pb2_run()
  fitness_1 = np.array([-100.0 * (m + 1) for m in range(N)])
  first, second = run.events[0], run.events[-1]
  parent = {first['member']: first['parent']}
  fitness_2 = np.array([np.mean([fitness_1[parent.get(m, m)],
                                 -100.0 * (m + 1) + 10.0 * (m + 1)])
                        for m in range(N)])
  assert len(calls) == 2
  # Each member's context: the fitness its last interval started from (a
  # copy's, its parent's then), or before it has one, its fitness now.
  start_2 = np.array([fitness_1[parent.get(m, m)] for m in range(N)])
  assert not np.allclose(start_2, fitness_2)
  for (starts, running), context, event in ((calls[0], fitness_1, first),
                                            (calls[1], start_2, second)):
    # The copy takes its parent's weights, so it is chosen at its parent's
    # context; the members kept are pending at theirs, with their values.
    np.testing.assert_allclose(starts, [context[event['parent']]], rtol=1e-6)
    kept = [m for m in range(N) if m != event['member']]
    np.testing.assert_allclose(running.start, context[kept], rtol=1e-6)
    assert running.x.shape == (N - 1, len(pb2.continuous_fields(
        run.rule.space)))


def test_pb2_is_a_function_of_the_seed_and_its_state_is_checkpointed(
    tmp_path):
  a, _, _ = pb2_run()
  b, _, _ = pb2_run()
  for name in a.hparams._fields:
    np.testing.assert_array_equal(getattr(a.hparams, name),
                                  getattr(b.hparams, name), name)
  restored = round_trip(a, Run(explore='pb2'), tmp_path)
  np.testing.assert_array_equal(restored.pb2_rows, a.rule_state.pb2_rows)
  np.testing.assert_array_equal(restored.last_fitness,
                                a.rule_state.last_fitness)


def test_pb2_leaves_out_an_interval_cut_by_a_diverged_replacement():
  """A member replaced for divergence between two decisions trained its
  interval with two sets of weights: its change is not PB2 data."""
  run, _, _ = pb2_run()
  before = np.asarray(run.rule_state.last_fitness).copy()
  diverged = np.zeros(N, bool)
  diverged[0] = True
  run.diverge(diverged)
  after = np.asarray(run.rule_state.last_fitness)
  assert np.isnan(after[0])
  np.testing.assert_array_equal(after[1:], before[1:])
  # Evaluations started once the replacement's weights went out.
  run.call(30, [(m, -50.0 * (m + 1)) for m in range(N)],
           started_under=run.version + 1)
  data = pb2.data(np.asarray(run.rule_state.pb2_rows))
  third = data.t == 2.0  # the rows of the interval the replacement cut
  assert third.sum() == N - 1


def test_when_every_member_diverged_the_lineage_restarts():
  """Re-initialised weights descend from no member: the lineage says so
  with a reset event per member, so its lines of weights start again."""
  run = Run()
  first = run.call(200)  # the first call writes the init events
  run.call(30, [(m, -100.0 * (m + 1)) for m in range(N)])  # a copy
  logs = [e for _, e in first.logs] + [e for e in run.events]
  assert len(set(pbt_lib.founders(logs).values())) < N
  decision = run.diverge(np.ones(N, bool))
  assert decision.reinit is not None and decision.renewed.all()
  resets = [e for name, e in decision.logs if name == LINEAGE]
  assert [(e['event'], e['member']) for e in resets] == [
      ('reset', m) for m in range(N)]
  assert pbt_lib.founders(logs + resets) == {
      m: (m, run.update_steps) for m in range(N)}


def test_a_checkpoint_of_an_earlier_state_layout_is_refused(tmp_path):
  """A checkpoint written before PB2's rows held the starting fitness
  (no state version in its meta) is refused with a message, before its
  arrays meet the new template's shapes."""
  run = Run(explore='pb2')
  run.call(200)
  checkpointer = Checkpointer(str(tmp_path))
  try:
    checkpointer.save(1, run.state, {'hparams': run.hparams,
                                     'rule': run.rule_state},
                      {'rule_format': resume.RULE_FORMAT})
    config = PBTRunConfig(explore='pb2', resume=str(tmp_path))
    with pytest.raises(ConfigError, match='earlier fastpbrl, whose pbt rule'):
      resume.restore(checkpointer, config, run.rule, None, None, None, None)
  finally:
    checkpointer.close()


def test_pb2_needs_a_continuous_field():
  only_categorical = ss.SearchSpace({'batch_size': ss.Categorical((64, 128))})
  with pytest.raises(ConfigError, match='--explore pb2'):
    PBT(PBTRunConfig(explore='pb2'), space=only_categorical)
  # Over several processes it runs (tests/test_distributed.py runs it).
  rule = PBT(PBTRunConfig(explore='pb2'))
  assert rule.multi_process_problem(rule.config, 'over 2 processes') is None


def test_copy_replay_and_shared_replay_are_refused_together():
  with pytest.raises(ConfigError, match='^--copy-replay copies a member\'s '
                                        'own replay, and with --shared-replay'):
    PBT(PBTRunConfig(copy_replay=True, shared_replay=True))


def test_copy_replay_over_processes_needs_a_jax_env():
  """A JAX env's rings are global arrays, copied across processes inside
  the partitioned program (tests/test_distributed.py); a gymnasium env's
  replay stays in its process, so the flag is refused there, by name."""
  gym_env = PBT(PBTRunConfig(env='Pendulum-v1', copy_replay=True))
  problem = gym_env.multi_process_problem(gym_env.config, 'over 2 processes')
  assert problem.startswith('--copy-replay is not supported over 2 '
                            'processes for a gymnasium env')
  jax_env = PBT(PBTRunConfig(env='gymnax:Pendulum-v1', copy_replay=True))
  assert jax_env.multi_process_problem(jax_env.config,
                                       'over 2 processes') is None
