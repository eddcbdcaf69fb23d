"""Actor throughput: env steps per second per actor process (one core).

For each env and each number of members one actor process hosts, one run
measures, back to back on the same machine,

* **serial**: the actor stepping one ``gymnasium.make`` env per member in
  turn (``--no-vector-envs``, and every env without a vectorized batch);
* **vectorized**: the actor stepping its envs as one numpy batch
  (``fastpbrl.actors.vector_envs``; the default where the env has one);

(a batch of one env is stepped serially in both), both acting with the
members' TD3 policies (one vectorized, jitted CPU
call per step for all hosted members, with exploration noise) and sending
their chunks through the real transport (shared-memory channels, inserted
into a per-member replay by the reader threads). A plain gymnasium loop
(one env, ``action_space.sample()``) is the reference, measured before and
after the actor rows. Each rate is the mean of ``--repeats`` runs, the
two modes alternating so that the machine's drift reaches both. Two rates
per run: env steps per second of wall time, and per second of the actor
process's CPU time (user + system, from ``/proc``), which is its rate per
core (an actor runs JAX on one thread) and does not count time the
process waited for a core: the second measures the code, the first also
the machine.

Usage::

  python -m benchmarks.actor_throughput                  # the CPU sweep
  python -m benchmarks.actor_throughput --envs HalfCheetah-v5 --members 8
  # with the learning benchmark's evaluations (5 episodes every 2,500
  # steps, played by the actor beside training: one batch of evaluation
  # envs, serial or vectorized as the training envs)
  python -m benchmarks.actor_throughput --envs HalfCheetah-v5 \
      --members 4 8 16 --eval-every 2500 --eval-episodes 5 \
      --out benchmarks/results/cpu/actor_throughput_eval.json

With evaluations the rate counts training env steps only (what reaches the
replay), as a run's budget does.

Where a step's time goes: for each row, a fresh process set up as an
actor (``configure_actor_process``) also times the two parts that both
modes share, each alone, in CPU microseconds per step of all the row's
members: the physics (MuJoCo's ``mj_step`` with the env's frame skip on
each env, as both modes call it; none for an env without MuJoCo physics)
and the policy (the actor's jitted call for all members, noise included,
and the copy of its actions to numpy). Everything else in a step is what
a vectorized batch can shrink, so ``serial / (physics + policy)`` bounds
the ratio vectorized/serial per CPU-second: the ``bound`` column. The
same process times the vectorized actor's own work alone (its loop with
``mj_step`` doing nothing and constant actions for the policy call); the
vectorized rest beyond it is what the two shared parts cost more when they
run in turn with everything else than alone.

A table goes to stdout, every row with the command, machine, date and
commit to ``--out`` (default ``benchmarks/results/cpu/
actor_throughput.json``) and a table to the same name with ``.md``.
Host-side code only: processes, timers and prints.
"""

from __future__ import annotations

import argparse
import functools
import logging
import multiprocessing
import os
import sys
import time
from unittest import mock

import gymnasium as gym
import jax
import mujoco
import numpy as np

from benchmarks.pages import step_split_table
from benchmarks.provenance import cpu_machine, git_commit, write_record
from fastpbrl import agents
from fastpbrl.actors import Actor, ActorPool, ParamStore, chunk_layout
from fastpbrl.actors import vector_envs
from fastpbrl.actors.actor import (configure_actor_process, key_data_of,
                                   make_policy_fns)
from fastpbrl.actors.vector_envs import batch_kind
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import PerMemberReplay, transition_fields

MODES = ('serial', 'vectorized')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--envs', nargs='+',
                      default=['HalfCheetah-v5', 'Pendulum-v1'])
  parser.add_argument('--members', type=int, nargs='+',
                      default=[1, 2, 4, 8, 16],
                      help='members hosted by the one actor process')
  parser.add_argument('--seconds', type=float, default=10.0,
                      help='measured time per row, once warm')
  parser.add_argument('--hidden', type=int, nargs='+', default=[256, 256])
  parser.add_argument('--repeats', type=int, default=2,
                      help='runs of each mode per row, alternating')
  parser.add_argument('--chunk-steps', type=int, default=32)
  parser.add_argument('--eval-every', type=int, default=0,
                      help='training env steps per member between '
                      'evaluations (0: none)')
  parser.add_argument('--eval-episodes', type=int, default=5,
                      help='episodes per evaluation, played at once')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', default=os.path.join(
      'benchmarks', 'results', 'cpu', 'actor_throughput.json'))
  return parser.parse_args(argv)


def plain_steps_per_s(env_id: str, seconds: float, seed: int) -> float:
  """Plain gymnasium stepping with random actions in one loop."""
  env = gym.make(env_id)
  env.reset(seed=seed)
  env.action_space.seed(seed)
  steps = 0
  start = time.perf_counter()
  end = start + seconds
  while True:
    for _ in range(100):
      _, _, terminated, truncated, _ = env.step(env.action_space.sample())
      if terminated or truncated:
        env.reset()
    steps += 100
    now = time.perf_counter()
    if now >= end:
      break
  env.close()
  return steps / (now - start)


def cpu_seconds(pid: int) -> float:
  """User + system CPU time of process ``pid`` so far."""
  with open(f'/proc/{pid}/stat') as f:
    fields = f.read().rsplit(')', 1)[1].split()
  # Fields 14 and 15 of proc(5) (utime, stime), after the name's ')'.
  return (int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK')


def actor_steps_per_s(args, env_id: str, n: int,
                      vectorized: bool) -> tuple[float, float]:
  """Env steps per second of wall time and per second of CPU time of
  one actor process hosting ``n`` members that act with their TD3
  policies."""
  spec, config, _, tree = _td3_population(args.hidden, env_id, n, args.seed)
  replay = PerMemberReplay(transition_fields(spec), n, capacity=200_000)

  def sink(actor_id, members, chunk):
    del actor_id
    replay.insert(members, chunk, int(chunk['meta'][0]))

  store = ParamStore.create(tree)
  try:
    store.write(tree)
    pool = ActorPool(
        env_fn=functools.partial(gym.make, env_id),
        agent_fn=functools.partial(agents.make_agent, 'td3', config=config),
        transition_fields=transition_fields(spec), num_members=n, store=store,
        sink=sink, seed=args.seed, num_processes=1,
        chunk_steps=args.chunk_steps, warmup_steps=0,
        eval_interval=args.eval_every, eval_episodes=args.eval_episodes,
        vectorized_envs=vectorized)
    with pool:
      pool.start()
      # Start-up (spawn, imports, first compile) is not measured.
      deadline = time.monotonic() + 300
      while (replay.inserted() < 4 * args.chunk_steps).any():
        pool.check()
        if time.monotonic() > deadline:
          raise TimeoutError('the actor did not start within 300 s:\n'
                             + pool.describe_status())
        time.sleep(0.05)
      pid = pool.pids()[0]
      start_steps, start = replay.inserted().sum(), time.perf_counter()
      start_cpu = cpu_seconds(pid)
      time.sleep(args.seconds)
      pool.check()
      steps, end = replay.inserted().sum(), time.perf_counter()
      cpu = cpu_seconds(pid) - start_cpu
  finally:
    store.close()
  steps -= start_steps
  return float(steps / (end - start)), float(steps / cpu)


def _cpu_us_per_call(call, seconds: float) -> float:
  """CPU microseconds per ``call(i)`` (``i``: the call's number), over at
  least ``seconds`` of CPU time once warm."""
  for i in range(20):
    call(i)
  calls, start = 20, time.process_time()
  while (used := time.process_time() - start) < seconds:
    for i in range(calls, calls + 50):
      call(i)
    calls += 50
  return used / (calls - 20) * 1e6


def physics_us(env_id: str, n: int, seconds: float, seed: int):
  """CPU µs of MuJoCo's physics alone for one step of ``n`` envs (random
  controls, an env reset every 1,000 steps); None for an env without
  MuJoCo physics."""
  envs = [gym.make(env_id).unwrapped for _ in range(n)]
  if not hasattr(envs[0], 'model'):
    return None
  rng = np.random.default_rng(seed)
  for j, env in enumerate(envs):
    env.reset(seed=seed + j)
  controls = rng.uniform(-1, 1, (1000, n, envs[0].data.ctrl.size))

  def call(i):
    for j, env in enumerate(envs):
      env.data.ctrl[:] = controls[i % 1000, j]
      mujoco.mj_step(env.model, env.data, nstep=env.frame_skip)
    if i % 1000 == 999:
      for env in envs:
        env.reset()

  return _cpu_us_per_call(call, seconds)


def _td3_population(hidden: tuple, env_id: str, n: int, seed: int):
  """The env spec, the TD3 config and agent, and the host tree
  ``(policy_params, hparams)`` of ``n`` fresh TD3 members."""
  spec = make_env_spec(gym.make(env_id))
  config = TD3Config(hidden_sizes=tuple(hidden))
  agent = agents.make_agent('td3', spec, config)
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(seed), hparams)
  tree = jax.device_get((learner.policy_params(state), hparams))
  return spec, config, agent, tree


def policy_us(hidden: tuple, env_id: str, n: int, seconds: float,
              seed: int) -> float:
  """CPU µs of the actor's policy call for ``n`` members (TD3, noise
  included, its actions copied to numpy)."""
  spec, _, agent, tree = _td3_population(hidden, env_id, n, seed)
  params, hparams = jax.device_put(tree)
  impl = 'threefry2x32'  # the actors' default (PipelineConfig.prng_impl)
  policy, _ = make_policy_fns(agent, impl)
  keys = jax.device_put(np.stack([key_data_of(seed + j, impl)
                                  for j in range(n)]))
  obs = np.zeros((n, *spec.observations.shape), spec.observations.dtype)
  steps = np.arange(n, dtype=np.uint32)
  return _cpu_us_per_call(
      lambda i: np.array(policy(params, hparams, obs, keys, steps)), seconds)


class _NoPhysics:
  """Stands in for the ``mujoco`` module of ``vector_envs``: its
  ``mj_step`` does nothing."""

  @staticmethod
  def mj_step(model, data, nstep=1):
    del model, data, nstep


def bookkeeping_us(hidden: tuple, env_id: str, n: int, seconds: float,
                   seed: int, chunk_steps: int = 32) -> float:
  """CPU µs per step of ``n`` members of the vectorized actor without the
  two shared parts: its real loop (``Actor.fill`` into a chunk) with
  ``mj_step`` doing nothing and the policy call replaced by constant
  actions. What is left is the actor's own per-step work and the batch's
  numpy. Pendulum's physics is that numpy, so it stays in."""
  spec, config, _, tree = _td3_population(hidden, env_id, n, seed)
  layout = chunk_layout(transition_fields(spec), n, chunk_steps)
  chunk = layout.views(bytearray(layout.nbytes))
  constant = jax.device_put(np.zeros((n, *spec.actions.shape),
                                     spec.actions.dtype))
  with ParamStore.create(tree) as store, mock.patch.object(
      vector_envs, 'mujoco', _NoPhysics):
    store.write(tree)
    actor = Actor(members=range(n), env_fn=functools.partial(gym.make, env_id),
                  agent_fn=functools.partial(agents.make_agent, 'td3',
                                             config=config),
                  store=store, seed=seed, warmup_steps=0)
    # A probe, not the product: the actor's policy call, taken out.
    actor._policy = lambda *args: constant  # noqa: SLF001
    try:
      return _cpu_us_per_call(lambda i: actor.fill(chunk), seconds) / (
          chunk_steps)
    finally:
      actor.close()


def step_costs(hidden: tuple, env_id: str, n: int, seconds: float,
               seed: int) -> dict:
  """The physics' and the policy's CPU µs per step of ``n`` members, each
  timed alone in this process (run it in a fresh one: it is set up as an
  actor process is)."""
  configure_actor_process()
  return {'physics_us': physics_us(env_id, n, seconds, seed),
          'policy_us': policy_us(hidden, env_id, n, seconds, seed),
          'bookkeeping_us': bookkeeping_us(hidden, env_id, n, seconds, seed)}


def spawned_step_costs(args, env_id: str, n: int) -> dict:
  """``step_costs`` in a fresh spawned process."""
  with multiprocessing.get_context('spawn').Pool(1) as pool:
    return pool.apply(step_costs, (tuple(args.hidden), env_id, n,
                                   args.seconds / 2, args.seed))


def evaluations(settings) -> str:
  """The evaluations the actor played beside training, in words."""
  every = getattr(settings, 'eval_every', 0)
  if not every:
    return 'no evaluations'
  return (f'evaluations of {settings.eval_episodes} episodes every '
          f'{every:,} training steps')


def table(record: dict) -> str:
  lines = ['| env | members per actor | batch | per CPU-second: serial | '
           'vectorized | ratio | per wall second: serial | vectorized | '
           'ratio |', '|---|---:|---|---:|---:|---:|---:|---:|---:|']
  # Each rate is the mean of --repeats runs, serial and vectorized
  # alternating; the runs are in the JSON.
  for r in record['rows']:
    cpu = r['vectorized_per_cpu_s'] / r['serial_per_cpu_s']
    lines.append(
        f'| {r["env"]} | {r["members"]} | {r["batch"]} | '
        f'{r["serial_per_cpu_s"]:,.0f} | {r["vectorized_per_cpu_s"]:,.0f} | '
        f'{cpu:.2f}x | {r["serial"]:,.0f} | {r["vectorized"]:,.0f} | '
        f'{r["vectorized"] / r["serial"]:.2f}x |')
  return '\n'.join(lines)


def step_split(row: dict) -> dict:
  """A row's CPU µs per step of all its members: each mode's (from its
  rate per CPU-second) and the rest beside the shared parts, and the
  bound ``serial / (physics + policy)`` on the ratio per CPU-second.
  Where the row also timed the vectorized actor's own work alone
  (``bookkeeping_us``), what its rest holds beyond that: the extra cost
  of the shared parts run in turn with everything else rather than alone
  (``extra_in_turn_us``)."""
  serial = row['members'] / row['serial_per_cpu_s'] * 1e6
  vectorized = row['members'] / row['vectorized_per_cpu_s'] * 1e6
  shared = (row['physics_us'] or 0.0) + row['policy_us']
  split = {'serial_us': serial, 'vectorized_us': vectorized,
           'rest_serial_us': serial - shared,
           'rest_vectorized_us': vectorized - shared,
           'bound': serial / shared}
  if row.get('bookkeeping_us') is not None:
    split['extra_in_turn_us'] = (split['rest_vectorized_us']
                                 - row['bookkeeping_us'])
  return split


def main(argv=None) -> None:
  args = parse_args(argv)
  logging.basicConfig(level=logging.WARNING)
  cores = len(os.sched_getaffinity(0))
  print(f'actor throughput: TD3 {tuple(args.hidden)}, one actor process, '
        f'{args.seconds:g} s per row, {cores} cores available, '
        f'{evaluations(args)}', flush=True)
  plain, rows = {}, []
  for env_id in args.envs:
    before = plain_steps_per_s(env_id, args.seconds / 2, args.seed)
    for n in args.members:
      kind = batch_kind(gym.make(env_id), n).__name__
      runs = {mode: [] for mode in MODES}
      for _ in range(args.repeats):  # alternating, so drift hits both
        for mode in MODES:
          runs[mode].append(actor_steps_per_s(args, env_id, n,
                                              mode == 'vectorized'))
      row = {'env': env_id, 'members': n, 'batch': kind, 'runs': runs,
             **spawned_step_costs(args, env_id, n)}
      for mode, r in runs.items():
        row[mode] = float(np.mean([wall for wall, _ in r]))
        row[f'{mode}_per_cpu_s'] = float(np.mean([cpu for _, cpu in r]))
      row.update(step_split(row))
      rows.append(row)
      print(table({'rows': [row]}).splitlines()[-1], flush=True)
    after = plain_steps_per_s(env_id, args.seconds / 2, args.seed)
    plain[env_id] = (before + after) / 2
  record = {'command': ' '.join(['python', '-m', 'benchmarks.actor_throughput',
                                 *(sys.argv[1:] if argv is None else argv)]),
            'machine': cpu_machine(),
            'date': time.strftime('%Y-%m-%d'), 'commit': git_commit(),
            'settings': {k: v for k, v in vars(args).items() if k != 'out'},
            'plain': plain, 'rows': rows}
  write_record(args.out, record, (
      f'Actor throughput: env steps/s of one actor process, TD3 '
      f'{tuple(args.hidden)} policy + noise, {evaluations(args)}; '
      f'{cores} cores; '
      f'{record["date"]}.\nCommand: `{record["command"]}`\n\n'
      f'{table(record)}\n\nA plain gymnasium loop (one env, random '
      f'actions), env steps per wall second: ' + ', '.join(
          f'{env} {rate:,.0f}' for env, rate in plain.items()) + '.\n'
      f'\n{step_split_table(record)}\n'))
  print(table(record))
  print(step_split_table(record))


if __name__ == '__main__':
  main()
