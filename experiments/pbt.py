"""Alias of ``fastpbrl pbt``, kept so that ``python -m experiments.pbt``
works from a checkout; the rule is ``fastpbrl/rules/pbt/rule.py``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('pbt')

if __name__ == '__main__':
  sys.exit(as_command('pbt', sys.argv[1:]))
