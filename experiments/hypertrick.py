"""Alias of ``fastpbrl hypertrick`` (the installed command), kept so that
``python -m experiments.hypertrick`` works from a checkout; the implementation is
``fastpbrl/commands/hypertrick.py``."""

from fastpbrl.commands.hypertrick import *  # noqa: F403
from fastpbrl.commands.hypertrick import PRESETS, main  # noqa: F401

if __name__ == '__main__':
  import sys

  from fastpbrl.commands import main as fastpbrl_main
  sys.exit(fastpbrl_main(['hypertrick', *sys.argv[1:]]))  # as `fastpbrl hypertrick`
