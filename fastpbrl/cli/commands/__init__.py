"""The installed ``fastpbrl`` command (host-side): ``fastpbrl <command> ...``.

A rule of the registry (``fastpbrl.rules``) is a command of its own, its
flags generated from its config class; the other commands are modules of
this package with a ``main(argv)``:

    fastpbrl pbt|cemrl|dvd|hypertrick|seeds|random [flags]
                                                       train (``--help`` lists the flags)
    fastpbrl mymod:MyRule [flags]                      train with a rule of your own
    fastpbrl info [AGENT|RULE] [--env ENV]            agents, rules, hyperparameters, presets
    fastpbrl evaluate RUN_DIR [--member best|INDEX] [--episodes K] [--video-dir DIR]
    fastpbrl bench [flags]                             the learner update-speed benchmark

``python -m experiments.<rule>`` from a checkout is an alias of
``fastpbrl <rule>``. A setting that a command refuses ends it with one line,
``error: ...``, and exit status 2, before any process starts.

``fastpbrl --help`` imports nothing of JAX: a command's module (a rule's,
the run loop, ``fastpbrl.cli.parse``) is imported through ``_load`` when the
command runs, and the rules' help lines are read from their source
(``fastpbrl.rules.builtin``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Optional, Sequence

from fastpbrl import __version__
from fastpbrl.rules import builtin

# Commands that are not rules: name -> (module, one line for --help).
COMMANDS = {
    'info': ('fastpbrl.cli.commands.info',
             'the agents and rules; an agent\'s hyperparameters, a rule\'s '
             'presets'),
    'evaluate': ('fastpbrl.cli.commands.evaluate',
                 'mean and std of return of a trained member (and a video)'),
    'bench': ('fastpbrl.cli.commands.bench',
              'learner update-speed benchmark (from a checkout)'),
}


def usage() -> str:
  """``fastpbrl --help``: the registered rules, then the other commands."""
  rules = list(builtin.help_lines().items())
  others = [(name, text) for name, (_, text) in COMMANDS.items()]
  width = max(len(name) for name, _ in rules + others + [('module:Rule', '')])
  lines = ['usage: fastpbrl <command> [flags]   (fastpbrl <command> --help)',
           '', 'train a population with a rule:']
  lines += [f'  {name:<{width}}  {text}' for name, text in rules]
  lines += [f'  {"module:Rule":<{width}}  a rule of your own '
            '(fastpbrl.rules.register; examples/halving.py)', '',
            'other commands:']
  lines += [f'  {name:<{width}}  {text}' for name, text in others]
  return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs ``fastpbrl <command> ...``; returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ('-h', '--help'):
    print(usage(), file=sys.stdout if argv else sys.stderr)
    return 0 if argv else 2
  if argv[0] == '--version':
    print(f'fastpbrl {__version__}')
    return 0
  name, rest = argv[0], argv[1:]
  try:
    if name in COMMANDS:
      _load(COMMANDS[name][0]).main(rest)
    else:
      _load('fastpbrl.cli.parse').train_command(_rule(name), rest,
                                          prog=f'fastpbrl {name}')
  except SystemExit as e:
    if isinstance(e.code, str):  # a one-line 'error: ...' from a flag check
      print(e.code, file=sys.stderr)
      return 2
    return 0 if e.code is None else e.code
  return 0


def _load(module: str):
  """``module``, imported when its command runs.

  The one deliberate lazy import of the command line, for start-up speed
  (not to dodge a cycle): JAX, the run loop and the rules take seconds to
  import, which ``fastpbrl --help`` need not wait for.
  """
  return importlib.import_module(module)


def _rule(name: str):
  """The rule ``fastpbrl NAME`` names; ``SystemExit`` with one line if none."""
  registry = _load('fastpbrl.rules.registry')
  try:
    return registry.get(name)
  except ValueError as e:
    if ':' in name:
      raise SystemExit(f'error: {e}') from None
    raise SystemExit(
        f'error: unknown command {name!r}; choose one of '
        f'{", ".join((*registry.known(), *COMMANDS))}, or give '
        'module:Rule for a rule of your own') from None


def console_script() -> None:
  """The ``[project.scripts]`` entry point."""
  try:
    sys.exit(main())
  except BrokenPipeError:  # output piped into a reader that left: head
    # Python's own advice: point stdout at devnull so its flush at exit
    # does not fail again.
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(1)
