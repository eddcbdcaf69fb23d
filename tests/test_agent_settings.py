"""--agent-settings, the per-agent --hidden-sizes default, and the run
settings refused for an agent that learns from its own rollouts."""

import dataclasses
import json

import pytest

import fastpbrl
from examples import a2c
from fastpbrl.config.agent_settings import (agent_config, hidden_sizes_of,
                                            steps_per_call_of)
from fastpbrl.config.checks import validate
from fastpbrl.config.derived import as_learner_calls, resolved
from fastpbrl.config.errors import ConfigError
from fastpbrl.config.fields import RunConfig
from fastpbrl.config.saved import check_resume, saved_config
from fastpbrl.run import build

A2C = 'examples.a2c:A2C'


def _refused(config: RunConfig) -> str:
  with pytest.raises(ConfigError) as info:
    validate(resolved(config))
  return str(info.value)


def test_agent_settings_set_fields_of_any_agent_parsed_to_their_types():
  td3 = agent_config(RunConfig(
      agent='td3', agent_settings=('batch_size=64', 'hidden_sizes=32,16')))
  assert td3.batch_size == 64 and td3.hidden_sizes == (32, 16)
  assert td3.steps_per_call == 50  # a replay agent's stays its own
  rollout = RunConfig(agent=A2C, env='gymnax:CartPole-v1',
                      agent_settings=('rollout_length=16', 'num_envs=4'))
  made = agent_config(rollout)
  # steps_per_call=None reaches the rollout agent's config: it derives T x E,
  # and so does every interval that counts learner calls.
  assert made == a2c.A2CConfig(rollout_length=16, num_envs=4)
  assert made.steps_per_call == 64 and made.batch_size == 64
  assert steps_per_call_of(rollout) == 64
  assert as_learner_calls(640, rollout) == 10
  assert steps_per_call_of(
      dataclasses.replace(rollout, steps_per_call=128)) == 128
  agent = build.make_agent(rollout, build.make_env_spec(rollout.env))
  assert agent.config == made and agent.learns_from == 'rollout'
  # The built-in PPO: its own minibatch size, T x E steps per call.
  ppo = agent_config(RunConfig(agent='ppo', agent_settings=(
      'rollout_length=128', 'num_envs=8', 'epochs=4', 'activation=relu')))
  assert (ppo.rollout_length, ppo.num_envs, ppo.epochs, ppo.activation,
          ppo.batch_size, ppo.steps_per_call) == (128, 8, 4, 'relu', 64, 1024)


@pytest.mark.parametrize('settings, message', [
    (('rollout_lenght=3',), "--agent-settings rollout_lenght=3: --agent "
     "examples.a2c:A2C has no setting 'rollout_lenght'; did you mean "
     "rollout_length?"),
    (('num_envs=two',), "--agent-settings num_envs=two: 'two' is not an "
     'integer'),
    (('num_envs',), "--agent-settings 'num_envs': expected NAME=VALUE"),
    (('num_envs=2', 'num_envs=3'), '--agent-settings sets num_envs twice'),
    (('batch_size=7',), '--agent examples.a2c:A2C --agent-settings '
     'batch_size=7: batch_size 7: A2C takes one step on the whole rollout'),
])
def test_a_bad_agent_setting_is_one_line_naming_the_flag(settings, message):
  assert _refused(RunConfig(agent=A2C, agent_settings=settings)).startswith(
      message)


def test_a_setting_given_by_a_flag_and_agent_settings_is_refused():
  assert _refused(RunConfig(agent='td3', steps_per_call=10,
                            agent_settings=('steps_per_call=20',))) == (
      '--steps-per-call and --agent-settings steps_per_call=... both set '
      'steps_per_call; give one')
  assert _refused(RunConfig(agent='dqn', hidden_sizes=(8,),
                            agent_settings=('mlp_hidden_sizes=8',))) == (
      '--hidden-sizes and --agent-settings mlp_hidden_sizes=... both set '
      'mlp_hidden_sizes; give one')


def test_hidden_sizes_default_to_the_agents_own():
  assert hidden_sizes_of(RunConfig(agent='td3')) == (256, 256)
  assert hidden_sizes_of(RunConfig(agent='dqn')) == (256, 256)
  assert hidden_sizes_of(RunConfig(agent=A2C)) == (64, 64)
  assert hidden_sizes_of(RunConfig(agent='ppo')) == (64, 64)
  assert hidden_sizes_of(RunConfig(agent='examples.ddpg:DDPG')) == (
      400, 300)
  assert hidden_sizes_of(RunConfig(agent=A2C,
                                              hidden_sizes=(8,))) == (8,)


def _saved_run(tmp_path, **settings):
  run = tmp_path / 'run'
  (run / 'checkpoints').mkdir(parents=True)
  (run / 'config.json').write_text(json.dumps(
      {'rule': 'seeds', 'env': 'Pendulum-v1', 'population_size': 4,
       **settings}))
  return str(run)


def test_a_run_saved_with_the_old_default_widths_resumes(tmp_path):
  # config.json of a TD3 run from before the per-agent default: [256, 256].
  run = _saved_run(tmp_path, agent='td3', hidden_sizes=[256, 256])
  resumed = saved_config(run, RunConfig(resume=run))
  check_resume(resumed, 'seeds')
  # The same widths left unset, or given: the same network.
  check_resume(dataclasses.replace(resumed, hidden_sizes=None),
                          'seeds')
  new = _saved_run(tmp_path / 'new', agent='td3', hidden_sizes=None)
  check_resume(RunConfig(resume=new, hidden_sizes=(256, 256)),
                          'seeds')
  with pytest.raises(ConfigError, match=r'^--hidden-sizes \(64, 64\) '
                     r'differs from the resumed run\'s \(256, 256\)'):
    check_resume(dataclasses.replace(resumed, hidden_sizes=(64, 64)),
                            'seeds')
  with pytest.raises(ConfigError, match='^--agent-settings'):
    check_resume(dataclasses.replace(
        resumed, agent_settings=('batch_size=8',)), 'seeds')


@pytest.mark.parametrize('change, message', [
    ({'update_to_data_ratio': 2.0}, '--update-to-data-ratio 2.0: --agent '
     'examples.a2c:A2C learns from its own rollouts, one update step per env '
     'step it learned from; leave it at 1'),
    ({'envs_per_member': 4}, '--envs-per-member 4: --agent examples.a2c:A2C '
     'learns from its own rollouts; set its envs per member with '
     '--agent-settings num_envs=4'),
    ({'shared_replay': True}, '--shared-replay: --agent examples.a2c:A2C '
     'learns from its own rollouts and keeps no replay; drop the flag'),
    ({'replay_capacity': 1000}, '--replay-capacity 1000: --agent '
     'examples.a2c:A2C learns from its own rollouts and keeps no replay'),
    ({'checkpoint_replay': True}, '--checkpoint-replay: --agent '
     'examples.a2c:A2C learns from its own rollouts and keeps no replay'),
    ({'interleave': 2}, '--interleave 2: --agent examples.a2c:A2C learns '
     'from its own rollouts and acts, then updates, once per iteration'),
])
def test_a_rollout_agent_refuses_replay_settings(change, message):
  assert _refused(RunConfig(agent=A2C, **change)).startswith(message)
  # The same settings are a replay agent's own.
  validate(resolved(RunConfig(agent='td3', **change)))


def test_a_rollout_agent_ignores_a_warmup_with_a_warning(caplog):
  # A preset's warm-up (PBT's paper preset sets 25,000) is not refused.
  config = resolved(RunConfig(agent=A2C, env='CartPole-v1',
                                         env_steps=1000, warmup_steps=5000))
  validate(config)
  build.make_agent(config, build.make_env_spec('CartPole-v1'))
  assert '--warmup-steps 5000 is ignored' in caplog.text
  caplog.clear()
  build.make_agent(resolved(dataclasses.replace(
      config, warmup_steps=None)), build.make_env_spec('CartPole-v1'))
  assert 'warmup' not in caplog.text


def test_train_takes_agent_settings_as_a_mapping():
  with pytest.raises(ConfigError, match=r'^--agent examples.a2c:A2C '
                     r'--agent-settings num_envs=2 hidden_sizes=8,8 '
                     r'batch_size=7: batch_size 7'):
    fastpbrl.train('seeds', agent=A2C, env='CartPole-v1', progress=False,
                   agent_settings={'num_envs': 2, 'hidden_sizes': (8, 8),
                                   'batch_size': 7})


def test_the_actor_paths_rollout_shapes_are_refused_before_the_run(tmp_path):
  # Gymnasium envs: one env per member, one iteration per learner call
  # (fastpbrl.datapath.actor_rollouts), refused when the agent is built, before the
  # run folder is made.
  run_dir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=r'^--agent ppo: num_envs must be 1 '
                     'with actor processes'):
    fastpbrl.train('seeds', agent='ppo', env='CartPole-v1', progress=False,
                   run_dir=str(run_dir),
                   agent_settings={'num_envs': 4, 'rollout_length': 16})
  assert not run_dir.exists()
  # JAX envs take several.
  config = RunConfig(agent='ppo', env='gymnax:CartPole-v1',
                     agent_settings=('num_envs=4', 'rollout_length=16'))
  assert build.make_agent(config, build.make_env_spec(config.env)).config \
      .num_envs == 4


def test_a_rollout_agent_records_no_warmup_by_default():
  # config.json shows what the run does: no random warm-up for PPO, the
  # budget's for TD3; a warm-up the user set is kept (and warned about).
  assert resolved(RunConfig(agent='ppo')).warmup_steps == 0
  assert resolved(RunConfig(agent='td3')).warmup_steps == 1000
  assert resolved(RunConfig(agent='ppo',
                                       warmup_steps=7)).warmup_steps == 7
