"""Environment construction: Atari ids get Nature DQN's preprocessing (84x84x4
uint8 frames, clipped rewards, the game score kept), other ids are plain
``gymnasium.make``; a missing ale-py is a one-line error naming the extra."""

import importlib.util
import json
import os
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest

from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.envs import gym as envs
from fastpbrl.run import build

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HAS_ATARI = all(importlib.util.find_spec(m) is not None
                for m in ('ale_py', 'cv2'))
needs_atari = pytest.mark.skipif(
    not HAS_ATARI, reason="ale-py and OpenCV not installed: pip install -e "
    "'.[atari]' (or '.[test]') to test the Atari pipeline")


@needs_atari
def test_pong_is_84x84x4_uint8_frames_and_dqn_takes_it():
  env = envs.make_env('ALE/Pong-v5')
  try:
    assert env.observation_space.shape == (84, 84, 4)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8
    frames = [obs]
    for _ in range(3):
      frames.append(env.step(0)[0])
    # Channels are the stacked frames, oldest first: each step shifts them.
    np.testing.assert_array_equal(frames[3][..., :3], frames[2][..., 1:])
    assert env.unwrapped._frameskip == 1  # frames are skipped in the wrapper
  finally:
    env.close()
  spec = build.make_env_spec('ALE/Pong-v5')
  assert tuple(spec.observations.shape) == (84, 84, 4)
  assert spec.observations.dtype == np.uint8
  agent = build.make_agent(RunConfig(agent='dqn', env='ALE/Pong-v5'), spec)
  assert agent.env_spec.actions.num_values == 6
  assert float(agent.default_hparams().epsilon_decay_steps) == 1e6


@needs_atari
def test_rewards_are_clipped_and_the_game_score_kept():
  """Space Invaders pays 5 to 30 points an alien; the agent sees +1."""
  env = envs.make_env('ALE/SpaceInvaders-v5')
  rng = np.random.default_rng(0)
  rewards = []
  try:
    env.reset(seed=0)
    done = False
    while not done:
      _, r, terminated, truncated, info = env.step(int(rng.integers(6)))
      rewards.append(r)
      done = terminated or truncated
  finally:
    env.close()
  assert set(rewards) <= {0.0, 1.0} and 1.0 in rewards
  score = info['true_objective']
  assert score >= 5 * sum(rewards)  # every alien is worth 5 points or more
  assert score % 5 == 0


def test_game_score_sums_unclipped_rewards_of_the_episode():

  class Scripted(gym.Env):
    observation_space = gym.spaces.Box(0, 1, (1,), np.float32)
    action_space = gym.spaces.Discrete(1)

    def reset(self, *, seed=None, options=None):
      self.t = 0
      return np.zeros(1, np.float32), {}

    def step(self, action):
      self.t += 1
      reward = [7.0, -3.0, 0.5][self.t - 1]
      return np.zeros(1, np.float32), reward, self.t == 3, False, {}

  env = gym.wrappers.ClipReward(envs.GameScore(Scripted()), -1.0, 1.0)
  for _ in range(2):  # the score restarts with each episode
    env.reset()
    steps = [env.step(0) for _ in range(3)]
    assert [s[1] for s in steps] == [1.0, -1.0, 0.5]
    assert 'true_objective' not in steps[1][4]
    assert steps[2][4]['true_objective'] == 4.5


def test_other_ids_are_plain_gymnasium():
  env = envs.make_env('CartPole-v1')
  try:
    assert env.observation_space.shape == (4,)
    assert not envs.is_atari('CartPole-v1')
  finally:
    env.close()


def test_atari_without_ale_py_names_the_extra(monkeypatch):
  monkeypatch.setattr(envs, '_register_ale', lambda: False)
  with pytest.raises(gym.error.DependencyNotInstalled, match=r"\.\[atari\]"):
    envs.make_env('ALE/Pong-v5')
  with pytest.raises(ConfigError, match=(
      r"--env 'ALE/Pong-v5' cannot be made: .*\.\[atari\]")):
    build.make_env_spec('ALE/Pong-v5')


def test_preset_atari_is_nature_dqns_schedule():
  from experiments import pbt
  from fastpbrl.agents import dqn
  from fastpbrl.cli import parse as cli
  from fastpbrl.rules.pbt import PBT
  config = cli.parse(pbt.PRESETS, 'x', ['--preset', 'atari'])
  assert (config.agent, config.env) == ('dqn', 'ALE/Pong-v5')
  assert (config.update_to_data_ratio, config.warmup_steps,
          config.replay_capacity, config.warmup_counts_as_data) == (
              0.25, 50_000, 100_000, False)
  assert {k: getattr(config, k) for k in dqn.NATURE_ATARI_RUN} == (
      dqn.NATURE_ATARI_RUN)
  PBT(config)  # passes PBT's checks (an evaluation in every span)


@needs_atari
def test_dqn_on_frames_warns_when_flags_are_not_natures(monkeypatch):
  warnings = []
  monkeypatch.setattr(build.log, 'warning',
                      lambda message, *args: warnings.append(message % args))
  spec = build.make_env_spec('ALE/Pong-v5')
  nature = dict(update_to_data_ratio=0.25, warmup_steps=50_000,
                replay_capacity=100_000, warmup_counts_as_data=False)
  build.make_agent(RunConfig(agent='dqn', env='ALE/Pong-v5', **nature), spec)
  assert not warnings
  build.make_agent(RunConfig(agent='dqn', env='ALE/Pong-v5'), spec)
  assert len(warnings) == 1
  assert '--update-to-data-ratio 1.0 (reference: 0.25)' in warnings[0]
  assert '--replay-capacity 1000000 (reference: 100000)' in warnings[0]
  assert ('--warmup-counts-as-data (reference: --no-warmup-counts-as-data)'
          in warnings[0])


# The run below plays whole games of Pong through the Nature CNN at every
# evaluation: at the suite's XLA optimisation level 0 (tests/conftest.py)
# the run took 216 s of CPU against 38 s at XLA's default level (2-core AMD
# EPYC), far more than the compile time level 0 saves. So the run goes in a
# process of its own, with XLA's default level.
_PONG_RUN = """
import json, sys
from experiments import pbt
result = pbt.main(sys.argv[1:])
print(json.dumps({'env_steps': result.env_steps,
                  'update_steps': result.update_steps, 'calls': result.calls,
                  'final_returns': result.final_returns}))
"""


def _default_xla_optimisation(environ) -> dict:
  flags = [flag for flag in environ.get('XLA_FLAGS', '').split()
           if not flag.startswith('--xla_backend_optimization_level')]
  return {**environ, 'XLA_FLAGS': ' '.join(flags)}


@needs_atari
@pytest.mark.slow
def test_pbt_of_two_dqn_members_on_pong(tmp_path):
  from fastpbrl.logs.logging import read_member_csvs
  out = subprocess.run([
      sys.executable, '-c', _PONG_RUN,
      '--preset', 'atari', '--population-size', '2', '--env-steps', '400',
      '--warmup-steps', '200', '--batch-size', '8', '--num-actors', '1',
      '--replay-capacity', '1000', '--eval-every', '80',
      '--eval-episodes', '1', '--ready-after', '80', '--no-progress',
      '--run-dir', str(tmp_path / 'pong')],
      cwd=ROOT, env=_default_xla_optimisation(os.environ),
      capture_output=True, text=True, timeout=1800, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result['env_steps'] >= 400
  # One update per 4 env steps after the warm-up (none for the warm-up's
  # random steps: the preset's --no-warmup-counts-as-data), in calls of 10.
  assert result['update_steps'] == result['calls'] * 10
  assert result['update_steps'] <= (result['env_steps'] - 200) / 4 + 10
  assert len(read_member_csvs(str(tmp_path / 'pong'))) == 2
  # Pong's clipped score of the final evaluation: -21 to 21.
  assert len(result['final_returns']) == 2
  assert all(-21 <= r <= 21 for r in result['final_returns'])
