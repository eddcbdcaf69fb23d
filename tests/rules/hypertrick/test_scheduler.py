"""HyperTrick: the phase rule, its eviction rate, and slot resets."""

import heapq
import math

import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.core import search_space as ss
from fastpbrl.rules.hypertrick import scheduler as ht

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric


def simulate(config, num_slots, rng, metric=None):
  """Asynchronous run: each slot's phase takes a random time; the slot that
  finishes first reports next. Returns the scheduler's state."""
  metric = metric or (lambda worker, phase: rng.standard_normal())
  sched = ht.start(config, num_slots, num_hparams=1)
  heap = []
  for slot, worker in enumerate(sched.slot_worker):
    if worker >= 0:
      sched = ht.set_hparams(sched, worker, [worker])
      heapq.heappush(heap, (rng.exponential(), slot))
  while heap:
    now, slot = heapq.heappop(heap)
    worker = int(sched.slot_worker[slot])
    sched, report = ht.report(config, sched, slot,
                              metric(worker, int(sched.slot_phase[slot])))
    if report.decision == ht.CONTINUE:
      heapq.heappush(heap, (now + rng.exponential(), slot))
    elif report.new_worker is not None:
      sched = ht.set_hparams(sched, report.new_worker, [report.new_worker])
      heapq.heappush(heap, (now + rng.exponential(), slot))
  assert ht.done(config, sched)
  return sched


def binomial_sds(config):
  """Standard deviations of the eviction rates ``[P - 1]``, of the numbers of
  workers reaching each phase ``[P]`` and of the completion rate, to first
  order, for i.i.d. metrics: in phase ``p`` the ``E[W_p] r / q`` reporters
  after the first ``M_p`` are each below the running ``q``-quantile with
  probability ``q``, so the evictions are ``Binomial(E[W_p] r / q, q)``, and
  phase ``j``'s are carried into phase ``p > j`` with weight ``(1 - r)^(p - 1
  - j)``. (Measured over 100 seeds: at most 10% above these.)"""
  r, q, num = config.eviction_rate, config.quantile, config.num_phases
  workers = np.array([ht.expected_workers(config, p)
                      for p in range(1, num + 1)])
  evicted_sd = np.sqrt(workers[:-1] * r * (1 - q))
  carry = np.array([[(1 - r) ** (p - 1 - j) if p > j else 0.0
                     for j in range(1, num)] for p in range(1, num + 1)])
  reached_sd = np.sqrt(carry ** 2 @ evicted_sd ** 2)
  completion_sd = math.sqrt(np.sum((carry.sum(0) * evicted_sd) ** 2)) / (
      config.num_workers * num)
  return evicted_sd / workers[:-1], reached_sd, completion_sd


def test_eviction_rate_matches_target():
  config = ht.HyperTrickConfig(num_workers=3000, num_phases=4,
                               eviction_rate=0.25)
  sched = simulate(config, num_slots=40, rng=np.random.default_rng(0))
  assert int(sched.launched) == 3000
  rates = ht.eviction_rates(config, sched)
  rate_sd, reached_sd, completion_sd = binomial_sds(config)
  # Statistical, 5 sd (binomial_sds): 0.032 to 0.043.
  assert np.all(np.abs(rates - 0.25) <= 5 * rate_sd), (rates, rate_sd)
  # Eq. 1: E[W_p] = W (1 - r)^(p - 1) workers reach phase p.
  reached = sched.reported[1:]
  expected = [ht.expected_workers(config, p) for p in range(1, 5)]
  # Statistical, 5 sd (binomial_sds): 0 (all start) to 111 workers (9%).
  assert np.all(np.abs(reached - expected) <= 5 * reached_sd), (reached,
                                                                expected)
  # Observed completion rate against eq. 9. Statistical, 5 sd (binomial_sds):
  # 0.023, 3% of the rate.
  observed = reached.sum() / (config.num_workers * config.num_phases)
  assert observed == pytest.approx(ht.expected_completion_rate(config),
                                   abs=5 * completion_sd)


def test_eviction_rate_other_settings():
  config = ht.HyperTrickConfig(num_workers=2000, num_phases=3,
                               eviction_rate=0.1, quantile=0.3)
  sched = simulate(config, num_slots=16, rng=np.random.default_rng(1))
  # Statistical, 5 sd (binomial_sds): 0.030 and 0.031.
  rates, rate_sd = ht.eviction_rates(config, sched), binomial_sds(config)[0]
  assert np.all(np.abs(rates - 0.1) <= 5 * rate_sd), (rates, rate_sd)


def test_first_reporters_continue_then_lower_half_stops():
  config = ht.HyperTrickConfig(num_workers=10, num_phases=3,
                               eviction_rate=0.25)
  assert ht.min_continuing(config, 1) == 5  # floor(10 * 0.5)
  assert ht.min_continuing(config, 2) == 3  # floor(10 * 0.75 * 0.5)
  sched = ht.start(config, num_slots=10)

  def report(slot, metric):
    nonlocal sched
    sched, result = ht.report(config, sched, slot, metric)
    return result

  # The first five reporters of phase 1 continue, however bad.
  for slot, m in enumerate([-100., -50., 0., 1., 2.]):
    assert report(slot, m).decision == ht.CONTINUE
  # Then Worker Selection Mode: below the median of what was reported stops.
  # median(-100, -50, 0, 1, 2) = 0
  r = report(5, -1.0)
  assert r.decision == ht.TERMINATE and r.new_worker is None  # W launched
  assert sched.slot_worker[5] == -1 and sched.slot_phase[5] == 0
  # median(-100, -50, -1, 0, 1, 2) = -0.5
  assert report(6, -0.4).decision == ht.CONTINUE
  assert report(7, 5.0).decision == ht.CONTINUE
  # A diverged worker (NaN) is terminated in Worker Selection Mode, and the
  # quantile stays defined with it in the list.
  assert report(8, float('nan')).decision == ht.TERMINATE
  # median(-inf, -100, -50, -1, -0.4, 0, 1, 2, 5) = -0.4
  assert report(9, -0.5).decision == ht.TERMINATE
  # Phase 1's metrics, ascending, the NaN recorded as -inf: exact (stored
  # as reported).
  np.testing.assert_array_equal(
      ht.phase_metrics(sched, 1),
      [-np.inf, -100, -50, -1, -0.5, -0.4, 0, 1, 2, 5])
  assert sched.reported[1] == 10 and sched.terminated[1] == 3
  assert ht._quantile([-np.inf, 1.0], 0.5) == -np.inf
  assert ht._quantile([-np.inf, 1.0, 3.0], 0.5) == 1.0
  with pytest.raises(ValueError, match='slot 5'):
    report(5, 0.0)


def test_report_leaves_the_state_it_was_given_unchanged():
  config = ht.HyperTrickConfig(num_workers=4, num_phases=2)
  sched = ht.start(config, num_slots=2, num_hparams=1)
  sched, _ = ht.report(config, sched, 0, 1.0)
  kept = jax.tree.map(np.copy, sched)
  after, result = ht.report(config, sched, 0, 2.0)  # completes: a new worker
  assert result.decision == ht.COMPLETE and result.new_worker == 2
  jax.tree.map(np.testing.assert_array_equal, sched, kept)
  assert after.slot_worker.tolist() == [2, 1] and int(after.launched) == 3
  # The same report on the same state decides the same.
  assert ht.report(config, sched, 0, 2.0)[1] == result


def test_a_phase_with_no_unconditional_reporter_keeps_its_first():
  # W = 2, r = 0.25: M_1 = floor(2 * 0.5) = 1 but M_2 = floor(2 * 0.75 *
  # 0.5) = 0: the first phase-2 reporter has nothing to be compared with
  # (no quantile), nor, on one slot, the first of phase 3.
  config = ht.HyperTrickConfig(num_workers=2, num_phases=4)
  assert ht.min_continuing(config, 2) == ht.min_continuing(config, 3) == 0
  sched = ht.start(config, num_slots=1)
  decisions = []
  for metric in (1.0, 1.0, 1.0):
    sched, result = ht.report(config, sched, 0, metric)
    decisions.append(result.decision)
  assert decisions == [ht.CONTINUE] * 3 and sched.slot_phase[0] == 4


def test_slots_restart_until_all_workers_launched_and_best():
  config = ht.HyperTrickConfig(num_workers=6, num_phases=2, eviction_rate=0.2)
  sched = ht.start(config, num_slots=2, num_hparams=1)
  assert sched.slot_worker.tolist() == [0, 1]
  for w in (0, 1):
    sched = ht.set_hparams(sched, w, [0.1 * (w + 1)])
  sched, result = ht.report(config, sched, 0, 1.0)
  assert result.decision == ht.CONTINUE
  sched, done = ht.report(config, sched, 0, 3.0)  # last phase
  assert done.decision == ht.COMPLETE and done.new_worker == 2
  assert sched.slot_worker[0] == 2 and sched.slot_phase[0] == 1
  best = ht.best(sched)
  assert best.worker == 0 and best.metric == 3.0 and best.phase == 2
  # As set: exact.
  np.testing.assert_array_equal(best.hparams, [0.1])
  assert ht.best(ht.start(config, 2, 1)._replace(
      best_worker=np.asarray(2))).hparams is None  # never set


def test_completion_rates_match_table_1():
  # Table 1: r = 25%; P = 10 gives E[rho] = 37.75%, min 18.87%; P = 5 gives
  # 61.02% and 30.51%.
  for phases, mean, low in ((10, 0.3775, 0.1887), (5, 0.6102, 0.3051)):
    config = ht.HyperTrickConfig(num_workers=10 ** 6, num_phases=phases,
                                 eviction_rate=0.25)
    # Table 1 prints percentages to 2 decimals: within 5e-5.
    assert ht.expected_completion_rate(config) == pytest.approx(mean, abs=5e-5)
    assert ht.min_completion_rate(config) == pytest.approx(low, abs=5e-5)


@pytest.mark.parametrize('kwargs, message', [
    (dict(eviction_rate=0.5), 'eviction_rate'),
    (dict(eviction_rate=0.0), 'eviction_rate'),
    (dict(quantile=1.5), 'quantile'),
    (dict(num_phases=0), 'num_phases'),
])
def test_config_validation(kwargs, message):
  args = dict(num_workers=10, num_phases=3)
  args.update(kwargs)
  with pytest.raises(ValueError, match=message):
    ht.HyperTrickConfig(**args)


def test_reset_members(td3_agent, td3_population):
  state, hparams = td3_population
  n = 10
  space = agents.get('td3').default_search_space
  reset = np.zeros(n, bool)
  reset[[1, 4]] = True
  new_state, new_hparams = jax.jit(
      ht.reset_members, static_argnames=('init', 'space'))(
          jax.random.PRNGKey(3), state, hparams, reset, init=td3_agent.init,
          space=space)
  member = lambda tree, i: jax.tree.map(lambda x: np.asarray(x[i]), tree)
  for i in range(n):
    new, old = member(new_state, i), member(state, i)
    if not reset[i]:
      jax.tree.map(np.testing.assert_array_equal, new, old)
      jax.tree.map(np.testing.assert_array_equal, member(new_hparams, i),
                   member(hparams, i))
      continue
    # A fresh member: step 0, zero optimizer moments, targets = online nets,
    # parameters unlike the old ones, hyperparameters from the prior.
    assert new.step == 0
    assert all(np.all(x == 0) for x in jax.tree.leaves(new.policy_opt))
    jax.tree.map(np.testing.assert_array_equal, new.target_policy, new.policy)
    # A fresh init against the old one (offset by 0.5 i): weights apart by
    # ~0.1 or more, far beyond allclose's rtol of 1e-5.
    assert not np.allclose(jax.tree.leaves(new.policy)[-1],
                           jax.tree.leaves(old.policy)[-1])
    changed = [f for f in space.fields
               if getattr(new_hparams, f)[i] != getattr(hparams, f)[i]]
    assert len(changed) == len(space.fields)
    np.testing.assert_array_equal(new_hparams.tau[i], hparams.tau[i])
  assert np.asarray(ss.within_bounds(space, new_hparams))[reset].all()
  # The two reset slots do not share a fresh init: two independent inits'
  # weights differ by ~0.1, far beyond allclose's rtol of 1e-5.
  assert not np.allclose(jax.tree.leaves(new_state.policy)[-1][1],
                         jax.tree.leaves(new_state.policy)[-1][4])
