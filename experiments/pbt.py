"""Alias of ``fastpbrl pbt`` (the installed command), kept so that
``python -m experiments.pbt`` works from a checkout; the rule is
``fastpbrl/rules/pbt.py``."""

import sys
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules import registry

RULE = registry.get('pbt')
PRESETS = RULE.presets


def main(argv: Optional[Sequence[str]] = None):
  """``fastpbrl pbt`` with ``argv``."""
  return cli.train_command(RULE, argv, prog='fastpbrl pbt')


if __name__ == '__main__':
  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['pbt', *sys.argv[1:]]))  # as `fastpbrl pbt`
