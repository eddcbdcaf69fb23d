"""HyperTrick: the phase rule, its eviction rate, and slot resets."""

import heapq
import math

import jax
import numpy as np
import pytest

from fastpbrl.population import hypertrick as ht
from fastpbrl.population import search_space as ss

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric


def simulate(config, num_slots, rng, metric=None):
  """Asynchronous run: each slot's phase takes a random time; the slot that
  finishes first reports next. Returns the scheduler."""
  metric = metric or (lambda worker, phase: rng.standard_normal())
  sched = ht.HyperTrick(config, num_slots)
  heap = []
  for slot, worker in enumerate(sched.start()):
    if worker is not None:
      sched.set_hparams(worker, {'id': worker})
      heapq.heappush(heap, (rng.exponential(), slot))
  while heap:
    now, slot = heapq.heappop(heap)
    worker = sched.slot_worker[slot]
    report = sched.report(slot, metric(worker, sched.worker_phase[worker]))
    if report.decision == ht.CONTINUE:
      heapq.heappush(heap, (now + rng.exponential(), slot))
    elif report.new_worker is not None:
      sched.set_hparams(report.new_worker, {'id': report.new_worker})
      heapq.heappush(heap, (now + rng.exponential(), slot))
  assert sched.done
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
  assert sched.launched == 3000
  rates = sched.eviction_rates()
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
  rates, rate_sd = sched.eviction_rates(), binomial_sds(config)[0]
  assert np.all(np.abs(rates - 0.1) <= 5 * rate_sd), (rates, rate_sd)


def test_first_reporters_continue_then_lower_half_stops():
  config = ht.HyperTrickConfig(num_workers=10, num_phases=3,
                               eviction_rate=0.25)
  assert ht.min_continuing(config, 1) == 5  # floor(10 * 0.5)
  assert ht.min_continuing(config, 2) == 3  # floor(10 * 0.75 * 0.5)
  sched = ht.HyperTrick(config, num_slots=10)
  sched.start()
  # The first five reporters of phase 1 continue, however bad.
  for slot, m in enumerate([-100., -50., 0., 1., 2.]):
    assert sched.report(slot, m).decision == ht.CONTINUE
  # Then Worker Selection Mode: below the median of what was reported stops.
  # median(-100, -50, 0, 1, 2) = 0
  r = sched.report(5, -1.0)
  assert r.decision == ht.TERMINATE and r.new_worker is None  # W launched
  assert sched.slot_worker[5] is None
  # median(-100, -50, -1, 0, 1, 2) = -0.5
  assert sched.report(6, -0.4).decision == ht.CONTINUE
  assert sched.report(7, 5.0).decision == ht.CONTINUE
  # A diverged worker (NaN) is terminated in Worker Selection Mode, and the
  # quantile stays defined with it in the list.
  assert sched.report(8, float('nan')).decision == ht.TERMINATE
  # median(-inf, -100, -50, -1, -0.4, 0, 1, 2, 5) = -0.4
  assert sched.report(9, -0.5).decision == ht.TERMINATE
  assert sched.history[-2][2] == -np.inf
  assert ht._quantile([-np.inf, 1.0], 0.5) == -np.inf
  assert ht._quantile([-np.inf, 1.0, 3.0], 0.5) == 1.0
  with pytest.raises(ValueError, match='slot 5'):
    sched.report(5, 0.0)


def test_slots_restart_until_all_workers_launched_and_best():
  config = ht.HyperTrickConfig(num_workers=6, num_phases=2, eviction_rate=0.2)
  sched = ht.HyperTrick(config, num_slots=2)
  assert sched.start() == [0, 1]
  for w in (0, 1):
    sched.set_hparams(w, {'lr': 0.1 * (w + 1)})
  assert sched.report(0, 1.0).decision == ht.CONTINUE
  done = sched.report(0, 3.0)  # last phase
  assert done.decision == ht.COMPLETE and done.new_worker == 2
  assert sched.slot_worker[0] == 2 and sched.worker_phase[2] == 1
  best = sched.best()
  assert best.worker == 0 and best.metric == 3.0 and best.phase == 2
  assert best.hparams == {'lr': 0.1}


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
  space = ss.default_search_space('td3')
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


class FakePipeline:
  """What the HyperTrick driver asks of the pipeline; records restarts."""

  policy_version = 7

  def __init__(self):
    self.restarted = []

  def restart_members(self, members):
    self.restarted.append(list(members))

  def wait_published(self, timeout=None):
    return True


def driver_and_loop(config):
  """A HyperTrick driver over 2 tiny TD3 members and the loop it sees,
  with a ``FakePipeline``."""
  from fastpbrl import drivers  # noqa: PLC0415
  from fastpbrl.learner import PopulationLearner  # noqa: PLC0415
  from fastpbrl.run import Loop  # noqa: PLC0415
  from tests.population.conftest import tiny_td3  # noqa: PLC0415

  driver = drivers.HyperTrickDriver(config)
  agent = tiny_td3()
  hparams = driver.initial_hparams(jax.random.PRNGKey(0), agent, 2)
  learner = PopulationLearner(agent)
  pipeline = FakePipeline()
  loop = Loop(config=config, run_dir='', agent=agent, learner=learner,
              pipeline=pipeline, state=learner.init(
                  jax.random.PRNGKey(1), hparams),
              hparams=hparams, key=jax.random.PRNGKey(2),
              member_update_steps=np.zeros(2, np.int64))
  return driver, loop, pipeline


def test_driver_restarts_evicted_slots_as_new_experiments():
  # The evicted slot's replay must start empty with its own warm-up: the
  # driver asks the pipeline for that (Pipeline.restart_members, whose
  # effect on the replay tests/test_pipeline.py checks), and its phases count
  # the slot's own update steps, which stop while it warms up.
  from fastpbrl import drivers  # noqa: PLC0415
  from fastpbrl.actors import EpisodeRecord  # noqa: PLC0415

  config = drivers.HyperTrickRunConfig(
      population_size=2, num_workers=6, num_phases=2, phase_update_steps=100,
      eval_every=50, eviction_rate=0.25)
  driver, loop, pipeline = driver_and_loop(config)
  restarted_total = 0
  for call in range(1, 40):
    loop.update_steps = call * 50
    loop.member_update_steps += 50
    # Member 0 always scores higher than member 1.
    loop.episodes = [EpisodeRecord(m, 100.0 - 50 * m + call, 10, True, 0, 8, 8)
                     for m in range(2)]
    before = len(pipeline.restarted)
    driver.after_call(loop)
    for members in pipeline.restarted[before:]:
      restarted_total += len(members)
      for m in members:  # its phase starts at its current update count
        assert driver.phase_start[m] == loop.member_update_steps[m]
    if driver.scheduler.done:
      break
  assert restarted_total >= 1
  assert restarted_total == driver.scheduler.launched - 2


def test_driver_starts_no_experiment_the_budget_cannot_train():
  # A slot restarted when the budget left holds less than its warm-up and
  # one phase would be evaluated untrained at the end: it keeps its worker
  # instead (the slot goes idle in the scheduler). With one phase, every
  # report completes a worker and asks for a new one.
  from fastpbrl import drivers  # noqa: PLC0415
  from fastpbrl.actors import EpisodeRecord  # noqa: PLC0415

  config = drivers.HyperTrickRunConfig(
      population_size=2, num_workers=6, num_phases=1, phase_update_steps=100,
      eval_every=50, env_steps=1000, warmup_steps=100, eviction_rate=0.25)
  driver, loop, pipeline = driver_and_loop(config)

  def phase_ends(env_steps):
    loop.env_steps = env_steps
    loop.update_steps += 100
    loop.member_update_steps += 100
    loop.episodes = [EpisodeRecord(m, 10.0 * m, 10, True, 0, 8, 8)
                     for m in range(2)]
    driver.after_call(loop)

  # 300 env steps left >= warm-up 100 + one phase of 100 update steps.
  phase_ends(700)
  assert pipeline.restarted == [[0, 1]] and driver.scheduler.launched == 4
  # 100 left: no new experiment; both slots keep their (completed) workers.
  phase_ends(900)
  assert pipeline.restarted == [[0, 1]] and driver.scheduler.launched == 4
  assert driver.scheduler.slot_worker == [None, None]
