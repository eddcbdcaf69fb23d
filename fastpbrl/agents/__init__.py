"""Agents: TD3, SAC, DQN and PPO as pure functions, and the registry that adds
others, from user code too (see ``base.py`` for the contract)."""

from fastpbrl.agents.base import Agent, SharedCritic, with_defaults
from fastpbrl.agents.registry import (BUILTIN, AgentSpec, get, known,
                                      make_agent, register)

AGENTS = tuple(BUILTIN)  # the built-in agents' names

__all__ = ['AGENTS', 'Agent', 'AgentSpec', 'SharedCritic', 'get', 'known',
           'make_agent', 'register', 'with_defaults']
