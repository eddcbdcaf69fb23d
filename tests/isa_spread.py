"""How far float results move between CPU instruction sets: the measure
behind the suite's tolerances (``tests/numerics.py``).

XLA's CPU backend emits code for the widest vector instructions the CPU
has (AVX-512 on AMD Zen 4 and recent Intel cores, AVX2 before them), and the
width decides in which order a dot product's terms are added, so the same
program rounds differently from one machine to the next.
``--xla_cpu_max_isa`` caps the width, so one machine can round as a
narrower one does.

``python -m tests.isa_spread [--isa SSE4_2 AVX AVX2 default] [--out DIR]``
builds the inputs of three route pairs once (initial states,
hyperparameters, batches), then, for each instruction set, runs both routes
of every pair on them in a child process (4 host CPU devices), in float32
and in float64, and compares:

* route spread: the two routes of one pair under one instruction set, what
  a test's tolerance must cover;
* ISA spread: one route under an instruction set against the machine's
  default, how far the rounding moves with the vector width.

Each is reported as the largest absolute difference and as the largest
``|a - b| / (atol + rtol |b|)`` for ``numerics.TRAJECTORY`` (at most 1:
within the tolerance the tests use). ``--out`` writes ``isa_spread.json``
and ``isa_spread.md`` there with the command, machine, date and commit.

The route pairs: ``population_loop`` (TD3, one vectorized 10-step call
against each member stepped alone), ``sharded_population`` (TD3 over 4
devices against one) and ``sharded_dvd`` (DvD's shared critic over 4
devices against one, the all-reduce of the critic loss). ``tests/
test_isa_spread.py`` runs this and requires every float64 spread within the
tolerance.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

import jax
import numpy as np

from benchmarks.provenance import code_version, machine
from fastpbrl.agents import td3
from fastpbrl.devices import sharding
from fastpbrl.learner.population import (PopulationLearner, SharedCriticLearner,
                                         population_hparams)
from fastpbrl.rules.dvd import diversity as dvd
from tests import numerics
from tests.agents.helpers import env_spec, random_batch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISAS = ('SSE4_2', 'AVX', 'AVX2', 'default')
DEVICES = 4
N, STEPS, BATCH, HIDDEN = 8, 10, 16, (16, 16)
DTYPES = ('float32', 'float64')


# --------------------------------------------------------------------------
# The route pairs (run in the child, 4 host devices)
# --------------------------------------------------------------------------


def _agent():
  return td3.make_agent(env_spec('Pendulum-v1'), td3.TD3Config(
      hidden_sizes=HIDDEN, batch_size=BATCH, steps_per_call=STEPS))


def _hparams(agent):
  return population_hparams(
      agent, N, policy_lr=np.linspace(1e-4, 1e-3, N),
      critic_lr=np.linspace(3e-4, 2e-3, N), discount=np.linspace(0.9, 0.99, N),
      policy_update_fraction=[0.5, 1.0] * (N // 2))


def _shared_dvd(agent):
  shared = dvd.with_diversity(agent.shared_critic,
                              agent.shared_critic.policy_apply, 1.0,
                              num_states=8)
  return shared, lambda hp: dvd.dvd_hparams(hp, 0.5)


def _learners(name, agent, mesh):
  """``(plain, other)`` learners of route pair ``name`` and its hparams
  transform."""
  if name == 'sharded_dvd':
    shared, wrap = _shared_dvd(agent)
    return (SharedCriticLearner(shared, STEPS),
            SharedCriticLearner(shared, STEPS, mesh=mesh), wrap)
  return (PopulationLearner(agent, STEPS),
          PopulationLearner(agent, STEPS, mesh=mesh), lambda hp: hp)


PAIRS = ('population_loop', 'sharded_population', 'sharded_dvd')


def inputs(name: str) -> dict:
  """Route pair ``name``'s inputs as numpy leaves: ``state``, ``hparams``,
  ``batch`` (built once, by the parent, so every child starts alike)."""
  agent = _agent()
  plain, _, wrap = _learners(name, agent, None)
  hparams = wrap(_hparams(agent))
  state = plain.init(jax.random.PRNGKey(0), hparams)
  batch = random_batch(agent.env_spec, (N, STEPS, BATCH), seed=1)
  return jax.tree.map(np.asarray, {'state': state, 'hparams': hparams,
                                   'batch': batch})


def _loop(agent, state, hparams, batch):
  """Each member stepped alone by ``jit(agent.update)``."""
  update = jax.jit(agent.update)
  members = []
  for i in range(N):
    s = jax.tree.map(lambda x, i=i: x[i], state)
    h = jax.tree.map(lambda x, i=i: x[i], hparams)
    for t in range(STEPS):
      s, _ = update(s, h, jax.tree.map(lambda x, i=i, t=t: x[i, t], batch))
    members.append(s)
  return jax.tree.map(lambda *x: np.stack(x), *members)


def run_pair(name: str, data: dict, dtype: str) -> tuple:
  """``(route A, route B)`` final states of pair ``name`` from ``data``."""
  agent = _agent()
  plain, other, _ = _learners(name, agent, sharding.make_mesh(jax.devices()))
  cast = numerics.as_float64 if dtype == 'float64' else (lambda t: t)
  state, hparams, batch = cast((data['state'], data['hparams'],
                                data['batch']))
  copy = lambda t: jax.tree.map(np.array, t)  # noqa: E731  (donated)
  a, _ = plain.update(copy(state), hparams, batch)
  if name == 'population_loop':
    b = _loop(agent, state, hparams, batch)
  else:
    b, _ = other.update(copy(state), hparams, batch)
  return jax.tree.map(np.asarray, a), jax.tree.map(np.asarray, b)


def child(inputs_path: str, out_path: str) -> None:
  """Runs every pair in both dtypes on the inputs the parent saved."""
  jax.config.update('jax_enable_x64', True)  # float32 stays float32
  assert len(jax.devices()) == DEVICES, jax.devices()
  with open(inputs_path, 'rb') as f:
    saved = dict(np.load(f, allow_pickle=False))
  out = {}
  for name in PAIRS:
    data = _unflatten(name, saved)
    for dtype in DTYPES:
      a, b = run_pair(name, data, dtype)
      for route, tree in (('a', a), ('b', b)):
        for i, leaf in enumerate(jax.tree.leaves(tree)):
          out[f'{name}/{dtype}/{route}/{i}'] = leaf
  np.savez(out_path, **out)


# --------------------------------------------------------------------------
# The parent: inputs, children, comparison
# --------------------------------------------------------------------------


def _flatten(name: str, data: dict) -> dict:
  return {f'{name}/{i}': x for i, x in enumerate(jax.tree.leaves(data))}


def _unflatten(name: str, saved: dict) -> dict:
  """Pair ``name``'s inputs from the parent's leaves (the structure from a
  fresh ``inputs(name)``, whose values are discarded)."""
  treedef = jax.tree.structure(inputs(name))
  return jax.tree.unflatten(treedef, [saved[f'{name}/{i}']
                                      for i in range(treedef.num_leaves)])


def _child_env(isa: str) -> dict:
  flags = os.environ.get('XLA_FLAGS', '')
  flags += f' --xla_force_host_platform_device_count={DEVICES}'
  if isa != 'default':
    flags += f' --xla_cpu_max_isa={isa}'
  return {**os.environ, 'XLA_FLAGS': flags.strip(), 'JAX_PLATFORMS': 'cpu',
          'PYTHONPATH': os.pathsep.join(
              [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p])}


def run_children(isas, folder: str, timeout: float = 1200) -> dict:
  """``{isa: {key: leaf}}`` from one child process per instruction set."""
  inputs_path = os.path.join(folder, 'inputs.npz')
  saved = {}
  for name in PAIRS:
    saved.update(_flatten(name, inputs(name)))
  np.savez(inputs_path, **saved)
  results = {}
  for isa in isas:
    out_path = os.path.join(folder, f'{isa}.npz')
    proc = subprocess.run(
        [sys.executable, '-m', 'tests.isa_spread', '--child', inputs_path,
         out_path], cwd=REPO, env=_child_env(isa), capture_output=True,
        text=True, timeout=timeout)
    if proc.returncode != 0:
      raise RuntimeError(f'--isa {isa}: the child failed:\n'
                         f'{proc.stderr[-3000:]}')
    with open(out_path, 'rb') as f:
      results[isa] = dict(np.load(f))
  return results


def spread(a: dict, b: dict, prefix_a: str, prefix_b: str) -> dict:
  """Largest absolute difference and largest TRAJECTORY ratio between the
  floating leaves under ``prefix_a`` of ``a`` and ``prefix_b`` of ``b``."""
  rtol, atol = numerics.TRAJECTORY['rtol'], numerics.TRAJECTORY['atol']
  worst = {'max_abs': 0.0, 'max_ratio': 0.0}
  keys = sorted(k for k in a if k.startswith(prefix_a))
  assert keys, prefix_a
  for key in keys:
    x = a[key]
    y = b[prefix_b + key[len(prefix_a):]]
    if not np.issubdtype(x.dtype, np.floating):
      continue
    x, y = x.astype(np.float64), y.astype(np.float64)
    diff = np.abs(x - y)
    worst['max_abs'] = max(worst['max_abs'], float(diff.max(initial=0.0)))
    worst['max_ratio'] = max(worst['max_ratio'], float(
        (diff / (atol + rtol * np.abs(y))).max(initial=0.0)))
  return worst


def compare(results: dict) -> list[dict]:
  """One row per (pair, dtype, instruction set): route and ISA spreads."""
  reference = 'default' if 'default' in results else next(iter(results))
  rows = []
  for name in PAIRS:
    for dtype in DTYPES:
      for isa, out in results.items():
        row = {'pair': name, 'dtype': dtype, 'isa': isa,
               'route': spread(out, out, f'{name}/{dtype}/a/',
                               f'{name}/{dtype}/b/')}
        if isa != reference:
          row['isa_vs_' + reference] = spread(
              out, results[reference], f'{name}/{dtype}/a/',
              f'{name}/{dtype}/a/')
        rows.append(row)
  return rows


def table(rows: list[dict]) -> str:
  lines = ['| route pair | dtype | instruction set | route spread, max abs '
           '| route spread / tolerance | ISA spread, max abs '
           '| ISA spread / tolerance |', '|---|---|---|---:|---:|---:|---:|']
  for r in rows:
    other = next((v for k, v in r.items() if k.startswith('isa_vs_')), None)
    cells = [r['pair'], r['dtype'], r['isa'],
             f"{r['route']['max_abs']:.2g}", f"{r['route']['max_ratio']:.2g}",
             '' if other is None else f"{other['max_abs']:.2g}",
             '' if other is None else f"{other['max_ratio']:.2g}"]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _cpu_flags() -> list[str]:
  try:
    with open('/proc/cpuinfo') as f:
      for line in f:
        if line.startswith('flags'):
          flags = line.split(':', 1)[1].split()
          return sorted(f for f in flags if f.startswith(('avx', 'sse4')))
  except OSError:
    pass
  return []


def write(out: str, rows: list[dict], isas, command: str) -> None:
  """``isa_spread.json`` (rows and how they were measured), then the
  table made from it."""
  os.makedirs(out, exist_ok=True)
  meta = {'command': command, 'machine': machine(),
          'cpu_vector_flags': _cpu_flags(),
          'date': datetime.date.today().isoformat(), 'commit': code_version(),
          'isas': list(isas), 'tolerance': numerics.TRAJECTORY,
          'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'jax': jax.__version__}
  with open(os.path.join(out, 'isa_spread.json'), 'w') as f:
    json.dump({**meta, 'rows': rows}, f, indent=1)
  write_table(out)


def write_table(out: str) -> None:
  """``isa_spread.md`` from ``isa_spread.json`` in ``out``."""
  with open(os.path.join(out, 'isa_spread.json')) as f:
    meta = json.load(f)
  tol = meta['tolerance']
  with open(os.path.join(out, 'isa_spread.md'), 'w') as f:
    f.write('# Float spread between CPU instruction sets\n\n'
            f'`{meta["command"]}` on {meta["machine"]} (vector flags: '
            f'{" ".join(meta["cpu_vector_flags"])}), {meta["date"]}, commit '
            f'{meta["commit"]}, jax {meta["jax"]}. Route spread: the two '
            'routes of a pair under one instruction set (what a test '
            'compares). ISA spread: route A under that instruction set '
            'against the same route under the default, from the same '
            f'inputs. Tolerance: rtol {tol["rtol"]:g}, atol {tol["atol"]:g} '
            '(`tests/numerics.py`); a ratio above 1 is outside it. '
            'Generated by `tests/isa_spread.py` (`--table DIR` rebuilds it '
            'from the JSON).\n\n' + table(meta['rows']) + '\n')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m tests.isa_spread', description=__doc__.split('\n')[0])
  parser.add_argument('--isa', nargs='+', default=list(ISAS),
                      help='values of --xla_cpu_max_isa, or default (the '
                      'machine\'s widest); default: %(default)s')
  parser.add_argument('--out', help='folder for isa_spread.json and .md')
  parser.add_argument('--table', metavar='DIR',
                      help='only rebuild DIR/isa_spread.md from its JSON')
  parser.add_argument('--child', nargs=2, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    child(*args.child)
    return 0
  if args.table:
    write_table(args.table)
    return 0
  bad = [isa for isa in args.isa if not isa.replace('_', '').isalnum()]
  if bad:
    parser.error(f'--isa {bad[0]!r}: expected a name such as SSE4_2, AVX2 '
                 'or default')
  with tempfile.TemporaryDirectory(prefix='isa-spread-') as folder:
    rows = compare(run_children(args.isa, folder))
  print(table(rows))
  if args.out:
    write(args.out, rows, args.isa,
          'python -m tests.isa_spread ' + ' '.join(argv or sys.argv[1:]))
  return 0


if __name__ == '__main__':
  sys.exit(main())
