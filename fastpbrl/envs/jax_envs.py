"""Environments written in JAX, for the on-device data path: the contract
(``JaxEnv``) and the registry of the families that make them.

An ``--env`` id ``prefix:NAME`` whose prefix names a registered family
(``gymnax:Pendulum-v1``, ``brax:hopper``, ``shaped:MountainCar-v0``) names
a pure-JAX environment. The run then steps it inside the learner's
compiled call (``fastpbrl.learner.collect``) instead of in actor processes.
Everything here is host-side construction; what it returns is pure
functions.

The contract every family's env fills, :class:`JaxEnv`:

* ``reset(key) -> (env_state, observation)``: a new episode;
* ``step(env_state, action, key) -> (env_state, observation, reward,
  terminated)``: one step, with **no automatic reset and no time limit**;
  ``action`` is in the env's own units (``fastpbrl.learner.collect`` scales the
  agents' ``[-1, 1]`` actions to the bounds of ``env_spec``, as the
  actors do with ``scale_action``); ``terminated`` is a true end of the
  episode (a fallen hopper), never a time limit;
* ``max_episode_steps``: the time limit, applied by
  ``fastpbrl.learner.collect`` as a truncation, as gymnasium's ``TimeLimit``
  does.

Keeping termination and truncation apart is why the built-in families do
not use their libraries' own episode wrappers: gymnax's ``step`` and Brax's
``EpisodeWrapper`` reset automatically and report the time limit as
``done``, so the real next observation of a truncated step, which the TD
target bootstraps from, would be lost.

A *family* is a function ``make(env_id, name) -> JaxEnv``, registered under
its prefix with ``@register(prefix)``: ``make`` gets the whole ``--env`` id
(for ``JaxEnv.env_id`` and its messages) and the ``name`` after the
prefix, and builds the env with its spec (``spec_of``) and, if it has
any, its env parameters (``JaxEnv.env_params``, ``with_params``,
``objective``: ``fastpbrl.envs.params``). It raises ``JaxEnvError`` (or
``ValueError``) with one line for a name it cannot make. The built-in
families (``BUILTIN``: ``gymnax``, ``brax``, the shaped example task
``shaped``) register when their modules are imported, on first use, so
that gymnax and Brax are imported only by a run that asks for them.

A family of your own registers when your module is imported: import it
(or call ``register`` in your script) before ``fastpbrl.train``, and before
``load_policy``, ``evaluate`` or a resume of its runs, which make the env
again from the id. The ``fastpbrl`` command does not import it.
"""

from __future__ import annotations

import functools
import importlib
import re
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
from acme import specs

from fastpbrl.core.imports import code_identity, known_names

# Built-in families: prefix -> the module whose import registers it.
BUILTIN = {'gymnax': 'fastpbrl.envs.gymnax_envs',
           'brax': 'fastpbrl.envs.brax_envs',
           'shaped': 'fastpbrl.envs.shaping'}
# A prefix is a word: it cannot hold the ``.`` of a module name, so that a
# gymnasium id ``module:EnvId`` never reads as a family's.
_PREFIX = re.compile(r'[A-Za-z_][A-Za-z0-9_-]*')


class JaxEnvError(ValueError):
  """An env id that cannot be made; the message names ``--env``."""


class JaxEnv(NamedTuple):
  """A pure-JAX environment, as ``fastpbrl.learner.collect`` steps it.

  An env with parameters searched as hyperparameters
  (``fastpbrl.envs.params``) also gives ``env_params`` (``(name,
  EnvParam)`` pairs), ``with_params(env_state, values) -> env_state`` (the
  state acting with ``{name: scalar}``) and, for its fitness,
  ``objective(env_state)``: the task's own score of the episode so far
  (the true objective a shaped reward departs from).
  """

  env_id: str
  env_spec: specs.EnvironmentSpec
  max_episode_steps: int
  reset: Callable[[jax.Array], tuple[Any, jax.Array]]
  step: Callable[[Any, jax.Array, jax.Array], tuple[Any, jax.Array,
                                                    jax.Array, jax.Array]]
  env_params: tuple = ()
  with_params: Callable[[Any, dict], Any] | None = None
  objective: Callable[[Any], jax.Array] | None = None


Family = Callable[[str, str], JaxEnv]

_REGISTRY: dict[str, Family] = {}


def register(prefix: str) -> Callable[[Family], Family]:
  """A decorator that registers a family, ``make(env_id, name) ->
  JaxEnv``, under ``prefix``: ``--env prefix:NAME`` then names its envs.
  Returns ``make`` unchanged.

  Call it at a module's top level, in a module the run imports before it
  starts (the module docstring).

  Raises:
    ValueError: ``prefix`` is not a word (letters, digits, ``_``, ``-``),
      is a built-in family's, or is already registered by other code.
  """
  if not isinstance(prefix, str) or not _PREFIX.fullmatch(prefix):
    raise ValueError(f'a JAX env family prefix is a word (letters, digits, '
                     f'"_", "-"), got {prefix!r}')

  def add(make: Family) -> Family:
    if not callable(make):
      raise ValueError(f'JAX env family {prefix!r}: register a function '
                       f'make(env_id, name) -> JaxEnv, got {make!r}')
    module = getattr(make, '__module__', '')
    if prefix in BUILTIN and module != BUILTIN[prefix]:
      raise ValueError(f'JAX env family {prefix!r} is built in; choose '
                       'another prefix')
    taken = _REGISTRY.get(prefix)
    if taken is not None and code_identity(taken) != code_identity(make):
      by = '.'.join(getattr(taken, a, '?') for a in ('__module__',
                                                     '__qualname__'))
      raise ValueError(f'JAX env family {prefix!r} is already registered by '
                       f'{by}; choose another prefix')
    _REGISTRY[prefix] = make  # or again, by the same code (a reload)
    return make

  return add


def known() -> tuple[str, ...]:
  """The family prefixes: built-ins, then the others registered in this
  process."""
  return known_names(_REGISTRY, BUILTIN)


def family(prefix: str) -> Family:
  """The family registered under ``prefix``, importing a built-in's module.

  Raises:
    JaxEnvError: one line for an unknown prefix, naming the known ones.
  """
  if prefix not in _REGISTRY and prefix in BUILTIN:
    importlib.import_module(BUILTIN[prefix])
  if prefix not in _REGISTRY:
    raise JaxEnvError(f'no JAX env family {prefix!r}; the families are '
                      f'{", ".join(known())} (fastpbrl.envs.register adds '
                      'one)')
  return _REGISTRY[prefix]


def family_of(env_id: str) -> str | None:
  """The family prefix of a JAX env id (``'gymnax'``), or None for any
  other id."""
  prefix, sep, _ = env_id.partition(':')
  return prefix if sep and (prefix in _REGISTRY or prefix in BUILTIN) else None


def unregistered_family_hint(prefix: str) -> str:
  """For an id ``prefix:NAME`` that names no family and whose module does
  not import: a clause naming the families, where ``prefix`` could be one
  (``''`` otherwise), for the end of that one-line error."""
  if not _PREFIX.fullmatch(prefix):
    return ''
  return (f'; or, for a JAX env family {prefix!r}, import the module that '
          f'registers it first (the families: {", ".join(known())})')


def is_jax_env(env_id: str) -> bool:
  """Whether ``env_id`` names a JAX environment (``gymnax:...``,
  ``brax:...``, or a registered family's); imports no family."""
  return family_of(env_id) is not None


@functools.cache
def make(env_id: str) -> JaxEnv:
  """The ``JaxEnv`` of ``env_id`` (cached: its functions are pure).

  Raises:
    JaxEnvError: not a JAX env id, an unknown name, a missing extra, or a
      space fastpbrl's agents cannot serve; one line naming ``--env``.
  """
  prefix, sep, name = env_id.partition(':')
  if not sep:
    raise JaxEnvError(f'--env {env_id!r} is not a JAX env id; those start '
                      f'with one of {", ".join(f"{p}:" for p in known())}')
  try:
    build = family(prefix)
  except JaxEnvError as e:
    raise JaxEnvError(f'--env {env_id!r}: {e}') from None
  try:
    env = build(env_id, name)
  except JaxEnvError:
    raise
  except ValueError as e:  # a user family's own refusal: one line too
    raise JaxEnvError(f'--env {env_id!r}: {" ".join(str(e).split())}'
                      ) from None
  if not isinstance(env, JaxEnv):
    raise TypeError(f'JAX env family {prefix!r} returned '
                    f'{type(env).__name__}, not a fastpbrl.envs.JaxEnv')
  return env


def spec_of(observations: specs.Array,
            actions: specs.Array) -> specs.EnvironmentSpec:
  """The env spec of a family's env: its observation and action specs
  (``acme.specs``; a 1-D ``BoundedArray`` or a ``DiscreteArray`` of
  actions), with float32 scalar rewards and discounts."""
  return specs.EnvironmentSpec(
      observations=observations, actions=actions,
      rewards=specs.Array((), np.float32, name='reward'),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name='discount'))
