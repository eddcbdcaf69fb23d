"""The built-in rules by name, and each one's ``help`` line, known without
importing the rules (host-side; imports nothing of JAX).

``fastpbrl --help`` lists the rules; importing a rule's module imports JAX,
the learner and the agents (seconds), so the help lines are read from the
modules' source instead: the string assigned to ``help`` in the class body
that assigns ``name``. ``tests/test_commands.py`` checks that these are the
imported classes' ``help``.
"""

from __future__ import annotations

import ast
import importlib.util

# Built-in rules: name -> the module whose import registers it.
BUILTIN = {'pbt': 'fastpbrl.rules.pbt.rule',
           'cemrl': 'fastpbrl.rules.cemrl.rule',
           'dvd': 'fastpbrl.rules.dvd.rule',
           'hypertrick': 'fastpbrl.rules.hypertrick.rule',
           'seeds': 'fastpbrl.rules.seeds',
           'random': 'fastpbrl.rules.random_search'}


def help_lines() -> dict[str, str]:
  """``{name: help}`` of every built-in rule, in ``BUILTIN``'s order."""
  return {name: _class_help(module, name) for name, module in BUILTIN.items()}


def _class_help(module: str, name: str) -> str:
  """The ``help`` string of the class in ``module`` whose ``name`` is
  ``name``, read from the module's source.

  Raises:
    LookupError: no such class with a literal ``help`` string.
  """
  with open(importlib.util.find_spec(module).origin, encoding='utf-8') as f:
    tree = ast.parse(f.read())
  for node in tree.body:
    if not isinstance(node, ast.ClassDef):
      continue
    values = {target.id: stmt.value.value for stmt in node.body
              if isinstance(stmt, ast.Assign)
              and isinstance(stmt.value, ast.Constant)
              for target in stmt.targets if isinstance(target, ast.Name)}
    if values.get('name') == name and isinstance(values.get('help'), str):
      return values['help']
  raise LookupError(f'{module}: no class with name = {name!r} and a '
                    'literal help string')
