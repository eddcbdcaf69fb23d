"""Population Based Training of TD3 / SAC / DQN members on one machine.

    fastpbrl pbt                    # small default: TD3, Pendulum-v1, 4 members
    fastpbrl pbt --preset paper     # the 2022 paper: HalfCheetah-v5, 80 members
    fastpbrl pbt --preset atari     # Nature DQN on ALE/Pong-v5 (pip install -e '.[atari]')
    fastpbrl pbt --resume runs/pbt-td3-...   # continue a killed run
    fastpbrl pbt --rerun-lineage runs/pbt-td3-.../lineage.jsonl --rerun-member 3
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.agents import dqn
from fastpbrl.population import pbt as pbt_lib
from fastpbrl.rules.pbt import PBTDriver, PBTRunConfig, ScheduleDriver
from fastpbrl.run import ConfigError, RunConfig


@dataclasses.dataclass
class PBTScript(PBTRunConfig):
  rerun_lineage: Optional[str] = None
  """A lineage.jsonl of an earlier PBT run: re-run one member's schedule alone."""
  rerun_member: int = 0
  """With --rerun-lineage: the member whose hyperparameter schedule to re-run."""


PRESETS = {
    'small': PBTScript(),
    'paper': PBTScript(env='HalfCheetah-v5', population_size=80,
                       env_steps=1_000_000, warmup_steps=25_000,
                       ready_after=100_000, eval_every=10_000,
                       checkpoint_every=500),
    # Nature DQN's schedule (Mnih et al. 2015, Extended Data Table 1; see
    # fastpbrl/agents/dqn.py): 50M frames = 12.5M agent steps per member,
    # one update per 4 steps, 50k random steps first, a 100k replay per
    # member (5.3 GiB each); PBT decides every 500k env steps.
    'atari': PBTScript(agent='dqn', env='ALE/Pong-v5', population_size=4,
                       env_steps=12_500_000, **dqn.NATURE_ATARI_RUN,
                       ready_after=125_000, eval_every=125_000,
                       eval_episodes=5, checkpoint_every=2_500),
}


def _driver(config: PBTScript):
  if not config.rerun_lineage:
    return PBTDriver(config)
  # Re-run one member's schedule: a population of one with the run settings.
  try:
    steps = pbt_lib.schedule(config.rerun_lineage, config.rerun_member)
  except (OSError, ValueError, KeyError) as e:
    raise ConfigError(f'--rerun-lineage {config.rerun_lineage} '
                      f'--rerun-member {config.rerun_member}: {e}') from None
  single = RunConfig(**{**{f.name: getattr(config, f.name)
                           for f in dataclasses.fields(RunConfig)},
                        'population_size': 1})
  return ScheduleDriver(single, steps)


def main(argv: Optional[Sequence[str]] = None):
  return cli.main(PRESETS, __doc__, _driver, argv, prog='fastpbrl pbt')

