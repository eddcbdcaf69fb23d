"""JAX env families registered from user code (``fastpbrl.envs.register``,
``fastpbrl/envs/jax_envs.py``): a family written here, a counter whose
rewards fix every episode's return whatever the agent does, runs through
``fastpbrl.train`` on the device and through ``GymnasiumView``, and its
returns are the ones its reward implies; the guide's family steps as the
guide's gymnasium env; the registry refuses unknown and taken prefixes
with one line."""

import os
import re
import subprocess
import sys
import types

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from acme import specs

import fastpbrl
from fastpbrl.envs import gym as envs
from fastpbrl.envs import jax_envs
from fastpbrl.envs import register, spec_of
from fastpbrl.envs.jax_envs import JaxEnv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
PREFIX = 'counter_test'
TIME_LIMIT = 4


@register(PREFIX)
def make_counter(env_id: str, name: str) -> JaxEnv:
  """``counter_test:N``: step ``t`` (from 1) rewards ``t``, and the episode
  terminates after ``N`` steps, or is cut at ``TIME_LIMIT``."""
  if not name.isdigit() or int(name) < 1:
    raise ValueError(f'{name!r} is not a number of steps')
  steps = int(name)

  def reset(key):
    del key
    return jnp.int32(0), jnp.zeros(1, jnp.float32)

  def step(t, action, key):
    del action, key  # the return is the same whatever the agent does
    t = t + 1
    return (t, jnp.full(1, t / 10, jnp.float32), t.astype(jnp.float32),
            t >= steps)

  return JaxEnv(env_id, spec_of(
      specs.Array((1,), np.float32, name='observation'),
      specs.BoundedArray((1,), np.float32, -1.0, 1.0, name='action')),
      TIME_LIMIT, reset, step)


def expected_episode(steps: int) -> tuple[float, int]:
  """The return and length of an episode of ``counter_test:steps``: the
  sum of 1..L, L the steps it lasts."""
  length = min(steps, TIME_LIMIT)
  return length * (length + 1) / 2, length


def test_the_api_names_the_registry():
  assert fastpbrl.envs.register is jax_envs.register is register
  assert jax_envs.known()[:3] == ('gymnax', 'brax', 'shaped')
  assert PREFIX in jax_envs.known()
  assert jax_envs.is_jax_env(f'{PREFIX}:3')
  assert not jax_envs.is_jax_env('fastpbrl.envs.shaping:ShapedMountainCar-v0')


@pytest.mark.parametrize('steps', [3, 9])  # terminated; cut by the limit
def test_the_gymnasium_view_plays_a_registered_family(steps):
  env = envs.make_env(f'{PREFIX}:{steps}')
  env.reset(seed=0)
  rewards, done = [], (False, False)
  while not any(done):
    _, reward, *done, _ = env.step(np.zeros(1, np.float32))
    rewards.append(reward)
  total, length = expected_episode(steps)
  assert (sum(rewards), len(rewards)) == (total, length)
  assert done == [steps <= TIME_LIMIT, steps > TIME_LIMIT]


def test_a_registered_family_trains_on_the_device(tmp_path):
  """``seeds`` of 2 TD3 members on ``counter_test:3`` for 24 env steps
  each: 8 episodes each, and every episode, in training, in the
  evaluations and in the final one, returns 1 + 2 + 3 in 3 steps."""
  fastpbrl.train('seeds', env=f'{PREFIX}:3', run_dir=str(tmp_path / 'run'),
                 population_size=2, env_steps=24, warmup_steps=0,
                 hidden_sizes=(8,), batch_size=4, steps_per_call=4,
                 eval_every=24, eval_episodes=1, progress=False,
                 track='none')
  run = fastpbrl.load_run(str(tmp_path / 'run'))
  total, length = expected_episode(3)
  episodes = run.episodes
  training = episodes[~episodes['evaluation']]
  assert training.groupby('member').size().tolist() == [24 // length] * 2
  assert episodes['evaluation'].any()
  assert (episodes['episode_return'] == total).all()
  assert (episodes['episode_length'] == length).all()
  assert list(run.final_returns) == [total, total]


def test_an_unknown_prefix_is_one_line_naming_the_families():
  with pytest.raises(jax_envs.JaxEnvError) as e:
    jax_envs.make('nope:Thing-v0')
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith("--env 'nope:Thing-v0': no JAX env family "
                            "'nope'; the families are gymnax, brax, shaped, ")
  assert PREFIX in message and 'fastpbrl.envs.register' in message
  assert not jax_envs.is_jax_env('nope:Thing-v0')
  # A run reads it as gymnasium's module:EnvId; its one line names both.
  with pytest.raises(fastpbrl.ConfigError) as e:
    fastpbrl.train('seeds', env='nope:Thing-v0', progress=False, track='none')
  message = str(e.value)
  assert '\n' not in message
  assert "module 'nope' cannot be imported" in message
  assert "JAX env family 'nope'" in message and PREFIX in message


def test_a_family_refusing_a_name_is_one_line_naming_env():
  with pytest.raises(jax_envs.JaxEnvError,
                     match=rf"^--env '{PREFIX}:x': 'x' is not a number"):
    jax_envs.make(f'{PREFIX}:x')


def test_a_taken_or_malformed_prefix_is_refused():
  assert register(PREFIX)(make_counter) is make_counter  # itself: again

  def other(env_id, name):
    return make_counter(env_id, name)

  with pytest.raises(ValueError, match=f"'{PREFIX}' is already registered "
                     f'by {__name__}.make_counter'):
    register(PREFIX)(other)
  with pytest.raises(ValueError, match="'gymnax' is built in"):
    register('gymnax')(other)
  for bad in ('my.module', 'a:b', '', 'two words'):
    with pytest.raises(ValueError, match='prefix is a word'):
      register(bad)
  assert jax_envs.family(PREFIX) is make_counter


def test_built_in_families_import_their_library_only_when_used():
  """``import fastpbrl.envs`` imports no JAX; knowing an id is a JAX env's
  imports no family; making a gymnax env imports gymnax, never Brax."""
  code = (
      'import sys\n'
      'import fastpbrl.envs\n'
      'assert "jax" not in sys.modules\n'
      'from fastpbrl.envs import jax_envs\n'
      'assert jax_envs.is_jax_env("brax:hopper")\n'
      'assert jax_envs.is_jax_env("shaped:MountainCar-v0")\n'
      'assert not {"gymnax", "brax", "fastpbrl.envs.gymnax_envs",\n'
      '            "fastpbrl.envs.shaping"} & set(sys.modules)\n'
      'jax_envs.make("shaped:MountainCar-v0")\n'
      'assert "gymnax" in sys.modules and "brax" not in sys.modules\n')
  done = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr


def test_the_shaped_task_is_a_family_of_its_own_module():
  """The shaped example registers from ``fastpbrl.envs.shaping``: gymnax's
  MountainCar, its spec unchanged, with the bonus as an env parameter
  (``tests/test_env_params.py`` checks its rewards)."""
  from fastpbrl.envs import shaping  # noqa: PLC0415
  assert jax_envs.family('shaped') is shaping.make_shaped
  shaped = jax_envs.make('shaped:MountainCar-v0')
  plain = jax_envs.make('gymnax:MountainCar-v0')
  assert shaped.env_id == 'shaped:MountainCar-v0'
  assert (shaped.env_spec, shaped.max_episode_steps) == (
      plain.env_spec, plain.max_episode_steps)
  assert dict(shaped.env_params) == shaping.ENV_PARAMS
  assert plain.env_params == () and plain.objective is None


def guide_module(marker: str, name: str) -> types.ModuleType:
  """The python block after ``<!-- marker -->`` in the own-env guide, run
  as a module ``name`` (not put in ``sys.modules``)."""
  with open(os.path.join(ROOT, 'docs', 'guides', 'own-env.md')) as f:
    match = re.search(rf'^<!-- {re.escape(marker)} -->\n```python\n(.*?)^```',
                      f.read(), re.S | re.M)
  module = types.ModuleType(name)
  exec(compile(match.group(1), f'{name}.py', 'exec'), module.__dict__)
  return module


def test_the_guides_family_steps_as_the_guides_gymnasium_env(monkeypatch):
  """``point:Line-v0`` of docs/guides/own-env.md, from the same state and
  actions, gives the observations and rewards of the page's gymnasium
  ``PointEnv`` (float32 against its float64 arithmetic)."""
  monkeypatch.setattr(jax_envs, '_REGISTRY', dict(jax_envs._REGISTRY))
  monkeypatch.setattr(gym, 'register', lambda *args, **kwargs: None)
  guide_module('jax-family: point_family.py', 'point_family')
  reference = guide_module('recipe-file: point_env.py', 'point_env').PointEnv()
  env = jax_envs.make('point:Line-v0')
  assert env.env_spec.observations.shape == (2,)
  assert env.max_episode_steps == 50
  state, obs = env.reset(jax.random.PRNGKey(0))
  reference.reset(seed=0)
  reference.position, reference.velocity = (float(v) for v in state)
  step = jax.jit(env.step)
  rng = np.random.default_rng(0)
  for _ in range(env.max_episode_steps):
    action = rng.uniform(-1, 1, (1,)).astype(np.float32)
    state, obs, reward, terminated = step(state, action, jax.random.PRNGKey(1))
    ref_obs, ref_reward, *_ = reference.step(action)
    np.testing.assert_allclose(obs, ref_obs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(reward, ref_reward, rtol=1e-5, atol=1e-6)
    assert not terminated
  with pytest.raises(jax_envs.JaxEnvError,
                     match=r"^--env 'point:Nope': no point env 'Nope'"):
    jax_envs.make('point:Nope')
