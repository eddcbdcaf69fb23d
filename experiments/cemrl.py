"""Alias of ``fastpbrl cemrl`` (the installed command), kept so that
``python -m experiments.cemrl`` works from a checkout; the rule is
``fastpbrl/rules/cemrl.py``."""

import sys
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules import registry

RULE = registry.get('cemrl')
PRESETS = RULE.presets


def main(argv: Optional[Sequence[str]] = None):
  """``fastpbrl cemrl`` with ``argv``."""
  return cli.train_command(RULE, argv, prog='fastpbrl cemrl')


if __name__ == '__main__':
  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['cemrl', *sys.argv[1:]]))  # as `fastpbrl cemrl`
