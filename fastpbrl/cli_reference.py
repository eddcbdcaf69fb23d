"""The command-line reference, generated from the rules' config classes
(host-side): ``python -m fastpbrl.cli_reference > docs/reference/cli.md``.

Each flag's text is its field's docstring, the string right after the
field in the class body, which is also what ``--help`` shows (``tyro``
reads it the same way); the default is the first preset's. A test checks
that the committed page is what this prints, so the page cannot drift from
the code.
"""

from __future__ import annotations

import dataclasses

from fastpbrl.cli_help import default_text, field_docs
from fastpbrl.config import RunConfig
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


def markdown() -> str:
  """The whole reference page."""
  shared = [f.name for f in dataclasses.fields(RunConfig)]
  lines = ['# Command-line reference', '',
           'Generated from the config classes by `python -m '
           'fastpbrl.cli_reference`; `fastpbrl RULE --help` shows the same '
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
  return '\n'.join(lines) + '\n'


if __name__ == '__main__':
  print(markdown(), end='')
