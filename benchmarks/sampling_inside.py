"""Host sampling vs sampling inside the compiled learner call.

Host-side script (numpy and ``time.perf_counter``; nothing jittable). For each
population size ``N`` it fills a per-member replay of random HalfCheetah-like
transitions (observation 17, action 6; no env needed) and times, per learner
call of ``S`` update steps of ``B`` transitions per member:

* ``host sample+put``: ``PerMemberReplay.sample`` + ``jax.device_put``,
  waited for (what the prefetch thread does per call);
* ``host total``: the same followed by ``PopulationLearner.update``, done in
  sequence (the learner's view without prefetch);
* ``device``: ``PopulationLearner.update_from_replay`` on a ``DeviceReplay``
  holding the same data.

Every path is compiled and run once before timing; each figure is the median
of ``--calls`` calls, each waited for with ``block_until_ready``. The table
gives milliseconds per call and microseconds per member-step (per call
divided by ``N * S``).

Usage::

  python -m benchmarks.sampling_inside                   # N = 1 8 32 80
  python -m benchmarks.sampling_inside --members 1 8 --calls 3
  python -m benchmarks.sampling_inside --hidden 256 256 --capacity 100000
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np
from acme import specs

from fastpbrl.agents import td3
from fastpbrl.core.types import random_transitions
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import PerMemberReplay, transition_fields
from fastpbrl.replay.device import DeviceReplay


def halfcheetah_like_spec(obs_dim: int = 17,
                          action_dim: int = 6) -> specs.EnvironmentSpec:
  return specs.EnvironmentSpec(
      observations=specs.Array((obs_dim,), np.float32),
      actions=specs.BoundedArray((action_dim,), np.float32, -1.0, 1.0),
      rewards=specs.Array((), np.float32),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0))


def median_time(fn, calls: int) -> float:
  times = []
  for _ in range(calls):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def measure(n: int, args) -> dict:
  spec = halfcheetah_like_spec()
  agent = td3.make_agent(spec, td3.TD3Config(
      hidden_sizes=tuple(args.hidden), batch_size=args.batch_size,
      steps_per_call=args.steps))
  learner = PopulationLearner(agent, args.steps, args.batch_size)
  hparams = population_hparams(agent, n)
  fields = transition_fields(spec)
  host = PerMemberReplay(fields, n, args.capacity)
  dev = DeviceReplay('per_member', fields, n, args.capacity)
  data = random_transitions(spec, (n, args.capacity), seed=args.seed)._asdict()
  host.insert(np.arange(n), data)
  dev.load_state_dict(host.state_dict())
  replay_state = dev.flush()
  rng = np.random.default_rng(args.seed)
  state = learner.init(jax.random.PRNGKey(args.seed), hparams)
  key = [jax.random.PRNGKey(args.seed + 1)]

  def sample_put():
    batch = host.sample(rng, args.steps, args.batch_size)
    return jax.block_until_ready(jax.device_put(batch))

  def host_call():
    nonlocal state
    state, metrics = learner.update(state, hparams, sample_put())
    jax.block_until_ready((state, metrics))

  def device_call():
    nonlocal state
    key[0], k = jax.random.split(key[0])
    state, metrics = learner.update_from_replay(state, hparams, replay_state,
                                                k)
    jax.block_until_ready((state, metrics))

  for fn in (sample_put, host_call, device_call):  # compile, warm up
    fn()
  out = {'sample+put': median_time(sample_put, args.calls),
         'host total': median_time(host_call, args.calls),
         'device': median_time(device_call, args.calls)}
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--members', type=int, nargs='+', default=[1, 8, 32, 80],
                      help='population sizes N')
  parser.add_argument('--hidden', type=int, nargs='+', default=[64, 64],
                      help='TD3 policy and critic MLP widths')
  parser.add_argument('--steps', type=int, default=50,
                      help='update steps per learner call S')
  parser.add_argument('--batch-size', type=int, default=256,
                      help='transitions per member per step B')
  parser.add_argument('--capacity', type=int, default=10_000,
                      help='replay rows per member (filled with random data)')
  parser.add_argument('--calls', type=int, default=20,
                      help='timed calls per path (the median is reported)')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args(argv)
  print(f'backend {jax.default_backend()} ({jax.devices()[0]}), TD3 hidden '
        f'{args.hidden}, S={args.steps}, B={args.batch_size}, capacity '
        f'{args.capacity:,} per member, median of {args.calls} calls')
  header = (f'{"N":>4} | {"sample+put ms":>13} | {"host total ms":>13} | '
            f'{"device ms":>9} | {"host us/member-step":>19} | '
            f'{"device us/member-step":>21}')
  print(header)
  print('-' * len(header))
  for n in args.members:
    r = measure(n, args)
    per = 1e6 / (n * args.steps)
    print(f'{n:>4} | {1e3 * r["sample+put"]:>13.2f} | '
          f'{1e3 * r["host total"]:>13.2f} | {1e3 * r["device"]:>9.2f} | '
          f'{per * r["host total"]:>19.1f} | {per * r["device"]:>21.1f}',
          flush=True)


if __name__ == '__main__':
  main()
