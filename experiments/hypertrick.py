"""Alias of ``fastpbrl hypertrick`` (the installed command), kept so that
``python -m experiments.hypertrick`` works from a checkout; the rule is
``fastpbrl/rules/hypertrick.py``."""

import sys
from typing import Optional, Sequence

from fastpbrl import cli
from fastpbrl.rules import registry

RULE = registry.get('hypertrick')
PRESETS = RULE.presets


def main(argv: Optional[Sequence[str]] = None):
  """``fastpbrl hypertrick`` with ``argv``."""
  return cli.train_command(RULE, argv, prog='fastpbrl hypertrick')


if __name__ == '__main__':
  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['hypertrick', *sys.argv[1:]]))  # as `fastpbrl hypertrick`
