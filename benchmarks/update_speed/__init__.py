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
call, over a list of population sizes. ``--agents ppo`` adds PPO on
HalfCheetah-v5 shapes at SB3's defaults (64x64 tanh MLPs, one iteration
of a 2048-step rollout, 10 epochs of minibatches of 64, per call; its
update steps are env steps, see ``config.py``). ``--shared-critic`` adds the CEM-RL /
DvD case of Figure 4: one TD3 critic shared by the population,
``SharedCriticLearner`` against CEM-RL's sequential order.

Per configuration it reports the median time per call and per member-step,
the compile time apart, XLA's FLOPs per call and the achieved FLOP/s as a
fraction of a matmul peak measured on the same device in the same run, peak
memory, and writes ``update_speed.json``, ``update_speed.csv``,
``update_speed.png`` (Figure 2 style) and ``summary.md`` to ``--out``.

Runs on whichever JAX backend is present (CPU, GPU or TPU). Host-side code
only: processes, timers and files. The programs timed are the package's own
(``PopulationLearner``, ``SharedCriticLearner``, ``agent.update``); this
benchmark only builds inputs, calls them and reads the clock.

Layout, by job: ``config.py`` (what is measured: the config, agent shapes,
the cases), ``measurements.py`` (FLOPs, matmul peak, memory, machine),
``implementations.py`` (one runner per implementation), ``timing.py`` (one
configuration), ``sweep.py`` (population sizes, worker processes),
``report.py`` (JSON, CSV, plot, summary) and this module: the command line
and ``main``. Every name of the former single-file module is importable
from here.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import shlex
import sys
import time
from typing import Callable, Optional, Sequence

import jax

# The names used here, and every other name of the former single-file
# module, re-exported for code that imports them from here (the tests do).
from benchmarks.update_speed.config import (  # noqa: F401
    _AGENT_MODULES, AGENTS, ATARI_FRAME_SHAPE, ATARI_NUM_ACTIONS,
    BARRIER_TIMEOUT_S, COLUMNS, DEFAULT_AGENTS, DEFAULT_POPULATION_SIZES,
    HALF_CHEETAH_ACTION_DIM, HALF_CHEETAH_OBS_DIM, IMPLEMENTATIONS, LABELS,
    MIN_SAMPLES, SHARED_CRITIC_IMPLEMENTATIONS, TORCH_AVAILABLE,
    TORCH_IMPLEMENTATIONS, BenchmarkConfig, Case, available_cores,
    build_cases, default_batch_size, default_steps, env_spec, iterations,
    make_agent, random_data, whole_steps)
from benchmarks.update_speed.implementations import (  # noqa: F401
    PARALLEL_MEMBER_RUNNERS, RUNNERS, JaxSequential, JaxVectorized,
    SharedCriticSequential, SharedCriticVectorized, TorchSequential,
    TorchVectorized, _LearnerRunner, _Runner, _SkipCase, _TorchRunner,
    random_batch, torch_device)
from benchmarks.update_speed.measurements import (  # noqa: F401
    _abstract, _flops_from, _jax_device_peak_bytes,
    _memory_total_bytes, _peak_rss_bytes, _version, calls_per_sample,
    device_description, is_out_of_memory, machine_description,
    measure_matmul_peak, xla_flops)
from benchmarks.update_speed.report import (  # noqa: F401
    _COLORS, _MARKERS, _fmt_ms, _log2_axes, _reference, _series,
    apply_run_peak, plot, summary_markdown, write_results)
from benchmarks.update_speed.sweep import (  # noqa: F401
    _exit_on_sigterm, _sweep_worker, run_case, run_sweep)
from benchmarks.update_speed.timing import (  # noqa: F401
    _base_row, _finish_row, _load_average, _parallel_member,
    _ParallelFailure, measure, measure_parallel)


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
      help='agents to time (default: td3 sac dqn; ppo when named); may be '
      'empty with --shared-critic')
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
      help='batch size for every agent instead of 256 (TD3/SAC) and 32 (DQN) '
      "(PPO: its minibatch size instead of 64; it must divide 2048)")
  parser.add_argument(
      '--hidden', type=_positive_int, default=None,
      help='hidden width of the two TD3/SAC MLP layers instead of 256 (PPO: '
      'of its 64)')
  parser.add_argument(
      '--isolation', choices=('process', 'none'), default=defaults.isolation,
      help="'process' (default): each sweep in a fresh process; 'none': "
      'everything in this process (faster start, for debugging)')
  parser.add_argument(
      '--max-parallel-processes', type=_positive_int,
      default=defaults.max_parallel_processes,
      help='largest N for jax-parallel and torch-parallel '
      '(default: twice the available cores)')
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
      '(default: the available cores); torch-parallel '
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
  ppo_iteration = default_steps('ppo')  # one iteration's env steps
  if ('ppo' in args.agents and args.batch_size is not None
      and ppo_iteration % args.batch_size):
    parser.error(f'--batch-size {args.batch_size} must divide PPO\'s '
                 f'{ppo_iteration}-step rollout (its minibatch size)')
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
