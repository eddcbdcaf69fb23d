"""Random search from the prior (``fastpbrl random``): its members start
from the draws of ``fastpbrl pbt --init-hparams prior`` (the same initial
population, built by ``fastpbrl.run.build.initial_population`` for both rules),
for every kind of agent; they keep them through a run and through a stop
and resume, which restores them and draws nothing; a search space outside
the agent's domains is refused in one line naming --search-space."""

import json
import os

import jax
import numpy as np
import pytest

from examples import ddpg  # registers the user agent 'ddpg'
from fastpbrl import agents, rules
from fastpbrl.cli import commands
from fastpbrl.core import search_space as ss
from fastpbrl.rules.random_search import PRESETS, RandomSearch
from fastpbrl.run.build import initial_population, make_agent, make_env_spec
from fastpbrl.run.plots import read_hparams_csv

SPACE = json.dumps({'policy_lr': {'kind': 'loguniform', 'low': 1e-4,
                                  'high': 1e-2},
                    'tau': {'kind': 'uniform', 'low': 0.001, 'high': 0.02}})


def initial(rule_name: str, **fields):
  """``(agent, space, state, hparams)`` of a new run of ``rule_name``."""
  rule_cls = rules.get(rule_name)
  rule = rule_cls.from_config(rule_cls.config_class(
      hidden_sizes=(8,), **fields))
  agent = make_agent(rule.config, make_env_spec(rule.config.env))
  rule.prepare(agent)
  learner = rule.make_learner(agent, agent.config.steps_per_call)
  state, hparams, _ = initial_population(rule.config, rule, agent, learner)
  return agent, rule.space, state, hparams


@pytest.mark.parametrize('fields', [
    dict(agent='td3', env='Pendulum-v1', population_size=4),
    dict(agent='sac', env='Pendulum-v1', population_size=3, seed=7),
    dict(agent='dqn', env='CartPole-v1', population_size=3),
    dict(agent='ppo', env='CartPole-v1', population_size=3, seed=2),
    dict(agent=ddpg.DDPG.name, env='Pendulum-v1', population_size=3),
    dict(agent='td3', env='Pendulum-v1', population_size=5, seed=3,
         search_space=SPACE, hparams=('tau=0.01',)),
], ids=['td3', 'sac', 'dqn', 'ppo', 'user-agent', 'td3-own-space'])
def test_members_start_from_pbts_prior_draws(fields):
  """The same seed, population and space: the same hyperparameters as
  PBT's prior start, leaf for leaf, and the same initial parameters. The
  draws differ between members, lie in the space, and the fields outside
  it are the agent's defaults (``--hparams`` included)."""
  agent, space, state, hparams = initial('random', **fields)
  _, _, pbt_state, pbt_hparams = initial('pbt', init_hparams='prior',
                                         **fields)
  jax.tree.map(np.testing.assert_array_equal, hparams, pbt_hparams)
  jax.tree.map(np.testing.assert_array_equal, state, pbt_state)
  n = fields['population_size']
  assert np.asarray(ss.within_bounds(space, hparams)).all()
  defaults = agent.default_hparams()
  for name in defaults._fields:
    values = np.asarray(getattr(hparams, name))
    assert values.shape == (n,), name
    if name in space.fields:
      assert len(set(values.tolist())) == n, (name, values)
    else:
      np.testing.assert_array_equal(values, getattr(defaults, name))


@pytest.mark.parametrize('explore', ['pb2', 'resample'])
def test_other_explores_from_the_prior_start_from_the_same_draws(explore):
  """PB2 and the 2022 paper's resample (PBT's explores ``pb2`` and
  ``resample``) from the prior: the learning report's
  ``pbt-pb2-prior-ppo`` and ``pbt-resample-prior-ppo`` rows, paired seed
  by seed with ``random-ppo``."""
  fields = dict(agent='ppo', env='CartPole-v1', population_size=3, seed=2)
  _, _, state, hparams = initial('random', **fields)
  _, _, rule_state, rule_hparams = initial('pbt', init_hparams='prior',
                                           explore=explore, **fields)
  jax.tree.map(np.testing.assert_array_equal, hparams, rule_hparams)
  jax.tree.map(np.testing.assert_array_equal, state, rule_state)


def test_seeds_differ_and_the_draws_are_not_the_defaults():
  """Another seed draws other values; neither is the seeds rule's
  population at the defaults."""
  _, space, _, first = initial('random', env='Pendulum-v1', population_size=2)
  _, _, _, second = initial('random', env='Pendulum-v1', population_size=2,
                            seed=1)
  _, _, _, defaults = initial('seeds', env='Pendulum-v1', population_size=2)
  for name in space.fields:
    assert not np.array_equal(getattr(first, name), getattr(second, name))
    assert not np.array_equal(getattr(first, name), getattr(defaults, name))


def test_paper_preset_is_pbts_paper_run_without_pbt():
  pbt = rules.get('pbt').presets['paper']
  paper = PRESETS['paper']
  assert paper.search_space == pbt.search_space
  assert pbt.init_hparams == 'prior'  # the arm draws what PBT starts from
  for name in ('env', 'agent', 'population_size', 'env_steps',
               'warmup_steps', 'eval_every', 'checkpoint_every', 'seed'):
    assert getattr(paper, name) == getattr(pbt, name), name


def test_a_space_outside_the_agents_domain_is_one_line(tmp_path, monkeypatch,
                                                       capsys):
  """tau must be > 0 (TD3's declared domain): refused before any folder."""
  monkeypatch.chdir(tmp_path)
  assert commands.main(['random', '--no-progress', '--search-space',
                        '{"tau": {"kind": "uniform", "low": 0, '
                        '"high": 0.1}}']) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith('error: --search-space') and '\n' not in err, err
  assert 'tau' in err
  assert os.listdir(tmp_path) == []


def test_help_names_the_paper_and_the_arm(capsys):
  assert commands.main(['random', '--help']) == 0
  text = capsys.readouterr().out
  assert text.startswith('usage: fastpbrl random ')
  assert 'Jaderberg et al. 2017' in text and '--search-space' in text
  assert 'control arm' in RandomSearch.help and '2017' in RandomSearch.help


# On the device (a JAX env): the tiny run is a few seconds after compiling.
TINY = ['--env', 'gymnax:Pendulum-v1', '--population-size', '2',
        '--warmup-steps', '100', '--hidden-sizes', '16', '16',
        '--batch-size', '16', '--steps-per-call', '10', '--eval-every', '200',
        '--eval-episodes', '1', '--checkpoint-every', '100',
        '--no-progress', '--track', 'none']


@pytest.mark.slow
def test_a_run_stopped_and_resumed_keeps_its_draws(tmp_path, monkeypatch):
  """``fastpbrl random`` to 400 env steps per member, then ``--resume`` to
  600 with ``initial_hparams`` drawing other values: the resumed run
  restores the checkpoint's draws, and every row of ``hparams.csv``, before
  and after the resume, is each member's first draw (no decision ever
  changes them)."""
  run_dir = str(tmp_path / 'run')
  assert commands.main(['random', *TINY, '--env-steps', '400',
                        '--run-dir', run_dir]) == 0
  _, space, _, draws = initial('random', env='gymnax:Pendulum-v1',
                               population_size=2)
  redrawn = []
  monkeypatch.setattr(RandomSearch, 'initial_hparams', _redrawing(redrawn))
  assert commands.main(['random', '--resume', run_dir,
                        '--env-steps', '600']) == 0
  assert redrawn  # the resume built a population, then restored over it
  rows = read_hparams_csv(run_dir)
  assert max(r['env_steps'] for r in rows) >= 600
  assert len({r['update_steps'] for r in rows}) >= 3
  for row in rows:
    for name in draws._fields:
      assert np.float32(row[name]) == np.asarray(
          getattr(draws, name))[row['member']], (name, row)
  assert not os.path.exists(os.path.join(run_dir, 'lineage.jsonl'))
  with open(os.path.join(run_dir, 'config.json')) as f:
    assert json.load(f)['rule'] == 'random'
  assert any(name in space.fields for name in draws._fields)


def _redrawing(calls=None):
  """``RandomSearch.initial_hparams`` drawing from another key (what a
  resume would find if it drew instead of restoring), appending each
  call's key to ``calls``."""
  draw = RandomSearch.initial_hparams
  calls = [] if calls is None else calls

  def redraw(self, key, agent, population_size):
    calls.append(key)
    return draw(self, jax.random.fold_in(key, 1), agent, population_size)

  return redraw


def test_other_draws_would_differ():
  """The resume test's redraw gives other values: were they restored by
  nothing, the test would see them."""
  spec = agents.get('td3')
  agent = make_agent(rules.get('random').config_class(hidden_sizes=(8,)),
                     make_env_spec('Pendulum-v1'))
  rule = RandomSearch(rules.get('random').config_class())
  key = jax.random.PRNGKey(0)
  first = rule.initial_hparams(key, agent, 2)
  other = _redrawing()(rule, key, agent, 2)
  for name in spec.default_search_space.fields:
    assert not np.array_equal(getattr(first, name), getattr(other, name))
