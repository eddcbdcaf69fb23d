"""Importing user code named on the command line (host-side).

``--agent mypkg.ddpg:DDPG`` and ``fastpbrl mypkg.halving:Halving`` name a
module and an attribute; ``path/to/file.py:Name`` names a file, imported
from its folder. A module is looked for on ``sys.path`` and, as
``python -m`` would, in the current folder (the ``fastpbrl`` command's own
path holds only its install folder). Both registries (``fastpbrl.agents``,
``fastpbrl.rules``) import through ``import_ref_module``.

``lazy_names`` gives a package the ``__getattr__`` (PEP 562) that imports
a name's module on first use (``fastpbrl.rules`` and each rule's folder).
"""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType
from typing import Any, Callable, Mapping


def add_cwd_to_path() -> None:
  """Puts the current folder on ``sys.path``, as ``python -m`` does, so that
  a module of the user's named on the command line (``--agent mymod:X``,
  ``--env mymod:Env-v0``) imports from where the command runs; spawned
  actor processes inherit the path."""
  if os.getcwd() not in sys.path and '' not in sys.path:
    sys.path.append(os.getcwd())


def import_ref_module(ref: str, module_name: str) -> ModuleType:
  """The module ``module_name`` of ``ref`` (``module:attribute``), imported.

  Raises:
    ValueError: one line saying why it cannot be imported (a missing file,
      or the error the module's import raised).
  """
  if module_name.endswith('.py'):  # a file: import it from its folder
    folder = os.path.dirname(os.path.abspath(module_name))
    if not os.path.isfile(module_name):
      raise ValueError(f'{ref!r}: no file {module_name}')
    if folder not in sys.path:
      sys.path.insert(0, folder)
    module_name = os.path.splitext(os.path.basename(module_name))[0]
  else:
    add_cwd_to_path()
  try:
    return importlib.import_module(module_name)
  except Exception as e:  # noqa: BLE001 (any failure of user code at import)
    detail = ' '.join(f'{type(e).__name__}: {e}'.split())
    raise ValueError(f'{ref!r}: cannot import {module_name}: {detail}'
                     ) from None


def known_names(registered: Mapping[str, Any],
                builtin: Mapping[str, str]) -> tuple[str, ...]:
  """Names a registry accepts without a module: built-ins, then the others
  registered in this process."""
  return tuple(builtin) + tuple(n for n in registered if n not in builtin)


def find(ref: str, registered: Mapping[str, Any], builtin: Mapping[str, str],
         what: str, register: str):
  """``(entry, None)`` for a registered or built-in name (importing the
  built-in's module, which registers it), or ``(None, (module,
  attribute))`` for ``module:attribute``, the module imported.

  Raises:
    ValueError: one line, for a name that is neither (``what``: "an
      agent"; ``register``: the function that registers one).
  """
  if ref in registered:
    return registered[ref], None
  if ref in builtin:
    importlib.import_module(builtin[ref])
    return registered[ref], None
  if ':' not in ref:
    raise ValueError(f'{ref!r} is unknown; choose one of '
                     f'{", ".join(known_names(registered, builtin))}, or give '
                     f'module:attribute of {what} registered with {register}')
  module_name, attr = ref.rsplit(':', 1)
  return None, (import_ref_module(ref, module_name), attr)


def code_identity(fn) -> tuple[str, str]:
  """The file and qualified name of the function ``fn``: the same for the
  same code imported twice (a reload, or one file imported under two
  module names: ``__main__`` and its import path), so that a registry
  lets it register again and refuses other code under a taken name."""
  code = getattr(fn, '__code__', None)
  source = code.co_filename if code is not None else getattr(
      fn, '__module__', '')
  return source, getattr(fn, '__qualname__', repr(fn))


def lazy_names(package: str,
               names: Mapping[str, str]) -> Callable[[str], Any]:
  """A module ``__getattr__`` for ``package`` that imports
  ``package.<names[name]>`` on first use of ``name`` and returns its
  attribute ``name``: ``__getattr__ = lazy_names(__name__, _NAMES)``."""

  def __getattr__(name: str) -> Any:
    if name in names:
      return getattr(importlib.import_module(f'{package}.{names[name]}'),
                     name)
    raise AttributeError(f'module {package!r} has no attribute {name!r}')

  return __getattr__
