"""Alias of ``fastpbrl dvd`` (the installed command), kept so that
``python -m experiments.dvd`` works from a checkout; the implementation is
``fastpbrl/commands/dvd.py``."""

from fastpbrl.commands.dvd import *  # noqa: F403
from fastpbrl.commands.dvd import PRESETS, main  # noqa: F401

if __name__ == '__main__':
  import sys

  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['dvd', *sys.argv[1:]]))  # as `fastpbrl dvd`
