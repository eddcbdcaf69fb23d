"""PPO (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"),
as pure functions over one member's state (jittable; registered as
``ppo``, ``learns_from='rollout'``).

One ``update`` is one PPO iteration on the ``[T, E]`` rollout the member
has just collected with ``behave``: values of every observation and next
observation under the current value network, generalised advantage
estimation (Schulman et al. 2016, eq. 16, :func:`gae`), returns
``A + V``, then ``epochs`` passes over a fresh random permutation of the
``T x E`` samples in minibatches of ``batch_size``, each one Adam step on
the clipped surrogate objective (eq. 7, :func:`clipped_surrogate`) plus
``vf_coef`` times the value MSE minus ``ent_coef`` times the entropy
(eq. 9, with SB3's signs), gradients clipped to global norm
``max_grad_norm``.

It follows Stable-Baselines3's ``PPO`` with ``MlpPolicy``
(``stable_baselines3/ppo/ppo.py``, ``common/policies.py``), defaults
included: separate 64x64 tanh MLPs for policy and value, orthogonal
initialisation (gain ``sqrt(2)`` hidden, 0.01 policy head, 1 value head,
zero biases), a diagonal Gaussian with a state-independent log-std
parameter (continuous actions) or a categorical (discrete ones), one Adam
(eps ``1e-5``) over both networks, rollout 2048, 10 epochs, minibatch 64,
lr 3e-4, clip 0.2, entropy 0, value 0.5, lambda 0.95, gamma 0.99, max
grad norm 0.5, advantages normalised per minibatch with the unbiased std
plus ``1e-8``, no value clipping. ``python -m benchmarks.sb3_equivalence
--agent ppo`` checks iterations against SB3's ``PPO.train()`` in float64, with
``--normalize-observations`` and ``--normalize-rewards`` against SB3's
``VecNormalize`` too.

Departures from SB3:

* actions are in ``[-1, 1]`` units: the Gaussian's samples are clipped to
  ``[-1, 1]`` and scaled to the env's bounds on the env side (SB3 clips
  them to the bounds themselves). On envs whose bounds are ``[-1, 1]``
  (most MuJoCo tasks) the two are the same; elsewhere ``log_std_init``
  counts in half action ranges;
* observation normalisation (``normalize_observations``, SB3's
  ``VecNormalize`` without reward normalisation, same ``1e-8`` and clip at
  10) keeps its running mean and variance in the member's state and in its
  policy parameters, and updates them at the END of each iteration from
  the rollout's raw observations (parallel Welford; the prior count is 0,
  not SB3's ``1e-4``); VecNormalize updates them at every env step, so
  the rollout's early observations are normalised with older statistics
  there;
* reward normalisation (``normalize_rewards``, VecNormalize's reward
  path: each reward divided by ``sqrt(var + 1e-8)`` of the running
  discounted returns ``ret = gamma ret + r``, clipped to 10) is exact per
  step: ``update`` scans the rollout in time order, advancing each env's
  return (kept in the member's state across iterations, reset after an
  episode end) and merging the ``E`` new returns into the statistics
  before scaling that step's rewards, as VecNormalize's ``step_wait``
  does. Only the learning sees scaled rewards (the data path, its episode
  returns and evaluations keep the raw ones), and gamma is the member's
  traced ``discount`` (rl-zoo sets VecNormalize's own gamma to the
  agent's). The iteration's metrics gain ``reward_scale``, the last
  step's ``1 / sqrt(var + 1e-8)``. It needs each env's rollouts (column
  ``e`` of ``[T, E]``) to arrive in order, iteration after iteration; after
  an exploit the member continues its own episodes with its parent's
  returns until they end. Departures: the prior count is 0, not ``1e-4``
  (as for the observations), and the statistics are float32 in training,
  not float64 (measured on a synthetic stream of returns: the float32
  variance drifts from the float64 one by under 1e-4 relative over 3e5
  per-step merges);
* no ``target_kl`` early stop and no learning-rate or clip-range schedule:
  every hyperparameter is a traced per-member scalar that population rules
  set instead;
* the global-norm clip is PyTorch's ``clip_grad_norm_`` (scale
  ``max_grad_norm / (norm + 1e-6)`` when below 1) with a traced bound;
* ``explained_variance`` is 0, not NaN, when the returns have no
  variance (a NaN metric would mark the member as diverged).

On a synchronous path (the member collects, then learns) the value and
policy parameters that ``update`` starts from are the behaviour ones; on
an asynchronous one the ratio's denominator ``Rollout.log_prob`` corrects
for the policy lag and the values are those of the current network.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import optax
from acme import specs

from fastpbrl.agents import networks as nets_lib
from fastpbrl.agents.base import Agent, scalar_hparams
from fastpbrl.agents.registry import register
from fastpbrl.core import search_space as ss
from fastpbrl.core.types import Params, PRNGKey, Rollout

ADAM_EPS = 1e-5  # SB3's PPO passes eps=1e-5 to its Adam
ADVANTAGE_EPS = 1e-8  # SB3: (A - mean) / (std + 1e-8)
OBS_EPS = 1e-8  # VecNormalize: (obs - mean) / sqrt(var + 1e-8)
OBS_CLIP = 10.0  # VecNormalize's clip_obs
REWARD_EPS = 1e-8  # VecNormalize: r / sqrt(var(returns) + 1e-8)
REWARD_CLIP = 10.0  # VecNormalize's clip_reward
GRAD_NORM_EPS = 1e-6  # torch.nn.utils.clip_grad_norm_


@dataclasses.dataclass(frozen=True)
class PPOConfig:
  """Static PPO settings (changing one recompiles); SB3's defaults."""

  hidden_sizes: Sequence[int] = (64, 64)  # policy and value MLP widths
  rollout_length: int = 2048  # T: steps per env per iteration (SB3 n_steps)
  num_envs: int = 1  # E: envs each member acts in at once
  epochs: int = 10  # passes over the rollout per iteration (SB3 n_epochs)
  batch_size: int = 64  # minibatch size; must divide T x E
  # env steps per member per learner call, a multiple of T x E (None: one
  # iteration, T x E; filled in at construction, so dataclasses.replace
  # of rollout_length or num_envs needs steps_per_call=None again)
  steps_per_call: Optional[int] = None
  normalize_observations: bool = False  # running mean/var of observations
  # rewards over the running std of discounted returns (VecNormalize's)
  normalize_rewards: bool = False
  normalize_advantage: bool = True  # per minibatch, as SB3
  ortho_init: bool = True  # SB3's orthogonal init; False: PyTorch's default
  activation: str = 'tanh'  # hidden activation: 'tanh' or 'relu'
  log_std_init: float = 0.0  # initial log-std of the Gaussian policy

  def __post_init__(self):
    if self.rollout_length < 1 or self.num_envs < 1 or self.epochs < 1:
      raise ValueError(
          'rollout_length, num_envs and epochs must be >= 1, got '
          f'{self.rollout_length}, {self.num_envs}, {self.epochs}')
    samples = self.rollout_length * self.num_envs
    if self.batch_size < 1 or samples % self.batch_size:
      raise ValueError(
          f'batch_size {self.batch_size} must divide rollout_length x '
          f'num_envs = {samples} (the minibatches split each rollout)')
    if self.steps_per_call is None:
      object.__setattr__(self, 'steps_per_call', samples)
    if self.activation not in nets_lib.ACTIVATIONS:
      raise ValueError(f'activation must be one of '
                       f'{tuple(nets_lib.ACTIVATIONS)}, got '
                       f'{self.activation!r}')


class PPOHParams(NamedTuple):
  """Traced PPO hyperparameters, each a float32 scalar per member."""

  learning_rate: jax.Array  # Adam step size of policy and value
  clip_range: jax.Array  # epsilon of the clipped ratio
  ent_coef: jax.Array  # weight of the entropy bonus
  vf_coef: jax.Array  # weight of the value loss
  gae_lambda: jax.Array  # lambda of GAE
  discount: jax.Array  # gamma
  max_grad_norm: jax.Array  # global gradient norm bound


def default_hparams() -> PPOHParams:
  """SB3's PPO defaults."""
  return scalar_hparams(
      PPOHParams, learning_rate=3e-4, clip_range=0.2, ent_coef=0.0,
      vf_coef=0.5, gae_lambda=0.95, discount=0.99, max_grad_norm=0.5)


class ObsStats(NamedTuple):
  """Running statistics of raw observations (identity when normalisation
  is off: mean 0, var 1, never updated)."""

  mean: jax.Array  # [*obs_shape] float
  var: jax.Array  # [*obs_shape] float, population variance
  count: jax.Array  # [] float, observations seen


class RewardNorm(NamedTuple):
  """VecNormalize's reward-scaling state (zeros and the identity
  statistics, never updated, when reward normalisation is off)."""

  returns: jax.Array  # [E] float: discounted return of each env's episode
  stats: ObsStats  # [] shaped: running mean/var/count of those returns


class PPOState(NamedTuple):
  """One member's full training state (what PBT's exploit copies)."""

  policy: Params  # policy MLP (and the Gaussian's log_std)
  value: Params  # value MLP
  opt_state: optax.OptState  # one Adam over (policy, value)
  obs_stats: ObsStats
  reward_norm: RewardNorm
  key: PRNGKey  # minibatch shuffles
  step: jax.Array  # int32 [], iterations done


class PPONetworks(NamedTuple):
  policy: nets_lib.Network
  value: nets_lib.Network
  obs_shape: tuple
  discrete: bool


def make_networks(env_spec: specs.EnvironmentSpec,
                  config: PPOConfig) -> PPONetworks:
  """The policy and value networks for ``env_spec``.

  Raises:
    ValueError: an action space that is neither discrete nor a 1-D box.
  """
  actions = env_spec.actions
  common = dict(hidden=config.hidden_sizes, activation=config.activation,
                ortho_init=config.ortho_init)
  if isinstance(actions, specs.DiscreteArray):
    policy = nets_lib.categorical_policy(int(actions.num_values), **common)
    discrete = True
  elif isinstance(actions, specs.BoundedArray) and len(actions.shape) == 1:
    policy = nets_lib.diagonal_gaussian_policy(
        int(actions.shape[0]), log_std_init=config.log_std_init, **common)
    discrete = False
  else:
    raise ValueError(f'PPO needs a discrete or a 1-D box action space, got '
                     f'{actions!r}')
  return PPONetworks(policy=policy, value=nets_lib.state_value(**common),
                     obs_shape=tuple(env_spec.observations.shape),
                     discrete=discrete)


# --------------------------------------------------------------------------
# Pieces (public: the tests check each against a hand-worked value)
# --------------------------------------------------------------------------


def gae(reward: jax.Array, value: jax.Array, next_value: jax.Array,
        terminated: jax.Array, truncated: jax.Array, discount: jax.Array,
        gae_lambda: jax.Array) -> jax.Array:
  """Generalised advantage estimates ``[T, E]`` (Schulman et al. 2016).

  ``delta_t = r_t + gamma (1 - terminated_t) V(next_obs_t) - V(obs_t)``
  bootstraps from the real next state, truncations included, and never
  through a termination; ``A_t = delta_t + gamma lambda (1 - done_t)
  A_{t+1}`` stops at every episode end (``done = terminated | truncated``),
  and the last step's ``A_{T-1} = delta_{T-1}``. This equals SB3's
  ``RolloutBuffer.compute_returns_and_advantage`` with its timeout
  bootstrap (``r + gamma V(terminal obs)`` at truncations).
  """
  delta = reward + discount * (1.0 - terminated) * next_value - value
  done = jnp.maximum(terminated, truncated)

  def back(next_adv, x):
    delta_t, done_t = x
    adv = delta_t + discount * gae_lambda * (1.0 - done_t) * next_adv
    return adv, adv

  _, adv = jax.lax.scan(back, jnp.zeros_like(delta[0]), (delta, done),
                        reverse=True)
  return adv


def clipped_surrogate(ratio: jax.Array, advantage: jax.Array,
                      clip_range: jax.Array) -> jax.Array:
  """PPO's policy loss, eq. 7 negated: ``-mean(min(r A, clip(r, 1 - eps,
  1 + eps) A))``."""
  clipped = jnp.clip(ratio, 1.0 - clip_range, 1.0 + clip_range)
  return -jnp.mean(jnp.minimum(ratio * advantage, clipped * advantage))


def normalize(stats: ObsStats, obs: jax.Array) -> jax.Array:
  """VecNormalize's ``clip((obs - mean) / sqrt(var + 1e-8), -10, 10)``."""
  obs = obs.astype(stats.mean.dtype)
  return jnp.clip((obs - stats.mean) / jnp.sqrt(stats.var + OBS_EPS),
                  -OBS_CLIP, OBS_CLIP)


def update_obs_stats(stats: ObsStats, obs: jax.Array) -> ObsStats:
  """``stats`` merged with a batch ``obs [..., *obs_shape]`` (the parallel
  variance formula of Chan et al. 1979, as SB3's ``RunningMeanStd``; also
  the returns' statistics, of shape ``[]``)."""
  shape = stats.mean.shape
  x = obs.astype(stats.mean.dtype).reshape((-1, *shape))
  n = jnp.asarray(x.shape[0], stats.count.dtype)
  batch_mean = jnp.mean(x, axis=0)
  batch_var = jnp.var(x, axis=0)
  total = stats.count + n
  delta = batch_mean - stats.mean
  mean = stats.mean + delta * n / total
  m2 = (stats.var * stats.count + batch_var * n
        + jnp.square(delta) * stats.count * n / total)
  return ObsStats(mean=mean, var=m2 / total, count=total)


def scale_rewards(norm: RewardNorm, reward: jax.Array, done: jax.Array,
                  discount: jax.Array) -> tuple[jax.Array, RewardNorm]:
  """VecNormalize's reward path over a rollout ``[T, E]``, in time order:
  the scaled rewards ``[T, E]`` and the state to continue from.

  At each step, as ``VecNormalize.step_wait``: ``ret = gamma ret + r``
  per env, the ``E`` returns merged into the statistics, the step's
  rewards divided by ``sqrt(var + 1e-8)`` of the statistics just updated
  and clipped to ``[-10, 10]``, then the returns of the envs whose episode
  ended (``done``, terminated or truncated) reset to 0. A float32 count
  stops counting exactly past ``2**24`` returns (env steps of the member);
  later returns then weigh about ``1 / 2**24`` each, as they should.
  """
  dtype = norm.returns.dtype
  discount = jnp.asarray(discount, dtype)

  def step(carry, x):
    returns, stats = carry
    r, d = x
    returns = returns * discount + r
    stats = update_obs_stats(stats, returns)
    scaled = jnp.clip(r / jnp.sqrt(stats.var + REWARD_EPS), -REWARD_CLIP,
                      REWARD_CLIP)
    return (jnp.where(d > 0, jnp.zeros_like(returns), returns), stats), scaled

  (returns, stats), scaled = jax.lax.scan(
      step, (norm.returns, norm.stats), (reward.astype(dtype), done))
  return scaled, RewardNorm(returns=returns, stats=stats)


def clip_by_global_norm(grads: Params, max_norm: jax.Array) -> Params:
  """PyTorch's ``clip_grad_norm_`` with a traced bound: ``grads`` times
  ``min(1, max_norm / (norm + 1e-6))``."""
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
  scale = jnp.minimum(1.0, max_norm / (norm + GRAD_NORM_EPS))
  return jax.tree.map(lambda g: g * scale.astype(g.dtype), grads)


def minibatch_order(key: PRNGKey, num_samples: int,
                    epochs: int) -> jax.Array:
  """``[epochs, num_samples]`` int32: one permutation of the flattened
  rollout per epoch (sample ``i`` is step ``i // E`` of env ``i % E``).
  ``update`` draws it from the second half of ``jax.random.split(
  state.key)``."""
  return jax.vmap(lambda k: jax.random.permutation(k, num_samples))(
      jax.random.split(key, epochs)).astype(jnp.int32)


def explained_variance(prediction: jax.Array, target: jax.Array) -> jax.Array:
  """``1 - Var(target - prediction) / Var(target)``; 0 when ``Var(target)``
  is 0 (SB3 gives NaN there)."""
  var = jnp.var(target)
  safe = jnp.where(var == 0, 1.0, var)
  return jnp.where(var == 0, 0.0, 1.0 - jnp.var(target - prediction) / safe)


def _gaussian_log_prob(mean, log_std, action):
  z = (action - mean) * jnp.exp(-log_std)
  return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * math.log(2 * math.pi),
                 axis=-1)


def _gaussian_entropy(log_std):
  return jnp.sum(0.5 + 0.5 * math.log(2 * math.pi) + log_std, axis=-1)


def log_prob_and_entropy(nets: PPONetworks, policy: Params, obs: jax.Array,
                         action: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``log pi(action | obs)`` and the policy's entropy at ``obs``, ``[B]``
  each (``obs`` already normalised)."""
  if nets.discrete:
    logits = jax.nn.log_softmax(nets.policy.apply(policy, obs))
    log_prob = jnp.take_along_axis(
        logits, action.astype(jnp.int32)[..., None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logits) * logits, axis=-1)
    return log_prob, entropy
  mean, log_std = nets.policy.apply(policy, obs)
  return (_gaussian_log_prob(mean, log_std, action),
          _gaussian_entropy(log_std))


def _sample(nets: PPONetworks, policy: Params, obs: jax.Array, key: PRNGKey,
            explore: bool) -> tuple[jax.Array, Optional[jax.Array]]:
  """An action per observation (``obs`` normalised) and, when sampled, its
  log-probability."""
  if nets.discrete:
    logits = jax.nn.log_softmax(nets.policy.apply(policy, obs))
    if not explore:
      return jnp.argmax(logits, axis=-1).astype(jnp.int32), None
    action = jax.random.categorical(key, logits).astype(jnp.int32)
    return action, jnp.take_along_axis(logits, action[..., None],
                                       axis=-1)[..., 0]
  mean, log_std = nets.policy.apply(policy, obs)
  if not explore:
    return mean, None
  action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape,
                                                       mean.dtype)
  return action, _gaussian_log_prob(mean, log_std, action)


class _Minibatch(NamedTuple):
  observation: jax.Array
  action: jax.Array
  log_prob: jax.Array  # behaviour policy's
  advantage: jax.Array
  returns: jax.Array


def ppo_loss(nets: PPONetworks, config: PPOConfig, params: tuple,
             batch: _Minibatch, hp: PPOHParams):
  """SB3's minibatch loss ``pg + vf_coef * vf - ent_coef * entropy``;
  returns (loss, metrics) (``batch.observation`` already normalised)."""
  policy, value = params
  log_prob, entropy = log_prob_and_entropy(nets, policy, batch.observation,
                                           batch.action)
  advantage = batch.advantage
  if config.normalize_advantage and config.batch_size > 1:
    # SB3: torch's std, the unbiased one (ddof=1).
    advantage = (advantage - jnp.mean(advantage)) / (
        jnp.std(advantage, ddof=1) + ADVANTAGE_EPS)
  log_ratio = log_prob - batch.log_prob
  ratio = jnp.exp(log_ratio)
  pg_loss = clipped_surrogate(ratio, advantage, hp.clip_range)
  # SB3's default: no value clipping.
  vf_loss = jnp.mean(jnp.square(batch.returns
                                - nets.value.apply(value, batch.observation)))
  mean_entropy = jnp.mean(entropy)
  loss = pg_loss + hp.vf_coef * vf_loss - hp.ent_coef * mean_entropy
  metrics = {
      'policy_loss': pg_loss, 'value_loss': vf_loss, 'entropy': mean_entropy,
      'approx_kl': jax.lax.stop_gradient(
          jnp.mean(jnp.exp(log_ratio) - 1.0 - log_ratio)),
      'clip_fraction': jax.lax.stop_gradient(jnp.mean(
          (jnp.abs(ratio - 1.0) > hp.clip_range).astype(ratio.dtype)))}
  return loss, metrics


def _adam(learning_rate) -> optax.GradientTransformation:
  return optax.adam(learning_rate, eps=ADAM_EPS)


def _identity_stats(shape: tuple) -> ObsStats:
  """Statistics that leave values as they are: mean 0, var 1, count 0."""
  return ObsStats(mean=jnp.zeros(shape, jnp.float32),
                  var=jnp.ones(shape, jnp.float32),
                  count=jnp.zeros((), jnp.float32))


def _init(nets: PPONetworks, config: PPOConfig, key: PRNGKey,
          hparams: PPOHParams) -> PPOState:
  """``Agent.init``: fresh networks, one Adam state over both, and the
  identity observation and reward statistics."""
  del hparams  # the initial state does not depend on hyperparameters
  k_pi, k_v, k_state = jax.random.split(key, 3)
  obs = jnp.zeros((1, *nets.obs_shape), jnp.float32)
  params = (nets.policy.init(k_pi, obs), nets.value.init(k_v, obs))
  reward_norm = RewardNorm(returns=jnp.zeros((config.num_envs,), jnp.float32),
                           stats=_identity_stats(()))
  return PPOState(policy=params[0], value=params[1],
                  opt_state=_adam(1.0).init(params),
                  obs_stats=_identity_stats(nets.obs_shape),
                  reward_norm=reward_norm, key=k_state,
                  step=jnp.zeros((), jnp.int32))


def _prepare(config: PPOConfig, stats: ObsStats, obs: jax.Array) -> jax.Array:
  """``obs`` as the networks see it: normalised with ``stats`` when
  ``normalize_observations``, else as it is."""
  if config.normalize_observations:
    return normalize(stats, obs)
  return obs


def _act(nets: PPONetworks, config: PPOConfig, policy_params,
         observation: jax.Array, key: PRNGKey, hparams: PPOHParams,
         explore: bool) -> jax.Array:
  """``Agent.act``: a sample (``explore``) or the evaluation action."""
  del hparams  # PPO explores by sampling its own distribution
  policy, stats = policy_params
  action, _ = _sample(nets, policy, _prepare(config, stats, observation), key,
                      explore)
  # The env side clips too (collect.scale_actions); act's contract is
  # actions in [-1, 1].
  return action if nets.discrete else jnp.clip(action, -1.0, 1.0)


def _behave(nets: PPONetworks, config: PPOConfig, policy_params,
            observation: jax.Array, key: PRNGKey, hparams: PPOHParams):
  """``Agent.behave``: sampled actions and their log-probabilities."""
  del hparams
  policy, stats = policy_params
  return _sample(nets, policy, _prepare(config, stats, observation), key, True)


def _policy_params(state: PPOState) -> tuple[Params, ObsStats]:
  """``Agent.policy_params``: the policy and the observation statistics."""
  return state.policy, state.obs_stats


def _values(nets: PPONetworks, value: Params, obs: jax.Array,
            shape: tuple) -> jax.Array:
  """``V(obs)`` of the prepared observations ``obs`` ``[*shape,
  *obs_shape]``, of shape ``shape`` (``[T, E]``)."""
  flat = obs.reshape((math.prod(shape), *nets.obs_shape))
  return nets.value.apply(value, flat).reshape(shape)


def _samples(nets: PPONetworks, config: PPOConfig, state: PPOState,
             hp: PPOHParams, rollout: Rollout):
  """``(samples, values, reward_norm)``: the rollout's ``T x E`` samples
  for the minibatches (prepared observations, GAE advantages, returns
  ``A + V``), the values ``V(obs)`` ``[T, E]`` and the reward statistics
  after the rollout."""
  obs = _prepare(config, state.obs_stats, rollout.observation)
  next_obs = _prepare(config, state.obs_stats, rollout.next_observation)
  values = _values(nets, state.value, obs, rollout.reward.shape)
  next_values = _values(nets, state.value, next_obs, rollout.reward.shape)
  terminated = rollout.terminated.astype(values.dtype)
  truncated = rollout.truncated.astype(values.dtype)
  reward = rollout.reward.astype(values.dtype)
  reward_norm = state.reward_norm
  if config.normalize_rewards:
    # VecNormalize's per-step scaling, continuing each env's return from
    # the previous iteration (its rollouts are consecutive).
    reward, reward_norm = scale_rewards(
        reward_norm, reward, jnp.maximum(terminated, truncated), hp.discount)
    reward = reward.astype(values.dtype)
  advantage = gae(reward, values, next_values, terminated, truncated,
                  hp.discount, hp.gae_lambda)
  n = config.rollout_length * config.num_envs
  samples = _Minibatch(
      observation=obs.reshape((n, *nets.obs_shape)),
      action=rollout.action.reshape((n,) + rollout.action.shape[2:]),
      log_prob=rollout.log_prob.reshape(n).astype(values.dtype),
      advantage=advantage.reshape(n),
      returns=(advantage + values).reshape(n))
  return samples, values, reward_norm


def _minibatch_step(nets: PPONetworks, config: PPOConfig, carry,
                    batch: _Minibatch, hp: PPOHParams):
  """One Adam step on ``batch``'s loss, gradients clipped to
  ``max_grad_norm``: ``((params, opt_state), metrics)``."""
  params, opt_state = carry
  (_, metrics), grads = jax.value_and_grad(
      lambda p: ppo_loss(nets, config, p, batch, hp), has_aux=True)(params)
  grads = clip_by_global_norm(grads, hp.max_grad_norm)
  updates, opt_state = _adam(hp.learning_rate).update(grads, opt_state)
  return (optax.apply_updates(params, updates), opt_state), metrics


def _epochs(nets: PPONetworks, config: PPOConfig, carry, samples: _Minibatch,
            hp: PPOHParams, key: PRNGKey):
  """``epochs`` passes over ``samples`` in shuffled minibatches of
  ``batch_size``, one ``_minibatch_step`` each, from ``carry = (params,
  opt_state)``: the new carry and each metric's mean over the steps."""
  num_samples = config.rollout_length * config.num_envs
  order = minibatch_order(key, num_samples, config.epochs).reshape(
      config.epochs * (num_samples // config.batch_size), config.batch_size)
  carry, metrics = jax.lax.scan(
      lambda c, idx: _minibatch_step(
          nets, config, c, jax.tree.map(lambda x: x[idx], samples), hp),
      carry, order)
  return carry, {k: jnp.mean(v) for k, v in metrics.items()}


def _update(nets: PPONetworks, config: PPOConfig, state: PPOState,
            hp: PPOHParams, rollout: Rollout):
  """``Agent.update``: one PPO iteration on the ``[T, E]`` rollout (the
  module docstring): the samples, the minibatch epochs, then the
  observation statistics merged with the rollout's."""
  samples, values, reward_norm = _samples(nets, config, state, hp, rollout)
  key, k_shuffle = jax.random.split(state.key)
  (params, opt_state), metrics = _epochs(
      nets, config, ((state.policy, state.value), state.opt_state), samples,
      hp, k_shuffle)
  metrics['explained_variance'] = explained_variance(values.reshape(-1),
                                                     samples.returns)
  if config.normalize_rewards:
    metrics['reward_scale'] = 1.0 / jnp.sqrt(reward_norm.stats.var
                                             + REWARD_EPS)
  stats = state.obs_stats
  if config.normalize_observations:
    # At the END of the iteration (VecNormalize: at every env step).
    stats = update_obs_stats(stats, rollout.observation)
  new_state = PPOState(policy=params[0], value=params[1], opt_state=opt_state,
                       obs_stats=stats, reward_norm=reward_norm, key=key,
                       step=state.step + 1)
  return new_state, metrics


def make_agent(env_spec: specs.EnvironmentSpec,
               config: PPOConfig = PPOConfig()) -> Agent:
  """Builds the PPO agent's pure functions for ``env_spec``: the functions
  above with the networks and the static ``config`` bound, so that the
  hyperparameters stay traced arguments."""
  nets = make_networks(env_spec, config)
  return Agent(
      name='ppo', env_spec=env_spec, config=config,
      default_hparams=default_hparams,
      init=functools.partial(_init, nets, config),
      act=functools.partial(_act, nets, config),
      update=functools.partial(_update, nets, config),
      policy_params=_policy_params, learns_from='rollout',
      behave=functools.partial(_behave, nets, config))


# Not in the 2022 paper (it does not tune PPO). PB2 (Parker-Holder et al.
# 2020) tunes PPO's learning rate, clip range, GAE lambda and batch size;
# the batch size is static here (it sets array shapes), so the prior is
# over the first three plus the entropy weight and the discount, around
# SB3's defaults.
SEARCH_SPACE = {
    'learning_rate': ss.LogUniform(1e-5, 1e-3),
    'clip_range': ss.Uniform(0.1, 0.3),
    'ent_coef': ss.Uniform(0.0, 0.01),
    'gae_lambda': ss.Uniform(0.9, 1.0),
    'discount': ss.Discount(0.95, 0.999),
}

# Meaning, unit and valid range of each hyperparameter (``fastpbrl info ppo``).
DOMAINS = {
    'learning_rate': ss.positive('Adam step size of policy and value',
                                 'step size'),
    'clip_range': ss.HParamDomain(
        'the ratio pi/pi_old is clipped to [1 - clip_range, 1 + clip_range]',
        'ratio', low=0.0, high=1.0, low_open=True),
    'ent_coef': ss.non_negative('weight of the entropy bonus in the loss',
                                'loss weight'),
    'vf_coef': ss.non_negative('weight of the value MSE in the loss',
                               'loss weight'),
    'gae_lambda': ss.HParamDomain('lambda of generalised advantage '
                                  'estimation', 'trace decay per env step',
                                  low=0.0, high=1.0),
    'discount': ss.HParamDomain('discount gamma of the returns',
                                'per env step', low=0.0, high=1.0),
    'max_grad_norm': ss.positive('global gradient norm bound of each '
                                 'minibatch step', 'gradient norm'),
}

register('ppo', make_agent=make_agent, config=PPOConfig,
         default_search_space=SEARCH_SPACE, hparam_domains=DOMAINS,
         example_env='CartPole-v1', learns_from='rollout')
