"""Alias of ``fastpbrl random``, kept so that ``python -m experiments.random``
works from a checkout; the rule is ``fastpbrl/rules/random_search.py``.

Run it with ``-m``: ``python experiments/random.py`` would put this folder
first on ``sys.path``, where this file hides the standard library's
``random``."""

import sys

from experiments._alias import alias, as_command

RULE, PRESETS, main = alias('random')

if __name__ == '__main__':
  sys.exit(as_command('random', sys.argv[1:]))
