"""Learner wait fraction: short TD3 runs of populations through the pipeline.

For each population size and each data path, runs ``fastpbrl.datapath.actor_replay.Pipeline``
(actor processes, replay, rate limiter, prefetch) with
``fastpbrl.learner.population.PopulationLearner`` on TD3 for a fixed wall-clock budget
and reports, once warm (the first ``--warm-calls`` calls, which hold the
warm-up and the first compile, are excluded):

* the fraction of wall time the learner waited for data (goal: < 5%);
* the time per learner call and per member-step (call time / (N x steps));
* the achieved update-to-data ratio and env steps collected per second.

The data paths, side by side in one run:

* ``sync``: the loop as it was: host replay, and after each call the
  parameters are fetched (``device_get``, which waits for the call) and
  written to shared memory before the next call is dispatched;
* ``host``: host replay, the call's parameters published by a thread
  (``Pipeline.publish_async``) and its metrics read once the next call is
  dispatched (what ``fastpbrl.run.main`` does);
* ``device``: as ``host``, with the replay on the device and sampling inside
  the compiled call (``fastpbrl.replay.device``).

Usage::

  python -m benchmarks.learner_wait                  # 8, 32, 80 members
  python -m benchmarks.learner_wait --members 4 --modes host device --seconds 30

A table goes to stdout and every row, with the command and the machine, to
``--out`` (default ``benchmarks/results/<backend>/learner_wait.json``).
Host-side code only: training loops, timers and prints.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import sys
import time

import jax
import numpy as np

from benchmarks.data_paths import td3_population
from fastpbrl import agents
from fastpbrl.datapath.actor_replay import Pipeline
from fastpbrl.datapath.common import PipelineConfig

MODES = ('sync', 'host', 'device')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--members', type=int, nargs='+', default=[8, 32, 80])
  parser.add_argument('--modes', nargs='+', default=list(MODES),
                      choices=MODES)
  parser.add_argument('--seconds', type=float, default=60.0,
                      help='wall-clock budget of each run')
  parser.add_argument('--warmup-steps', type=int, default=500,
                      help='random-action env steps per member')
  parser.add_argument('--warm-calls', type=int, default=5,
                      help='learner calls excluded from the figures')
  parser.add_argument('--steps-per-call', type=int, default=50)
  parser.add_argument('--batch-size', type=int, default=256)
  parser.add_argument('--hidden', type=int, nargs='+', default=[64, 64])
  parser.add_argument('--ratio', type=float, default=1.0,
                      help='update-to-data ratio (the limiter\'s cap)')
  parser.add_argument('--replay-capacity', type=int, default=100_000,
                      help='transitions per member (the device replay '
                      'allocates all of it at start)')
  parser.add_argument('--processes', type=int, default=None)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default=None)
  args = parser.parse_args(argv)
  if args.warm_calls < 1:
    parser.error(f'--warm-calls must be >= 1, got {args.warm_calls}')
  if min(args.members) < 1:
    parser.error(f'--members must be >= 1, got {args.members}')
  return args


def run_one(args, n: int, mode: str) -> dict:
  config, _, hparams, learner, state = td3_population(args, n, args.env)
  pipeline_config = PipelineConfig(
      num_steps=args.steps_per_call, batch_size=args.batch_size,
      warmup_steps=args.warmup_steps, update_to_data_ratio=args.ratio,
      num_actor_processes=(None if args.processes is None
                           else min(args.processes, n)),
      replay_capacity=args.replay_capacity,
      replay_location='device' if mode == 'device' else 'host')
  calls = 0
  call_ends = []
  pending = None
  with Pipeline(args.env,
                functools.partial(agents.make_agent, 'td3', config=config),
                learner.policy_params(state), hparams, pipeline_config,
                seed=args.seed) as pipeline:
    start = time.monotonic()
    while time.monotonic() - start < args.seconds:
      batch = pipeline.next_batch()
      state, metrics = learner.update(state, hparams, batch)
      if mode == 'sync':
        np.asarray(metrics['finite'])
        pipeline.publish(learner.policy_params(state), hparams)  # waits
      else:
        if pending is not None:  # the previous call's, as fastpbrl.run.main does
          np.asarray(pending['finite'])
        pending = metrics
        pipeline.publish_async(learner.policy_params(state), hparams)
      calls += 1
      call_ends.append(time.monotonic())
      if calls == args.warm_calls:
        pipeline.reset_wait_stats()
        warm_at = time.monotonic()
        warm_env_steps = pipeline.env_steps.copy()
    jax.block_until_ready(state)
    done_at = time.monotonic()
    stats = pipeline.wait_stats()
    env_steps = pipeline.env_steps
    ratio = pipeline.update_to_data_ratio()
    processes = pipeline.pool.num_processes
  if calls <= args.warm_calls + 1:
    raise SystemExit(f'N={n} {mode}: only {calls} learner calls in '
                     f'{args.seconds} s: raise --seconds or lower '
                     '--warm-calls')
  warm_s = done_at - warm_at
  per_call = np.median(np.diff(call_ends[args.warm_calls - 1:]))
  return {
      'members': n, 'mode': mode, 'calls': calls,
      'warm_calls': calls - args.warm_calls,
      'wait_fraction': stats.wait_fraction,
      'ms_per_call': per_call * 1e3,
      'us_per_member_step': per_call / (n * args.steps_per_call) * 1e6,
      'achieved_ratio': ratio,
      'env_steps_per_s': float((env_steps - warm_env_steps).sum() / warm_s),
      'sample_ms': stats.sample_s * 1e3, 'transfer_ms': stats.transfer_s * 1e3,
      'actor_processes': processes}


def main(argv=None) -> None:
  args = parse_args(argv)
  logging.basicConfig(level=logging.WARNING,
                      format='%(asctime)s %(name)s: %(message)s')
  backend = jax.default_backend()
  out = args.out or os.path.join('benchmarks', 'results', backend,
                                 'learner_wait.json')
  print(f'learner wait: TD3 {tuple(args.hidden)} on {args.env}, '
        f'{args.steps_per_call} steps x batch {args.batch_size} per call, '
        f'ratio {args.ratio}, {args.seconds:.0f} s per run, '
        f'{jax.devices()[0].device_kind} ({backend})')
  header = (f'{"N":>4} {"mode":>7} {"wait":>7} {"ms/call":>8} '
            f'{"us/member-step":>15} {"ratio":>6} {"env steps/s":>12} '
            f'{"sample+put ms":>14}')
  print(header)
  rows = []
  for n in args.members:
    for mode in args.modes:
      row = run_one(args, n, mode)
      rows.append(row)
      print(f'{n:>4} {mode:>7} {row["wait_fraction"]:>7.1%} '
            f'{row["ms_per_call"]:>8.1f} {row["us_per_member_step"]:>15.2f} '
            f'{row["achieved_ratio"]:>6.2f} {row["env_steps_per_s"]:>12.0f} '
            + (f'{row["sample_ms"] + row["transfer_ms"]:>14.1f}'
               if mode != 'device' else f'{"-":>14}'), flush=True)
  os.makedirs(os.path.dirname(out) or '.', exist_ok=True)
  with open(out, 'w') as f:
    json.dump({'command': ' '.join([sys.executable, '-m',
                                    'benchmarks.learner_wait', *sys.argv[1:]]),
               'machine': {'platform': platform.platform(),
                           'processor': platform.processor(),
                           'cpus': os.cpu_count(),
                           'device': jax.devices()[0].device_kind,
                           'jax': jax.__version__},
               'date': time.strftime('%Y-%m-%d'), 'rows': rows}, f, indent=1)
  print(f'rows in {out}')


if __name__ == '__main__':
  main()
