"""The agent contract: read this file to add an agent to fastpbrl, in the
package or in your own code; ``examples/ddpg.py`` does it in under 100 lines.

An agent is a bundle of **pure functions over pytrees** for ONE member. The
learner (``fastpbrl.learner.population``) stacks members on a leading population axis and
runs ``jit(vmap(scan(update)))``; actors call ``act`` on the policy parameters
they read from shared memory. Nothing in an agent knows about the population,
processes or devices.

To add an agent ``foo``, in any importable module (``mypkg/foo.py``):

1. Write

   * ``FooConfig``: a frozen dataclass of **static** settings (layer sizes,
     anything that changes array shapes; changing it recompiles). It needs
     ``batch_size`` (transitions per member per update step) and
     ``steps_per_call`` (update steps per learner call); its defaults are the
     agent's. ``--batch-size``, ``--steps-per-call`` and ``--hidden-sizes``
     override those fields (the last one the field named at registration).
   * ``FooHParams``: a ``NamedTuple`` of **scalar arrays** (learning rates,
     discount, tau, noise scales, ...). They are traced: giving member ``i``
     another learning rate, or changing it between calls, never recompiles.
     Do not branch on them in Python; use ``jnp.where``. Actors read
     ``exploration_noise`` (or whatever ``act`` reads) from them.
   * ``FooState``: a ``NamedTuple`` training state holding everything a
     population rule must copy when one member replaces another: online and
     target parameters, optimizer states, any learned temperature, the step
     counter and the member's PRNG key.
   * ``make_agent(env_spec, config) -> Agent`` filling the fields below
     (``ValueError`` for an env it cannot handle; the run reports it naming
     ``--agent`` and ``--env``).

2. Register it, at the module's top level::

       FOO = fastpbrl.agents.register(
           'foo', make_agent=make_agent, config=FooConfig,
           default_search_space={'lr': ss.LogUniform(1e-5, 1e-3), ...},
           hparam_domains={'lr': ss.positive('Adam step size', 'step size'),
                           ...},
           shared_critic=None,           # or (env_spec, config) -> SharedCritic
           hidden_sizes_field='hidden_sizes')  # None: no such setting

   ``default_search_space`` is PBT's and HyperTrick's prior over fields of
   ``FooHParams`` (``fastpbrl.core.search_space``; ``--search-space
   FILE`` replaces it). ``hparam_domains`` gives each field's meaning,
   unit and valid range (``search_space.HParamDomain``): ``--hparams``
   and search spaces outside it are refused, ``fastpbrl info`` prints it;
   a field without one is unchecked. ``shared_critic`` is the capability CEM-RL and DvD
   need (a ``SharedCritic``, below); without it they refuse the agent,
   naming ``--agent``. PBT, HyperTrick and independent seeds take any agent.
   The built-in TD3, SAC and DQN register the same way, at the end of their
   modules.

3. Select it with ``--agent mypkg.foo:FOO`` (``module:attribute``, the
   attribute being the returned ``AgentSpec``, or ``mypkg.foo:foo``, the
   registered name; a file ``path/foo.py:FOO`` works too). The module must
   be importable (on ``sys.path``): actor processes are *spawned* and rebuild
   the agent from this same string, so they import the module again and it
   registers itself again there. Nothing in the package is edited. An unknown
   name or a module that does not import stops the run before anything
   starts, with one line naming ``--agent``.

4. Build networks with ``fastpbrl.agents.networks`` (the only module that
   imports haiku) and optimizers with optax *inside* ``update`` from the traced
   learning rate (``optax.adam(hparams.lr)``; ``deterministic.adam_step``):
   the optimizer state does not depend on the learning rate, so the
   hyperparameter stays a traced leaf and ``FooHParams`` is the one place
   where it lives. Deterministic actor-critics share their state, policy
   loss and acting in ``fastpbrl.agents.deterministic`` (TD3, DDPG); TD
   targets and Polyak averaging are below (``td_target``, ``polyak``).

5. Test it as ``tests/agents/test_td3.py`` does: the vectorized population
   update against a per-member loop, the loss against a value worked out by
   hand (``tests/examples/test_ddpg.py``), and the compilation count.

**Agents that learn from their own rollouts** (on-policy: PPO, A2C) set
``learns_from='rollout'`` (at ``register`` and on the ``Agent``) and give
``behave``. Then:

* the config also has ``rollout_length`` (``T``, steps per env per
  iteration) and ``num_envs`` (``E``, envs each member acts in at once);
  ``batch_size`` is its minibatch size (as Stable-Baselines3's PPO's) and
  ``steps_per_call`` counts env steps per member: a multiple of ``T x E``,
  the iterations one learner call runs (``T x E``: one). An on-policy
  member's "update steps" are the env steps it learned from, so every
  interval of the rules, the logs and the budget counts alike for both
  kinds, and ``--update-to-data-ratio`` stays 1;
* ``update(state, hparams, rollout) -> (state, metrics)`` is ONE
  iteration on the ``Rollout`` (``fastpbrl.core.types``, ``[T, E, ...]``) the
  member has just collected with ``behave``: advantages, then the epochs
  of minibatch steps it wants, shuffled with the key in its state. The
  learner scans it over a call's iterations and vmaps it over members, as
  it does a replay agent's gradient step;
* the data path collects the rollouts: inside the compiled call for JAX
  envs (the envs step, the members ``behave``, then ``update``; nothing
  crosses to the host but episode statistics), or in the actor processes
  for gymnasium envs. Anything ``act`` reads beside the network (an
  observation normaliser's statistics) belongs in ``policy_params``, so
  actors, exploit copies and checkpoints carry it.

``fastpbrl/agents/ppo.py`` is the built-in one; ``examples/a2c.py`` is one
in user code. Nothing in the package names either.

The contract departs from "``init(key, env_spec, hparams)``" in one way: the
environment spec is bound when the agent is *made* (``make_agent(env_spec,
config)``), because ``act`` and ``update`` need the same network output sizes
and action bounds that ``init`` does; ``init`` then takes ``(key, hparams)``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, Callable, Generic, Optional, TypeVar

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.core.types import (POPULATION_AXIS, Metrics, Params, PRNGKey,
                                 Transition)

State = TypeVar('State')
HParams = TypeVar('HParams')


@dataclasses.dataclass(frozen=True)
class Agent(Generic[State, HParams]):
  """The pure functions that define one member of a population.

  Attributes:
    name: short name, used in logs and the CLI (``td3``, ``sac``, ``dqn``).
    env_spec: the spec the networks were built for.
    config: the static configuration (a frozen dataclass).
    default_hparams: ``() -> HParams`` of scalar float32 arrays, the published
      defaults.
    init: ``(key, hparams) -> State``. A fresh member.
    act: ``(policy_params, observation, key, hparams, explore) -> action``.
      ``observation`` has one leading batch axis; ``explore`` is a bool
      (static under ``jit``: pass it as a Python bool), and
      ``explore=False`` is the evaluation policy (noise-free for TD3 and
      SAC, epsilon-greedy at 0.05 for DQN); actions are in
      ``[-1, 1]`` for continuous agents and int32 for discrete ones.
    update: ``(state, hparams, batch) -> (state, metrics)``, ONE gradient step
      on a ``Transition`` batch with leading axis ``[B]``; ``metrics`` is a
      dict of scalar arrays. Must be jittable and vmappable, with no Python
      side effects.
    policy_params: ``State -> Params``, what actors need to act (the part of
      the state that goes to shared memory).
    shared_critic: optional whole-population update for the shared-critic
      mode of CEM-RL and DvD (see ``SharedCritic``); ``None`` if the agent
      has none. ``fastpbrl.agents.make_agent`` fills it from the registered
      spec's ``shared_critic`` when ``make_agent`` leaves it out.
    acting_hparams: optional ``(hparams, env_step) -> hparams``, the
      hyperparameters one member explores with once it has collected
      ``env_step`` training env steps (DQN's annealed epsilon). Actors apply
      it per member and per step, inside their jitted policy call, before
      ``act(..., explore=True)``; evaluation actions use ``hparams`` as they
      are. It must be jittable; ``None``: exploration does not depend on the
      step.
    learns_from: ``'replay'`` (TD3, SAC, DQN: ``update`` is one gradient
      step on a ``Transition`` batch sampled from a replay) or
      ``'rollout'`` (on-policy: PPO, A2C; see "Agents that learn from
      their own rollouts" in the module docstring).
    behave: rollout agents only: ``(policy_params, observation[B], key,
      hparams) -> (action[B], log_prob[B])``, the exploring policy that
      collects the rollout, with the log-probability of what it sampled
      (``Rollout.log_prob``). ``act(..., explore=True)`` must sample the
      same distribution; ``act(..., explore=False)`` is the evaluation
      policy (a Gaussian's mean, a categorical's most likely action).
  """

  name: str
  env_spec: specs.EnvironmentSpec
  config: Any
  default_hparams: Callable[[], HParams]
  init: Callable[[PRNGKey, HParams], State]
  act: Callable[..., jax.Array]
  update: Callable[[State, HParams, Transition], tuple[State, Metrics]]
  policy_params: Callable[[State], Params]
  shared_critic: Optional['SharedCritic'] = None
  acting_hparams: Optional[Callable[[HParams, jax.Array], HParams]] = None
  learns_from: str = 'replay'
  behave: Optional[Callable[..., tuple[jax.Array, jax.Array]]] = None

  def __post_init__(self):
    if self.learns_from not in LEARNS_FROM:
      raise ValueError(f'agent {self.name!r}: learns_from must be one of '
                       f'{LEARNS_FROM}, got {self.learns_from!r}')
    if (self.learns_from == 'rollout') != (self.behave is not None):
      raise ValueError(f'agent {self.name!r}: an agent that learns from '
                       'its rollouts needs behave, and only it has one')
    if self.learns_from == 'rollout':
      iteration = rollout_steps(self.config)
      if self.config.steps_per_call % iteration:
        raise ValueError(
            f'steps_per_call {self.config.steps_per_call} is not a multiple '
            f'of an iteration\'s {iteration} env steps (rollout_length '
            f'{self.config.rollout_length} x num_envs '
            f'{self.config.num_envs})')


# What an agent may learn from (``Agent.learns_from``).
LEARNS_FROM = ('replay', 'rollout')

# Config fields a rollout agent needs beside ``batch_size`` and
# ``steps_per_call``.
ROLLOUT_CONFIG_FIELDS = ('rollout_length', 'num_envs')


def rollout_steps(config) -> int:
  """Env steps per member of one on-policy iteration: ``rollout_length x
  num_envs`` of a rollout agent's config."""
  return int(config.rollout_length) * int(config.num_envs)


def steps_per_update(agent) -> int:
  """Update steps one ``agent.update`` call counts: one gradient step of an
  agent that learns from a replay; an iteration's env steps
  (``rollout_steps``) of one that learns from its own rollouts."""
  if agent.learns_from == 'replay':
    return 1
  return rollout_steps(agent.config)


@dataclasses.dataclass(frozen=True)
class SharedCritic:
  """Population update where one critic is shared by all members.

  The 2022 paper's section 4.2 modification of CEM-RL / DvD: each member has
  its own policy; every member's batch goes through every policy in parallel
  and the critic loss is the population mean of the members' critic losses,
  so the critic takes one step per update step whatever the population size.

  Attributes:
    init: ``(key, hparams[N]) -> SharedState`` for a population of ``N``
      (taken from the leading axis of ``hparams``).
    update: ``(state, hparams[N], batch[N, B, ...]) -> (state, metrics[N])``:
      one update step of the whole population (no vmap around it).
    policy_params: ``SharedState -> Params[N]``.
    with_policy_loss: ``(extra) -> SharedCritic`` adding a population-level
      term ``extra(policy_params[N], observations[N, B, ...]) -> scalar`` to
      the policy loss (DvD's diversity term).
    policy_apply: ``(one member's policy params, observations[B, ...]) ->
      actions[B, A]``, the deterministic policy: DvD compares members by
      these actions.

  CEM-RL also writes sampled policies into the state: its ``SharedState``
  is a ``NamedTuple`` with per-member ``policy``, ``target_policy``,
  ``policy_opt`` and ``key`` fields and a scalar ``step`` (TD3's
  ``SharedTD3State``).
  """

  init: Callable[..., Any]
  update: Callable[..., tuple[Any, Metrics]]
  policy_params: Callable[[Any], Params]
  with_policy_loss: Callable[[Callable[..., jax.Array]], 'SharedCritic']
  policy_apply: Callable[[Params, jax.Array], jax.Array]


def scalar_hparams(hparams_cls: type, **values: float):
  """Builds a hyperparameter ``NamedTuple`` of float32 scalar arrays."""
  return hparams_cls(**{k: jnp.asarray(v, jnp.float32) for k, v in values.items()})


def with_defaults(agent: Agent, **values: float) -> Agent:
  """``agent`` whose ``default_hparams()`` has ``values`` for the fields
  they name, the others as they were.

  Raises:
    ValueError: a name that is not one of the agent's hyperparameters
      (with the nearest ones).
  """
  defaults = agent.default_hparams()
  for name in values:
    if name not in defaults._fields:
      near = difflib.get_close_matches(name, defaults._fields, n=1)
      hint = f'did you mean {near[0]}? ' if near else ''
      raise ValueError(f'{agent.name} has no hyperparameter {name!r}; '
                       f'{hint}its hyperparameters: '
                       f'{", ".join(defaults._fields)}')
  changed = defaults._replace(**{
      k: jnp.asarray(v, jnp.asarray(getattr(defaults, k)).dtype)
      for k, v in values.items()})
  return dataclasses.replace(agent, default_hparams=functools.partial(
      _constant, changed))


def _constant(value):
  return value


def stack_hparams(hparams: HParams, population_size: int) -> HParams:
  """Repeats one member's hyperparameters along a new leading axis."""
  return jax.tree.map(
      lambda x: jnp.broadcast_to(jnp.asarray(x), (population_size,) + jnp.shape(x)),
      hparams)


def periodic_flag(step: jax.Array, fraction: jax.Array) -> jax.Array:
  """True on a fraction of steps, spread evenly: ``floor((t+1)f) > floor(tf)``.

  A traced replacement for ``step % delay == 0`` (TD3's delayed policy
  update, DQN's target refresh): ``fraction = 1 / delay`` gives exactly every
  ``delay``-th step, and a fraction that is not one over an integer still
  gives that rate on average. The paper's PBT search space treats TD3's delay
  as such a fraction in ``[0.2, 1]``.

  Integer arithmetic, right at any step count: ``f`` is taken in fixed point,
  ``q = ceil(f * 2**24)`` (exact for every float32 ``f >= 0.5``, at most
  ``2**-24`` above ``f`` otherwise; rounding up keeps ``f = 1/d`` firing on
  step ``d - 1`` for ``d < 4096``), and the flag is the carry out of the low
  24 bits, ``(t q mod 2**24) + q >= 2**24``, i.e. ``floor((t+1)q / 2**24) >
  floor(tq / 2**24)``. The product is taken in wrapping uint32 arithmetic,
  which is exact modulo ``2**32`` and hence modulo ``2**24``. (A float32
  ``floor`` of ``t f`` loses the pattern past ``2**24`` steps and gives no
  flag at all past ``2**25``.)
  """
  one = 1 << _FLAG_BITS
  q = jnp.ceil(jnp.clip(jnp.asarray(fraction, jnp.float32), 0.0, 1.0)
                * one).astype(jnp.uint32)
  low = (jnp.asarray(step).astype(jnp.uint32) * q) & jnp.uint32(one - 1)
  return low + q >= jnp.uint32(one)


_FLAG_BITS = 24  # fixed-point bits of periodic_flag's fraction


def any_member(flag: jax.Array) -> jax.Array:
  """``flag`` OR-ed over the population when called under the learner's vmap.

  Use it as the predicate of a ``lax.cond`` whose branch work is optional
  per member (TD3's delayed policy step): under ``vmap`` a per-member
  predicate turns the cond into a select that runs both branches for every
  member on every step, while this one stays a real cond that skips the
  branch on steps where *no* member needs it (the branch then selects per
  member with the original ``flag``). Outside the learner's vmap (one
  member, the actors, user code) it returns ``flag`` unchanged.
  """
  try:
    return jax.lax.pmax(flag.astype(jnp.int32), POPULATION_AXIS) > 0
  except NameError:  # no population axis bound: a single member
    return flag


def polyak(target: Params, online: Params, tau: jax.Array) -> Params:
  """``target <- (1 - tau) target + tau online`` with a traced ``tau``."""
  return optax.incremental_update(online, target, tau)


def select_tree(flag: jax.Array, on_true, on_false):
  """``jnp.where`` over two pytrees of the same structure."""
  return jax.tree.map(lambda a, b: jnp.where(flag, a, b), on_true, on_false)


def td_target(reward: jax.Array, terminated: jax.Array, discount: jax.Array,
              next_value: jax.Array) -> jax.Array:
  """One-step TD target ``r + discount * (1 - terminated) * V(s')``.

  Truncation does not appear: a transition cut by a time limit bootstraps
  from its real next state like any non-terminal one; only a termination
  stops the bootstrap.
  """
  return reward + discount * (1.0 - terminated) * next_value
