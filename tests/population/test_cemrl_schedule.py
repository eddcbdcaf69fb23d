"""CEM-RL's schedule (Algorithm 1 of Pourchot & Sigaud 2019) as the driver
runs it: ``CEMRLDriver`` and its learner driven call by call as
``fastpbrl.run.run`` does, with a stand-in pipeline that only numbers the
published versions and hands over the episodes each call ends."""

import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastpbrl import drivers
from fastpbrl.actors.actor import EpisodeRecord
from fastpbrl.run import Loop
from tests.population.conftest import pendulum_spec, random_batch, tiny_td3

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 4  # members; the RL half is members 0 and 1 (--rl-fraction 0.5)
NUM_RL = 2
S = 5  # update steps per learner call
B = 4  # batch size


def fitness_episode(generation: int, member: int) -> tuple[float, int]:
  """(return, length) of every episode member ``member`` ends while
  generation ``generation`` is under way. The lengths of a generation sum
  to 46 + 20 g: never a multiple of S, so calls end partly inactive."""
  return float((7 * member + 3 * generation) % 5), 7 + 3 * member + 5 * generation


class FakePipeline:
  """What the driver reads of the pipeline: the published version."""

  def __init__(self):
    self.policy_version = 1  # run.run publishes once before the first call

  def wait_published(self, timeout=None):
    return True


def make_loop(tmp_path, monkeypatch, seed: int = 0):
  # The mean policy's evaluation plays gym episodes: not needed here.
  monkeypatch.setattr('fastpbrl.rules.cemrl.evaluate_policy',
                      lambda *a, **k: [0.0])
  tmp_path.mkdir(parents=True, exist_ok=True)
  config = drivers.CEMRLRunConfig(population_size=N, rl_fraction=0.5,
                                  hidden_sizes=(8, 8), batch_size=B,
                                  steps_per_call=S, seed=seed)
  driver = drivers.CEMRLDriver(config)
  agent = tiny_td3(batch_size=B, steps_per_call=S)
  learner = driver.make_learner(agent, S)
  k_hp, k_driver, k_init, k_rule = jax.random.split(jax.random.PRNGKey(seed), 4)
  hparams = driver.initial_hparams(k_hp, agent, N)
  state = driver.initialize(k_driver, learner.init(k_init, hparams), agent)
  loop = Loop(config=driver.config, run_dir=str(tmp_path), agent=agent,
              learner=learner, pipeline=FakePipeline(), state=state,
              hparams=hparams, key=k_rule)
  return driver, loop


def one_call(driver, loop) -> None:
  """One iteration of run.run's loop: a learner call, the episodes that
  ended during it (started under the newest published version), the
  driver, the publish. The batch depends on the critic's step count only."""
  batch = random_batch(pendulum_spec(), (N, S, B), int(loop.state.step))
  loop.state, _ = loop.learner.update(loop.state, loop.hparams, batch)
  loop.calls += 1
  loop.update_steps += S
  g = driver.generation + 1  # the generation under way
  v = loop.pipeline.policy_version
  loop.episodes = [EpisodeRecord(m, *fitness_episode(g, m), False, 0, v, v)
                   for m in range(N)]
  driver.after_call(loop)
  loop.pipeline.policy_version += 1


def adam_counts(state):
  """(critic Adam steps, [N] policy Adam steps)."""
  return (int(state.critic_opt[0].count),
          np.asarray(state.policy_opt[0].count).copy())


def drive(driver, loop, generations: int):
  """Runs calls until ``generations`` CEM updates; returns per generation
  (critic steps, [N] actor steps, [N] fitness-episode lengths), counted on
  the optimizers' step counters: the critic's from one generation's start
  to the next's; a member's policy's from its loading to its evaluation."""
  out = []
  start = published = adam_counts(loop.state)
  call = 0
  while driver.generation < generations:
    call += 1
    assert call < 500, 'the schedule does not end generations'
    g = driver.generation + 1
    one_call(driver, loop)
    if driver.generation == g:  # generation g ended with this call
      critic_end = int(loop.state.critic_opt[0].count)
      lengths = np.array([fitness_episode(g, m)[1] for m in range(N)])
      out.append((critic_end - start[0], published[1] - start[1], lengths))
      start = adam_counts(loop.state)
    published = adam_counts(loop.state)
  return out


def test_counts_of_actor_and_critic_steps_follow_algorithm_1(tmp_path,
                                                             monkeypatch):
  driver, loop = make_loop(tmp_path, monkeypatch)
  counts = drive(driver, loop, 4)
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
  # One compilation for every generation's bound, train and eval phases.
  assert loop.learner.compilations == 1


def test_critic_ignores_the_members_outside_the_rl_half(tmp_path, monkeypatch):
  driver, loop = make_loop(tmp_path, monkeypatch)
  drive(driver, loop, 1)  # generation 2, which trains, starts now
  state, hparams = loop.state, loop.hparams
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
  copy = lambda tree: jax.tree.map(jnp.copy, tree)  # the learner donates
  inputs = copy(changed)
  a, _ = loop.learner.update(copy(state), hparams, batch)
  b, _ = loop.learner.update(copy(changed), hparams, changed_batch)
  # The critic loss averages over the RL members' batches and target
  # policies only: same critic, same RL policies either way, bit for bit
  # (one program, the same inputs to everything they depend on).
  chex.assert_trees_all_close(
      (a.critic, a.target_critic, a.critic_opt),
      (b.critic, b.target_critic, b.critic_opt), rtol=0, atol=0)
  # S = 5 Adam steps move weights by ~lr = 3e-4 each, far beyond allclose's
  # 1e-5 relative.
  assert not np.allclose(jax.tree.leaves(a.critic)[0],
                         jax.tree.leaves(state.critic)[0]), 'critic did not step'
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


def test_new_generations_start_with_fresh_policy_optimizers(tmp_path,
                                                            monkeypatch):
  driver, loop = make_loop(tmp_path, monkeypatch)
  fresh = lambda state: jax.vmap(optax.adam(1.0).init)(state.policy)
  # Generation 1, as initialize() loads it.
  chex.assert_trees_all_equal(loop.state.policy_opt, fresh(loop.state))
  trained_before = 0
  for g in range(1, 4):
    previous = None
    while driver.generation < g:
      previous = np.asarray(loop.state.policy_opt[0].count).copy()
      one_call(driver, loop)
    trained_before += int(previous[:NUM_RL].min() > 0)
    # Newly sampled policies: Adam starts afresh, targets equal the policies.
    chex.assert_trees_all_equal(loop.state.policy_opt, fresh(loop.state))
    chex.assert_trees_all_equal(loop.state.target_policy, loop.state.policy)
  assert trained_before >= 2, 'the RL half never trained before a reset'


@pytest.mark.parametrize('phase', ['train', 'eval'])
def test_resume_continues_the_schedule(tmp_path, monkeypatch, phase):
  driver, loop = make_loop(tmp_path / 'a', monkeypatch)
  drive(driver, loop, 1)
  one_call(driver, loop)  # generation 2 trains 66 steps: 14 calls
  while phase == 'eval' and driver.phase == 'train':
    one_call(driver, loop)
  assert driver.phase == phase
  # What run.run checkpoints and restores.
  saved = jax.tree.map(np.asarray, (loop.state, loop.hparams, loop.key,
                                    driver.checkpoint_arrays()))
  meta = json.loads(json.dumps(driver.checkpoint_meta()))
  rest = drive(driver, loop, 3)

  resumed, loop2 = make_loop(tmp_path / 'b', monkeypatch)
  state, hparams, key, arrays = jax.tree.map(jnp.asarray, saved)
  resumed.restore(arrays, meta)
  loop2.state, loop2.hparams, loop2.key = state, hparams, key
  rest2 = drive(resumed, loop2, 3)
  # The same schedule and the same CEM distribution (a resumed eval phase
  # scores from the next publish on: one more call, a no-op).
  for (c, a, l), (c2, a2, l2) in zip(rest, rest2, strict=True):
    assert c == c2
    np.testing.assert_array_equal(a, a2)
  assert rest[-1][0] == 86
  assert resumed.critic_steps == driver.critic_steps == 66 + 86
  # Bit for bit: the same programs on the same restored values.
  np.testing.assert_array_equal(resumed.cem_state.mean, driver.cem_state.mean)
  np.testing.assert_array_equal(resumed.cem_state.var, driver.cem_state.var)


def test_budget_is_the_populations_total(monkeypatch):
  from experiments import cemrl
  from fastpbrl import cli
  config = drivers.CEMRLDriver(cli.parse(cemrl.PRESETS, 'x',
                                         ['--preset', 'paper'])).config
  # The paper's budget: 1M env steps in all on HalfCheetah, 10 members.
  assert (config.env, config.population_size) == ('HalfCheetah-v5', 10)
  assert config.total_env_steps == 1_000_000
  assert config.env_steps == 100_000  # per member, what run.run counts
  assert config.warmup_steps * 10 == 10_000  # the paper's start_steps
  # One shared-critic update step per env step of the population.
  assert config.update_to_data_ratio == 10
  assert drivers.CEMRLDriver(config).config == config  # idempotent (resume)


@pytest.mark.parametrize('argv, message', [
    (['--env-steps', '5000'], '--env-steps is per member .* pass '
     '--total-env-steps 30000 for 5000 per member'),
    (['--total-env-steps', '3000', '--warmup-steps', '500'],
     r'--warmup-steps 500 per member \(3000 in all\) must be below '
     '--total-env-steps 3000'),
    (['--total-env-steps', '0'], '--total-env-steps must be > 0'),
    (['--population-size', '5'], '--population-size must be even'),
])
def test_bad_budget_flags_exit_naming_them(argv, message, tmp_path,
                                           monkeypatch):
  import re
  from experiments import cemrl
  import fastpbrl.run as run_lib
  def no_start(*args, **kwargs):
    raise AssertionError('a run started despite an invalid setting')
  monkeypatch.setattr(run_lib, 'RunLogger', no_start)
  with pytest.raises(SystemExit) as info:
    cemrl.main(argv + ['--run-dir', str(tmp_path), '--no-progress'])
  assert re.search(message, str(info.value.code)), info.value.code
