"""User hooks into the run loop (host-side): ``Callback``, and the
``Loop`` it sees."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from fastpbrl.config import RunConfig


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
    would."""

  def after_rule_decision(self, loop: Loop, event: dict) -> None:
    """Once per decision the rule made in this call (``Decision.events``),
    before ``after_call``: PBT ``{'event': 'exploit', 'member', 'parent',
    'new_hparams', ...}`` (the lineage line), HyperTrick ``{'event':
    'reset', 'member', 'hparams'}``, CEM-RL ``{'event': 'generation',
    'generation', 'mean_policy_return'}``, DvD ``{'event': 'lambda',
    'value'}``; each also has ``step`` (update steps) and ``env_steps``
    (per member)."""
