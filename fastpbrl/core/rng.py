"""A numpy random generator's state as arrays (host-side).

Rules keep their bookkeeping in a state of arrays, checkpointed as a
pytree (``fastpbrl/rules/base.py``); a rule that draws from numpy's
``PCG64`` (DvD's Thompson bandit, HyperTrick's report order) keeps the
generator's state here and continues the same stream after a resume.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Pcg64State(NamedTuple):
  """A numpy ``PCG64`` bit generator's state as arrays, so that a rule's
  state can hold it and a checkpoint store it (``pcg64_state``,
  ``pcg64_generator``): the same draws as the generator it came from."""

  state: np.ndarray  # [2] uint64: the 128-bit LCG state, high half first
  inc: np.ndarray  # [2] uint64: the 128-bit increment, high half first
  has_uint32: np.ndarray  # () int64: 1 if half of a 64-bit draw is buffered
  uinteger: np.ndarray  # () uint64: that buffered 32-bit half


_LOW64 = (1 << 64) - 1


def pcg64_state(generator: np.random.Generator) -> Pcg64State:
  """``generator``'s state (a ``PCG64`` one, as ``np.random.default_rng``
  makes) as arrays."""
  state = generator.bit_generator.state
  if state['bit_generator'] != 'PCG64':
    raise ValueError(f'pcg64_state needs a PCG64 generator, got '
                     f'{state["bit_generator"]}')

  def halves(value: int) -> np.ndarray:
    return np.array([value >> 64, value & _LOW64], np.uint64)

  return Pcg64State(state=halves(state['state']['state']),
                    inc=halves(state['state']['inc']),
                    has_uint32=np.asarray(state['has_uint32'], np.int64),
                    uinteger=np.asarray(state['uinteger'], np.uint64))


def pcg64_generator(state: Pcg64State) -> np.random.Generator:
  """A new ``np.random.Generator`` that continues from ``state``."""

  def whole(halves: np.ndarray) -> int:
    return (int(halves[0]) << 64) | int(halves[1])

  bit_generator = np.random.PCG64(0)  # seeded only to skip OS entropy
  bit_generator.state = {
      'bit_generator': 'PCG64',
      'state': {'state': whole(state.state), 'inc': whole(state.inc)},
      'has_uint32': int(state.has_uint32),
      'uinteger': int(state.uinteger)}
  return np.random.Generator(bit_generator)
