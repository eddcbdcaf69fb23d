"""Replays a run's observations through a rule's ``decide`` and compares its
decisions with the ones the run took.

A rule is a pure function of what it observed (``fastpbrl/rules/base.py``),
so the episodes, counters and policy versions a live run saw determine its
decisions. ``benchmarks/rule_recorder.py`` records them in a short run;
this script feeds them to the rule's ``decide`` outside any run, applies
its decisions the way the loop does, and checks that every event and every
call's hyperparameters are the same. A recording made by one version of
the code and replayed by another shows that both take the same decisions
on the same data: how the rule contract was checked against the drivers it
replaced (``benchmarks/results/rules/``).

    python -m benchmarks.rule_recorder --rule pbt --out /tmp/pbt.pkl
    python -m benchmarks.rule_replay --rule pbt --recording /tmp/pbt.pkl \
        [--recorded-with COMMIT] [--results benchmarks/results/rules]

What a replay cannot reproduce, and leaves out: the training state (the
learner does not run, so a copied or sampled member is a copy of the
initial one), hence whatever a decision computes from trained weights
(CEM-RL's mean-policy return, DvD's measured diversity): the replay's
``Observation.data`` answers an evaluation with the recorded mean-policy
returns and probe states with zeros. The decisions
themselves do not depend on them, except CEM-RL's new generation, whose
hyperparameters (the training bound) are compared but not its weights.
The recordings are pickles of this project's own making: load only your
own.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import sys
from typing import Any

import jax
import numpy as np

from benchmarks.provenance import code_version, machine
from benchmarks.rule_recorder import COMMON, RULES
from fastpbrl import rules
from fastpbrl.core.types import episode_record
from fastpbrl.logs.logging import write_json_atomic
from fastpbrl.rules.base import Observation
from fastpbrl.run import build

# Event fields computed from trained weights: not reproducible by a replay.
FROM_WEIGHTS = ('mean_policy_return',)


class RecordedQueries:
  """``Observation.data`` of a replay: the recorded mean-policy returns,
  in order, for the evaluations; zeros for probe states."""

  def __init__(self, events, observation_shape):
    self.observation_shape = tuple(observation_shape)
    self.returns = [e['mean_policy_return'] for _, e in events
                    if 'mean_policy_return' in e]

  def evaluate(self, policy_params, actor_hparams, episodes, seed):
    del actor_hparams, seed
    k = len(jax.tree.leaves(policy_params)[0])
    value = self.returns.pop(0) if self.returns else float('nan')
    return np.full((k, episodes), value), np.zeros((k, episodes), np.int64)

  def random_states(self, num_states, seed):
    del seed
    return np.zeros((num_states, *self.observation_shape), np.float32)


def _rule(name: str):
  """The rule, learner and initial population of the recorded run."""
  rule_cls = rules.get(name)
  rule = rule_cls.from_config(rule_cls.config_class(**COMMON, **RULES[name]))
  agent, learner, state, hparams, rule_state = build.assemble(rule)
  return rule, agent, learner, state, hparams, rule_state


def _shared_critic_steps(state, hparams, num_steps: int):
  """The shared critic's step counter after one call (CEM-RL reads it):
  a call's steps count while ``step < train_until``."""
  if not (hasattr(state, 'step') and hasattr(hparams, 'train_until')):
    return state
  step = int(np.asarray(state.step))
  bound = int(np.asarray(hparams.train_until)[0])
  return state._replace(step=jax.numpy.asarray(
      min(step + num_steps, max(step, bound)), jax.numpy.asarray(
          state.step).dtype))


def _same(a: Any, b: Any) -> bool:
  leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
  return len(leaves_a) == len(leaves_b) and all(
      np.array_equal(np.asarray(x), np.asarray(y))
      for x, y in zip(leaves_a, leaves_b))


def _event_text(event: dict) -> str:
  return json.dumps({k: v for k, v in event.items() if k not in FROM_WEIGHTS},
                    sort_keys=True, default=float)


# Modules whose classes recordings name, and where those classes live now
# (the rules' math moved from fastpbrl.population into the rules' folders).
MOVED_MODULES = {'fastpbrl.population.dvd': 'fastpbrl.rules.dvd.diversity',
                 'fastpbrl.population.cem': 'fastpbrl.rules.cemrl.cem'}


class _Unpickler(pickle.Unpickler):
  """Reads a recording made before a class it names moved."""

  def find_class(self, module: str, name: str):
    return super().find_class(MOVED_MODULES.get(module, module), name)


def replay(name: str, recording: str) -> dict:
  """Replays ``recording`` through rule ``name``; returns the comparison."""
  with open(recording, 'rb') as f:
    # Hyperparameters are pickled NamedTuples, restored by position: TD3's
    # policy_delay of older recordings reads as policy_update_fraction.
    recorded = _Unpickler(f).load()
  rule, agent, learner, state, hparams, rule_state = _rule(name)
  n = rule.config.population_size
  first_version = np.zeros((n,), np.int64)
  marked_at = np.zeros((n,), np.int64)
  events, hparams_differ = [], []
  data = RecordedQueries(recorded['events'],
                         agent.env_spec.observations.shape)
  for call in recorded['calls']:
    state = _shared_critic_steps(state, hparams, learner.num_steps)
    # Recordings hold episodes as dicts: records, in this one place.
    records = [episode_record(r) for r in call['episodes']]
    episodes = tuple(r for r in records if r.start_policy_version
                     >= first_version[int(r.member)])
    rule_state, decision = rule.decide(rule_state, Observation(
        calls=call['calls'], update_steps=call['update_steps'],
        member_update_steps=call['member_update_steps'],
        env_steps=call['env_steps'], episodes=episodes,
        marked_at=marked_at.copy(), state=state, hparams=hparams,
        data=data))
    if decision.state is not None:
      state = decision.state
    if decision.hparams is not None:
      hparams = decision.hparams
    if decision.renewed is not None:
      first_version[decision.renewed] = call['version'] + 1
    if decision.mark is not None:
      marked_at[decision.mark] = call['version']
    events += [(call['calls'], e) for e in decision.events]
    if not _same(hparams, call['hparams']):
      hparams_differ.append(call['calls'])
  want = [(c, _event_text(e)) for c, e in recorded['events']]
  got = [(c, _event_text(e)) for c, e in events]
  return dict(rule=name, calls=len(recorded['calls']),
              recorded_events=len(want), replayed_events=len(got),
              same_events=want == got,
              first_event_difference=next(
                  (i for i, (x, y) in enumerate(zip(want, got)) if x != y),
                  None if len(want) == len(got) else min(len(want), len(got))),
              calls_with_other_hparams=hparams_differ,
              same=(want == got and not hparams_differ))


def write_result(outcome: dict, folder: str, recorded_with: str) -> None:
  """Adds ``outcome`` to ``folder/replay.json`` (one entry per rule and
  recording's code) and regenerates ``replay.md`` from it."""
  path = os.path.join(folder, 'replay.json')
  results = {}
  if os.path.exists(path):
    with open(path) as f:
      results = json.load(f)
  results[f"{outcome['rule']} recorded with {recorded_with}"] = {
      **outcome, 'recorded_with': recorded_with,
      'replayed_with': code_version(), 'machine': machine(),
      'date': datetime.date.today().isoformat(),
      'command': ' '.join(['python -m benchmarks.rule_replay',
                           *sys.argv[1:]])}
  os.makedirs(folder, exist_ok=True)
  write_json_atomic(path, results)
  lines = ['# Rule decisions replayed', '',
           'Generated by `benchmarks/rule_replay.py` from `replay.json`: a '
           'short Pendulum-v1 run of each rule recorded with one version of '
           'the code, its observations replayed through the rule of another.',
           '', '| rule | learner calls | events recorded | events replayed | '
           'same decisions | recorded with | replayed with | machine | date |',
           '|---|---|---|---|---|---|---|---|---|']
  for r in results.values():
    lines.append(f"| {r['rule']} | {r['calls']} | {r['recorded_events']} | "
                 f"{r['replayed_events']} | {'yes' if r['same'] else 'NO'} | "
                 f"{r['recorded_with']} | {r['replayed_with']} | "
                 f"{r['machine']} | {r['date']} |")
  with open(os.path.join(folder, 'replay.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--rule', required=True, choices=sorted(RULES))
  parser.add_argument('--recording', required=True,
                      help='a recording of benchmarks/rule_recorder.py')
  parser.add_argument('--recorded-with', default='this code',
                      help='the commit the recording was made with')
  parser.add_argument('--results', default=None,
                      help='a folder to add the outcome to (replay.json/md)')
  args = parser.parse_args(argv)
  outcome = replay(args.rule, args.recording)
  print(json.dumps(outcome, indent=1))
  if args.results:
    write_result(outcome, args.results, args.recorded_with)
  return 0 if outcome['same'] else 1


if __name__ == '__main__':
  sys.exit(main())
