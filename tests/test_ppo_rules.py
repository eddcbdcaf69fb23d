"""Every rule that makes sense for an agent that learns from its own
rollouts, with the built-in PPO on the on-device path (gymnax CartPole):
PBT with each explore (perturb is ``tests/test_device_rollouts.py``'s),
HyperTrick and a user rule (``examples/halving.py``), whose restarts
start a member's envs over (``DeviceEnvs.restart_members``), and random
search. Each tiny run finishes with every member's update steps equal to
its env steps, and the hyperparameters change where, and only where, the
rule changes them. HyperTrick holds no warm-up for a PPO slot. (CEM-RL
and DvD refuse PPO in one line: ``tests/test_user_errors.py``.)
"""

import os

import jax
import numpy as np
import pytest

import fastpbrl
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.learner.population import PopulationLearner
from fastpbrl.rules.base import Population
from fastpbrl.rules.hypertrick import HyperTrick, HyperTrickRunConfig
from fastpbrl.rules.testing import Harness
from fastpbrl.run import build
from fastpbrl.run.plots import read_hparams_csv

# T = 16 steps in E = 2 envs: 32 env steps per member per learner call.
PER_CALL = 32
TINY = dict(agent='ppo', env='gymnax:CartPole-v1', population_size=4,
            hidden_sizes=(16, 16), env_steps=8 * PER_CALL,
            agent_settings=('rollout_length=16', 'num_envs=2',
                            'batch_size=16', 'epochs=2'),
            eval_every=2 * PER_CALL, eval_episodes=1, seed=3,
            progress=False, track='none')

RULES = {
    'pbt-resample': ('pbt', dict(explore='resample', ready_after=2 * PER_CALL,
                                 fraction=0.5)),
    'pbt-pb2': ('pbt', dict(explore='pb2', ready_after=2 * PER_CALL,
                            fraction=0.5)),
    # 2 slots, 6 configurations of 2 phases of 2 calls: slots that lose a
    # phase restart with a new configuration.
    'hypertrick': ('hypertrick', dict(population_size=2, num_workers=6,
                                      num_phases=2,
                                      phase_env_steps=2 * PER_CALL)),
    'random': ('random', {}),
    # A user rule (examples/halving.py): rungs of 2 calls, the worse half
    # re-initialised and restarted with new hyperparameters.
    'user-halving': ('examples.halving:Halving',
                     dict(rung_update_steps=2 * PER_CALL, fraction=0.5)),
}


def schedule(run_dir):
  """``{member: [its hyperparameter rows, in order]}`` of ``hparams.csv``
  (the counters dropped)."""
  out = {}
  for row in read_hparams_csv(run_dir):
    values = {k: v for k, v in row.items()
              if k not in ('member', 'env_steps', 'update_steps')}
    out.setdefault(row['member'], []).append(values)
  return out


def rule_column(run_dir, name):
  """The values ``rule.csv`` logged for ``name`` (lines step,wall,name,v)."""
  with open(os.path.join(run_dir, 'rule.csv')) as f:
    rows = [line.rstrip('\n').split(',') for line in f][1:]
  return [float(r[-1]) for r in rows if r[-2] == name]


@pytest.mark.slow
@pytest.mark.parametrize('case', sorted(RULES))
def test_a_rule_runs_ppo_on_device(tmp_path, case):
  pytest.importorskip('gymnax')
  rule, settings = RULES[case]
  run_dir = str(tmp_path / case)
  result = fastpbrl.train(rule, run_dir=run_dir, **{**TINY, **settings})
  n = settings.get('population_size', TINY['population_size'])
  run = result.run
  # One iteration per call; an on-policy member's update steps are the env
  # steps it learned from.
  assert run.calls == 8
  assert run.env_steps == run.update_steps == 8 * PER_CALL
  assert len(run.final_returns) == n
  assert np.isfinite(run.final_returns).all()
  assert run.diverged == 0
  rows = schedule(run_dir)
  assert sorted(rows) == list(range(n))
  changed = {m: any(r != rs[0] for r in rs) for m, rs in rows.items()}
  if rule == 'pbt':
    exploits = [e for e in result.lineage if e['event'] == 'exploit']
    assert exploits, result.lineage
    # An exploited member takes its parent's hyperparameters, explored.
    for e in exploits:
      assert changed[e['member']], (e, rows[e['member']])
    assert not any(changed[m] for m in range(n)
                   if m not in {e['member'] for e in exploits})
  elif rule == 'hypertrick':
    # More configurations than slots were launched: slots restarted, each
    # with a configuration of its own.
    launched = rule_column(run_dir, 'workers_launched')
    assert max(launched) > n, launched
    assert any(changed.values()), rows
  elif case == 'user-halving':
    assert max(rule_column(run_dir, 'restarts')) > 0
    assert any(changed.values()), rows
  else:  # random: each member keeps its own draw
    assert not any(changed.values()), rows
    assert len({tuple(rs[0].values()) for rs in rows.values()}) == n


def test_hypertrick_starts_an_on_policy_experiment_while_a_phase_fits():
  """A PPO slot has no warm-up: HyperTrick starts a new experiment while
  the budget left holds one phase, where a TD3 slot also needs its
  --warmup-steps (``tests/rules/hypertrick/test_rule.py``'s
  ``test_starts_no_experiment_the_budget_cannot_train``, same settings:
  there the second report launches nothing)."""
  config = HyperTrickRunConfig(
      agent='ppo', env='CartPole-v1', population_size=2, num_workers=6,
      num_phases=1, phase_env_steps=100, eval_every=50, env_steps=1000,
      warmup_steps=100, eviction_rate=0.25, hidden_sizes=(8,),
      agent_settings=('rollout_length=4', 'batch_size=4'))
  rule = HyperTrick(config)
  agent = build.make_agent(rule.config, build.make_env_spec(config.env))
  rule.prepare(agent)
  hparams = rule.initial_hparams(jax.random.PRNGKey(0), agent, 2)
  state = PopulationLearner(agent).init(jax.random.PRNGKey(1), hparams)
  rule_state, state = rule.init(
      jax.random.PRNGKey(2),
      Population(agent, state, hparams, jax.random.PRNGKey(3)))
  run = Harness(rule, rule_state, state=state, hparams=hparams)

  def phase_ends(env_steps):
    run.env_steps = env_steps
    v = run.policy_version
    return run.observe(tuple(EpisodeRecord(m, 10.0 * m, 10, True, 0, v, v)
                             for m in range(2)),
                       update_steps=run.update_steps + 100)

  assert phase_ends(700).restart.tolist() == [True, True]
  assert int(run.rule_state.scheduler.launched) == 4
  # 100 left: one phase, and no warm-up to hold.
  assert phase_ends(900).restart.tolist() == [True, True]
  assert int(run.rule_state.scheduler.launched) == 6
