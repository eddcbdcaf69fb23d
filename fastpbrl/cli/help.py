"""What the training commands' ``--help`` says, and the checks of flag
values tyro would refuse in a box of its own (host-side; not jittable).

Each flag's text is its config field's docstring (the string right after
the field in the class body, read from the source); the flags are grouped
(the shared settings by ``GROUPS``, a rule's own settings last), each
default is printed once (the value the chosen preset, ``--config`` file or
resumed run gives), and an enumeration (a ``Literal`` field) lists its
choices.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import shutil
import textwrap
import typing
from typing import Any, Optional, Sequence

# The shared settings (``RunConfig``'s fields) by topic, in --help's order.
GROUPS = (
    ('what to train', ('env', 'agent', 'population_size', 'seed',
                       'env_steps', 'hparams', 'agent_settings')),
    ('learning', ('warmup_steps', 'update_to_data_ratio',
                  'warmup_counts_as_data', 'hidden_sizes', 'network_init',
                  'batch_size', 'steps_per_call', 'replay_capacity',
                  'shared_replay', 'replay_location')),
    ('evaluation', ('eval_every', 'eval_episodes')),
    ('run folder, checkpoints and tracking', ('run_dir', 'resume',
                                              'checkpoint_every',
                                              'checkpoint_replay', 'track',
                                              'progress')),
    ('processes and devices', ('num_actors', 'actor_timeout',
                               'vector_envs', 'envs_per_member', 'interleave', 'devices')),
)

# Flags every training command reads before the config's own.
COMMAND_FLAGS = (
    ('-h, --help', 'Show this message and exit.'),
    ('--config FILE', 'Settings from a JSON or YAML file (names as the '
     'flags; a run\'s config.json is one); flags override them.'),
    ('--print-config', 'Print the resolved settings as JSON and exit '
     'without running.'),
)


def field_docs(config_class) -> dict[str, str]:
  """``{field: docstring}`` of ``config_class`` and its bases (a field's
  own class wins), read from the source as ``tyro`` does."""
  docs: dict[str, str] = {}
  for cls in reversed(config_class.__mro__):
    if not dataclasses.is_dataclass(cls):
      continue
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    for node, after in zip(body, body[1:]):
      if (isinstance(node, ast.AnnAssign)
          and isinstance(node.target, ast.Name)
          and isinstance(after, ast.Expr)
          and isinstance(after.value, ast.Constant)
          and isinstance(after.value.value, str)):
        docs[node.target.id] = ' '.join(after.value.value.split())
  return docs


def choices(config_class) -> dict[str, tuple]:
  """``{field: allowed values}`` of ``config_class``'s ``Literal`` fields
  (``Optional[Literal[...]]`` included)."""
  hints = typing.get_type_hints(config_class)
  found = {}
  for field in dataclasses.fields(config_class):
    kind = hints[field.name]
    if typing.get_origin(kind) is typing.Union:
      inner = [a for a in typing.get_args(kind) if a is not type(None)]
      kind = inner[0] if len(inner) == 1 else kind
    if typing.get_origin(kind) is typing.Literal:
      found[field.name] = typing.get_args(kind)
  return found


def metavar(kind: Any) -> str:
  """The placeholder of a flag's value: ``INT``, ``{a,b}``, ``INT [INT ...]``."""
  if typing.get_origin(kind) is typing.Union:
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    return metavar(inner[0]) if len(inner) == 1 else 'VALUE'
  if typing.get_origin(kind) is typing.Literal:
    return '{' + ','.join(str(a) for a in typing.get_args(kind)) + '}'
  if typing.get_origin(kind) is tuple:
    one = metavar(typing.get_args(kind)[0])
    return f'{one} [{one} ...]'
  return {int: 'INT', float: 'FLOAT', str: 'STR'}.get(kind, 'VALUE')


def default_text(value) -> str:
  """A default as the command line spells it."""
  if isinstance(value, (tuple, list)):
    return ' '.join(str(v) for v in value) or '(none)'
  return 'None' if value is None else str(value)


def flag_entries(config) -> dict[str, tuple[str, str]]:
  """``{field: (flag with its value's placeholder, help text with the
  default)}`` of ``config``'s fields; the default is left out where the
  text already says what an unset (None) value means."""
  hints = typing.get_type_hints(type(config))
  docs = field_docs(type(config))
  entries = {}
  for field in dataclasses.fields(config):
    flag = '--' + field.name.replace('_', '-')
    value = getattr(config, field.name)
    text = docs.get(field.name, '')
    if hints[field.name] is bool:
      flag = f'{flag}, --no-{flag[2:]}'
    else:
      flag = f'{flag} {metavar(hints[field.name])}'
    if not (value is None and 'default' in text.lower()):
      text = f'{text} Default: {default_text(value)}.'.strip()
    entries[field.name] = (flag, text)
  return entries


def wrap_entry(flag: str, text: str, width: int, column: int = 30) -> list:
  """One flag's lines: the flag, its text wrapped beside it (or below it,
  when the flag is wider than the column)."""
  indent = ' ' * column
  first = f'  {flag}'
  if len(first) + 2 > column:
    return [first] + textwrap.wrap(text, width, initial_indent=indent,
                                   subsequent_indent=indent)
  return textwrap.wrap(text, width,
                       initial_indent=first.ljust(column),
                       subsequent_indent=indent) or [first]


def help_text(config, prog: str, description: str, presets: Sequence[str],
              source: str, width: Optional[int] = None) -> str:
  """The whole ``--help`` of a training command: usage, description, the
  command's own flags, the shared settings by group, then the rule's own;
  defaults are ``config``'s (from ``source``: the preset, file or run)."""
  width = width or min(100, shutil.get_terminal_size((100, 24)).columns)
  entries = flag_entries(config)
  lines = [f'usage: {prog} [flags]', '']
  for paragraph in description.replace('``', '').strip().split('\n\n'):
    if paragraph.startswith('    '):  # an example block: as written
      lines += [paragraph, '']
    else:
      lines += textwrap.wrap(' '.join(paragraph.split()), width) + ['']
  lines += [f'Defaults now: {source}.', '', 'command:']
  command = [(f'--preset {{{",".join(presets)}}}',
              'The defaults to start from (fastpbrl info RULE lists each '
              f'preset\'s values). Default: {presets[0]}.'),
             ('--resume DIR', 'Continue the run in DIR from its last '
              'checkpoint, with its saved settings; flags change them.'),
             *COMMAND_FLAGS]
  for flag, text in command:
    lines += wrap_entry(flag, text, width)
  shown = set()
  for title, names in GROUPS:
    names = [n for n in names if n in entries and n != 'resume']
    lines += ['', f'{title}:']
    for name in names:
      lines += wrap_entry(*entries[name], width)
    shown.update(names)
  shown.add('resume')
  own = [n for n in entries if n not in shown]
  if own:
    lines += ['', f'{prog}, its own settings:']
    for name in own:
      lines += wrap_entry(*entries[name], width)
  return '\n'.join(lines) + '\n'


def given_values(flag: str, argv: Sequence[str], many: bool) -> list:
  """The values ``argv`` gives ``flag``, one list per occurrence:
  ``--flag V``, ``--flag=V``, or (``many``) ``--flag V1 V2 ...``."""
  found = []
  for i, arg in enumerate(argv):
    if arg.startswith(flag + '='):
      found.append([arg[len(flag) + 1:]])
    elif arg == flag:
      values = []
      for value in argv[i + 1:]:
        if value.startswith('--') or (values and not many):
          break
        values.append(value)
      found.append(values)
  return found


# A scalar type -> (its parser, how a message names it).
_PARSERS = {int: (int, 'an integer'), float: (float, 'a number')}


def value_problem(name: str, kind: Any, values: Sequence[str]
                  ) -> Optional[str]:
  """Why ``values`` cannot be the field ``name`` of type ``kind`` (one
  line naming the flag), or None."""
  flag = '--' + name.replace('_', '-')
  if typing.get_origin(kind) is typing.Union:
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    if len(inner) != 1 or list(values) == ['None']:
      return None
    kind = inner[0]
  if typing.get_origin(kind) is tuple:
    kind = typing.get_args(kind)[0]
  for value in values:
    if typing.get_origin(kind) is typing.Literal:
      allowed = [str(a) for a in typing.get_args(kind)]
      if value not in allowed:
        return (f'{flag} must be one of {", ".join(allowed)}, got '
                f'{value!r}')
    elif kind in _PARSERS:
      parse, what = _PARSERS[kind]
      try:
        parse(value)
      except ValueError:
        return f'{flag} must be {what}, got {value!r}'
  return None


def check_values(config_class, argv: Sequence[str]) -> Optional[str]:
  """One line naming the flag if ``argv`` gives a number flag something
  that is not one, or an enumeration a value it has not; else None (the
  ranges are the config checks' business)."""
  hints = typing.get_type_hints(config_class)
  for field in dataclasses.fields(config_class):
    kind = hints[field.name]
    if kind is bool:
      continue
    flag = '--' + field.name.replace('_', '-')
    many = 'tuple' in str(kind)
    for values in given_values(flag, argv, many):
      problem = value_problem(field.name, kind, values)
      if problem is not None:
        return problem
  return None
