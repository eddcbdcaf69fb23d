"""Alias of ``fastpbrl seeds`` (the installed command), kept so that
``python -m experiments.seeds`` works from a checkout; the rule is
``fastpbrl/rules/seeds.py``."""

import sys
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules import registry

RULE = registry.get('seeds')
PRESETS = RULE.presets


def main(argv: Optional[Sequence[str]] = None):
  """``fastpbrl seeds`` with ``argv``."""
  return cli.train_command(RULE, argv, prog='fastpbrl seeds')


if __name__ == '__main__':
  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['seeds', *sys.argv[1:]]))  # as `fastpbrl seeds`
