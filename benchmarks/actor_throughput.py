"""Actor throughput: env steps per second per actor process.

Compares, in one run on the same machine,

* **plain**: one ``gymnasium.make`` env stepped in a Python loop with
  ``env.action_space.sample()`` actions (reset on episode end) — the
  reference; also with actions from a ``np.random.Generator`` to show what
  the action sampling alone costs;
* **actor (random)**: fastpbrl actor processes in their warm-up phase
  (uniform random actions, no policy call);
* **actor (policy)**: the same processes acting with the members' TD3
  policies, one vectorized jitted CPU call per step for all hosted members,
  with exploration noise;

each actor phase going through the real transport (chunks over the
shared-memory channels, inserted into a per-member replay by the reader
threads). The plain loop runs while no actor is running, and once before and
once after the actor phases; their mean is the reference.

Usage::

  python -m benchmarks.actor_throughput            # HalfCheetah-v5, 4 members
  python -m benchmarks.actor_throughput --members 8 --processes 2 --seconds 20

Host-side code only: processes, timers and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import time

import gymnasium as gym
import jax
import numpy as np

from fastpbrl import agents
from fastpbrl.actors import ActorPool, ParamStore, default_num_processes
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.learner import PopulationLearner, population_hparams
from fastpbrl.replay import PerMemberReplay, transition_fields
from fastpbrl.types import make_env_spec


@dataclasses.dataclass
class Args:
  env: str = 'HalfCheetah-v5'
  members: int = 4
  processes: int | None = None  # default: available cores minus one
  seconds: float = 10.0  # measured time per phase
  hidden: tuple[int, ...] = (256, 256)
  chunk_steps: int = 32
  prng_impl: str = 'threefry2x32'
  seed: int = 0


def parse_args() -> Args:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  defaults = Args()
  parser.add_argument('--env', default=defaults.env)
  parser.add_argument('--members', type=int, default=defaults.members)
  parser.add_argument('--processes', type=int, default=None)
  parser.add_argument('--seconds', type=float, default=defaults.seconds)
  parser.add_argument('--hidden', type=int, nargs='+',
                      default=list(defaults.hidden))
  parser.add_argument('--chunk-steps', type=int, default=defaults.chunk_steps)
  parser.add_argument('--prng-impl', default=defaults.prng_impl)
  parser.add_argument('--seed', type=int, default=defaults.seed)
  ns = parser.parse_args()
  return Args(env=ns.env, members=ns.members, processes=ns.processes,
              seconds=ns.seconds, hidden=tuple(ns.hidden),
              chunk_steps=ns.chunk_steps, prng_impl=ns.prng_impl, seed=ns.seed)


def plain_steps_per_s(env_id: str, seconds: float, seed: int,
                      numpy_actions: bool = False) -> float:
  """Plain gymnasium stepping with random actions in one loop."""
  env = gym.make(env_id)
  env.reset(seed=seed)
  env.action_space.seed(seed)
  rng = np.random.default_rng(seed)
  low, high = env.action_space.low, env.action_space.high
  steps = 0
  start = time.perf_counter()
  end = start + seconds
  while True:
    for _ in range(100):
      action = (rng.uniform(low, high) if numpy_actions
                else env.action_space.sample())
      _, _, terminated, truncated, _ = env.step(action)
      if terminated or truncated:
        env.reset()
    steps += 100
    now = time.perf_counter()
    if now >= end:
      break
  env.close()
  return steps / (now - start)


def actor_steps_per_s(args: Args, random_phase: bool) -> tuple[float, int]:
  """Env steps per second per actor process; returns (rate, processes)."""
  env_id = args.env
  spec = make_env_spec(gym.make(env_id))
  config = TD3Config(hidden_sizes=args.hidden)
  agent = agents.make_agent('td3', spec, config)
  n = args.members
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(args.seed), hparams)
  tree = jax.device_get((learner.policy_params(state), hparams))
  fields = transition_fields(spec)
  replay = PerMemberReplay(fields, n, capacity=200_000)

  def sink(actor_id, members, chunk):
    del actor_id
    replay.insert(members, chunk, int(chunk['meta'][0]))

  processes = args.processes or default_num_processes(n)
  store = ParamStore.create(tree)
  try:
    store.write(tree)
    pool = ActorPool(
        env_fn=functools.partial(gym.make, env_id),
        agent_fn=functools.partial(agents.make_agent, 'td3', config=config),
        transition_fields=fields, num_members=n, store=store, sink=sink,
        seed=args.seed, num_processes=processes, chunk_steps=args.chunk_steps,
        warmup_steps=10**12 if random_phase else 0, prng_impl=args.prng_impl)
    with pool:
      pool.start()
      # Start-up (spawn, imports, first compile) is not measured: wait until
      # every process has sent a few chunks.
      deadline = time.monotonic() + 120
      while (replay.inserted() < 4 * args.chunk_steps).any():
        pool.check()
        if time.monotonic() > deadline:
          raise TimeoutError('actors did not start within 120 s:\n'
                             + pool.describe_status())
        time.sleep(0.05)
      start_steps, start = replay.inserted().sum(), time.perf_counter()
      time.sleep(args.seconds)
      pool.check()
      steps, end = replay.inserted().sum(), time.perf_counter()
  finally:
    store.close()
  return (steps - start_steps) / (end - start) / pool.num_processes, (
      pool.num_processes)


def main() -> None:
  args = parse_args()
  logging.basicConfig(level=logging.WARNING)
  print(f'actor throughput: {args.env}, {args.members} members, TD3 policy '
        f'{args.hidden}, chunk {args.chunk_steps} steps, prng '
        f'{args.prng_impl}, {args.seconds:.0f} s per phase, '
        f'{len(os.sched_getaffinity(0))} cores available')
  plain_before = plain_steps_per_s(args.env, args.seconds / 2, args.seed)
  numpy_before = plain_steps_per_s(args.env, args.seconds / 2, args.seed,
                                   numpy_actions=True)
  random_rate, p = actor_steps_per_s(args, random_phase=True)
  policy_rate, _ = actor_steps_per_s(args, random_phase=False)
  plain_after = plain_steps_per_s(args.env, args.seconds / 2, args.seed)
  numpy_after = plain_steps_per_s(args.env, args.seconds / 2, args.seed,
                                  numpy_actions=True)
  plain = (plain_before + plain_after) / 2
  plain_numpy = (numpy_before + numpy_after) / 2
  m = -(-args.members // p)
  print(f'plain gymnasium loop, action_space.sample(): {plain:8.0f} steps/s '
        f'(before {plain_before:.0f}, after {plain_after:.0f})')
  print(f'plain gymnasium loop, numpy Generator actions: {plain_numpy:8.0f} '
        f'steps/s')
  print(f'actor process, warm-up (random actions):  {random_rate:8.0f} '
        f'steps/s per process = {random_rate / plain:.0%} of plain '
        f'({p} process(es), up to {m} members each)')
  print(f'actor process, TD3 policy + noise:        {policy_rate:8.0f} '
        f'steps/s per process = {policy_rate / plain:.0%} of plain')


if __name__ == '__main__':
  main()
