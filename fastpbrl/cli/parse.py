"""Command-line parsing for the experiment scripts (host-side).

Flags come from the config dataclass through ``tyro`` (each field's
docstring is its ``--help`` line, underscores become dashes). A ``--preset``
flag, read first, picks the dataclass instance whose values are the defaults
that the other flags then override: ``--preset paper --population-size 40``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import json
import os
import sys
import traceback
from typing import Mapping, Optional, Sequence, TypeVar

import tyro

from fastpbrl.cli import help as cli_help
from fastpbrl.config.derived import resolved
from fastpbrl.config.errors import ConfigError, StorageError
from fastpbrl.config.saved import file_config, saved_config
from fastpbrl.devices import distributed
from fastpbrl.logs.logging import setup_logging
from fastpbrl.run import build
from fastpbrl.run.signals import ForcedExit, RunInterrupted

C = TypeVar('C')


def run(config, rule):
  """``fastpbrl.run.main.run(config, rule)``, the run loop imported when a run
  starts: a deliberate lazy import for start-up speed, so that ``fastpbrl
  RULE --help`` and a refused flag skip importing the loop, the checkpoints
  and the loggers (a fifth of a second)."""
  return importlib.import_module('fastpbrl.run.main').run(config, rule)


def parse(presets: Mapping[str, C], description: str,
          argv: Optional[Sequence[str]] = None,
          prog: Optional[str] = None) -> C:
  """Parses ``argv`` into a copy of the chosen preset's config."""
  argv = list(sys.argv[1:] if argv is None else argv)
  names = list(presets)
  pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
  pre.add_argument('--preset', default=names[0])
  pre.add_argument('--resume', default=None)
  pre.add_argument('--config', default=None)
  pre.add_argument('--print-config', action='store_true')
  try:
    known, rest = pre.parse_known_args(argv)
  except argparse.ArgumentError as e:  # --preset or --resume with no value
    raise SystemExit(f'error: {e}') from None
  if known.preset not in presets:
    raise SystemExit(f'error: --preset {known.preset!r} is not one of '
                     f'{", ".join(names)}')
  check_flags(type(presets[names[0]]), rest, prog)
  default = presets[known.preset]
  source = f'--preset {known.preset}'
  if known.resume is not None and known.config is not None:
    raise SystemExit('error: --config and --resume: a resume takes the '
                     'run\'s saved settings; give changes as flags')
  try:
    if known.config is not None:
      default = file_config(known.config, default)
      source = f'--preset {known.preset} with {known.config}'
    if known.resume is not None:
      default = saved_config(known.resume, default)
      rest += ['--resume', known.resume]
      source = f'the settings saved in {known.resume}'
  except ConfigError as e:
    raise SystemExit(f'error: {e}') from None
  if '-h' in rest or '--help' in rest:
    print(cli_help.help_text(default, prog or 'fastpbrl', description, names,
                             source), end='')
    raise SystemExit(0)
  config = tyro.cli(type(default), default=default, args=rest,
                    description=description, prog=prog)
  if known.print_config:
    print(json.dumps(dataclasses.asdict(resolved(config)), indent=2))
    raise SystemExit(0)
  return config


def known_flags(config_class) -> list[str]:
  """The flags ``tyro`` makes of ``config_class``'s fields (``--x-y``,
  and ``--no-x-y`` for a bool), with ``--help``."""
  flags = ['--help', '--preset', '--resume', '--config', '--print-config']
  for field in dataclasses.fields(config_class):
    name = field.name.replace('_', '-')
    flags.append(f'--{name}')
    if field.type in (bool, 'bool'):
      flags.append(f'--no-{name}')
  return flags


def check_flags(config_class, argv: Sequence[str],
                prog: Optional[str]) -> None:
  """Refuses, in one line with the nearest flags, a flag that
  ``config_class`` has not."""
  flags = known_flags(config_class)
  for arg in argv:
    flag = arg.split('=', 1)[0]
    if not flag.startswith('--') or flag in flags or flag == '--':
      continue
    near = difflib.get_close_matches(flag, flags, n=2, cutoff=0.75)
    hint = (f'did you mean {" or ".join(near)}?' if near else
            f'{prog or "the command"} --help lists the flags; an agent\'s '
            'hyperparameter is set with --hparams NAME=VALUE (fastpbrl info '
            'AGENT lists them)')
    raise SystemExit(f'error: unknown flag {flag}; {hint}')
  problem = cli_help.check_values(config_class, argv)
  if problem is not None:
    raise SystemExit(f'error: {problem}')


def train_command(rule_cls, argv: Optional[Sequence[str]] = None,
                  prog: Optional[str] = None):
  """``fastpbrl <rule> [flags]``: parses the flags of the registered rule
  ``rule_cls`` (its ``config_class``, ``--preset`` from its ``presets``,
  the description from its module's docstring), builds the rule and runs;
  a configuration error exits with a one-line message (status 2) before
  any process starts.

  SIGINT / SIGTERM (``fastpbrl.run.signals``): the run checkpoints and this
  exits with one line (the checkpoint, the command that resumes it) and
  status 130 / 143.
  """
  module = sys.modules.get(rule_cls.__module__)
  description = ((module.__doc__ if module is not None else None)
                 or rule_cls.__doc__ or rule_cls.help)
  config = parse(rule_cls.presets, description, argv,
                 prog or f'fastpbrl {rule_cls.name}')
  try:
    # Before any JAX operation, joining processes included: one host
    # device per core on the device path.
    build.use_every_core(config)
    # Several processes (python -m fastpbrl.launch, srun): join them.
    processes = distributed.initialize_if_launched()
  except (ConfigError, ValueError) as e:
    raise SystemExit(f'error: {e}') from None
  setup_logging(None if processes is None else processes.process_id)
  try:
    rule = rule_cls.from_config(config)
    return run(rule.config, rule)
  except ConfigError as e:
    raise SystemExit(f'error: {e}') from None
  except StorageError as e:
    print(f'error: {e}', file=sys.stderr, flush=True)
    sys.stdout.flush()
    # Every process and segment is released by now; skip the interpreter's
    # exit handlers, where libraries whose writes failed (tensorboardX's
    # flush, orbax's writer tasks) would repeat the same disk error in
    # tracebacks after this line.
    os._exit(1)
  except (RunInterrupted, ForcedExit) as e:
    print(str(e), file=sys.stderr, flush=True)
    raise SystemExit(e.exit_status) from None
  except KeyboardInterrupt:  # before the run's handlers were installed
    print('interrupted before training started; nothing to save',
          file=sys.stderr, flush=True)
    raise SystemExit(130) from None
  except Exception:
    if processes is None:
      raise
    # Over several processes an ordinary exit waits at jax's shutdown
    # barrier for the others, which wait in a collective for this one: a
    # hang of minutes. Everything of this process is closed by now; exit at
    # once, so the launcher (or srun) stops the others.
    traceback.print_exc()
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)
