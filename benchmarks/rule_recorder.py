"""Records what a rule saw and decided in a short run, for
``benchmarks/rule_replay.py`` (host-side).

Kept apart from the replay and written against the public API only
(``fastpbrl.train``, ``fastpbrl.Callback``), so that it also runs on code
from before the rule contract, where a callback's loop held the pipeline:
copy this file into such a checkout's ``benchmarks/`` and run it there to
record the decisions of the drivers the rules replaced.

    python -m benchmarks.rule_recorder --rule pbt --out /tmp/pbt.pkl
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys

import jax
import numpy as np

import fastpbrl

# Short Pendulum-v1 runs in which each rule takes several decisions.
RULES = {
    'pbt': dict(env_steps=6000, warmup_steps=500, ready_after=500,
                eval_every=500, fitness_window=3),
    'hypertrick': dict(env_steps=8000, warmup_steps=300, num_workers=8,
                       num_phases=2, phase_env_steps=600, eval_every=500),
    'dvd': dict(env_steps=5000, warmup_steps=500, bandit_every=200,
                eval_every=200, steps_per_call=50),
    'cemrl': dict(total_env_steps=24000, warmup_steps=500),
}
COMMON = dict(env='Pendulum-v1', population_size=4, hidden_sizes=(32, 32),
              eval_episodes=2, progress=False, seed=3, num_actors=1,
              track='none')


class Recorder(fastpbrl.Callback):
  """Per learner call: the counters, every finished episode, the policy
  version the rule's decision saw, and the hyperparameters after it."""

  def __init__(self):
    self.calls, self.events = [], []

  def after_rule_decision(self, loop, event):
    self.events.append((loop.calls, event))

  def after_call(self, loop):
    self.calls.append(dict(
        calls=loop.calls, update_steps=loop.update_steps,
        member_update_steps=np.asarray(loop.member_update_steps).copy(),
        env_steps=loop.env_steps,
        episodes=[r._asdict() for r in loop.episodes],
        version=_version(loop),
        hparams=jax.tree.map(np.asarray, loop.hparams)))


def _version(loop):
  """The policy version of this call's decision: the loop's, or on code
  before the rule contract the pipeline's once it published everything
  submitted (what a driver read when it decided)."""
  pipeline = getattr(loop, 'pipeline', None)
  if pipeline is None:
    return loop.policy_version
  pipeline.wait_published()
  return pipeline.policy_version


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--rule', required=True, choices=sorted(RULES))
  parser.add_argument('--out', required=True, help='the recording to write')
  args = parser.parse_args(argv)
  recorder = Recorder()
  fastpbrl.train(args.rule, callbacks=[recorder],
                 run_dir=os.path.splitext(args.out)[0] + '-run', **COMMON,
                 **RULES[args.rule])
  with open(args.out, 'wb') as f:
    pickle.dump(dict(calls=recorder.calls, events=recorder.events), f)
  print(f'{args.rule}: {len(recorder.calls)} calls, {len(recorder.events)} '
        f'events recorded in {args.out}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
