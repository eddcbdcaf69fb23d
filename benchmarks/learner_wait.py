"""Learner wait fraction: a short TD3 run of a population through the pipeline.

Runs ``fastpbrl.pipeline.Pipeline`` (actor processes, replay, rate limiter,
prefetch thread) with ``fastpbrl.learner.PopulationLearner`` on TD3 for a
fixed wall-clock budget and reports the fraction of wall time the learner
spent waiting for data once warm: the first ``--warm-calls`` learner calls
(warm-up steps, start-up, the first compile) are excluded by resetting the
statistics after them.

Usage::

  python -m benchmarks.learner_wait                # 4 members, HalfCheetah-v5
  python -m benchmarks.learner_wait --seconds 300 --members 8

Host-side code only: the training loop, timers and prints.
"""

from __future__ import annotations

import argparse
import functools
import logging
import time

import gymnasium as gym
import jax
import numpy as np

from fastpbrl import agents
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.learner import PopulationLearner, population_hparams
from fastpbrl.pipeline import Pipeline, PipelineConfig
from fastpbrl.types import make_env_spec


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--members', type=int, default=4)
  parser.add_argument('--seconds', type=float, default=90.0,
                      help='wall-clock budget of the whole run')
  parser.add_argument('--warmup-steps', type=int, default=2_000,
                      help='random-action env steps per member')
  parser.add_argument('--warm-calls', type=int, default=5,
                      help='learner calls excluded from the wait fraction')
  parser.add_argument('--steps-per-call', type=int, default=50)
  parser.add_argument('--batch-size', type=int, default=256)
  parser.add_argument('--hidden', type=int, nargs='+', default=[256, 256])
  parser.add_argument('--ratio', type=float, default=1.0,
                      help='update-to-data ratio')
  parser.add_argument('--processes', type=int, default=None)
  parser.add_argument('--seed', type=int, default=0)
  return parser.parse_args()


def main() -> None:
  args = parse_args()
  if args.warm_calls < 1:
    raise SystemExit(f'--warm-calls must be >= 1, got {args.warm_calls}')
  logging.basicConfig(level=logging.INFO,
                      format='%(asctime)s %(name)s: %(message)s')
  logging.getLogger('jax').setLevel(logging.WARNING)
  spec = make_env_spec(gym.make(args.env))
  config = TD3Config(hidden_sizes=tuple(args.hidden),
                     batch_size=args.batch_size,
                     steps_per_call=args.steps_per_call)
  agent = agents.make_agent('td3', spec, config)
  n = args.members
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(args.seed), hparams)
  pipeline_config = PipelineConfig(
      num_steps=args.steps_per_call, batch_size=args.batch_size,
      warmup_steps=args.warmup_steps, update_to_data_ratio=args.ratio,
      num_actor_processes=args.processes, replay_capacity=1_000_000)
  print(f'learner wait: TD3 {tuple(args.hidden)}, {n} members on {args.env}, '
        f'{args.steps_per_call} update steps x batch {args.batch_size} per '
        f'call, ratio {args.ratio}, warm-up {args.warmup_steps} steps per '
        f'member, budget {args.seconds:.0f} s')
  start = time.monotonic()
  calls = 0
  call_times = []
  with Pipeline(args.env,
                functools.partial(agents.make_agent, 'td3', config=config),
                learner.policy_params(state), hparams, pipeline_config,
                seed=args.seed) as pipeline:
    while time.monotonic() - start < args.seconds:
      t0 = time.monotonic()
      batch = pipeline.next_batch()
      state, _ = learner.update(state, hparams, batch)
      pipeline.publish(learner.policy_params(state), hparams)  # syncs
      calls += 1
      call_times.append(time.monotonic() - t0)
      if calls == args.warm_calls:
        first_wait = pipeline.wait_stats().first_wait_s
        pipeline.reset_wait_stats()
        warm_at = time.monotonic()
        warm_env_steps = pipeline.env_steps.copy()
    stats = pipeline.wait_stats()
    episodes = pipeline.drain_episodes()
    env_steps = pipeline.env_steps
    ratio = pipeline.update_to_data_ratio()
    actors = pipeline.pool.status()
  if calls <= args.warm_calls:
    raise SystemExit(f'only {calls} learner calls in {args.seconds} s: raise '
                     '--seconds or lower --warm-calls')
  warm_s = time.monotonic() - warm_at
  per_call = np.median(call_times[args.warm_calls:])
  rate = (env_steps - warm_env_steps).sum() / warm_s
  returns = {}
  for r in episodes:
    if not r.evaluation:
      returns.setdefault(r.member, []).append(r.episode_return)
  print(f'learner calls: {calls} ({stats.batches} after the first '
        f'{args.warm_calls}), median {per_call * 1e3:.0f} ms per call incl. '
        f'waiting')
  print(f'env steps per member: {env_steps.tolist()}, update steps per member '
        f'{calls * args.steps_per_call}, achieved ratio {ratio:.3f}')
  print(f'env steps collected once warm: {rate:.0f} per s (all members)')
  print(f'prefetch: {stats.sample_s * 1e3:.1f} ms sampling + '
        f'{stats.transfer_s * 1e3:.1f} ms device_put per batch')
  print('actors blocked by backpressure: '
        + ', '.join(f'{a.blocked_s:.1f} s' for a in actors))
  print('episodes: ' + ', '.join(
      f'member {m}: {len(v)} (last return {v[-1]:.0f})'
      for m, v in sorted(returns.items())))
  print(f'first batch after {first_wait:.1f} s (actor start-up + warm-up)')
  print(f'LEARNER WAIT FRACTION once warm: {stats.wait_fraction:.2%} '
        f'({stats.wait_s:.2f} s of {stats.wall_s:.1f} s; last '
        f'{min(stats.batches, 50)} calls: {stats.recent_wait_fraction:.2%})')


if __name__ == '__main__':
  main()
