"""CEM-RL (Pourchot & Sigaud 2019) with a shared TD3 critic, vectorized over
the population as in the 2022 paper (section 4.2).

    python -m experiments.cemrl                    # small default: Pendulum-v1, 6 members
    python -m experiments.cemrl --preset paper     # HalfCheetah-v5, 10 members
"""

from __future__ import annotations

from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.drivers import CEMRLDriver, CEMRLRunConfig

PRESETS = {
    'small': CEMRLRunConfig(),
    'paper': CEMRLRunConfig(env='HalfCheetah-v5', population_size=10,
                            env_steps=1_000_000, warmup_steps=10_000,
                            generation_calls=100, checkpoint_every=500),
}


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, CEMRLDriver, argv)


if __name__ == '__main__':
  main()
