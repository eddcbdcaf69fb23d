"""Building a run from its settings (host-side; not jittable).

The env spec, the agent (with the run's size overrides), the mesh the
population is split over, the processes the run spans, the run folder and
the initial population: everything ``fastpbrl.run.main.run`` needs before the
first learner call, each refused with one line naming its flag.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time

import gymnasium as gym
import jax

from fastpbrl import agents as agents_lib
from fastpbrl.config.agent_settings import agent_config, agent_spec
from fastpbrl.config.checks import parse_hparams
from fastpbrl.config.derived import path_kind, resolved
from fastpbrl.config.errors import ConfigError, check
from fastpbrl.config.fields import RunConfig
from fastpbrl.core import search_space as ss
from fastpbrl.core.imports import add_cwd_to_path
from fastpbrl.core.types import make_env_spec as spec_of
from fastpbrl.datapath import factory
from fastpbrl.devices import cores, distributed
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.envs import params as env_params
from fastpbrl.envs.gym import make_env, parameters_of
from fastpbrl.envs.jax_envs import is_jax_env
from fastpbrl.replay.buffers import format_bytes
from fastpbrl.replay.device import device_memory_bytes
from fastpbrl.rules.base import Population

log = logging.getLogger('fastpbrl')


def make_env_spec(env_id: str):
  """Env spec for ``env_id``, with a clear error for an unknown id or a
  space the library cannot serve."""
  if is_jax_env(env_id):  # gymnax:..., brax:...: no gymnasium env to probe
    try:
      return jax_envs.make(env_id).env_spec
    except jax_envs.JaxEnvError as e:
      raise ConfigError(str(e)) from None
  if ':' in env_id:  # 'mymod:Point-v0': mymod may sit where the command runs
    add_cwd_to_path()
  try:
    env = make_env(env_id)
  except gym.error.Error as e:
    raise ConfigError(f'--env {env_id!r} cannot be made: {e}') from None
  except ImportError as e:  # 'mymod:Point-v0' whose module does not import
    module = env_id.split(':', 1)[0]
    raise ConfigError(f'--env {env_id!r}: module {module!r} cannot be '
                      f'imported ({e.__class__.__name__}: '
                      f'{str(e).splitlines()[0] if str(e) else e!r}); put it '
                      'on PYTHONPATH or install it'
                      f'{jax_envs.unregistered_family_hint(module)}') from None
  try:
    return spec_of(env)
  except ValueError as e:  # an observation or action space it cannot serve
    raise ConfigError(f'--env {env_id!r}: {e}') from None
  finally:
    env.close()


def make_agent(config: RunConfig, env_spec):
  """The agent ``config.agent`` names, its static config as the run's
  settings make it (``config.agent_config``: the size flags, then
  ``--agent-settings``), its defaults from ``--hparams``."""
  spec = agent_spec(config.agent)
  agent_settings = agent_config(config)
  if not path_kind(config).random_warmup:
    warn_warmup_ignored(config)
  try:
    agent = agents_lib.make_agent(config.agent, env_spec, agent_settings)
    # What the run's data path cannot run (the actors' rollouts), refused
    # before the run folder is made rather than when the path starts.
    factory.check_agent(config, agent)
  except ValueError as e:
    message = str(e)
    raise ConfigError(message if message.startswith('--') else
                      f'--agent {config.agent} on --env {config.env}: '
                      f'{message}') from None
  if spec.image_run_settings and len(env_spec.observations.shape) == 3:
    warn_image_run_settings(config, spec)
  agent = with_env_parameters(agent, config.env)
  values = parse_hparams(config.hparams)
  if not values:
    return agent
  check_env_values(values, config.env)
  try:
    return agents_lib.with_defaults(agent, **values)
  except ValueError as e:
    raise ConfigError(f'--hparams: {e}') from None


def with_env_parameters(agent, env_id: str):
  """``agent`` with one ``env_<name>`` hyperparameter per parameter the
  env declares (``fastpbrl.envs.params``); ``agent`` for an env without."""
  try:
    return env_params.with_env_params(agent, parameters_of(env_id))
  except ValueError as e:
    raise ConfigError(f'--env {env_id}: {e}') from None


def check_env_values(values: dict, env_id: str) -> None:
  """``--hparams`` values of env parameters: parameters of ``env_id``, in
  their declared domains."""
  params = parameters_of(env_id)
  unknown = env_params.unknown_fields(values, params, env_id)
  check(unknown is None, f'--hparams {unknown}')
  try:
    ss.check_values(env_params.domains(params), values)
  except ValueError as e:
    raise ConfigError(f'--hparams {e}') from None


def warn_warmup_ignored(config: RunConfig) -> None:
  """Warns that ``--warmup-steps`` means nothing to an agent that learns
  from its own rollouts (it acts with its policy from the first step), where
  it is not the default ``resolved`` derives from the budget (a preset's,
  or one given): refusing it would refuse every preset that sets one."""
  default = resolved(dataclasses.replace(config, warmup_steps=None))
  if config.warmup_steps not in (None, 0, default.warmup_steps):
    log.warning('--warmup-steps %d is ignored: --agent %s learns from its '
                'own rollouts, acting with its policy from the first step',
                config.warmup_steps, config.agent)


def warn_image_run_settings(config: RunConfig, spec) -> None:
  """Warns, naming each flag, where a run on image observations departs
  from the run settings the agent registered for images
  (``image_run_settings``: DQN's are Nature DQN's schedule)."""

  def differs(name, ours, reference):
    name = name.replace('_', '-')
    if isinstance(reference, bool):  # a flag pair: --name / --no-name
      return (f'--{"" if ours else "no-"}{name} (reference: '
              f'--{"" if reference else "no-"}{name})')
    return f'--{name} {ours} (reference: {reference})'

  differ = [differs(k, getattr(config, k), v)
            for k, v in spec.image_run_settings.items()
            if getattr(config, k) != v]
  if differ:
    log.warning('%s on image observations with %s; its reference settings '
                'are image_run_settings of its registration (%s)', spec.name,
                ', '.join(differ), spec.module)


def use_every_core(config: RunConfig) -> None:
  """One host device per core for a run whose envs are stepped on the
  device (``fastpbrl.devices.cores``), the cores shared by the processes
  the environment names (``fastpbrl.launch``, SLURM); call before any JAX
  operation, ``jax.distributed.initialize`` included. The actor path keeps
  the cores for its actors.

  Raises:
    ConfigError: ``FASTPBRL_CPU_DEVICES`` is not a positive integer.
    ValueError: the environment names processes wrongly.
  """
  if not is_jax_env(config.env):
    return
  settings = distributed.settings_from_env()
  num_processes = 1 if settings is None else settings['num_processes']
  try:
    count = cores.cpu_devices_for(config.devices, config.population_size,
                                  num_processes)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if count is None:
    return
  if cores.set_cpu_devices(count):
    log.info('%d host CPU devices for %d cores (the population is stepped '
             'on the device; %s=N or --devices choose)', count,
             cores.available_cores(), cores.CPU_DEVICES_VAR)
  else:
    log.info('JAX started before the run, so it keeps the CPU devices it '
             'has (%d); for one per core, call fastpbrl.train before any '
             'JAX operation, or set %s before Python starts',
             len(jax.local_devices()), cores.CPU_DEVICES_VAR)


def population_mesh(config: RunConfig):
  """The mesh ``--devices`` asks for, logged; None for one device (the
  unsharded program, exactly as without sharding). Over several processes
  (``fastpbrl.devices.distributed``) the mesh is always every process's devices."""
  if jax.process_count() > 1:
    total = len(jax.devices())
    check(str(config.devices).strip().lower() in ('auto', str(total)),
          f'--devices {config.devices}: a run over {jax.process_count()} '
          f'processes uses all their {total} devices; use auto')
    check(config.population_size % total == 0,
          f'--population-size {config.population_size} does not split '
          f'evenly over the {total} devices of {jax.process_count()} '
          f'processes; use a multiple of {total}')
  try:
    devices = sharding.choose_devices(config.devices, config.population_size)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  mesh = sharding.make_mesh(devices) if len(devices) > 1 else None
  log.info('%s', sharding.describe(mesh, config.population_size))
  return mesh


def check_processes(config: RunConfig, rule, mesh):
  """The run's ``distributed.Processes``; over several processes, refuses
  (one line naming the flag) what does not work there yet."""
  processes = distributed.Processes(mesh, config.population_size)
  if not processes.several:
    return processes
  where = f'over {processes.count} processes'
  check(rule.multi_process,
        f'fastpbrl {rule.name} does not run {where} yet')
  problem = rule.multi_process_problem(config, where)
  check(problem is None, problem or '')
  check(rule.shared_replay or not rule.shares_replay(),
        f'--shared-replay: {where} each process keeps a replay of its own '
        'members only; run it in one process, or drop it')
  jax_env = is_jax_env(config.env)
  check(jax_env or config.replay_location in ('auto', 'host'),
        f'--replay-location {config.replay_location}: {where} each process '
        'samples its members from a host replay; use auto or host')
  log.info('process %d of %d: members %d-%d of %d (%s live here)',
           processes.index, processes.count, processes.local.start,
           processes.local.stop - 1, config.population_size,
           path_kind(config).lives_here)
  return processes


def shard_state(learner, state, hparams):
  """``(state, hparams)`` placed on the learner's mesh (a restored
  checkpoint is host arrays); unchanged for a learner without one."""
  if getattr(learner, 'mesh', None) is None:
    return state, hparams
  state, hparams, _ = learner.shard(state, hparams)
  return state, hparams


def default_run_dir(rule: str, agent: str, env: str,
                    root: str = 'runs') -> str:
  """Creates and returns a new ``runs/<rule>-<agent>-<env>-<time>``; the
  env id's ``/`` and ``:`` (``ALE/Pong-v5``, ``mymod:Point-v0``) become
  ``_``. Two runs started in the same second from one folder (a job
  array, two terminals) get ``-2``, ``-3``, ... rather than one folder:
  the folder is claimed with an exclusive ``mkdir``."""
  stamp = time.strftime('%Y%m%d-%H%M%S')
  env = env.replace('/', '_').replace(':', '_')
  base = os.path.join(root, f'{rule}-{agent}-{env}-{stamp}')
  os.makedirs(root, exist_ok=True)
  for k in itertools.count(1):
    path = base if k == 1 else f'{base}-{k}'
    try:
      os.mkdir(path)
      return path
    except FileExistsError:
      continue


def initial_population(config: RunConfig, rule, agent, learner):
  """``(state, hparams, rule_state)`` of a new run, from ``config.seed``:
  the rule's initial hyperparameters, the learner's initial state and the
  rule's ``init`` (which may change that state), placed on the learner's
  mesh."""
  key = jax.random.PRNGKey(config.seed)
  k_hparams, k_init, k_rule = jax.random.split(key, 3)
  try:
    hparams = rule.initial_hparams(k_hparams, agent, config.population_size)
  except ConfigError:
    raise  # already names its flag
  except ValueError as e:  # e.g. a search space that does not fit the agent
    raise ConfigError(f'initial hyperparameters: {e}') from None
  k_init, k_population = jax.random.split(k_init)
  rule_state, state = rule.init(k_rule, Population(
      agent, learner.init(k_init, hparams), hparams, k_population))
  state, hparams = shard_state(learner, state, hparams)
  return state, hparams, rule_state


def assemble(rule):
  """``(agent, learner, state, hparams, rule_state)``: what ``rule`` runs
  with in one process on one device, built from ``rule.config`` (to read a
  run's checkpoint into, or to drive a rule outside a run)."""
  config = rule.config
  agent = make_agent(config, make_env_spec(config.env))
  rule.prepare(agent)
  learner = rule.make_learner(agent, agent.config.steps_per_call)
  state, hparams, rule_state = initial_population(config, rule, agent,
                                                  learner)
  return agent, learner, state, hparams, rule_state


def check_population_memory(config: RunConfig, agent, mesh=None) -> None:
  """Refuses (one line naming --population-size) a population whose
  members' training states (parameters, target parameters, optimizer
  states: one member's, from ``jax.eval_shape``, times the population) are
  larger than the memory of the devices they are placed on (the machine's
  on the CPU backend), before any folder is made or array allocated."""
  try:
    shapes = jax.eval_shape(agent.init, jax.random.PRNGKey(0),
                            agent.default_hparams())
  except Exception:  # noqa: BLE001 (an agent of a user's: not estimated)
    return
  member = sum(leaf.size * leaf.dtype.itemsize
               for leaf in jax.tree.leaves(shapes))
  memory = device_memory_bytes()
  if memory is None:
    try:
      memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError):
      return
  memory *= 1 if mesh is None else mesh.devices.size
  need = member * config.population_size
  check(need <= memory,
        f'--population-size {config.population_size}: the members\' '
        f'parameters and optimizer states alone need {format_bytes(need)} '
        f'({format_bytes(member)} each), more than the '
        f'{format_bytes(memory)} of memory they would live in; lower '
        '--population-size or --hidden-sizes')
