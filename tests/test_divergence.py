"""A diverging member (NaN or Inf in its loss or parameters) is flagged in
the compiled call, keeps its last finite state, and is then reset or (under
PBT) replaced by a copy of a good member; the other members are untouched."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.agents import td3
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.rules import pbt
from fastpbrl.rules.pbt import PBT, PBTRunConfig
from fastpbrl.run.main import run
from tests import numerics
from tests.agents.helpers import env_spec, random_batch

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

SMALL = td3.TD3Config(hidden_sizes=(16, 16), batch_size=16, steps_per_call=10)
BAD = 2  # the member with a learning rate of 1e3


@pytest.fixture(scope='module')
def agent():
  return td3.make_agent(env_spec('Pendulum-v1'), SMALL)


def pendulum_scaled_batch(agent, seed):
  """Random transitions at Pendulum's scales (angular velocity up to 8,
  rewards down to -16): unit-scale data keeps an Adam step of 1e3 finite."""
  batch = random_batch(agent.env_spec,
                       (4, SMALL.steps_per_call, SMALL.batch_size), seed=seed)
  return batch._replace(observation=batch.observation * 8,
                        next_observation=batch.next_observation * 8,
                        reward=batch.reward * 16)


def rows(tree, i):
  return jax.tree.map(lambda x: np.asarray(x[i]), tree)


def test_a_diverging_member_is_flagged_and_keeps_its_last_finite_state(agent):
  lrs = np.full(4, 3e-4, np.float32)
  lrs[BAD] = 1e3
  bad = population_hparams(agent, 4, policy_lr=lrs, critic_lr=lrs)
  good = population_hparams(agent, 4)  # the same population, member 2 sane
  learner = PopulationLearner(agent)
  key = jax.random.PRNGKey(0)
  state_bad = learner.init(key, good)  # identical initial parameters
  state_good = learner.init(key, good)
  flagged_at = None
  for call in range(30):
    batch = pendulum_scaled_batch(agent, call)
    before = rows(state_bad, BAD)
    state_bad, metrics = learner.update(state_bad, bad, batch)
    state_good, _ = learner.update(state_good, good, batch)
    finite = np.asarray(metrics['finite'])
    # Independent members: the others equal a run without the bad member,
    # bit for bit (one program; a member's rows never read another's values).
    for i in (0, 1, 3):
      chex.assert_trees_all_equal(rows(state_bad, i), rows(state_good, i))
    assert finite[[0, 1, 3]].all()
    if not finite[BAD]:
      flagged_at = call
      # The flagged member kept its state from before the call: finite.
      chex.assert_trees_all_equal(rows(state_bad, BAD), before)
      break
  assert flagged_at is not None, 'a learning rate of 1e3 never diverged'
  for leaf in jax.tree.leaves(state_bad):
    if jnp.issubdtype(leaf.dtype, jnp.inexact):
      assert np.isfinite(np.asarray(leaf)).all()
  # A reset re-initialises that member only.
  reset = learner.reinit_members(jax.random.PRNGKey(9), state_bad, bad,
                                 np.arange(4) == BAD)
  for i in (0, 1, 3):
    chex.assert_trees_all_equal(rows(reset, i), rows(state_bad, i))
  # The same values as a fresh init with that key, up to float rounding:
  # ``reinit_members`` is one compiled program, ``fresh`` runs op by op,
  # and XLA may round the two differently in the last bit (it does at the
  # tests' optimisation level, tests/conftest.py). A reset that used another
  # key, or none, would be off by the size of the weights.
  fresh = jax.vmap(agent.init)(jax.random.split(jax.random.PRNGKey(9), 4), bad)
  # Rule 1: a truncated normal draw is a few float32 ops per entry (16
  # counted); atol for entries near 0, where the uniform behind erfinv cancels.
  tol = numerics.rounding_rtol(16)
  chex.assert_trees_all_close(rows(reset, BAD), rows(fresh, BAD), rtol=tol,
                              atol=tol)


def test_diverged_parents_come_from_the_top_healthy_members():
  config = pbt.PBTConfig(fraction=0.25)
  fitness = jnp.asarray([1.0, np.nan, 5.0, 3.0, -2.0, 4.0, 0.0, 2.0])
  diverged = jnp.asarray([False, True, False, False, True, False, False,
                          False])
  seen = set()
  for seed in range(50):
    parent = np.asarray(pbt.diverged_parents(jax.random.PRNGKey(seed), fitness,
                                             diverged, config))
    # Healthy members are their own parents.
    np.testing.assert_array_equal(parent[~np.asarray(diverged)],
                                  np.flatnonzero(~np.asarray(diverged)))
    seen.update(parent[np.asarray(diverged)].tolist())
  # floor(0.25 * 8) = 2: the two fittest healthy members, 2 (5.0), 5 (4.0).
  assert seen == {2, 5}
  # Without any fitness yet, any healthy member may be the parent, never a
  # diverged one.
  none = jnp.full(8, jnp.nan)
  for seed in range(50):
    parent = np.asarray(pbt.diverged_parents(jax.random.PRNGKey(seed), none,
                                             diverged, config))
    assert not np.asarray(diverged)[parent[[1, 4]]].any()


def test_replace_diverged_copies_a_good_member_and_explores(agent):
  n = 4
  learner = PopulationLearner(agent)
  hparams = population_hparams(agent, n, critic_lr=[1e-4, 2e-4, 1e3, 4e-4])
  state = learner.init(jax.random.PRNGKey(1), hparams)
  config = pbt.PBTConfig(fraction=0.25)
  space = agents.get('td3').default_search_space
  fitness = jnp.asarray([10.0, 30.0, 5.0, 20.0])
  diverged = np.arange(n) == BAD
  result = pbt.replace_diverged(jax.random.PRNGKey(3), state, hparams,
                                fitness, diverged, config, space)
  parent = np.asarray(result.parent)
  assert parent[BAD] == 1 and np.asarray(result.replaced).tolist() == list(
      diverged)
  # The copy holds the parent's networks (keys are refreshed).
  chex.assert_trees_all_equal(rows(result.state.policy, BAD),
                              rows(state.policy, 1))
  chex.assert_trees_all_equal(rows(result.state.critic, BAD),
                              rows(state.critic, 1))
  for i in (0, 1, 3):
    chex.assert_trees_all_equal(rows(result.state, i), rows(state, i))
  # The diverging learning rate is gone: the parent's, perturbed.
  new_lr = float(result.hparams.critic_lr[BAD])
  # ~2e-4 against 1e3: approx's default 1e-6 relative is far below the gap.
  assert new_lr != pytest.approx(1e3)
  assert 2e-4 / 1.3 <= new_lr <= 2e-4 * 1.3 or new_lr in np.asarray(
      hparams.critic_lr)


class OneBadMember(PBT):
  """PBT whose member 2 starts with learning rates of 1e3."""

  def initial_hparams(self, key, agent, population_size):
    hparams = super().initial_hparams(key, agent, population_size)
    lr = hparams.critic_lr.at[BAD].set(1e3)
    return hparams._replace(critic_lr=lr,
                            policy_lr=hparams.policy_lr.at[BAD].set(1e3))


@pytest.mark.slow
def test_pbt_replaces_a_diverging_member_and_the_run_goes_on(tmp_path):
  # HalfCheetah's larger observations make the first Adam steps of 1e3
  # overflow at once; on Pendulum the same member's critic loss explodes
  # (~1e22) but stays finite, and PBT's ordinary exploit handles it.
  config = PBTRunConfig(
      env='HalfCheetah-v5', population_size=4, env_steps=1200,
      warmup_steps=200,
      hidden_sizes=(16, 16), batch_size=16, steps_per_call=10,
      eval_every=300, eval_episodes=1, num_actors=1, replay_capacity=5000,
      ready_after=400, progress=False, run_dir=str(tmp_path / 'run'))
  result = run(config, OneBadMember(config))
  # Replaced once: the call already queued when its flags were read ran the
  # same diverging member, and must not replace its healthy copy again.
  assert result.diverged == 1
  events = pbt.read_lineage(tmp_path / 'run' / 'lineage.jsonl')
  diverged = [e for e in events if e.get('reason') == 'diverged']
  assert len(diverged) == 1 and diverged[0]['member'] == BAD
  assert diverged[0]['parent'] != BAD
  # 1e3 is exact in float32 and JSON writes a float's repr: exactly equal.
  assert diverged[0]['old_hparams']['critic_lr'] == 1e3
  # The learning rate that diverged is gone; every member ends finite.
  assert result.hparams[BAD]['critic_lr'] < 1.0
  assert np.isfinite(result.final_returns).all()
