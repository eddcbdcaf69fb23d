"""User hooks into the run loop (host-side): ``Callback``, and the
``Loop`` it sees."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional

import numpy as np

from fastpbrl.config.fields import RunConfig


@dataclasses.dataclass
class Loop:
  """The run as a callback sees it between learner calls."""

  config: RunConfig
  run_dir: str  # this process's folder (process 0: the run's)
  agent: Any
  learner: Any
  state: Any  # stacked training state (device)
  hparams: Any  # stacked hyperparameters (device)
  calls: int = 0  # learner calls done
  update_steps: int = 0  # update steps per member done (the population's)
  # [N] update steps each member kept: less than update_steps for members
  # restarted as new experiments (``Decision.restart``).
  member_update_steps: np.ndarray = None
  env_steps: int = 0  # env steps per member collected (least over members)
  episodes: list = dataclasses.field(default_factory=list)  # this call's
  diverged: int = 0  # member divergences (NaN/Inf) replaced so far
  # The policy version the actors acted with when this call's rule decision
  # replaced or marked members (their new weights go out as the next one);
  # None when no decision of this call needed it.
  policy_version: Optional[int] = None
  # Why a callback ended the run (``stop``); None while it goes on.
  stop_reason: Optional[str] = None

  def stop(self, reason: str) -> None:
    """Ends the run after this call as if its budget were spent: a last
    checkpoint, the final evaluation and the summary (over several
    processes, once any process's callback asked)."""
    if self.stop_reason is None:
      self.stop_reason = reason


class Callback:
  """User code the run loop calls (host-side): subclass it, override what
  you need, and pass instances as ``run(config, rule, callbacks=[...])``
  (or ``fastpbrl.train(..., callbacks=[...])``).

  Both hooks run in the learner's process, between learner calls: keep them
  short, since the learner waits for them (the actors do not).
  """

  def after_call(self, loop: Loop) -> None:
    """After every learner call and the rule's decision, before the new
    policies go to the actors. ``loop`` holds the counters (``calls``,
    ``update_steps``, ``env_steps`` per member), this call's finished
    ``episodes``, and the stacked ``state`` and ``hparams``; replacing
    ``loop.state`` or ``loop.hparams`` changes what is trained, as a rule
    would; ``loop.stop(reason)`` ends the run after this call."""

  def after_rule_decision(self, loop: Loop, event: dict) -> None:
    """Once per decision the rule made in this call (``Decision.events``),
    before ``after_call``: PBT ``{'event': 'exploit', 'member', 'parent',
    'new_hparams', ...}`` (the lineage line), HyperTrick ``{'event':
    'reset', 'member', 'hparams'}``, CEM-RL ``{'event': 'generation',
    'generation', 'mean_policy_return'}``, DvD ``{'event': 'lambda',
    'value'}``; each also has ``step`` (update steps) and ``env_steps``
    (per member)."""


class StopAtReturn(Callback):
  """Ends the run once a member's evaluation reaches ``threshold``: the mean
  return of its last ``--eval-episodes`` evaluation episodes (one
  evaluation), as Stable-Baselines3's ``StopTrainingOnRewardThreshold``
  does for one agent."""

  def __init__(self, threshold: float):
    self.threshold = float(threshold)
    self._returns: dict[int, list] = {}

  def after_call(self, loop: Loop) -> None:
    size = loop.config.eval_episodes
    for record in loop.episodes:
      if not record['evaluation']:
        continue
      member = int(record['member'])
      kept = self._returns.setdefault(member, [])
      kept.append(float(record['episode_return']))
      del kept[:-size]
      if len(kept) == size and np.mean(kept) >= self.threshold:
        loop.stop(f'member {member} reached a mean evaluation return of '
                  f'{np.mean(kept):.1f} >= {self.threshold:g}')


class TimeLimit(Callback):
  """Ends the run after ``seconds`` of training (counted from its first
  learner call, in this process; over several processes the first to
  reach it stops all)."""

  def __init__(self, seconds: float, clock=time.monotonic):
    if not seconds > 0:
      raise ValueError(f'TimeLimit needs seconds > 0, got {seconds}')
    self.seconds = float(seconds)
    self._clock = clock
    self._start: Optional[float] = None

  def after_call(self, loop: Loop) -> None:
    now = self._clock()
    if self._start is None:
      self._start = now
    elif now - self._start >= self.seconds:
      loop.stop(f'the time limit of {self.seconds:g} s was reached')

