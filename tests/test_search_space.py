"""Search spaces: sampling, perturbation, constraints and validation."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastpbrl
from fastpbrl import agents
from fastpbrl.agents import td3
from fastpbrl.core import search_space as ss
from fastpbrl.rules.pbt import PBT, PBTRunConfig
from fastpbrl.run import build
from tests import numerics

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = pytest.mark.numeric

N = 4000
# A float32 explore of a log-scale field: ~8 ops in log space, where |log x|
# <= 11 (x, 1 - gamma >= 3e-5), relative after exp: rule 1 with k = 100.
LOG_SCALE_RTOL = numerics.rounding_rtol(100)


def test_sample_within_bounds_and_untouched_fields():
  space = agents.get('td3').default_search_space
  template = td3.default_hparams()
  hp = jax.jit(ss.sample, static_argnums=(1, 3))(
      jax.random.PRNGKey(0), space, template, N)
  for name, dist in space.distributions:
    x = np.asarray(getattr(hp, name))
    assert x.shape == (N,) and x.dtype == np.float32
    assert x.min() >= np.float32(dist.low) and x.max() <= np.float32(dist.high)
  # Fields outside the space keep the template's values.
  for name in ('tau', 'reward_scale'):
    np.testing.assert_array_equal(getattr(hp, name),
                                  np.full(N, getattr(template, name)))
  assert bool(jnp.all(ss.within_bounds(space, hp)))


def test_log_uniform_spreads_evenly_over_decades():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(1e-5, 1e-2),
                          'critic_lr': ss.Uniform(1e-5, 1e-2)})
  hp = ss.sample(jax.random.PRNGKey(1), space, td3.default_hparams(), N)
  logs = np.log10(np.asarray(hp.policy_lr))
  counts = np.histogram(logs, bins=[-5, -4, -3, -2])[0] / N
  # Statistical: sd sqrt(1/3 2/3 / N) = 0.0075; 0.03 is 4 sd.
  np.testing.assert_allclose(counts, [1 / 3] * 3, rtol=0, atol=0.03)
  # The uniform prior puts ~90% of its mass in the top decade instead (0.9009;
  # sd sqrt(0.9 0.1 / N) = 0.0047, 0.03 is 6 sd).
  top = np.mean(np.asarray(hp.critic_lr) > 1e-3)
  assert abs(top - 0.9) < 0.03


def test_categorical_sample_and_adjacent_moves():
  values = (0.9, 0.95, 0.99, 0.995)
  space = ss.SearchSpace({'discount': ss.Categorical(values)})
  hp = ss.sample(jax.random.PRNGKey(2), space, td3.default_hparams(), N)
  x = np.asarray(hp.discount)
  grid = np.asarray(values, np.float32)
  assert set(np.unique(x)) == set(grid)
  moved = ss.perturb(jax.random.PRNGKey(3), space, hp, resample_probability=0.0)
  i_old = np.searchsorted(grid, x)
  i_new = np.searchsorted(grid, np.asarray(moved.discount))
  assert np.all(np.abs(i_new - i_old) == 1)  # always exactly one step
  # Both directions are used from interior values.
  interior = (i_old > 0) & (i_old < len(values) - 1)
  steps = (i_new - i_old)[interior]
  # Statistical: ~N/2 fair coins, sd 0.011; 0.1 is 9 sd.
  assert 0.4 < np.mean(steps == 1) < 0.6
  # Ends move to their only neighbour.
  assert np.all(i_new[i_old == 0] == 1)
  assert np.all(i_new[i_old == len(values) - 1] == len(values) - 2)


def _reflect(x, low, high):
  """Reference mirror at the bounds, written out case by case."""
  x = np.asarray(x, np.float64)
  return np.where(x > high, 2 * high - x, np.where(x < low, 2 * low - x, x))


def test_perturb_multiplies_by_factors_then_reflects():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3),
                          'exploration_noise': ss.Uniform(0.0, 1.0)})
  hp = ss.sample(jax.random.PRNGKey(4), space, td3.default_hparams(), N)
  out = ss.perturb(jax.random.PRNGKey(5), space, hp, factors=(0.8, 1.2),
                   resample_probability=0.0)
  x, y = np.asarray(hp.policy_lr), np.asarray(out.policy_lr)
  lo, hi = np.log(3e-5), np.log(3e-3)
  down = np.exp(_reflect(np.log(x) + np.log(0.8), lo, hi))
  up = np.exp(_reflect(np.log(x) + np.log(1.2), lo, hi))
  is_down = np.isclose(y, down, rtol=LOG_SCALE_RTOL, atol=0)
  is_up = np.isclose(y, up, rtol=LOG_SCALE_RTOL, atol=0)
  assert np.all(is_down | is_up)
  # Statistical: ~N fair coins, sd 0.008; 0.05 is 6 sd.
  assert 0.45 < np.mean(is_up & ~is_down) / np.mean(is_up ^ is_down) < 0.55
  # Uniform: linear mirror at the bounds; values that left [0, 1] exist and
  # came back inside, none sits on the bound.
  e, f = np.asarray(hp.exploration_noise), np.asarray(out.exploration_noise)
  # The factor, a product and 2 - y: rule 1 with k = 4 of values <= 2.
  tol = 2 * numerics.rounding_rtol(4)
  ok = (np.isclose(f, _reflect(e * 0.8, 0, 1), rtol=0, atol=tol)
        | np.isclose(f, _reflect(e * 1.2, 0, 1), rtol=0, atol=tol))
  assert np.all(ok)
  assert np.any(e * 1.2 > 1.0)
  assert f.min() >= 0.0 and f.max() < 1.0
  # Fields outside the space are untouched.
  np.testing.assert_array_equal(out.tau, hp.tau)
  np.testing.assert_array_equal(out.critic_lr, hp.critic_lr)


def test_reflection_by_hand():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(1.0, 10.0),
                          'exploration_noise': ss.Uniform(0.5, 1.0)})
  hp = td3.default_hparams()._replace(policy_lr=jnp.float32(9.0),
                                      exploration_noise=jnp.float32(0.9))
  hp = jax.tree.map(lambda x: jnp.broadcast_to(x, (1,)), hp)
  out = ss.perturb(jax.random.PRNGKey(0), space, hp, factors=(1.2,),
                   resample_probability=0.0)
  # log 10.8 mirrored at log 10: 10 / 1.08; 1.08 mirrored at 1.0: 0.92.
  # ~8 float32 ops on values <= 2 log 10 = 4.6 (in log space), relative after
  # exp: rule 1 with k = 40 (the linear mirror needs fewer).
  np.testing.assert_allclose(out.policy_lr, [10.0 / 1.08],
                             rtol=numerics.rounding_rtol(40))
  np.testing.assert_allclose(out.exploration_noise, [0.92],
                             rtol=numerics.rounding_rtol(40))


def test_discount_is_searched_in_horizon_space():
  space = ss.SearchSpace({'discount': ss.Discount(0.9, 0.999)})
  hp = ss.sample(jax.random.PRNGKey(0), space, td3.default_hparams(), N)
  g = np.asarray(hp.discount, np.float64)
  assert g.min() >= 0.9 and g.max() <= 0.999 and np.all(g < 1.0)
  # 1 - gamma is log-uniform over [1e-3, 0.1]: its log is uniform.
  u = (np.log(1 - g) - np.log(1e-3)) / (np.log(0.1) - np.log(1e-3))
  # Statistical: sd sqrt(1/12 / N) = 0.0046 and sqrt(0.25 0.75 / N) =
  # 0.0068; 0.03 is 6.5 and 4.4 sd.
  assert abs(np.mean(u) - 0.5) < 0.03 and abs(np.mean(u < 0.25) - 0.25) < 0.03
  out = ss.perturb(jax.random.PRNGKey(1), space, hp, factors=(0.8, 1.2),
                   resample_probability=0.0)
  h = 1 - np.asarray(out.discount, np.float64)
  inside = (1 - g > 1e-3 / 0.8) & (1 - g < 0.1 / 1.2)  # no reflection
  ratio = h[inside] / (1 - g[inside])
  # gamma's float32 rounding (<= eps/2) relative to 1 - gamma >= 1e-3, plus
  # the log-space ops: 1.3e-4 (the other factor is 50% away).
  tol = numerics.rounding_rtol(1) / 1e-3 + LOG_SCALE_RTOL
  assert np.all(np.isclose(ratio, 0.8, rtol=tol, atol=0)
                | np.isclose(ratio, 1.2, rtol=tol, atol=0))
  with pytest.raises(ValueError, match="'discount'.*high < 1"):
    ss.SearchSpace({'discount': ss.Discount(0.9, 1.0)})


@pytest.mark.parametrize('agent', ['td3', 'sac', 'dqn'])
@pytest.mark.parametrize('resample_probability', [0.0, 0.25])
def test_repeated_explore_keeps_a_spread(agent, resample_probability):
  # PBT explores the same members again and again: no continuous field may
  # collapse onto its bounds (clipping put every discount of U(0.9, 1) on
  # 0.9 or 1.0 after one round).
  module = pytest.importorskip(f'fastpbrl.agents.{agent}')
  space = agents.get(agent).default_search_space
  hp = ss.sample(jax.random.PRNGKey(0), space, module.default_hparams(), 1000)
  explore = jax.jit(lambda k, h: ss.perturb(
      k, space, h, resample_probability=resample_probability))
  for i in range(20):
    hp = explore(jax.random.PRNGKey(100 + i), hp)
  for name, dist in space.distributions:
    if isinstance(dist, ss.Categorical):
      continue
    x = np.asarray(getattr(hp, name))
    at_bound = np.mean((x == np.float32(dist.low)) | (x == np.float32(dist.high)))
    assert at_bound < 0.01, (name, at_bound)
    assert len(np.unique(x)) > 500, (name, len(np.unique(x)))
    assert np.all(x >= np.float32(dist.low)) and np.all(x <= np.float32(dist.high))


def test_resample_probability():
  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3)})
  hp = ss.sample(jax.random.PRNGKey(6), space, td3.default_hparams(), N)
  out = ss.perturb(jax.random.PRNGKey(7), space, hp, resample_probability=0.25)
  x, y = np.asarray(hp.policy_lr), np.asarray(out.policy_lr)
  lo, hi = np.log(3e-5), np.log(3e-3)
  perturbed = (np.isclose(y, np.exp(_reflect(np.log(x * 0.8), lo, hi)),
                          rtol=LOG_SCALE_RTOL, atol=0)
               | np.isclose(y, np.exp(_reflect(np.log(x * 1.2), lo, hi)),
                            rtol=LOG_SCALE_RTOL, atol=0))
  # Statistical: sd sqrt(0.25 0.75 / N) = 0.0068; 0.03 is 4.4 sd.
  assert abs(np.mean(~perturbed) - 0.25) < 0.03
  out1 = ss.perturb(jax.random.PRNGKey(7), space, hp, resample_probability=1.0)
  assert np.all(np.asarray(ss.within_bounds(space, out1)))


def test_constraint_applied_after_sample_and_perturb():
  def lr_order(h):
    return h._replace(critic_lr=jnp.maximum(h.critic_lr, h.policy_lr))

  space = ss.SearchSpace({'policy_lr': ss.LogUniform(3e-5, 3e-3),
                          'critic_lr': ss.LogUniform(3e-5, 3e-3)},
                         constraint=lr_order)
  hp = ss.sample(jax.random.PRNGKey(8), space, td3.default_hparams(), 500)
  assert np.all(np.asarray(hp.critic_lr) >= np.asarray(hp.policy_lr))
  out = ss.perturb(jax.random.PRNGKey(9), space, hp)
  assert np.all(np.asarray(out.critic_lr) >= np.asarray(out.policy_lr))


@pytest.mark.parametrize('dists, message', [
    ({'policy_lr': ss.LogUniform(0.0, 1e-3)}, "'policy_lr'.*positive"),
    ({'policy_lr': ss.LogUniform(-1.0, 1e-3)}, "'policy_lr'.*positive"),
    ({'discount': ss.Uniform(1.0, 0.9)}, "'discount'.*low < high"),
    ({'discount': ss.Uniform(0.9, 0.9)}, "'discount'.*low < high"),
    ({'discount': ss.Uniform(0.9, float('inf'))}, "'discount'.*finite"),
    ({'epsilon': ss.Categorical(())}, "'epsilon'.*at least one"),
    ({'epsilon': ss.Categorical((0.1, 0.1))}, "'epsilon'.*distinct"),
    ({'tau': (0.0, 1.0)}, "'tau'.*LogUniform, Uniform, Discount or Categorical"),
])
def test_invalid_distributions_name_the_field(dists, message):
  with pytest.raises(ValueError, match=message):
    ss.SearchSpace(dists)


def test_unknown_field_and_agent():
  space = ss.SearchSpace({'learning_rate': ss.LogUniform(1e-5, 1e-3)})
  with pytest.raises(ValueError, match=r"\['learning_rate'\].*TD3HParams"):
    ss.sample(jax.random.PRNGKey(0), space, td3.default_hparams(), 2)
  with pytest.raises(ValueError, match="'trpo' is unknown; choose one of td3"):
    agents.get('trpo')
  space = agents.get('td3').default_search_space
  hp = ss.sample(jax.random.PRNGKey(0), space, td3.default_hparams(), 2)
  with pytest.raises(ValueError, match='resample_probability'):
    ss.perturb(jax.random.PRNGKey(0), space, hp, resample_probability=1.5)


def test_default_spaces_match_the_paper():
  t = dict(agents.get('td3').default_search_space.distributions)
  assert t['policy_lr'] == ss.LogUniform(3e-5, 3e-3) == t['critic_lr']
  assert t['policy_update_fraction'] == ss.Uniform(0.2, 1.0)
  assert (t['exploration_noise'] == ss.Uniform(0.0, 1.0) == t['target_noise']
          == t['noise_clip'])
  # The paper's U(0.9, 1), in horizon space and without gamma = 1.
  assert t['discount'] == ss.Discount(0.9, 0.999)
  s = dict(agents.get('sac').default_search_space.distributions)
  assert set(s) == {'policy_lr', 'critic_lr', 'alpha_lr',
                    'target_entropy_scale', 'reward_scale', 'discount'}
  assert s['target_entropy_scale'] == ss.Uniform(0.2, 2.0)
  d = dict(agents.get('dqn').default_search_space.distributions)
  assert set(d) == {'lr', 'epsilon', 'discount'}
  assert d['discount'] == ss.Discount(0.9, 0.999) == s['discount']
  # Hashable, so usable as a static jit argument.
  hash(agents.get('sac').default_search_space)


@pytest.mark.parametrize('agent', ['td3', 'sac', 'dqn'])
def test_default_spaces_fit_the_agents(agent):
  module = pytest.importorskip(f'fastpbrl.agents.{agent}')
  template = module.default_hparams()
  space = agents.get(agent).default_search_space
  hp = ss.sample(jax.random.PRNGKey(0), space, template, 64)
  assert type(hp) is type(template)
  assert np.asarray(ss.within_bounds(space, hp)).all()
  out = ss.perturb(jax.random.PRNGKey(1), space, hp)
  assert np.asarray(ss.within_bounds(space, out)).all()


@pytest.mark.parametrize('agent', ['td3', 'sac', 'dqn'])
def test_sample_near_defaults(agent):
  module = pytest.importorskip(f'fastpbrl.agents.{agent}')
  space = agents.get(agent).default_search_space
  defaults = module.default_hparams()
  hp = ss.sample_near(jax.random.PRNGKey(3), space, defaults, 1000)
  assert np.asarray(ss.within_bounds(space, hp)).all()
  for name in defaults._fields:
    x, d = np.asarray(getattr(hp, name), np.float64), float(getattr(defaults, name))
    assert x[0] == np.float32(d), name  # member 0 at the defaults
    if name not in space.fields:
      assert np.all(x == np.float32(d)), name
      continue
    dist = space[name]
    if isinstance(dist, ss.Categorical):
      continue
    lo, hi = dist.low, dist.high
    slack = LOG_SCALE_RTOL  # the factor's float32 ops
    if isinstance(dist, ss.Discount):
      x, d, lo, hi = 1 - x, 1 - d, 1 - dist.high, 1 - dist.low
      slack += numerics.rounding_rtol(1) / x.min()  # gamma's rounding
    if not (lo <= d * 0.8 and d * 1.25 <= hi):
      continue  # a default near a bound: mirrored (tested elsewhere)
    ratio = x[1:] / d
    # Within a factor 1.25 but for rounding (slack), spread over that range:
    # 13% of draws fall beyond 0.85 and 1.18 each; all 999 miss: p < 1e-60.
    assert (ratio.min() >= 0.8 * (1 - slack)
            and ratio.max() <= 1.25 * (1 + slack)), name
    assert ratio.min() < 0.85 and ratio.max() > 1.18, name
  with pytest.raises(ValueError, match='spread'):
    ss.sample_near(jax.random.PRNGKey(0), space, defaults, 4, spread=1.0)


def test_pbt_starts_near_the_defaults_by_default():
  config = PBTRunConfig(env='Pendulum-v1', population_size=8)
  assert config.init_hparams == 'near-defaults'
  rule = PBT(config)
  agent = build.make_agent(config, build.make_env_spec(config.env))
  rule.prepare(agent)
  hp = rule.initial_hparams(jax.random.PRNGKey(0), agent, 8)
  defaults = td3.default_hparams()
  for name in defaults._fields:
    x = np.asarray(getattr(hp, name), np.float64)
    assert x[0] == np.float32(getattr(defaults, name))
  # No member far from the defaults: exploration noise and target noise
  # within 1.25x of 0.1 and 0.2, discount's 1 - gamma within 1.25x of 0.01,
  # but for a few float32 roundings of values <= 1 (rule 1, k = 8, absolute).
  tol = numerics.rounding_rtol(8)
  assert np.all(np.asarray(hp.exploration_noise) <= 0.125 + tol)
  assert np.all(np.asarray(hp.target_noise) <= 0.25 + tol)
  assert np.all(np.abs(1 - np.asarray(hp.discount, np.float64)) <= 0.0125 + tol)
  prior = PBT(PBTRunConfig(init_hparams='prior'))
  hp = prior.initial_hparams(jax.random.PRNGKey(0), agent, 8)
  # The paper's prior, U(0, 1): all 8 below 0.3 with probability 0.3^8 = 7e-5.
  assert np.asarray(hp.exploration_noise).max() > 0.3


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_search_space_file_reads_every_kind(tmp_path):
  import json
  path = _write(tmp_path, 'space.json', json.dumps({
      'policy_lr': {'kind': 'log_uniform', 'low': 1e-4, 'high': 1e-3},
      'exploration_noise': {'kind': 'uniform', 'low': 0, 'high': 0.5},
      'discount': {'kind': 'discount', 'low': 0.95, 'high': 0.995},
      'policy_update_fraction': {'kind': 'categorical',
                                 'values': [0.25, 0.5, 1]}}))
  space = ss.load(path)
  assert dict(space.distributions) == {
      'policy_lr': ss.LogUniform(1e-4, 1e-3),
      'exploration_noise': ss.Uniform(0.0, 0.5),
      'discount': ss.Discount(0.95, 0.995),
      'policy_update_fraction': ss.Categorical((0.25, 0.5, 1.0))}
  yaml = pytest.importorskip('yaml')
  path = _write(tmp_path, 'space.yaml', yaml.safe_dump(
      {'policy_lr': {'kind': 'log_uniform', 'low': 1e-4, 'high': 1e-3}}))
  assert ss.load(path).fields == ('policy_lr',)


def test_search_space_file_takes_ray_tune_and_optuna_spellings():
  """Ray Tune's ``loguniform`` and ``choice(categories)`` and Optuna's
  ``choices`` read as ours."""
  space = ss.from_dict({
      'policy_lr': {'kind': 'loguniform', 'low': 1e-4, 'high': 1e-3},
      'policy_update_fraction': {'kind': 'choice', 'categories': [0.5, 1]},
      'tau': {'kind': 'categorical', 'choices': [0.005, 0.01]}})
  assert dict(space.distributions) == {
      'policy_lr': ss.LogUniform(1e-4, 1e-3),
      'policy_update_fraction': ss.Categorical((0.5, 1.0)),
      'tau': ss.Categorical((0.005, 0.01))}


def test_the_example_search_space_file_fits_td3():
  space = ss.load('examples/search_space.json')
  ss.validate(space, td3.default_hparams())


@pytest.mark.parametrize('text, message', [
    ('{"policy_lr": {"kind": "normal", "low": 0, "high": 1}}',
     "field 'policy_lr': kind 'normal' is unknown; choose one of log_uniform"),
    ('{"policy_lr": {"kind": "uniform", "low": 1, "high": 1}}',
     "field 'policy_lr': Uniform needs low < high, got low=1.0, high=1.0"),
    ('{"policy_lr": {"kind": "log_uniform", "low": 0, "high": 1}}',
     "field 'policy_lr': LogUniform needs positive bounds"),
    ('{"discount": {"kind": "discount", "low": 0.9, "high": 1}}',
     "field 'discount': Discount needs 0 <= low < high < 1"),
    ('{"tau": {"kind": "uniform", "lo": 0, "high": 1}}',
     r"field 'tau': a uniform takes low, high; unknown \['lo'\]"),
    ('{"tau": {"kind": "uniform", "low": "0", "high": 1}}',
     "field 'tau': low must be a number"),
    ('{"tau": {"kind": "categorical", "values": []}}',
     "field 'tau': Categorical needs at least one value"),
    ('{"tau": [0, 1]}', "field 'tau': expected"),
    ('{}', 'defines no hyperparameter'),
    ('{"tau": ', 'not valid JSON'),
])
def test_bad_search_space_file_names_the_field(tmp_path, text, message):
  with pytest.raises(ValueError, match=message) as info:
    ss.load(_write(tmp_path, 'space.json', text))
  assert '\n' not in str(info.value)


def test_search_space_flag_errors_name_the_flag(tmp_path, monkeypatch):
  from experiments import pbt
  import fastpbrl.run.main as run_lib

  def no_start(*args, **kwargs):
    raise AssertionError('a run started despite an invalid search space')

  monkeypatch.setattr(run_lib, 'RunLogger', no_start)
  bad = _write(tmp_path, 'bad.json',
               '{"policy_lr": {"kind": "uniform", "low": 2, "high": 1}}')
  unknown = _write(tmp_path, 'unknown.json',
                   '{"learning_rate": {"kind": "uniform", "low": 0, "high": 1}}')
  for path, message in [
      (bad, f"--search-space {bad}: search space field 'policy_lr': Uniform "
            'needs low < high'),
      (unknown, f"--search-space {unknown}: search space fields "
                "['learning_rate'] are not hyperparameters of TD3HParams"),
      (str(tmp_path / 'missing.json'),
       f"--search-space {tmp_path / 'missing.json'}: cannot read it")]:
    with pytest.raises(SystemExit) as info:
      pbt.main(['--search-space', path, '--run-dir', str(tmp_path / 'run'),
                '--no-progress', '--population-size', '2'])
    assert message in str(info.value.code), info.value.code
    assert '\n' not in str(info.value.code)


def test_near_restricts_each_field_around_the_defaults():
  space = agents.get('td3').default_search_space
  near = ss.near(space, td3.default_hparams())
  assert near.fields == space.fields and near.constraint is space.constraint
  # By hand, spread 1.25: lr 3e-4 -> [2.4e-4, 3.75e-4]; discount 0.99 ->
  # 1 - gamma in [0.008, 0.0125]; exploration noise 0.1 -> [0.08, 0.125];
  # policy_update_fraction 0.5 -> [0.4, 0.625].
  expected = {'policy_lr': (ss.LogUniform, 2.4e-4, 3.75e-4),
              'critic_lr': (ss.LogUniform, 2.4e-4, 3.75e-4),
              'discount': (ss.Discount, 0.9875, 0.992),
              'exploration_noise': (ss.Uniform, 0.08, 0.125),
              'target_noise': (ss.Uniform, 0.16, 0.25),
              'noise_clip': (ss.Uniform, 0.4, 0.625),
              'policy_update_fraction': (ss.Uniform, 0.4, 0.625)}
  for name, (kind, low, high) in expected.items():
    dist = near[name]
    assert type(dist) is kind, name
    # The float32 default's rounding, then float64 arithmetic (rule 1, k = 2).
    np.testing.assert_allclose([dist.low, dist.high], [low, high],
                               rtol=numerics.rounding_rtol(2), err_msg=name)
  # Clipped to the support, a categorical keeps its neighbours, and a
  # default of 0 (no factor around it) keeps the whole distribution.
  odd = ss.SearchSpace({'policy_lr': ss.LogUniform(2.8e-4, 3e-3),
                        'tau': ss.Categorical((0.001, 0.005, 0.01, 0.05)),
                        'exploration_noise': ss.Uniform(0.0, 1.0)})
  hp = td3.default_hparams()._replace(exploration_noise=jnp.float32(0.0))
  out = ss.near(odd, hp)
  np.testing.assert_allclose([out['policy_lr'].low, out['policy_lr'].high],
                             [2.8e-4, 3.75e-4],
                             rtol=numerics.rounding_rtol(2))  # as above
  assert out['tau'].values == (0.001, 0.005, 0.01)
  assert out['exploration_noise'] == ss.Uniform(0.0, 1.0)


def test_perturb_resamples_from_the_resample_space():
  space = agents.get('td3').default_search_space
  defaults = td3.default_hparams()
  near = ss.near(space, defaults)
  hp = ss.sample_near(jax.random.PRNGKey(0), space, defaults, N)
  everywhere = ss.perturb(jax.random.PRNGKey(1), space, hp,
                          resample_probability=1.0)
  around = ss.perturb(jax.random.PRNGKey(1), space, hp,
                      resample_probability=1.0, resample_space=near)
  for name, dist in near.distributions:
    x = np.asarray(getattr(around, name))
    # A uniform draw low + (high - low) u rounds 3 times (log-scale draws are
    # clipped to the bounds): rule 1 with k = 8.
    slack = numerics.rounding_rtol(8)
    assert x.min() >= np.float32(dist.low) * (1 - slack), name
    assert x.max() <= np.float32(dist.high) * (1 + slack), name
    # From the whole prior most values fall outside the near region: 72% or
    # more (policy_update_fraction), sd <= 0.008, 30 sd above 0.5.
    y = np.asarray(getattr(everywhere, name))
    assert np.mean((y < dist.low) | (y > dist.high)) > 0.5, name
  # Perturbed (not resampled) values still move by the factors and may
  # leave the near region: the resample space bounds only redraws.
  moved = ss.perturb(jax.random.PRNGKey(2), space,
                     hp._replace(policy_lr=jnp.full((N,), 3.7e-4)),
                     resample_probability=0.0, resample_space=near)
  np.testing.assert_allclose(np.unique(np.asarray(moved.policy_lr)),
                             [3.7e-4 * 0.8, 3.7e-4 * 1.2],
                             rtol=LOG_SCALE_RTOL)
  with pytest.raises(ValueError, match='resample_space has fields'):
    ss.perturb(jax.random.PRNGKey(0), space, hp, resample_space=ss.SearchSpace(
        {'policy_lr': ss.LogUniform(1e-4, 1e-3)}))


# --- A search space given as a dict (the Python API) or inline JSON --------

DICT_SPACE = {'policy_lr': {'kind': 'loguniform', 'low': 1e-4, 'high': 1e-3},
              'discount': {'kind': 'discount', 'low': 0.95, 'high': 0.995}}


def test_an_inline_space_is_the_space_the_file_would_give(tmp_path):
  path = tmp_path / 'space.json'
  path.write_text(json.dumps(DICT_SPACE))
  from_file = PBT(PBTRunConfig(search_space=str(path))).space
  inline = PBT(PBTRunConfig(search_space=json.dumps(DICT_SPACE))).space
  assert inline == from_file == ss.from_dict(DICT_SPACE)


@pytest.mark.parametrize('space, message', [
    ({'policy_lr': {'kind': 'loguniform', 'low': 1e-3, 'high': 1e-4}},
     'search_space|--search-space'),
    ({'no_such_field': {'kind': 'uniform', 'low': 0.0, 'high': 1.0}},
     'no_such_field'),
])
def test_train_refuses_a_bad_dict_space_before_making_the_run_folder(
    space, message, tmp_path):
  run_dir = tmp_path / 'run'
  with pytest.raises(fastpbrl.ConfigError, match=message):
    fastpbrl.train('pbt', search_space=space, run_dir=str(run_dir),
                   progress=False, num_actors=1)
  assert not run_dir.exists()


def test_a_domain_prints_its_range_and_says_why_a_value_is_invalid():
  lr = ss.positive('Adam step size', 'step size')
  assert str(lr) == '(0, inf)'
  assert lr.problem(3e-4) is None
  assert lr.problem(0.0) == 'is outside its valid range (0, inf)'
  assert lr.problem(-1.0) == 'is outside its valid range (0, inf)'
  fraction = ss.HParamDomain('f', '', low=0.0, high=1.0, low_open=True)
  assert str(fraction) == '(0, 1]' and fraction.problem(1.0) is None
  half_open = ss.HParamDomain('p', '', low=0.0, high=1.0, high_open=True)
  assert str(half_open) == '[0, 1)' and half_open.problem(1.0)
  period = ss.HParamDomain('period', 'update steps', low=1.0, integer=True)
  assert str(period) == '[1, inf) integers'
  assert period.problem(2500.0) is None
  assert period.problem(2500.5).startswith('is not an integer')
  assert ss.HParamDomain('anything').problem(-1e9) is None
  assert lr.problem(float('nan')).startswith('is not finite')


def test_values_and_spaces_are_checked_against_domains_in_one_line():
  domains = {'policy_lr': ss.positive('Adam step size of the actor',
                                      'step size'),
             'epsilon': ss.HParamDomain('rate', 'probability', low=0.0,
                                        high=1.0)}
  ss.check_values(domains, {'policy_lr': 1e-3, 'unchecked': -5.0})
  with pytest.raises(ValueError) as info:
    ss.check_values(domains, {'policy_lr': -1.0})
  assert str(info.value) == ('policy_lr=-1 is outside its valid range '
                             '(0, inf) (Adam step size of the actor)')
  with pytest.raises(ValueError, match="search space field 'policy_lr': low "
                     r'-0.001 is outside its valid range \(0, inf\)'):
    ss.check_space(domains, ss.SearchSpace(
        {'policy_lr': ss.Uniform(-1e-3, 1e-3)}))
  with pytest.raises(ValueError, match="search space field 'epsilon': value "
                     r'1.5 is outside its valid range \[0, 1\]'):
    ss.check_space(domains, ss.SearchSpace(
        {'epsilon': ss.Categorical((0.1, 1.5))}))
  ss.check_space(domains, ss.SearchSpace(
      {'policy_lr': ss.PAPER_LR, 'epsilon': ss.Uniform(0.0, 1.0),
       'tau': ss.Uniform(-1.0, 1.0)}))  # tau: no domain, unchecked
  renamed = {'old': 'was renamed new: old=2 -> new=0.5'}
  with pytest.raises(ValueError, match='^old was renamed new: old=2 -> '
                     'new=0.5$'):
    ss.check_values(domains, {'old': 2.0}, renamed)
  with pytest.raises(ValueError, match='^old was renamed new'):
    ss.check_space(domains, ss.SearchSpace({'old': ss.Uniform(1.0, 2.0)}),
                   renamed)
