"""Many seeds: N independent members at the agent's published defaults,
no population rule; the baseline every rule is measured against
(``python -m benchmarks.learning``).

    fastpbrl seeds                        # TD3, Pendulum-v1, 4 seeds
    fastpbrl seeds --agent sac --env Hopper-v5 --population-size 8
"""

from __future__ import annotations

from fastpbrl.config.fields import RunConfig
from fastpbrl.rules.base import Rule
from fastpbrl.rules.registry import register


@register
class Seeds(Rule):
  """N independent members at the agent's published defaults, each with its
  own initial parameters, env and exploration streams and replay: N seeds
  of one agent trained at once. Everything is the base ``Rule``'s."""

  name = 'seeds'
  help = "N independent members at the agent's published defaults"
  config_class = RunConfig
  presets = {'small': RunConfig()}
