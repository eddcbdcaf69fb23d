"""A 4-member TD3 PBT over several processes (``fastpbrl.devices.distributed``),
run by ``tests/test_distributed.py``.

``python -m fastpbrl.launch --num-processes 2 -- python -m
tests.distributed_worker OUT_DIR``: every process owns a block of members,
builds its members' batches itself (synthetic, derived from the seed, the
call and the member's row), runs ``CALLS`` learner calls per generation and
one PBT exploit per generation on fitness it measures for its own members,
and writes ``OUT_DIR/process_<id>.json``: its rule decisions and its rows
of the final state. ``reference()`` is the same run in one process on one
device, unsharded, for the test to compare with. ``pbt_step`` is the
multi-process PBT recipe the worker runs (the run loop's own is
``fastpbrl.devices.distributed.Processes``).

``python -m tests.distributed_worker OUT_DIR shared`` does the same for the
shared-critic rules: CEM-RL's and DvD's shared-critic updates (one program
over both processes' members: the critic loss's mean over members and
DvD's kernel over every member's actions cross processes), then per
generation CEM-RL's distribution update and next sample on the global
policies and DvD's logged action distance, as ``fastpbrl.rules.cemrl`` and
``fastpbrl.rules.dvd`` compute them; ``shared_reference()`` is the same
in one process.

Both compute in float64 (states, hyperparameters and batches cast with
``numerics.as_float64``), so that the two programs, which sum in different
orders, agree to ``numerics.TRAJECTORY`` (``tests/numerics.py``, rule 2);
``reference()`` must be called inside ``numerics.float64()``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from fastpbrl.agents import td3
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import random_transitions
from fastpbrl.devices import distributed
from fastpbrl.devices import sharding
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)
from fastpbrl.rules import pbt as pbt_lib
from fastpbrl.rules.cemrl import cem as cem_lib
from fastpbrl.rules.dvd import diversity as dvd_lib
from tests import numerics
from tests.agents.helpers import env_spec

N, STEPS, BATCH, CALLS, GENERATIONS, SEED = 4, 2, 4, 2, 2, 7
TINY = td3.TD3Config(hidden_sizes=(8,), batch_size=BATCH, steps_per_call=STEPS)
CONFIG = pbt_lib.PBTConfig(ready_after=STEPS * CALLS, fraction=0.5)
SPACE = ss.SearchSpace({'policy_lr': ss.LogUniform(1e-5, 1e-2),
                        'critic_lr': ss.LogUniform(1e-5, 1e-2)})
# Fitness = this table (which decides the ranking: generation 0 has the
# members of process 0 copy those of process 1, generation 1 the other way)
# + a small function of the member's policy parameters.
TABLE = np.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0]])


def agent():
  return td3.make_agent(env_spec('Pendulum-v1'), TINY)


def hparams_of(a):
  return numerics.as_float64(population_hparams(
      a, N, policy_lr=np.linspace(1e-4, 1e-3, N),
      critic_lr=np.linspace(3e-4, 2e-3, N), discount=np.linspace(0.9, 0.99, N)))


def batch_rows(a, call: int, rows) -> jax.Array:
  """``[len(rows), STEPS, BATCH, ...]``: member ``row``'s batch of a call,
  the same whichever process builds it."""
  parts = [random_transitions(a.env_spec, (1, STEPS, BATCH),
                              seed=[SEED, call, int(r)]) for r in rows]
  return numerics.as_float64(jax.tree.map(lambda *x: np.concatenate(x),
                                          *parts))


def fitness_of(policy_rows, generation: int, rows) -> np.ndarray:
  """Per member: the table's value + 1e-3 * mean |policy parameter|."""
  leaves = [np.abs(np.asarray(x, np.float64)).reshape(len(rows), -1).mean(1)
            for x in jax.tree.leaves(policy_rows)]
  return (TABLE[generation][np.asarray(rows)]
          + 1e-3 * np.mean(leaves, axis=0)).astype(np.float32)


def tree_dict(tree) -> dict:
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path): np.asarray(x).tolist()
          for path, x in flat}


def decision_dict(decision) -> dict:
  return {'fitness': decision['fitness'].tolist(),
          'parent': decision['parent'].tolist(),
          'replaced': decision['replaced'].tolist(),
          'hparams': {k: np.asarray(v).tolist()
                      for k, v in decision['hparams']._asdict().items()}}


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host values that are the same in every process (a rule key, the
  gathered fitness) as replicated global arrays."""
  target = sharding.replicated(mesh)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(
      target, np.asarray(x), np.shape(x)), tree)


def as_replicated(x: Any, mesh: Mesh) -> Any:
  """``x`` as a global array: kept if it already is one, else its host
  value (the same in every process) replicated over ``mesh``."""
  if isinstance(x, jax.Array) and (not x.is_fully_addressable
                                   or jax.process_count() == 1):
    return x
  return replicate(x, mesh)


def pbt_step(exploit, key, state, hparams, local_fitness, ready, mesh: Mesh):
  """One PBT exploit-and-explore across processes; every process calls it.

  The recipe: each process measured the fitness of its own members
  (``local_fitness``, ``[local rows]``); ``allgather_members`` gives every
  process the whole ``[N]`` fitness; every process then calls the same
  jitted rule (``exploit``, a ``pbt.CompiledExploitExplore``) with the same
  key on the global state, so all take the same decision and XLA moves a
  copied member's rows between processes. Besides the rule's own
  collectives, only two host gathers cross processes: the fitness, and
  the decision read back for the host's records (lineage, logs).

  Args:
    exploit: ``pbt.CompiledExploitExplore`` (or any callable with its
      signature).
    key: the rule's key, the same in every process (host or replicated).
    state: the global stacked training state.
    hparams: the global stacked hyperparameters.
    local_fitness: ``[local rows]`` fitness of this process's members.
    ready: ``[N]`` bool, a global array (e.g. ``pbt.ready_mask`` jitted on
      the global step counters) or host values equal in every process.
    mesh: the global population mesh.

  Returns:
    ``(result, decision)``: the ``PBTResult`` of global arrays, and a dict
    of host numpy values equal in every process: ``fitness`` ``[N]``,
    ``parent`` ``[N]``, ``replaced`` ``[N]``, ``hparams`` (the new ones).
  """
  n = jax.tree.leaves(hparams)[0].shape[0]
  fitness = distributed.allgather_members(
      np.asarray(local_fitness, np.float32), mesh, n)
  result = exploit(as_replicated(key, mesh), state, hparams,
                   replicate(fitness, mesh),
                   as_replicated(np.asarray(ready, bool) if not isinstance(
                       ready, jax.Array) else ready, mesh))
  decision = jax.tree.map(sharding.whole_value, dict(
      parent=result.parent, replaced=result.replaced, hparams=result.hparams))
  return result, dict(fitness=fitness, **decision)


def write(out_dir: str, prefix: str, info, out: dict) -> None:
  """``out`` as ``OUT_DIR/<prefix>_<process id>.json`` (written whole)."""
  path = os.path.join(out_dir, f'{prefix}_{info.process_id}.json')
  with open(path + '.tmp', 'w') as f:
    json.dump(out, f)
  os.replace(path + '.tmp', path)
  os.write(1, f'OK process {info.process_id} of {info.num_processes}\n'.encode())


def distributed_run(out_dir: str) -> None:
  jax.config.update('jax_enable_x64', True)
  info = distributed.initialize_from_env()
  mesh = distributed.global_population_mesh()
  rows = distributed.member_rows(mesh, N)
  a = agent()
  learner = PopulationLearner(a, mesh=mesh)
  exploit = pbt_lib.CompiledExploitExplore(CONFIG, SPACE)
  ready_of = jax.jit(lambda steps, last: pbt_lib.ready_mask(steps, last,
                                                            CONFIG))
  mark_ready = jax.jit(lambda ready, steps, last: jax.numpy.where(
      ready, steps, last))
  local = distributed.local_members(N, mesh)
  hparams = distributed.to_global(
      jax.tree.map(lambda x: np.asarray(x)[local], hparams_of(a)), mesh, N)
  state = numerics.as_float64(learner.init(
      replicate(jax.random.PRNGKey(SEED), mesh), hparams))
  last_ready = distributed.to_global(np.zeros(len(rows), np.int32), mesh, N)
  decisions = []
  for generation in range(GENERATIONS):
    for call in range(CALLS):
      batch = distributed.to_global(
          batch_rows(a, generation * CALLS + call, rows), mesh, N)
      state, _ = learner.update(state, hparams, batch)
    fitness = fitness_of(distributed.to_local(state.policy), generation, rows)
    ready = ready_of(state.step, last_ready)
    key = jax.random.fold_in(jax.random.PRNGKey(SEED + 1), generation)
    result, decision = pbt_step(exploit, key, state, hparams, fitness, ready,
                                mesh)
    state, hparams = result.state, result.hparams
    last_ready = mark_ready(ready, state.step, last_ready)
    decisions.append(decision_dict(decision))
  assert learner.compilations == 1, learner.compilations
  assert exploit.compilations == 1, exploit.compilations
  out = {'process_id': info.process_id, 'pid': os.getpid(),
         'num_processes': info.num_processes,
         'local_devices': len(info.local_devices),
         'global_devices': len(info.global_devices),
         'rows': rows.tolist(), 'decisions': decisions,
         'state': tree_dict(distributed.to_local(state)),
         'hparams': tree_dict(distributed.to_local(hparams))}
  write(out_dir, 'process', info, out)


def reference() -> dict:
  """The same run in this process, one device, no mesh: the whole
  population's batches, fitness and rule calls."""
  a = agent()
  rows = np.arange(N)
  learner = PopulationLearner(a)
  exploit = pbt_lib.CompiledExploitExplore(CONFIG, SPACE)
  hparams = hparams_of(a)
  state = numerics.as_float64(learner.init(jax.random.PRNGKey(SEED), hparams))
  last_ready = np.zeros(N, np.int32)
  decisions = []
  for generation in range(GENERATIONS):
    for call in range(CALLS):
      state, _ = learner.update(state, hparams,
                                batch_rows(a, generation * CALLS + call, rows))
    fitness = fitness_of(state.policy, generation, rows)
    ready = pbt_lib.ready_mask(np.asarray(state.step), last_ready, CONFIG)
    key = jax.random.fold_in(jax.random.PRNGKey(SEED + 1), generation)
    result = exploit(key, state, hparams, fitness, ready)
    state, hparams = result.state, result.hparams
    last_ready = np.where(ready, np.asarray(state.step), last_ready)
    decisions.append(decision_dict(
        {'fitness': fitness, 'parent': np.asarray(result.parent),
         'replaced': np.asarray(result.replaced), 'hparams': result.hparams}))
  return {'decisions': decisions, 'state': tree_dict(state),
          'hparams': tree_dict(hparams)}


def shared_critics(a):
  """``{name: (SharedCritic, hparams)}`` as the CEM-RL and DvD rules build
  them (their ``shared_critic_update`` and ``initial_hparams``)."""
  base = hparams_of(a)
  return {
      'cemrl': (cem_lib.with_rl_schedule(a.shared_critic, N // 2),
                cem_lib.rl_hparams(
                    base, train_until=STEPS * CALLS * GENERATIONS - 1)),
      'dvd': (dvd_lib.with_diversity(a.shared_critic,
                                     a.shared_critic.policy_apply, 1.0,
                                     num_states=BATCH),
              dvd_lib.dvd_hparams(base, 0.5)),
  }


PROBE = np.random.default_rng(SEED).normal(size=(5, 3))  # Pendulum states


def shared_generations(a, name, learner, state, hparams, batches, gather):
  """``GENERATIONS`` x (``CALLS`` learner calls, then the rule's host step):
  CEM-RL's distribution update on the fitness table and a new sample
  loaded into the policies; DvD's mean pairwise action distance on fixed
  states. ``batches(call)`` gives a call's batch, ``gather`` a value's
  whole host copy. Returns the final state and what each generation
  decided or measured."""
  distance = jax.jit(lambda s: dvd_lib.mean_pairwise_action_distance(
      jax.vmap(a.shared_critic.policy_apply, in_axes=(0, None))(
          learner.shared.policy_params(s), np.asarray(PROBE))))
  flat, _ = cem_lib.flatten_population(state.policy)
  cem = cem_lib.init(flat[0])
  measured = []
  for generation in range(GENERATIONS):
    for call in range(CALLS):
      state, _ = learner.update(state, hparams,
                                batches(generation * CALLS + call))
    if name == 'dvd':
      measured.append(float(gather(distance(state))))
      continue
    flat, unravel = cem_lib.flatten_population(state.policy)
    cem = cem_lib.update(cem, flat, jax.numpy.asarray(TABLE[generation],
                                                      jax.numpy.float64))
    key = jax.random.fold_in(jax.random.PRNGKey(SEED + 2), generation)
    state = cem_lib.load_policies(state, cem_lib.sample(key, cem, N), unravel)
    measured.append(gather(cem.mean).tolist())
  return state, measured


def shared_run(out_dir: str) -> None:
  jax.config.update('jax_enable_x64', True)
  info = distributed.initialize_from_env()
  mesh = distributed.global_population_mesh()
  rows = distributed.member_rows(mesh, N)
  local = distributed.local_members(N, mesh)
  a = agent()
  out = {'process_id': info.process_id, 'rows': rows.tolist()}
  for name, (shared, all_hparams) in shared_critics(a).items():
    learner = SharedCriticLearner(shared, STEPS, mesh=mesh)
    hparams = distributed.to_global(
        jax.tree.map(lambda x: np.asarray(x)[local], all_hparams), mesh, N)
    state = numerics.as_float64(learner.init(
        replicate(jax.random.PRNGKey(SEED), mesh), hparams))
    state, measured = shared_generations(
        a, name, learner, state, hparams,
        lambda call: distributed.to_global(batch_rows(a, call, rows), mesh,
                                           N),
        sharding.whole_value)
    assert learner.compilations == 1, (name, learner.compilations)
    out[name] = {'measured': measured,
                 'state': tree_dict(distributed.to_local(state))}
  write(out_dir, 'shared', info, out)


def shared_reference() -> dict:
  """``shared_run`` in this process, one device, no mesh."""
  a = agent()
  rows = np.arange(N)
  out = {}
  for name, (shared, hparams) in shared_critics(a).items():
    learner = SharedCriticLearner(shared, STEPS)
    state = numerics.as_float64(learner.init(jax.random.PRNGKey(SEED),
                                             hparams))
    state, measured = shared_generations(
        a, name, learner, state, hparams,
        lambda call: batch_rows(a, call, rows), np.asarray)
    out[name] = {'measured': measured, 'state': tree_dict(state)}
  return out


if __name__ == '__main__':
  if os.environ.get('DISTRIBUTED_WORKER_DUMP_S'):
    # Every thread's Python stack on stderr if the run still goes on then
    # (before the test's deadline): a stall says where it is.
    faulthandler.dump_traceback_later(
        float(os.environ['DISTRIBUTED_WORKER_DUMP_S']), exit=False)
  if sys.argv[2:] == ['shared']:
    shared_run(sys.argv[1])
  else:
    distributed_run(sys.argv[1])
