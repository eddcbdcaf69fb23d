"""Time of the actors' per-step policy call under XLA:CPU's two schedulers.

An actor calls its members' policy once per env step
(``fastpbrl.actors.actor.make_policy_fns``), so that call's fixed cost
bounds how fast the actors step. This times the call as an actor runs it
(jitted, outputs copied to numpy) in a fresh process set up as an actor
(``configure_actor_process``: one Eigen thread, synchronous dispatch),
under each scheduler:

* ``in order``: ``--xla_cpu_enable_concurrency_optimized_scheduler=false``,
  what the actors run;
* ``concurrent``: XLA's default, which orders a program's independent
  steps to run at once on other threads (the actors before they set the
  flag).

Rows: PPO's on-policy call (actions and log-probabilities), TD3's (actions
with noise), each alone and with the evaluation envs' actions beside
(``policy_and_eval``), for ``M`` members of HalfCheetah-v5. Wall
microseconds per call (the actor waits for each): the median over
``--repeats`` processes per scheduler, the two alternating. Host-side
benchmark code.

::

  python -m benchmarks.policy_call              # the measurement
  python -m benchmarks.policy_call --smoke      # seconds: checks it runs
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time

import jax
import numpy as np

from benchmarks.provenance import (answered_one_row, cpu_machine, git_commit,
                                   row_in_process, write_record)
from fastpbrl.actors.actor import (configure_actor_process, key_data_of,
                                   make_policy_fns)
from fastpbrl.agents.registry import make_agent
from fastpbrl.datapath.actor_family import make_gym_env, probe_env_spec

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'results', 'cpu', 'policy_call.json')
IMPL = 'threefry2x32'  # the actors' default (PipelineConfig.prng_impl)
EVAL_ENVS = 5  # evaluation envs per member (the default --eval-episodes)
SCHEDULER = '--xla_cpu_enable_concurrency_optimized_scheduler'
SCHEDULERS = {'in order': 'false', 'concurrent': 'true'}
CALLS = (('ppo', 'policy'), ('ppo', 'policy_and_eval'), ('td3', 'policy'),
         ('td3', 'policy_and_eval'))


def _call_and_args(agent_ref: str, call: str, m: int, env_id: str):
  """The actor's jitted call ``call`` of ``agent_ref`` and the arguments an
  actor passes it, for ``m`` members."""
  spec = probe_env_spec(functools.partial(make_gym_env, env_id))
  agent = make_agent(agent_ref, spec)
  hp = jax.device_get(agent.default_hparams())
  states = [agent.init(jax.random.key(i), hp) for i in range(m)]
  stack = lambda xs: jax.tree.map(lambda *a: np.stack(a), *xs)
  params = jax.device_put(
      stack([jax.device_get(agent.policy_params(s)) for s in states]))
  hparams = jax.device_put(stack([hp] * m))
  policy, with_eval = make_policy_fns(agent, IMPL,
                                      behave=agent.learns_from == 'rollout')
  rng = np.random.default_rng(0)
  obs = rng.standard_normal((m, *spec.observations.shape)).astype(np.float32)
  keys = jax.device_put(np.stack([key_data_of(j, IMPL) for j in range(m)]))
  steps = np.arange(m, dtype=np.uint32)
  if call == 'policy':
    return policy, (params, hparams, obs, keys, steps)
  eval_obs = rng.standard_normal(
      (m, EVAL_ENVS, *spec.observations.shape)).astype(np.float32)
  return with_eval, (params, params, hparams, obs, eval_obs, keys, keys,
                     steps)


def time_call(args, agent_ref: str, call: str, m: int) -> dict:
  """Wall µs per call, in this process (set up as an actor first)."""
  configure_actor_process()
  fn, call_args = _call_and_args(agent_ref, call, m, args.env)
  as_numpy = lambda: jax.tree.map(np.asarray, fn(*call_args))
  for _ in range(50):  # compiled and warm
    as_numpy()
  n, start = 0, time.perf_counter()
  while (used := time.perf_counter() - start) < args.seconds:
    for _ in range(20):
      as_numpy()
    n += 20
  return {'us': used / n * 1e6, 'xla_flags': os.environ['XLA_FLAGS']}


def _one(args, m: int, what: str) -> dict:
  """``--one M AGENT:CALL`` (a row's process)."""
  agent_ref, call = what.split(':')
  return time_call(args, agent_ref, call, m)


def one_row(args, agent_ref: str, call: str, m: int) -> dict:
  """Both schedulers for one call, ``--repeats`` processes each."""
  times = {name: [] for name in SCHEDULERS}
  flags = {}
  for _ in range(args.repeats):
    for name, value in SCHEDULERS.items():
      env = {**os.environ, 'XLA_FLAGS': f'{SCHEDULER}={value}'}
      got = row_in_process('benchmarks.policy_call', [str(m),
                           f'{agent_ref}:{call}'], _argv(args), env=env)
      if 'error' in got:
        raise SystemExit(f'{agent_ref} {call} {m}: {got["error"]}')
      times[name].append(got['us'])
      flags[name] = got['xla_flags']
  return {'agent': agent_ref, 'call': call, 'members': m, 'xla_flags': flags,
          **{f'us_{name.replace(" ", "_")}': float(np.median(t))
             for name, t in times.items()}}


def _argv(args) -> list[str]:
  return ['--env', args.env, '--seconds', str(args.seconds)]


def markdown(record: dict) -> str:
  lines = ["# The actors' policy call under XLA:CPU's two schedulers", '',
           f'`{record["command"]}`; {record["machine"]["cpu_model"]} '
           f'({record["machine"]["cpus"]} CPUs), jax '
           f'{record["machine"]["jax"]}, {record["date"][:10]}, commit '
           f'{record["commit"][:7]}. Wall µs per call, {record["env"]}, '
           f'median of {record["repeats"]} processes per scheduler.', '',
           '| agent | call | members | in order (µs) | concurrent (µs) | '
           'ratio |', '| --- | --- | ---: | ---: | ---: | ---: |']
  for r in record['rows']:
    lines.append(f'| {r["agent"]} | `{r["call"]}` | {r["members"]} | '
                 f'{r["us_in_order"]:.1f} | {r["us_concurrent"]:.1f} | '
                 f'{r["us_concurrent"] / r["us_in_order"]:.2f}x |')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--members', type=int, nargs='+', default=[2, 8])
  parser.add_argument('--seconds', type=float, default=1.0,
                      help='timed seconds of calls per process')
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--out', default=RESULT)
  parser.add_argument('--smoke', action='store_true',
                      help="tiny settings, PPO's policy call alone (checks "
                      'the code runs)')
  parser.add_argument('--one', nargs=2, metavar=('M', 'AGENT:CALL'),
                      help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if answered_one_row(args, _one):
    return {}
  calls = CALLS
  if args.smoke:  # one call, two processes
    calls, args.members, args.seconds, args.repeats = CALLS[:1], [2], 0.01, 1
  rows = [one_row(args, agent_ref, call, m) for agent_ref, call in calls
          for m in args.members]
  record = {
      'command': ' '.join(['python', '-m', 'benchmarks.policy_call',
                           *(sys.argv[1:] if argv is None else argv)]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'commit': git_commit(), 'machine': cpu_machine(), 'smoke': args.smoke,
      'env': args.env, 'seconds': args.seconds, 'repeats': args.repeats,
      'rows': rows}
  write_record(args.out, record, markdown(record))
  print(markdown(record))
  return record


if __name__ == '__main__':
  main()
