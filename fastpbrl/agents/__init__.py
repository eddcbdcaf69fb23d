"""Agents: TD3, SAC and DQN as pure functions (see ``base.py`` for the contract)."""

from fastpbrl.agents.base import Agent, SharedCritic

AGENTS = ('td3', 'sac', 'dqn')


def make_agent(name: str, env_spec, config=None) -> Agent:
  """Builds agent ``name`` (one of ``AGENTS``) for ``env_spec``."""
  if name == 'td3':
    from fastpbrl.agents import td3 as module
    default = module.TD3Config
  elif name == 'sac':
    from fastpbrl.agents import sac as module
    default = module.SACConfig
  elif name == 'dqn':
    from fastpbrl.agents import dqn as module
    default = module.DQNConfig
  else:
    raise ValueError(f'unknown agent {name!r}; choose one of {AGENTS}')
  return module.make_agent(env_spec, config or default())


__all__ = ['AGENTS', 'Agent', 'SharedCritic', 'make_agent']
