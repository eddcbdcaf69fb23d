"""DvD's rule through its contract (``decide`` driven by
``fastpbrl.rules.testing.Harness``, no run): the lambda bandit's rounds
and rewards, the lambda schedule and its lambda-0 baseline, the logged
diversity figure, and the state, which checkpoints as a pytree and refuses
a resume with other bandit settings."""

import copy
import dataclasses

import jax
import numpy as np
import pytest

from fastpbrl.agents import td3
from fastpbrl.config.errors import ConfigError
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.devices import distributed
from fastpbrl.rules.base import Observation
from fastpbrl.rules.dvd.rule import DvD, DvDRunConfig
from fastpbrl.rules.testing import Harness
from fastpbrl.run import resume
from fastpbrl.run.build import initial_population, make_agent, make_env_spec
from fastpbrl.run.checkpoint import Checkpointer
from tests.test_datapath import probe_states_of_dvd


@dataclasses.dataclass(frozen=True)
class ProbeData:
  """``Observation.data`` of these tests: the old algorithm's states."""

  def evaluate(self, *args):
    raise AssertionError('DvD evaluates no policy')

  def random_states(self, num_states, seed):
    return probe_states_of_dvd('Pendulum-v1', num_states, seed)
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 3


def _config(**overrides) -> DvDRunConfig:
  base = dict(env='Pendulum-v1', population_size=N, hidden_sizes=(8, 8),
              batch_size=4, steps_per_call=10, eval_every=20,
              bandit_every=20, bandit_lookback=2, diversity_states=16)
  return DvDRunConfig(**{**base, **overrides})


class Run(Harness):
  """A ``Harness`` over a DvD rule (``ProbeData`` answering its queries)
  whose calls are 10 update steps each and end evaluations of given
  returns."""

  def __init__(self, config: DvDRunConfig):
    rule = DvD(config)
    self.agent = make_agent(config, make_env_spec(config.env))
    rule.prepare(self.agent)
    learner = rule.make_learner(self.agent, 1)
    state, hparams, rule_state = initial_population(config, rule, self.agent,
                                                    learner)
    super().__init__(rule, rule_state, state=state, hparams=hparams,
                     learner=learner, data=ProbeData())

  def next_counters(self) -> dict:
    """The next call's counters: 10 update steps a call, 100 env steps
    more than update steps."""
    steps = 10 * (self.calls + 1)
    return dict(update_steps=steps, env_steps=steps + 100)

  def next_observation(self, episodes=()) -> Observation:
    """The next call's observation, with these finished episodes."""
    return self.observation(episodes, **self.next_counters())

  def call(self, eval_returns=()):
    """One learner call in which evaluations of these returns ended, the
    ``k``-th by member ``k % N``."""
    return self.call_members({}, eval_returns)

  def call_members(self, returns_by_member: dict, eval_returns=()):
    """One learner call in which these members' evaluations ended."""
    pairs = [(i % N, r) for i, r in enumerate(eval_returns)] + [
        (m, r) for m, rs in returns_by_member.items() for r in rs]
    episodes = [EpisodeRecord(m, float(r), 200, True, 0, 0)
                for m, r in pairs]
    return self.observe(episodes, **self.next_counters())

  @property
  def lam(self) -> np.ndarray:
    return np.asarray(self.hparams.diversity_weight)

  @property
  def arm(self) -> int:
    return int(self.rule_state.arm)

  @property
  def history(self) -> list:
    return self.rule.bandit.history(self.rule_state.bandit)


def test_bandit_rounds_reward_improvement_over_recent_rounds():
  run = Run(_config(bandit_score='best', bandit_reward='improvement'))
  # The first round's lambda is the bandit's first choice (--seed's
  # generator), in the initial hyperparameters already.
  np.testing.assert_array_equal(run.lam, run.rule_state.lam)
  assert float(run.rule_state.lam) == run.rule.config.lambda_arms[run.arm]
  # Round = 2 calls; its return = best evaluation in it. Rounds: 10, 12, 11,
  # 15 -> rewards: none (first round), 1 (12 > 10), 0 (11 < max(10, 12)),
  # 1 (15 > max(12, 11)).
  arms = []
  for best in (10.0, 12.0, 11.0, 15.0):
    arms.append(run.arm)
    lam = float(run.rule_state.lam)
    assert run.call([best - 5.0]).hparams is None  # mid-round: nothing
    decision = run.call([best, best - 1.0])
    np.testing.assert_array_equal(run.lam, run.rule_state.lam)  # applied
    assert float(run.rule_state.lam) == run.rule.config.lambda_arms[run.arm]
    # A new lambda comes with its event; the same one with nothing.
    if float(run.rule_state.lam) == lam:
      assert decision.hparams is None and not decision.events
    else:
      assert decision.events == ({
          'event': 'lambda', 'step': 10 * run.calls,
          'env_steps': 10 * run.calls + 100,
          'value': float(run.rule_state.lam)},)
  assert run.history == [(arms[1], 1.0), (arms[2], 0.0), (arms[3], 1.0)]
  # --bandit-lookback 2 rounds are compared; one more is kept (the
  # relative-gain reward needs 2 gains).
  np.testing.assert_array_equal(run.rule_state.recent_scores,
                                [12.0, 11.0, 15.0])
  # A round in which no evaluation ended keeps its arm and earns nothing.
  arm = run.arm
  run.call()
  decision = run.call()
  assert decision.hparams is None and not decision.events
  assert run.arm == arm and len(run.history) == 3


def test_bandit_rounds_reward_gains_above_the_recent_median_if_asked():
  assert _config().bandit_reward == 'improvement'  # the paper's, the default
  run = Run(_config(bandit_score='best', bandit_reward='relative-gain'))
  # Rounds 10, 12, 11, 15, 16, 19: gains 2, -1, 4, 1, 3. Rewards: none, none
  # (one previous gain is needed), 0 (-1 < 2), 1 (4 > median(2, -1)),
  # 0 (1 < median(-1, 4) with --bandit-lookback 2), 1 (3 > median(4, 1)).
  # improvement would pay rounds 4-6 all 1 (each a new best).
  arms = []
  for best in (10.0, 12.0, 11.0, 15.0, 16.0, 19.0):
    arms.append(run.arm)
    run.call([best])
    run.call([best - 1.0])
  assert run.history == list(zip(arms[2:], [0.0, 1.0, 0.0, 1.0]))
  np.testing.assert_array_equal(run.rule_state.recent_scores,
                                [15.0, 16.0, 19.0])


@pytest.mark.parametrize('score, rewards, scores', [
    # Population mean (the default, as the DvD authors' code): member means
    # first, so member 0's two evaluations in round 3 do not weigh double.
    ('mean', [0.0, 1.0], [5.0, 0.0, (7.0 + 4.0) / 2]),
    # Best episode: round 2's best rose although its mean fell.
    ('best', [1.0, 0.0], [10.0, 20.0, 8.0]),
])
def test_bandit_round_return_is_the_population_mean_by_default(
    score, rewards, scores):
  config = _config(bandit_lookback=5, bandit_reward='improvement')
  if score != 'mean':
    config = dataclasses.replace(config, bandit_score=score)
  assert config.bandit_score == score
  run = Run(config)
  arms = []
  for first, second in (({0: [10.0]}, {1: [0.0]}),
                        ({0: [20.0], 1: [-20.0]}, {}),
                        ({0: [6.0]}, {0: [8.0], 1: [4.0]})):
    arms.append(run.arm)
    run.call_members(first)
    run.call_members(second)
  # Means of small integers: exact. NaN: rounds not played yet.
  np.testing.assert_array_equal(run.rule_state.recent_scores,
                                [np.nan] * 3 + scores)
  assert run.history == list(zip(arms[1:], rewards))


def test_lambda_zero_baseline_never_applies_the_term():
  run = Run(_config(lambda_mode='schedule', lambda_start=0.0, lambda_end=0.0))
  for _ in range(5):
    decision = run.call([1.0])
    assert decision.hparams is None and not decision.events
    np.testing.assert_array_equal(run.lam, 0.0)
  assert run.rule.scalars(run.rule_state)['diversity_weight'] == 0.0
  assert int(run.rule_state.arm) == -1


def test_schedule_sets_lambda_by_update_steps_with_an_event_each_change():
  run = Run(_config(lambda_mode='schedule', lambda_start=0.5, lambda_end=0.0,
                    lambda_decay_steps=40))
  np.testing.assert_array_equal(run.lam, 0.5)
  values = []
  for _ in range(6):
    run.call()
    values.append(float(run.lam[0]))
  # np.interp of 10, 20, ... on (0, 0.5) -> (40, 0): a slope, a product and
  # a sum in float64 (rule 1, k = 4); lambda is float32 in the hparams.
  np.testing.assert_allclose(values, [0.375, 0.25, 0.125, 0.0, 0.0, 0.0],
                             rtol=0, atol=numerics.rounding_rtol(4))
  assert [e['value'] for e in run.events] == [
      float(run.rule.schedule(s)) for s in (10, 20, 30, 40)]
  assert [e['step'] for e in run.events] == [10, 20, 30, 40]
  assert run.rule.summary(run.rule_state, '') == 'DvD final lambda: 0.0'


def test_logged_diversity_is_the_mean_pairwise_action_distance():
  run = Run(_config())

  def scalars():
    return run.rule.scalars(run.rule_state)

  assert 'mean_pairwise_action_distance' not in scalars()
  for _ in range(9):
    run.call()
  assert 'mean_pairwise_action_distance' not in scalars()
  run.call()  # call 10: measured
  got = scalars()['mean_pairwise_action_distance']
  # By hand: every member's actions on the probe states, all pairs.
  states = probe_states_of_dvd('Pendulum-v1', 16, seed=0)
  nets = td3.make_networks(run.agent.env_spec, run.agent.config)
  policies = run.learner.policy_params(run.state)
  acts = [np.asarray(nets.policy.apply(
      jax.tree.map(lambda x, i=i: x[i], policies), states)) for i in range(N)]
  dists = [np.linalg.norm(acts[i] - acts[j], axis=-1).mean()
           for i in range(N) for j in range(N) if i != j]
  # Two programs' actions (in [-1, 1]) differ by rule 1's bound for a forward
  # pass (k = 32), twice per distance; then the means' 24 ops, relative.
  action_atol = 2 * numerics.rounding_rtol(32)
  expected = float(np.mean(dists))
  assert got == pytest.approx(expected, rel=0, abs=action_atol
                              + numerics.rounding_rtol(24) * expected)
  assert got > 0.0
  assert f'{got:.4f}' in run.rule.summary(run.rule_state, '')
  # Identical members: distance 0.
  run.state = run.state._replace(policy=jax.tree.map(
      lambda x: np.broadcast_to(x[:1], x.shape), run.state.policy))
  for _ in range(10):
    run.call()
  # Rows of one vmapped forward pass: at most rule 1's bound, as above.
  assert scalars()['mean_pairwise_action_distance'] == pytest.approx(
      0.0, abs=action_atol)


def _save_and_restore(tmp_path, run: Run, template_run: Run):
  """``run``'s rule state through a checkpoint, read back into the shapes
  ``template_run``'s ``init`` gave (as ``fastpbrl.run.resume`` does)."""
  checkpointer = Checkpointer(str(tmp_path))
  try:
    checkpointer.save(run.calls, run.state,
                      {'hparams': run.hparams, 'rule': run.rule_state},
                      {'rule_format': resume.RULE_FORMAT})
    _, extra, _ = checkpointer.restore(
        template_run.state, {'hparams': template_run.hparams,
                             'rule': template_run.rule_state})
  finally:
    checkpointer.close()
  return resume.like(template_run.rule_state, extra['rule'])


def _assert_same_state(got, want):
  """Equal structure, leaf types and dtypes, and values (NaN equal)."""
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert type(a) is type(b) and a.dtype == b.dtype, (type(a), type(b))
    np.testing.assert_array_equal(a, b)  # the same values: exact


def test_checkpointed_state_round_trips_and_continues_identically(tmp_path):
  run = Run(_config())
  for best in (3.0, 1.0, 4.0):
    run.call([best])
    run.call([best])
  run.call([9.0, 2.0])  # mid-round, two members' returns recorded
  for _ in range(3):
    run.call()  # through call 10: a diversity measured
  assert not np.isnan(run.rule_state.diversity)
  resumed = Run(_config())
  restored = _save_and_restore(tmp_path, run, resumed)
  _assert_same_state(restored, run.rule_state)
  # A resume measures the diversity again; the rest is the checkpoint's.
  resumed.rule_state = resumed.rule.resumed(restored)
  assert 'mean_pairwise_action_distance' not in resumed.rule.scalars(
      resumed.rule_state)
  _assert_same_state(resumed.rule_state._replace(
      diversity=run.rule_state.diversity), run.rule_state)
  resumed.hparams, resumed.state, resumed.calls = (run.hparams, run.state,
                                                   run.calls)
  # Through call 20: the resumed run measures its diversity again.
  for best in (2.0, 8.0, 5.0, 7.0, 1.0, 6.0, 6.0, 3.0, 9.0, 4.0):
    for r in (run, resumed):
      r.call([best])
  assert resumed.events == run.events[len(run.events) - len(resumed.events):]
  _assert_same_state(resumed.rule_state, run.rule_state)


@pytest.mark.parametrize('flag, value, message', [
    ('bandit_score', 'mean', '--bandit-score best'),
    ('bandit_reward', 'relative-gain', '--bandit-reward improvement'),
    ('bandit_lookback', 3, '--bandit-lookback'),
    ('lambda_arms', (0.0, 0.5, 1.0), '--lambda-arms'),
])
def test_resume_with_other_bandit_settings_is_refused(tmp_path, flag, value,
                                                      message):
  saved = Run(_config(bandit_score='best'))
  saved.call([3.0])
  saved.call([5.0])
  saved.call([7.0])
  resumed = Run(_config(**{'bandit_score': 'best', flag: value}))
  restored = _save_and_restore(tmp_path, saved, resumed)
  with pytest.raises(ConfigError, match=message):
    resumed.rule.resumed(restored)
  # With its own settings it resumes: the scores and the round's returns.
  own = Run(_config(bandit_score='best'))
  state = own.rule.resumed(_save_and_restore(tmp_path / 'own', saved, own))
  np.testing.assert_array_equal(state.recent_scores, [np.nan, np.nan, 5.0])
  assert int(state.round.counts[0]) == 1 and state.round.best[0] == 7.0


def test_checkpoint_from_before_the_rule_contract_is_refused(tmp_path):
  # What a DvD driver wrote: its host values in the meta, no rule format.
  run = Run(_config())
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(1, run.state, {'hparams': run.hparams},
                    {'driver': {'arm': 0, 'lam': 0.0, 'calls_in_round': 0}})
  config = dataclasses.replace(run.rule.config, resume=str(tmp_path))
  fresh = resume.Restored(run.state, run.hparams, run.rule_state,
                          resume.FRESH_COUNTERS, None)
  try:
    with pytest.raises(ConfigError, match='start a new run'):
      resume.restore(checkpointer, config, run.rule, run.agent.env_spec,
                     run.learner, fresh, distributed.Processes(None, 4))
  finally:
    checkpointer.close()


def test_decide_changes_nothing_it_is_given():
  run = Run(_config())
  for best in (3.0, 1.0, 4.0, 2.0):
    run.call([best])
    run.call([best, best + 1.0])
  run.call([6.0])
  # Call 10 ends a round (a reward, a new choice) and measures diversity.
  observation = run.next_observation(
      [EpisodeRecord(1, 7.0, 200, True, 0, 0)])
  rule_state = run.rule_state
  before = copy.deepcopy((rule_state, observation))
  attributes = dict(run.rule.__dict__)
  before_attributes = copy.deepcopy(
      {k: v for k, v in attributes.items() if k != 'distance'})
  new_state, decision = run.rule.decide(rule_state, observation)
  assert int(new_state.bandit.selections) > int(rule_state.bandit.selections)
  assert not np.isnan(new_state.diversity)
  # Inputs: the same values (exact) and structure.
  after = (rule_state, observation)
  assert jax.tree.structure(after) == jax.tree.structure(before)
  jax.tree.map(np.testing.assert_array_equal, after, before)
  # The rule: the same attributes, equal settings, the same compiled function.
  assert run.rule.__dict__.keys() == attributes.keys()
  assert run.rule.distance is attributes['distance']
  for name, value in before_attributes.items():
    now = run.rule.__dict__[name]
    if isinstance(value, (np.ndarray, jax.Array)):
      np.testing.assert_array_equal(now, value)
    else:
      assert now == value, name
  # Deciding again from the same inputs gives the same decision and state.
  again_state, again = run.rule.decide(rule_state, observation)
  _assert_same_state(again_state, new_state)
  assert again.events == decision.events


@pytest.mark.parametrize('flag, value, message', [
    ('bandit_lookback', 0, '--bandit-lookback must be >= 1'),
    ('bandit_window', -1, '--bandit-window must be >= 0'),
    ('bandit_burn_in', -1, '--bandit-burn-in must be >= 0'),
    ('bandit_score', 'median', '--bandit-score must be mean or best'),
    ('bandit_reward', 'gain', '--bandit-reward must be improvement or '
     'relative-gain'),
    ('diversity_states', 0, '--diversity-states must be >= 1'),
])
def test_bad_bandit_flags_name_the_flag(flag, value, message):
  with pytest.raises(ConfigError, match=message):
    DvD(_config(**{flag: value}))
