"""The installed ``fastpbrl`` command (host-side): ``fastpbrl <command> ...``.

Each sub-command is a module of this package with a ``main(argv)``:

    fastpbrl pbt|cemrl|dvd|hypertrick|seeds [flags]   train (``--help`` lists the flags)
    fastpbrl evaluate RUN_DIR [--member best|INDEX] [--episodes K] [--video-dir DIR]
    fastpbrl bench [flags]                             the learner update-speed benchmark

``python -m experiments.<rule>`` from a checkout is an alias of
``fastpbrl <rule>``. A setting that a command refuses ends it with one line,
``error: ...``, and exit status 2, before any process starts.
"""

from __future__ import annotations

import importlib
import sys
from typing import Optional, Sequence

# name -> (module, one line for ``fastpbrl --help``)
COMMANDS = {
    'pbt': ('fastpbrl.commands.pbt',
            'Population Based Training of TD3 / SAC / DQN members'),
    'cemrl': ('fastpbrl.commands.cemrl',
              'CEM-RL: CEM over TD3 policies with a shared critic'),
    'dvd': ('fastpbrl.commands.dvd',
            'DvD-TD3: shared critic, diversity term, bandit over lambda'),
    'hypertrick': ('fastpbrl.commands.hypertrick',
                   'HyperTrick: phased search with early termination'),
    'seeds': ('fastpbrl.commands.seeds',
              'N independent members at the agent\'s published defaults'),
    'evaluate': ('fastpbrl.commands.evaluate',
                 'mean and std of return of a trained member (and a video)'),
    'bench': ('fastpbrl.commands.bench',
              'learner update-speed benchmark (from a checkout)'),
}


def usage() -> str:
  width = max(map(len, COMMANDS))
  lines = ['usage: fastpbrl <command> [flags]   (fastpbrl <command> --help)',
           '', 'commands:']
  lines += [f'  {name:<{width}}  {text}' for name, (_, text) in COMMANDS.items()]
  return '\n'.join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
  """Runs ``fastpbrl <command> ...``; returns the exit status."""
  argv = list(sys.argv[1:] if argv is None else argv)
  if not argv or argv[0] in ('-h', '--help'):
    print(usage(), file=sys.stdout if argv else sys.stderr)
    return 0 if argv else 2
  if argv[0] == '--version':
    from fastpbrl import __version__  # noqa: PLC0415
    print(f'fastpbrl {__version__}')
    return 0
  name, rest = argv[0], argv[1:]
  if name not in COMMANDS:
    print(f'error: unknown command {name!r}; choose one of '
          f'{", ".join(COMMANDS)}', file=sys.stderr)
    return 2
  module = importlib.import_module(COMMANDS[name][0])
  try:
    module.main(rest)
  except SystemExit as e:
    if isinstance(e.code, str):  # a one-line 'error: ...' from a flag check
      print(e.code, file=sys.stderr)
      return 2
    return 0 if e.code is None else e.code
  return 0


def console_script() -> None:
  """The ``[project.scripts]`` entry point."""
  sys.exit(main())
