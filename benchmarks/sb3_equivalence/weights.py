"""Our parameters against Stable-Baselines3's modules, and the set-up both
comparisons share: our hyperparameters and state at the compared dtype,
SB3's inputs left uncast in float64, and the optional perturbation of
SB3's copy of the initial weights."""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import stable_baselines3.common.policies as sb3_policies
import torch

Linears = list  # [(w [in, out], b)] in layer order


def haiku_linears(params: dict, prefix: str) -> Linears:
  """The ``(w [in, out], b)`` of the MLP under ``prefix`` in layer order."""
  names = sorted((k for k in params if k.startswith(prefix)),
                 key=lambda k: int(k.rsplit('_', 1)[1]))
  return [(np.asarray(params[k]['w']), np.asarray(params[k]['b']))
          for k in names]


def split_head(linears: Linears, action_dim: int) -> Linears:
  """SAC's policy MLP ends in one layer of ``2 x action_dim`` outputs (mean,
  then log-std); SB3's has two heads (``mu``, ``log_std``)."""
  *body, (w, b) = linears
  return [*body, (w[:, :action_dim], b[:action_dim]),
          (w[:, action_dim:], b[action_dim:])]


def torch_linears(module) -> list:
  """The ``torch.nn.Linear`` layers of ``module`` in order."""
  return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def copy_into(linears_src: Linears, torch_modules) -> None:
  """Our layers' weights and biases into SB3's ``Linear`` modules."""
  assert len(linears_src) == len(torch_modules)
  with torch.no_grad():
    for (w, b), lin in zip(linears_src, torch_modules):
      lin.weight.copy_(torch.as_tensor(w.T.copy()))
      lin.bias.copy_(torch.as_tensor(b.copy()))


def max_rel_diff(linears_src: Linears, torch_modules) -> float:
  """The largest relative difference ``|A - B| / |A|`` (Frobenius norms)
  over the layers' weights and biases. Element-wise differences are not
  meaningful: Adam moves a parameter whose gradient is at rounding level
  by up to its full step in either direction, by the sign of that
  rounding."""
  worst = 0.0
  for (w, b), lin in zip(linears_src, torch_modules):
    for ours, theirs in ((w, lin.weight.detach().numpy().T),
                         (b, lin.bias.detach().numpy())):
      worst = max(worst, relative_difference(theirs, reference=ours))
  return worst


def relative_difference(value, reference) -> float:
  """``|value - reference| / |reference|`` (Frobenius norms, in
  float64)."""
  value = np.asarray(value, np.float64)
  reference = np.asarray(reference, np.float64)
  return float(np.linalg.norm(value - reference)
               / max(np.linalg.norm(reference), 1e-12))


class Pair(NamedTuple):
  """One parameter group: ours (from the agent's state) and SB3's modules."""

  ours: Callable  # state -> Linears
  theirs: list  # torch Linear modules in the same order


def compared_dtype(float32: bool):
  """The dtype both sides compute in; in float64, SB3's cast of Box
  observations to float32 on the way into its networks is skipped."""
  if float32:
    return np.float32
  sb3_policies.preprocess_obs = lambda obs, *_, **__: obs
  return np.float64


def at_dtype(agent, hparams, seed: int, dtype):
  """``hparams`` and the agent's initial state (from ``seed``) at
  ``dtype``. The defaults are float32 arrays; ``str()`` gives their
  shortest decimal (3e-4, not float32's 2.9999999e-4), which SB3 also
  uses."""
  hparams = jax.tree.map(
      lambda x: jnp.asarray(float(str(np.float32(x))), dtype), hparams)
  state = jax.jit(agent.init)(jax.random.PRNGKey(seed), hparams)
  state = jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, state)
  return hparams, state


def perturb(modules, scale: float, seed: int) -> None:
  """Multiplies every parameter of ``modules`` by ``1 + scale x N(0, 1)``,
  element by element (``--perturb``); nothing at scale 0."""
  if not scale:
    return
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for module in modules:
      for p in module.parameters():
        p.mul_(1 + scale * torch.randn(p.shape, generator=gen,
                                       dtype=p.dtype))


def differences_line(diffs: dict) -> str:
  """``'largest relative difference <name> <value>, ...'``."""
  return 'largest relative difference ' + ', '.join(
      f'{k} {v:.1e}' for k, v in diffs.items())


def exit_status(what: str, worst: float, tolerance: float) -> int:
  """Prints the largest difference of the comparison ``what`` against
  ``tolerance``; 0 within it, 1 above."""
  ok = worst <= tolerance
  print(f'{what}: largest relative difference {worst:.2e} '
        f'({"within" if ok else "above"} the tolerance {tolerance:g})')
  return 0 if ok else 1
