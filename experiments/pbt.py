"""Alias of ``fastpbrl pbt`` (the installed command), kept so that
``python -m experiments.pbt`` works from a checkout; the implementation is
``fastpbrl/commands/pbt.py``."""

from fastpbrl.commands.pbt import *  # noqa: F403
from fastpbrl.commands.pbt import PRESETS, main  # noqa: F401

if __name__ == '__main__':
  import sys

  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['pbt', *sys.argv[1:]]))  # as `fastpbrl pbt`
