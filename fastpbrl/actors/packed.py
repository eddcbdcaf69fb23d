"""A compiled call whose outputs come back to the host as one buffer.

Host-side wrapper around ``jax.jit`` for the actors' per-step policy calls.

The actors call a small compiled policy once per env step, so its fixed
cost bounds how fast they step. On XLA:CPU (jaxlib 0.10.2) a policy
computation that returns two arrays ran much slower than the same
computation returning one: PPO's ``behave`` for two HalfCheetah members
(the actions and their log-probabilities) took about 61 µs a call against
23 µs with both packed into one array (same HLO but for the root; 2-core
AMD EPYC VM, single-threaded actor settings; ``benchmarks/policy_call.py``
times both routes). ``PackedCall`` packs every output leaf into one
``uint32`` buffer ``[M, width]`` inside the compiled program
(``lax.bitcast_convert_type``, exact: no value is converted) and unpacks
it on the host with numpy views. A function of one output is compiled as
it is: there is nothing to pack.

The layout is fixed by the first call's shapes: the call is compiled ahead
of time for them (``jit(...).lower(...).compile()``), so a later call with
other shapes raises instead of being misread.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# A bool leaf travels as a whole uint32 word (0 or 1).
_WORD = np.dtype(np.uint32)


class _Leaf(NamedTuple):
  dtype: np.dtype  # the leaf's own dtype
  shape: tuple  # per-member shape (without the leading M axis)
  start: int  # first uint32 column of the leaf in the buffer
  stop: int


def _words(dtype: np.dtype, shape: tuple) -> int:
  """uint32 words a leaf of ``shape`` (per member) takes."""
  size = int(np.prod(shape, dtype=np.int64))
  if dtype == np.bool_:
    return size
  if dtype.itemsize % _WORD.itemsize:
    raise TypeError(f'PackedCall packs 32- and 64-bit and bool outputs, '
                    f'got {dtype}')
  return size * dtype.itemsize // _WORD.itemsize


def _to_words(x: jax.Array) -> jax.Array:
  """``x`` ``[M, ...]`` as ``[M, words]`` uint32, bit for bit."""
  if x.dtype == jnp.bool_:
    x = x.astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(x.shape[0], -1)


class PackedCall:
  """``jax.jit(fn)`` whose result comes back as numpy arrays.

  ``fn`` returns a pytree of arrays that share a leading axis ``M``, each of
  a 32- or 64-bit dtype or bool. Calling the object returns the same pytree
  as writable numpy arrays, copied out of the one buffer the compiled call
  returns. Compiled on the first call; every later call must have the
  first call's argument shapes and dtypes.
  """

  def __init__(self, fn: Callable[..., Any]):
    self._fn = fn
    self._compiled = None
    self._treedef = None
    self._leaves: tuple[_Leaf, ...] = ()

  def _pack(self, *args) -> jax.Array:
    leaves = jax.tree.leaves(self._fn(*args))
    return jnp.concatenate([_to_words(x) for x in leaves], axis=1)

  def _compile(self, args) -> None:
    out = jax.eval_shape(self._fn, *args)
    shapes, self._treedef = jax.tree.flatten(out)
    m = {s.shape[0] if s.shape else None for s in shapes}
    if len(m) != 1 or None in m:
      raise ValueError(f'PackedCall: every output needs the same leading '
                       f'axis, got shapes {[s.shape for s in shapes]}')
    leaves, start = [], 0
    for s in shapes:
      dtype, shape = np.dtype(s.dtype), tuple(s.shape[1:])
      stop = start + _words(dtype, shape)
      leaves.append(_Leaf(dtype, shape, start, stop))
      start = stop
    self._leaves = tuple(leaves)
    # One output needs no packing (packing it cost a few µs more).
    fn = self._pack if len(leaves) > 1 else self._fn
    self._compiled = jax.jit(fn).lower(*args).compile()

  def __call__(self, *args) -> Any:
    if self._compiled is None:
      self._compile(args)
    if len(self._leaves) == 1:
      out = np.array(jax.tree.leaves(self._compiled(*args))[0])
      return jax.tree.unflatten(self._treedef, [out])
    buf = np.asarray(self._compiled(*args))
    m = buf.shape[0]
    out = []
    for leaf in self._leaves:
      words = np.array(buf[:, leaf.start:leaf.stop])  # a contiguous copy
      if leaf.dtype == np.bool_:
        out.append(words.astype(np.bool_).reshape(m, *leaf.shape))
      else:
        out.append(words.view(leaf.dtype).reshape(m, *leaf.shape))
    return jax.tree.unflatten(self._treedef, out)
