"""The training loop: learner calls, the rule between them, logs and
checkpoints (host-side; not jittable).

One iteration, top to bottom (``train``):

    state   = data.learn(learner, state, ...)  the data path's next data and
                                               one compiled call, S update steps
    read back the previous call's results      divergence, learner scalars
    episodes, env steps                        this call's, from every process
    rule.decide(rule_state, observation)       the population rule
    apply the decision                         new state, hparams, replay copies
    callbacks, publish the new policies, logs
    checkpoint every --checkpoint-every env steps per member (whole calls)

The previous call's results are read back only once the next call is
dispatched, so the device is never idle while the host waits. Over several
processes every step that reads or agrees on host values is a
``distributed.Processes`` collective, which is the identity for one
process.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple, Optional, Sequence

import jax
import numpy as np

from fastpbrl.config.derived import as_learner_calls
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.datapath.protocol import DataPath
from fastpbrl.logs.logging import append_rows
from fastpbrl.rules.base import (DataQueries, Decision, Observation, Rule,
                                 apply_decision)
from fastpbrl.run.callbacks import Callback, Loop

log = logging.getLogger('fastpbrl')

# Learner calls between two rows of the rule's and the learner's scalars.
SCALARS_EVERY = 10


class Finished(NamedTuple):
  """A learner call whose results the host reads once the next is queued."""

  calls: int  # the call's number
  metrics: Any  # its metrics (device arrays)
  env_steps: int  # env steps per member when it was dispatched
  scalars: dict | None  # host scalars to log with its metrics (every 10th)


class RuleRun:
  """The rule's side of the loop: its state, and what the loop keeps for
  it (which episodes still count, the versions of its marks, the events
  its last decisions made).

  Episodes that started before a member's weights were replaced
  (``Decision.renewed``) are left out of the rule's observations; the
  callbacks and the logs see every episode.
  """

  def __init__(self, rule: Rule, rule_state, population_size: int,
               run_dir: str):
    self.rule = rule
    self.state = rule_state
    self.run_dir = run_dir
    self.first_version = np.zeros((population_size,), np.int64)
    self.marked_at = np.zeros((population_size,), np.int64)
    self.events: list[dict] = []

  def observation(self, loop: Loop,
                  data: Optional[DataQueries] = None) -> Observation:
    """What the rule may read after the call ``loop`` just took; ``data``
    answers its queries (``RuleQueries`` of the run's data path)."""
    episodes: tuple[EpisodeRecord, ...] = tuple(
        r for r in loop.episodes
        if r.start_policy_version >= self.first_version[int(r.member)])
    return Observation(
        calls=loop.calls, update_steps=loop.update_steps,
        member_update_steps=loop.member_update_steps.copy(),
        env_steps=loop.env_steps, episodes=episodes,
        marked_at=self.marked_at.copy(), state=loop.state,
        hparams=loop.hparams, data=data)

  def take_events(self) -> list[dict]:
    """The decisions' events since the last call, oldest first."""
    events, self.events = self.events, []
    return events


class RuleQueries:
  """A rule's queries (``rules.base.DataQueries``) answered by the run's
  data path: ``K`` policies that every process holds whole, where the data
  path's ``evaluate`` plays each process's rows of a population."""

  def __init__(self, data: DataPath, processes):
    self.data, self.processes = data, processes

  def evaluate(self, policy_params, actor_hparams, episodes: int, seed: int):
    processes = self.processes
    if not processes.several:  # this process's rows are the K policies
      return self.data.evaluate(policy_params, actor_hparams, episodes,
                                seed)[:2]
    # Over several processes the data path plays the population's rows,
    # each process its own: the K policies become rows 0..K-1 (the others
    # repeat row 0), so policy k is seeded as member k, as in one process.
    k = int(jax.tree.leaves(policy_params)[0].shape[0])
    n = int(processes.population_size)
    if k > n:
      raise ValueError(f'a rule may evaluate at most {n} policies at once '
                       f'over several processes, got {k}')
    rows = np.where(np.arange(n) < k, np.arange(n), 0)[processes.local]
    returns, lengths, _ = self.data.evaluate(
        jax.tree.map(lambda x: np.asarray(x)[rows], policy_params),
        jax.tree.map(lambda x: np.asarray(x)[rows], actor_hparams),
        episodes, seed)
    return returns[:k], lengths[:k]

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    return self.data.random_states(num_states, seed)


def apply(parts: 'Parts', loop: Loop, decision: Decision) -> None:
  """Carries out a rule's ``decision`` on the loop and the data path
  (``rules.base.apply_decision``, as ``rules.testing.Harness`` does)."""
  rule_run, data, processes = parts.rule_run, parts.data, parts.processes

  def published_version() -> int:
    # Parameters are published by a thread: the store's version counts only
    # what it has written. Once everything submitted is written, the next
    # version is the first with the new weights (a rule decision, so this
    # short wait is off the per-call path).
    data.wait_published()
    loop.policy_version = data.policy_version
    return loop.policy_version

  loop.state, loop.hparams = apply_decision(
      decision, loop.state, loop.hparams,
      reinit_members=lambda *args: parts.learner.reinit_members(*args),
      copy_data=lambda members, sources: data.copy_member_data(
          *processes.local_pairs(members, sources)),
      restart=lambda members: data.restart_members(
          processes.local_indices(members)),
      published_version=published_version,
      first_version=rule_run.first_version, marked_at=rule_run.marked_at)
  append_rows(rule_run.run_dir, decision.logs)
  rule_run.events.extend(decision.events)


@dataclasses.dataclass
class Parts:
  """What the loop drives: everything built before the first call."""

  rule_run: RuleRun
  learner: Any
  data: DataPath  # actors + replay, or JAX envs on the device
  processes: Any  # fastpbrl.devices.distributed.Processes
  stop: Any  # fastpbrl.run.signals.StopRequest
  logger: Any  # fastpbrl.logs.logging.RunLogger
  hparams_log: Any  # fastpbrl.logs.logging.HParamsLog
  rule_log: Any  # fastpbrl.logs.logging.RuleLog
  saver: Any  # fastpbrl.run.resume.Saver
  callbacks: Sequence[Callback] = ()


class Divergence:
  """Replaces members whose learner call diverged (NaN or Inf).

  The learner keeps a diverged member's last finite state and flags it; its
  flag is read one call later (``Finished``), when the next call already
  ran the old member. Members replaced after call ``calls`` was dispatched
  are remembered, so that call's flags for their diverged predecessors do
  not replace them again.
  """

  def __init__(self, population_size: int):
    self.replaced_calls = -1
    self.replaced = np.zeros(population_size, bool)

  def check(self, parts: Parts, loop: Loop, done: Finished) -> None:
    diverged = ~parts.processes.host(done.metrics['finite'])
    if self.replaced_calls == done.calls:
      diverged &= ~self.replaced
    if not diverged.any():
      return
    # Replaced in the newest state, one call after they diverged.
    if loop.calls > done.calls:  # call loop.calls ran the old member
      self.replaced_calls, self.replaced = loop.calls, diverged
    rule_run = parts.rule_run
    observation = rule_run.observation(
        loop, RuleQueries(parts.data, parts.processes))._replace(episodes=())
    rule_run.state, decision = rule_run.rule.replace_diverged(
        rule_run.state, observation, diverged)
    apply(parts, loop, decision)
    loop.diverged += int(diverged.sum())
    log.warning('members %s diverged (NaN or Inf in their loss or '
                'parameters) in learner call %d: %s (%d so far)',
                np.flatnonzero(diverged).tolist(), done.calls,
                decision.note or 'replaced', loop.diverged)


def read_back(parts: Parts, loop: Loop, divergence: Divergence,
              done: Finished) -> None:
  """What needs call ``done.calls``'s results on the host."""
  if 'finite' in done.metrics:  # one [N] flag per call, not per step
    divergence.check(parts, loop, done)
  if done.scalars is not None:
    scalars = learner_scalars(
        {k: parts.processes.host(v) for k, v in done.metrics.items()},
        loop.config.population_size)
    scalars.update(done.scalars)
    scalars['learner/diverged_members_total'] = loop.diverged
    parts.logger.scalars(scalars, done.env_steps)


def learner_scalars(metrics: dict, population_size: int) -> dict:
  """``learner/<k>``, the population's mean of each metric, and
  ``member_<i>/learner/<k>``, each member's mean over its steps (for the
  metrics with a leading population axis, ``[N]`` or ``[N, steps]``)."""
  scalars = {}
  for k, v in metrics.items():
    v = np.asarray(v, np.float64)
    scalars[f'learner/{k}'] = float(np.mean(v))
    if v.ndim and v.shape[0] == population_size:
      per_member = v.reshape(population_size, -1).mean(axis=1)
      scalars.update({f'member_{i:03d}/learner/{k}': float(x)
                      for i, x in enumerate(per_member)})
  return scalars


def learner_call(parts: Parts, loop: Loop) -> Any:
  """One learner call on the data path's next data; returns its metrics
  (device arrays), or None when a stop was requested while it waited."""
  rule = parts.rule_run.rule
  call = parts.data.learn(parts.learner, loop.state, loop.hparams,
                          rule.actor_hparams(loop.hparams),
                          shared_critic=rule.shared_critic,
                          should_stop=parts.stop)
  if call is None:
    return None
  loop.state = call.state
  loop.member_update_steps += call.member_update_steps
  loop.calls += 1
  loop.update_steps += parts.learner.num_steps
  return call.metrics


def observe(parts: Parts, loop: Loop, steps_before: int) -> bool:
  """This call's finished episodes and env steps into ``loop`` (gathered
  from every process); returns whether a stop was requested in any."""
  # A resumed run's data path counts from zero: steps before the checkpoint
  # are added back, so budgets and logs continue (episode records already
  # carry the members' own, continued, counts).
  loop.episodes = parts.processes.episodes(parts.data.drain_episodes())
  loop.policy_version = None
  # The least over members (of every process); and whether a signal came
  # (to any process), so that all stop after the same call.
  stopping, least = parts.processes.agree(
      parts.stop.requested, parts.data.env_steps_per_member())
  loop.env_steps = steps_before + least
  parts.logger.episodes(loop.episodes, loop.env_steps, loop.update_steps)
  return stopping


def call_back(parts: Parts, loop: Loop, after_call: bool = True) -> list:
  """Hands the rule's decisions since the last call to each callback, then
  (``after_call``) calls its ``after_call``; returns the decisions."""
  events = parts.rule_run.take_events()
  for callback in parts.callbacks:
    for event in events:
      callback.after_rule_decision(loop, event)
    if after_call:
      callback.after_call(loop)
  return events


def publish(parts: Parts, loop: Loop) -> None:
  """Sends the newest policies and acting hyperparameters to the actors
  (written by the publisher thread once the call is done)."""
  processes, rule = parts.processes, parts.rule_run.rule
  parts.data.publish_async(
      processes.local_view(parts.learner.policy_params(loop.state)),
      processes.local_view(rule.actor_hparams(loop.hparams)))


def log_call(parts: Parts, loop: Loop, events: list) -> Optional[dict]:
  """Progress; hyperparameter and rule rows; every ``SCALARS_EVERY`` calls
  also the host scalars to log with this call's metrics (returned)."""
  rule, data = parts.rule_run.rule, parts.data
  n = loop.config.population_size
  parts.logger.progress(loop.env_steps * n, calls=loop.calls,
                        wait=f'{data.wait_fraction():.0%}')
  if loop.calls % SCALARS_EVERY == 0 or events or loop.calls == 1:
    parts.hparams_log.write(loop.env_steps, loop.update_steps,
                            rule.hparam_rows(loop.hparams))
  if loop.calls % SCALARS_EVERY:
    return None
  rule_scalars = rule.scalars(parts.rule_run.state)
  parts.rule_log.write(loop.env_steps, loop.update_steps, rule_scalars)
  scalars = {f'rule/{k}': v for k, v in rule_scalars.items()}
  scalars['pipeline/learner_wait_fraction'] = data.wait_fraction()
  scalars['pipeline/population_env_steps'] = loop.env_steps * n
  for i, row in enumerate(rule.hparam_rows(loop.hparams)):
    scalars.update({f'member_{i:03d}/hparams/{k}': v for k, v in row.items()})
  return scalars


def train(parts: Parts, loop: Loop) -> None:
  """Learner calls until the rule's budget is spent or a stop is requested
  (SIGINT/SIGTERM, in any process); the last call's results are read back
  and the rule's last events reported before it returns."""
  rule_run, config = parts.rule_run, loop.config
  divergence = Divergence(config.population_size)
  # Learner calls, not env steps, so that every process saves at one call.
  checkpoint_calls = as_learner_calls(config.checkpoint_every, config)
  steps_before = loop.env_steps
  pending: Finished | None = None
  queries = RuleQueries(parts.data, parts.processes)
  while not finished(parts, loop, steps_before):
    metrics = learner_call(parts, loop)
    if metrics is None:
      break  # a signal arrived while waiting for data (in any process)
    if pending is not None:
      read_back(parts, loop, divergence, pending)
    stopping = observe(parts, loop, steps_before)
    rule_run.state, decision = rule_run.rule.decide(
        rule_run.state, rule_run.observation(loop, queries))
    apply(parts, loop, decision)
    events = call_back(parts, loop)
    # After the rule, so that what it changed reaches the actors.
    publish(parts, loop)
    # Against env steps per member, as the members' returns are.
    pending = Finished(loop.calls, metrics, loop.env_steps,
                       log_call(parts, loop, events))
    if stopping:
      break
    if parts.processes.any(loop.stop_reason is not None):
      log.info('a callback ended the run after learner call %d: %s',
               loop.calls, loop.stop_reason or 'in another process')
      break
    if checkpoint_calls and loop.calls % checkpoint_calls == 0:
      read_back(parts, loop, divergence, pending)
      pending = None
      parts.saver.save(loop)
  if pending is not None:
    read_back(parts, loop, divergence, pending)
    call_back(parts, loop, after_call=False)  # a last divergence's
  parts.logger.finish_progress(loop.env_steps * config.population_size,
                               calls=loop.calls)


def write_last_rows(parts: Parts, loop: Loop) -> None:
  """The hyperparameter and rule rows of the loop's end, written once its
  last checkpoint is: a resumed run cuts its logs back to that checkpoint,
  so a stopped run's last rows give way to the resumed run's own."""
  rule_run = parts.rule_run
  parts.hparams_log.write(loop.env_steps, loop.update_steps,
                          rule_run.rule.hparam_rows(loop.hparams))
  if loop.calls % SCALARS_EVERY:  # else written at this call already
    parts.rule_log.write(loop.env_steps, loop.update_steps,
                         rule_run.rule.scalars(rule_run.state))


def finished(parts: Parts, loop: Loop, steps_before: int) -> bool:
  """The rule has nothing left to do, or the env-step budget is spent
  and the learner has taken the update steps that the budget's data
  earned (``DataPath.update_steps_owed``; the least over processes):
  actors run a little ahead of the learner, and a resumed run's refill may
  reach the budget before the learner took what it earned."""
  rule_run = parts.rule_run
  if rule_run.rule.finished(rule_run.state):
    return True
  if loop.env_steps < loop.config.env_steps:
    return False
  owed = parts.data.update_steps_owed(loop.config.env_steps - steps_before)
  _, least = parts.processes.agree(False, owed)
  return least < parts.learner.num_steps
