"""Checks of the sharded population, run by ``tests/test_sharding.py`` in a
subprocess whose ``XLA_FLAGS`` give it 4 host CPU devices (the flag must be
set before jax is imported). ``python -m tests.sharding_worker NAME``
runs one check; it prints ``OK NAME`` and exits 0, or fails an assertion.

The checks compute in float64 (``jax_enable_x64``, states and batches cast
with ``numerics.as_float64``), so that the sharded and unsharded programs,
which sum in different orders, agree to ``numerics.TRAJECTORY``: in float32
Adam can turn a rounding-level difference into ``2 lr`` per step, more than
any tolerance can allow (``tests/numerics.py``).
"""

from __future__ import annotations

import sys

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from fastpbrl.agents import td3
from fastpbrl.core import search_space as ss
from fastpbrl.devices import sharding
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)
from fastpbrl.rules import pbt as pbt_lib
from fastpbrl.rules.cemrl import cem as cem_lib
from fastpbrl.rules.dvd import diversity as dvd_lib
from tests import numerics
from tests.agents.helpers import env_spec, random_batch

jax.config.update('jax_enable_x64', True)
f64 = numerics.as_float64

N, D, STEPS, BATCH = 8, 4, 3, 8
TINY = td3.TD3Config(hidden_sizes=(8, 8), batch_size=BATCH,
                     steps_per_call=STEPS)


def agent():
  return td3.make_agent(env_spec('Pendulum-v1'), TINY)


def mesh():
  assert len(jax.devices()) == D, jax.devices()
  return sharding.make_mesh(jax.devices())


def hparams_of(a, scale=1.0):
  return f64(population_hparams(
      a, N, policy_lr=scale * np.linspace(1e-4, 1e-3, N),
      critic_lr=scale * np.linspace(3e-4, 2e-3, N),
      discount=np.linspace(0.9, 0.99, N),
      policy_update_fraction=[0.5, 1.0] * (N // 2)))


def host(tree):
  return jax.tree.map(np.array, tree)


def assert_population_sharded(tree, m):
  """Every leaf split along its leading axis, N / D rows on each device."""
  for x in jax.tree.leaves(tree):
    assert x.sharding == sharding.population_sharding(m), x.sharding
    assert len(x.sharding.device_set) == D
    rows = {s.data.shape[0] for s in x.addressable_shards}
    assert rows == {N // D}, rows


def compiled_text(learner, *args):
  return learner._step.lower(*args).compile().as_text()  # pylint: disable=protected-access


def check_population_learner():
  a, m = agent(), mesh()
  hparams = hparams_of(a)
  batch = f64(random_batch(a.env_spec, (N, STEPS, BATCH), seed=1))
  plain, sharded = PopulationLearner(a), PopulationLearner(a, mesh=m)
  key = jax.random.PRNGKey(0)
  s0, s1 = f64(plain.init(key, hparams)), f64(sharded.init(key, hparams))
  assert_population_sharded(s1, m)
  chex.assert_trees_all_equal(host(s0), host(s1))
  text = compiled_text(sharded, *sharded.shard(s1, hparams, (batch, jnp.ones(
      (N,), bool))))
  # Independent members: nothing is gathered; the only collective is the
  # all-reduce of any_member's pmax (TD3's delayed policy step).
  assert 'all-gather' not in text and 'all-to-all' not in text
  for call in range(3):
    h = hparams_of(a, scale=1.0 + call)  # new values: no recompilation
    s0, m0 = plain.update(s0, h, batch)
    s1, m1 = sharded.update(s1, h, batch)  # s1 donated, reused sharded
    assert_population_sharded((s1, m1), m)
    chex.assert_trees_all_close(host(s0), host(s1), **numerics.TRAJECTORY)
    chex.assert_trees_all_close(host(m0), host(m1), **numerics.TRAJECTORY)
  assert sharded.compilations == 1, sharded.compilations
  assert sharded._step._cache_size() == 1  # pylint: disable=protected-access
  # A batch already placed on the mesh is not copied.
  placed = sharding.shard_population(batch, m, N)
  again = sharding.shard_population(placed, m, N)
  assert all(x is y for x, y in zip(jax.tree.leaves(placed),
                                    jax.tree.leaves(again)))
  assert_population_sharded(sharded.policy_params(s1), m)
  chex.assert_trees_all_close(host(plain.policy_params(s0)),
                              host(sharded.policy_params(s1)),
                              **numerics.TRAJECTORY)
  rows = np.arange(N) % 3 == 0
  r0 = plain.reinit_members(key, s0, hparams, rows)
  r1 = sharded.reinit_members(key, s1, hparams, rows)
  assert_population_sharded(r1, m)
  chex.assert_trees_all_close(host(r0), host(r1), **numerics.TRAJECTORY)


def check_device_replay():
  """A per-member device replay kept on the mesh: its rings split with
  their members through inserts, flushes and copies, and a learner call
  sampling from it equals the same call on one device."""
  from fastpbrl.replay import device as device_replay  # noqa: PLC0415
  from fastpbrl.replay.buffers import transition_fields  # noqa: PLC0415
  a, m = agent(), mesh()
  fields = transition_fields(a.env_spec)
  replays = [device_replay.DeviceReplay('per_member', fields, N, 64),
             device_replay.DeviceReplay('per_member', fields, N, 64, mesh=m)]
  rng = np.random.default_rng(3)
  for t in range(5):  # chunks of 2 members x 10 steps, wrapping the rings
    members = rng.choice(N, 2, replace=False)
    chunk = {k: rng.normal(size=(2, 10, *shape)).astype(dtype)
             for k, (shape, dtype) in fields.items()}
    for r in replays:
      r.insert(members, chunk)
  plain, sharded = replays
  fill = {k: rng.normal(size=(N, 70, *shape)).astype(dtype)
          for k, (shape, dtype) in fields.items()}
  for r in replays:  # 70 steps of every member: every ring wraps
    r.insert(np.arange(N), fill)
  plain_state, sharded_state = plain.flush(), sharded.flush()
  chex.assert_trees_all_equal(host(plain_state), host(sharded_state))
  assert_population_sharded(sharded_state, m)
  plain.copy_members([7], [1])
  sharded.copy_members([7], [1])  # member 1 (device 0) onto 7 (device 3)
  chex.assert_trees_all_equal(host(plain.state), host(sharded.state))
  assert_population_sharded(sharded.state, m)
  hparams = hparams_of(a)
  learners = PopulationLearner(a, batch_size=BATCH), PopulationLearner(
      a, batch_size=BATCH, mesh=m)
  key = jax.random.PRNGKey(5)
  states = [f64(learner.init(key, hparams)) for learner in learners]
  for call in range(2):
    k = jax.random.fold_in(key, call)
    s0, m0 = learners[0].update_from_replay(states[0], hparams, plain.state, k)
    s1, m1 = learners[1].update_from_replay(states[1], hparams,
                                            sharded.state, k)
    states = [s0, s1]
    assert_population_sharded((s1, m1), m)
    chex.assert_trees_all_close(host(s0), host(s1), **numerics.TRAJECTORY)
  assert learners[1].compilations == 1


def shared_critics(a):
  """(name, SharedCritic, hparams) as the CEM-RL and DvD rules build them
  (their ``shared_critic_update``)."""
  base = hparams_of(a)
  return [
      ('td3', a.shared_critic, base),
      ('cemrl', cem_lib.with_rl_schedule(a.shared_critic, N // 2),
       cem_lib.rl_hparams(base, train_until=10)),
      ('dvd', dvd_lib.with_diversity(a.shared_critic,
                                     a.shared_critic.policy_apply, 1.0,
                                     num_states=4),
       dvd_lib.dvd_hparams(base, 0.5)),
  ]


def check_shared_critic_learner():
  a, m = agent(), mesh()
  batch = f64(random_batch(a.env_spec, (N, STEPS, BATCH), seed=2))
  for name, shared, hparams in shared_critics(a):
    plain = SharedCriticLearner(shared, STEPS)
    sharded = SharedCriticLearner(shared, STEPS, mesh=m)
    key = jax.random.PRNGKey(3)
    s0, s1 = f64(plain.init(key, hparams)), f64(sharded.init(key, hparams))
    chex.assert_trees_all_equal(host(s0), host(s1))
    per_member = ('policy', 'target_policy', 'policy_opt', 'key')
    for field in s1._fields:
      for x in jax.tree.leaves(getattr(s1, field)):
        want = P(sharding.POPULATION_AXIS) if field in per_member else P()
        assert x.sharding.spec == want, (name, field, x.sharding)
    text = compiled_text(sharded, *sharded.shard(s1, hparams, batch))
    # The critic loss is the mean over members, who live on 4 devices.
    assert 'all-reduce' in text, name
    # The mean over members is an all-reduce of four partial sums here, one
    # sum there: equal up to float64 rounding through 2 calls (rule 2).
    for _ in range(2):
      s0, m0 = plain.update(s0, hparams, batch)
      s1, m1 = sharded.update(s1, hparams, batch)
      chex.assert_trees_all_close(host(s0), host(s1), **numerics.TRAJECTORY)
      chex.assert_trees_all_close(host(m0), host(m1), **numerics.TRAJECTORY)
    for field in per_member:
      assert_population_sharded(getattr(s1, field), m)
    assert s1.critic is not None and all(
        x.sharding.spec == P() and len(x.sharding.device_set) == D
        for x in jax.tree.leaves(s1.critic))
    assert sharded.compilations == 1, (name, sharded.compilations)
    print('shared', name, 'ok')


def check_rules():
  a, m = agent(), mesh()
  hparams = hparams_of(a)
  learner = PopulationLearner(a, mesh=m)
  state = f64(learner.init(jax.random.PRNGKey(4), hparams))
  state = state._replace(step=jnp.arange(N, dtype=state.step.dtype) * 10)
  state, hparams, _ = learner.shard(state, hparams)
  assert_population_sharded((state, hparams), m)
  rows_of = {x.device.id: x.index[0] for x in state.step.addressable_shards}
  assert rows_of[0] == slice(0, 2) and rows_of[3] == slice(6, 8), rows_of
  before = host(state)
  # Truncation over 1 member: 7 (worst, device 3) copies 1 (best, device 0).
  config = pbt_lib.PBTConfig(ready_after=0, fraction=1 / N)
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(1e-5, 1e-2)})
  exploit = pbt_lib.CompiledExploitExplore(config, space)
  fitness = np.zeros(N, np.float32)
  fitness[1], fitness[7] = 10.0, -10.0
  result = exploit(jax.random.PRNGKey(5), state, hparams, fitness,
                   np.ones(N, bool))
  np.testing.assert_array_equal(result.parent, [0, 1, 2, 3, 4, 5, 6, 1])
  after = host(result.state)
  for field in state._fields:
    for b, x in zip(jax.tree.leaves(getattr(before, field)),
                    jax.tree.leaves(getattr(after, field))):
      np.testing.assert_array_equal(x[:7], b[:7])  # the others unchanged
      if field == 'key':  # a copy gets a fresh key, by design
        assert not np.array_equal(x[7], b[1])
      else:  # params, targets, optimizer states, step: exactly member 1's
        np.testing.assert_array_equal(x[7], b[1], err_msg=field)
  assert int(after.step[7]) == 10
  print('pbt output shardings:', sorted({str(x.sharding.spec) for x in
                                         jax.tree.leaves(result.state)}))
  # The learner takes the rule's output (placed as it is) without compiling
  # again, and returns it sharded.
  batch = f64(random_batch(a.env_spec, (N, STEPS, BATCH), seed=6))
  new, _ = learner.update(result.state, result.hparams, batch)
  new, _ = learner.update(new, result.hparams, batch)
  assert_population_sharded(new, m)
  assert learner.compilations == 1
  assert learner._step._cache_size() == 1  # pylint: disable=protected-access

  # CEM: the distribution update and a new generation on sharded policies.
  plain = PopulationLearner(a)
  s0 = f64(plain.init(jax.random.PRNGKey(4), hparams_of(a)))
  s1 = f64(learner.init(jax.random.PRNGKey(4), hparams_of(a)))
  flat0, unravel = cem_lib.flatten_population(s0.policy)
  flat1, _ = cem_lib.flatten_population(s1.policy)
  cem_state = cem_lib.init(flat0[0])
  fit = jnp.asarray(np.arange(N)[::-1], jnp.float32)
  c0 = cem_lib.update(cem_state, flat0, fit)
  c1 = cem_lib.update(cem_state, flat1, fit)
  # A weighted mean and variance over 8 members of parameters of size <= 1,
  # summed in another order: rule 1 with k = 32 (absolute where the mean
  # cancels towards 0).
  tol = numerics.rounding_rtol(32, np.float64)
  chex.assert_trees_all_close(host(c0), host(c1), rtol=tol, atol=tol)
  sample = cem_lib.sample(jax.random.PRNGKey(7), c1, N)
  g0 = cem_lib.load_policies(s0, sample, unravel)
  g1 = cem_lib.load_policies(s1, sample, unravel)
  chex.assert_trees_all_equal(host(g0), host(g1))

  # DvD: the diversity measure over sharded policies.
  probe = jnp.asarray(np.random.default_rng(0).normal(
      size=(5,) + a.env_spec.observations.shape), jnp.float64)
  distance = jax.jit(lambda p, s: dvd_lib.mean_pairwise_action_distance(
      jax.vmap(a.shared_critic.policy_apply, in_axes=(0, None))(p, s)))
  # A mean of 8 x 8 x 5 positive distances, each after a small forward pass
  # (< 50 operations): rule 1 with k = 400.
  np.testing.assert_allclose(distance(s0.policy, probe),
                             distance(s1.policy, probe),
                             rtol=numerics.rounding_rtol(400, np.float64))
  kernel = lambda p: dvd_lib.diversity_loss(  # noqa: E731
      jax.vmap(a.shared_critic.policy_apply, in_axes=(0, None))(p, probe), 1.0)
  # log det of K + 1e-4 I (Cholesky): rule 1's bound for the 400 operations
  # that build K, times K + 1e-4 I's condition number, at most
  # (8 + 1e-4) / 1e-4 < 1e5 for 8 members (entries in [0, 1]).
  np.testing.assert_allclose(jax.jit(kernel)(s0.policy),
                             jax.jit(kernel)(s1.policy),
                             rtol=1e5 * numerics.rounding_rtol(400, np.float64))


def check_choose_devices():
  devices = jax.devices()
  assert len(devices) == D
  assert sharding.choose_devices('auto', 8) == devices
  assert sharding.choose_devices('auto', 6) == devices[:1]
  assert sharding.choose_devices(2, 6) == devices[:2]
  assert sharding.choose_devices('4', 8) == devices
  for bad, pattern in [(5, 'exceeds the 4 visible'), (3, 'does not divide'),
                       ('two', 'must be'), (0, 'must be')]:
    try:
      sharding.choose_devices(bad, 8 if bad != 5 else 10)
    except ValueError as e:
      assert str(e).startswith('--devices') and pattern in str(e), e
      assert '\n' not in str(e)
    else:
      raise AssertionError(f'--devices {bad} accepted')


CHECKS = {
    'population_learner': check_population_learner,
    'shared_critic_learner': check_shared_critic_learner,
    'rules': check_rules,
    'choose_devices': check_choose_devices,
    'device_replay': check_device_replay,
}

if __name__ == '__main__':
  for name in sys.argv[1:]:
    CHECKS[name]()
    print('OK', name, flush=True)
