"""Time of the actors' per-step policy call: one output buffer against an
array per output.

An actor calls its members' policy once per env step
(``fastpbrl.actors.actor.make_policy_fns``), so that call's fixed cost
bounds how fast the actors step. This times the same vmapped functions
(``policy_fns``) compiled two ways, in a process set up as an actor
(``configure_actor_process``: one XLA thread, synchronous dispatch, the
program's steps in order; a flag set in ``XLA_FLAGS`` beforehand wins, so
``XLA_FLAGS=--xla_cpu_enable_concurrency_optimized_scheduler=true`` times
the calls under XLA's default scheduler):

* ``one buffer``: what the actors run, ``fastpbrl.actors.packed.PackedCall``
  (every output packed into one uint32 array, unpacked with numpy);
* ``an array per output``: ``jax.jit`` of the same function, each output
  copied to numpy (the actors' call before ``PackedCall``).

Rows: PPO's on-policy call (actions and log-probabilities), TD3's (actions
only), and each with the evaluation envs' actions beside
(``policy_and_eval``), for ``M`` members of HalfCheetah-v5. Wall
microseconds per call (the actor waits for each), the median of interleaved
blocks of the two routes. Host-side benchmark code.

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

from benchmarks.provenance import cpu_machine, git_commit, write_record
from fastpbrl.actors.actor import (configure_actor_process, key_data_of,
                                   policy_fns)
from fastpbrl.actors.packed import PackedCall
from fastpbrl.agents.registry import make_agent
from fastpbrl.pipeline import _make_gym_env, _probe_env_spec

RESULT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      'results', 'cpu', 'policy_call.json')
IMPL = 'threefry2x32'  # the actors' default (PipelineConfig.prng_impl)
EVAL_ENVS = 5  # evaluation envs per member (the default --eval-episodes)


def _population(agent_ref: str, env_id: str, m: int):
  """The agent and ``m`` members' stacked policy params and hparams."""
  spec = _probe_env_spec(functools.partial(_make_gym_env, env_id))
  agent = make_agent(agent_ref, spec)
  hp = jax.device_get(agent.default_hparams())
  states = [agent.init(jax.random.key(i), hp) for i in range(m)]
  stack = lambda xs: jax.tree.map(lambda *a: np.stack(a), *xs)
  params = stack([jax.device_get(agent.policy_params(s)) for s in states])
  return spec, agent, jax.device_put(params), jax.device_put(stack([hp] * m))


def _call_args(spec, params, hparams, m: int, with_eval: bool) -> tuple:
  """The arguments an actor passes, for ``m`` members."""
  rng = np.random.default_rng(0)
  obs = rng.standard_normal((m, *spec.observations.shape)).astype(np.float32)
  keys = jax.device_put(np.stack([key_data_of(j, IMPL) for j in range(m)]))
  steps = np.arange(m, dtype=np.uint32)
  if not with_eval:
    return params, hparams, obs, keys, steps
  eval_obs = rng.standard_normal(
      (m, EVAL_ENVS, *spec.observations.shape)).astype(np.float32)
  return params, params, hparams, obs, eval_obs, keys, keys, steps


def _per_output(fn):
  """The call before ``PackedCall``: jit, then each output to numpy."""
  jitted = jax.jit(fn)
  return lambda *args: jax.tree.map(np.asarray, jitted(*args))


def _check_same(a, b) -> None:
  """The two routes act alike (to float32 rounding: XLA may fuse the two
  programs differently)."""
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4)


def _median_us(calls: dict, args: tuple, block_s: float, blocks: int) -> dict:
  """Median wall µs per call of each of ``calls``, over ``blocks``
  interleaved blocks of at least ``block_s`` seconds each."""
  times = {name: [] for name in calls}
  for _ in range(blocks):
    for name, call in calls.items():
      n, start = 0, time.perf_counter()
      while (used := time.perf_counter() - start) < block_s:
        for _ in range(20):
          call(*args)
        n += 20
      times[name].append(used / n * 1e6)
  return {name: float(np.median(t)) for name, t in times.items()}


def one_row(agent_ref: str, behave: bool, with_eval: bool, m: int,
            env_id: str, block_s: float, blocks: int) -> dict:
  spec, agent, params, hparams = _population(agent_ref, env_id, m)
  fn = policy_fns(agent, IMPL, behave)[1 if with_eval else 0]
  args = _call_args(spec, params, hparams, m, with_eval)
  calls = {'one buffer': PackedCall(fn), 'an array per output':
           _per_output(fn)}
  _check_same(calls['one buffer'](*args), calls['an array per output'](*args))
  us = _median_us(calls, args, block_s, blocks)
  return {'agent': agent_ref, 'call': ('policy_and_eval' if with_eval
                                       else 'policy'),
          'outputs': len(jax.tree.leaves(jax.eval_shape(fn, *args))),
          'members': m, 'us_one_buffer': us['one buffer'],
          'us_array_per_output': us['an array per output']}


def markdown(record: dict) -> str:
  lines = ['# The actors\' policy call: one output buffer against an array '
           'per output', '',
           f'`{record["command"]}`; {record["machine"]["cpu_model"]} '
           f'({record["machine"]["cpus"]} CPUs), jax '
           f'{record["machine"]["jax"]}, {record["date"][:10]}, commit '
           f'{record["commit"][:7]}; XLA_FLAGS `{record["xla_flags"]}`. '
           f'Wall µs per call, {record["env"]}, median of interleaved '
           'blocks.', '',
           '| agent | call | outputs | members | one buffer (µs) | '
           'an array per output (µs) | ratio |',
           '| --- | --- | ---: | ---: | ---: | ---: | ---: |']
  for r in record['rows']:
    lines.append(f'| {r["agent"]} | `{r["call"]}` | {r["outputs"]} | '
                 f'{r["members"]} | {r["us_one_buffer"]:.1f} | '
                 f'{r["us_array_per_output"]:.1f} | '
                 f'{r["us_array_per_output"] / r["us_one_buffer"]:.2f}x |')
  return '\n'.join(lines) + '\n'


def main(argv=None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--members', type=int, nargs='+', default=[2, 8])
  parser.add_argument('--block-seconds', type=float, default=0.5)
  parser.add_argument('--blocks', type=int, default=7)
  parser.add_argument('--out', default=RESULT)
  parser.add_argument('--smoke', action='store_true',
                      help='tiny settings (checks the code runs)')
  args = parser.parse_args(argv)
  if args.smoke:
    args.members, args.block_seconds, args.blocks = [2], 0.01, 1
  rows = [one_row(agent, behave, with_eval, m, args.env, args.block_seconds,
                  args.blocks)
          for agent, behave in (('ppo', True), ('td3', False))
          for with_eval in (False, True) for m in args.members]
  record = {
      'command': ' '.join(['python', '-m', 'benchmarks.policy_call',
                           *(sys.argv[1:] if argv is None else argv)]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'commit': git_commit(), 'machine': cpu_machine(), 'smoke': args.smoke,
      'xla_flags': os.environ.get('XLA_FLAGS', ''),
      'env': args.env, 'rows': rows}
  write_record(args.out, record, markdown(record))
  print(markdown(record))
  return record


if __name__ == '__main__':
  configure_actor_process()  # before any computation: as an actor runs
  main()
