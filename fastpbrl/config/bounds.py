"""The ranges settings declare on their fields, and their check.

A config field declares its allowed range once (``bounded(5, ge=1)``);
``check_bounds`` refuses a value outside it with one line naming the flag,
the range and the value. Host-side; not jittable.
"""

import dataclasses
import math
from typing import NamedTuple, Optional

from fastpbrl.config.errors import check


BOUNDS = 'fastpbrl.bounds'  # the key of a field's ``Bounds`` in its metadata


class Bounds(NamedTuple):
  """A setting's allowed range, declared once on its field (``bounded``)
  and checked by ``check_bounds``, as ``search_space.HParamDomain`` declares
  a hyperparameter's. ``None`` (a setting ``resolved`` derives, or one left
  to a rule) is always allowed; a number must be finite."""

  low: Optional[float] = None
  high: Optional[float] = None
  low_open: bool = False  # True: > low; False: >= low
  high_open: bool = False  # True: < high; False: <= high
  unit: str = ''  # after the range in the message: ' env steps', ' seconds'
  note: str = ''  # after that: ' (0: all rounds)'

  def allows(self, value: float) -> bool:
    return math.isfinite(value) and not (
        self.low is not None and (value <= self.low if self.low_open
                                  else value < self.low)) and not (
        self.high is not None and (value >= self.high if self.high_open
                                   else value > self.high))

  def describe(self) -> str:
    """The range as the messages state it: '>= 1', '> 0', 'in (0, 64]'."""
    if self.low is not None and self.high is not None:
      return (f'in {"(" if self.low_open else "["}{self.low!r}, '
              f'{self.high!r}{")" if self.high_open else "]"}')
    if self.low is not None:
      return f'{">" if self.low_open else ">="} {self.low!r}'
    return f'{"<" if self.high_open else "<="} {self.high!r}'

  def message(self, name: str, value) -> str:
    """``ConfigError``'s line for ``value`` of the setting ``name``."""
    return (f'--{name.replace("_", "-")} must be {self.describe()}'
            f'{self.unit}{self.note}, got {value}')


def bounded(default, *, ge=None, gt=None, le=None, lt=None, unit: str = '',
            note: str = ''):
  """A config field whose values must be ``>= ge`` (or ``> gt``) and ``<=
  le`` (or ``< lt``): ``eval_episodes: int = bounded(5, ge=1)``. Its
  docstring stays the field's help."""
  if ge is not None and gt is not None or le is not None and lt is not None:
    raise ValueError('bounded: give ge or gt, and le or lt, not both')
  if ge is None and gt is None and le is None and lt is None:
    raise ValueError('bounded: give at least one bound')
  bounds = Bounds(low=gt if ge is None else ge, high=lt if le is None else le,
                  low_open=gt is not None, high_open=lt is not None,
                  unit=unit, note=note)
  return dataclasses.field(default=default, metadata={BOUNDS: bounds})


def declared_bounds(config_class: type) -> dict[str, Bounds]:
  """``{field: Bounds}`` of a config class, in field order: a subclass that
  redeclares a field without bounds (a new default or docstring) keeps its
  base class's; one that declares bounds replaces them."""
  if not dataclasses.is_dataclass(config_class):
    return {}  # an object with RunConfig's fields: nothing declared
  found = {}
  for cls in reversed(config_class.__mro__):
    for field in getattr(cls, '__dataclass_fields__', {}).values():
      if BOUNDS in field.metadata:
        found[field.name] = field.metadata[BOUNDS]
  order = [f.name for f in dataclasses.fields(config_class)]
  return {name: found[name] for name in order if name in found}


def check_bounds(config, names: Optional[tuple[str, ...]] = None) -> None:
  """Raises ``ConfigError`` (one line: the flag, its range, the value) for
  the first setting outside its declared ``Bounds`` (of ``names``: every
  declared one by default). A value that is not a number is left to
  ``check_types``."""
  for name, bounds in declared_bounds(type(config)).items():
    value = getattr(config, name)
    if names is not None and name not in names or value is None:
      continue
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      continue
    check(bounds.allows(value), bounds.message(name, value))
