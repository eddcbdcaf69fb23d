"""Alias of ``fastpbrl seeds``, kept so that ``python -m experiments.seeds``
works from a checkout; the rule is ``fastpbrl/rules/seeds.py``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('seeds')

if __name__ == '__main__':
  sys.exit(as_command('seeds', sys.argv[1:]))
