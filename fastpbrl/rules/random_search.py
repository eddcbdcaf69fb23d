"""Random search from the prior, the control arm of Population Based
Training (Jaderberg et al. 2017): hyperparameters drawn once, then trained
without exploit or explore (host-side; nothing here is jitted).

    fastpbrl random                          # TD3, Pendulum-v1, 4 draws
    fastpbrl random --agent ppo --env CartPole-v1 --population-size 8
    fastpbrl random --search-space examples/search_space.json

N members, each with hyperparameters drawn once, at the start, from the
search space (``--search-space``, else the agent's registered space), then
trained to the end without exploit or explore: random search (Bergstra &
Bengio 2012) run in parallel. Jaderberg et al. measure PBT against "the very
strong baseline of performing random search with the same number of
workers" (Sect. 4.1.2), whose "initial hyperparameter ranges ... were the
same" as PBT's (appendix A.2), and report PBT's gains as "improvement over
the equivalent random search baseline" (Fig. 5). This rule is that arm:
its members start from THE SAME draws as ``fastpbrl pbt --init-hparams
prior`` of the same ``--seed``, ``--population-size`` and search space
(both sample with ``fastpbrl.core.search_space.sample`` from the key
``fastpbrl.run.build.initial_population`` gives every rule), so the two runs
start alike (the same initial parameters too) and differ in PBT's
decisions. ``--preset paper`` is the arm of ``fastpbrl pbt --preset
paper`` (its run settings, which draw from the prior). Against ``fastpbrl seeds`` (every member at
the agent's defaults) it measures what the search space itself gives.

What a run reports is the generic one: every member's hyperparameters in
``hparams.csv`` (constant over the run) and the best member, whose draw
is the search's answer, with its hyperparameters in the summary. A member
whose update diverges is re-initialised with its own draw (the base
``Rule.replace_diverged``): random search never redraws. A resume restores
the draws from the checkpoint, as every rule's hyperparameters are.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from fastpbrl.config.derived import resolved
from fastpbrl.config.fields import RunConfig
from fastpbrl.core import search_space as ss
from fastpbrl.rules.base import Rule
from fastpbrl.rules.common import search_space_of, validate_space
from fastpbrl.rules.pbt.rule import PRESETS as PBT_PRESETS
from fastpbrl.rules.registry import register


@dataclasses.dataclass
class RandomSearchRunConfig(RunConfig):
  """Random search from the prior (the control arm of Jaderberg et al.
  2017's PBT) on top of the shared run settings."""

  search_space: Optional[str] = None
  """A JSON (or YAML) file of the hyperparameters to search and their priors,
  or the same JSON object inline (format: docs/guides/search-spaces.md;
  example: examples/search_space.json); default: the agent's registered
  space. Each member's values are drawn from it once, at the start, as
  PBT's --init-hparams prior draws them."""


def control_arm(pbt_config: RunConfig) -> RandomSearchRunConfig:
  """The random-search run of a PBT preset: its shared run settings and
  search space, without PBT's own settings."""
  shared = {f.name: getattr(pbt_config, f.name)
            for f in dataclasses.fields(RunConfig)}
  return RandomSearchRunConfig(**shared,
                               search_space=pbt_config.search_space)


PRESETS = {
    'small': RandomSearchRunConfig(),
    # The control arm of ``fastpbrl pbt --preset paper`` (HalfCheetah-v5,
    # 80 members drawn from the prior): the same draws, never exploited.
    'paper': control_arm(PBT_PRESETS['paper']),
}


@register
class RandomSearch(Rule):
  """N members with hyperparameters drawn from the prior, trained
  independently: nothing happens between learner calls (the base
  ``Rule``'s ``decide``); only ``initial_hparams`` differs from ``seeds``.
  """

  name = 'random'
  help = ("Random search from the prior, PBT's control arm (Jaderberg et al. "
          '2017)')
  config_class = RandomSearchRunConfig
  presets = PRESETS

  def __init__(self, config: RandomSearchRunConfig,
               space: Optional[ss.SearchSpace] = None):
    config = resolved(config)
    super().__init__(config)
    self.space = space or search_space_of(config)

  def prepare(self, agent) -> None:
    validate_space(self.config, self.space, agent.default_hparams())

  def initial_hparams(self, key, agent, population_size):
    """Each member's draw from the prior: the draws of ``PBT`` with
    ``--init-hparams prior`` for the same ``key`` (fields outside the
    space at the agent's defaults, ``--hparams`` included)."""
    return ss.sample(key, self.space, agent.default_hparams(),
                     population_size)
