"""The successive-halving rule of examples/halving.py, a rule written
outside the package: its decisions through the contract, and a run, its
SIGTERM stop and its resume through the ``fastpbrl`` command."""

import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from examples import halving
from fastpbrl import rules
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.rules.testing import Harness
from fastpbrl.run.build import initial_population, make_agent, make_env_spec
from tests.test_distributed import DEADLINE_S, sigterm_after

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
COMMAND = [sys.executable, '-c',
           'from fastpbrl.cli.commands import console_script; console_script()',
           'examples.halving:Halving']
FLAGS = ['--env', 'Pendulum-v1', '--population-size', '4', '--warmup-steps',
         '100', '--hidden-sizes', '8', '8', '--batch-size', '8',
         '--steps-per-call', '10', '--rung-update-steps', '100',
         '--eval-every', '100', '--eval-episodes', '1', '--num-actors', '1',
         '--replay-capacity', '2000', '--checkpoint-every', '50',
         '--no-progress', '--track', 'none']
ENV = {**os.environ, 'JAX_PLATFORMS': 'cpu'}


def _evaluations(scores):
  return tuple(EpisodeRecord(m, r, 200, True, 100, 1, start_policy_version=1)
               for m, r in scores)


def _start():
  """The rule in a ``rules.testing.Harness`` (as the loop would drive it)."""
  config = halving.HalvingConfig(population_size=4, hidden_sizes=(8, 8),
                                 rung_update_steps=100, eval_every=100)
  rule = halving.Halving(config)
  agent = make_agent(config, make_env_spec(config.env))
  rule.prepare(agent)
  learner = rule.make_learner(agent, 1)
  state, hparams, rule_state = initial_population(config, rule, agent,
                                                  learner)
  return Harness(rule, rule_state, state=state, hparams=hparams,
                 learner=learner)


def test_registered_and_found_by_its_ref():
  assert rules.get('examples.halving:Halving') is halving.Halving
  assert rules.get('halving') is halving.Halving
  from fastpbrl.rules.registry import ref_of
  assert ref_of(halving.Halving) == 'examples.halving:Halving'


def test_the_bottom_half_restarts_once_every_member_finished_its_rung():
  run = _start()
  start, old = run.rule_state, np.asarray(run.hparams.policy_lr)
  scores = [(0, -300.0), (1, -100.0), (2, -400.0), (3, -200.0)]
  # Mid-rung: the evaluations are recorded, nothing is decided.
  decision = run.observe(_evaluations(scores), update_steps=50, env_steps=100)
  assert decision == rules.Decision()
  assert run.rule_state.counts.tolist() == [1, 1, 1, 1]
  # The rung is over: the two worst (members 2 and 0) restart, with new
  # hyperparameters; the others keep theirs.
  decision = run.observe(update_steps=100)
  assert decision.restart.tolist() == [True, False, True, False]
  assert decision.renewed.tolist() == decision.restart.tolist()
  assert decision.reinit[0].tolist() == decision.restart.tolist()
  assert [np.flatnonzero(r).tolist() for r in run.restarts] == [[0, 2]]
  assert [e['member'] for e in run.events] == [2, 0]
  new = np.asarray(run.hparams.policy_lr)
  assert new[1] == old[1] and new[3] == old[3]  # kept: the same values
  assert new[0] != old[0] and new[2] != old[2]  # redrawn
  assert int(run.rule_state.restarts) == 2 and run.rule_state.counts.sum() == 0
  # The same observation gives the same decision: a pure function.
  observation = _start().observation(_evaluations(scores), update_steps=50)
  first = run.rule.decide(start, observation)
  second = run.rule.decide(start, observation)
  assert jax.tree.all(jax.tree.map(np.array_equal, first[0], second[0]))


def test_bad_settings_are_refused_naming_the_flag():
  with pytest.raises(rules.base.ConfigError, match='--fraction must be in'):
    halving.Halving(halving.HalvingConfig(fraction=0.9))


@pytest.mark.slow
def test_runs_stops_and_resumes_through_the_command(tmp_path):
  """``fastpbrl examples.halving:Halving``: a run restarts members, a
  SIGTERM stops it with a checkpoint (exit 143), and ``--resume`` with the
  same command finishes it."""
  run_dir = str(tmp_path / 'run')
  proc = subprocess.Popen(
      COMMAND + FLAGS + ['--env-steps', '1000000', '--run-dir', run_dir],
      cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
      text=True)
  rule_csv = os.path.join(run_dir, 'rule.csv')
  out = sigterm_after(lambda: _restarts(rule_csv), 'a restart', proc)
  assert proc.returncode == 143, out[-3000:]
  assert 'fastpbrl examples.halving:Halving --resume' in out, out[-3000:]
  with open(os.path.join(run_dir, 'config.json')) as f:
    assert json.load(f)['rule'] == 'examples.halving:Halving'
  stopped = int(re.findall(r'SIGTERM: stopped after learner call \d+ '
                           r'\((\d+) env steps per member\)', out)[0])
  done = subprocess.run(
      COMMAND + ['--resume', run_dir, '--env-steps', str(stopped + 200),
                 '--no-progress'],
      cwd=REPO, env=ENV, capture_output=True, text=True, timeout=DEADLINE_S)
  assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
  assert 'resumed' in done.stderr and 'members restarted' in done.stdout
  with open(os.path.join(run_dir, 'final_returns.json')) as f:
    assert np.isfinite(json.load(f)['final_returns']).all()


def _restarts(rule_csv: str) -> float:
  """The last ``restarts`` value in ``rule.csv`` (0 if none yet)."""
  if not os.path.exists(rule_csv):
    return 0
  with open(rule_csv) as f:
    rows = [line.strip().split(',') for line in f if line.endswith('\n')]
  values = [float(r[3]) for r in rows[1:] if r[2] == 'restarts']
  return values[-1] if values else 0
