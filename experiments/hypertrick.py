"""Alias of ``fastpbrl hypertrick``, kept so that ``python -m experiments.hypertrick``
works from a checkout; the rule is ``fastpbrl/rules/hypertrick/rule.py``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('hypertrick')

if __name__ == '__main__':
  sys.exit(as_command('hypertrick', sys.argv[1:]))
