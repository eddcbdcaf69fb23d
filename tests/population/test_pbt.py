"""PBT exploit/explore on a stacked TD3 population, fitness and lineage."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from fastpbrl import agents
from fastpbrl import search_space as ss
from fastpbrl.learner import population_hparams
from fastpbrl.population import pbt
from tests import numerics
from tests.population.conftest import pendulum_spec

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 10
SPACE = agents.get('td3').default_search_space


def explored(dist, x, factor):
  """Reference explore of one value: ``x * factor`` mirrored back into the
  bounds, in log space for LogUniform, of ``1 - x`` for a Discount."""
  x = np.asarray(x, np.float64)

  def mirror(y, lo, hi):
    return np.where(y > hi, 2 * hi - y, np.where(y < lo, 2 * lo - y, y))

  if isinstance(dist, ss.Discount):
    lo, hi = np.log(1 - dist.high), np.log(1 - dist.low)
    return 1 - np.exp(mirror(np.log((1 - x) * factor), lo, hi))
  if isinstance(dist, ss.LogUniform):
    return np.exp(mirror(np.log(x * factor), np.log(dist.low),
                         np.log(dist.high)))
  return mirror(x * factor, dist.low, dist.high)


def leaves(tree):
  return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope='module')
def population(td3_population):
  return td3_population


def test_truncation_copies_the_whole_state(population):
  state, hparams = population
  fitness = np.array([5., 1., 9., 3., 0., 7., 2., 8., 6., 4.], np.float32)
  config = pbt.PBTConfig(fraction=0.3, resample_probability=0.0)
  out = pbt.exploit_explore(jax.random.PRNGKey(0), state, hparams, fitness,
                            np.ones(N, bool), config, SPACE)
  replaced, parent = np.asarray(out.replaced), np.asarray(out.parent)
  order = np.argsort(fitness)
  # The bottom 30% exactly are replaced, each by one of the top 30%.
  np.testing.assert_array_equal(np.flatnonzero(replaced), np.sort(order[:3]))
  assert set(parent[replaced]) <= set(order[-3:])
  np.testing.assert_array_equal(parent[~replaced], np.flatnonzero(~replaced))

  # Per-member reference, leaf by leaf.
  new_fields, old_fields = out.state._asdict(), state._asdict()
  for name in state._fields:
    for new, old in zip(leaves(new_fields[name]), leaves(old_fields[name])):
      for i in range(N):
        if not replaced[i]:
          np.testing.assert_array_equal(new[i], old[i], err_msg=name)
        elif name == 'key':
          assert not np.array_equal(new[i], old[parent[i]])
          assert not np.array_equal(new[i], old[i])
        else:
          np.testing.assert_array_equal(new[i], old[parent[i]], err_msg=name)
  # Two copies of the same parent get different keys.
  keys = np.asarray(out.state.key)[replaced]
  assert len({tuple(k) for k in keys}) == len(keys)

  # Hyperparameters: the parent's, perturbed by 0.8 or 1.2 (then reflected)
  # on the space's fields, copied as they are elsewhere.
  for name in hparams._fields:
    new, old = np.asarray(getattr(out.hparams, name)), np.asarray(
        getattr(hparams, name))
    np.testing.assert_array_equal(new[~replaced], old[~replaced])
    src = old[parent[replaced]]
    if name in SPACE.fields:
      dist = SPACE[name]
      # float32 explore: ~8 ops in log space, where |log x| <= 11 (x, 1 - gamma
      # >= 3e-5), relative after exp: rule 1, k = 100 (the other factor: 50%).
      tol = numerics.rounding_rtol(100)
      ok = (np.isclose(new[replaced], explored(dist, src, 0.8), rtol=tol,
                       atol=0)
            | np.isclose(new[replaced], explored(dist, src, 1.2), rtol=tol,
                         atol=0))
      assert ok.all(), name
    else:
      np.testing.assert_array_equal(new[replaced], src)


def test_reset_optimizers(population, td3_agent):
  state, hparams = population
  fitness = np.arange(N, dtype=np.float32)
  config = pbt.PBTConfig(reset_optimizers=True)
  out = pbt.exploit_explore(jax.random.PRNGKey(3), state, hparams, fitness,
                            np.ones(N, bool), config, SPACE)
  replaced = np.asarray(out.replaced)
  assert replaced.sum() == 3
  for i in range(N):
    new_i = jax.tree.map(lambda x: x[i], out.state)
    old_i = jax.tree.map(lambda x: x[i], state)
    if replaced[i]:
      # A fresh Adam state for the copied parameters (count 0, moments 0).
      fresh = optax.adam(1.0).init(new_i.policy)
      chex.assert_trees_all_equal(new_i.policy_opt, fresh)
      chex.assert_trees_all_equal(new_i.critic_opt,
                                  optax.adam(1.0).init(new_i.critic))
      p = int(out.parent[i])
      chex.assert_trees_all_equal(new_i.critic,
                                  jax.tree.map(lambda x: x[p], state.critic))
    else:
      chex.assert_trees_all_equal(new_i.policy_opt, old_i.policy_opt)
  with pytest.raises(ValueError, match='optimizer_fields.*nope'):
    pbt.exploit_explore(jax.random.PRNGKey(3), state, hparams, fitness,
                        np.ones(N, bool),
                        pbt.PBTConfig(reset_optimizers=True,
                                      optimizer_fields=('nope',)), SPACE)


def test_ready_guards_and_nan(population):
  state, hparams = population
  fitness = np.arange(N, dtype=np.float32)
  ready = np.zeros(N, bool)
  ready[[0, 5]] = True
  out = pbt.exploit_explore(jax.random.PRNGKey(0), state, hparams, fitness,
                            ready, pbt.PBTConfig(), SPACE)
  np.testing.assert_array_equal(np.flatnonzero(out.replaced), [0])

  all_ready = np.ones(N, bool)
  # Bottom {0, 1, 2} (fitness 0, 1, 2), top {7, 8, 9}: the largest gap is 9.
  out = pbt.exploit_explore(jax.random.PRNGKey(1), state, hparams, fitness,
                            all_ready, pbt.PBTConfig(min_gap_absolute=9.5),
                            SPACE)
  assert not np.asarray(out.replaced).any()
  seen = np.zeros(3, int)
  for seed in range(10):
    out = pbt.exploit_explore(jax.random.PRNGKey(seed), state, hparams,
                              fitness, all_ready,
                              pbt.PBTConfig(min_gap_absolute=7.5), SPACE)
    replaced, parent = np.asarray(out.replaced), np.asarray(out.parent)
    seen += replaced[:3]
    # Member 0 needs parent 8 or 9, member 1 parent 9, member 2 never.
    np.testing.assert_array_equal(
        replaced[:3], [parent[0] in (8, 9), parent[1] == 9, False])
    assert not replaced[3:].any()
  assert seen[0] > 0 and seen[1] > 0  # the guard let the large gaps through
  # Relative gap on large fitness: 100.. 109, gaps < 10% of |fitness|.
  out = pbt.exploit_explore(jax.random.PRNGKey(1), state, hparams,
                            fitness + 100.0, all_ready,
                            pbt.PBTConfig(min_gap_relative=0.1), SPACE)
  assert not np.asarray(out.replaced).any()
  # Not evaluated (NaN): never replaced, never a parent.
  nan_fit = fitness.copy()
  nan_fit[[0, 9]] = np.nan
  for seed in range(5):
    out = pbt.exploit_explore(jax.random.PRNGKey(seed), state, hparams,
                              nan_fit, all_ready, pbt.PBTConfig(), SPACE)
    replaced, parent = np.asarray(out.replaced), np.asarray(out.parent)
    assert not replaced[[0, 9]].any() and 9 not in parent[replaced]


def test_tournament(population):
  state, hparams = population
  config = pbt.PBTConfig(exploit='tournament')
  rng = np.random.default_rng(0)
  step = jax.jit(pbt.select_parents, static_argnums=3)
  counts = np.zeros(N)
  for seed in range(200):
    fitness = rng.permutation(N).astype(np.float32)
    parent, replaced = map(np.asarray, step(jax.random.PRNGKey(seed),
                                            fitness, np.ones(N, bool), config))
    assert np.all(parent[replaced] != np.flatnonzero(replaced))
    assert np.all(fitness[parent[replaced]] > fitness[replaced])
    np.testing.assert_array_equal(parent[~replaced], np.flatnonzero(~replaced))
    assert not replaced[np.argmax(fitness)]
    assert replaced[np.argmin(fitness)]  # everyone beats the worst
    counts += replaced[np.argsort(fitness)]  # by rank, worst first
  # Rank j (0 = worst) loses to a uniform opponent with probability
  # (N - 1 - j) / (N - 1).
  p = (N - 1 - np.arange(N)) / (N - 1)
  # Statistical: a rate over 200 draws, sd sqrt(p (1 - p) / 200) <= 0.035;
  # 5 sd (0 at the ends, which are certain).
  assert np.all(np.abs(counts / 200 - p) <= 5 * np.sqrt(p * (1 - p) / 200)), (
      counts / 200, p)
  # The full step copies state for tournament too.
  fitness = np.arange(N, dtype=np.float32)
  out = pbt.exploit_explore(jax.random.PRNGKey(0), state, hparams, fitness,
                            np.ones(N, bool), config, SPACE)
  i = int(np.flatnonzero(out.replaced)[0])
  p = int(out.parent[i])
  chex.assert_trees_all_equal(jax.tree.map(lambda x: x[i], out.state.policy),
                              jax.tree.map(lambda x: x[p], state.policy))


def welch_reference(x, y):
  """scipy's two-sided Welch p-value of two rows, NaN dropped."""
  x, y = x[np.isfinite(x)], y[np.isfinite(y)]
  return scipy.stats.ttest_ind(x, y, equal_var=False).pvalue


# scipy warns of cancellation for the rows without spread on one side,
# whose variance it computes as the rounding of identical values (~1e-32):
# far below the other side's, so the p-values compare all the same.
@pytest.mark.filterwarnings('ignore:Precision loss occurred')
def test_welch_p_value_matches_scipy():
  rng = np.random.default_rng(0)
  x = rng.normal(rng.normal(0, 2, (200, 1)), rng.uniform(0.1, 3, (200, 1)),
                 (200, 10))
  y = rng.normal(rng.normal(0, 2, (200, 1)), rng.uniform(0.1, 3, (200, 1)),
                 (200, 10))
  x[:50, 6:] = np.nan  # some rows shorter: a window not yet full
  y[25:75, 3:] = np.nan
  y[190:] = y[190:, :1]  # no spread on one side: df is the other's n - 1
  got = np.asarray(pbt.welch_p_value(jnp.asarray(x, jnp.float32),
                                     jnp.asarray(y, jnp.float32)))
  want = np.array([welch_reference(a, b) for a, b in zip(x, y)])
  # float32 moments of 10 values of order 1 (relative error ~1e-6) and
  # float32's incomplete beta (~1e-5 relative): far inside 1e-4.
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
  # Returns of order 1e10: the same p-values (no variance is squared).
  big = np.asarray(pbt.welch_p_value(jnp.asarray(x * 1e10, jnp.float32),
                                     jnp.asarray(y * 1e10, jnp.float32)))
  np.testing.assert_allclose(big, want, rtol=1e-4, atol=1e-6)
  assert (want < 0.05).sum() > 50 and (want > 0.05).sum() > 50  # both sides


def test_welch_p_value_without_spread_or_with_one_value():
  nan = np.nan
  x = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0], [1.0, nan, nan],
                 [1.0, 2.0, nan]])
  y = jnp.array([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0], [0.0, 5.0, 9.0],
                 [0.0, nan, nan]])
  p = np.asarray(pbt.welch_p_value(x, y))
  np.testing.assert_array_equal(p[:2], [0.0, 1.0])
  assert np.isnan(p[2:]).all()


def test_ttest_copies_only_a_member_better_by_welchs_test():
  n, config = 10, pbt.PBTConfig(exploit='ttest')
  rng = np.random.default_rng(0)
  step = jax.jit(pbt.select_parents, static_argnums=3)
  index = np.arange(n)
  decided = 0
  for seed in range(30):
    samples = rng.normal(rng.normal(0, 1, (n, 1)), 1.0, (n, 10))
    samples[rng.random(n) < 0.2, 5:] = np.nan
    samples[seed % n, 1:] = np.nan  # one member with a single value
    fitness = np.nanmean(samples, axis=1).astype(np.float32)
    ready = rng.random(n) < 0.8
    key = jax.random.PRNGKey(seed)
    parent, replaced = map(np.asarray, step(key, fitness, ready, config,
                                            samples))
    # The member each one drew (the docstring's uniform other member),
    # checked against the tournament's copies from the same key.
    drawn = (index + np.asarray(jax.random.randint(key, (n,), 1, n))) % n
    tour_parent, tour_replaced = map(np.asarray, step(
        key, fitness, ready, pbt.PBTConfig(exploit='tournament')))
    np.testing.assert_array_equal(tour_parent[tour_replaced],
                                  drawn[tour_replaced])
    for i in range(n):
      p_value = welch_reference(samples[drawn[i]], samples[i])
      if abs(p_value - 0.05) < 1e-3:
        continue  # float32 against float64 at the threshold
      want = bool(ready[i] and fitness[drawn[i]] > fitness[i]
                  and p_value < 0.05)
      assert replaced[i] == want, (seed, i, p_value)
      assert parent[i] == (drawn[i] if want else i)
      decided += want
  assert 20 < decided < 150  # copies made and refused alike


def test_ttest_needs_the_samples():
  with pytest.raises(ValueError, match='samples'):
    pbt.select_parents(jax.random.PRNGKey(0), jnp.zeros(4), jnp.ones(4, bool),
                       pbt.PBTConfig(exploit='ttest'))


def test_explore_stays_in_bounds(population):
  state, hparams = population
  config = pbt.PBTConfig(fraction=0.5, resample_probability=0.25)
  rule = pbt.CompiledExploitExplore(config, SPACE)
  rng = np.random.default_rng(1)
  for seed in range(20):
    out = rule(jax.random.PRNGKey(seed), state, hparams,
               rng.standard_normal(N), np.ones(N, bool))
    hparams = out.hparams
    assert np.asarray(ss.within_bounds(SPACE, hparams)).all()
  assert rule.compilations == 1


def test_compiles_once_across_values(population):
  state, hparams = population
  rule = pbt.CompiledExploitExplore(pbt.PBTConfig(), SPACE)
  rng = np.random.default_rng(2)
  for seed in range(4):
    out = rule(jax.random.PRNGKey(seed), state, hparams,
               rng.standard_normal(N).astype(np.float32),
               rng.uniform(size=N) < 0.7)
    state, hparams = out.state, out.hparams
  assert rule.compilations == 1


def test_ready_mask():
  config = pbt.PBTConfig(ready_after=100, no_mutation_before=500)
  steps = jnp.array([450, 600, 650, 700])
  last = jnp.array([0, 550, 500, 600])
  np.testing.assert_array_equal(pbt.ready_mask(steps, last, config),
                                [False, False, True, True])


@pytest.mark.parametrize('kwargs, message', [
    (dict(fraction=0.6), 'fraction'),
    (dict(fraction=0.0), 'fraction'),
    (dict(exploit='roulette'), 'exploit'),
    (dict(exploit='ttest', significance=0.0), 'significance'),
    (dict(exploit='ttest', significance=1.0), 'significance'),
    (dict(resample_probability=2.0), 'resample_probability'),
    (dict(perturb_factors=(0.8, -1.0)), 'perturb factors'),
    (dict(min_gap_relative=-0.1), 'min_gap_relative'),
])
def test_config_validation(kwargs, message):
  with pytest.raises(ValueError, match=message):
    pbt.PBTConfig(**kwargs)


def test_fitness_tracker():
  tracker = pbt.FitnessTracker(3, window=10)
  for r in range(15):
    tracker.record(0, float(r))
  tracker.record(1, 2.0)
  fit = tracker.fitness()
  assert fit[0] == np.mean(np.arange(5, 15)) and fit[1] == 2.0
  assert np.isnan(fit[2])
  tracker.on_exploit(np.array([0, 1, 0]), np.array([False, False, True]))
  assert tracker.fitness()[2] == fit[0]
  tracker.reset([0])
  assert np.isnan(tracker.fitness()[0])
  saved = tracker.history()
  assert saved == [[], [2.0], [float(r) for r in range(5, 15)]]
  restored = pbt.FitnessTracker(3, window=10)
  restored.set_history(saved)
  np.testing.assert_array_equal(restored.fitness(), tracker.fitness())
  true_obj = pbt.FitnessTracker(1, use_true_objective=True)
  true_obj.record(0, episode_return=100.0, true_objective=1.0)
  assert true_obj.fitness()[0] == 1.0
  with pytest.raises(ValueError, match='true_objective'):
    true_obj.record(0, 5.0)


def test_lineage_and_schedule(tmp_path, population):
  state, hparams = population
  n = 6
  state = jax.tree.map(lambda x: x[:n], state)
  hparams = jax.tree.map(lambda x: x[:n], hparams)
  path = tmp_path / 'lineage.jsonl'
  lineage = pbt.Lineage(path)
  lineage.record_init(0, hparams)
  rule = pbt.CompiledExploitExplore(pbt.PBTConfig(fraction=0.5), SPACE)

  def rows(h):
    return [{k: float(np.asarray(v)[i]) for k, v in h._asdict().items()}
            for i in range(n)]

  # Forward reference: each member's schedule, carried along with copies.
  expected = [[(0, r)] for r in rows(hparams)]
  origin = list(range(n))  # the initial member each one descends from
  rng = np.random.default_rng(3)
  total = 0
  for t, step in enumerate((100, 200, 300, 400, 500)):
    fitness = rng.standard_normal(n).astype(np.float32)
    out = rule(jax.random.PRNGKey(t), state, hparams, fitness,
               np.ones(n, bool))
    written = lineage.record(step, out, hparams, fitness)
    replaced, parent = np.asarray(out.replaced), np.asarray(out.parent)
    assert written == replaced.sum()
    total += written
    new_rows = rows(out.hparams)
    expected = [expected[parent[i]] + [(step, new_rows[i])] if replaced[i]
                else expected[i] for i in range(n)]
    origin = [origin[parent[i]] if replaced[i] else origin[i]
              for i in range(n)]
    # The file's last events are exactly this call's replacements.
    events = pbt.read_lineage(path)[-written:] if written else []
    assert [e['member'] for e in events] == list(np.flatnonzero(replaced))
    for e in events:
      assert e['step'] == step and e['parent'] == parent[e['member']]
      assert e['new_hparams'] == new_rows[e['member']]
      assert e['old_hparams'] == rows(hparams)[e['member']]
      # A float32 value as a Python float through JSON: exact.
      assert e['fitness'] == float(fitness[e['member']])
    state, hparams = out.state, out.hparams

  events = pbt.read_lineage(path)
  assert len(events) == n + total
  assert max(len(s) for s in expected) >= 3  # copies of copies happened
  for i in range(n):
    got = pbt.schedule(path, i)
    assert [s for s, _ in got] == [s for s, _ in expected[i]]
    for (_, a), (_, b) in zip(got, expected[i]):
      assert a == b  # float32 values as Python floats through JSON: exact
  # The schedule as of an earlier step.
  initial = rows(population[1])[:n]
  assert pbt.schedule(events, 0, until_step=0) == [(0, initial[0])]
  with pytest.raises(ValueError, match='no init event for member 7'):
    pbt.schedule(events, 7)
  assert pbt.founders(path) == {i: (origin[i], 0) for i in range(n)}
  assert len(set(origin)) < n  # some lineages ended


def test_founders_reads_one_decision_as_simultaneous():
  def init(m, step, event='init'):
    return {'event': event, 'member': m, 'step': step}

  def copy(m, parent, step, **extra):
    return {'event': 'exploit', 'member': m, 'parent': parent, 'step': step,
            **extra}

  events = [init(m, 0) for m in range(4)] + [
      # One decision: 1 copies 3 while 2 copies 1 (written in member
      # order); 2 takes 1's line as it was before the decision.
      copy(1, 3, 50), copy(2, 1, 50),
      # The next: 0 copies 1 while 1 copies 2.
      copy(0, 1, 100), copy(1, 2, 100),
      # A diverged replacement, then a decision at the same step: the
      # decision reads the population after the replacement.
      copy(3, 2, 200, reason='diverged'), copy(2, 3, 200),
      init(1, 300, event='reset')]  # a slot restarted from scratch
  assert pbt.founders(events) == {0: (3, 0), 1: (1, 300), 2: (1, 0),
                                  3: (1, 0)}
  with pytest.raises(ValueError, match='member 1 copies member 5'):
    pbt.founders(events + [copy(1, 5, 400)])


def test_sac_state_copied_with_temperature():
  sac = pytest.importorskip('fastpbrl.agents.sac')
  agent = sac.make_agent(pendulum_spec(), sac.SACConfig(hidden_sizes=(4,)))
  n = 4
  hparams = population_hparams(agent, n)
  state = jax.jit(jax.vmap(agent.init))(
      jax.random.split(jax.random.PRNGKey(0), n), hparams)
  state = state._replace(log_alpha=jnp.arange(n, dtype=jnp.float32),
                         step=jnp.arange(n, dtype=jnp.int32))
  fitness = np.array([3., 0., 2., 1.], np.float32)  # member 1 is the worst
  out = pbt.CompiledExploitExplore(
      pbt.PBTConfig(fraction=0.25, reset_optimizers=True),
      agents.get('sac').default_search_space)(
          jax.random.PRNGKey(0), state, hparams, fitness, np.ones(n, bool))
  np.testing.assert_array_equal(out.replaced, [False, True, False, False])
  assert int(out.parent[1]) == 0  # the best
  assert float(out.state.log_alpha[1]) == 0.0 and int(out.state.step[1]) == 0
  chex.assert_trees_all_equal(
      jax.tree.map(lambda x: x[1], out.state.critic),
      jax.tree.map(lambda x: x[0], state.critic))
  # alpha_opt is found by its '_opt' suffix and reset (count and moments).
  assert all(np.all(np.asarray(x)[1] == 0)
             for x in jax.tree.leaves(out.state.alpha_opt))
