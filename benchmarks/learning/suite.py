"""The learning benchmark's suite: its tasks, their budgets, its methods,
and which of them can run where; the ``seeds`` and random-search rows each
rule's row is compared with."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from fastpbrl import agents as agents_lib
from fastpbrl.config.errors import ConfigError
from fastpbrl.envs import jax_envs
from fastpbrl.run import build


@dataclasses.dataclass(frozen=True)
class Task:
  """A task of the suite and the budgets it is run at."""

  env_steps: int  # per member
  warmup_steps: int  # random-action steps per member first
  eval_every: int  # env steps per member between evaluations
  ready_after: int  # PBT: env steps per member between decisions
  phase_env_steps: int  # HyperTrick: env steps per member per phase


TASKS = {
    'Pendulum-v1': Task(20_000, 1_000, 2_000, 2_500, 5_000),
    # The same task in JAX (gymnax), stepped on the device inside the
    # learner call: its rows check that the two data paths learn alike.
    'gymnax:Pendulum-v1': Task(20_000, 1_000, 2_000, 2_500, 5_000),
    'InvertedPendulum-v5': Task(10_000, 1_000, 1_000, 1_250, 2_500),
    'Hopper-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    'HalfCheetah-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    # Held-out: no default of an agent or a rule was chosen on these; they
    # take Hopper's and HalfCheetah's budgets, untuned.
    'Walker2d-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
    'Ant-v5': Task(100_000, 10_000, 5_000, 10_000, 25_000),
}
HELD_OUT = ('Walker2d-v5', 'Ant-v5', 'gymnax:MountainCarContinuous-v0')
# Members per run unless --population-size says otherwise; runs at another
# size are stored and reported apart (``result_path``, ``cell_of``).
DEFAULT_POPULATION = 4
# Discrete-action tasks for the on-policy rows (PPO): no warm-up, and
# evaluations and PBT decisions at whole multiples of PPO's default
# iteration of 2,048 env steps per member.
TASKS.update({
    'CartPole-v1': Task(100_000, 0, 10_240, 20_480, 25_600),
    'gymnax:CartPole-v1': Task(500_000, 0, 20_480, 61_440, 122_880),
    # Brax (the brax extra), on the device; its rollout-agent rows act as
    # Brax's own PPO does (ROLLOUT_SETTINGS), at multiples of that
    # iteration's 2,048 env steps per member.
    'brax:inverted_pendulum': Task(524_288, 0, 65_536, 131_072, 131_072),
    # The larger on-device populations (16 PPO members, 2^20 env steps
    # each): gymnax:Pendulum-v1 above at --env-steps 1048576 (its
    # evaluations every 104,857 steps, decisions every 131,072), and these
    # two with the same decisions. MountainCarContinuous is held out.
    'gymnax:Acrobot-v1': Task(1_048_576, 0, 65_536, 131_072, 262_144),
    'gymnax:MountainCarContinuous-v0': Task(1_048_576, 0, 65_536, 131_072,
                                            262_144),
})
# Static settings of rollout agents (PPO) per task, where the agent's own
# defaults (SB3's: one env, 2,048-step rollouts) do not fit how the task's
# users run it. Brax's PPO steps thousands of envs at once in short unrolls
# over normalised observations (brax/training/agents/ppo); this is that
# layout scaled to a CPU (64 envs x 32 steps, 4 epochs of minibatches of
# 512). The hyperparameters stay the agent's defaults: nothing is tuned to
# the task.
ROLLOUT_SETTINGS = {
    'brax:inverted_pendulum': (
        'num_envs=64', 'rollout_length=32', 'batch_size=512', 'epochs=4',
        'normalize_observations=True'),
}
# Reward shaping searched as an env parameter (fastpbrl.envs.shaping): gymnax's
# MountainCar-v0 with an energy bonus whose weight is env_energy_bonus
# (default 0: no shaping), scored on the unshaped return. Fixed before its
# runs.
TASKS['shaped:MountainCar-v0'] = Task(196_608, 0, 16_384, 32_768, 65_536)
# PureJaxRL's layout for gymnax tasks (its ppo.py: 4 envs x 128 steps,
# 4 epochs of 4 minibatches), the way gymnax's users run PPO; fixed before
# the 16-member runs. gymnax:CartPole-v1 keeps SB3's, as its rows were run.
GYMNAX_LAYOUT = ('num_envs=4', 'rollout_length=128', 'batch_size=128',
                 'epochs=4')
ROLLOUT_SETTINGS.update({name: GYMNAX_LAYOUT for name in (
    'gymnax:Pendulum-v1', 'gymnax:Acrobot-v1',
    'gymnax:MountainCarContinuous-v0')})
# MountainCar's velocity is about a hundredth of its position's scale: its
# PPO users normalise observations (rl-baselines3-zoo's MountainCar entry).
ROLLOUT_SETTINGS['shaped:MountainCar-v0'] = GYMNAX_LAYOUT + (
    'normalize_observations=True',)

# rl-baselines3-zoo's tuned PPO settings (``hyperparams/ppo.yml``, its
# HalfCheetah and Hopper entries, written for v3/v4 and taken unchanged for
# v5), as SB3's
# keyword arguments; ``normalize`` is VecNormalize of observations and
# rewards with the agent's gamma, as the zoo wraps it. A method whose flags
# hold ``ZOO`` takes these for its task (``zoo_flags``, ``sb3_zoo_ppo``).
ZOO = '@zoo'
ZOO_PPO = {
    'HalfCheetah-v5': dict(
        normalize=True, n_steps=512, batch_size=64, gamma=0.98,
        learning_rate=2.0633e-05, ent_coef=0.000401762, clip_range=0.1,
        n_epochs=20, gae_lambda=0.92, max_grad_norm=0.8, vf_coef=0.58096,
        log_std_init=-2.0, ortho_init=False, activation='relu',
        net_arch=(256, 256)),
    'Hopper-v5': dict(
        normalize=True, n_steps=512, batch_size=32, gamma=0.999,
        learning_rate=9.80828e-05, ent_coef=0.00229519, clip_range=0.2,
        n_epochs=5, gae_lambda=0.99, max_grad_norm=0.7, vf_coef=0.835671,
        log_std_init=-2.0, ortho_init=False, activation='relu',
        net_arch=(256, 256)),
}
# SB3 keyword -> our PPO's traced hyperparameter, and -> its static setting.
ZOO_HPARAMS = {'learning_rate': 'learning_rate', 'gamma': 'discount',
               'ent_coef': 'ent_coef', 'clip_range': 'clip_range',
               'gae_lambda': 'gae_lambda', 'max_grad_norm': 'max_grad_norm',
               'vf_coef': 'vf_coef'}
ZOO_SETTINGS = {'n_steps': 'rollout_length', 'batch_size': 'batch_size',
                'n_epochs': 'epochs', 'log_std_init': 'log_std_init',
                'ortho_init': 'ortho_init', 'activation': 'activation'}


def zoo_flags(task_name: str) -> list:
  """Our CLI flags for ``ZOO_PPO[task_name]``."""
  zoo = ZOO_PPO[task_name]
  hparams = [f'{ours}={zoo[theirs]!r}' for theirs, ours in ZOO_HPARAMS.items()]
  settings = [f'{ours}={zoo[theirs]}' for theirs, ours in ZOO_SETTINGS.items()]
  settings += [f'normalize_observations={zoo["normalize"]}',
               f'normalize_rewards={zoo["normalize"]}']
  return (['--hparams', *hparams, '--agent-settings', *settings,
           '--hidden-sizes', *map(str, zoo['net_arch'])])


METHODS = {
    # name: (experiment module, extra flags)
    'seeds-td3': ('seeds', ['--agent', 'td3']),
    'pbt-td3': ('pbt', ['--agent', 'td3']),
    # The 2022 paper's explore: every hyperparameter of a copy redrawn.
    'pbt-resample-td3': ('pbt', ['--agent', 'td3', '--explore', 'resample']),
    # PB2 (Parker-Holder et al. 2020): a GP bandit chooses a copy's values.
    'pbt-pb2-td3': ('pbt', ['--agent', 'td3', '--explore', 'pb2']),
    # Jaderberg et al.'s T-test selection instead of truncation.
    'pbt-ttest-td3': ('pbt', ['--agent', 'td3', '--exploit', 'ttest']),
    # PBT's path with nothing decided: every member at the defaults, and a
    # fitness gap no member reaches, so no copy and no explore.
    'pbt-no-copy-td3': ('pbt', ['--agent', 'td3', '--init-hparams',
                                'defaults', '--min-gap-absolute', '1e9']),
    # Today's PBT with one replay for all members: each learns from every
    # member's transitions (as CEM-RL's and DvD's shared critic does).
    'pbt-shared-td3': ('pbt', ['--agent', 'td3', '--shared-replay']),
    # The baseline with one replay for all members: what sharing alone gives.
    'seeds-shared-td3': ('seeds', ['--agent', 'td3', '--shared-replay']),
    # The baseline with the update accounting of TD3's and SB3's reference
    # loops: no catch-up on the warm-up's data (see ``sb3-td3``).
    'seeds-td3-no-catch-up': ('seeds', ['--agent', 'td3',
                                        '--no-warmup-counts-as-data']),
    # The same with a tenth of the policy lag: 10 update steps per learner
    # call (a policy published every 10 updates, actors at most 72 env steps
    # ahead of the learner's needs) instead of 50 (every 50, 232 ahead).
    'seeds-td3-no-catch-up-low-lag': ('seeds', [
        '--agent', 'td3', '--no-warmup-counts-as-data',
        '--steps-per-call', '10']),
    # The baseline with PyTorch's initialisation (SB3's) instead of haiku's
    # (Acme's): the one difference left between our TD3 and SB3's.
    'seeds-td3-torch-init': ('seeds', ['--agent', 'td3',
                                       '--network-init', 'torch']),
    'seeds-sac': ('seeds', ['--agent', 'sac']),
    'pbt-sac': ('pbt', ['--agent', 'sac']),
    'cemrl': ('cemrl', []),
    'dvd': ('dvd', []),
    # A round scored by its best evaluation episode, not the population mean.
    'dvd-best-round': ('dvd', ['--bandit-score', 'best']),
    # A round rewarded for a gain above the recent median gain, not for
    # beating the recent rounds' return (the paper's).
    'dvd-relative-gain': ('dvd', ['--bandit-reward', 'relative-gain']),
    # A shorter kernel length scale: members whose actions differ by more
    # than ~2 sigma (root mean square) look distinct and stop being pushed.
    'dvd-sigma-0.3': ('dvd', ['--kernel-sigma', '0.3']),
    'dvd-no-diversity': ('dvd', ['--lambda-mode', 'schedule',
                                 '--lambda-start', '0', '--lambda-end', '0']),
    'hypertrick': ('hypertrick', []),
    # Random search from the prior (Jaderberg et al. 2017's control arm):
    # the members' draws of PBT's --init-hparams prior, never exploited.
    'random-td3': ('random', ['--agent', 'td3']),
    # Our TD3 agent (the same pure functions) in a plain synchronous loop:
    # no actor processes, no rate limiter, no prefetch; one env step per
    # member, then one update on a batch sampled from everything so far, as
    # SB3 does; so a gap to SB3 is either in the data path (if this closes
    # it) or in the agent (if it does not).
    'sync-td3': ('sync', ['td3']),
    'sb3-td3': ('sb3', ['td3']),
    'sb3-sac': ('sb3', ['sac']),
    # SB3's own defaults (TD3: Adam 1e-3, 400x300, learning starts after 100
    # steps, no exploration noise), to tell a gap in the implementation from
    # one in the settings.
    'sb3-td3-own-defaults': ('sb3', ['td3', 'own-defaults']),
    'seeds-ppo': ('seeds', ['--agent', 'ppo']),
    'pbt-ppo': ('pbt', ['--agent', 'ppo']),
    'pbt-pb2-ppo': ('pbt', ['--agent', 'ppo', '--explore', 'pb2']),
    'random-ppo': ('random', ['--agent', 'ppo']),
    # The papers' comparison with random-ppo: PBT and PB2 started from the
    # same prior draws as random search (Jaderberg et al. 2017 and PB2 start
    # every member at random from the search space), exploring over the
    # whole of it. pbt-ppo and pbt-pb2-ppo start near the defaults instead.
    'pbt-prior-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams', 'prior']),
    'pbt-pb2-prior-ppo': ('pbt', ['--agent', 'ppo', '--explore', 'pb2',
                                  '--init-hparams', 'prior']),
    # The 2022 paper's explore (a copy's values drawn again from the prior)
    # from the same prior draws: the third PBT variant of the comparison.
    'pbt-resample-prior-ppo': ('pbt', ['--agent', 'ppo', '--explore',
                                       'resample', '--init-hparams',
                                       'prior']),
    # PBT from the prior, selecting on the env's true objective (Sample
    # Factory's PBT with reward shaping), and the trap beside it: selecting
    # on the shaped return, which the searched bonus itself feeds.
    'pbt-objective-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams',
                                  'prior', '--true-objective']),
    'pbt-shaped-return-ppo': ('pbt', ['--agent', 'ppo', '--init-hparams',
                                      'prior']),
    # SB3's PPO at its own defaults, which are our PPO's defaults.
    'sb3-ppo': ('sb3', ['ppo']),
    # The parity pair at rl-baselines3-zoo's tuned PPO settings for the task
    # (ZOO_PPO; a task without an entry is skipped): ours, and SB3's.
    'seeds-ppo-zoo': ('seeds', ['--agent', 'ppo', ZOO]),
    'sb3-ppo-zoo': ('sb3', ['ppo', ZOO]),
}


# PB2's own setting (Parker-Holder et al. 2020, its PPO runs): 1M env steps
# per member and a decision every 50,000; here every 49,152, a whole number
# (24) of PPO's 2,048-step iterations, so decisions fall between learner
# calls at the same points in every run. Evaluations at the same points.
# Fixed before its runs (``POPULATION_CELLS``).
BUDGETS = {(name, 1_000_000): Task(1_000_000, 0, 49_152, 49_152, 245_760)
           for name in ('HalfCheetah-v5', 'Hopper-v5')}


def task_budget(args, task_name: str) -> Task:
  """The task's budget; at ``--env-steps``, its ``BUDGETS`` entry if it
  has one, else every count scaled to that budget."""
  task = TASKS[task_name]
  if args.env_steps is None:
    return task
  if (task_name, args.env_steps) in BUDGETS:
    return BUDGETS[(task_name, args.env_steps)]
  scale = args.env_steps / task.env_steps
  return Task(args.env_steps, max(1, int(task.warmup_steps * scale)),
              max(1, int(task.eval_every * scale)),
              max(1, int(task.ready_after * scale)),
              max(1, int(task.phase_env_steps * scale)))


@functools.lru_cache(maxsize=None)
def fits(task_name: str, method: str) -> Optional[str]:
  """None if ``method``'s agent can act in ``task_name``, else why not
  (its ``make_agent``'s refusal, e.g. TD3 on a discrete action space)."""
  module_name, extra = METHODS[method]
  agent = extra[0] if module_name in ('sb3', 'sync') else agent_of(extra)
  if module_name in ('sb3', 'sync') and jax_envs.is_jax_env(task_name):
    return f'{module_name} steps gymnasium envs only'
  if ZOO in extra and task_name not in ZOO_PPO:
    return f'no rl-zoo PPO settings for it (ZOO_PPO has {list(ZOO_PPO)})'
  try:
    agents_lib.make_agent(agent, build.make_env_spec(task_name))
  except (ValueError, ConfigError) as e:
    return str(e).splitlines()[0]
  return None


RULE_MODULES = ('pbt', 'cemrl', 'dvd', 'hypertrick', 'random')


def agent_of(flags: list) -> str:
  """The agent a method's flags run (``--agent``, else TD3)."""
  return flags[flags.index('--agent') + 1] if '--agent' in flags else 'td3'


def baseline_of(method: str) -> Optional[str]:
  """The ``seeds`` row a rule's row is compared with: ``seeds-<agent>``
  of the rule's agent (``--agent``, else TD3); None for baselines and
  reference implementations."""
  module, flags = METHODS.get(method, (None, []))
  if module not in RULE_MODULES:
    return None
  return f'seeds-{agent_of(flags)}'


# Rules that choose hyperparameters (random search: by its draws alone).
SEARCHING_MODULES = ('pbt', 'hypertrick', 'random')


def control_of(method: str) -> Optional[str]:
  """The random-search row a searching rule's row is also compared with,
  the control arm of Jaderberg et al. 2017 and of HyperTrick:
  ``random-<agent>`` of a PBT or HyperTrick row's agent, where the suite
  has one; None otherwise."""
  module, flags = METHODS.get(method, (None, []))
  if module not in ('pbt', 'hypertrick'):
    return None
  control = f'random-{agent_of(flags)}'
  return control if control in METHODS else None
