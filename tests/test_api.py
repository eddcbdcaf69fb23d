"""The Python API end to end at a tiny budget: ``train`` with callbacks,
then ``load_policy`` / ``evaluate`` on the run folder, checked against what
the run itself computed (its final evaluation) and against a hand-played
rollout; the README's example, run as written."""

import json
import os
import re
import shutil
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

import fastpbrl
from fastpbrl.cli import commands
from fastpbrl.datapath.evaluation import evaluation_seeds
from fastpbrl.logs.logging import read_final_returns
from fastpbrl.rules import pbt as pbt_lib
from fastpbrl.run.plots import hparam_lines, read_hparams_csv
from tests import numerics
from tests.test_preemption import stopped_by_sigterm

# Floats of two routes: tests/isa_matrix.sh runs them per instruction set.
pytestmark = [pytest.mark.slow, pytest.mark.numeric]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {'env': 'Pendulum-v1', 'env_steps': 1000, 'warmup_steps': 200,
        'hidden_sizes': (16, 16), 'batch_size': 16, 'steps_per_call': 10,
        'eval_every': 200, 'num_actors': 1, 'replay_capacity': 5000,
        'eval_episodes': 2, 'ready_after': 200, 'fraction': 0.5,
        'progress': False}


class Recorder(fastpbrl.Callback):

  def __init__(self):
    self.calls, self.events, self.order = [], [], []

  def after_call(self, loop):
    self.calls.append(loop.calls)
    self.order.append('call')

  def after_rule_decision(self, loop, event):
    self.events.append(event)
    self.order.append('event')


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  recorder = Recorder()
  run_dir = str(tmp_path_factory.mktemp('api') / 'pbt')
  result = fastpbrl.train('pbt', population_size=4, run_dir=run_dir,
                          callbacks=[recorder], **TINY)
  return result, recorder


def test_train_reports_the_best_member_its_checkpoint_and_lineage(trained):
  result, recorder = trained
  saved = read_final_returns(result.run_dir)
  # JSON writes a float's repr, which reads back to the same float: exact.
  assert saved['final_returns'] == result.run.final_returns
  assert result.best_member == int(np.argmax(saved['final_returns']))
  assert result.best_final_return == max(saved['final_returns'])
  assert fastpbrl.best_member(result.run_dir) == result.best_member
  assert os.path.isdir(result.checkpoint)
  assert os.path.basename(result.checkpoint) == str(saved['checkpoint_step'])
  assert result.lineage == pbt_lib.read_lineage(
      os.path.join(result.run_dir, 'lineage.jsonl'))
  for name in ('returns.png', 'lineage.png', 'hparams.png'):
    assert os.path.getsize(os.path.join(result.run_dir, name)) > 5000


def test_callbacks_see_every_call_and_every_exploit(trained):
  result, recorder = trained
  assert recorder.calls == list(range(1, result.run.calls + 1))
  exploits = [e for e in result.lineage if e['event'] == 'exploit']
  assert exploits, 'PBT never exploited'
  assert recorder.events == exploits  # the same dicts as the lineage lines
  assert all('env_steps' in e for e in result.lineage)
  assert recorder.order[-1] == 'call'  # decisions come before their call


def test_hparams_csv_ends_with_the_final_hyperparameters(trained):
  result, _ = trained
  lines = hparam_lines(read_hparams_csv(result.run_dir))
  # The CSV and the lineage hold float(x) of the same float32 values, as
  # their reprs, which read back to the same floats: exact.
  for member, final in enumerate(result.run.hparams):
    for name, value in final.items():
      assert lines[name][member][1][-1] == value
  # Every exploit's new hyperparameters appear at its env step.
  for e in result.lineage:
    if e['event'] == 'exploit':
      xs, ys = lines['policy_lr'][e['member']]
      assert ys[xs.index(e['env_steps'])] == e['new_hparams']['policy_lr']


def test_evaluate_replays_the_runs_final_evaluation(trained, monkeypatch):
  result, _ = trained
  # A relative run folder, as a user would type it.
  monkeypatch.chdir(os.path.dirname(result.run_dir))
  relative = os.path.basename(result.run_dir)
  for member in ('best', 1):
    scores = fastpbrl.evaluate(relative, member=member, episodes=2, seed=0)
    index = result.best_member if member == 'best' else member
    assert scores.member == index
    # One observation at a time against the run's batch of all members'
    # episodes: float32 actions may round apart, by <= 64 roundings of sums
    # of size <= 4 (3e-5, rule 1), and Pendulum's returns move by less than
    # that relative change of every action (measured: one ulp of every
    # action moves a return by < 1e-7). Members' means lie ~1% apart or more.
    assert scores.mean == pytest.approx(result.run.final_returns[index],
                                        rel=1e-4)
    # evaluate computes std as np.std of these very returns: exact.
    assert scores.std == np.std(scores.returns)


def test_load_policy_acts_like_evaluate_single_or_batched(trained):
  result, _ = trained
  policy = fastpbrl.load_policy(result.run_dir, member=2)
  env = gym.make('Pendulum-v1')
  returns = []
  for reset_seed in evaluation_seeds(7, 2, 2):
    obs, _ = env.reset(seed=reset_seed)
    total, done = 0.0, False
    while not done:
      action = policy(obs)
      assert action.shape == (1,) and -2.0 <= action[0] <= 2.0
      obs, reward, terminated, truncated, _ = env.step(action)
      total += reward
      done = terminated or truncated
    returns.append(total)
  scores = fastpbrl.evaluate(result.run_dir, member=2, episodes=2, seed=7)
  # evaluate plays this very loop (the same policy program, env and seeds,
  # the same sums in the same order): exact.
  assert scores.returns == returns
  batch = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  batched = policy(batch)
  assert batched.shape == (5, 1)
  # Rule 1: three layers (4, 17 and 17 terms, each one's error carried on
  # through the next one's weights) and tanh: <= 64 roundings of sums of
  # size <= 4, times the action scale 2. A mixed-up batch row is off by ~1.
  np.testing.assert_allclose(batched, np.stack([policy(o) for o in batch]),
                             rtol=0, atol=2 * 4 * numerics.rounding_rtol(64))
  with pytest.raises(ValueError, match=r'expected \(3,\)'):
    policy(np.zeros(4))


def test_predict_is_sb3s_and_explores_when_asked(trained):
  """``predict`` returns ``(action, None)`` as Stable-Baselines3's does:
  the evaluation action when deterministic, else the member's training
  exploration (TD3: Gaussian noise of its exploration_noise, clipped)."""
  result, _ = trained
  policy = fastpbrl.load_policy(result.run_dir, member=1)
  batch = np.tile(np.float32([[0.3, -0.9, 0.5]]), (400, 1))
  action, state = policy.predict(batch)
  assert state is None
  # The same program on the same inputs: exact.
  np.testing.assert_array_equal(action, policy(batch))
  noisy, _ = policy.predict(batch, deterministic=False)
  assert noisy.shape == (400, 1) and np.all(np.abs(noisy) <= 2.0)
  # Noise of std sigma (in [-1, 1] units) times the action scale 2, clipped
  # at the bounds: the spread is positive and at most 2 sigma.
  sigma = float(np.asarray(policy._hparams.exploration_noise))
  spread = float(np.std(noisy - action))
  assert 0 < spread <= 2 * sigma * (1 + 4 / np.sqrt(2 * 400)), (spread, sigma)


def test_sb3_evaluate_policy_runs_a_member(trained):
  """Stable-Baselines3's own ``evaluate_policy`` (``.[torch]`` extra) plays
  a member through ``predict``: the returns its wrapper records are those
  of our own evaluation of the same episodes."""
  evaluation = pytest.importorskip(
      'stable_baselines3.common.evaluation', reason='the .[torch] extra')
  vec_env = pytest.importorskip('stable_baselines3.common.vec_env')
  result, _ = trained
  policy = fastpbrl.load_policy(result.run_dir, member=0)
  env = vec_env.DummyVecEnv([lambda: gym.make('Pendulum-v1')])
  env.seed(int(evaluation_seeds(3, 0, 1)[0]))  # its first reset's seed
  returns, _ = evaluation.evaluate_policy(policy, env, n_eval_episodes=1,
                                          return_episode_rewards=True,
                                          warn=False)
  ours = fastpbrl.evaluate(result.run_dir, member=0, episodes=1, seed=3)
  # The same policy program, env and reset seed. SB3's vectorized env keeps
  # each reward as float32 (one rounding each; Pendulum's rewards all have
  # one sign, so the sum's relative error is at most one float32 rounding),
  # then sums as ours does: rule 1 with k = 2 in float32.
  np.testing.assert_allclose(returns, ours.returns,
                             rtol=numerics.rounding_rtol(2, np.float32))


def test_save_and_load_one_members_policy(trained, tmp_path):
  """``Policy.save`` writes one member alone (kilobytes, not the
  population's checkpoint); ``load_policy`` of the file acts exactly as the
  policy it was saved from."""
  result, _ = trained
  policy = fastpbrl.load_policy(result.run_dir, member=3)
  path = str(tmp_path / 'member3.npz')
  policy.save(path)
  assert os.path.getsize(path) < 100_000
  loaded = fastpbrl.load_policy(path)
  assert (loaded.member, loaded.env_id, loaded.agent_ref) == (3, 'Pendulum-v1',
                                                               'td3')
  batch = np.random.default_rng(1).normal(size=(16, 3)).astype(np.float32)
  # The same parameters through the same program: exact.
  np.testing.assert_array_equal(loaded(batch), policy(batch))
  (tmp_path / 'junk.npz').write_bytes(b'not a policy')
  with pytest.raises(fastpbrl.ConfigError, match='not a policy file'):
    fastpbrl.load_policy(str(tmp_path / 'junk.npz'))


def test_evaluate_command_prints_mean_and_std(trained, capsys):
  result, _ = trained
  assert commands.main(['evaluate', result.run_dir, '--episodes', '2',
                        '--json']) == 0
  printed = json.loads(capsys.readouterr().out)
  assert printed['member'] == result.best_member
  # As in test_evaluate_replays_the_runs_final_evaluation: float32 actions
  # rounded apart (3e-5), which Pendulum's returns do not amplify.
  assert printed['mean'] == pytest.approx(
      result.run.final_returns[result.best_member], rel=1e-4)
  assert commands.main(['evaluate', result.run_dir, '--member', '9']) == 2
  assert capsys.readouterr().err.strip() == (
      'error: --member 9 is out of range: the run has 4 members (0..3)')


def test_evaluate_writes_a_video(trained, tmp_path):
  pytest.importorskip('moviepy')
  pytest.importorskip('pygame')  # Pendulum's renderer
  result, _ = trained
  scores = fastpbrl.evaluate(result.run_dir, member=0, episodes=1,
                             video_dir=str(tmp_path / 'videos'))
  assert len(scores.videos) == 1 and scores.videos[0].endswith('.mp4')
  assert os.path.getsize(scores.videos[0]) > 1000
  # Recording does not change what is played.
  plain = fastpbrl.evaluate(result.run_dir, member=0, episodes=1)
  # The same episode through the same policy program (rendering reads the
  # state, never changes it): exact.
  assert scores.returns == plain.returns


def test_train_refuses_unknown_settings_naming_them():
  with pytest.raises(fastpbrl.ConfigError, match="no setting 'env_step' "
                     r'\(--env-step\)'):
    fastpbrl.train('pbt', env_step=10)
  with pytest.raises(fastpbrl.ConfigError, match="rule 'ppo' is unknown"):
    fastpbrl.train('ppo')
  with pytest.raises(fastpbrl.ConfigError, match='--env-steps must be > 0'):
    fastpbrl.train('seeds', env_steps=0)
  # Hyperparameters as a dict: checked as --hparams is, before any process.
  with pytest.raises(fastpbrl.ConfigError, match="td3 has no hyperparameter "
                     "'policy_learning_rate'; did you mean policy_lr?"):
    fastpbrl.train('seeds', hparams={'policy_learning_rate': 1e-3})
  with pytest.raises(fastpbrl.ConfigError, match='--hparams discount=0.9 is '
                     'outside the search space'):
    fastpbrl.train('pbt', hparams={'discount': 0.9},
                   search_space={'discount': {'kind': 'discount', 'low': 0.95,
                                              'high': 0.99}})


def run_example(tmp_path, code: str) -> str:
  """Runs ``code`` in a fresh interpreter in ``tmp_path``, with the
  repository and ``examples/`` importable; its standard output."""
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
      [ROOT, os.path.join(ROOT, 'examples')])}
  out = subprocess.run([sys.executable, '-c', code], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  return out.stdout


def test_readme_quickstart_is_the_file_and_runs(tmp_path):
  with open(os.path.join(ROOT, 'examples', 'quickstart.py')) as f:
    example = f.read()
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  assert f'```python\n{example}```' in readme
  assert len(example.splitlines()) <= 15
  tiny = {k: v for k, v in TINY.items() if k != 'env'}
  stdout = run_example(tmp_path, (
      'import quickstart\n'
      f'policy, scores, run = quickstart.main(**{tiny!r})\n'
      'assert scores.member == run.best_member\n'
      'assert list(run.hparam_schedule().columns)[0] == "update_steps"\n'))
  assert 'policy_lr' in stdout


def test_the_api_example_runs(tmp_path):
  tiny = {k: v for k, v in TINY.items() if k not in ('env', 'progress')}
  stdout = run_example(tmp_path, (
      'import api_example\n'
      f'result, scores = api_example.main(**{tiny!r})\n'
      'assert scores.member == result.best_member\n'))
  assert 'best member' in stdout and 'action [' in stdout
  assert os.listdir(tmp_path / 'runs')[0].startswith('pbt-td3-Pendulum-v1-')


def test_a_callback_ends_the_run_as_a_spent_budget(tmp_path):
  """``TimeLimit`` ends a run early: it stops after the call the limit
  passed, with a checkpoint, a final evaluation and the summary, as a
  spent budget would."""
  tiny = {**TINY, 'env_steps': 100_000, 'eval_every': 100_000}
  del tiny['ready_after'], tiny['fraction']
  result = fastpbrl.train('seeds', population_size=2, callbacks=[
      fastpbrl.TimeLimit(1e-6)], run_dir=str(tmp_path / 'run'), **tiny)
  assert result.run.calls == 2  # the first call starts the clock
  assert result.run.env_steps < 100_000
  assert len(result.run.final_returns) == 2
  assert os.path.exists(os.path.join(result.run_dir, 'summary.txt'))
  assert os.path.basename(result.checkpoint) == '2'


def test_train_runs_where_main_has_no_file(tmp_path):
  """A notebook's kernel has a ``__main__`` without a file, as ``python
  -c`` has: the actor processes do not re-import it, and the run
  finishes without a ``__main__`` guard."""
  settings = {**TINY, 'population_size': 2, 'track': 'none',
              'run_dir': str(tmp_path / 'run')}
  code = ('import fastpbrl\n'
          f'result = fastpbrl.train("pbt", **{settings!r})\n'
          'print("best", result.best_member)\n')
  proc = subprocess.run([sys.executable, '-c', code], cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-5000:]
  assert re.search(r'^best [01]$', proc.stdout, re.M), proc.stdout
  assert 'died' not in proc.stderr  # no actor failed to start


def saved_settings(run_dir) -> dict:
  """A run's config.json, less what names its folder."""
  with open(os.path.join(run_dir, 'config.json')) as f:
    saved = json.load(f)
  return {k: v for k, v in saved.items()
          if k not in ('run_dir', 'resume', 'progress')}


def test_train_resume_continues_with_the_saved_settings(tmp_path):
  """A 2-member PBT run of the command, stopped by SIGTERM after a
  checkpoint; ``fastpbrl.train(resume=DIR)`` and nothing else finishes it
  with the settings it started with, as ``fastpbrl pbt --resume DIR``
  finishes a copy of it."""
  flags = ['--population-size', '2', '--env-steps', '1500',
           '--warmup-steps', '200', '--hidden-sizes', '16', '12',
           '--batch-size', '16', '--steps-per-call', '10', '--eval-every',
           '200', '--eval-episodes', '1', '--num-actors', '1',
           '--replay-capacity', '5000', '--ready-after', '200',
           '--checkpoint-every', '50', '--no-progress', '--track', 'none']
  by_api, by_command = str(tmp_path / 'api'), str(tmp_path / 'command')
  stopped_by_sigterm(flags, by_api, 'experiments.pbt')
  started = saved_settings(by_api)
  shutil.copytree(by_api, by_command)

  result = fastpbrl.train(resume=by_api)
  proc = subprocess.run(
      [sys.executable, '-m', 'experiments.pbt', '--resume', by_command],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-5000:]
  assert result.run_dir == by_api
  assert saved_settings(by_api) == saved_settings(by_command) == started
  assert started['population_size'] == 2
  assert started['hidden_sizes'] == [16, 12]
  for run_dir in (by_api, by_command):
    returns = read_final_returns(run_dir)
    assert len(returns['final_returns']) == 2, run_dir
    assert returns['env_steps'] >= 1500, run_dir
