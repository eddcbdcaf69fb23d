"""Reading a settings file: JSON, or YAML for ``.yaml`` / ``.yml`` with
PyYAML installed (host-side). What ``--search-space`` and ``--config``
read."""

from __future__ import annotations

import json
import os
from typing import Any


def read(path: str) -> Any:
  """The value a JSON or YAML file holds.

  Raises:
    ValueError: one line: an unreadable file, or bad syntax.
  """
  yaml_file = os.path.splitext(path)[1].lower() in ('.yaml', '.yml')
  try:
    with open(path) as f:
      text = f.read()
  except OSError as e:
    raise ValueError(f'cannot read it: {e.strerror}') from None
  if not yaml_file:
    try:
      return json.loads(text)
    except json.JSONDecodeError as e:
      raise ValueError(f'not valid JSON: {e}') from None
  try:
    import yaml  # noqa: PLC0415 (optional: only YAML files need it)
  except ImportError:
    raise ValueError('a YAML file needs PyYAML (pip install pyyaml); or '
                     'write it as JSON') from None
  try:
    return yaml.safe_load(text)
  except yaml.YAMLError as e:
    raise ValueError('not valid YAML: ' + ' '.join(str(e).split())) from None
