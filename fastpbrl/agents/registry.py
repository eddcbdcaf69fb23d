"""The agent registry: one ``register`` call adds an agent, from the package
or from user code (host-side; imports modules, nothing here is jittable).

``register(name, make_agent=..., config=..., default_search_space=...,
hparam_domains=..., shared_critic=...)`` records an ``AgentSpec``; ``get(ref)`` finds one and
``make_agent(ref, env_spec, config)`` builds the agent. A *ref* is what
``--agent`` takes:

* a registered name: ``td3``, ``sac``, ``dqn``, ``ppo`` (their modules are imported
  on first use, so ``import fastpbrl.agents`` does not import haiku), or any
  name registered earlier in this process;
* ``module:attribute``, e.g. ``mypkg.ddpg:DDPG`` or ``examples.ddpg:DDPG``:
  the module is imported (it must be importable: on ``sys.path``), and the
  attribute is an ``AgentSpec`` (what ``register`` returns) or the name the
  module registered; ``path/to/ddpg.py:DDPG`` imports the file by putting its
  folder on ``sys.path``.

Actor processes are spawned: they rebuild the agent from the same *ref*
string (``datapath.create`` passes it, never a closure), so a user module is
imported again there by its import path and registers itself again.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

from acme import specs

from fastpbrl.agents.base import (LEARNS_FROM, ROLLOUT_CONFIG_FIELDS, Agent,
                                  SharedCritic)
from fastpbrl.core import search_space as ss
from fastpbrl.core.imports import code_identity, find, known_names

# Built-in agents: name -> the module whose import registers it.
BUILTIN = {'td3': 'fastpbrl.agents.td3', 'sac': 'fastpbrl.agents.sac',
           'dqn': 'fastpbrl.agents.dqn', 'ppo': 'fastpbrl.agents.ppo'}

# Fields every agent config needs: the learner and the pipeline read them.
REQUIRED_CONFIG_FIELDS = ('batch_size', 'steps_per_call')


@dataclasses.dataclass(frozen=True)
class AgentSpec:
  """What the run loop, the rules and the actors need to know of an agent.

  Attributes:
    name: short name, in logs and summaries; ``--agent NAME`` once registered.
    make_agent: ``(env_spec, config) -> Agent``.
    config: the static config class (a dataclass): ``config()`` gives the
      agent's defaults; it has ``batch_size`` and ``steps_per_call``, and
      ``--batch-size``, ``--steps-per-call`` and ``--hidden-sizes`` override
      fields of it.
    default_search_space: the prior of PBT and HyperTrick (``--search-space``
      replaces it), over fields of the agent's hyperparameters.
    shared_critic: optional ``(env_spec, config) -> SharedCritic``, the
      whole-population update with one critic that CEM-RL and DvD train
      through; ``None``: those rules refuse the agent.
    hidden_sizes_field: the config field ``--hidden-sizes`` sets (DQN:
      ``mlp_hidden_sizes``); ``None``: the agent has no such setting and the
      flag keeps its default.
    image_run_settings: run settings (``RunConfig`` fields) the agent's
      reference uses on image observations (DQN: Nature DQN's schedule); a
      run on images that departs from them gets a warning naming the flags.
    hparam_domains: ``{field: search_space.HParamDomain}``: each
      hyperparameter's meaning, unit and valid range; ``--hparams``,
      ``--search-space`` and the default space are checked against it. A
      field without one is unchecked (``fastpbrl info`` says so).
    renamed_hparams: ``{old name: the rest of a one-line message}`` for
      hyperparameters that were renamed, e.g. ``'policy_delay': 'was
      renamed policy_update_fraction (...)'``: an old name is refused with it.
    example_env: an env the agent acts in, for what needs one without a
      run (``fastpbrl info AGENT`` without ``--env``).
    learns_from: ``'replay'`` or ``'rollout'`` (``Agent.learns_from``): a
      run's settings are checked against it before the agent is made.
    module: the module that registered it.
  """

  name: str
  make_agent: Callable[[specs.EnvironmentSpec, Any], Agent]
  config: type
  default_search_space: ss.SearchSpace
  shared_critic: Optional[Callable[[specs.EnvironmentSpec, Any],
                                   SharedCritic]] = None
  hidden_sizes_field: Optional[str] = 'hidden_sizes'
  image_run_settings: Optional[Mapping[str, Any]] = dataclasses.field(
      default=None, hash=False)
  hparam_domains: Mapping[str, ss.HParamDomain] = dataclasses.field(
      default_factory=dict, hash=False)
  renamed_hparams: Mapping[str, str] = dataclasses.field(
      default_factory=dict, hash=False)
  example_env: str = 'Pendulum-v1'
  learns_from: str = 'replay'
  module: str = ''

  def check_hparams(self, values: Mapping[str, float]) -> None:
    """Checks hyperparameter values against the agent's domains.

    Raises:
      ValueError: one line naming the field, the value and the valid range.
    """
    ss.check_values(self.hparam_domains, values, self.renamed_hparams)

  def check_search_space(self, space: ss.SearchSpace) -> None:
    """Checks that ``space`` stays inside the agent's domains.

    Raises:
      ValueError: one line naming the field, the bound and the valid range.
    """
    ss.check_space(self.hparam_domains, space, self.renamed_hparams)


_REGISTRY: dict[str, AgentSpec] = {}


def register(name: str, *, make_agent: Callable[..., Agent], config: type,
             default_search_space: Union[ss.SearchSpace, Mapping[str, Any]],
             shared_critic: Optional[Callable[..., SharedCritic]] = None,
             hidden_sizes_field: Optional[str] = 'hidden_sizes',
             image_run_settings: Optional[Mapping[str, Any]] = None,
             hparam_domains: Optional[Mapping[str, ss.HParamDomain]] = None,
             renamed_hparams: Optional[Mapping[str, str]] = None,
             example_env: str = 'Pendulum-v1',
             learns_from: str = 'replay') -> AgentSpec:
  """Registers an agent under ``name`` and returns its ``AgentSpec``.

  Call it at a module's top level (not under ``if __name__ ==
  '__main__':``): spawned actor processes re-import the module and must find
  the agent registered again.

  ``hparam_domains`` declares each hyperparameter's meaning, unit and
  valid range (``search_space.HParamDomain``); leave it out and values are
  unchecked. The default search space must lie inside it.
  ``learns_from='rollout'`` registers an on-policy agent (see
  ``fastpbrl.agents.base``): its config needs ``rollout_length`` and
  ``num_envs`` too.

  Raises:
    ValueError: a bad name or config class, a search space that is not one
      or leaves ``hparam_domains``, or ``name`` already registered by
      another module.
  """
  if not name or ':' in name or name != name.strip():
    raise ValueError(f'agent name must be non-empty, without ":" or spaces '
                     f'at the ends, got {name!r}')
  if not callable(make_agent):
    raise ValueError(f'agent {name!r}: make_agent must be callable')
  if not dataclasses.is_dataclass(config) or not isinstance(config, type):
    raise ValueError(f'agent {name!r}: config must be a dataclass class, got '
                     f'{config!r}')
  if learns_from not in LEARNS_FROM:
    raise ValueError(f'agent {name!r}: learns_from must be one of '
                     f'{LEARNS_FROM}, got {learns_from!r}')
  fields = {f.name for f in dataclasses.fields(config)}
  wanted = REQUIRED_CONFIG_FIELDS + ((hidden_sizes_field,)
                                     if hidden_sizes_field else ()) + (
      ROLLOUT_CONFIG_FIELDS if learns_from == 'rollout' else ())
  missing = [f for f in wanted if f not in fields]
  if missing:
    raise ValueError(f'agent {name!r}: config {config.__name__} has no field '
                     f'{", ".join(missing)}')
  if not isinstance(default_search_space, ss.SearchSpace):
    default_search_space = ss.SearchSpace(dict(default_search_space))
  domains = dict(hparam_domains or {})
  bad = [k for k, v in domains.items() if not isinstance(v, ss.HParamDomain)]
  if bad:
    raise ValueError(f'agent {name!r}: hparam_domains[{bad[0]!r}] is not a '
                     'fastpbrl.core.search_space.HParamDomain')
  renamed = dict(renamed_hparams or {})
  try:
    ss.check_space(domains, default_search_space, renamed)
  except ValueError as e:
    raise ValueError(f'agent {name!r}: default_search_space: {e}') from None
  spec = AgentSpec(name=name, make_agent=make_agent, config=config,
                   default_search_space=default_search_space,
                   shared_critic=shared_critic,
                   hidden_sizes_field=hidden_sizes_field,
                   image_run_settings=(None if image_run_settings is None
                                       else dict(image_run_settings)),
                   hparam_domains=domains, renamed_hparams=renamed,
                   example_env=example_env, learns_from=learns_from,
                   module=getattr(make_agent, '__module__', ''))
  old = _REGISTRY.get(name)
  # The same code registering again (a reload, or one file imported under
  # two module names: __main__ and its import path, or a path and a package)
  # replaces its own entry.
  if old is not None and (code_identity(old.make_agent)
                          != code_identity(make_agent)):
    raise ValueError(f'agent {name!r} is already registered by '
                     f'{old.module}; choose another name')
  _REGISTRY[name] = spec
  return spec


def known() -> tuple[str, ...]:
  """Names ``--agent`` accepts without a module: built-ins, then the others
  registered in this process."""
  return known_names(_REGISTRY, BUILTIN)


def get(ref: str) -> AgentSpec:
  """The spec ``ref`` names (see the module docstring), importing what it
  needs.

  Raises:
    ValueError: one line saying why ``ref`` names no agent.
  """
  spec, found = find(ref, _REGISTRY, BUILTIN, 'an agent',
                     'fastpbrl.agents.register')
  if spec is not None:
    return spec
  module, attr = found
  value = getattr(module, attr, None)
  if isinstance(value, AgentSpec):
    return value
  if value is None and attr in _REGISTRY:
    return _REGISTRY[attr]
  raise ValueError(f'{ref!r}: module {module.__name__} has no AgentSpec '
                   f'{attr!r} (what fastpbrl.agents.register returns) and '
                   f'registers no agent of that name')


def make_agent(ref: str, env_spec: specs.EnvironmentSpec,
               config: Any = None) -> Agent:
  """Builds the agent ``ref`` names for ``env_spec`` (``config``: the
  spec's defaults if ``None``); its ``shared_critic`` comes from the spec
  when ``make_agent`` left it out. Picklable as
  ``functools.partial(make_agent, ref, config=config)``: what actors get."""
  spec = get(ref)
  config = spec.config() if config is None else config
  agent = spec.make_agent(env_spec, config)
  if agent.shared_critic is None and spec.shared_critic is not None:
    agent = dataclasses.replace(agent,
                                shared_critic=spec.shared_critic(env_spec, config))
  if agent.name != spec.name:
    agent = dataclasses.replace(agent, name=spec.name)
  if agent.learns_from != spec.learns_from:
    raise ValueError(f'agent {spec.name!r} was registered with learns_from='
                     f'{spec.learns_from!r} but its make_agent built one '
                     f'that learns from {agent.learns_from!r}')
  return agent
