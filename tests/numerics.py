"""Float tolerances of the suite, each derived from the computation it checks.

Two routes to one value (the vectorized update against a per-member loop,
the sharded program against the unsharded one, sampling inside the call
against outside) need not round alike: XLA fuses, splits and reorders sums
differently in each program, and the CPU's vector width (SSE, AVX2,
AVX-512) decides in which order a dot product's terms are added. A test that
compares two routes therefore allows the difference that rounding can make,
and no more, so that it still fails on a real defect. Three kinds:

1. **A short chain of operations** (a loss, a kernel entry, a CEM mean):
   each rounded operation is exact up to a relative ``u = eps / 2``, so two
   routes of at most ``k`` operations on the longest path differ by at most
   ``2 k u = k eps`` relative, to first order (Higham, *Accuracy and
   Stability of Numerical Algorithms*, 2002, section 3.1: ``gamma_k = k u /
   (1 - k u)``). ``rounding_rtol(k)`` gives that bound; ``k`` is counted
   generously (a sum of ``n`` terms is ``n`` operations, a transcendental
   function a few ulps, which XLA's CPU approximations stay within).

2. **A trajectory** (several optimizer steps): Adam divides the first moment
   by ``sqrt(v) + 1e-8``, so an absolute gradient difference ``d`` moves a
   parameter by up to ``lr * d / 1e-8``. In float32 a gradient entry near
   zero has ``d`` of order ``1e-7``, larger than ``1e-8``: its Adam step can
   flip sign between two routes, moving the parameter by ``2 lr`` per step,
   which no tolerance can allow and still see a defect (a defect moves a
   parameter by about ``lr`` too). So these comparisons run in float64
   (``float64()``, ``as_float64``), where the same chain starts from ``d``
   of order ``n u |g| <= 256 x 1.1e-16 x 1 = 2.8e-14`` (a mean over a batch
   of at most 256 per-sample gradients of size ~1) and Adam's division gives
   at most ``lr x 2.8e-14 / 1e-8 = 2.8e-9`` per step at ``lr = 1e-3``; over
   the suite's longest comparison (50 steps) that adds up to ``1.4e-7``,
   and ``TRAJECTORY['atol'] = 1e-6`` allows a further factor 7 for its
   growth through the network and the optimizer's state. A defect (another
   member's batch, hyperparameter or key; a missing or extra step) moves a
   parameter by about Adam's step size, ``lr >= 1e-4`` in these tests, 100
   times more.
   Measured (``python -m tests.isa_spread``): the routes differ by at most
   about ``1e-13`` in float64 on every instruction set.

3. **A statistical check** (a sample mean, a rate over many draws): the
   tolerance comes from the standard error, not from rounding, and its
   comment says how many standard errors it allows.

Values that both routes compute by the same operations in the same order
(a copy, a gather, a ``where``) are compared exactly
(``assert_trees_all_equal`` or ``rtol=0``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)  # 1.19e-7: float32's spacing at 1
EPS64 = float(np.finfo(np.float64).eps)  # 2.22e-16

# Two routes of at most 50 Adam steps, compared in float64 (rule 2 above).
TRAJECTORY = {'rtol': 1e-9, 'atol': 1e-6}


def rounding_rtol(ops: int, dtype=np.float32) -> float:
  """Relative tolerance between two routes of at most ``ops`` rounded
  operations on their longest path, in ``dtype``: ``ops * eps`` (rule 1)."""
  return ops * float(np.finfo(dtype).eps)


def float64():
  """Context in which jax computes in float64 (``jax.enable_x64``)."""
  return jax.enable_x64(True)


def as_float64(tree):
  """Every floating leaf of ``tree`` as float64 (jax arrays keep their
  placement: ``astype`` of a sharded array stays sharded); other leaves
  unchanged. Call inside ``float64()``."""

  def cast(x):
    if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
      return x
    if not isinstance(x, jax.Array):
      return np.asarray(x, np.float64)
    if not jax.config.jax_enable_x64:  # jax would truncate to float32
      raise RuntimeError('as_float64 of a jax array outside '
                         'numerics.float64(): it would stay float32')
    return x.astype(jnp.float64)

  return jax.tree.map(cast, tree)
