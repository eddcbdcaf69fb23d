"""PackedCall: one output buffer, the same values as the plain jitted call."""

import gymnasium
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastpbrl.actors.actor import key_data_of, make_policy_fns
from fastpbrl.actors.packed import PackedCall
from fastpbrl.agents.registry import make_agent
from fastpbrl.types import make_env_spec


def _mixed(x, k):
  """Outputs of every supported kind: float, int, bool, a nested tree."""
  return {'a': x * 2.0, 'n': (x.sum(-1) > 0).astype(jnp.int32) - k,
          'flags': x > 0, 'tuple': (x[:, :1], k.astype(jnp.float32))}


def test_values_dtypes_and_tree_match_the_plain_jit():
  x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
  k = np.arange(3, dtype=np.int32)
  want = jax.device_get(jax.jit(_mixed)(x, k))
  got = PackedCall(_mixed)(x, k)
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    assert isinstance(g, np.ndarray) and g.flags.writeable
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(g, w)  # bit for bit: nothing converted


def test_nan_and_negative_zero_survive_bit_for_bit():
  x = np.array([[np.nan, -0.0, np.inf, -1e-45]], np.float32)
  got, neg = PackedCall(lambda v: (v, -v))(x)
  assert got.view(np.uint32).tolist() == x.view(np.uint32).tolist()
  assert neg.view(np.uint32).tolist() == (-x).view(np.uint32).tolist()


def test_one_output_comes_back_unpacked_and_writable():
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  got = PackedCall(lambda v: {'a': v * 2.0})(x)
  assert got['a'].flags.writeable
  np.testing.assert_array_equal(got['a'], x * 2.0)


def test_later_calls_with_other_shapes_are_refused():
  for fn in (lambda v: v + 1, lambda v: (v + 1, v > 0)):
    call = PackedCall(fn)
    call(np.zeros((2, 3), np.float32))
    with pytest.raises(TypeError):
      call(np.zeros((4, 3), np.float32))


def test_outputs_without_a_shared_leading_axis_are_refused():
  with pytest.raises(ValueError, match='leading axis'):
    PackedCall(lambda v: (v, v.sum()))(np.zeros((2, 3), np.float32))


def _ppo_population(m: int):
  spec = make_env_spec(gymnasium.make('MountainCarContinuous-v0'))
  agent = make_agent('ppo', spec)
  hp = agent.default_hparams()
  states = [agent.init(jax.random.key(i), hp) for i in range(m)]
  stack = lambda xs: jax.tree.map(lambda *a: np.stack(a), *xs)
  params = stack([jax.device_get(agent.policy_params(s)) for s in states])
  return spec, agent, params, stack([jax.device_get(hp)] * m)


def test_the_actors_policy_calls_act_as_the_unpacked_vmap():
  # The actors' calls (packed, vmapped over members) against the agent's
  # functions called one member at a time. Two programs, so float32
  # rounding may differ: a 64-64 tanh MLP's outputs of order 1 to a few
  # ulp (rtol 1e-5 is about 80 ulp); the log-probabilities, sums of
  # squares of order 1 to 10, likewise (atol 1e-4).
  m, k = 3, 2
  spec, agent, params, hparams = _ppo_population(m)
  rng = np.random.default_rng(1)
  obs = rng.standard_normal((m, 2)).astype(np.float32)
  eval_obs = rng.standard_normal((m, k, 2)).astype(np.float32)
  keys = np.stack([key_data_of(j, 'threefry2x32') for j in range(m)])
  steps = np.array([0, 7, 123], np.uint32)
  policy, with_eval = make_policy_fns(agent, 'threefry2x32', behave=True)
  actions, log_probs = policy(params, hparams, obs, keys, steps)
  (eactions, elog_probs), eval_actions = with_eval(
      params, params, hparams, obs, eval_obs, keys, keys, steps)
  for j in range(m):
    one = jax.tree.map(lambda a: a[j], params)
    key = jax.random.fold_in(jax.random.wrap_key_data(keys[j]), steps[j])
    a, lp = jax.jit(agent.behave)(one, obs[j][None], key, None)
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(actions[j], a[0], **close)
    np.testing.assert_allclose(eactions[j], actions[j], **close)  # one sample
    np.testing.assert_allclose(log_probs[j], lp[0], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(elog_probs[j], log_probs[j], rtol=1e-5,
                               atol=1e-4)
    ekey = jax.random.fold_in(jax.random.wrap_key_data(keys[j]), steps[j])
    for e in range(k):
      mean = jax.jit(agent.act, static_argnums=4)(
          one, eval_obs[j, e][None], jax.random.fold_in(ekey, e), None,
          False)
      np.testing.assert_allclose(eval_actions[j, e], mean[0], **close)
  assert actions.shape == (m, 1) and log_probs.shape == (m,)
  assert eval_actions.shape == (m, k, 1)
