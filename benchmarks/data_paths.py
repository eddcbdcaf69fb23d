"""The two data paths side by side: actor processes stepping gymnasium envs
against JAX envs stepped on the device inside the learner call.

For each population size, TD3 members (small networks, 64x64 by default)
train for a fixed wall-clock budget on:

* ``actors``: ``fastpbrl.datapath.actor_replay.Pipeline`` (actor processes step the
  gymnasium env ``--env``, host replay, prefetch thread, parameters
  published by a thread), the loop ``fastpbrl.run.main`` runs;
* ``on-device``: ``fastpbrl.datapath.device_replay.DevicePipeline`` (the JAX env
  ``--jax-env`` stepped, acted in, inserted, sampled and updated in one
  compiled call). On the CPU backend, ``--cpu-devices K`` gives XLA ``K``
  host devices and splits the population over them (``--devices``), so
  that the one compiled call runs on ``K`` cores: the actors path uses
  the cores its actor processes run on, and XLA runs a small network's
  operations on one thread.

Once warm (the warm-up and the first ``--warm-calls`` calls, which hold the
compiles, are excluded) each row reports the population's env steps per
second, update steps per second, the fraction of wall time the learner
waited for data (``actors``: for a batch; ``on-device``: for the host
between two calls), and the peak resident memory of the run's processes
(each row runs in a fresh process; for ``actors`` the largest of the actor
processes is added). Both run at the same update-to-data ratio, so env
steps per second is also the rate of learning.

Usage::

  python -m benchmarks.data_paths                              # CPU sweep
  python -m benchmarks.data_paths --modes on-device --jax-env brax:hopper \\
      --members 256 1024 --out benchmarks/results/gpu/data_paths.json  # GPU

A table goes to stdout, every row with the command, machine, date and
commit to ``--out`` (default ``benchmarks/results/<backend>/
data_paths.json``) and a table to the same name with ``.md``.
Host-side code: training loops, timers, subprocesses and prints.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import resource
import sys
import time

import jax
import numpy as np

from benchmarks.provenance import (answered_one_row, git_commit,
                                   row_in_process, write_record)
from fastpbrl import agents
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.datapath.actor_replay import Pipeline
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.device_replay import DevicePipeline, EnvCall
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.run.build import make_env_spec

MODES = ('actors', 'on-device')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='Pendulum-v1',
                      help='gymnasium env of the actors path')
  parser.add_argument('--jax-env', default='gymnax:Pendulum-v1',
                      help='JAX env of the on-device path')
  parser.add_argument('--members', type=int, nargs='+',
                      default=[4, 16, 64, 256, 1024])
  parser.add_argument('--modes', nargs='+', default=list(MODES),
                      choices=MODES)
  parser.add_argument('--seconds', type=float, default=60.0,
                      help='wall-clock budget of each row, once warm')
  parser.add_argument('--warmup-steps', type=int, default=200)
  parser.add_argument('--warm-calls', type=int, default=3)
  parser.add_argument('--steps-per-call', type=int, default=50)
  parser.add_argument('--batch-size', type=int, default=256)
  parser.add_argument('--hidden', type=int, nargs='+', default=[64, 64])
  parser.add_argument('--envs-per-member', type=int, default=1,
                      help='on-device: envs each member acts in at once')
  parser.add_argument('--replay-capacity', type=int, default=10_000,
                      help='transitions per member')
  parser.add_argument('--cpu-devices', type=int, default=1,
                      help='on-device rows on the CPU backend: host devices '
                      'the population is split over (rows whose N they do '
                      'not divide use one)')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default=None)
  parser.add_argument('--one', nargs=2, metavar=('N', 'MODE'),
                      help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def td3_population(args, n: int, env_id: str, mesh=None):
  """``(config, agent, hparams, learner, state)`` of ``n`` TD3 members of
  ``args.hidden`` networks on ``env_id`` (also ``learner_wait``'s), split
  over ``mesh``'s devices when one is given."""
  config = TD3Config(hidden_sizes=tuple(args.hidden),
                     batch_size=args.batch_size,
                     steps_per_call=args.steps_per_call)
  agent = agents.make_agent('td3', make_env_spec(env_id), config)
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent, mesh=mesh)
  state = learner.init(jax.random.PRNGKey(args.seed), hparams)
  return config, agent, hparams, learner, state


def setup(args, n: int, env_id: str, mesh=None):
  pipeline_config = PipelineConfig(
      num_steps=args.steps_per_call, batch_size=args.batch_size,
      warmup_steps=args.warmup_steps, warmup_counts_as_data=False,
      replay_capacity=args.replay_capacity, replay_location='host')
  return (*td3_population(args, n, env_id, mesh), pipeline_config)


class Clock:
  """Calls, env steps and update steps from the warm point on."""

  def __init__(self, args):
    self.args, self.calls, self.start = args, 0, time.monotonic()
    self.warm_at = self.warm_steps = None

  def tick(self, pipeline, updates: int) -> bool:
    """Counts a call; True while the budget lasts."""
    self.calls += 1
    if self.calls == self.args.warm_calls:
      pipeline.reset_wait_stats()
      self.warm_at = time.monotonic()
      self.warm_steps = pipeline.env_steps.copy()
      self.warm_updates = updates
    return (self.warm_at is None
            or time.monotonic() - self.warm_at < self.args.seconds)

  def row(self, n: int, mode: str, pipeline, updates: int) -> dict:
    seconds = time.monotonic() - self.warm_at
    steps = float((pipeline.env_steps - self.warm_steps).sum())
    return {'members': n, 'mode': mode, 'seconds': seconds,
            'calls': self.calls - self.args.warm_calls,
            'env_steps_per_s': steps / seconds,
            'update_steps_per_s': n * (updates - self.warm_updates) / seconds,
            'wait_fraction': pipeline.wait_fraction()}


def run_actors(args, n: int) -> dict:
  config, _, hparams, learner, state, pipeline_config = setup(args, n,
                                                               args.env)
  clock, updates = Clock(args), 0
  with Pipeline(args.env,
                functools.partial(agents.make_agent, 'td3', config=config),
                learner.policy_params(state), hparams, pipeline_config,
                seed=args.seed) as pipeline:
    pending = None
    while True:
      state, metrics = learner.update(state, hparams, pipeline.next_batch())
      if pending is not None:  # the previous call's, as fastpbrl.run.main does
        np.asarray(pending['finite'])
      pending = metrics
      pipeline.publish_async(learner.policy_params(state), hparams)
      updates += args.steps_per_call
      if not clock.tick(pipeline, updates):
        break
    jax.block_until_ready(state)
    row = clock.row(n, 'actors', pipeline, updates)
    row['actor_processes'] = pipeline.pool.num_processes
  return row


def run_on_device(args, n: int) -> dict:
  devices = sharding.choose_devices('auto', n)
  mesh = sharding.make_mesh(devices) if len(devices) > 1 else None
  _, agent, hparams, learner, state, pipeline_config = setup(
      args, n, args.jax_env, mesh)
  pipeline = DevicePipeline(jax_envs.make(args.jax_env), agent, learner, n,
                            pipeline_config, seed=args.seed,
                            envs_per_member=args.envs_per_member)
  pipeline.publish(learner.policy_params(state), hparams)
  clock = Clock(args)
  while True:
    batch = pipeline.next_batch()
    if isinstance(batch, EnvCall):
      state, metrics = pipeline.run_call(learner, state, hparams, hparams)
    else:
      state, metrics = learner.update(state, hparams, batch)
    np.asarray(metrics['finite'])
    pipeline.publish(learner.policy_params(state), hparams)
    if not clock.tick(pipeline, pipeline.update_steps):
      break
  jax.block_until_ready(state)
  row = clock.row(n, 'on-device', pipeline, pipeline.update_steps)
  row['envs_per_member'] = args.envs_per_member
  row['devices'] = len(devices)
  pipeline.close()
  return row


def one(args, n: int, mode: str) -> dict:
  row = (run_actors if mode == 'actors' else run_on_device)(args, n)
  own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
  row['peak_rss_bytes'] = own + (children if mode == 'actors' else 0)
  row['env'] = args.env if mode == 'actors' else args.jax_env
  return row


def child_env(args, mode: str) -> dict:
  """A row's process environment: ``--cpu-devices`` host devices for an
  on-device row on the CPU backend (read when its XLA starts)."""
  env = dict(os.environ)
  if mode == 'on-device' and args.cpu_devices > 1:
    env['XLA_FLAGS'] = (env.get('XLA_FLAGS', '') + ' --xla_force_host_'
                        f'platform_device_count={args.cpu_devices}').strip()
  return env


def table(rows: list[dict]) -> str:
  lines = ['| N | path | env | devices | env steps/s | update steps/s '
           '| learner wait | peak memory |',
           '|---:|---|---|---:|---:|---:|---:|---:|']
  for r in rows:
    if 'error' in r:
      lines.append(f'| {r["members"]} | {r["mode"]} | {r.get("env", "")} | '
                   f'| {r["error"]} | | | |')
      continue
    lines.append(
        f'| {r["members"]} | {r["mode"]} | {r["env"]} | '
        f'{r.get("devices", 1)} | '
        f'{r["env_steps_per_s"]:,.0f} | {r["update_steps_per_s"]:,.0f} | '
        f'{r["wait_fraction"]:.1%} | '
        f'{r["peak_rss_bytes"] / 2**30:.2f} GiB |')
  return '\n'.join(lines)


def main(argv=None) -> None:
  args = parse_args(argv)
  if answered_one_row(args, one):
    return
  backend = jax.default_backend()
  out = args.out or os.path.join('benchmarks', 'results', backend,
                                 'data_paths.json')
  rows = []
  for n in args.members:
    for mode in args.modes:
      rows.append({'members': n, 'mode': mode, **row_in_process(
          'benchmarks.data_paths', [str(n), mode],
          argv if argv is not None else sys.argv[1:],
          env=child_env(args, mode))})
      print(table(rows[-1:]).splitlines()[-1], flush=True)
  record = {'command': ' '.join(['python', '-m', 'benchmarks.data_paths',
                                 *sys.argv[1:]]),
            'machine': {'platform': platform.platform(),
                        'processor': platform.processor() or 'unknown',
                        'cpus': os.cpu_count(),
                        'device': jax.devices()[0].device_kind,
                        'jax': jax.__version__},
            'date': time.strftime('%Y-%m-%d'), 'commit': git_commit(),
            'settings': {k: v for k, v in vars(args).items()
                         if k not in ('out', 'one')},
            'rows': rows}
  write_record(out, record, (
      f'Data paths: TD3 {tuple(args.hidden)}, {args.steps_per_call} '
      f'update steps x batch {args.batch_size} per call, ratio 1; '
      f'{record["machine"]["device"]} ({backend}), '
      f'{record["machine"]["cpus"]} CPUs; {record["date"]}.\n'
      f'Command: `{record["command"]}`\n\n{table(rows)}\n'))
  print(f'rows in {out}')


if __name__ == '__main__':
  main()
