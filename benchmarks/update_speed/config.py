"""What a benchmark run measures (host-side): the implementations, agents
and population sizes it knows, the ``BenchmarkConfig`` that the command
line fills in, the agents at benchmark shapes (HalfCheetah-v5 for
TD3/SAC/PPO, Atari for DQN), their inputs (``random_data``), and the list
of sweeps (``Case``) a config expands into.

PPO (``--agents ppo``, not in the default run) learns from rollouts: its
"update steps" are the env steps of the rollouts it learns from, so a
call of ``S`` steps is ``S / 2048`` iterations of SB3's defaults (a
2048-step rollout in one env, 10 epochs of minibatches of 64), each
``S`` is rounded up to whole iterations (``1`` and ``default`` are both
one iteration), and the time per update step is per env step learned.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Optional

import numpy as np
from acme import specs

from fastpbrl.agents import dqn, ppo, sac, td3
from fastpbrl.agents.base import rollout_steps
from fastpbrl.core.types import Rollout, random_transitions


AGENTS = ('td3', 'sac', 'dqn', 'ppo')
DEFAULT_AGENTS = ('td3', 'sac', 'dqn')  # the paper's Figure 2
IMPLEMENTATIONS = ('jax-vectorized', 'jax-sequential', 'jax-parallel',
                   'torch-sequential', 'torch-vectorized', 'torch-parallel')
TORCH_IMPLEMENTATIONS = tuple(i for i in IMPLEMENTATIONS if i.startswith('torch'))
SHARED_CRITIC_IMPLEMENTATIONS = ('jax-vectorized', 'jax-sequential')
DEFAULT_POPULATION_SIZES = (1, 2, 4, 8, 16, 32, 64, 80)
LABELS = {
    'jax-vectorized': 'JAX vectorized', 'jax-sequential': 'JAX sequential',
    'jax-parallel': 'JAX parallel', 'torch-sequential': 'torch sequential',
    'torch-vectorized': 'torch vectorized', 'torch-parallel': 'torch parallel',
}
# HalfCheetah-v5: 17-d observations, 6-d actions in [-1, 1] (checked against
# gymnasium in the tests); Atari: the full ALE action set.
HALF_CHEETAH_OBS_DIM, HALF_CHEETAH_ACTION_DIM = 17, 6
ATARI_FRAME_SHAPE, ATARI_NUM_ACTIONS = (84, 84, 4), 18
MIN_SAMPLES = 3  # timed samples a configuration keeps even past its time budget
BARRIER_TIMEOUT_S = 900.0  # a parallel process waiting longer gives up

# Whether torch can be imported; looked up without importing it (the tests
# set this to False to check the torch-missing path).
TORCH_AVAILABLE = importlib.util.find_spec('torch') is not None

COLUMNS = (
    'mode', 'agent', 'implementation', 'steps_per_call', 'population_size',
    'batch_size', 'hidden', 'status', 'reason', 'time_per_call_ms',
    'time_per_call_min_ms', 'time_per_call_max_ms', 'num_samples',
    'time_per_update_step_ms', 'time_per_member_step_ms', 'compile_s',
    'flops_per_call', 'flops_source', 'achieved_flop_per_s',
    'fraction_of_matmul_peak', 'matmul_peak_flop_per_s', 'peak_device_bytes',
    'peak_rss_bytes',
    'memory_note', 'torch_threads', 'load_average_1min', 'device')


def available_cores() -> int:
  """CPU cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
  """Everything a benchmark run depends on (logged at start, saved in JSON)."""

  agents: tuple = DEFAULT_AGENTS
  """Agents whose independent-member population update is timed."""
  implementations: tuple = IMPLEMENTATIONS
  """Implementations to time (torch ones are skipped without torch)."""
  population_sizes: tuple = DEFAULT_POPULATION_SIZES
  """Population sizes N, ascending; a sweep stops at the first out-of-memory."""
  steps_per_call: tuple = ('1', 'default')
  """Update steps per call; 'default' is the agent's (50 TD3/SAC, 10 DQN)."""
  repeats: int = 10
  """Timed samples per configuration (the median is reported)."""
  warmup: int = 2
  """Untimed calls after the first (compiling) call."""
  out: Optional[str] = None
  """Output folder; benchmarks/results/<backend> by default."""
  shared_critic: bool = False
  """Also time the shared-critic TD3 population (paper's Figure 4)."""
  max_seconds_per_config: float = 120.0
  """Time budget of one configuration: fewer samples past it, and larger N
  are skipped when even the minimum number of samples would not fit."""
  batch_size: Optional[int] = None
  """Batch size override for all agents (smoke tests)."""
  hidden: Optional[int] = None
  """Hidden width override of the TD3/SAC MLPs (smoke tests)."""
  isolation: str = 'process'
  """'process': each (agent, implementation, steps) sweep runs in a fresh
  process (clean memory peaks, no thread-pool interference, a crash is
  recorded instead of ending the run); 'none': all in this process."""
  max_parallel_processes: int = 2 * available_cores()
  """Largest N for the one-process-per-member implementations."""
  matmul_size: Optional[int] = None
  """Side of the square f32 matmul that sets the peak (2048 on CPU, 8192
  on accelerators by default)."""
  seed: int = 0
  """Seed of parameters and random batches."""
  matmul_per_sweep: bool = True
  """Measure the matmul peak again at the start of every sweep; the peak
  of the run is the best of these (other jobs on a shared machine lower
  what one measurement sees); else only once at the start of the run."""
  torch_threads: Optional[int] = None
  """torch.set_num_threads for torch-sequential/-vectorized (default: the
  available cores); torch-parallel splits the cores between its processes."""


# --------------------------------------------------------------------------
# Agents, shapes and batches
# --------------------------------------------------------------------------


def env_spec(agent_name: str) -> specs.EnvironmentSpec:
  """HalfCheetah-v5 shapes for TD3/SAC, Atari shapes for DQN."""
  if agent_name == 'dqn':
    observations = specs.Array(ATARI_FRAME_SHAPE, np.uint8, name='observation')
    actions = specs.DiscreteArray(ATARI_NUM_ACTIONS, name='action')
  else:
    observations = specs.Array((HALF_CHEETAH_OBS_DIM,), np.float32,
                               name='observation')
    actions = specs.BoundedArray(
        (HALF_CHEETAH_ACTION_DIM,), np.float32,
        -np.ones(HALF_CHEETAH_ACTION_DIM, np.float32),
        np.ones(HALF_CHEETAH_ACTION_DIM, np.float32), name='action')
  return specs.EnvironmentSpec(
      observations=observations, actions=actions,
      rewards=specs.Array((), np.float32, name='reward'),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name='discount'))


_AGENT_MODULES = {'td3': (td3, td3.TD3Config), 'sac': (sac, sac.SACConfig),
                  'dqn': (dqn, dqn.DQNConfig), 'ppo': (ppo, ppo.PPOConfig)}


def default_steps(agent_name: str) -> int:
  return _AGENT_MODULES[agent_name][1]().steps_per_call


def whole_steps(agent_name: str, steps: int) -> int:
  """``steps`` per call as the agent can take them: a rollout agent's
  rounded up to whole iterations (``rollout_length x num_envs`` env
  steps), a replay agent's as they are."""
  config = _AGENT_MODULES[agent_name][1]()
  if not hasattr(config, 'rollout_length'):
    return steps
  per_iteration = rollout_steps(config)
  return -(-steps // per_iteration) * per_iteration


def random_data(agent, leading: tuple, steps: int, batch_size: int,
                seed: int):
  """Random inputs of ``steps`` update steps of ``agent`` after the
  ``leading`` axes: a ``Transition`` ``[*leading, steps, batch_size]`` for
  a replay agent, a ``Rollout`` ``[*leading, I, T, E]`` of ``I = steps /
  (T x E)`` iterations for a rollout agent (``batch_size`` is then its
  config's minibatch size, not an input shape)."""
  if agent.learns_from != 'rollout':
    return random_transitions(agent.env_spec, (*leading, steps, batch_size),
                              seed)
  config = agent.config
  shape = (*leading, steps // rollout_steps(config), config.rollout_length,
           config.num_envs)
  t = random_transitions(agent.env_spec, shape, seed)
  log_prob = np.random.default_rng(seed).normal(-1.0, 0.3, shape)
  return Rollout(*t, log_prob=log_prob.astype(np.float32))


def iterations(agent, steps: int) -> int:
  """What one call of ``steps`` update steps scans ``agent.update`` over
  (``PopulationLearner.iterations``)."""
  if agent.learns_from != 'rollout':
    return steps
  return steps // rollout_steps(agent.config)


def default_batch_size(agent_name: str) -> int:
  return _AGENT_MODULES[agent_name][1]().batch_size


def make_agent(agent_name: str, steps: int, batch_size: int,
               hidden: Optional[int]):
  """The fastpbrl agent at benchmark settings."""
  module, config_cls = _AGENT_MODULES[agent_name]
  fields = dict(batch_size=batch_size, steps_per_call=steps)
  if agent_name == 'ppo':
    steps = whole_steps(agent_name, steps)
    fields['steps_per_call'] = steps
  if hidden is not None and agent_name != 'dqn':
    fields['hidden_sizes'] = (hidden, hidden)
  return module.make_agent(env_spec(agent_name), config_cls(**fields))


@dataclasses.dataclass(frozen=True)
class Case:
  """One sweep over population sizes: a mode, agent, implementation, steps."""

  mode: str  # 'independent' or 'shared-critic'
  agent: str
  implementation: str
  steps: int
  batch_size: int
  hidden: Optional[int]  # TD3/SAC MLP width; None for DQN

  def label(self) -> str:
    return (f'{self.mode} {self.agent} {self.implementation} '
            f'steps={self.steps}')


def build_cases(cfg: BenchmarkConfig) -> list[Case]:
  """The sweeps of a run, in the order they are measured."""
  cases = []

  def steps_for(agent_name):
    return sorted({whole_steps(agent_name, default_steps(agent_name)
                               if s == 'default' else int(s))
                   for s in cfg.steps_per_call})

  def width(agent_name):
    if agent_name == 'dqn':
      return None
    return cfg.hidden or _AGENT_MODULES[agent_name][1]().hidden_sizes[0]

  for agent_name in cfg.agents:
    batch = cfg.batch_size or default_batch_size(agent_name)
    for steps in steps_for(agent_name):
      for impl in cfg.implementations:
        cases.append(Case('independent', agent_name, impl, steps, batch,
                          width(agent_name)))
  if cfg.shared_critic:
    batch = cfg.batch_size or default_batch_size('td3')
    for steps in steps_for('td3'):
      for impl in cfg.implementations:
        if impl in SHARED_CRITIC_IMPLEMENTATIONS:
          cases.append(Case('shared-critic', 'td3', impl, steps, batch,
                            width('td3')))
  return cases
