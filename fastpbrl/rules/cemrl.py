"""CEM-RL's host-side half: its run settings and driver (not jittable).

The pure half, the diagonal cross-entropy method and the RL half's schedule
in the shared-critic update, is ``fastpbrl.population.cem``. Here:
``CEMRLRunConfig`` (the ``fastpbrl cemrl`` flags, with the budget of the
whole population) and ``CEMRLDriver`` (Algorithm 1's generations; its
docstring lists the departures the asynchronous pipeline forces).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.evaluation import evaluate_policy
from fastpbrl.learner import population_hparams
from fastpbrl.population import cem as cem_lib
from fastpbrl.rules.common import FreshEpisodes, _check_shared_critic
from fastpbrl.run import Driver, Loop, RunConfig, _check, hparam_rows


@dataclasses.dataclass
class CEMRLRunConfig(RunConfig):
  """CEM-RL (Pourchot & Sigaud 2019) with the 2022 paper's shared critic.

  The budget is stated as CEM-RL states it: env steps of the whole
  population together (``--total-env-steps``), not per member.
  """

  agent: str = 'td3'
  """Agent with the shared-critic update this rule trains: td3 (SAC and DQN
  have none), or one of your own that registers it (module:attribute)."""

  population_size: int = 6
  """Number of members (even: CEM samples mirrored pairs)."""
  total_env_steps: int = 180_000
  """Budget: env steps of the WHOLE POPULATION together, as CEM-RL states
  budgets (its paper: 1,000,000 on HalfCheetah with 10 members). The random
  warm-up and the steps actors collect while the RL half trains count too."""
  env_steps: Optional[int] = None
  """Per-member budget, which CEM-RL derives: ceil(--total-env-steps /
  --population-size). Leave it unset."""
  update_to_data_ratio: Optional[float] = None
  """Rate limiter cap in update steps per env step PER MEMBER; default: the
  population size, i.e. one shared-critic step per env step of the
  population (CEM-RL's ratio). Higher: fewer env steps collected while the
  RL half trains, more idle learner calls while the population is evaluated."""
  rl_fraction: float = 0.5
  """Fraction of each generation that takes TD3 steps through the shared critic."""
  elite_fraction: float = 0.5
  """Fraction of the population the CEM distribution is refit on."""
  initial_variance: float = 1e-3
  """Initial variance of the CEM distribution around the initial policy."""
  initial_extra_noise: float = 1e-2
  """Extra variance added at each update; decays towards --noise-limit."""
  noise_decay: float = 0.95
  """Factor of the extra noise's geometric decay."""
  noise_limit: float = 1e-5
  """Value the extra noise decays towards."""
  action_noise: float = 0.0
  """Gaussian action noise of the members' episodes (CEM-RL: none; the
  population's parameter noise explores). Fitness episodes are played with it."""
  mean_eval_episodes: int = 1
  """Episodes of the distribution's mean policy after each generation."""


class CEMRLDriver(Driver):
  """CEM-RL's generations (Algorithm 1 of Pourchot & Sigaud 2019).

  Generation ``g``, in two phases:

  * train: ``N`` policies are sampled from the CEM distribution and loaded
    into the actors and their target actors, with fresh policy optimizer
    states (line 10; the authors' code builds a new Adam for each RL actor).
    The RL half (members ``0 .. round(rl_fraction N) - 1``) then takes
    ``actor_steps[g]`` update steps through the shared critic
    (``cem.with_rl_schedule``): each step is one TD3 policy step per RL
    member and one critic step whose loss is averaged over the RL members.
    So, per generation, each RL actor takes ``actor_steps[g]`` actor steps and
    the critic ``actor_steps[g]`` critic steps, Algorithm 1's counts (its
    sequential loop gives the critic ``2 actor_steps / n`` steps per RL actor,
    ``actor_steps`` in all).
  * eval: the learner's calls change nothing; each member's fitness is the
    return of its first training episode that starts after the trained
    policies were published. Then the CEM distribution is refit on the
    ``N`` policies (the trained ones fed back, line 13) and the mean policy
    is evaluated in the learner process (``mean_policy.csv``).

  ``actor_steps[g + 1]`` is the total length of generation ``g``'s fitness
  episodes (lines 14-17: the env steps of the evaluations);
  ``actor_steps[1] = 0``, so the first generation is evaluated untrained.

  Departures from the paper, all forced by the asynchronous pipeline (the
  paper's loop is sequential) except the first:

  * the critic update is the 2022 paper's vectorized one (sec. 4.2): each
    step, every RL member's batch goes through its own target policy and
    the critic loss is their mean; ``policy_delay`` is 1 for all members
    (as in the 2022 authors' code), which gives the counts above;
  * actors never pause. While the RL half trains they keep stepping (with
    the policies being trained) at the rate limiter's pace, one env step per
    member per ``--update-to-data-ratio`` update steps (by default one
    population env step per update step, i.e. ``actor_steps`` env steps in
    all); in the eval phase each member finishes the episode in progress
    (and what its actor had already queued, up to 8 chunks of 32 steps)
    before its fitness episode starts, and keeps acting until the slowest
    member's ends. All these steps go into the replay and count in
    ``--total-env-steps``, but not in ``actor_steps`` (the paper collects
    none of them), so a budget buys fewer generations and fewer critic
    steps than in the paper, which has one critic step per env step. At
    the default ratio a generation collected about 3 times ``actor_steps``
    env steps on HalfCheetah-v5 (12,032 for 4,000 with 4 members and
    1,000-step episodes) and 4 times on Pendulum-v1 (200-step episodes);
  * the rate limiter paces the actors by the learner's update steps, so the
    learner keeps calling (with every step inactive) during the eval phase;
  * the learner runs whole calls of ``--steps-per-call`` steps: a
    generation's last training call has only its first ``actor_steps mod
    steps_per_call`` steps active (a traced bound, ``train_until``), so the
    counts are exact, with no rounding;
  * the warm-up is ``--warmup-steps`` random-action steps per member before
    the first generation; the paper instead runs its first generations
    (``start_steps`` = 10,000 env steps in all) without RL training.
  """

  name = 'cemrl'
  shared_critic = True
  shared_replay = True
  min_population = 2

  def __init__(self, config: CEMRLRunConfig):
    config = self.resolve(config)
    super().__init__(config)
    _check_shared_critic('CEM-RL', config)
    _check(config.population_size % 2 == 0, f'--population-size must be even '
           f'(mirrored sampling), got {config.population_size}')
    _check(0 < config.rl_fraction <= 1,
           f'--rl-fraction must be in (0, 1], got {config.rl_fraction}')
    _check(0 < config.elite_fraction <= 1,
           f'--elite-fraction must be in (0, 1], got {config.elite_fraction}')
    _check(config.initial_variance > 0, '--initial-variance must be > 0')
    _check(config.initial_extra_noise >= 0, '--initial-extra-noise must be >= 0')
    _check(0 < config.noise_decay < 1, '--noise-decay must be in (0, 1)')
    _check(config.noise_limit >= 0, '--noise-limit must be >= 0')
    _check(config.action_noise >= 0, '--action-noise must be >= 0')
    _check(config.mean_eval_episodes >= 1, '--mean-eval-episodes must be >= 1')
    n = config.population_size
    self.num_rl = max(1, round(config.rl_fraction * n))
    self.phase = 'train'
    self.generation = 0  # CEM updates done
    self.actor_steps = 0  # Algorithm 1's actor_steps for this generation
    self.critic_steps = 0  # shared critic steps so far (state.step)
    self.fresh = FreshEpisodes(n)  # the eval phase scores fresh episodes
    self.resumed = False
    self.fitness = np.full((n,), np.nan)
    self.lengths = np.zeros((n,), np.int64)  # of the fitness episodes
    # (generation, total env steps, actor steps, mean-policy return)
    self.mean_returns: list[tuple[int, int, int, float]] = []
    self.cem_state = None
    self.unravel = None
    self.initial_policy_opt = None
    self.agent = None

  @staticmethod
  def resolve(config: CEMRLRunConfig) -> CEMRLRunConfig:
    """The config ``run`` gets (``driver.config``): the per-member budget
    from ``--total-env-steps`` and the default update-to-data ratio filled in.
    Idempotent, so a resumed run resolves its saved config alike."""
    _check(config.total_env_steps > 0,
           f'--total-env-steps must be > 0, got {config.total_env_steps}')
    n = config.population_size
    if n < 1:
      return config  # validate names --population-size
    per_member = -(-config.total_env_steps // n)
    # A resume re-derives it from the (possibly raised) --total-env-steps.
    _check(config.env_steps in (None, per_member) or config.resume is not None,
           f'--env-steps is per member and CEM-RL derives it from '
           f'--total-env-steps, the budget of the whole population as the '
           f'paper states it: pass --total-env-steps '
           f'{(config.env_steps or 0) * n} for {config.env_steps} per member')
    _check(config.warmup_steps * n < config.total_env_steps,
           f'--warmup-steps {config.warmup_steps} per member '
           f'({config.warmup_steps * n} in all) must be below '
           f'--total-env-steps {config.total_env_steps}')
    ratio = config.update_to_data_ratio
    return dataclasses.replace(
        config, env_steps=per_member,
        update_to_data_ratio=float(n) if ratio is None else ratio)

  def initial_hparams(self, key, agent, population_size):
    del key
    # policy_delay 1 (an agent that has one, as TD3): every critic step comes
    # with one policy step per RL member, so both counts are actor_steps
    # (see the class docstring).
    fields = agent.default_hparams()._fields
    every_step = {'policy_delay': 1.0} if 'policy_delay' in fields else {}
    return cem_lib.rl_hparams(population_hparams(
        agent, population_size, **every_step))

  def shared_critic_update(self, agent):
    return cem_lib.with_rl_schedule(agent.shared_critic, self.num_rl)

  def actor_hparams(self, hparams):
    agent = hparams.agent
    return agent._replace(exploration_noise=jnp.full_like(
        agent.exploration_noise, self.config.action_noise))

  def hparam_rows(self, hparams) -> list[dict]:
    return hparam_rows(hparams.agent)

  def _sample_generation(self, key, state):
    flat = cem_lib.sample(key, self.cem_state, self.config.population_size)
    return cem_lib.load_policies(state, flat, self.unravel,
                                 reset={'policy_opt': self.initial_policy_opt})

  def initialize(self, key, state, agent):
    flat, self.unravel = cem_lib.flatten_population(state.policy)
    self.cem_state = cem_lib.init(
        flat[0], initial_var=self.config.initial_variance,
        initial_extra_noise=self.config.initial_extra_noise)
    # The freshly initialised policy optimizer state. Adam's depends only on
    # the parameters' shapes, so it is the fresh state of any sampled policy.
    self.initial_policy_opt = jax.tree.map(jnp.copy, state.policy_opt)
    self.agent = agent
    # Generation 1: actor_steps = 0, and hparams' train_until is 0.
    return self._sample_generation(key, state)

  def _start_evaluation(self, loop: Loop) -> None:
    self.phase = 'eval'
    self.fitness[:] = np.nan
    self.lengths[:] = 0
    # The trained policies go out with the publish that follows this call.
    self.fresh.renew(loop, np.ones(self.fitness.shape, bool))

  def after_call(self, loop: Loop) -> None:
    # state.step, counted on the host so that no call waits for the last
    # one to finish: a call's steps are active while step < train_until
    # (``cem_lib.with_rl_schedule``), each adding one.
    train_until = int(np.asarray(loop.hparams.train_until)[0])
    self.critic_steps = min(self.critic_steps + loop.learner.num_steps,
                            max(self.critic_steps, train_until))
    if self.phase == 'train':
      if self.critic_steps >= train_until:
        device_steps = int(loop.state.step)  # a rule decision: may sync
        if device_steps != self.critic_steps:
          raise RuntimeError(f'CEM-RL counted {self.critic_steps} shared '
                             f'critic steps but the state has {device_steps}')
        self._start_evaluation(loop)
      return
    if self.resumed:
      # Versions restart with a resumed run's pipeline, and its first
      # episodes are random warm-up: score from the next publish on.
      self.resumed = False
      self.fresh.renew(loop, np.ones(self.fitness.shape, bool))
      return
    for r in loop.episodes:
      m = int(r['member'])
      # Training episodes: like Algorithm 1's evaluations they go into the
      # replay and the budget (the pipeline's evaluation episodes do not).
      if (not r['evaluation'] and np.isnan(self.fitness[m])
          and self.fresh.keep(r)):
        self.fitness[m] = float(r['episode_return'])
        self.lengths[m] = int(r['episode_length'])
    if np.isnan(self.fitness).any():
      return
    flat, _ = cem_lib.flatten_population(loop.state.policy)
    self.cem_state = cem_lib.update(
        self.cem_state, flat, jnp.asarray(self.fitness, jnp.float32),
        elite_fraction=self.config.elite_fraction,
        noise_decay=self.config.noise_decay,
        noise_limit=self.config.noise_limit)
    self.generation += 1
    mean_return = float(np.mean(evaluate_policy(
        self.agent, self.config.env, self.unravel(self.cem_state.mean),
        self.config.mean_eval_episodes,
        seed=self.config.seed + 10_000 * self.generation)))
    # The run's count: the least member's env steps, times N.
    total_env_steps = loop.env_steps * self.config.population_size
    self.mean_returns.append((self.generation, total_env_steps,
                              self.actor_steps, mean_return))
    with open(os.path.join(loop.run_dir, 'mean_policy.csv'), 'a') as f:
      if f.tell() == 0:
        f.write('generation,total_env_steps,actor_steps,mean_policy_return\n')
      f.write(f'{self.generation},{total_env_steps},{self.actor_steps},'
              f'{mean_return}\n')
    # Algorithm 1, lines 14-17: the next RL actors each train for as many
    # steps as this generation's evaluation episodes took in all.
    self.actor_steps = int(self.lengths.sum())
    self.emit([{'event': 'generation', 'step': loop.update_steps,
                'env_steps': loop.env_steps, 'generation': self.generation,
                'mean_policy_return': mean_return}])
    loop.state = self._sample_generation(loop.next_key(), loop.state)
    loop.hparams = cem_lib.set_train_until(
        loop.hparams, self.critic_steps + self.actor_steps)
    self.phase = 'train'

  def scalars(self) -> dict:
    out = {'generation': self.generation, 'actor_steps': self.actor_steps,
           'critic_steps': self.critic_steps}
    if self.mean_returns:
      out['mean_policy_return'] = self.mean_returns[-1][3]
    return out

  def checkpoint_arrays(self):
    return {'cem': self.cem_state}

  def checkpoint_meta(self) -> dict:
    return {'phase': self.phase, 'generation': self.generation,
            'actor_steps': self.actor_steps,
            'critic_steps': self.critic_steps,
            'mean_returns': self.mean_returns}

  def restore(self, arrays, meta) -> None:
    self.cem_state = cem_lib.CEMState(*[jnp.asarray(x) for x in arrays['cem']])
    self.phase, self.generation = meta['phase'], meta['generation']
    self.actor_steps = meta['actor_steps']
    self.critic_steps = meta['critic_steps']
    # A train phase goes on to its bound (state.step and hparams are
    # restored); an eval phase evaluates the trained policies anew.
    self.resumed = self.phase == 'eval'
    self.fitness = np.full_like(self.fitness, np.nan)
    self.lengths = np.zeros_like(self.lengths)
    self.fresh.restart()
    self.mean_returns = [tuple(x) for x in meta['mean_returns']]

  def summary(self, loop: Loop) -> str:
    del loop
    if not self.mean_returns:
      return 'CEM-RL: no generation finished'
    best = max(r[3] for r in self.mean_returns)
    return (f'CEM-RL: {self.generation} generations, {self.critic_steps} '
            f'critic steps; mean-policy return {self.mean_returns[-1][3]:.1f} '
            f'at the end, best {best:.1f} (mean_policy.csv)')
