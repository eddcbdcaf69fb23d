"""Every registered rule keeps the contract of ``fastpbrl/rules/base.py``:
settings only on the rule, all bookkeeping in a state of arrays with a key
(what a checkpoint stores), presets of its own config class; and the
registry finds rules by name and by ``module:Class``, refusing what is not
one with one line."""

import ast
import dataclasses
import glob
import os

import jax
import numpy as np
import pytest

from fastpbrl import rules
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.core import search_space as ss
from fastpbrl.rules import registry
from fastpbrl.run import build
from fastpbrl.run.build import initial_population, make_agent, make_env_spec

SMALL = dict(env='Pendulum-v1', population_size=4, hidden_sizes=(8, 8))


@pytest.mark.parametrize('name', list(registry.BUILTIN))
def test_builtin_rules_register_with_presets_of_their_config(name):
  rule_cls = rules.get(name)
  assert rule_cls.name == name and rule_cls.help
  assert registry.ref_of(rule_cls) == name
  assert rule_cls.presets
  for preset in rule_cls.presets.values():
    assert isinstance(preset, rule_cls.config_class)


@pytest.mark.parametrize('name', list(registry.BUILTIN))
def test_state_is_a_pytree_of_arrays_with_a_key(name):
  rule_cls = rules.get(name)
  fields = {f.name for f in dataclasses.fields(rule_cls.config_class)}
  config = rule_cls.config_class(**{k: v for k, v in SMALL.items()
                                    if k in fields})
  rule = rule_cls.from_config(config)
  agent = make_agent(rule.config, make_env_spec(rule.config.env))
  rule.prepare(agent)
  learner = rule.make_learner(agent, 1)
  _, _, rule_state = initial_population(rule.config, rule, agent, learner)
  assert hasattr(rule_state, '_fields') and 'key' in rule_state._fields
  for leaf in jax.tree.leaves(rule_state):
    assert isinstance(leaf, (np.ndarray, jax.Array)), (name, type(leaf))


def test_registry_refuses_what_is_not_a_rule():
  with pytest.raises(ValueError, match='subclass of fastpbrl.rules.Rule'):
    rules.register(object)

  class Nameless(rules.Rule):
    pass

  with pytest.raises(ValueError, match='name must be non-empty'):
    rules.register(Nameless)

  class Taken(rules.Rule):
    name = 'pbt'

  with pytest.raises(ValueError, match="'pbt' is already registered by"):
    rules.register(Taken)

  class Command(rules.Rule):
    name = 'evaluate'

  with pytest.raises(ValueError, match='is a fastpbrl command'):
    rules.register(Command)


def test_unknown_refs_get_one_line():
  with pytest.raises(ValueError, match="'nope' is unknown; choose one of"):
    rules.get('nope')
  with pytest.raises(ValueError, match='cannot import no_such_module'):
    rules.get('no_such_module:Rule')
  with pytest.raises(ValueError, match='has no Rule class'):
    rules.get('fastpbrl.rules.base:Nothing')


def test_train_refuses_an_unregistered_rule_class():
  from fastpbrl.api import rule_class
  from fastpbrl.config.errors import ConfigError

  class Unregistered(rules.Rule):
    name = 'unregistered-here'

  with pytest.raises(ConfigError, match='is not registered'):
    rule_class(Unregistered)


def test_a_rule_that_cannot_run_over_processes_is_refused(monkeypatch):
  """Over several processes, a rule with ``multi_process = False`` is
  refused before anything starts, in one line naming it; every built-in
  rule runs there."""
  class Local(rules.Rule):
    name = 'local-only'
    multi_process = False

  several = type('Several', (), dict(several=True, count=2))
  monkeypatch.setattr(build.distributed, 'Processes',
                      lambda mesh, n: several())
  with pytest.raises(ConfigError,
                     match='^fastpbrl local-only does not run over 2 '
                           'processes yet$'):
    build.check_processes(RunConfig(), Local(RunConfig()), None)
  assert all(rules.get(name).multi_process for name in registry.BUILTIN)


def test_shared_replay_is_the_rules_or_the_configs_choice(monkeypatch):
  """A rule whose update needs one replay always has it; seeds and PBT
  take it from --shared-replay, HyperTrick (which restarts members with an
  empty replay) refuses it in one line. Over several processes
  --shared-replay is refused in one line naming it (each process's replay
  holds its own members), the rules that need a shared replay are not."""
  seeds, pbt = rules.get('seeds'), rules.get('pbt')
  assert not seeds(RunConfig()).shares_replay()
  shared = seeds(RunConfig(shared_replay=True))
  assert shared.shares_replay()
  assert pbt(pbt.config_class(shared_replay=True)).shares_replay()
  hypertrick = rules.get('hypertrick')
  with pytest.raises(ConfigError, match='^--shared-replay: HyperTrick '
                                        'restarts a slot'):
    hypertrick(hypertrick.config_class(shared_replay=True))
  dvd = rules.get('dvd')
  assert dvd(dvd.config_class()).shares_replay()

  several = type('Several', (), dict(several=True, count=2))
  monkeypatch.setattr(build.distributed, 'Processes',
                      lambda mesh, n: several())
  with pytest.raises(ConfigError, match='^--shared-replay: over 2 '
                                        'processes each process keeps'):
    build.check_processes(shared.config, shared, None)
  monkeypatch.setattr(build, 'log', type('Quiet', (), dict(
      info=staticmethod(lambda *a: None))))
  several.local = range(0, 2)
  several.index = 0
  build.check_processes(dvd.config_class(), dvd(dvd.config_class()), None)


@pytest.mark.parametrize('name', list(registry.BUILTIN))
def test_hparams_flag_sets_every_members_defaults(name):
  """``--hparams`` replaces the agent's defaults for every rule: a field
  outside the search space (tau) is the given value in every member;
  a searched one (policy_lr) is every member's where the rule trains at
  the defaults, member 0's under PBT's near-defaults start, and no
  member's under random search, which draws it from the prior."""
  rule_cls = rules.get(name)
  fields = {f.name for f in dataclasses.fields(rule_cls.config_class)}
  config = rule_cls.config_class(
      **{k: v for k, v in SMALL.items() if k in fields},
      hparams=('tau=0.01', 'policy_lr=0.001'))
  rule = rule_cls.from_config(config)
  agent = make_agent(rule.config, make_env_spec(rule.config.env))
  rule.prepare(agent)
  n = rule.config.population_size
  hparams = rule.initial_hparams(jax.random.PRNGKey(0), agent, n)
  agent_hparams = getattr(hparams, 'agent', hparams)  # CEM-RL, DvD wrap them
  # float32 of the given values, exactly.
  np.testing.assert_array_equal(agent_hparams.tau, np.float32(0.01))
  policy_lr = np.asarray(agent_hparams.policy_lr)
  if name in ('seeds', 'cemrl', 'dvd'):
    np.testing.assert_array_equal(policy_lr, np.float32(0.001))
  elif name == 'pbt':  # near-defaults: member 0 at them, the rest near
    assert policy_lr[0] == np.float32(0.001)
    assert np.all((policy_lr >= 0.001 / 1.25 * (1 - 1e-6))
                  & (policy_lr <= 0.001 * 1.25 * (1 + 1e-6))), policy_lr
  elif name == 'random':  # drawn from the prior, the given value unused
    assert not np.any(policy_lr == np.float32(0.001)), policy_lr
    assert np.asarray(ss.within_bounds(rule.space, agent_hparams)).all()


# What generic code may read of a rule: the run, the API, the commands and
# the readers of a run folder (benchmarks and the rules themselves are not
# generic).
GENERIC = ('fastpbrl/run', 'fastpbrl/trained', 'fastpbrl/cli', 'fastpbrl/logs',
           'fastpbrl/api.py', 'fastpbrl/rules/registry.py',
           'fastpbrl/rules/testing.py')
RULE_NAMES = ('rule', 'rule_cls', 'rule_obj')


def _is_rule(node) -> bool:
  """``rule``, ``rule_cls``, ``rule_obj`` or ``<anything>.rule``."""
  return ((isinstance(node, ast.Name) and node.id in RULE_NAMES)
          or (isinstance(node, ast.Attribute) and node.attr == 'rule'))


def _rule_reads(path: str):
  """``(line, attribute or None)`` of every read of a rule's attribute in
  ``path`` (None: a ``getattr``/``hasattr`` probe)."""
  with open(path) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute) and _is_rule(node.value):
      yield node.lineno, node.attr
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
          and node.func.id in ('getattr', 'hasattr') and node.args
          and _is_rule(node.args[0])):
      yield node.lineno, None


def test_generic_code_reads_only_what_the_rule_contract_declares():
  """Every attribute of a rule that generic code reads is declared on
  ``Rule`` (``config`` is set by its ``__init__``), and none is probed for
  with ``getattr`` or ``hasattr``."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  paths = []
  for place in GENERIC:
    place = os.path.join(root, place)
    paths += ([place] if place.endswith('.py') else
              glob.glob(os.path.join(place, '**', '*.py'), recursive=True))
  undeclared = [f'{os.path.relpath(path, root)}:{line} {attr or "probe"}'
                for path in paths for line, attr in _rule_reads(path)
                if attr is None or not (attr == 'config'
                                        or hasattr(rules.Rule, attr))]
  assert undeclared == []
  assert {'rule.space', 'rule.outputs'} <= {
      f'rule.{attr}' for path in paths for _, attr in _rule_reads(path)}
