"""Alias of ``fastpbrl cemrl``, kept so that ``python -m experiments.cemrl``
works from a checkout; the rule is ``fastpbrl/rules/cemrl/rule.py``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('cemrl')

if __name__ == '__main__':
  sys.exit(as_command('cemrl', sys.argv[1:]))
