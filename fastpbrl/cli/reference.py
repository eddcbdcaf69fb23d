"""The command-line reference, generated from the rules' config classes and
the other commands' parsers (host-side): ``python -m fastpbrl.cli.reference
> docs/reference/cli.md``.

Each rule flag's text is its field's docstring, the string right after the
field in the class body, which is also what ``--help`` shows (``tyro``
reads it the same way); the default is the first preset's. The other
commands (``info``, ``evaluate``, ``bench``, ``python -m fastpbrl.launch``)
are argparse parsers: their usage line and each argument's help. A test
checks that the committed page is what this prints, so the page cannot
drift from the code. ``bench`` comes with a checkout (``benchmarks/``),
where this runs.
"""

from __future__ import annotations

import argparse
import dataclasses

from fastpbrl import launch
from fastpbrl.cli.commands import COMMANDS, bench, evaluate, info
from fastpbrl.cli.help import default_text, field_docs
from fastpbrl.config.fields import RunConfig
from fastpbrl.rules import registry


def flag_table(config, names) -> list[str]:
  """Markdown rows of ``config``'s fields ``names``."""
  docs = field_docs(type(config))
  rows = ['| flag | default | what it sets |', '|---|---|---|']
  for name in names:
    text = docs.get(name, '').replace('|', '\\|')
    flag = name.replace('_', '-')
    value = getattr(config, name)
    if isinstance(value, bool):
      flag = f'{flag}, --no-{flag}'
    rows.append(f'| `--{flag}` | `{default_text(value)}` | {text} |')
  return rows


def usage(parser: argparse.ArgumentParser) -> str:
  """``parser``'s usage line, unwrapped (whatever the terminal's width)."""
  formatter = argparse.HelpFormatter(parser.prog, width=10_000)
  formatter.add_usage(parser.usage, parser._actions,  # noqa: SLF001
                      parser._mutually_exclusive_groups)  # noqa: SLF001
  return ' '.join(formatter.format_help().split())


def argument_table(parser: argparse.ArgumentParser) -> list[str]:
  """Markdown rows of ``parser``'s arguments (``--help`` left out): the
  help text as ``--help`` prints it, and the default where it says none."""
  rows = ['| argument | what it sets |', '|---|---|']
  for action in parser._actions:  # noqa: SLF001 (argparse has no public list)
    if isinstance(action, argparse._HelpAction):  # noqa: SLF001
      continue
    names = ', '.join(action.option_strings) or action.metavar or action.dest
    if action.option_strings and action.nargs != 0:
      metavar = action.metavar or action.dest.upper()
      names += f' {metavar}' + (' ...' if action.nargs in ('+', '*') else '')
    params = {**vars(action), 'prog': parser.prog}
    if action.choices is not None:
      params['choices'] = ', '.join(map(str, action.choices))
    text = (action.help or '') % params
    if action.choices is not None and '{' not in names:
      text += f' (one or more of: {params["choices"]})' if action.nargs in (
          '+', '*') else f' (one of: {params["choices"]})'
    if action.required and action.option_strings:
      text += ' (required)'
    elif ('default' not in text and action.default not in (None, False)
          and action.option_strings):
      text += f' (default: {default_text(action.default)})'
    text = text.replace('|', '\\|')
    rows.append(f'| `{names}` | {text} |')
  return rows


def command_section(name: str, parser: argparse.ArgumentParser,
                    text: str) -> list[str]:
  """The section of a command that is an argparse parser."""
  epilog = [parser.epilog.rstrip()] if parser.epilog else []
  return ['', f'## {name}', '', f'{text}.', '', '```', usage(parser),
          *epilog, '```', '', *argument_table(parser)]


def other_commands() -> list[str]:
  """The sections of ``info``, ``evaluate``, ``bench`` and ``python -m
  fastpbrl.launch``."""
  parsers = {'info': info.parser(), 'evaluate': evaluate.parser(),
             'bench': bench.load_benchmark().build_parser()}
  lines = []
  for name, parser in parsers.items():
    text = COMMANDS[name][1]
    if name == 'bench':
      text += ('; `fastpbrl bench [flags]` runs `python -m '
               'benchmarks.update_speed [flags]`')
    lines += command_section(f'fastpbrl {name}', parser, text[0].upper()
                             + text[1:])
  lines += command_section(
      'python -m fastpbrl.launch', launch.parser(),
      'Runs a command as several JAX processes on this machine '
      '([several devices and processes](../guides/scale.md)); what '
      'follows `--` is the command')
  return lines


def markdown() -> str:
  """The whole reference page."""
  shared = [f.name for f in dataclasses.fields(RunConfig)]
  lines = ['# Command-line reference', '',
           'Generated from the config classes and the commands\' parsers '
           'by `python -m '
           'fastpbrl.cli.reference`; `fastpbrl RULE --help` shows the same '
           'text. A preset (`--preset NAME`) changes the defaults, which '
           '`fastpbrl info RULE` lists; `--config FILE` (JSON or YAML: '
           'setting names to values, a run\'s `config.json` included) '
           'overrides them; `--resume DIR` takes the run\'s saved settings '
           'as defaults; flags override all of these, and '
           '`--print-config` prints the result without running.', '',
           '## Flags of every rule', '',
           *flag_table(RunConfig(), shared)]
  for rule in registry.builtins():
    config = next(iter(rule.presets.values()))
    own = [f.name for f in dataclasses.fields(config)
           if f.name not in shared or getattr(config, f.name)
           != getattr(RunConfig(), f.name)]
    lines += ['', f'## fastpbrl {rule.name}', '', f'{rule.help}. Presets: '
              f'{", ".join(rule.presets)}. Its own flags, and the shared '
              'flags whose default it changes:', '',
              *flag_table(config, own)]
  lines += other_commands()
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  print(markdown(), end='')
