"""Wall time of on-policy members through fastpbrl's actor processes beside
one Stable-Baselines3 PPO agent: ``N`` PPO members x ``S`` env steps each
(``fastpbrl.datapath.actor_rollouts``, synchronous iterations) against SB3's PPO x
``S`` on the same env, and the ratio of the two wall times (below ``N``:
the population costs less than ``N`` SB3 runs one after another).

Host-side benchmark code (processes, torch); nothing in ``fastpbrl``
imports this module.

Both sides use the agent's settings: SB3 gets ``n_steps =
rollout_length``, ``batch_size``, ``n_epochs`` (where the agent's config
has one) and ``net_arch`` = ``hidden_sizes``, one env, on the CPU. The
fastpbrl wall time includes its start (actor processes, compilation), as
SB3's includes building its model: what a user waits for.

::

  python -m benchmarks.ppo_actor_speed                  # HalfCheetah-v5
  python -m benchmarks.ppo_actor_speed --smoke          # seconds, CartPole

The real measurement runs on a quiet machine; ``--smoke`` only checks that
both sides run and the result file is written.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import tempfile
import time

from benchmarks.provenance import cpu_machine, git_commit

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'results', 'ppo', 'actor_speed.json')
SMOKE = {'env': 'CartPole-v1',
         'agent': 'tests.rollout_agent_for_tests:ROLLOUT_TEST',
         'env_steps': 64, 'population_size': 2}


def agent_config(agent_ref: str):
  """The registered config's defaults of ``agent_ref`` (a rollout agent)."""
  from fastpbrl import agents  # local: a spawned actor re-imports this file
  spec = agents.get(agent_ref)
  if spec.learns_from != 'rollout':
    raise SystemExit(f'--agent {agent_ref} does not learn from rollouts')
  return spec.config()


def run_fastpbrl(env: str, agent_ref: str, population_size: int,
                 env_steps: int, num_actors: int | None) -> dict:
  """``population_size`` members x ``env_steps`` through the actors."""
  import fastpbrl  # local: see agent_config
  from fastpbrl.actors import default_num_processes
  config = agent_config(agent_ref)
  processes = (default_num_processes(population_size, on_policy=True)
               if num_actors is None else min(num_actors, population_size))
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as run_dir:
    result = fastpbrl.train(
        'seeds', agent=agent_ref, env=env, population_size=population_size,
        env_steps=env_steps, run_dir=os.path.join(run_dir, 'run'),
        steps_per_call=config.rollout_length * config.num_envs,
        warmup_steps=1,  # no warm-up on this path; the check reads it
        eval_every=env_steps, eval_episodes=1, num_actors=num_actors,
        progress=False)
  return {'wall_s': time.perf_counter() - start,
          'run_wall_s': result.run.wall_time,
          'env_steps_per_member': result.run.env_steps,
          'actor_processes': processes,
          'calls': result.run.calls}


def run_sb3(env: str, agent_ref: str, env_steps: int, seed: int = 0) -> dict:
  """One SB3 PPO agent x ``env_steps`` with the agent's settings."""
  import gymnasium as gym  # local: only this side needs them
  import torch
  from stable_baselines3 import PPO
  config = agent_config(agent_ref)
  torch.set_num_threads(1)  # as one fastpbrl actor: one core
  kwargs = {'n_steps': config.rollout_length,
            'batch_size': config.batch_size,
            'policy_kwargs': {'net_arch': list(config.hidden_sizes)}}
  for name in ('num_epochs', 'epochs', 'n_epochs'):  # as the agent names it
    if hasattr(config, name):
      kwargs['n_epochs'] = int(getattr(config, name))
      break
  start = time.perf_counter()
  model = PPO('MlpPolicy', gym.make(env), seed=seed, device='cpu', **kwargs)
  model.learn(total_timesteps=env_steps)
  return {'wall_s': time.perf_counter() - start,
          'env_steps': int(model.num_timesteps),
          'settings': {k: v for k, v in kwargs.items()}}


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--agent', default='ppo')
  parser.add_argument('--env-steps', type=int, default=200_000,
                      help='S: env steps per member, and of the SB3 agent')
  parser.add_argument('--population-size', type=int, default=4)
  parser.add_argument('--num-actors', type=int, default=None)
  parser.add_argument('--out', default=RESULT)
  parser.add_argument('--smoke', action='store_true',
                      help=f'tiny settings {SMOKE} (checks the code runs)')
  args = parser.parse_args(argv)
  if args.smoke:
    for k, v in SMOKE.items():
      setattr(args, k, v)
  ours = run_fastpbrl(args.env, args.agent, args.population_size,
                      args.env_steps, args.num_actors)
  sb3 = run_sb3(args.env, args.agent, args.env_steps)
  record = {
      'command': ' '.join([sys.executable, '-m', 'benchmarks.ppo_actor_speed',
                           *(sys.argv[1:] if argv is None else argv)]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'commit': git_commit(), 'machine': cpu_machine(), 'smoke': args.smoke,
      'env': args.env, 'agent': args.agent,
      'agent_config': dataclasses.asdict(agent_config(args.agent)),
      'population_size': args.population_size, 'env_steps': args.env_steps,
      'fastpbrl': ours, 'sb3': sb3,
      # fastpbrl's N members over one SB3 agent: below N, the population
      # costs less than N SB3 runs one after another.
      'wall_time_ratio': ours['wall_s'] / sb3['wall_s'],
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, 'w') as f:
    json.dump(record, f, indent=2, default=str)
    f.write('\n')
  print(f'{args.population_size} members x {args.env_steps} steps: '
        f'{ours["wall_s"]:.1f} s; SB3 PPO x {args.env_steps}: '
        f'{sb3["wall_s"]:.1f} s; ratio {record["wall_time_ratio"]:.2f}')
  return record


if __name__ == '__main__':
  main()
