"""Alias of ``fastpbrl seeds`` (the installed command), kept so that
``python -m experiments.seeds`` works from a checkout; the implementation is
``fastpbrl/commands/seeds.py``."""

from fastpbrl.commands.seeds import *  # noqa: F403
from fastpbrl.commands.seeds import PRESETS, main  # noqa: F401

if __name__ == '__main__':
  import sys

  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['seeds', *sys.argv[1:]]))  # as `fastpbrl seeds`
