"""The hyperparameter domains the built-in agents register: every field
declared, the defaults and the default priors inside them, and TD3's
renamed delay refused with its conversion."""

import pytest

from fastpbrl import agents
from fastpbrl.core import search_space as ss
from fastpbrl.run.build import make_env_spec

# An env each built-in agent can act in (DQN's defaults depend on frames).
ENVS = {'td3': 'Pendulum-v1', 'sac': 'Pendulum-v1', 'dqn': 'CartPole-v1',
        'ppo': 'CartPole-v1'}


def _defaults(name):
  spec = agents.get(name)
  agent = spec.make_agent(make_env_spec(ENVS[name]), spec.config())
  return spec, agent.default_hparams()


@pytest.mark.parametrize('name', sorted(agents.BUILTIN))
def test_every_field_is_declared_and_its_default_lies_inside(name):
  spec, defaults = _defaults(name)
  assert set(spec.hparam_domains) == set(defaults._fields)
  for field, domain in spec.hparam_domains.items():
    assert domain.meaning and domain.unit, field
    assert domain.problem(float(getattr(defaults, field))) is None, field


@pytest.mark.parametrize('name', sorted(agents.BUILTIN))
def test_the_default_prior_lies_inside_the_domains(name):
  spec, _ = _defaults(name)
  for field, dist in spec.default_search_space.distributions:
    domain = spec.hparam_domains[field]
    values = (dist.values if isinstance(dist, ss.Categorical)
              else (dist.low, dist.high))
    for value in values:
      assert domain.problem(value) is None, (field, value)
  spec.check_search_space(spec.default_search_space)  # the same, in one call


def test_td3s_delay_is_a_fraction_under_a_name_that_says_so():
  spec, defaults = _defaults('td3')
  assert 'policy_delay' not in defaults._fields
  assert float(defaults.policy_update_fraction) == 0.5  # TD3's d = 2
  assert str(spec.hparam_domains['policy_update_fraction']) == '(0, 1]'
  with pytest.raises(ValueError) as info:
    spec.check_hparams({'policy_delay': 2.0})
  assert '\n' not in str(info.value)
  assert 'renamed policy_update_fraction' in str(info.value)
  assert 'policy_delay=2 -> policy_update_fraction=0.5' in str(info.value)
  with pytest.raises(ValueError, match='policy_update_fraction=0 is outside '
                     r'its valid range \(0, 1\]'):
    spec.check_hparams({'policy_update_fraction': 0.0})
  spec.check_hparams({'policy_update_fraction': 1.0})


def test_dqns_target_period_takes_whole_update_steps():
  spec, _ = _defaults('dqn')
  domain = spec.hparam_domains['target_update_period']
  assert domain.unit == 'update steps' and domain.integer
  assert 'target_update_interval' in domain.meaning  # SB3's, in env steps
  spec.check_hparams({'target_update_period': 2500.0})
  with pytest.raises(ValueError, match=r'target_update_period=2500\.5 is not '
                     'an integer'):
    spec.check_hparams({'target_update_period': 2500.5})
  with pytest.raises(ValueError, match='target_update_period=0 is outside'):
    spec.check_hparams({'target_update_period': 0.0})
  with pytest.raises(ValueError, match='LogUniform draws fractions'):
    spec.check_search_space(ss.SearchSpace(
        {'target_update_period': ss.LogUniform(100.0, 10_000.0)}))
  spec.check_search_space(ss.SearchSpace(
      {'target_update_period': ss.Categorical((1000, 2500, 8000))}))


def test_register_refuses_a_default_prior_outside_the_domains():
  with pytest.raises(ValueError, match="agent 'bad-prior': "
                     "default_search_space: search space field 'lr': low "
                     r'-0.001 is outside its valid range \(0, inf\)'):
    agents.register('bad-prior', make_agent=lambda *a: None,
                    config=agents.get('td3').config,
                    default_search_space={'lr': ss.Uniform(-1e-3, 1e-3)},
                    hparam_domains={'lr': ss.positive('step size')})
  assert 'bad-prior' not in agents.known()
