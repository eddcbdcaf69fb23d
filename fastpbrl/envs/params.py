"""Environment parameters searched as hyperparameters (host-side; the values
are traced arrays inside the compiled calls).

Sample Factory's PBT (``sample-factory-pbt-docs``) searches reward-shaping
coefficients of the environment beside the agent's hyperparameters, and
selects members on the true objective of the task instead of the shaped
return. fastpbrl does the same with the same machinery as the agent's
hyperparameters:

* An environment **declares** its parameters, ``{name: EnvParam}``: a
  default, a valid range and the range searched.

  - A gymnasium env (or one of its wrappers) has an ``env_params``
    attribute holding them and a method ``set_env_params(values)`` taking
    ``{name: float}``; the actors call it with their member's values before
    its next step whenever the values change (and on its evaluation envs).
  - A JAX env (``fastpbrl.envs.jax_envs.JaxEnv``) has an ``env_params`` field
    holding them (as ``(name, EnvParam)`` pairs, so that it stays
    hashable) and ``with_params(env_state, values) -> env_state`` taking
    ``{name: scalar array}``, which ``fastpbrl.learner.collect`` applies to each
    member's envs before every step, inside the compiled call: the values
    are traced, so a change never recompiles.

* In a run on such an env, each parameter becomes a hyperparameter field
  ``env_<name>`` appended to the agent's own (``with_env_params``): it is
  in ``--hparams``, in the default search space (``search_space``: the
  agent's space plus each parameter's ``prior``), in ``hparams.csv``, in
  ``fastpbrl info``. PBT's exploit copies it with the rest of a member's
  hyperparameters, its explore perturbs it, PB2 models it, random search
  draws it. The agent's own functions read its fields by name and never see
  the difference.

* **Fitness from the true objective.** A shaped env reports the task's own
  score of an episode: ``info['true_objective']`` at the episode's last
  step (gymnasium), ``objective(env_state)`` of the episode so far (JAX).
  ``--true-objective`` makes PBT select on it; the report's learning curves
  use it where the env gives one.

The trap Sample Factory names: a parameter that feeds the objective that
selects members is not searched, it is gamed. If the fitness were the
shaped return, PBT would raise every bonus coefficient, since each one adds
return without any skill. Select on an objective no parameter changes
(``--true-objective``), and keep parameters that change the task itself
(gravity, a goal's position) out of a search whose fitness depends on them.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping, NamedTuple, Optional

import jax.numpy as jnp

from fastpbrl.core import search_space as ss

PREFIX = 'env_'  # an env parameter ``name`` is the hyperparameter ``env_name``


class DeclarationError(ValueError):
  """An env's declaration of its parameters contradicts itself."""


@dataclasses.dataclass(frozen=True)
class EnvParam:
  """One parameter of an environment, as the env declares it.

  Attributes:
    default: the value of a member that searches nothing (``fastpbrl
      seeds``), and the env's own value.
    domain: where the value may lie and what it means (the same
      ``HParamDomain`` an agent declares for its hyperparameters).
    prior: the range searched by default (``LogUniform``, ``Uniform`` or
      ``Categorical``); it must lie in ``domain``.
  """

  default: float
  domain: ss.HParamDomain
  prior: Any

  def check(self, name: str) -> None:
    """Raises ValueError (one line) if the declaration contradicts itself."""
    problem = self.domain.problem(self.default)
    if problem:
      raise ValueError(f'env parameter {name!r}: default {self.default:g} '
                       f'{problem}')
    ss.check_space({field(name): self.domain},
                   ss.SearchSpace({field(name): self.prior}))


def field(name: str) -> str:
  """The hyperparameter field of env parameter ``name``."""
  return PREFIX + name


def declared(env) -> dict[str, EnvParam]:
  """``{name: EnvParam}`` an env declares in ``env_params`` (a ``JaxEnv``'s
  field, or a gymnasium env's or wrapper's attribute); ``{}`` for an env
  without parameters.

  Raises:
    DeclarationError: a declaration that contradicts itself, or an env that
      declares parameters and cannot take values (no ``set_env_params`` on
      a gymnasium env, no ``with_params`` on a JAX env).
  """
  params = dict(_attribute(env, 'env_params') or {})
  for name, param in params.items():
    if not isinstance(param, EnvParam):
      raise DeclarationError(f'env parameter {name!r}: expected an '
                             f'EnvParam, got {param!r}')
    try:
      param.check(name)
    except ValueError as e:
      raise DeclarationError(str(e)) from None
  setter = 'with_params' if hasattr(env, 'with_params') else 'set_env_params'
  if params and not callable(_attribute(env, setter)):
    raise DeclarationError(f'an env that declares env_params needs {setter}')
  return params


def _attribute(env, name: str):
  """``env``'s attribute ``name``, looked up through gymnasium wrappers."""
  if hasattr(env, name):
    return getattr(env, name)
  get = getattr(env, 'get_wrapper_attr', None)
  if get is None:
    return None
  try:
    return get(name)
  except AttributeError:
    return None


# ------------------------------------------------ beside the agent's fields


@functools.cache
def hparams_class(base: type, names: tuple[str, ...]) -> type:
  """The ``NamedTuple`` of ``base``'s fields followed by ``env_<name>`` for
  each of ``names`` (one class per pair, so that two builds of the same run
  give equal pytree structures)."""
  fields = [(f, Any) for f in base._fields] + [(field(n), Any) for n in names]
  cls = NamedTuple(f'{base.__name__}WithEnv', fields)
  cls.agent_class = base
  return cls


def with_env_params(agent, params: Mapping[str, EnvParam]):
  """``agent`` whose hyperparameters end with one ``env_<name>`` field per
  parameter, at its default (``agent`` itself for none).

  Raises:
    ValueError: a parameter whose field is already one of the agent's.
  """
  if not params:
    return agent
  defaults = agent.default_hparams()
  clash = [field(n) for n in params if field(n) in defaults._fields]
  if clash:
    raise ValueError(f'env parameters {clash} clash with hyperparameters of '
                     f'{agent.name}')
  cls = hparams_class(type(defaults), tuple(params))
  merged = cls(*defaults, *(jnp.asarray(p.default, jnp.float32)
                            for p in params.values()))
  return dataclasses.replace(
      agent, default_hparams=functools.partial(_constant, merged))


def _constant(value):
  return value


def values_of(hparams, names) -> dict[str, Any]:
  """``{name: value}`` of env parameters ``names`` in ``hparams`` (one
  member's scalars or the population's ``[N]`` arrays)."""
  return {name: getattr(hparams, field(name)) for name in names}


def agent_part(hparams):
  """``hparams`` without its env fields, as the agent's own ``NamedTuple``
  (``hparams`` itself where there are none): what crosses to the actor
  processes, whose pickled pytree structures need an importable class."""
  base = getattr(type(hparams), 'agent_class', None)
  if base is None:
    return hparams
  return base(*(getattr(hparams, f) for f in base._fields))


def env_part(hparams) -> dict[str, Any]:
  """``{name: value}`` of every env field of ``hparams`` (``{}`` where
  there are none)."""
  base = getattr(type(hparams), 'agent_class', None)
  if base is None:
    return {}
  return {f[len(PREFIX):]: getattr(hparams, f)
          for f in hparams._fields[len(base._fields):]}


class ActorHParams(NamedTuple):
  """What the actor processes read with the policies: the agent's own
  hyperparameters and the env parameters' values (``{name: [M]}``), apart,
  so that the pytree's classes are importable in a spawned process."""

  agent: Any
  env: dict


def for_actors(hparams) -> ActorHParams:
  """``hparams`` (merged or not) as the actors read it."""
  return ActorHParams(agent_part(hparams), env_part(hparams))


def setter(env):
  """A gymnasium env's (or wrapper's) ``set_env_params``."""
  return _attribute(env, 'set_env_params')


# ------------------------------------------- search spaces and domains


def domains(params: Mapping[str, EnvParam]) -> dict[str, ss.HParamDomain]:
  """Each parameter's ``domain``, under its field name."""
  return {field(n): p.domain for n, p in params.items()}


def with_space(space: ss.SearchSpace,
               params: Mapping[str, EnvParam]) -> ss.SearchSpace:
  """``space`` plus the priors of the parameters it leaves out (a space
  that names an env field keeps its own range for it)."""
  extra = [(field(n), p.prior) for n, p in params.items()
           if field(n) not in space.fields]
  if not extra:
    return space
  return dataclasses.replace(space, distributions=tuple(
      space.distributions) + tuple(extra))


def unknown_fields(names, params: Mapping[str, EnvParam],
                   env_id: str) -> Optional[str]:
  """Why ``names`` (hyperparameter fields given by a user) name env
  parameters ``env_id`` does not declare, or None."""
  bad = [n for n in names if n.startswith(PREFIX) and
         n[len(PREFIX):] not in params]
  if not bad:
    return None
  have = ', '.join(field(n) for n in params) or 'none'
  return (f'{", ".join(bad)}: not parameters of --env {env_id} (its env '
          f'parameters: {have})')
