"""The settings every rule shares: ``RunConfig``, and its field docs.

Each rule's config subclasses ``RunConfig``; the commands' flags and their
``--help`` text are built from these fields and their docstrings (tyro),
and docs/reference/cli.md from those. Host-side; not jittable.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar, Literal, Mapping, NamedTuple, Optional, TypeVar

from fastpbrl.config.bounds import bounded

C = TypeVar('C', bound='RunConfig')


class Derived(NamedTuple):
  """How a setting left unset (None) follows the budget: ``min(value,
  budget // divisor)``, at least ``least`` (``resolved``); at budgets of
  ``value x divisor`` and more it is ``value``."""

  value: int
  divisor: int
  least: int = 1


@dataclasses.dataclass
class RunConfig:
  """Settings shared by every experiment."""

  env: str = 'Pendulum-v1'
  """gymnasium environment id (MuJoCo v5 envs, classic control, ...), or a
  JAX env stepped on the device inside the learner call: gymnax:NAME
  (gymnax:Pendulum-v1; pip install 'fastpbrl[gymnax]'), brax:NAME
  (brax:hopper; pip install 'fastpbrl[brax]'), or PREFIX:NAME of a family
  registered with fastpbrl.envs.register."""
  agent: str = 'td3'
  """Agent: td3, sac, dqn (dqn needs a Discrete action space), ppo (on-policy:
  learns from its own rollouts), or an agent of your own as
  module:attribute (e.g. examples.ddpg:DDPG, examples.a2c:A2C; see
  fastpbrl/agents/base.py)."""
  population_size: int = 4
  """Number of members trained together."""
  seed: int = 0
  """Fixes initial parameters, hyperparameters, env resets, action noise,
  replay sampling and every rule decision."""
  env_steps: int = bounded(30_000, gt=0)
  """Budget: environment steps per member (training episodes only)."""
  warmup_steps: Optional[int] = bounded(None, ge=0)
  """Random-action steps per member before learning starts (default:
  1,000, or half of --env-steps below 2,000)."""
  update_to_data_ratio: float = bounded(1.0, gt=0, le=64)
  """Target update steps per env step (per member); the learner waits above it."""
  warmup_counts_as_data: bool = True
  """True: the warm-up's env steps count toward the ratio, so right after the
  warm-up the learner takes ratio x warm-up update steps at once, on the
  random-action data. False: only env steps after the warm-up count, as in
  TD3's and Stable-Baselines3's reference loops (one update per env step
  from the warm-up's end: ratio x (env steps - warm-up) in all)."""
  num_actors: Optional[int] = bounded(None, ge=1)
  """Actor processes (default: CPU cores minus one, at least 1; every core
  for on-policy agents such as PPO, whose learner waits while the actors
  step, and whose results the split of members over processes leaves
  unchanged)."""
  vector_envs: bool = True
  """Each actor steps its members' envs as one numpy batch where fastpbrl
  has one for the env (MuJoCo HalfCheetah, Hopper, Walker2d v5;
  Pendulum-v1); gymnasium's own step gives the same results, one env
  after another (--no-vector-envs, and every other env)."""
  envs_per_member: int = bounded(1, ge=1)
  """JAX envs (gymnax:, brax:) only: envs each member acts in at once, on
  the device; a learner call's env steps per member are rounded up to a
  multiple of it."""
  interleave: int = bounded(1, ge=1)
  """JAX envs only: times per learner call the members alternate between
  acting and updating (1: act for the call's env steps, then update; up to
  --steps-per-call: an update after each env step). It must divide the
  call's update steps and env-step batches."""
  hparams: tuple[str, ...] = ()
  """The agent's hyperparameters as NAME=VALUE (e.g. policy_lr=1e-3
  discount=0.98): every member's defaults. Seeds trains with them; PBT and
  HyperTrick start from them and keep those outside the search space
  fixed. fastpbrl info AGENT lists the names."""
  hidden_sizes: Optional[tuple[int, ...]] = None
  """MLP widths of policies and critics (TD3/SAC) or of the Q-MLP (DQN): the
  config field the agent registered as its hidden sizes (default: the
  agent's own, 256 256 for TD3, SAC and DQN, 64 64 for PPO)."""
  agent_settings: tuple[str, ...] = ()
  """Fields of the agent's static config as NAME=VALUE, each parsed to its
  field's type (a sequence as 64,64), e.g. rollout_length=128 num_envs=8
  epochs=4 for PPO; changing one recompiles. fastpbrl info AGENT lists
  them."""
  network_init: Literal['haiku', 'torch'] = 'haiku'
  """How MLP weights start (TD3, SAC): 'haiku' (haiku's default, as in
  Acme: truncated normal of scale 1/sqrt(fan-in), zero biases) or 'torch'
  (PyTorch's, as in Stable-Baselines3 and the TD3/SAC reference code:
  weights and biases uniform in +-1/sqrt(fan-in))."""
  batch_size: Optional[int] = bounded(None, ge=1)
  """Transitions per member per update step (default: the agent's, 256 / 32;
  an on-policy agent's minibatch size)."""
  steps_per_call: Optional[int] = bounded(None, ge=1)
  """Update steps compiled into one learner call (default 50, DQN 10; an
  on-policy agent's are env steps per member, a multiple of its
  rollout_length x num_envs, one iteration by default)."""
  replay_capacity: int = bounded(1_000_000, ge=1)
  """Transitions per replay buffer."""
  shared_replay: bool = False
  """One replay for all members: each member's batches are drawn from every
  member's transitions, so each learns from N times the data at the same
  env steps. Off: each member learns from its own, as in the PBT papers
  (the 2022 paper keeps one replay per agent when tuning hyperparameters).
  CEM-RL and DvD always share one; HyperTrick cannot (it restarts a slot
  with an empty replay of its own). One process only."""
  eval_every: Optional[int] = bounded(None, ge=1)
  """Env steps per member between evaluations (noise-free episodes of one
  frozen policy version); every run also evaluates each member's final
  policy at the end of its budget (default: 5,000, or half of --env-steps
  below 10,000)."""
  eval_episodes: int = bounded(5, ge=1)
  """Episodes per evaluation, played at once (one evaluation env each per
  member); their mean is one point of the return curve."""
  checkpoint_every: int = bounded(5_000, ge=0)
  """Env steps per member between checkpoints, rounded to whole learner
  calls (0: only at the end and on SIGINT/SIGTERM)."""
  checkpoint_replay: bool = False
  """Also store the replay in each checkpoint, so a resume continues with
  the data the run had (off by default: up to GBs per checkpoint; its size
  is logged at each save)."""
  actor_timeout: float = bounded(120.0, gt=0, unit=' seconds')
  """Seconds without a heartbeat after which an actor process counts as
  hung and is killed and restarted."""
  replay_location: Literal['auto', 'host', 'device'] = 'auto'
  """Where the replay lives: host (numpy; batches sampled by a thread and
  copied to the device), device (sampled inside the compiled learner call)
  or auto (device on a GPU/TPU when the replay fits in half its memory,
  host otherwise and on CPU); the choice and its reason are logged."""
  run_dir: Optional[str] = None
  """Where logs and checkpoints go (default: runs/<rule>-<agent>-<env>-<time>)."""
  resume: Optional[str] = None
  """A run directory to continue from its last checkpoint."""
  progress: bool = True
  """Show the progress bar."""
  devices: str = 'auto'
  """Devices to split the population over (one program, members sharded
  along the population axis): auto (every visible device if the population
  divides evenly by their count, else 1) or a count k (the first k; it must
  divide --population-size)."""
  track: Literal['tensorboard', 'wandb', 'mlflow', 'none'] = 'tensorboard'
  """Where scalars go besides the CSVs: tensorboard (event files in the run
  directory), wandb or mlflow (each with the TensorBoard files too; pip
  install 'fastpbrl[wandb]' / 'fastpbrl[mlflow]'), or none."""

  # Interval settings whose unit was not env steps per member before
  # fastpbrl 0.2: {field: (its name then, 'calls' or 'update_steps')}. A
  # run's config.json saved then is read in today's unit (``saved_config``).
  legacy_intervals: ClassVar[Mapping[str, tuple[str, str]]] = {
      'checkpoint_every': ('checkpoint_every', 'calls')}
  # Settings that, left unset (None), follow the budget (``resolved``).
  follows_budget: ClassVar[Mapping[str, Derived]] = {
      'warmup_steps': Derived(1_000, 2, least=0),
      'eval_every': Derived(5_000, 2)}

  def member_budget(self) -> Optional[int]:
    """The env steps per member that ``follows_budget`` settings follow."""
    return self.env_steps


def rule_fields(config) -> tuple[str, ...]:
  """The fields a rule's config adds to ``RunConfig``'s (those its rule
  checks; ``validate`` checks the rest)."""
  shared = {f.name for f in dataclasses.fields(RunConfig)}
  return tuple(f.name for f in dataclasses.fields(config)
               if f.name not in shared)
