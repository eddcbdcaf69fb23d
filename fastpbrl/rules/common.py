"""What several rules share (host-side; not jittable).

The search space a rule samples from (``--search-space`` or the agent's
default) and its check against the agent's hyperparameters; the shared-critic
check of CEM-RL and DvD; the check that every span a rule scores holds
an evaluation; and the evaluation returns of an observation's episodes,
per member. (Which episodes still score a member whose weights were
replaced is the loop's business: ``Decision.renewed``.)
"""

from __future__ import annotations

import json
from typing import Optional, Sequence

import gymnasium as gym
import numpy as np

from fastpbrl.config.agent_settings import agent_spec
from fastpbrl.config.checks import parse_hparams
from fastpbrl.config.errors import ConfigError, check
from fastpbrl.config.fields import RunConfig
from fastpbrl.core import search_space as ss
from fastpbrl.envs import params as env_params
from fastpbrl.envs.gym import parameters_of


def search_space_of(config: RunConfig) -> ss.SearchSpace:
  """``--search-space``: a file, or the space itself as a JSON object (the
  Python API passes a dict as one, so that config.json keeps it); if unset,
  the agent's default space and the priors of the env's parameters
  (``fastpbrl.envs.params``). Its ranges must lie in the agent's declared
  domains (``register(..., hparam_domains=...)``) and the env parameters'
  (a given space searches the env parameters it names, and holds the
  others at their defaults)."""
  path = getattr(config, 'search_space', None)
  if path is None:
    return default_space(config)
  try:
    if path.lstrip().startswith('{'):
      space = ss.from_dict(json.loads(path))
    else:
      space = ss.load(path)
  except json.JSONDecodeError as e:
    raise ConfigError(f'--search-space: not a JSON object ({e})') from None
  except ValueError as e:
    source = 'the given space' if path.lstrip().startswith('{') else path
    raise ConfigError(f'--search-space {source}: {e}') from None
  check_space(config, space)
  return space


def default_space(config: RunConfig) -> ss.SearchSpace:
  """The agent's default space with the priors of the parameters of the
  env (``config.env``; none where the config names no env)."""
  space = agent_spec(config.agent).default_search_space
  return env_params.with_space(space, env_parameters(config))


def env_parameters(config: RunConfig) -> dict:
  """``{name: EnvParam}`` of ``config.env`` (``{}`` without one, or for an
  env that cannot be made here: the run refuses it, naming ``--env``, when
  it makes the env's spec)."""
  env_id = getattr(config, 'env', None)
  if env_id is None:
    return {}
  try:
    return parameters_of(env_id)
  except env_params.DeclarationError as e:
    raise ConfigError(f'--env {env_id}: {e}') from None
  except (ValueError, ImportError, gym.error.Error):
    return {}


def check_space(config: RunConfig, space: ss.SearchSpace) -> None:
  """Every range of ``space`` in its field's domain: the agent's
  hyperparameters' and the env parameters'; an ``env_`` field the env does
  not declare is refused."""
  params = env_parameters(config)
  unknown = env_params.unknown_fields(space.fields, params,
                                      getattr(config, 'env', None))
  check(unknown is None, f'{_source_of(config, space)}: {unknown}')
  try:
    agent_spec(config.agent).check_search_space(space)
    ss.check_space(env_params.domains(params), space)
  except ValueError as e:
    raise ConfigError(f'{_source_of(config, space)}: {e}') from None


def validate_space(config: RunConfig, space: ss.SearchSpace,
                   defaults) -> None:
  """Every field of the space is a hyperparameter of the agent, its range
  lies in the field's declared domain, and a value ``--hparams`` gives a
  searched field lies in its range."""
  check_space(config, space)
  given = parse_hparams(getattr(config, 'hparams', ()))
  for name, value in given.items():
    if name in space.fields and not ss.contains(space[name], value):
      raise ConfigError(
          f'--hparams {name}={value:g} is outside the search space '
          f'({name}: {space[name]}); the rule starts from it and searches '
          'within the space: widen it with --search-space')
  try:
    ss.validate(space, defaults)
  except ValueError as e:
    raise ConfigError(f'{_source_of(config, space)}: {e}') from None


def _source_of(config: RunConfig, space: ss.SearchSpace) -> str:
  """Where ``space`` came from, as an error message names it."""
  path = getattr(config, 'search_space', None)
  if path:
    return ('--search-space' if path.lstrip().startswith('{')
            else f'--search-space {path}')
  if space == default_space(config):
    return f'the default search space of --agent {config.agent}' + (
        f' and --env {config.env}' if env_parameters(config) else '')
  return 'the search space'  # a space passed to the rule in code


def check_shared_critic(rule: str, config: RunConfig) -> None:
  """CEM-RL and DvD train deterministic policies through one critic shared
  by the population: the agent must register that update
  (``register(..., shared_critic=...)``; of the built-ins, TD3 does)."""
  spec = agent_spec(config.agent)
  check(spec.shared_critic is not None,
        f'{rule} needs deterministic policies trained through one shared '
        f'critic: --agent {config.agent} registers no shared_critic update '
        '(of the built-in agents only td3 does)')


def check_evaluations_per(span_env_steps: float, config: RunConfig,
                          span_flag: str) -> None:
  """A rule that scores every span of ``span_env_steps`` env steps per
  member needs an evaluation to start inside each span."""
  check(config.eval_every <= span_env_steps,
        f'--eval-every {config.eval_every} is longer than one {span_flag} '
        f'span ({span_env_steps:.0f} env steps per member): spans would end '
        'without an evaluation to score them; lower --eval-every or lengthen '
        'the span')


def evaluations(episodes: Sequence, *, since: Optional[np.ndarray] = None
                ) -> list:
  """The evaluation episodes (``EpisodeRecord``) of ``episodes``, in their
  order; with ``since`` (``[N]`` policy versions, as
  ``Observation.marked_at``), only those that started after member
  ``m``'s ``since[m]``."""
  return [r for r in episodes if r.evaluation and (
      since is None or r.start_policy_version > since[r.member])]


def evaluation_returns(episodes: Sequence, population_size: int, *,
                       since: Optional[np.ndarray] = None,
                       field: str = 'episode_return') -> list[list[float]]:
  """Per member, the returns of its evaluation episodes in ``episodes``,
  oldest first: ``out[m]`` is member ``m``'s list (empty: none).

  Args:
    episodes: ``EpisodeRecord``s (``Observation.episodes``).
    population_size: ``N``, the number of lists.
    since: ``[N]`` policy versions: only episodes that started after
      member ``m``'s ``since[m]`` (``Observation.marked_at``: evaluations
      of the policy trained since its last ``mark``).
    field: what an episode gives: ``'episode_return'``, or
      ``'true_objective'`` (PBT's ``--true-objective``).
  """
  out: list[list[float]] = [[] for _ in range(population_size)]
  for r in evaluations(episodes, since=since):
    out[int(r.member)].append(float(getattr(r, field)))
  return out
