"""What each ``experiments/<rule>.py`` alias holds: ``python -m
experiments.<rule>`` from a checkout is ``fastpbrl <rule>``."""

import functools

from fastpbrl.cli import parse as cli
from fastpbrl.cli.commands import main as fastpbrl_main
from fastpbrl.rules import registry


def alias(name: str):
  """``(rule class, its presets, main(argv))`` of the rule ``name``."""
  rule = registry.get(name)
  return rule, rule.presets, functools.partial(cli.train_command, rule,
                                               prog=f'fastpbrl {name}')


def as_command(name: str, argv) -> int:
  """``fastpbrl name *argv``'s exit status."""
  return fastpbrl_main([name, *argv])
