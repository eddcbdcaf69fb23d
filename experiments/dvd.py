"""Alias of ``fastpbrl dvd`` (the installed command), kept so that
``python -m experiments.dvd`` works from a checkout; the rule is
``fastpbrl/rules/dvd.py``."""

import sys
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules import registry

RULE = registry.get('dvd')
PRESETS = RULE.presets


def main(argv: Optional[Sequence[str]] = None):
  """``fastpbrl dvd`` with ``argv``."""
  return cli.train_command(RULE, argv, prog='fastpbrl dvd')


if __name__ == '__main__':
  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['dvd', *sys.argv[1:]]))  # as `fastpbrl dvd`
