"""CEM-RL (Pourchot & Sigaud 2019) with a shared TD3 critic, vectorized over
the population as in the 2022 paper (section 4.2).

    fastpbrl cemrl                    # small default: Pendulum-v1, 6 members
    fastpbrl cemrl --preset paper     # HalfCheetah-v5, 10 members, 1M env steps

The budget, --total-env-steps, counts the env steps of the whole population
together, as CEM-RL states budgets (the paper: 1M on HalfCheetah, i.e.
100,000 per member with 10 members). --warmup-steps stays per member.
"""

from __future__ import annotations

from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules.cemrl import CEMRLDriver, CEMRLRunConfig

PRESETS = {
    'small': CEMRLRunConfig(),
    # The paper's HalfCheetah run: 10 members, 1M env steps in all, and
    # 10,000 warm-up steps in all (its start_steps).
    'paper': CEMRLRunConfig(env='HalfCheetah-v5', population_size=10,
                            total_env_steps=1_000_000, warmup_steps=1_000,
                            checkpoint_every=500),
}


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, CEMRLDriver, argv, prog='fastpbrl cemrl')

