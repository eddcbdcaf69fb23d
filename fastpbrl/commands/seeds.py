"""N independent members at the agent's published defaults: many seeds of
one agent at once, and the baseline the population rules are measured
against (``python -m benchmarks.learning``).

    fastpbrl seeds                        # TD3, Pendulum-v1, 4 seeds
    fastpbrl seeds --agent sac --env Hopper-v5 --population-size 8
"""

from __future__ import annotations

from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules.seeds import SeedsDriver
from fastpbrl.run import RunConfig

PRESETS = {'small': RunConfig()}


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, SeedsDriver, argv, prog='fastpbrl seeds')

