"""CEM-RL's rule (Algorithm 1 of Pourchot & Sigaud 2019) driven through the
rule contract: ``CEMRL.decide`` after real learner calls, driven by
``fastpbrl.rules.testing.Harness`` (which carries out its decisions as the
loop does), no run, no pipeline. Every episode of these tests starts under
the newest policy version, so the harness's filter (the loop's) of
episodes that started before a ``renewed`` member's new weights leaves
them all (``Decision.renewed`` itself is checked where it is decided)."""

import copy
import dataclasses
import os
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastpbrl.cli import parse as cli
from fastpbrl.config.errors import ConfigError
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.logs.logging import append_rows
from fastpbrl.rules import registry
from fastpbrl.rules.base import Observation
from fastpbrl.rules.cemrl import CEMRL, CEMRLRunConfig, CEMRLState
from fastpbrl.rules.cemrl import cem as cem_lib
from fastpbrl.rules.testing import Harness
from fastpbrl.run import build
from fastpbrl.run.checkpoint import Checkpointer
from fastpbrl.run.resume import like
from tests.rules.conftest import pendulum_spec, random_batch, tiny_td3

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 4  # members; the RL half is members 0 and 1 (--rl-fraction 0.5)
NUM_RL = 2
S = 5  # update steps per learner call
B = 4  # batch size
ENV_STEPS_PER_CALL = 3  # env steps per member the tests count per call


def fitness_episode(generation: int, member: int) -> tuple[float, int]:
  """(return, length) of every episode member ``member`` ends while
  generation ``generation`` is under way. The lengths of a generation sum
  to 46 + 20 g: never a multiple of S, so calls end partly inactive."""
  return (float((7 * member + 3 * generation) % 5),
          7 + 3 * member + 5 * generation)


def mean_policy_return(seed: int) -> float:
  """What the stand-in for the mean policy's evaluation returns: a value
  of the seed (hence of the generation), so that the last and the best
  returns differ (10,000 g mod 7: 4, 1, 5, 2 for g = 1..4)."""
  return float(seed % 7)


@dataclasses.dataclass(frozen=True)
class FakeData:
  """``Observation.data``: the mean policy's evaluation returns
  ``mean_policy_return(seed)`` instead of playing episodes."""

  def evaluate(self, policy_params, actor_hparams, episodes, seed):
    del actor_hparams, episodes
    assert len(jax.tree.leaves(policy_params)[0]) == 1  # the mean policy
    return np.full((1, 1), mean_policy_return(seed)), np.ones((1, 1))

  def random_states(self, num_states, seed):
    raise AssertionError('CEM-RL asks for no probe states')


def make_run(monkeypatch, seed: int = 0) -> Harness:
  """A ``Harness`` over a CEM-RL rule of N tiny TD3 members, ``FakeData``
  answering its evaluations."""
  del monkeypatch
  config = CEMRLRunConfig(population_size=N, rl_fraction=0.5,
                          hidden_sizes=(8, 8), batch_size=B,
                          steps_per_call=S, seed=seed)
  rule = CEMRL.from_config(config)
  agent = tiny_td3(batch_size=B, steps_per_call=S)
  rule.prepare(agent)
  learner = rule.make_learner(agent, S)
  state, hparams, rule_state = build.initial_population(rule.config, rule,
                                                        agent, learner)
  return Harness(rule, rule_state, state=state, hparams=hparams,
                 learner=learner, data=FakeData())


def fitness_episodes(run: Harness, generation: int, members) -> tuple:
  """The fitness episodes of ``members`` in ``generation``, started and
  ended under the newest published version."""
  v = run.policy_version
  return tuple(EpisodeRecord(m, *fitness_episode(generation, m), False, 0,
                             v, v) for m in members)


def observation(run: Harness, episodes: tuple) -> Observation:
  """The last call's observation again, with these episodes."""
  return run.observation(episodes, calls=run.calls)


def one_call(run: Harness):
  """A learner call, the episodes that ended during it (started under the
  newest published version), the rule's decision carried out; the
  publish. The batch depends on the critic's step count only. Returns the
  decision."""
  batch = random_batch(pendulum_spec(), (N, S, B), int(run.state.step))
  run.state, _ = run.learner.update(run.state, run.hparams, batch)
  g = int(run.rule_state.generation) + 1  # the generation under way
  return run.observe(fitness_episodes(run, g, range(N)),
                     update_steps=run.update_steps + S,
                     env_steps=(run.calls + 1) * ENV_STEPS_PER_CALL)


def adam_counts(state):
  """(critic Adam steps, [N] policy Adam steps)."""
  return (int(state.critic_opt[0].count),
          np.asarray(state.policy_opt[0].count).copy())


def drive(run: Harness, generations: int):
  """Runs calls until ``generations`` CEM updates; returns per generation
  (critic steps, [N] actor steps, [N] fitness-episode lengths), counted on
  the optimizers' step counters: the critic's from one generation's start
  to the next's; a member's policy's from its loading to its evaluation."""
  out = []
  start = published = adam_counts(run.state)
  call = 0
  while run.rule_state.generation < generations:
    call += 1
    assert call < 500, 'the schedule does not end generations'
    g = int(run.rule_state.generation) + 1
    one_call(run)
    if run.rule_state.generation == g:  # generation g ended with this call
      critic_end = int(run.state.critic_opt[0].count)
      lengths = np.array([fitness_episode(g, m)[1] for m in range(N)])
      out.append((critic_end - start[0], published[1] - start[1], lengths))
      start = adam_counts(run.state)
    published = adam_counts(run.state)
  return out


def assert_trees_identical(a, b):
  """Same structure, leaf types, dtypes and values (NaN equal to NaN)."""
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    assert type(x) is type(y) or (isinstance(x, jax.Array)
                                  and isinstance(y, jax.Array)), (x, y)
    assert np.asarray(x).dtype == np.asarray(y).dtype, (x, y)
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_is_registered_with_its_presets():
  assert registry.get('cemrl') is CEMRL
  assert CEMRL.config_class is CEMRLRunConfig
  assert list(CEMRL.presets) == ['small', 'paper']
  assert CEMRL.shared_critic and CEMRL.shared_replay
  assert CEMRL.multi_process
  assert CEMRL.log_files == ('mean_policy.csv',)


def test_counts_of_actor_and_critic_steps_follow_algorithm_1(monkeypatch):
  run = make_run(monkeypatch)
  counts = drive(run, 4)
  actor_steps = 0  # Algorithm 1: actor_steps = 0 before the first generation
  for g, (critic, actor, lengths) in enumerate(counts, start=1):
    # Each RL actor trains actor_steps steps; the critic 2 actor_steps / n
    # per RL actor, actor_steps in all; the other members do not train.
    expected = np.where(np.arange(N) < NUM_RL, actor_steps, 0)
    np.testing.assert_array_equal(actor, expected, err_msg=f'generation {g}')
    assert critic == NUM_RL * (2 * actor_steps // N) == actor_steps, (
        f'generation {g}: {critic} critic steps, expected {actor_steps}')
    # Lines 14-17: the next actor_steps is the env steps of this
    # generation's evaluation episodes.
    actor_steps = int(lengths.sum())
  assert [c for c, _, _ in counts] == [0, 66, 86, 106]
  # The rule's own count is the state's.
  assert (int(run.rule_state.critic_steps) == int(run.state.step)
          == 66 + 86 + 106)
  # One compilation for every generation's bound, train and eval phases.
  assert run.learner.compilations == 1


def test_phases_renew_every_member_and_log_each_generation(monkeypatch,
                                                           tmp_path):
  run = make_run(monkeypatch)
  everyone = np.ones((N,), bool)
  # Generation 1 trains 0 steps: its first call starts the eval phase, and
  # the trained policies' episodes alone score them.
  decision = one_call(run)
  assert run.rule_state.evaluating
  np.testing.assert_array_equal(decision.renewed, everyone)
  # Carried out: episodes that started before version 2 score nobody.
  np.testing.assert_array_equal(run.first_version, np.full((N,), 2))
  assert decision.state is None and decision.hparams is None
  assert decision.events == () and decision.logs == ()
  # The next call's episodes score every member: generation 1 ends.
  decision = one_call(run)
  assert int(run.rule_state.generation) == 1
  assert not run.rule_state.evaluating
  assert decision.renewed is None  # the train phase scores nothing
  lengths = [fitness_episode(1, m)[1] for m in range(N)]
  # The stand-in's return, copied into the event and the row: exact.
  assert decision.events == ({
      'event': 'generation', 'step': 2 * S, 'env_steps': 2 * ENV_STEPS_PER_CALL,
      'generation': 1, 'mean_policy_return': mean_policy_return(10_000)},)
  # mean_policy.csv's row: the actor_steps the generation trained (0).
  assert decision.logs == (('mean_policy.csv', {
      'generation': 1, 'total_env_steps': 2 * ENV_STEPS_PER_CALL * N,
      'actor_steps': 0, 'mean_policy_return': mean_policy_return(10_000)}),)
  assert int(run.rule_state.actor_steps) == sum(lengths) == 66
  np.testing.assert_array_equal(np.asarray(run.hparams.train_until),
                                np.full((N,), 66))
  # The file the old driver wrote, line for line.
  append_rows(str(tmp_path), decision.logs)
  with open(os.path.join(tmp_path, 'mean_policy.csv')) as f:
    assert f.read() == ('generation,total_env_steps,actor_steps,'
                        'mean_policy_return\n1,24,0,4.0\n')
  drive(run, 4)
  # Returns 4, 1, 5, 2: the last and the best (exact: copied values).
  assert run.rule.scalars(run.rule_state) == {
      'generation': 4, 'actor_steps': 46 + 20 * 4,
      'critic_steps': 66 + 86 + 106, 'mean_policy_return': 2.0}
  assert run.rule.summary(run.rule_state, str(tmp_path)) == (
      'CEM-RL: 4 generations, 258 critic steps; mean-policy return 2.0 at the '
      'end, best 5.0 (mean_policy.csv)')


def test_nothing_to_report_before_the_first_generation(monkeypatch, tmp_path):
  run = make_run(monkeypatch)
  assert run.rule.scalars(run.rule_state) == {
      'generation': 0, 'actor_steps': 0, 'critic_steps': 0}
  assert run.rule.summary(run.rule_state, str(tmp_path)) == (
      'CEM-RL: no generation finished')
  assert not run.rule.finished(run.rule_state)


def test_critic_ignores_the_members_outside_the_rl_half(monkeypatch):
  run = make_run(monkeypatch)
  drive(run, 1)  # generation 2, which trains, starts now
  state, hparams, learner = run.state, run.hparams, run.learner
  batch = random_batch(pendulum_spec(), (N, S, B), 100)
  other = random_batch(pendulum_spec(), (N, S, B), 101)
  # Other policies, target policies and batches for members 2 and 3 only.
  rows = np.arange(N) >= NUM_RL
  changed_batch = jax.tree.map(
      lambda a, b: np.where(rows.reshape((N,) + (1,) * (a.ndim - 1)), b, a),
      batch, other)
  def perturb(tree):
    return jax.tree.map(lambda x: x.at[NUM_RL:].add(0.3), tree)
  changed = state._replace(policy=perturb(state.policy),
                           target_policy=perturb(state.target_policy))
  copy_tree = lambda tree: jax.tree.map(jnp.copy, tree)  # the learner donates
  inputs = copy_tree(changed)
  a, _ = learner.update(copy_tree(state), hparams, batch)
  b, _ = learner.update(copy_tree(changed), hparams, changed_batch)
  # The critic loss averages over the RL members' batches and target
  # policies only: same critic, same RL policies either way, bit for bit
  # (one program, the same inputs to everything they depend on).
  chex.assert_trees_all_close(
      (a.critic, a.target_critic, a.critic_opt),
      (b.critic, b.target_critic, b.critic_opt), rtol=0, atol=0)
  # S = 5 Adam steps move weights by ~lr = 3e-4 each, far beyond allclose's
  # 1e-5 relative.
  assert not np.allclose(jax.tree.leaves(a.critic)[0],
                         jax.tree.leaves(state.critic)[0]), (
                             'critic did not step')
  head = lambda t: jax.tree.map(lambda x: x[:NUM_RL], t)
  tail = lambda t: jax.tree.map(lambda x: x[NUM_RL:], t)
  chex.assert_trees_all_close(head((a.policy, a.target_policy, a.policy_opt)),
                              head((b.policy, b.target_policy, b.policy_opt)),
                              rtol=0, atol=0)  # bit for bit, as above
  # The other members take no policy step at all.
  chex.assert_trees_all_equal(
      tail((b.policy, b.target_policy, b.policy_opt, b.key)),
      tail((inputs.policy, inputs.target_policy, inputs.policy_opt,
            inputs.key)))


def test_new_generations_start_with_fresh_policy_optimizers(monkeypatch):
  run = make_run(monkeypatch)
  fresh = lambda state: jax.vmap(optax.adam(1.0).init)(state.policy)
  # Generation 1, as init loads it.
  chex.assert_trees_all_equal(run.state.policy_opt, fresh(run.state))
  trained_before = 0
  for g in range(1, 4):
    previous = None
    while run.rule_state.generation < g:
      previous = np.asarray(run.state.policy_opt[0].count).copy()
      one_call(run)
    trained_before += int(previous[:NUM_RL].min() > 0)
    # Newly sampled policies: Adam starts afresh, targets equal the policies.
    chex.assert_trees_all_equal(run.state.policy_opt, fresh(run.state))
    chex.assert_trees_all_equal(run.state.target_policy, run.state.policy)
  assert trained_before >= 2, 'the RL half never trained before a reset'


def test_generations_are_sampled_from_the_updated_distribution(monkeypatch):
  run = make_run(monkeypatch)
  one_call(run)  # generation 1 is evaluated untrained
  before = run.rule_state
  # The eval phase's calls train nothing: these are the policies scored
  # (copied: the learner donates the state).
  trained = jax.tree.map(jnp.copy, run.state.policy)
  one_call(run)  # scores everyone: the update and generation 2
  flat, _ = cem_lib.flatten_population(trained)
  fitness = jnp.asarray([fitness_episode(1, m)[0] for m in range(N)],
                        jnp.float32)
  want = cem_lib.update(before.cem, flat, fitness)
  # The same function on the same inputs, eagerly both times: bit for bit.
  chex.assert_trees_all_equal(run.rule_state.cem, want)
  # The next generation: one split of the rule's key, mirrored samples of
  # the new distribution (the same eager program: exact).
  key, sub = jax.random.split(before.key)
  np.testing.assert_array_equal(run.rule_state.key, key)
  np.testing.assert_array_equal(
      cem_lib.flatten_population(run.state.policy)[0],
      cem_lib.sample(sub, want, N))


@pytest.mark.parametrize('phase', ['train', 'eval'])
def test_resume_continues_the_schedule(tmp_path, monkeypatch, phase):
  run = make_run(monkeypatch)
  drive(run, 1)
  one_call(run)  # generation 2 trains 66 steps: 14 calls
  while phase == 'eval' and not run.rule_state.evaluating:
    one_call(run)
  assert bool(run.rule_state.evaluating) == (phase == 'eval')
  # What the run checkpoints (fastpbrl.run.resume.Saver) and restores.
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(run.calls, run.state,
                    {'hparams': run.hparams, 'rule': run.rule_state}, {})
  counters = (run.calls, run.update_steps)
  rest = drive(run, 3)

  resumed = make_run(monkeypatch)  # a new run: its templates
  state, extra, _ = checkpointer.restore(
      resumed.state, {'hparams': resumed.hparams,
                      'rule': resumed.rule_state})
  checkpointer.close()
  resumed.state = jax.tree.map(jnp.asarray, state)
  resumed.hparams = jax.tree.map(jnp.asarray, extra['hparams'])
  resumed.rule_state = resumed.rule.resumed(like(resumed.rule_state,
                                                 extra['rule']))
  resumed.calls, resumed.update_steps = counters  # the loop's counters
  if phase == 'eval':
    # Versions restart and the first episodes are warm-up: the first call
    # of a resumed eval phase scores nobody, and renews everyone.
    decision = one_call(resumed)
    np.testing.assert_array_equal(decision.renewed, np.ones((N,), bool))
    assert np.isnan(resumed.rule_state.fitness).all()
  rest2 = drive(resumed, 3)
  # The same schedule and the same CEM distribution.
  for (c, a, _), (c2, a2, _) in zip(rest, rest2, strict=True):
    assert c == c2
    np.testing.assert_array_equal(a, a2)
  assert rest[-1][0] == 86
  assert (int(resumed.rule_state.critic_steps)
          == int(run.rule_state.critic_steps) == 66 + 86)
  # Bit for bit: the same programs on the same restored values.
  chex.assert_trees_all_equal(resumed.rule_state.cem, run.rule_state.cem)
  assert (resumed.rule.scalars(resumed.rule_state)
          == run.rule.scalars(run.rule_state))


def test_rule_state_round_trips_through_a_checkpoint(tmp_path, monkeypatch):
  run = make_run(monkeypatch)
  drive(run, 2)
  one_call(run)
  while not run.rule_state.evaluating:
    one_call(run)
  # Half the population scored (NaN: the others), every field set.
  episodes = fitness_episodes(run, 3, range(NUM_RL))
  saved, decision = run.rule.decide(run.rule_state, observation(run, episodes))
  assert decision.state is None and decision.hparams is None
  assert np.isnan(saved.fitness).tolist() == [False, False, True, True]
  assert saved.lengths.tolist() == [22, 25, 0, 0]
  assert int(saved.generation) == 2 and saved.evaluating
  # The stand-in's returns of generations 2 and 1, copied: exact.
  assert (float(saved.last_return), float(saved.best_return)) == (1.0, 4.0)
  checkpointer = Checkpointer(str(tmp_path))
  checkpointer.save(7, run.state, {'hparams': run.hparams, 'rule': saved}, {})
  template = make_run(monkeypatch)
  _, extra, _ = checkpointer.restore(
      template.state, {'hparams': template.hparams,
                       'rule': template.rule_state})
  checkpointer.close()
  restored = like(template.rule_state, extra['rule'])
  assert isinstance(restored, CEMRLState)
  # Stored and read back, not computed: exact, numpy stays numpy.
  assert_trees_identical(restored, saved)


def test_decide_changes_nothing_it_was_given(monkeypatch):
  run = make_run(monkeypatch)
  one_call(run)  # the eval phase of generation 1
  episodes = fitness_episodes(run, 1, range(N))
  obs = observation(run, episodes)
  rule_state = run.rule_state
  before = copy.deepcopy((rule_state, obs))
  settings = copy.deepcopy(run.rule.__dict__)
  agent = run.rule.agent
  # The whole generation's work: the update, the evaluation, the sampling.
  new_state, decision = run.rule.decide(rule_state, obs)
  assert int(new_state.generation) == 1 and decision.state is not None
  assert_trees_identical((rule_state, obs), before)
  assert run.rule.__dict__.keys() == settings.keys()
  assert run.rule.config == settings['config']
  # The agent (prepare's): an immutable NamedTuple of functions, whose deep
  # copy holds new functools.partial objects, equal to nothing: the same
  # object, with the same settings.
  assert run.rule.agent is agent
  assert run.rule.agent.config == settings['agent'].config
  # A function of its arguments: the same decision again.
  again_state, again = run.rule.decide(rule_state, obs)
  assert_trees_identical(again_state, new_state)
  assert_trees_identical((again.state, again.hparams),
                         (decision.state, decision.hparams))
  assert (again.events, again.logs) == (decision.events, decision.logs)


def test_budget_is_the_populations_total():
  config = CEMRL.from_config(CEMRL.presets['paper']).config
  # The paper's budget: 1M env steps in all on HalfCheetah, 10 members.
  assert (config.env, config.population_size) == ('HalfCheetah-v5', 10)
  assert config.total_env_steps == 1_000_000
  assert config.env_steps == 100_000  # per member, what run.run counts
  assert config.warmup_steps * 10 == 10_000  # the paper's start_steps
  # One shared-critic update step per env step of the population.
  assert config.update_to_data_ratio == 10
  assert CEMRL.from_config(config).config == config  # idempotent (resume)
  assert CEMRL(config).config == config


BAD_FLAGS = [
    (['--env-steps', '5000'], ('--env-steps is per member .* pass '
                               '--total-env-steps 30000 for 5000 per member')),
    (['--total-env-steps', '3000', '--warmup-steps', '500'],
     (r'--warmup-steps 500 per member \(3000 in all\) must be below '
      '--total-env-steps 3000')),
    (['--total-env-steps', '0'], '--total-env-steps must be > 0'),
    (['--population-size', '5'], '--population-size must be even'),
]


@pytest.mark.parametrize('argv, message', BAD_FLAGS)
def test_bad_budget_flags_exit_naming_them(argv, message, tmp_path,
                                           monkeypatch):
  def no_start(*args, **kwargs):
    raise AssertionError('a run started despite an invalid setting')
  monkeypatch.setattr(cli, 'run', no_start)
  with pytest.raises(SystemExit) as info:
    cli.train_command(CEMRL, argv + ['--run-dir', str(tmp_path),
                                     '--no-progress'])
  assert re.search(message, str(info.value.code)), info.value.code
  # The rule's own refusal, before any command line.
  config = cli.parse(CEMRL.presets, '', argv)
  with pytest.raises(ConfigError, match=message):
    CEMRL.from_config(config)
