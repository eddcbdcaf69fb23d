"""Drive a rule through observations without a run (host-side; for tests).

``Harness`` keeps what the run loop keeps for a rule (its state, the
stacked training state and hyperparameters, the policy versions behind
``Decision.renewed`` and ``Decision.mark``) and carries out each
``Decision`` with the loop's own code (``rules.base.apply_decision``).
What the loop would ask of the data path it records instead: replay
copies, restarts, log lines, events.

    harness = Harness(rule, rule_state, state=state, hparams=hparams,
                      learner=learner)
    decision = harness.observe(episodes, update_steps=200, env_steps=1000)
    assert harness.copies == [(members, sources)]

Each ``observe`` is one learner call: the observation holds the episodes
given that did not start under weights a decision has since replaced (as
``loop.RuleRun.observation`` leaves them out), then the call's new weights
are published (``policy_version`` goes up by one).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import jax
import numpy as np

from fastpbrl.rules.base import (DataQueries, Decision, Observation, Rule,
                                 apply_decision)


class Harness:
  """A rule and what the loop keeps for it (see the module docstring).

  Attributes:
    rule_state, state, hparams: as after the last decision.
    policy_version: the version actors act with now (1 at the start).
    first_version: ``[N]``, each member's first version with its current
      weights (``Decision.renewed``).
    marked_at: ``[N]``, ``Observation.marked_at``.
    calls, update_steps, env_steps: the last observation's counters.
    member_update_steps: ``[N]``, the last observation's
      ``Observation.member_update_steps``.
    copies: ``[(members, sources)]`` of ``Decision.copy_data``, in order.
    restarts: ``[mask]`` of ``Decision.restart`` (those with a member).
    events, logs: every decision's ``events`` and ``logs``, in order.
  """

  def __init__(self, rule: Rule, rule_state, *, state, hparams,
               learner: Any = None, policy_version: int = 1,
               data: Optional[DataQueries] = None):
    """``learner``: the one whose ``reinit_members`` carries out
    ``Decision.reinit`` (None: a rule that never re-initialises).
    ``data``: what ``Observation.data`` answers (a rule's evaluations and
    random states; a fake of ``rules.base.DataQueries`` in tests)."""
    self.rule, self.rule_state, self.data = rule, rule_state, data
    self.state, self.hparams, self.learner = state, hparams, learner
    n = len(jax.tree_util.tree_leaves(hparams)[0])
    self.policy_version = policy_version
    self.first_version = np.zeros((n,), np.int64)
    self.marked_at = np.zeros((n,), np.int64)
    self.calls = self.update_steps = self.env_steps = 0
    self.member_update_steps = np.zeros((n,), np.int64)
    self.copies: list[tuple] = []
    self.restarts: list[np.ndarray] = []
    self.events: list[dict] = []
    self.logs: list[tuple] = []

  def observation(self, episodes: Sequence = (), *,
                  update_steps: Optional[int] = None,
                  env_steps: Optional[int] = None,
                  member_update_steps: Optional[np.ndarray] = None,
                  calls: Optional[int] = None) -> Observation:
    """The observation after a learner call with these counters (default:
    the last ones; ``member_update_steps``: ``update_steps`` for all)."""
    if update_steps is not None:
      self.update_steps = update_steps
    if env_steps is not None:
      self.env_steps = env_steps
    self.calls = self.calls + 1 if calls is None else calls
    if member_update_steps is None:
      member_update_steps = np.full(len(self.marked_at), self.update_steps)
    self.member_update_steps = np.array(member_update_steps, np.int64)
    kept = tuple(e for e in episodes if e.start_policy_version
                 >= self.first_version[int(e.member)])
    return Observation(
        calls=self.calls, update_steps=self.update_steps,
        member_update_steps=self.member_update_steps.copy(),
        env_steps=self.env_steps, episodes=kept,
        marked_at=self.marked_at.copy(), state=self.state,
        hparams=self.hparams, data=self.data)

  def observe(self, episodes: Sequence = (), **counters) -> Decision:
    """One learner call: ``rule.decide`` on ``observation(episodes,
    **counters)``, the decision carried out, the new weights published."""
    self.rule_state, decision = self.rule.decide(
        self.rule_state, self.observation(episodes, **counters))
    self.apply(decision)
    self.policy_version += 1  # this call's weights reach the actors
    return decision

  def replace_diverged(self, diverged: np.ndarray, **counters) -> Decision:
    """The loop's ``rule.replace_diverged`` for ``diverged`` (``[N]``
    bool) members, carried out (no new call: the version stays)."""
    observation = self.observation((), **counters)
    self.rule_state, decision = self.rule.replace_diverged(
        self.rule_state, observation, np.asarray(diverged, bool))
    self.apply(decision)
    return decision

  def apply(self, decision: Decision) -> None:
    """Carries out ``decision`` as ``loop.apply`` does, recording what it
    would ask of the data path."""
    self.state, self.hparams = apply_decision(
        decision, self.state, self.hparams,
        reinit_members=self._reinit_members,
        copy_data=lambda members, sources: self.copies.append(
            (np.asarray(members), np.asarray(sources))),
        restart=lambda mask: self.restarts.append(np.asarray(mask).copy()),
        published_version=lambda: self.policy_version,
        first_version=self.first_version, marked_at=self.marked_at)
    self.logs.extend(decision.logs)
    self.events.extend(decision.events)

  def _reinit_members(self, key, state, hparams, members):
    if self.learner is None:
      raise ValueError('the decision re-initialises members: give the '
                       'Harness a learner (rule.make_learner(agent, 1))')
    return self.learner.reinit_members(key, state, hparams, members)
