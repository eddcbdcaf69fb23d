"""Update-speed benchmarks: the 2022 paper's Figure 2 and Figure 4.

Times ONE population update call, with every member's batches already on the
device, for several implementations of the same update:

* ``jax-vectorized``: this project, ``PopulationLearner`` (one compiled
  ``jit(vmap(scan(update, S)))`` for all ``N`` members);
* ``jax-sequential``: a Python loop over members of the jitted single-member
  ``scan(update, S)`` (the same compiled program called ``N`` times);
* ``jax-parallel``: one process per member, all sharing the device, started
  together at a barrier; a call lasts until the last process is done;
* ``torch-sequential``, ``torch-vectorized``, ``torch-parallel``: the same with
  standard PyTorch updates (``benchmarks/torch_agents.py``), when torch is
  installed.

for TD3 and SAC on HalfCheetah-v5 shapes (17-d observations, 6-d actions,
256x256 MLPs, batch 256) and DQN on Atari shapes (84x84x4 uint8 frames, 18
actions, Nature CNN, batch 32), with 1 and 50 (10 for DQN) update steps per
call, over a list of population sizes. ``--shared-critic`` adds the CEM-RL /
DvD case of Figure 4: one TD3 critic shared by the population,
``SharedCriticLearner`` against CEM-RL's sequential order.

Per configuration it reports the median time per call and per member-step,
the compile time apart, XLA's FLOPs per call and the achieved FLOP/s as a
fraction of a matmul peak measured on the same device in the same run, peak
memory, and writes ``update_speed.json``, ``update_speed.csv``,
``update_speed.png`` (Figure 2 style) and ``summary.md`` to ``--out``.

Runs on whichever JAX backend is present (CPU, GPU or TPU). Host-side code
only: processes, timers and files. The programs timed are the package's own
(``PopulationLearner``, ``SharedCriticLearner``, ``agent.update``); this module
only builds inputs, calls them and reads the clock.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import gc
import importlib.metadata
import importlib.util
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import resource
import shlex
import signal
import statistics
import sys
import threading
import time
import traceback
from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.agents import dqn, sac, td3
from fastpbrl.learner import (PopulationLearner, SharedCriticLearner,
                              multi_step, population_hparams)
from fastpbrl.types import random_transitions as random_batch

AGENTS = ('td3', 'sac', 'dqn')
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


# --------------------------------------------------------------------------
# Configuration and command line
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
  """Everything a benchmark run depends on (logged at start, saved in JSON)."""

  agents: tuple = AGENTS
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


def _int_at_least(minimum: int) -> Callable[[str], int]:
  """An argparse type: an integer >= ``minimum``, else a clear message."""

  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f'{text!r} is not an integer') from None
    if value < minimum:
      raise argparse.ArgumentTypeError(f'{value} must be >= {minimum}')
    return value

  return parse


_positive_int = _int_at_least(1)
_nonnegative_int = _int_at_least(0)


def _steps_arg(text: str) -> str:
  if text == 'default':
    return text
  return str(_positive_int(text))


def _positive_float(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    raise argparse.ArgumentTypeError(f'{text!r} is not a number') from None
  if not value > 0 or not math.isfinite(value):
    raise argparse.ArgumentTypeError(f'{text} must be a positive number')
  return value


def build_parser() -> argparse.ArgumentParser:
  defaults = BenchmarkConfig()
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.update_speed',
      description=__doc__.split('\n\n')[0] + '\n\n' + __doc__.split('\n\n')[1],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog=(
          'examples:\n'
          '  python -m benchmarks.update_speed --shared-critic\n'
          '  python -m benchmarks.update_speed --agents td3 sac '
          '--population-sizes 1 4 8 16 \\\n'
          '      --steps-per-call 50 '
          '--implementations jax-vectorized jax-sequential\n'
          '  python -m benchmarks.update_speed --agents td3 '
          '--population-sizes 1 2 --repeats 2 \\\n'
          '      --batch-size 8 --hidden 16 --out /tmp/smoke'))
  parser.add_argument(
      '--agents', nargs='*', choices=AGENTS, default=list(defaults.agents),
      help='agents to time (default: all); may be empty with --shared-critic')
  parser.add_argument(
      '--implementations', nargs='+', choices=IMPLEMENTATIONS,
      default=list(defaults.implementations),
      help='implementations to time (default: all; torch ones are skipped, '
      'with a message, when torch is not installed)')
  parser.add_argument(
      '--population-sizes', nargs='+', type=_positive_int,
      default=list(defaults.population_sizes),
      help='population sizes N (default: %(default)s); each sweep goes up in '
      'N and stops, with the reason recorded, at the first out-of-memory')
  parser.add_argument(
      '--steps-per-call', nargs='+', type=_steps_arg,
      default=list(defaults.steps_per_call),
      help="update steps per call; 'default' is the agent's own "
      '(50 for TD3/SAC, 10 for DQN) (default: 1 default)')
  parser.add_argument(
      '--repeats', type=_positive_int, default=defaults.repeats,
      help='timed samples per configuration, median reported '
      '(default: %(default)s)')
  parser.add_argument(
      '--warmup', type=_nonnegative_int, default=defaults.warmup,
      help='untimed calls after the first, compiling, call '
      '(default: %(default)s)')
  parser.add_argument(
      '--out', default=None,
      help='output folder (default: benchmarks/results/<jax backend>)')
  parser.add_argument(
      '--shared-critic', action='store_true',
      help='also time the TD3 population with one shared critic (CEM-RL / '
      'DvD, the paper\'s Figure 4): jax-vectorized vs jax-sequential')
  parser.add_argument(
      '--max-seconds-per-config', type=_positive_float,
      default=defaults.max_seconds_per_config,
      help='time budget of one configuration: past it no more samples are '
      f'taken (at least {MIN_SAMPLES} are), and a larger N whose minimum '
      'run would not fit is skipped with the reason recorded '
      '(default: %(default)s)')
  parser.add_argument(
      '--batch-size', type=_positive_int, default=None,
      help='batch size for every agent instead of 256 (TD3/SAC) and 32 (DQN)')
  parser.add_argument(
      '--hidden', type=_positive_int, default=None,
      help='hidden width of the two TD3/SAC MLP layers instead of 256')
  parser.add_argument(
      '--isolation', choices=('process', 'none'), default=defaults.isolation,
      help="'process' (default): each sweep in a fresh process; 'none': "
      'everything in this process (faster start, for debugging)')
  parser.add_argument(
      '--max-parallel-processes', type=_positive_int,
      default=defaults.max_parallel_processes,
      help='largest N for jax-parallel and torch-parallel '
      '(default: twice the available cores, %(default)s)')
  parser.add_argument(
      '--matmul-size', type=_positive_int, default=None,
      help='side of the f32 matmul that measures the peak '
      '(default: 2048 on CPU, 8192 on GPU/TPU)')
  parser.add_argument('--seed', type=int, default=defaults.seed,
                      help='seed of parameters and batches (default: 0)')
  parser.add_argument(
      '--matmul-once', action='store_true',
      help='measure the matmul peak only once, at the start, instead of at '
      'the start of every sweep (the default, as other jobs on a shared '
      'machine change what it can do during a long run)')
  parser.add_argument(
      '--torch-threads', type=_positive_int, default=None,
      help='torch.set_num_threads for torch-sequential and torch-vectorized '
      f'(default: the available cores, {available_cores()}); torch-parallel '
      'gives each of its N processes max(1, cores // N)')
  return parser


def parse_args(argv: Optional[Sequence[str]] = None) -> BenchmarkConfig:
  """Parses and validates the command line (exits with a message on error)."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.agents and not args.shared_critic:
    parser.error('nothing to run: give --agents or --shared-critic')
  if args.shared_critic and not set(args.implementations) & set(
      SHARED_CRITIC_IMPLEMENTATIONS):
    parser.error('--shared-critic needs jax-vectorized or jax-sequential in '
                 '--implementations')
  if args.out is not None and os.path.exists(args.out) and not os.path.isdir(
      args.out):
    parser.error(f'--out {args.out} exists and is not a folder')
  return BenchmarkConfig(
      agents=tuple(dict.fromkeys(args.agents)),
      implementations=tuple(dict.fromkeys(args.implementations)),
      population_sizes=tuple(sorted(set(args.population_sizes))),
      steps_per_call=tuple(dict.fromkeys(args.steps_per_call)),
      repeats=args.repeats, warmup=args.warmup, out=args.out,
      shared_critic=args.shared_critic,
      max_seconds_per_config=args.max_seconds_per_config,
      batch_size=args.batch_size, hidden=args.hidden,
      isolation=args.isolation,
      max_parallel_processes=args.max_parallel_processes,
      matmul_size=args.matmul_size, seed=args.seed,
      torch_threads=args.torch_threads,
      matmul_per_sweep=not args.matmul_once)


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
                  'dqn': (dqn, dqn.DQNConfig)}


def default_steps(agent_name: str) -> int:
  return _AGENT_MODULES[agent_name][1]().steps_per_call


def default_batch_size(agent_name: str) -> int:
  return _AGENT_MODULES[agent_name][1]().batch_size


def make_agent(agent_name: str, steps: int, batch_size: int,
               hidden: Optional[int]):
  """The fastpbrl agent at benchmark settings."""
  module, config_cls = _AGENT_MODULES[agent_name]
  fields = dict(batch_size=batch_size, steps_per_call=steps)
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
    return sorted({default_steps(agent_name) if s == 'default' else int(s)
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


# --------------------------------------------------------------------------
# Measurements common to all implementations
# --------------------------------------------------------------------------


def calls_per_sample(steps: int) -> int:
  """Calls averaged into one timed sample: enough for two update steps.

  TD3 updates its policy on every second step; with one step per call,
  single calls alternate between two costs, so a sample covers a pair.
  """
  return max(1, math.ceil(2 / steps))


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype),
                      tree)


def _flops_from(cost) -> Optional[float]:
  if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
    cost = cost[0] if cost else None
  if not isinstance(cost, dict):
    return None
  flops = cost.get('flops')
  return float(flops) if flops is not None and flops > 0 else None


def xla_flops(fn: Callable, *args) -> Optional[float]:
  """XLA's FLOP count of ``jit(fn)(*args)``, or None if the backend has none.

  Uses the HLO cost analysis of the lowered program (no compilation), and the
  compiled program's when that is missing. Only call this on a program
  without loops: XLA counts a while loop's body once whatever its trip count
  (so the benchmark counts ONE update step and multiplies), and a
  ``lax.cond`` as if its costlier branch ran.
  """
  lowered = jax.jit(fn).lower(*_abstract(args))
  for analysis in (lowered.cost_analysis,
                   lambda: lowered.compile().cost_analysis()):
    try:
      flops = _flops_from(analysis())
    except Exception:  # pylint: disable=broad-except
      flops = None
    if flops:
      return flops
  return None


def measure_matmul_peak(size: Optional[int] = None, repeats: int = 20) -> dict:
  """FLOP/s of a square f32 matmul on the default JAX device.

  ``peak_flop_per_s`` is from the fastest of ``repeats`` runs (the peak the
  device reached), ``median_flop_per_s`` from their median.
  """
  if size is None:
    size = 2048 if jax.default_backend() == 'cpu' else 8192
  ka, kb = jax.random.split(jax.random.PRNGKey(0))
  a = jax.random.normal(ka, (size, size), jnp.float32)
  b = jax.random.normal(kb, (size, size), jnp.float32)
  matmul = jax.jit(jnp.matmul)
  matmul(a, b).block_until_ready()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    matmul(a, b).block_until_ready()
    times.append(time.perf_counter() - start)
  flops = 2.0 * size ** 3
  return dict(size=size, flops=flops, best_s=min(times),
              median_s=statistics.median(times),
              peak_flop_per_s=flops / min(times),
              median_flop_per_s=flops / statistics.median(times))


def _peak_rss_bytes() -> int:
  # ru_maxrss is in KiB on Linux (bytes on macOS).
  scale = 1 if sys.platform == 'darwin' else 1024
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _jax_device_peak_bytes() -> Optional[int]:
  try:
    stats = jax.devices()[0].memory_stats()
  except Exception:  # pylint: disable=broad-except
    return None
  if not stats or 'peak_bytes_in_use' not in stats:
    return None
  return int(stats['peak_bytes_in_use'])


def is_out_of_memory(error: BaseException) -> bool:
  """Whether an exception means the device or host ran out of memory."""
  if isinstance(error, MemoryError):
    return True
  if type(error).__name__ == 'OutOfMemoryError':  # torch.OutOfMemoryError
    return True
  text = str(error)
  return 'RESOURCE_EXHAUSTED' in text or 'out of memory' in text.lower()


def device_description() -> str:
  """The device's name, with the CPU model on CPU."""
  device = jax.devices()[0]
  if device.platform == 'cpu':
    return f'cpu: {_cpu_model()} ({available_cores()} cores)'
  return f'{device.platform}: {device.device_kind}'


def _cpu_model() -> str:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _memory_total_bytes() -> Optional[int]:
  try:
    with open('/proc/meminfo') as f:
      for line in f:
        if line.startswith('MemTotal:'):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def _version(package: str) -> Optional[str]:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine_description() -> dict:
  """Host, device and library versions (torch's without importing it)."""
  devices = jax.devices()
  return dict(
      platform=platform.platform(), python=platform.python_version(),
      cpu_model=_cpu_model(), logical_cpus=os.cpu_count(),
      available_cores=available_cores(),
      memory_total_bytes=_memory_total_bytes(),
      jax_backend=jax.default_backend(), device=device_description(),
      device_kind=devices[0].device_kind, device_count=len(devices),
      versions={p: _version(p) for p in (
          'jax', 'jaxlib', 'numpy', 'dm-haiku', 'optax', 'torch',
          'matplotlib')})


# --------------------------------------------------------------------------
# Runners: one per implementation. Each builds its inputs (not timed), then
# `call()` runs one population update call and waits for its results.
# --------------------------------------------------------------------------


class _Runner:
  """Base: ``compile_s`` set by AOT runners; None where the first call
  compiles (it is then the first call's time minus a steady call's)."""

  compile_s: Optional[float] = None
  compiles_on_first_call = False
  flops_source = 'xla_cost_analysis'
  torch_threads: Optional[int] = None

  def call(self) -> None:
    raise NotImplementedError

  def flops_per_call(self) -> Optional[float]:
    raise NotImplementedError

  def device_peak_bytes(self) -> Optional[int]:
    return _jax_device_peak_bytes()


class _LearnerRunner(_Runner):
  """One call of a population learner on batches already on the device."""

  compiles_on_first_call = True

  def _setup(self, learner, hparams, env_spec, case: Case, n: int,
             seed: int) -> None:
    self.learner, self.hparams, self.steps = learner, hparams, case.steps
    self.state = learner.init(jax.random.PRNGKey(seed), hparams)
    self.batch = jax.device_put(random_batch(
        env_spec, (n, case.steps, case.batch_size), seed))
    jax.block_until_ready((self.state, self.batch))

  def call(self) -> None:
    self.state, metrics = self.learner.update(self.state, self.hparams,
                                              self.batch)
    jax.block_until_ready((self.state, metrics))

  def _flops(self, update_fn) -> Optional[float]:
    one_step = jax.tree.map(lambda x: x[:, 0], self.batch)
    flops = xla_flops(update_fn, self.state, self.hparams, one_step)
    return None if flops is None else flops * self.steps


class JaxVectorized(_LearnerRunner):
  """``PopulationLearner.update``: the project's one-program population call."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    del cache
    self.agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self._setup(PopulationLearner(self.agent, case.steps),
                population_hparams(self.agent, n), self.agent.env_spec, case,
                n, seed)

  def flops_per_call(self) -> Optional[float]:
    # A plain vmap: the delayed policy step counts on every step (an upper
    # bound; the learner's named vmap skips it where no member needs it).
    return self._flops(jax.vmap(self.agent.update))


class JaxSequential(_Runner):
  """A Python loop over members of the jitted single-member ``scan(update)``.

  The compiled program is the same for every N, so it is compiled once per
  sweep (ahead of time, which gives the compile time) and kept in ``cache``.
  """

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.hparams = agent.default_hparams()
    if 'init' not in cache:
      cache['init'] = jax.jit(agent.init)
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    self.states = [cache['init'](k, self.hparams) for k in keys]
    self.batches = [jax.device_put(random_batch(
        agent.env_spec, (case.steps, case.batch_size), seed + i))
                    for i in range(n)]
    jax.block_until_ready((self.states, self.batches))
    if 'step' not in cache:
      start = time.perf_counter()
      cache['step'] = jax.jit(multi_step(agent.update, case.steps),
                              donate_argnums=0).lower(
                                  self.states[0], self.hparams,
                                  self.batches[0]).compile()
      cache['compile_s'] = time.perf_counter() - start
      one_step = jax.tree.map(lambda x: x[0], self.batches[0])
      flops = xla_flops(agent.update, self.states[0], self.hparams, one_step)
      cache['member_flops'] = None if flops is None else flops * case.steps
    self.step = cache['step']
    self.compile_s = cache['compile_s']
    self.member_flops = cache['member_flops']

  def call(self) -> None:
    for i, batch in enumerate(self.batches):
      self.states[i], _ = self.step(self.states[i], self.hparams, batch)
    jax.block_until_ready(self.states)

  def flops_per_call(self) -> Optional[float]:
    if self.member_flops is None:
      return None
    return self.member_flops * len(self.states)


class SharedCriticVectorized(_LearnerRunner):
  """``SharedCriticLearner.update``: one critic step on the population-mean
  loss and all policy steps, vectorized (the paper's section 4.2)."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    del cache
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.shared = agent.shared_critic
    self._setup(SharedCriticLearner(self.shared, case.steps),
                population_hparams(agent, n), agent.env_spec, case, n, seed)

  def flops_per_call(self) -> Optional[float]:
    return self._flops(self.shared.update)


class SharedCriticSequential(_Runner):
  """CEM-RL's order: at each update step, member after member, one critic
  step on that member's batch (with its target policy) then that member's
  delayed policy step, all against the one shared critic.

  Each (step, member) pair is one call of the jitted single-member TD3
  ``agent.update`` on a ``TD3State`` assembled from the shared critic and
  the member's policy: the same critic and policy steps as in TD3.
  """

  def __init__(self, case: Case, n: int, seed: int, cache: dict):
    agent = make_agent(case.agent, case.steps, case.batch_size, case.hidden)
    self.hparams = agent.default_hparams()
    if 'init' not in cache:
      cache['init'] = jax.jit(agent.init)
    keys = jax.random.split(jax.random.PRNGKey(seed), n)
    members = [cache['init'](k, self.hparams) for k in keys]
    self.critic = (members[0].critic, members[0].target_critic,
                   members[0].critic_opt)
    self.members = [(m.policy, m.target_policy, m.policy_opt, m.key, m.step)
                    for m in members]
    batches = [random_batch(agent.env_spec, (case.steps, case.batch_size),
                            seed + i) for i in range(n)]
    # Per-step slices put on the device beforehand: no slicing in the call.
    self.batches = [[jax.device_put(jax.tree.map(lambda x, s=s: x[s], b))
                     for s in range(case.steps)] for b in batches]
    jax.block_until_ready((self.critic, self.members, self.batches))

    def member_step(critic, member, hparams, batch):
      state = td3.TD3State(
          policy=member[0], critic=critic[0], target_policy=member[1],
          target_critic=critic[1], policy_opt=member[2],
          critic_opt=critic[2], key=member[3], step=member[4])
      state, _ = agent.update(state, hparams, batch)
      return ((state.critic, state.target_critic, state.critic_opt),
              (state.policy, state.target_policy, state.policy_opt, state.key,
               state.step))

    if 'step' not in cache:
      start = time.perf_counter()
      cache['step'] = jax.jit(member_step, donate_argnums=(0, 1)).lower(
          self.critic, self.members[0], self.hparams,
          self.batches[0][0]).compile()
      cache['compile_s'] = time.perf_counter() - start
      cache['member_step_flops'] = xla_flops(
          member_step, self.critic, self.members[0], self.hparams,
          self.batches[0][0])
    self.step = cache['step']
    self.compile_s = cache['compile_s']
    self.member_step_flops = cache['member_step_flops']
    self.steps = case.steps

  def call(self) -> None:
    for s in range(self.steps):
      for i in range(len(self.members)):
        self.critic, self.members[i] = self.step(
            self.critic, self.members[i], self.hparams, self.batches[i][s])
    jax.block_until_ready((self.critic, self.members))

  def flops_per_call(self) -> Optional[float]:
    if self.member_step_flops is None:
      return None
    return self.member_step_flops * self.steps * len(self.members)


class _SkipCase(Exception):
  """A whole sweep cannot run here (the message says why)."""


def torch_device() -> str:
  """The torch device matching the JAX backend, or raises ``_SkipCase``."""
  import torch  # pylint: disable=import-outside-toplevel
  backend = jax.default_backend()
  if backend == 'cpu':
    return 'cpu'
  if backend == 'gpu' and torch.cuda.is_available():
    return 'cuda'
  raise _SkipCase(
      f'torch has no device for the JAX backend {backend!r} '
      f'(torch {torch.__version__}, CUDA available: '
      f'{torch.cuda.is_available()}): comparing it on another device would '
      'be meaningless')


class _TorchRunner(_Runner):
  """Shared parts of the torch runners."""

  flops_source = 'torch_flop_counter'

  def _setup_torch(self, case: Case, threads: int, seed: int):
    import torch  # pylint: disable=import-outside-toplevel
    from benchmarks import torch_agents  # pylint: disable=import-outside-toplevel
    self.torch = torch
    self.torch_agents = torch_agents
    self.device = torch_device()
    torch.set_num_threads(threads)
    self.torch_threads = threads
    torch.manual_seed(seed)
    if self.device == 'cuda':
      torch.cuda.reset_peak_memory_stats()
    self.image = case.agent == 'dqn'
    spec = env_spec(case.agent)
    if self.image:
      self.dims = dict(num_actions=ATARI_NUM_ACTIONS)
    else:
      self.dims = dict(obs_dim=HALF_CHEETAH_OBS_DIM,
                       action_dim=HALF_CHEETAH_ACTION_DIM,
                       hidden=(case.hidden, case.hidden))
    return spec

  def _sync(self) -> None:
    if self.device == 'cuda':
      self.torch.cuda.synchronize()

  def _count_flops(self, run: Callable[[], None], calls: int) -> float:
    from torch.utils.flop_counter import FlopCounterMode  # pylint: disable=import-outside-toplevel
    counter = FlopCounterMode(display=False)
    with counter:
      for _ in range(calls):
        run()
    return counter.get_total_flops() / calls

  def device_peak_bytes(self) -> Optional[int]:
    if self.device == 'cuda':
      return int(self.torch.cuda.max_memory_allocated())
    return None


class TorchSequential(_TorchRunner):
  """Standard PyTorch updates, one member after another."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict,
               threads: Optional[int] = None):
    del cache
    spec = self._setup_torch(case, threads or available_cores(), seed)
    self.members = [self.torch_agents.make_agent(case.agent, device=self.device,
                                                 **self.dims)
                    for _ in range(n)]
    self.batches = []
    for i in range(n):
      batch = self.torch_agents.to_torch(
          random_batch(spec, (case.steps, case.batch_size), seed + i),
          self.device, self.image)
      self.batches.append([{k: v[s] for k, v in batch.items()}
                           for s in range(case.steps)])
    self.steps = case.steps
    self._sync()

  def _run_member(self, i: int) -> None:
    for batch in self.batches[i]:
      self.members[i].update(batch)

  def call(self) -> None:
    for i in range(len(self.members)):
      self._run_member(i)
    self._sync()

  def flops_per_call(self) -> float:
    # One member's count times N: every member runs the same steps.
    calls = calls_per_sample(self.steps)
    return self._count_flops(lambda: self._run_member(0), calls) * len(
        self.members)


class TorchVectorized(_TorchRunner):
  """PyTorch with the members' layers stacked (batched matmuls, grouped
  convolutions): the paper's appendix C."""

  def __init__(self, case: Case, n: int, seed: int, cache: dict,
               threads: Optional[int] = None):
    del cache
    spec = self._setup_torch(case, threads or available_cores(), seed)
    self.agent_name = case.agent
    self.population = self.torch_agents.make_agent(
        case.agent, device=self.device, population=n, **self.dims)
    batch = random_batch(spec, (n, case.steps, case.batch_size), seed)
    # Step axis first, so that each step's [N, B, ...] slice is contiguous.
    batch = jax.tree.map(lambda x: np.ascontiguousarray(np.swapaxes(x, 0, 1)),
                         batch)
    batch = self.torch_agents.to_torch(batch, self.device, self.image)
    self.batches = [{k: v[s] for k, v in batch.items()}
                    for s in range(case.steps)]
    self.steps = case.steps
    self._sync()

  def _run(self) -> None:
    for batch in self.batches:
      self.population.update(batch)

  def call(self) -> None:
    self._run()
    self._sync()

  def flops_per_call(self) -> float:
    # torch's FlopCounterMode counts the backward of a grouped convolution as
    # if each group saw every group's channels (it grows as N^2; forward is
    # right). Count a one-member population instead and multiply by N: every
    # member does the same work.
    n = len(next(iter(self.batches[0].values())))
    single = self.torch_agents.make_agent(self.agent_name, device=self.device,
                                          population=1, **self.dims)
    batches = [{k: v[:1] for k, v in batch.items()} for batch in self.batches]

    def run_single():
      for batch in batches:
        single.update(batch)

    return self._count_flops(run_single, calls_per_sample(self.steps)) * n


RUNNERS = {
    ('independent', 'jax-vectorized'): JaxVectorized,
    ('independent', 'jax-sequential'): JaxSequential,
    ('independent', 'torch-sequential'): TorchSequential,
    ('independent', 'torch-vectorized'): TorchVectorized,
    ('shared-critic', 'jax-vectorized'): SharedCriticVectorized,
    ('shared-critic', 'jax-sequential'): SharedCriticSequential,
}
PARALLEL_MEMBER_RUNNERS = {'jax-parallel': JaxSequential,
                           'torch-parallel': TorchSequential}


# --------------------------------------------------------------------------
# Timing one configuration
# --------------------------------------------------------------------------


def _base_row(case: Case, n: int) -> dict:
  row = dict.fromkeys(COLUMNS)
  row.update(mode=case.mode, agent=case.agent,
             implementation=case.implementation, steps_per_call=case.steps,
             population_size=n, batch_size=case.batch_size, hidden=case.hidden,
             device=device_description(), reason='',
             load_average_1min=_load_average())
  return row


def _load_average() -> Optional[float]:
  # Other jobs on the machine slow every measurement: this says how busy it was.
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:
    return None


def _finish_row(row: dict, samples: Sequence[float], n: int, steps: int,
                flops: Optional[float], matmul: dict) -> dict:
  median = statistics.median(samples)
  row.update(
      status='ok', time_per_call_ms=1e3 * median,
      load_average_1min=_load_average(),
      time_per_call_min_ms=1e3 * min(samples),
      time_per_call_max_ms=1e3 * max(samples), num_samples=len(samples),
      time_per_update_step_ms=1e3 * median / steps,
      time_per_member_step_ms=1e3 * median / (n * steps))
  row['matmul_peak_flop_per_s'] = matmul['peak_flop_per_s']
  if flops:
    row.update(flops_per_call=flops, achieved_flop_per_s=flops / median,
               fraction_of_matmul_peak=flops / median / matmul['peak_flop_per_s'])
  return row


def measure(case: Case, cfg: BenchmarkConfig, n: int, cache: dict,
            matmul: dict) -> dict:
  """Times ``case`` at population size ``n`` in this process; one result row.

  The first call is never timed (it compiles); then ``cfg.warmup`` untimed
  calls; then up to ``cfg.repeats`` samples of ``calls_per_sample`` calls,
  fewer (but at least ``MIN_SAMPLES``) once ``cfg.max_seconds_per_config``
  has passed.
  """
  if case.implementation in PARALLEL_MEMBER_RUNNERS:
    return measure_parallel(case, cfg, n, matmul)
  started = time.perf_counter()
  row = _base_row(case, n)
  runner_cls = RUNNERS[(case.mode, case.implementation)]
  kwargs = ({'threads': cfg.torch_threads}
            if issubclass(runner_cls, _TorchRunner) else {})
  runner = runner_cls(case, n, cfg.seed, cache, **kwargs)
  start = time.perf_counter()
  runner.call()
  first_call_s = time.perf_counter() - start
  for _ in range(cfg.warmup):
    runner.call()
  k = calls_per_sample(case.steps)
  samples = []
  while len(samples) < cfg.repeats:
    start = time.perf_counter()
    for _ in range(k):
      runner.call()
    samples.append((time.perf_counter() - start) / k)
    if (len(samples) >= MIN_SAMPLES
        and time.perf_counter() - started > cfg.max_seconds_per_config):
      break
  flops = runner.flops_per_call()
  _finish_row(row, samples, n, case.steps, flops, matmul)
  if runner.compiles_on_first_call:
    # First call = trace + compile + one run.
    row['compile_s'] = max(0.0, first_call_s - statistics.median(samples))
  else:
    row['compile_s'] = runner.compile_s
  row.update(flops_source=runner.flops_source if flops else None,
             peak_device_bytes=runner.device_peak_bytes(),
             peak_rss_bytes=_peak_rss_bytes(),
             memory_note=('process peaks since this sweep started; sweeps '
                          'go up in N'),
             torch_threads=runner.torch_threads)
  return row


def _parallel_member(case: Case, cfg: BenchmarkConfig, n: int, rank: int,
                     barrier, stop, results) -> None:
  """One process of a parallel implementation: one member, timed in step
  with the others through ``barrier`` (host-side, runs in a child)."""
  result = dict(rank=rank, ok=False)
  try:
    runner_cls = PARALLEL_MEMBER_RUNNERS[case.implementation]
    kwargs = {}
    if runner_cls is TorchSequential:
      # One process per member: split the cores instead of oversubscribing.
      kwargs['threads'] = max(1, available_cores() // n)
    runner = runner_cls(case, 1, cfg.seed + rank, {}, **kwargs)
    barrier.wait(BARRIER_TIMEOUT_S)
    start = time.monotonic()
    runner.call()
    first_call_s = time.monotonic() - start
    for _ in range(cfg.warmup):
      runner.call()
    k = calls_per_sample(case.steps)
    starts, ends = [], []
    began = time.monotonic()
    for r in range(cfg.repeats):
      barrier.wait(BARRIER_TIMEOUT_S)
      starts.append(time.monotonic())  # CLOCK_MONOTONIC: shared by processes
      for _ in range(k):
        runner.call()
      ends.append(time.monotonic())
      if (rank == 0 and r + 1 >= MIN_SAMPLES
          and time.monotonic() - began > cfg.max_seconds_per_config):
        stop.value = 1
      barrier.wait(BARRIER_TIMEOUT_S)
      if stop.value:
        break
    result.update(
        ok=True, starts=starts, ends=ends, first_call_s=first_call_s,
        compile_s=runner.compile_s,
        compiles_on_first_call=runner.compiles_on_first_call,
        flops=runner.flops_per_call() if rank == 0 else None,
        flops_source=runner.flops_source,
        peak_device_bytes=runner.device_peak_bytes(),
        peak_rss_bytes=_peak_rss_bytes(), torch_threads=runner.torch_threads)
  except threading.BrokenBarrierError:
    result.update(error='another process of this configuration failed',
                  oom=False, secondary=True)
  except BaseException as e:  # pylint: disable=broad-except
    barrier.abort()
    result.update(error=f'{type(e).__name__}: {e}'[:2000],
                  oom=is_out_of_memory(e), secondary=False)
  results.put(result)


class _ParallelFailure(Exception):

  def __init__(self, message: str, oom: bool):
    super().__init__(message)
    self.oom = oom


def measure_parallel(case: Case, cfg: BenchmarkConfig, n: int,
                     matmul: dict) -> dict:
  """One process per member, all on the same device, started together.

  A sample is the wall time from the first process starting its calls to the
  last one finishing them (the clocks are the shared CLOCK_MONOTONIC).
  """
  row = _base_row(case, n)
  ctx = mp.get_context('spawn')
  barrier, stop, results = ctx.Barrier(n), ctx.Value('b', 0), ctx.Queue()
  procs = [ctx.Process(target=_parallel_member,
                       args=(case, cfg, n, rank, barrier, stop, results))
           for rank in range(n)]
  collected = []
  try:
    for p in procs:
      p.start()
    while len(collected) < n:
      try:
        collected.append(results.get(timeout=1.0))
      except queue.Empty:
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead and results.empty():
          code = dead[0].exitcode
          raise _ParallelFailure(
              f'a member process died with exit code {code}'
              + (' (killed: likely out of host memory)' if code == -9 else ''),
              oom=code == -9)
    for p in procs:
      p.join()
  finally:  # on failure or interruption, leave no member process behind
    if any(p.is_alive() for p in procs):
      barrier.abort()
      for p in procs:
        p.join(timeout=10)
        if p.is_alive():
          p.kill()
          p.join()
  failures = [r for r in collected if not r['ok']]
  if failures:
    first = min(failures, key=lambda r: r.get('secondary', False))
    raise _ParallelFailure(f'process {first["rank"]}: {first["error"]}',
                           oom=any(r.get('oom') for r in failures))
  collected.sort(key=lambda r: r['rank'])
  num = min(len(r['starts']) for r in collected)
  k = calls_per_sample(case.steps)
  samples = [(max(r['ends'][i] for r in collected)
              - min(r['starts'][i] for r in collected)) / k
             for i in range(num)]
  member_flops = collected[0]['flops']
  flops = None if member_flops is None else member_flops * n
  _finish_row(row, samples, n, case.steps, flops, matmul)
  if collected[0]['compiles_on_first_call']:
    compile_s = max(r['first_call_s'] for r in collected) - statistics.median(
        samples)
  elif collected[0]['compile_s'] is not None:
    # The processes compile at the same time: the slowest one counts.
    compile_s = max(r['compile_s'] for r in collected)
  else:  # eager torch
    compile_s = None
  device_peaks = [r['peak_device_bytes'] for r in collected]
  row.update(
      compile_s=None if compile_s is None else max(0.0, compile_s),
      flops_source=collected[0]['flops_source'] if flops else None,
      peak_device_bytes=(sum(device_peaks) if None not in device_peaks
                         else None),
      peak_rss_bytes=sum(r['peak_rss_bytes'] for r in collected),
      memory_note='sum over the member processes',
      torch_threads=collected[0]['torch_threads'])
  return row


def run_sweep(case: Case, cfg: BenchmarkConfig, matmul: dict,
              emit: Callable[[dict], None]) -> None:
  """Measures ``case`` at each population size, ascending; ``emit``s a row
  for each (measured, skipped with the reason, or out of memory).

  ``matmul`` is the run's matmul peak so far; when
  ``cfg.matmul_per_sweep``, the sweep measures the matmul again first and
  keeps the better of the two (``apply_run_peak`` later rescales every row
  to the best measurement of the whole run).
  """
  if cfg.matmul_per_sweep or not matmul:
    fresh = measure_matmul_peak(cfg.matmul_size)
    matmul = max(matmul, fresh, key=lambda m: m['peak_flop_per_s']) if (
        matmul) else fresh
  cache: dict = {}
  stop_reason = None
  previous = None  # (n, seconds per call)
  for n in cfg.population_sizes:
    if stop_reason is None and case.implementation.startswith('torch'):
      try:
        torch_device()
      except _SkipCase as e:
        stop_reason = str(e)
    if (stop_reason is None and case.implementation in PARALLEL_MEMBER_RUNNERS
        and n > cfg.max_parallel_processes):
      stop_reason = (f'N > --max-parallel-processes '
                     f'{cfg.max_parallel_processes} (one process per member)')
    if stop_reason is None and previous is not None:
      prev_n, per_call = previous
      minimum_calls = 1 + cfg.warmup + MIN_SAMPLES * calls_per_sample(case.steps)
      predicted = minimum_calls * per_call * n / prev_n
      if predicted > cfg.max_seconds_per_config:
        stop_reason = (
            f'predicted {predicted:.0f} s for N={n} (from N={prev_n}) > '
            f'--max-seconds-per-config {cfg.max_seconds_per_config:g}')
    if stop_reason is not None:
      row = _base_row(case, n)
      row.update(status='skipped', reason=stop_reason)
      emit(row)
      continue
    try:
      row = measure(case, cfg, n, cache, matmul)
    except Exception as e:  # pylint: disable=broad-except
      row = _base_row(case, n)
      oom = getattr(e, 'oom', False) or is_out_of_memory(e)
      row.update(status='oom' if oom else 'error',
                 reason=f'{type(e).__name__}: {e}'[:500])
      stop_reason = (f'out of memory at N={n}' if oom else
                     f'error at N={n}')
      emit(row)
      gc.collect()
      continue
    previous = (n, row['time_per_call_ms'] / 1e3)
    emit(row)
    gc.collect()


def _exit_on_sigterm() -> None:
  # SystemExit instead of an abrupt end, so `finally` blocks stop children.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def _sweep_worker(case: Case, cfg: BenchmarkConfig, matmul: dict,
                  results) -> None:
  """Entry point of a sweep's own process (host-side)."""
  _exit_on_sigterm()
  try:
    run_sweep(case, cfg, matmul, lambda row: results.put(('row', row)))
  except BaseException:  # pylint: disable=broad-except
    results.put(('failed', traceback.format_exc()))
  results.put(('done', None))


def run_case(case: Case, cfg: BenchmarkConfig, matmul: dict,
             emit: Callable[[dict], None]) -> None:
  """Runs one sweep, in a fresh process unless ``cfg.isolation == 'none'``.

  A worker that dies (segfault, killed for memory) is recorded as a
  'crashed' row at the N it was measuring and skipped rows after it.
  """
  if cfg.isolation == 'none':
    run_sweep(case, cfg, matmul, emit)
    return
  ctx = mp.get_context('spawn')
  results = ctx.Queue()
  worker = ctx.Process(target=_sweep_worker,
                       args=(case, cfg, matmul, results))
  done_sizes = []
  failure = None
  try:
    worker.start()
    while True:
      try:
        kind, payload = results.get(timeout=1.0)
      except queue.Empty:
        if worker.is_alive():
          continue
        try:  # it may have put its last messages just before exiting
          kind, payload = results.get(timeout=5.0)
        except queue.Empty:
          break
      if kind == 'row':
        done_sizes.append(payload['population_size'])
        emit(payload)
      elif kind == 'failed':
        failure = payload
      elif kind == 'done':
        break
    worker.join()
  finally:  # interrupted: stop the worker (it stops its own children)
    if worker.is_alive():
      worker.terminate()
      worker.join()
  remaining = [n for n in cfg.population_sizes if n not in done_sizes]
  if not remaining:
    return
  code = worker.exitcode
  reason = failure or (f'sweep process died with exit code {code}'
                       + (' (killed: likely out of host memory)'
                          if code == -9 else ''))
  for i, n in enumerate(remaining):
    row = _base_row(case, n)
    row.update(status='crashed' if i == 0 else 'skipped',
               reason=reason if i == 0 else
               f'sweep process crashed at N={remaining[0]}')
    emit(row)


# --------------------------------------------------------------------------
# Output: JSON, CSV, plot, summary table
# --------------------------------------------------------------------------


def _reference(rows: Sequence[dict], agent: str):
  """Per-N member-step times of the speed-up reference, and its label.

  Torch sequential with the fewest steps per call (1), as in the paper's
  Figure 2; JAX sequential when torch was not measured.
  """
  for impl in ('torch-sequential', 'jax-sequential'):
    cands = [r for r in rows if r['mode'] == 'independent'
             and r['agent'] == agent and r['implementation'] == impl
             and r['status'] == 'ok']
    if cands:
      steps = min(r['steps_per_call'] for r in cands)
      label = f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}/call'
      return {r['population_size']: r['time_per_member_step_ms']
              for r in cands if r['steps_per_call'] == steps}, label
  return {}, None


def _series(rows: Sequence[dict], mode: str, agent: str):
  """``{(implementation, steps): [(N, row)]}`` of the ok rows."""
  series: dict = {}
  for r in rows:
    if r['mode'] == mode and r['agent'] == agent and r['status'] == 'ok':
      series.setdefault((r['implementation'], r['steps_per_call']), []).append(
          (r['population_size'], r))
  order = {impl: i for i, impl in enumerate(IMPLEMENTATIONS)}
  return {key: sorted(series[key], key=lambda t: t[0])
          for key in sorted(series, key=lambda k: (order[k[0]], k[1]))}


_MARKERS = {'jax-vectorized': 'o', 'jax-sequential': 's', 'jax-parallel': '^',
            'torch-sequential': 'D', 'torch-vectorized': 'v',
            'torch-parallel': 'x'}
_COLORS = {'jax-vectorized': 'tab:blue', 'jax-sequential': 'tab:orange',
           'jax-parallel': 'tab:green', 'torch-sequential': 'tab:red',
           'torch-vectorized': 'tab:purple', 'torch-parallel': 'tab:brown'}


def _log2_axes(ax, sizes: Sequence[int]) -> None:
  ax.set_xscale('log', base=2)
  ax.set_xticks(sizes)
  ax.set_xticklabels([str(n) for n in sizes])
  ax.minorticks_off()


def plot(rows: Sequence[dict], meta: dict, path: str) -> None:
  """Figure 2 style: speed-up over torch sequential (1 step per call) vs N,
  one panel per agent, plus a Figure 4 panel for the shared critic."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  import matplotlib.ticker  # pylint: disable=import-outside-toplevel
  sizes = sorted({r['population_size'] for r in rows if r['status'] == 'ok'})
  agents = [a for a in AGENTS if _series(rows, 'independent', a)]
  shared = _series(rows, 'shared-critic', 'td3')
  panels = len(agents) + bool(shared)
  fig, axes = plt.subplots(1, max(panels, 1), figsize=(5.2 * max(panels, 1), 4.4),
                           squeeze=False)
  axes = list(axes[0])
  references = []
  for ax, agent in zip(axes, agents):
    ref, ref_label = _reference(rows, agent)
    references.append(ref_label)
    for (impl, steps), points in _series(rows, 'independent', agent).items():
      if ref:
        pts = [(n, ref[n] / r['time_per_member_step_ms']) for n, r in points
               if n in ref]
      else:
        pts = [(n, r['time_per_member_step_ms']) for n, r in points]
      if not pts:
        continue
      ax.plot(*zip(*pts), marker=_MARKERS[impl], color=_COLORS[impl],
              linestyle='-' if steps == 1 else '--',
              label=f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}')
    _log2_axes(ax, sizes)
    if ref:
      ax.axhline(1.0, color='grey', linewidth=0.8)
      ax.set_yscale('log', base=2)
      ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter('%g'))
      ax.set_ylabel(f'speed-up over {ref_label}')
    else:
      ax.set_yscale('log')
      ax.set_ylabel('ms per member-step')
    ax.set_xlabel('population size N')
    ax.set_title(f'{agent.upper()} (batch {points[0][1]["batch_size"]})')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  if shared:
    ax = axes[len(agents)]
    for (impl, steps), points in shared.items():
      ax.plot([n for n, _ in points],
              [r['time_per_update_step_ms'] for _, r in points],
              marker=_MARKERS[impl], color=_COLORS[impl],
              linestyle='-' if steps == 1 else '--',
              label=f'{LABELS[impl]}, {steps} step{"s" if steps > 1 else ""}')
    _log2_axes(ax, sizes)
    ax.set_yscale('log')
    ax.set_xlabel('population size N')
    ax.set_ylabel('ms per population update step')
    ax.set_title('TD3, one shared critic (CEM-RL / DvD)')
    ax.grid(True, which='both', alpha=0.3)
    ax.legend(fontsize=7)
  if not panels:
    axes[0].text(0.5, 0.5, 'no successful measurement', ha='center')
  title = f'Update speed on {meta["machine"]["device"]}'
  if any(r and not r.startswith('torch') for r in references):
    title += ('\n(torch sequential not measured: speed-ups are over JAX '
              'sequential)')
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _fmt_ms(value: float) -> str:
  return f'{value:.3g}' if value < 100 else f'{value:.0f}'


def summary_markdown(rows: Sequence[dict], meta: dict) -> str:
  """Markdown tables: ms per member-step (speed-up over the reference) per
  configuration and N, compile times, fraction of the matmul peak."""
  peak = meta.get('matmul_run_peak_flop_per_s',
                  meta['matmul']['peak_flop_per_s'])
  lines = [f'Device: {meta["machine"]["device"]}; matmul peak '
           f'{peak / 1e9:.0f} GFLOP/s ({meta["matmul"]["size"]}x'
           f'{meta["matmul"]["size"]} f32, best measurement of the run).', '']
  sizes = sorted({r['population_size'] for r in rows})
  for mode in ('independent', 'shared-critic'):
    for agent in AGENTS:
      series = _series(rows, mode, agent)
      if not series:
        continue
      ref, ref_label = (_reference(rows, agent) if mode == 'independent'
                        else ({}, None))
      unit = ('ms per member-step' if mode == 'independent'
              else 'ms per population update step')
      what = (f'speed-up over {ref_label}' if ref else None)
      lines.append(f'### {agent.upper()}{" shared critic" if mode != "independent" else ""}: '
                   f'{unit}' + (f' ({what})' if what else ''))
      lines.append('')
      lines.append('| implementation | steps/call | '
                   + ' | '.join(f'N={n}' for n in sizes)
                   + ' | compile (s) | % of matmul peak |')
      lines.append('|---|---:|' + '---:|' * len(sizes) + '---:|---:|')
      for (impl, steps), points in series.items():
        by_n = dict(points)
        cells = []
        for n in sizes:
          r = by_n.get(n)
          if r is None:
            cells.append('')
            continue
          key = ('time_per_member_step_ms' if mode == 'independent'
                 else 'time_per_update_step_ms')
          cell = _fmt_ms(r[key])
          if ref and n in ref:
            cell += f' ({ref[n] / r["time_per_member_step_ms"]:.2g}x)'
          cells.append(cell)
        compiles = [r['compile_s'] for _, r in points
                    if r['compile_s'] is not None]
        compile_cell = (f'{min(compiles):.1f}-{max(compiles):.1f}'
                        if compiles else 'eager')
        fractions = [r['fraction_of_matmul_peak'] for _, r in points
                     if r['fraction_of_matmul_peak'] is not None]
        frac_cell = (f'{100 * min(fractions):.0f}-{100 * max(fractions):.0f}'
                     if fractions else '')
        lines.append(f'| {LABELS[impl]} | {steps} | ' + ' | '.join(cells)
                     + f' | {compile_cell} | {frac_cell} |')
      lines.append('')
  not_ok = [r for r in rows if r['status'] != 'ok']
  if not_ok:
    lines.append('Not measured:')
    lines.append('')
    seen = set()
    for r in not_ok:
      key = (r['mode'], r['agent'], r['implementation'], r['steps_per_call'],
             r['reason'])
      if key in seen:
        continue
      seen.add(key)
      ns = [x['population_size'] for x in not_ok
            if (x['mode'], x['agent'], x['implementation'],
                x['steps_per_call'], x['reason']) == key]
      lines.append(f'- {r["mode"]} {r["agent"]} {r["implementation"]} '
                   f'steps={r["steps_per_call"]} N={",".join(map(str, ns))}: '
                   f'{r["status"]}: {r["reason"]}')
    lines.append('')
  return '\n'.join(lines)


def apply_run_peak(meta: dict, rows: Sequence[dict]) -> None:
  """Sets every row's fraction of the matmul peak against the best matmul
  measurement of the run (``meta['matmul_run_peak_flop_per_s']``)."""
  peaks = [meta['matmul']['peak_flop_per_s']] + [
      r['matmul_peak_flop_per_s'] for r in rows
      if r.get('matmul_peak_flop_per_s')]
  peak = max(peaks)
  meta['matmul_run_peak_flop_per_s'] = peak
  for r in rows:
    if r.get('achieved_flop_per_s'):
      r['fraction_of_matmul_peak'] = r['achieved_flop_per_s'] / peak


def write_results(out: str, meta: dict, rows: Sequence[dict]) -> dict:
  """Writes JSON, CSV, PNG and summary.md to ``out``; returns their paths."""
  apply_run_peak(meta, rows)
  os.makedirs(out, exist_ok=True)
  paths = {name: os.path.join(out, name) for name in (
      'update_speed.json', 'update_speed.csv', 'update_speed.png',
      'summary.md')}
  with open(paths['update_speed.json'], 'w') as f:
    json.dump({'meta': meta, 'rows': list(rows)}, f, indent=1)
  with open(paths['update_speed.csv'], 'w', newline='') as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS)
    writer.writeheader()
    for row in rows:
      writer.writerow({k: ('' if row.get(k) is None else row[k])
                       for k in COLUMNS})
  plot(rows, meta, paths['update_speed.png'])
  with open(paths['summary.md'], 'w') as f:
    f.write(summary_markdown(rows, meta))
  return paths


_STARTED = time.monotonic()


def _log_row(row: dict) -> None:
  head = (f'[{time.monotonic() - _STARTED:5.0f} s] {row["mode"]:13} {row["agent"]} {row["implementation"]:16} '
          f'S={row["steps_per_call"]:<3} N={row["population_size"]:<3}')
  if row['status'] != 'ok':
    print(f'{head} {row["status"]}: {row["reason"]}', flush=True)
    return
  compile_s = row['compile_s']
  frac = row['fraction_of_matmul_peak']
  print(f'{head} {row["time_per_call_ms"]:10.2f} ms/call '
        f'{row["time_per_member_step_ms"]:8.3f} ms/member-step '
        + (f'compile {compile_s:5.1f} s ' if compile_s is not None else
           'compile  n/a   ')
        + (f'{100 * frac:5.1f}% of matmul peak' if frac is not None else ''),
        flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs the benchmark; returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  cfg = parse_args(argv)
  # Several processes may share an accelerator (parallel implementations):
  # do not let the first one reserve most of its memory.
  os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  out = cfg.out or os.path.join('benchmarks', 'results', jax.default_backend())
  print('config:', json.dumps(dataclasses.asdict(cfg)), flush=True)
  torch_wanted = [i for i in cfg.implementations if i in TORCH_IMPLEMENTATIONS]
  if torch_wanted and not TORCH_AVAILABLE:
    print(f'torch is not installed: skipping {", ".join(torch_wanted)} '
          "(pip install torch, or the '.[torch]' extra, to include them)",
          flush=True)
  machine = machine_description()
  print('machine:', json.dumps(machine), flush=True)
  matmul = measure_matmul_peak(cfg.matmul_size)
  print(f'matmul peak: {matmul["peak_flop_per_s"] / 1e9:.1f} GFLOP/s '
        f'(median {matmul["median_flop_per_s"] / 1e9:.1f}) on '
        f'{matmul["size"]}x{matmul["size"]} f32', flush=True)
  meta = dict(
      command='python -m benchmarks.update_speed ' + shlex.join(argv),
      date=datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      config=dataclasses.asdict(cfg), machine=machine, matmul=matmul,
      torch_available=TORCH_AVAILABLE, load_average_1min_at_start=_load_average(),
      notes=[
          'time_per_call_ms: median over samples; a sample averages '
          'calls_per_sample calls (2 with 1 step per call, so TD3\'s '
          'every-other-step policy update is in every sample)',
          'compile_s: ahead-of-time lower+compile where the benchmark owns '
          'the jit (jax-sequential, shared-critic jax-sequential); first call '
          'minus the median call for the learners (trace + compile); the '
          'slowest process for jax-parallel; None for eager torch',
          'flops_per_call: XLA HLO cost analysis of one update step times '
          'steps (jax rows; a lax.cond counts as if its costlier branch ran, '
          'an upper bound for sequential TD3 whose policy step is skipped on '
          'every other step); torch.utils.flop_counter (matmuls and '
          'convolutions only) for torch rows',
          'fraction_of_matmul_peak: achieved FLOP/s over the run\'s matmul '
          'peak (meta.matmul_run_peak_flop_per_s): the fastest of 20 runs of '
          'the matmul, measured at the start of the run and of every sweep, '
          'best of all; matmul_peak_flop_per_s: the best seen when the sweep '
          'started (lower values mean a busier machine)',
          'peak_device_bytes: device allocator peak where the backend reports '
          'one (None on CPU); peak_rss_bytes: host process peak resident set'],
      finished=False)
  rows: list = []

  def emit(row):
    rows.append(row)
    _log_row(row)

  started = time.perf_counter()
  for case in build_cases(cfg):
    if case.implementation in TORCH_IMPLEMENTATIONS and not TORCH_AVAILABLE:
      for n in cfg.population_sizes:
        row = _base_row(case, n)
        row.update(status='skipped', reason='torch is not installed')
        emit(row)
      continue
    run_case(case, cfg, matmul, emit)
    write_results(out, meta, rows)  # partial results survive an interruption
  meta['finished'] = True
  meta['load_average_1min_at_end'] = _load_average()
  meta['wall_s'] = time.perf_counter() - started
  paths = write_results(out, meta, rows)
  print(summary_markdown(rows, meta))
  print('wrote', ', '.join(paths.values()), flush=True)
  return 0


if __name__ == '__main__':
  _exit_on_sigterm()
  sys.exit(main())
