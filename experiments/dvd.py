"""Alias of ``fastpbrl dvd``, kept so that ``python -m experiments.dvd``
works from a checkout; the rule is ``fastpbrl/rules/dvd/rule.py``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('dvd')

if __name__ == '__main__':
  sys.exit(as_command('dvd', sys.argv[1:]))
