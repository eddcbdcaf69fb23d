"""Trains one rejax population for ``python -m benchmarks.peers``.

Run by the rejax virtual environment's python
(``benchmarks/peers/setup_rejax.sh``), never by fastpbrl's: it imports
only the standard library, jax and rejax. ``--config`` is the JSON of the
keyword arguments of rejax's ``Algorithm.create`` (built by
``benchmarks/peers/rows.py``); the population is ``--members`` seeds of
that one config, as rejax's README trains one: ``jax.jit(jax.vmap(
algo.train))(keys)`` on one device (``--mode vmap``), or ``jax.pmap(
jax.vmap(algo.train))`` over every local device (``--mode pmap``; the
caller gives the process one host device per core through ``XLA_FLAGS``
before it starts), the members split evenly over them.

Usage::

  .venv-rejax/bin/python benchmarks/peers/rejax_train.py --algo ppo \\
      --members 2 --mode vmap --config '{"env": "CartPole-v1", ...}'

Prints one JSON line on stdout: the seconds of its phases (imports,
create, compile, train), the devices, each member's env steps, the
versions of jax, jaxlib, rejax and gymnax, and the mean return of rejax's
last evaluation. Host-side code: imports, timers and one compiled call.
"""

import time

STARTED = time.perf_counter()

# pylint: disable=g-import-not-at-top,g-bad-import-order
import argparse
import importlib.metadata
import json
import sys

PACKAGES = ('jax', 'jaxlib', 'rejax', 'gymnax', 'flax', 'optax')


def parse_args(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', 1)[0])
  parser.add_argument('--algo', required=True, help="rejax's name: ppo, td3")
  parser.add_argument('--config', required=True,
                      help="JSON of rejax's Algorithm.create keywords")
  parser.add_argument('--members', type=int, required=True,
                      help='seeds trained at once, one config')
  parser.add_argument('--mode', choices=('vmap', 'pmap'), default='vmap')
  parser.add_argument('--seed', type=int, default=0)
  return parser.parse_args(argv)


def versions() -> dict:
  """The installed versions of the packages that train."""
  found = {}
  for name in PACKAGES:
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def main(argv=None) -> None:
  args = parse_args(argv)
  config = json.loads(args.config)
  start = time.perf_counter()
  import jax
  import rejax
  imported = time.perf_counter()

  algo = rejax.get_algo(args.algo).create(**config)
  keys = jax.random.split(jax.random.PRNGKey(args.seed), args.members)
  devices = 1
  if args.mode == 'pmap':
    devices = jax.local_device_count()
    if args.members % devices:
      raise SystemExit(f'--members {args.members} does not split evenly '
                       f'over {devices} devices')
    keys = keys.reshape(devices, args.members // devices, *keys.shape[1:])
    train = jax.pmap(jax.vmap(algo.train))
  else:
    train = jax.jit(jax.vmap(algo.train))
  created = time.perf_counter()

  compiled = train.lower(keys).compile()
  lowered = time.perf_counter()

  state, evaluation = compiled(keys)
  jax.block_until_ready((state, evaluation))
  trained = time.perf_counter()

  steps = jax.device_get(state.global_step).reshape(-1)
  # [devices,] members, evaluations, episodes: the last evaluation's.
  returns = jax.device_get(evaluation[1])[..., -1, :]
  print(json.dumps({
      'algo': args.algo, 'mode': args.mode, 'members': args.members,
      'devices': devices, 'backend': jax.default_backend(),
      'env_steps_per_member': sorted({int(s) for s in steps}),
      'final_eval_mean_return': float(returns.mean()),
      'phases_s': {'before_main': start - STARTED,
                  'imports': imported - start,
                  'create': created - imported,
                  'compile': lowered - created,
                  'train': trained - lowered,
                  'in_process': trained - STARTED},
      'versions': versions(), 'python': sys.version.split()[0]}))


if __name__ == '__main__':
  main()
