"""HyperTrick (Heinrich & Frosio): hyperparameter search with early
termination. Configurations train in phases; at each phase's end the late
reporters in the lower quantile are terminated and their slot restarts with
fresh parameters and newly sampled hyperparameters. Ends with the best
configuration found.

    fastpbrl hypertrick                  # small default: TD3, Pendulum-v1
    fastpbrl hypertrick --preset paper   # HalfCheetah-v5, 100 configurations, 8 slots
"""

from __future__ import annotations

from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules.hypertrick import HyperTrickDriver, HyperTrickRunConfig

PRESETS = {
    'small': HyperTrickRunConfig(),
    'paper': HyperTrickRunConfig(env='HalfCheetah-v5', population_size=8,
                                 num_workers=100, num_phases=5,
                                 phase_update_steps=100_000,
                                 env_steps=50_000_000, warmup_steps=25_000,
                                 eval_every=10_000, checkpoint_every=500),
}


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, HyperTrickDriver, argv, prog='fastpbrl hypertrick')

