"""CEM-RL (Pourchot & Sigaud 2019) with a shared TD3 critic, vectorized over
the population as in the 2022 paper (section 4.2): settings, presets and
Algorithm 1's generations (host-side; the CEM arithmetic and the RL half's
update are jitted or pure JAX).

    fastpbrl cemrl                    # small default: Pendulum-v1, 6 members
    fastpbrl cemrl --preset paper     # HalfCheetah-v5, 10 members, 1M env steps

The budget, --total-env-steps, counts the env steps of the whole population
together, as CEM-RL states budgets (the paper: 1M on HalfCheetah, i.e.
100,000 per member with 10 members). --warmup-steps stays per member.

The pure half, the diagonal cross-entropy method and the RL half's schedule
in the shared-critic update, is ``fastpbrl.rules.cemrl.cem``. Here:
``CEMRLRunConfig`` (the flags, with the budget of the whole population) and
``CEMRL`` (Algorithm 1's generations; its docstring lists the departures
the asynchronous pipeline forces).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.config.bounds import bounded, check_bounds
from fastpbrl.config.derived import resolved
from fastpbrl.config.errors import check
from fastpbrl.config.fields import RunConfig, rule_fields
from fastpbrl.devices.sharding import whole_value
from fastpbrl.learner.population import population_hparams
from fastpbrl.rules.base import (Decision, Observation, Population, Rule,
                                 hparam_rows, split_key)
from fastpbrl.rules.cemrl import cem as cem_lib
from fastpbrl.rules.common import check_shared_critic
from fastpbrl.rules.registry import register

MEAN_POLICY = 'mean_policy.csv'


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
  total_env_steps: int = bounded(180_000, gt=0)
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
  rl_fraction: float = bounded(0.5, gt=0, le=1)
  """Fraction of each generation that takes TD3 steps through the shared critic."""
  elite_fraction: float = bounded(0.5, gt=0, le=1)
  """Fraction of the population the CEM distribution is refit on."""
  initial_variance: float = bounded(1e-3, gt=0)
  """Initial variance of the CEM distribution around the initial policy."""
  initial_extra_noise: float = bounded(1e-2, ge=0)
  """Extra variance added at each update; decays towards --noise-limit."""
  noise_decay: float = bounded(0.95, gt=0, lt=1)
  """Factor of the extra noise's geometric decay."""
  noise_limit: float = bounded(1e-5, ge=0)
  """Value the extra noise decays towards."""
  action_noise: float = bounded(0.0, ge=0)
  """Gaussian action noise of the members' episodes (CEM-RL: none; the
  population's parameter noise explores). Fitness episodes are played with it."""
  mean_eval_episodes: int = bounded(10, ge=1)
  """Episodes of the distribution's mean policy after each generation,
  played at once (CEM-RL's paper scores the mean on 10; one swings by
  more than a thousand on Pendulum-v1 from one generation to the next)."""

  def member_budget(self) -> Optional[int]:
    """Per member: --env-steps once derived, ceil(--total-env-steps /
    --population-size) before."""
    n, total = self.population_size, self.total_env_steps
    if self.env_steps is not None or not (isinstance(total, int)
                                          and isinstance(n, int) and n > 0):
      return self.env_steps
    return -(-total // n)


PRESETS = {
    'small': CEMRLRunConfig(),
    # The paper's HalfCheetah run: 10 members, 1M env steps in all, and
    # 10,000 warm-up steps in all (its start_steps).
    'paper': CEMRLRunConfig(env='HalfCheetah-v5', population_size=10,
                            total_env_steps=1_000_000, warmup_steps=1_000,
                            checkpoint_every=25_000),
}


class CEMRLState(NamedTuple):
  """CEM-RL's bookkeeping (host numpy, but the key, the distribution and the
  fresh policy optimizer state)."""

  key: jax.Array
  # The search distribution: mean and var [D] float32, extra_noise ()
  # float32 (D: the parameters of one policy).
  cem: cem_lib.CEMState
  # The freshly initialised policy optimizer states, [N, ...] leaves: what a
  # newly sampled generation starts from (Adam's depends only on the
  # parameters' shapes, so it is the fresh state of any sampled policy).
  initial_policy_opt: Any
  evaluating: np.ndarray  # () bool: the eval phase (else: train)
  generation: np.ndarray  # () int64: CEM updates done
  actor_steps: np.ndarray  # () int64: Algorithm 1's actor_steps (this one's)
  critic_steps: np.ndarray  # () int64: shared critic steps so far (state.step)
  update_steps: np.ndarray  # () int64: Observation.update_steps, last call
  # [N] float64: each member's fitness in this eval phase, NaN until its
  # fitness episode ends.
  fitness: np.ndarray
  lengths: np.ndarray  # [N] int64: the lengths of those episodes (0: none)
  last_return: np.ndarray  # () float64: the last mean-policy return (NaN: none)
  best_return: np.ndarray  # () float64: the best mean-policy return (NaN: none)
  # () bool: a resumed eval phase, whose first call scores nobody.
  resumed: np.ndarray


@register
class CEMRL(Rule):
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
    the critic loss is their mean; ``policy_update_fraction`` is 1 for all
    members (as in the 2022 authors' code), which gives the counts above;
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
  help = 'CEM-RL: CEM over TD3 policies with a shared critic'
  config_class = CEMRLRunConfig
  presets = PRESETS
  shared_critic = True
  shared_replay = True
  min_population = 2
  log_files = (MEAN_POLICY,)

  def __init__(self, config: CEMRLRunConfig):
    """Checks ``config``, resolved (``resolve``) if it is not yet."""
    # The agent first: its other settings may not apply to an agent
    # without a shared critic (PPO refuses CEM-RL's update-to-data ratio).
    check_shared_critic('CEM-RL', config)
    config = self.resolve(config)
    super().__init__(config)
    check(config.population_size % 2 == 0, f'--population-size must be even '
          f'(mirrored sampling), got {config.population_size}')
    check_bounds(config, rule_fields(config))  # --rl-fraction, --noise-decay...

  @classmethod
  def from_config(cls, config: CEMRLRunConfig) -> Rule:
    return cls(cls.resolve(config))

  @staticmethod
  def resolve(config: CEMRLRunConfig) -> CEMRLRunConfig:
    """The config ``run`` gets (``rule.config``): the per-member budget
    from ``--total-env-steps`` and the default update-to-data ratio filled in.
    Idempotent, so a resumed run resolves its saved config alike."""
    config = resolved(config)
    check_bounds(config, ('total_env_steps',))
    n = config.population_size
    if n < 1:
      return config  # validate names --population-size
    per_member = -(-config.total_env_steps // n)
    # A resume re-derives it from the (possibly raised) --total-env-steps.
    check(config.env_steps in (None, per_member) or config.resume is not None,
          f'--env-steps is per member and CEM-RL derives it from '
          f'--total-env-steps, the budget of the whole population as the '
          f'paper states it: pass --total-env-steps '
          f'{(config.env_steps or 0) * n} for {config.env_steps} per member')
    check(config.warmup_steps * n < config.total_env_steps,
          f'--warmup-steps {config.warmup_steps} per member '
          f'({config.warmup_steps * n} in all) must be below '
          f'--total-env-steps {config.total_env_steps}')
    ratio = config.update_to_data_ratio
    return dataclasses.replace(
        config, env_steps=per_member,
        update_to_data_ratio=float(n) if ratio is None else ratio)

  @property
  def num_rl(self) -> int:
    """The RL half's size: members ``0 .. num_rl - 1``."""
    return max(1, round(self.config.rl_fraction * self.config.population_size))

  def prepare(self, agent) -> None:
    # The mean policy is evaluated with this agent's default hyperparameters.
    self.agent = agent

  def initial_hparams(self, key, agent, population_size):
    del key
    # policy_update_fraction 1 (an agent that has one, as TD3): every
    # critic step comes with one policy step per RL member, so both counts
    # are actor_steps (see the class docstring).
    fields = agent.default_hparams()._fields
    every_step = ({'policy_update_fraction': 1.0}
                  if 'policy_update_fraction' in fields else {})
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

  def init(self, key, population: Population):
    n = self.config.population_size
    state = population.state
    flat, unravel = cem_lib.flatten_population(state.policy)
    cem = cem_lib.init(flat[0], initial_var=self.config.initial_variance,
                       initial_extra_noise=self.config.initial_extra_noise)
    rule_state = CEMRLState(
        key=key, cem=cem,
        initial_policy_opt=jax.tree.map(jnp.copy, state.policy_opt),
        evaluating=np.asarray(False), generation=np.asarray(0, np.int64),
        actor_steps=np.asarray(0, np.int64),
        critic_steps=np.asarray(0, np.int64),
        update_steps=np.asarray(0, np.int64),
        fitness=np.full((n,), np.nan), lengths=np.zeros((n,), np.int64),
        last_return=np.asarray(np.nan), best_return=np.asarray(np.nan),
        resumed=np.asarray(False))
    # Generation 1: actor_steps = 0, and hparams' train_until is 0.
    return rule_state, self._sample_generation(rule_state, population.key,
                                               state, unravel)

  def _sample_generation(self, rule_state: CEMRLState, key, state, unravel):
    """``state`` with a new generation sampled from the distribution, its
    policy optimizer states fresh."""
    flat = cem_lib.sample(key, rule_state.cem, self.config.population_size)
    return cem_lib.load_policies(
        state, flat, unravel,
        reset={'policy_opt': rule_state.initial_policy_opt})

  def decide(self, rule_state: CEMRLState, observation: Observation):
    obs, n = observation, self.config.population_size
    everyone = np.ones((n,), bool)
    # state.step, counted on the host so that no call waits for the last
    # one to finish: a call's steps are active while step < train_until
    # (``cem_lib.with_rl_schedule``), each adding one.
    num_steps = obs.update_steps - int(rule_state.update_steps)
    train_until = int(whole_value(obs.hparams.train_until)[0])
    critic_steps = int(rule_state.critic_steps)
    critic_steps = min(critic_steps + num_steps, max(critic_steps, train_until))
    rule_state = rule_state._replace(
        critic_steps=np.asarray(critic_steps, np.int64),
        update_steps=np.asarray(obs.update_steps, np.int64))
    if not rule_state.evaluating:
      if critic_steps < train_until:
        return rule_state, Decision()
      device_steps = int(whole_value(obs.state.step))  # a decision: may sync
      if device_steps != critic_steps:
        raise RuntimeError(f'CEM-RL counted {critic_steps} shared critic '
                           f'steps but the state has {device_steps}')
      # The trained policies go out with the publish that follows this
      # call: only episodes that start after it score them.
      return rule_state._replace(
          evaluating=np.asarray(True), fitness=np.full((n,), np.nan),
          lengths=np.zeros((n,), np.int64)), Decision(renewed=everyone)
    if rule_state.resumed:
      # Versions restart with a resumed run's pipeline, and its first
      # episodes are random warm-up: score from the next publish on.
      return rule_state._replace(resumed=np.asarray(False)), Decision(
          renewed=everyone)
    fitness, lengths = rule_state.fitness.copy(), rule_state.lengths.copy()
    for r in obs.episodes:
      m = int(r.member)
      # Training episodes: like Algorithm 1's evaluations they go into the
      # replay and the budget (the pipeline's evaluation episodes do not).
      if not r.evaluation and np.isnan(fitness[m]):
        fitness[m] = float(r.episode_return)
        lengths[m] = int(r.episode_length)
    rule_state = rule_state._replace(fitness=fitness, lengths=lengths)
    if np.isnan(fitness).any():
      return rule_state, Decision()
    return self._next_generation(rule_state, obs)

  def _next_generation(self, rule_state: CEMRLState, obs: Observation):
    """Every member is scored: the distribution's update, the mean policy's
    evaluation, and the next generation sampled."""
    flat, unravel = cem_lib.flatten_population(obs.state.policy)
    cem = cem_lib.update(
        rule_state.cem, flat, jnp.asarray(rule_state.fitness, jnp.float32),
        elite_fraction=self.config.elite_fraction,
        noise_decay=self.config.noise_decay,
        noise_limit=self.config.noise_limit)
    generation = int(rule_state.generation) + 1
    mean_return = self._mean_policy_return(obs, unravel(cem.mean),
                                           generation)
    # The run's count: the least member's env steps, times N.
    total_env_steps = obs.env_steps * self.config.population_size
    actor_steps = int(rule_state.actor_steps)
    best = float(rule_state.best_return)
    # max() over the returns so far, as a running value (NaN: none yet).
    if generation == 1 or mean_return > best:
      best = mean_return
    log_row = {'generation': generation, 'total_env_steps': total_env_steps,
               'actor_steps': actor_steps, 'mean_policy_return': mean_return}
    event = {'event': 'generation', 'step': obs.update_steps,
             'env_steps': obs.env_steps, 'generation': generation,
             'mean_policy_return': mean_return}
    critic_steps = int(rule_state.critic_steps)
    # Algorithm 1, lines 14-17: the next RL actors each train for as many
    # steps as this generation's evaluation episodes took in all.
    actor_steps = int(rule_state.lengths.sum())
    rule_state = rule_state._replace(
        cem=cem, generation=np.asarray(generation, np.int64),
        actor_steps=np.asarray(actor_steps, np.int64),
        last_return=np.asarray(mean_return), best_return=np.asarray(best),
        evaluating=np.asarray(False))
    rule_state, key = split_key(rule_state)
    state = self._sample_generation(rule_state, key, obs.state, unravel)
    hparams = cem_lib.set_train_until(obs.hparams, critic_steps + actor_steps)
    return rule_state, Decision(state=state, hparams=hparams, events=(event,),
                                logs=((MEAN_POLICY, log_row),))

  def _mean_policy_return(self, obs: Observation, policy, generation: int
                          ) -> float:
    """The mean return of ``--mean-eval-episodes`` noise-free episodes of
    ``policy`` (the distribution's mean), played by the data path with the
    agent's default hyperparameters and seeds of generation
    ``generation``."""
    if obs.data is None:
      raise ValueError('CEM-RL evaluates its mean policy through '
                       'Observation.data, and this observation has none')
    stacked = jax.tree.map(lambda x: jnp.asarray(whole_value(x))[None],
                           policy)
    defaults = jax.tree.map(lambda x: jnp.asarray(x)[None],
                            self.agent.default_hparams())
    returns, _ = obs.data.evaluate(
        stacked, defaults, self.config.mean_eval_episodes,
        self.config.seed + 10_000 * generation)
    return float(np.mean([float(r) for r in returns[0]]))

  def resumed(self, rule_state: CEMRLState) -> CEMRLState:
    # A train phase goes on to its bound (state.step and hparams are
    # restored); an eval phase evaluates the trained policies anew.
    n = self.config.population_size
    return rule_state._replace(
        resumed=np.asarray(bool(rule_state.evaluating)),
        fitness=np.full((n,), np.nan), lengths=np.zeros((n,), np.int64))

  def scalars(self, rule_state: CEMRLState) -> dict:
    out = {'generation': int(rule_state.generation),
           'actor_steps': int(rule_state.actor_steps),
           'critic_steps': int(rule_state.critic_steps)}
    if rule_state.generation > 0:
      out['mean_policy_return'] = float(rule_state.last_return)
    return out

  def summary(self, rule_state: CEMRLState, run_dir: str) -> str:
    del run_dir
    if rule_state.generation == 0:
      return 'CEM-RL: no generation finished'
    return (f'CEM-RL: {int(rule_state.generation)} generations, '
            f'{int(rule_state.critic_steps)} critic steps; mean-policy return '
            f'{float(rule_state.last_return):.1f} at the end, best '
            f'{float(rule_state.best_return):.1f} ({MEAN_POLICY})')
