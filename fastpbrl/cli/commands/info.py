"""``fastpbrl info``: what can be trained, and with which settings
(host-side).

    fastpbrl info                          # the agents and the rules
    fastpbrl info td3                      # an agent's hyperparameters
    fastpbrl info dqn --env CartPole-v1    # defaults can depend on the env
    fastpbrl info pbt                      # a rule's presets

An agent's page lists each hyperparameter with its default, its valid
range and unit, the prior PBT and HyperTrick search (the agent's default
search space; ``--search-space FILE`` replaces it) and, on the line below,
its meaning: what the agent registered (``hparam_domains``; a field it
declared nothing for reads "undeclared: unchecked"). The defaults are the agent's own for ``--env``:
DQN's differ on image observations. An ``--env`` with parameters searched
as hyperparameters (``fastpbrl.envs.params``: ``fastpbrl info ppo --env
shaped:MountainCar-v0``) adds them, as ``env_<name>``. A rule's page lists its presets and
the settings in which each differs from the first (the default).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from typing import Optional, Sequence

import numpy as np

from fastpbrl import agents as agents_lib
from fastpbrl.config.errors import ConfigError
from fastpbrl.core import search_space as ss
from fastpbrl.envs import params as env_params
from fastpbrl.envs.gym import parameters_of
from fastpbrl.rules import registry
from fastpbrl.run.build import make_env_spec


def describe(dist: ss.Distribution) -> str:
  """One search-space distribution as text (as a search-space file
  spells it)."""
  if isinstance(dist, ss.Categorical):
    return 'categorical ' + ', '.join(f'{v:g}' for v in dist.values)
  kind = {ss.LogUniform: 'log_uniform', ss.Uniform: 'uniform',
          ss.Discount: 'discount'}[type(dist)]
  return f'{kind} [{dist.low:g}, {dist.high:g}]'


def summary(module, width: int = 76) -> str:
  """The first sentence of ``module``'s docstring, cut to ``width``."""
  doc = ' '.join((getattr(module, '__doc__', None) or '').split('\n\n')[0]
                 .split())
  # A sentence ends at '. ' before a capital ('et al. 2018' goes on).
  sentence = re.split(r'(?<=[a-z)])\.\s+(?=[A-Z])', doc)[0].rstrip('.')
  return sentence if len(sentence) <= width else (
      sentence[:width - 3].rsplit(' ', 1)[0] + '...')


def flag(name: str, value) -> str:
  """A setting as the flag that gives it."""
  name = name.replace('_', '-')
  if isinstance(value, bool):
    return f'--{name}' if value else f'--no-{name}'
  if isinstance(value, (tuple, list)):
    return f'--{name} ' + ' '.join(str(v) for v in value)
  return f'--{name} {value}'


def table(rows: Sequence[Sequence[str]]) -> list[str]:
  """Left-aligned columns, two spaces apart."""
  widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
  return ['  '.join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
          for row in rows]


def overview() -> list[str]:
  """The registered agents and rules, one line each."""
  lines = ['agents (--agent; fastpbrl info AGENT for its hyperparameters):']
  for name in agents_lib.known():
    spec = agents_lib.get(name)
    lines.append(f'  {name:<11} {summary(sys.modules.get(spec.module))}'
                 .rstrip())
  lines += ['', 'rules (fastpbrl RULE; fastpbrl info RULE for its presets):']
  for rule in registry.builtins():
    presets = ', '.join(rule.presets)
    lines.append(f'  {rule.name:<11} {rule.help} (presets: {presets})')
  return lines


def agent_page(name: str, env: str) -> list[str]:
  """An agent's hyperparameters on ``env``: default and search range."""
  spec = agents_lib.get(name)
  try:
    agent = spec.make_agent(make_env_spec(env), spec.config())
  except ValueError as e:
    raise ConfigError(f'--env {env}: {e}; pass an env the agent can act '
                      'in') from None
  # An env with parameters adds them as env_<name> fields (env_params).
  params = parameters_of(env)
  agent = env_params.with_env_params(agent, params)
  space = dict(env_params.with_space(spec.default_search_space,
                                     params).distributions)
  domains = {**spec.hparam_domains, **env_params.domains(params)}
  rows = [('hyperparameter', 'default', 'valid range', 'unit',
           'searched by PBT / HyperTrick')]
  meanings = []
  for field, value in agent.default_hparams()._asdict().items():
    domain = domains.get(field)
    rows.append((field, f'{float(np.asarray(value)):g}',
                 str(domain) if domain else 'undeclared: unchecked',
                 (domain.unit or '-') if domain else '-',
                 describe(space[field]) if field in space else 'fixed'))
    meanings.append(domain.meaning if domain else
                    'no meaning or range registered (hparam_domains)')
  lines = table(rows)
  body = [lines[0]]
  for line, meaning in zip(lines[1:], meanings):
    body += [line, f'    {meaning}']
  return [f'{spec.name} ({spec.module}) on {env}: each hyperparameter\'s '
          'default, valid range and unit, the prior PBT and HyperTrick '
          'search (--search-space FILE replaces it; fixed: kept at the '
          'default), and its meaning below it', *body, '',
          'static settings (--agent-settings NAME=VALUE; changing one '
          'recompiles): ' + ', '.join(
              f'{f.name}={_setting_text(getattr(agent.config, f.name))}'
              for f in dataclasses.fields(agent.config))]


def _setting_text(value) -> str:
  """A static setting as ``--agent-settings`` takes it (``64,64``)."""
  if isinstance(value, (tuple, list)):
    return ','.join(str(v) for v in value)
  return str(value)


def rule_page(name: str) -> list[str]:
  """A rule's presets, each with the settings in which it differs from
  the first."""
  rule = registry.get(name)
  names = list(rule.presets)
  first = rule.presets[names[0]]
  lines = [f'{rule.name}: {rule.help}',
           f'presets (--preset; {names[0]} is the default):']
  for preset in names:
    config = rule.presets[preset]
    changed = [flag(f.name, getattr(config, f.name))
               for f in dataclasses.fields(config)
               if getattr(config, f.name) != getattr(first, f.name)]
    lines.append(f'  {preset}: ' + (', '.join(changed) if changed else
                                    f'fastpbrl {registry.ref_of(rule)} '
                                    '--help shows its values'))
  return lines


def parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='fastpbrl info', exit_on_error=False,
      description='The registered agents and rules; an agent\'s '
      'hyperparameters (default and search range) or a rule\'s presets.')
  parser.add_argument('name', nargs='?', default=None,
                      help='an agent or a rule (module:attribute for your own)')
  parser.add_argument('--env', default=None,
                      help='the env an agent\'s defaults are given for '
                      '(default: the example env the agent registered)')
  return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
  try:
    args, unknown = parser().parse_known_args(argv)
  except argparse.ArgumentError as e:
    raise SystemExit(f'error: {e}') from None
  if unknown:
    raise SystemExit(f'error: unknown argument {unknown[0]}; fastpbrl info '
                     '--help lists them')
  try:
    if args.name is None:
      lines = overview()
    elif args.name in agents_lib.known() or _is_agent(args.name):
      lines = agent_page(args.name, args.env
                         or agents_lib.get(args.name).example_env)
    elif ':' in args.name or args.name in registry.known():
      lines = rule_page(args.name)
    else:
      raise SystemExit(
          f'error: {args.name!r} is neither an agent '
          f'({", ".join(agents_lib.known())}) nor a rule '
          f'({", ".join(registry.known())}); give module:attribute for '
          'one of your own')
  except (ConfigError, ValueError) as e:
    raise SystemExit(f'error: {e}') from None
  print('\n'.join(lines))


def _is_agent(ref: str) -> bool:
  """Whether ``ref`` (``module:attribute``) names an agent."""
  if ':' not in ref:
    return False
  try:
    agents_lib.get(ref)
  except ValueError:
    return False
  return True
