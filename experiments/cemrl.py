"""Alias of ``fastpbrl cemrl`` (the installed command), kept so that
``python -m experiments.cemrl`` works from a checkout; the implementation is
``fastpbrl/commands/cemrl.py``."""

from fastpbrl.commands.cemrl import *  # noqa: F403
from fastpbrl.commands.cemrl import PRESETS, main  # noqa: F401

if __name__ == '__main__':
  import sys

  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['cemrl', *sys.argv[1:]]))  # as `fastpbrl cemrl`
