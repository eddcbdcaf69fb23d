"""PPO populations on the device against one Stable-Baselines3 PPO agent:
how long ``N`` members take compared with ``N`` sequential SB3 runs.

For each population size ``N`` (``--members``, default 1 4 16 64 256),
``N`` PPO members (``--agent``, default ``ppo``) each take ``--env-steps``
env steps of ``--jax-env`` (default gymnax:CartPole-v1) on the on-device
rollout path (``fastpbrl.datapath.device_rollouts.DeviceRollouts``: envs, rollouts
and updates in one compiled call per ``steps_per_call``), and one SB3 PPO
agent (needs the ``.[torch]`` extra; ``--no-sb3`` leaves it out) takes the
same env steps on gymnasium's ``--gym-env`` (default CartPole-v1) with
the same rollout length, envs, minibatch size, epochs and network widths.
Each row runs in a fresh process. Rows report the whole run's wall time
(start-up, compilation and every call: what a user waits for), the time
after the first call (warm), env steps per second of the population, and
the time ``N`` one-member runs take one after the other (``N x`` the
``N = 1`` row's, and ``N x`` SB3's), so the speed-up of running a
population at once reads off one table.

Usage::

  python -m benchmarks.ppo_speed                          # the full sweep
  python -m benchmarks.ppo_speed --members 1 4 --env-steps 2048  # smoke

A table goes to stdout; every row with the command, machine, date and
commit to ``--out`` (default ``benchmarks/results/ppo/
speed_cartpole.json``) and the table to the same name with ``.md``.
Host-side code: training loops, timers, subprocesses and prints.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import time

import jax
import numpy as np

from benchmarks.provenance import (answered_one_row, cpu_machine,
                                   git_commit, row_in_process, write_record)
from fastpbrl import agents
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.device_rollouts import DeviceRollouts
from fastpbrl.envs import jax_envs
from fastpbrl.learner.population import PopulationLearner, population_hparams

# The agent config's field of the epochs per iteration, as its registered
# config may name it; SB3's is ``n_epochs``.
EPOCH_FIELDS = ('epochs', 'num_epochs', 'n_epochs', 'update_epochs')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', 1)[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--members', type=int, nargs='+',
                      default=[1, 4, 16, 64, 256])
  parser.add_argument('--env-steps', type=int, default=100_000,
                      help='env steps per member (and of the SB3 agent)')
  parser.add_argument('--agent', default='ppo',
                      help='a registered agent that learns from rollouts')
  parser.add_argument('--jax-env', default='gymnax:CartPole-v1')
  parser.add_argument('--gym-env', default='CartPole-v1')
  parser.add_argument('--hidden', type=int, nargs='+', default=None,
                      help='network widths (default: the agent\'s)')
  parser.add_argument('--rollout-length', type=int, default=None,
                      help='T (default: the agent\'s)')
  parser.add_argument('--num-envs', type=int, default=None,
                      help='E (default: the agent\'s)')
  parser.add_argument('--batch-size', type=int, default=None,
                      help='minibatch size (default: the agent\'s)')
  parser.add_argument('--iterations-per-call', type=int, default=1,
                      help='PPO iterations in one compiled learner call')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--no-sb3', action='store_true',
                      help='leave out the Stable-Baselines3 row')
  parser.add_argument('--out', default=os.path.join(
      'benchmarks', 'results', 'ppo', 'speed_cartpole.json'))
  parser.add_argument('--merge', action='store_true',
                      help='add this run\'s rows to the record at --out '
                      '(replacing rows of the same N and path) instead of '
                      'writing a new one; the record lists each addition '
                      'with its command, date and commit')
  parser.add_argument('--report-only', action='store_true',
                      help='rewrite the table of --out from its JSON')
  parser.add_argument('--one', nargs=2, metavar=('N', 'MODE'),
                      help=argparse.SUPPRESS)  # one row, in this process
  return parser.parse_args(argv)


def agent_config(args):
  """The agent's config with the flags' overrides (its defaults where a
  flag is left out); ``steps_per_call`` is ``--iterations-per-call``
  iterations."""
  spec = agents.get(args.agent)
  if spec.learns_from != 'rollout':
    raise SystemExit(f'--agent {args.agent}: learns from replay; this '
                     'benchmark needs an agent that learns from rollouts')
  config = spec.config()
  length = args.rollout_length or config.rollout_length
  envs = args.num_envs or config.num_envs
  # One replace: a config may check or derive fields from the others.
  changes = {'rollout_length': length, 'num_envs': envs,
             'steps_per_call': args.iterations_per_call * length * envs}
  if args.batch_size is not None:
    changes['batch_size'] = args.batch_size
  if args.hidden is not None:
    changes[spec.hidden_sizes_field] = tuple(args.hidden)
  return dataclasses.replace(config, **changes)


def run_fastpbrl(args, n: int) -> dict:
  """``n`` members on the on-device rollout path until each has taken
  ``--env-steps`` env steps (whole calls)."""
  start = time.monotonic()
  env = jax_envs.make(args.jax_env)
  config = agent_config(args)
  agent = agents.make_agent(args.agent, env.env_spec, config)
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(args.seed), hparams)
  path = DeviceRollouts(env, agent, learner, n, PipelineConfig(
      num_steps=learner.num_steps, batch_size=config.batch_size,
      replay_capacity=1, eval_interval=0), seed=args.seed)
  path.publish(learner.policy_params(state), hparams)
  warm_at = None
  while path.env_steps_per_member() < args.env_steps:
    call = path.learn(learner, state, hparams, hparams, shared_critic=False)
    state = call.state
    np.asarray(call.metrics['finite'])  # the call is done
    if warm_at is None:
      warm_at, warm_steps = time.monotonic(), path.env_steps_per_member()
  jax.block_until_ready(state)
  end = time.monotonic()
  steps = path.env_steps_per_member()
  path.close()
  return {'members': n, 'mode': 'fastpbrl', 'env': args.jax_env,
          'env_steps_per_member': steps, 'seconds': end - start,
          'warm_seconds': end - warm_at,
          'env_steps_per_s': n * steps / (end - start),
          'warm_env_steps_per_s': n * (steps - warm_steps) / max(
              end - warm_at, 1e-9),
          'calls': path.calls, 'devices': jax.device_count(),
          'config': {k: (list(v) if isinstance(v, tuple) else v)
                     for k, v in dataclasses.asdict(config).items()}}


def run_sb3(args) -> dict:
  """One SB3 PPO agent for ``--env-steps`` env steps with the agent
  config's rollout length, envs, minibatch, epochs and widths."""
  try:
    import torch  # noqa: F401  (the optional extra: a clear skip below)
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
  except ImportError as e:
    return {'members': 1, 'mode': 'sb3', 'env': args.gym_env,
            'error': f'skipped: Stable-Baselines3 is not installed ({e}); '
                     'pip install -e .[torch]'}
  config = agent_config(args)
  spec = agents.get(args.agent)
  epochs = next((getattr(config, f) for f in EPOCH_FIELDS
                 if hasattr(config, f)), None)
  if epochs is None:
    return {'members': 1, 'mode': 'sb3', 'env': args.gym_env,
            'error': f'skipped: {args.agent}\'s config names no epochs '
                     f'field ({", ".join(EPOCH_FIELDS)})'}
  hidden = list(getattr(config, spec.hidden_sizes_field))
  start = time.monotonic()
  model = PPO('MlpPolicy', make_vec_env(args.gym_env, n_envs=config.num_envs,
                                        seed=args.seed),
              n_steps=config.rollout_length, batch_size=config.batch_size,
              n_epochs=int(epochs), seed=args.seed, device='cpu',
              policy_kwargs={'net_arch': hidden}, verbose=0)
  model.learn(total_timesteps=args.env_steps)
  end = time.monotonic()
  steps = int(model.num_timesteps)
  return {'members': 1, 'mode': 'sb3', 'env': args.gym_env,
          'env_steps_per_member': steps, 'seconds': end - start,
          'env_steps_per_s': steps / (end - start),
          'torch_threads': torch.get_num_threads()}


def one(args, n: int, mode: str) -> dict:
  row = run_fastpbrl(args, n) if mode == 'fastpbrl' else run_sb3(args)
  row['peak_rss_bytes'] = resource.getrusage(
      resource.RUSAGE_SELF).ru_maxrss * 1024
  return row


def table(rows: list[dict]) -> str:
  """Rows with ``N x`` the one-member times beside each population's."""
  single = next((r['seconds'] for r in rows if r['mode'] == 'fastpbrl'
                 and r['members'] == 1 and 'error' not in r), None)
  sb3 = next((r['seconds'] for r in rows if r['mode'] == 'sb3'
              and 'error' not in r), None)
  fmt = lambda x: '' if x is None else f'{x:,.1f}'
  lines = ['| N | path | env | seconds | warm seconds | env steps/s '
           '| N x fastpbrl N=1 (s) | N x SB3 (s) | speed-up over N x SB3 |',
           '|---:|---|---|---:|---:|---:|---:|---:|---:|']
  for r in rows:
    n = r['members']
    cells = [n, r['mode'], r.get('env', '')]
    if 'error' in r:
      cells += [r['error']] + [''] * 5
    elif r['mode'] == 'sb3':  # the reference itself: no ratios
      cells += [fmt(r['seconds']), '', f'{r["env_steps_per_s"]:,.0f}',
                '', '', '']
    else:
      cells += [fmt(r['seconds']), fmt(r.get('warm_seconds')),
                f'{r["env_steps_per_s"]:,.0f}',
                fmt(None if single is None else n * single),
                fmt(None if sb3 is None else n * sb3),
                '' if sb3 is None else f'{n * sb3 / r["seconds"]:,.1f}x']
    lines.append('| ' + ' | '.join(map(str, cells)) + ' |')
  return '\n'.join(lines)


def main(argv=None) -> None:
  args = parse_args(argv)
  if answered_one_row(args, one):
    return
  if args.report_only:
    with open(args.out) as f:
      record = json.load(f)
    write_record(args.out, record, markdown(record))
    return
  argv = argv if argv is not None else sys.argv[1:]
  runs = [(n, 'fastpbrl') for n in args.members] + (
      [] if args.no_sb3 else [(1, 'sb3')])
  rows = []
  for n, mode in runs:
    rows.append({'members': n, 'mode': mode, **row_in_process(
        'benchmarks.ppo_speed', [str(n), mode], argv)})
    print(table(rows).splitlines()[-1], flush=True)
  record = {'command': ' '.join(['python', '-m', 'benchmarks.ppo_speed',
                                 *argv]),
            'machine': {**cpu_machine(),
                        'device': jax.devices()[0].device_kind},
            'date': time.strftime('%Y-%m-%d'), 'commit': git_commit(),
            'settings': {k: v for k, v in vars(args).items()
                         if k not in ('out', 'one', 'merge')},
            'rows': rows}
  if args.merge:
    record = merged(args.out, record)
  write_record(args.out, record, markdown(record))
  print(f'rows in {args.out}')


# Settings that choose rows, not how a row is measured.
RUN_CHOICES = ('members', 'no_sb3', 'report_only')


def merged(path: str, new: dict) -> dict:
  """The record at ``path`` with ``new``'s rows in place of its rows of
  the same ``N`` and path (sorted as a sweep runs them), and ``new``'s
  command, date and commit listed under ``additions``. Refuses (exits
  with the setting named) a ``new`` run whose settings or machine differ
  from the record's: its rows would not compare."""
  with open(path) as f:
    record = json.load(f)
  for key in ('settings', 'machine'):
    differ = sorted(k for k in set(record[key]) | set(new[key])
                    if k not in RUN_CHOICES
                    and record[key].get(k) != new[key].get(k))
    if differ:
      raise SystemExit(f'--merge: the {key} differ from {path}\'s '
                       f'({", ".join(differ)}); run the whole sweep')
  added = {(r['members'], r['mode']) for r in new['rows']}
  rows = [r for r in record['rows']
          if (r['members'], r['mode']) not in added] + new['rows']
  rows.sort(key=lambda r: (r['mode'] != 'fastpbrl', r['members']))
  additions = record.get('additions', []) + [{
      k: new[k] for k in ('command', 'date', 'commit')} | {
          'rows': sorted(added)}]
  return {**record, 'rows': rows, 'additions': additions}


def markdown(record: dict) -> str:
  """The heading and table of a run's ``record``."""
  settings = record['settings']
  added = ''.join(
      f'\nRows {", ".join(f"N={n} ({mode})" for n, mode in a["rows"])}: '
      f'`{a["command"]}`, {a["date"]}, commit {a["commit"][:8]}.'
      for a in record.get('additions', []))
  return (f'PPO populations ({settings["agent"]}, {settings["jax_env"]}) '
          f'against one SB3 PPO ({settings["gym_env"]}), '
          f'{settings["env_steps"]:,} env steps per member; '
          f'{record["machine"]["device"]}, {record["machine"]["cpus"]} '
          f'CPUs; {record["date"]}, commit {record["commit"][:8]}.\n'
          f'Command: `{record["command"]}`{added}\n\n'
          f'{table(record["rows"])}\n')


if __name__ == '__main__':
  main()
