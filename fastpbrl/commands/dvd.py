"""DvD-TD3 (Parker-Holder et al. 2020): a population of TD3 policies with one
shared critic and a diversity term (minus the log-determinant of the members'
action kernel), on one machine.

    fastpbrl dvd                    # small default: Pendulum-v1, 4 members
    fastpbrl dvd --preset paper     # Humanoid-v5, 5 members, as in the 2022 paper
    fastpbrl dvd --lambda-mode schedule --lambda-start 0.5
    # Baseline: shared-critic TD3 without the term (lambda held at 0)
    fastpbrl dvd --lambda-mode schedule --lambda-start 0 --lambda-end 0

Both log rule/mean_pairwise_action_distance (tensorboard), the members'
mean action gap on a fixed batch of states, to compare their diversity.
"""

from __future__ import annotations

from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules.dvd import DvDDriver, DvDRunConfig

PRESETS = {
    'small': DvDRunConfig(),
    'paper': DvDRunConfig(env='Humanoid-v5', population_size=5,
                          env_steps=2_000_000, warmup_steps=25_000,
                          eval_every=10_000, checkpoint_every=500,
                          lambda_mode='schedule', lambda_decay_steps=500_000),
}


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, DvDDriver, argv, prog='fastpbrl dvd')

