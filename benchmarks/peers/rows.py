"""The rows of ``python -m benchmarks.peers``: one task, one layout, and
the commands that train it on each side.

A :class:`Row` holds what both sides share (agent, env, members, env
steps per member, network widths, rollout layout or replay settings, the
hyperparameters by fastpbrl's names); :func:`fastpbrl_command` and
:func:`rejax_command` turn it into each side's command line, so that the
two cannot drift apart (``tests/benchmarks/test_peers.py`` reads the
layout back from both commands). Pure functions, no JAX: importable where
neither library is installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional, Sequence

# The host-device flag that gives a process one CPU device per core.
DEVICE_COUNT_FLAG = '--xla_force_host_platform_device_count'
# Variables that set the device count of a JAX process: cleared for
# fastpbrl (which chooses its own, ``fastpbrl/devices/cores.py``) and for
# rejax on one device, set for rejax's pmap variant.
DEVICE_VARIABLES = ('XLA_FLAGS', 'FASTPBRL_CPU_DEVICES')
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'rejax_train.py')

# Stable-Baselines3's PPO defaults (fastpbrl's ppo defaults too).
SB3_PPO = {'learning_rate': 3e-4, 'clip_range': 0.2, 'ent_coef': 0.0,
           'vf_coef': 0.5, 'gae_lambda': 0.95, 'discount': 0.99,
           'max_grad_norm': 0.5}
# PureJaxRL's CartPole-v1 PPO config (purejaxrl/ppo.py), less its linear
# learning-rate annealing (neither side anneals here).
PUREJAXRL_PPO = {'learning_rate': 2.5e-4, 'clip_range': 0.2,
                 'ent_coef': 0.01, 'vf_coef': 0.5, 'gae_lambda': 0.95,
                 'discount': 0.99, 'max_grad_norm': 0.5}
# TD3's (Fujimoto et al. 2018, fastpbrl's td3 defaults); noises in half
# action ranges, as fastpbrl counts them.
TD3 = {'policy_lr': 3e-4, 'critic_lr': 3e-4, 'discount': 0.99,
       'tau': 0.005, 'policy_update_fraction': 0.5,
       'exploration_noise': 0.1, 'target_noise': 0.2, 'noise_clip': 0.5}

# fastpbrl's PPO hyperparameter names -> rejax PPO's.
REJAX_PPO_NAMES = {'learning_rate': 'learning_rate',
                   'clip_range': 'clip_eps', 'ent_coef': 'ent_coef',
                   'vf_coef': 'vf_coef', 'gae_lambda': 'gae_lambda',
                   'discount': 'gamma', 'max_grad_norm': 'max_grad_norm'}


@dataclasses.dataclass(frozen=True)
class Row:
  """One task trained the same way on both sides."""

  name: str  # the row's name on the command line and in the table
  agent: str  # 'ppo' or 'td3' (both libraries' names)
  env: str  # gymnax's env id, e.g. 'CartPole-v1'
  members: int  # seeds trained at once
  env_steps: int  # env steps per member
  hparams: Mapping[str, float]  # by fastpbrl's names, equal on both sides
  layout: str  # whose layout it is, for the table
  hidden: Sequence[int] = (64, 64)  # network widths (policy and value/Q)
  activation: str = 'tanh'  # hidden activation
  # PPO: T steps per env per iteration, E envs, epochs, minibatch size.
  rollout_length: Optional[int] = None
  num_envs: int = 1
  epochs: Optional[int] = None
  minibatch_size: Optional[int] = None
  # TD3: minibatch size, random-action steps, replay capacity, and half
  # the action range (rejax counts noise in env units, fastpbrl in half
  # ranges).
  batch_size: Optional[int] = None
  warmup_steps: Optional[int] = None
  replay_capacity: Optional[int] = None
  action_scale: float = 1.0

  @property
  def iteration_steps(self) -> int:
    """PPO: env steps per member per iteration (T x E)."""
    return self.rollout_length * self.num_envs


def sb3_ppo(members: int, env_steps: int, name='ppo-sb3') -> Row:
  """PPO with Stable-Baselines3's layout: 2,048 steps of one env, 10
  epochs of minibatches of 64, 64x64 tanh."""
  return Row(name=name, agent='ppo', env='CartPole-v1', members=members,
             env_steps=env_steps, hparams=SB3_PPO, layout='SB3',
             rollout_length=2048, num_envs=1, epochs=10, minibatch_size=64)


def purejaxrl_ppo(members: int, env_steps: int,
                  name='ppo-purejaxrl') -> Row:
  """PPO with PureJaxRL's gymnax layout: 4 envs x 128 steps, 4 epochs of
  4 minibatches (of 128), 64x64 tanh."""
  return Row(name=name, agent='ppo', env='CartPole-v1', members=members,
             env_steps=env_steps, hparams=PUREJAXRL_PPO, layout='PureJaxRL',
             rollout_length=128, num_envs=4, epochs=4, minibatch_size=128)


def td3(members: int, env_steps: int, name='td3') -> Row:
  """TD3 on Pendulum-v1, 64x64 ReLU, batch 256, one update per env step
  after 1,000 random-action steps, every transition kept."""
  return Row(name=name, agent='td3', env='Pendulum-v1', members=members,
             env_steps=env_steps, hparams=TD3, layout='TD3',
             activation='relu', batch_size=256, warmup_steps=1000,
             replay_capacity=1_000_000, action_scale=2.0)


def rows(names: Sequence[str], scale_members: Sequence[int] = (16, 64, 256),
         scale_env_steps: int = 100_000, smoke: bool = False) -> list[Row]:
  """The rows named (``scale`` stands for the scaling rows, one per
  ``scale_members``), in the order named. ``smoke``: every row at 2
  members (the scaling rows at 2 and 4) x 4,096 env steps (TD3: 2,000),
  only to check that both sides run."""
  made = []
  for name in names:
    if name == 'ppo-sb3':
      made.append(sb3_ppo(*((2, 4096) if smoke else (16, 500_000))))
    elif name == 'td3':
      made.append(td3(*((2, 2000) if smoke else (4, 15_000))))
    elif name == 'ppo-purejaxrl':
      made.append(purejaxrl_ppo(*((2, 4096) if smoke else (16, 500_000))))
    elif name == 'scale':
      for n in ((2, 4) if smoke else scale_members):
        made.append(purejaxrl_ppo(n, 4096 if smoke else scale_env_steps,
                                  name=f'ppo-purejaxrl-{n}'))
    else:
      raise ValueError(f'unknown row {name!r}: ppo-sb3, td3, '
                       'ppo-purejaxrl or scale')
  return made


def _number(x: float) -> str:
  return repr(float(x)) if not float(x).is_integer() else str(int(x))


# PBT's decisions in the rule's row: every 5% of the budget.
PBT_DECISIONS = 20


def fastpbrl_command(row: Row, run_dir: str, rule: str = 'seeds'
                     ) -> list[str]:
  """``fastpbrl seeds`` for the row (after the program): default flags but
  for the row's task, layout and hyperparameters, no progress bar, the
  run folder ``run_dir``. ``rule`` ``pbt``: the same run under PBT,
  deciding every 5% of the budget (``--ready-after``), what the rule
  costs."""
  command = [rule, '--agent', row.agent, '--env', f'gymnax:{row.env}',
             '--population-size', str(row.members),
             '--env-steps', str(row.env_steps),
             '--hidden-sizes', *map(str, row.hidden),
             '--hparams', *(f'{k}={_number(v)}'
                            for k, v in row.hparams.items())]
  if row.agent == 'ppo':
    command += ['--agent-settings', f'rollout_length={row.rollout_length}',
                f'num_envs={row.num_envs}', f'epochs={row.epochs}',
                f'batch_size={row.minibatch_size}',
                f'activation={row.activation}']
  else:
    # Only env steps after the warm-up count toward the update-to-data
    # ratio, as in rejax (and TD3's and SB3's reference loops): one
    # update per env step from the warm-up's end.
    command += ['--batch-size', str(row.batch_size),
                '--warmup-steps', str(row.warmup_steps),
                '--no-warmup-counts-as-data',
                '--replay-capacity', str(row.replay_capacity)]
  if rule == 'pbt':
    command += ['--ready-after', str(max(1, row.env_steps // PBT_DECISIONS))]
  return command + ['--no-progress', '--run-dir', run_dir]


def rejax_config(row: Row) -> dict:
  """The keywords of rejax's ``Algorithm.create`` for the row: the same
  task, layout and hyperparameters, evaluating as little as rejax allows
  (once, at the end: ``eval_freq`` = ``total_timesteps``, no initial
  evaluation)."""
  config = {'env': row.env, 'total_timesteps': row.env_steps,
            'eval_freq': row.env_steps, 'skip_initial_evaluation': True,
            'num_envs': row.num_envs}
  if row.agent == 'ppo':
    if row.iteration_steps % row.minibatch_size:
      raise ValueError(f'{row.name}: minibatch {row.minibatch_size} does '
                       f'not divide T x E = {row.iteration_steps}')
    config.update(
        num_steps=row.rollout_length, num_epochs=row.epochs,
        num_minibatches=row.iteration_steps // row.minibatch_size,
        agent_kwargs={'hidden_layer_sizes': list(row.hidden),
                      'activation': row.activation},
        **{REJAX_PPO_NAMES[k]: v for k, v in row.hparams.items()})
    return config
  h = row.hparams
  if tuple(row.hidden) != (64, 64):
    raise ValueError(f'{row.name}: rejax 0.1.3\'s TD3 has 64x64 networks '
                     f'only, not {row.hidden}')
  if h['policy_lr'] != h['critic_lr']:
    raise ValueError(f'{row.name}: rejax\'s TD3 has one learning rate')
  config.update(
      batch_size=row.batch_size,
      # rejax trains once its step count exceeds fill_buffer: warmup - 1
      # gives warmup random-action steps, then one update per env step.
      fill_buffer=row.warmup_steps - 1,
      # Every transition kept, as in fastpbrl's replay of a million: a
      # larger rejax buffer only costs time (report.DIFFERENCES).
      buffer_size=min(row.replay_capacity, row.env_steps),
      learning_rate=h['policy_lr'], gamma=h['discount'],
      polyak=1 - h['tau'],
      policy_delay=round(1 / h['policy_update_fraction']), num_epochs=1,
      exploration_noise=h['exploration_noise'] * row.action_scale,
      target_noise=h['target_noise'] * row.action_scale,
      target_noise_clip=h['noise_clip'] * row.action_scale,
      actor_kwargs={'activation': row.activation},
      critic_kwargs={'activation': row.activation})
  return config


def rejax_command(row: Row, mode: str) -> list[str]:
  """The driver's arguments (after the rejax venv's python) for the row
  on one device (``mode='vmap'``) or over the process's devices
  (``'pmap'``)."""
  return [DRIVER, '--algo', row.agent, '--members', str(row.members),
          '--mode', mode, '--config',
          json.dumps(rejax_config(row), sort_keys=True)]


def side_environment(mode: str, cores: int,
                     base: Optional[Mapping[str, str]] = None) -> dict:
  """The environment a side's process starts with: ``base`` (default
  ``os.environ``) without any device count, and for rejax's ``pmap``
  one host device per core."""
  env = {k: v for k, v in (os.environ if base is None else base).items()
         if k not in DEVICE_VARIABLES}
  if mode == 'pmap':
    env['XLA_FLAGS'] = f'{DEVICE_COUNT_FLAG}={cores}'
  if mode == 'one-device':  # fastpbrl on one host device
    env['FASTPBRL_CPU_DEVICES'] = '1'
  return env
