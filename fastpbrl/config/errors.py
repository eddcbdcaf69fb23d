"""What a run's settings can get wrong, and the one-line refusal.

``ConfigError`` is what the user did wrong (a setting, found before any
process starts), ``StorageError`` what the disk did; ``check`` raises the
first with its message. Host-side; not jittable.
"""

import dataclasses


class StorageError(RuntimeError):
  """The run could not write its logs or checkpoints (a full disk); every
  process is stopped and the last whole checkpoint is usable."""


class ConfigError(ValueError):
  """An invalid setting, found before any process starts; the message names
  the flag and what it may be."""


class SettingTypeError(ConfigError, TypeError):
  """A setting given in Python (``fastpbrl.train``) of the wrong type; the
  message names it and the type its field declares."""


def check(ok: bool, message: str) -> None:
  """Raises ``ConfigError(message)`` unless ``ok``."""
  if not ok:
    raise ConfigError(message)


def as_flag_error(error: ValueError, config) -> ConfigError:
  """Rewrites ``'fraction must be ...'`` from a rule's own config check into
  ``'--fraction must be ...'`` when the first word is a field of ``config``."""
  message = str(error)
  first = message.split(' ', 1)[0]
  if first in {f.name for f in dataclasses.fields(config)}:
    message = '--' + first.replace('_', '-') + message[len(first):]
  return ConfigError(message)
