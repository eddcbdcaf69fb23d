"""PPO against Stable-Baselines3's, iteration by iteration: each rollout
collected with our member's ``behave``, then our ``update`` on it and
SB3's ``PPO.train()`` on SB3's ``RolloutBuffer`` filled as SB3's
``collect_rollouts`` fills it, with our epochs' shuffles; the networks,
losses and normalisation statistics compared after each iteration (the
package's docstring says what is compared and how)."""

from __future__ import annotations

from typing import Callable, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import stable_baselines3 as sb3
import torch
from acme import specs
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.vec_env import (
    DummyVecEnv, VecEnvWrapper, VecNormalize)

from benchmarks.sb3_equivalence.weights import (
    at_dtype, compared_dtype, copy_into, differences_line, exit_status,
    haiku_linears, max_rel_diff, perturb, relative_difference, torch_linears)
from fastpbrl import agents as agents_lib
from fastpbrl.agents import ppo
from fastpbrl.core.types import Rollout, make_env_spec, scale_action
from fastpbrl.envs.gym import make_env

# Our parameter groups, from the agent's state.
OURS = {'policy': lambda s: haiku_linears(s.policy, 'policy'),
        'value': lambda s: haiku_linears(s.value, 'value')}


def _sb3_ppo_parts(policy) -> dict:
  """SB3's ``ActorCriticPolicy`` modules in our parameter groups' order."""
  return {
      'policy': [*torch_linears(policy.mlp_extractor.policy_net),
                 policy.action_net],
      'value': [*torch_linears(policy.mlp_extractor.value_net),
                policy.value_net]}


def _rollout(envs: list, obs_now: list, behave, policy_params, key,
             steps: int, dtype):
  """``steps`` steps of each env under our member's ``behave`` (jitted,
  ``(policy_params, obs, key) -> (action, log_prob)``); returns the
  ``Rollout`` fields but ``log_prob`` as numpy ``[T, E, ...]``
  (continuous actions rounded to float32: SB3's buffer casts them so) and
  the next key. Episodes that end are reset; ``obs_now`` (each env's
  observation) is updated in place."""
  action_spec = make_env_spec(envs[0]).actions
  discrete = isinstance(action_spec, specs.DiscreteArray)
  fields = {k: [] for k in ('observation', 'action', 'reward',
                            'next_observation', 'terminated', 'truncated')}
  for _ in range(steps):
    key, k_act = jax.random.split(key)
    obs = np.stack(obs_now).astype(dtype)
    action = np.asarray(behave(policy_params, obs, k_act)[0])
    if not discrete:
      action = action.astype(np.float32).astype(dtype)
    row = {k: [] for k in fields}
    for e, env in enumerate(envs):
      a = int(action[e]) if discrete else scale_action(action[e],
                                                       action_spec)
      nxt, r, term, trunc, _ = env.step(a)
      row['reward'].append(r)
      row['next_observation'].append(nxt)
      row['terminated'].append(term)
      row['truncated'].append(trunc and not term)
      obs_now[e] = env.reset()[0] if term or trunc else nxt
    fields['observation'].append(obs)
    fields['action'].append(action)
    for k in ('reward', 'next_observation', 'terminated', 'truncated'):
      fields[k].append(np.asarray(row[k], dtype))
  out = {k: np.stack(v) for k, v in fields.items()}
  if discrete:
    out['action'] = out['action'].astype(np.int32)
  return out, key


def _fill_sb3_buffer(model, data: dict, dtype, gamma: float) -> None:
  """SB3's ``RolloutBuffer`` as ``collect_rollouts`` leaves it on ``data``
  (SB3's own values and log-probabilities), then its GAE."""
  policy, buf = model.policy, model.rollout_buffer
  steps, num_envs = data['reward'].shape
  tensor = lambda x: torch.as_tensor(np.ascontiguousarray(x))  # noqa: E731
  flat_obs = data['observation'].reshape(steps * num_envs, -1)
  actions = data['action'].reshape(steps * num_envs, -1)
  with torch.no_grad():
    values = policy.predict_values(tensor(flat_obs)).numpy().reshape(
        steps, num_envs)
    torch_actions = tensor(actions)
    if np.issubdtype(actions.dtype, np.integer):
      torch_actions = torch_actions.long().flatten()
    _, log_prob, _ = policy.evaluate_actions(tensor(flat_obs), torch_actions)
    next_values = policy.predict_values(tensor(
        data['next_observation'].reshape(steps * num_envs, -1))).numpy(
        ).reshape(steps, num_envs)
  done = np.maximum(data['terminated'], data['truncated'])
  buf.reset()
  buf.observations = data['observation'].astype(dtype)
  buf.actions = actions.reshape(steps, num_envs, -1).astype(dtype)
  # The timeout bootstrap of collect_rollouts (truncated and not terminated).
  buf.rewards = (data['reward'] + gamma * data['truncated'] * next_values
                 ).astype(dtype)
  buf.episode_starts = np.concatenate(
      [np.zeros((1, num_envs)), done[:-1]]).astype(dtype)
  buf.values = values.astype(dtype)
  buf.log_probs = log_prob.numpy().reshape(steps, num_envs).astype(dtype)
  buf.advantages = np.zeros((steps, num_envs), dtype)
  buf.returns = np.zeros((steps, num_envs), dtype)
  buf.pos, buf.full = steps, True
  buf.compute_returns_and_advantage(torch.as_tensor(next_values[-1]),
                                    done[-1])


class Replay(VecEnvWrapper):
  """Returns ``self.next`` from ``step_wait``: the recorded step."""

  next = None

  def reset(self):
    return self.venv.reset()

  def step_wait(self):
    return self.next


class Normalizers(NamedTuple):
  """SB3's ``VecNormalize`` for observations (statistics only: the check
  updates them itself) and one for rewards over a replay of recorded
  steps (``replay.next``: what ``step_wait`` returns), both with the prior
  count 0, and ``normalize``, ``(obs, rms) -> normalised obs``."""

  obs: VecNormalize
  reward: VecNormalize
  replay: Replay
  normalize: Callable


def _sb3_normalizers(venv, gamma: float, float64: bool) -> Normalizers:
  replay = Replay(venv)
  obs_norm = VecNormalize(venv, norm_obs=True, norm_reward=False)
  reward_norm = VecNormalize(replay, norm_obs=False, norm_reward=True,
                             gamma=gamma)
  obs_norm.obs_rms.count = 0.0
  reward_norm.ret_rms.count = 0.0
  if float64:
    # SB3's normalize_reward without its final cast to float32.
    reward_norm.normalize_reward = lambda r: np.clip(
        r / np.sqrt(reward_norm.ret_rms.var + reward_norm.epsilon),
        -reward_norm.clip_reward, reward_norm.clip_reward)
    normalize = obs_norm._normalize_obs  # noqa: SLF001 (no float32 cast)
  else:
    normalize = lambda obs, _: obs_norm.normalize_obs(obs)  # noqa: E731
  return Normalizers(obs_norm, reward_norm, replay, normalize)


def _sb3_model(args, hp, norms: Normalizers):
  """SB3's PPO at our hyperparameters ``hp`` and the check's layout."""
  model = sb3.PPO(
      'MlpPolicy', norms.obs.venv,
      learning_rate=float(hp.learning_rate), n_steps=args.rollout_length,
      batch_size=args.batch_size, n_epochs=args.epochs,
      gamma=float(hp.discount), gae_lambda=float(hp.gae_lambda),
      clip_range=float(hp.clip_range), ent_coef=float(hp.ent_coef),
      vf_coef=float(hp.vf_coef), max_grad_norm=float(hp.max_grad_norm),
      seed=args.seed, device='cpu', verbose=0)
  model.set_logger(Logger(folder=None, output_formats=[]))
  if not args.float32:
    model.policy.double()
  return model


def _sb3_data(args, data: dict, norms: Normalizers, dtype) -> dict:
  """The rollout as SB3's buffer gets it: observations normalised under
  the statistics it was collected with, rewards scaled step by step by
  ``VecNormalize.step_wait`` (its returns reset at episode ends)."""
  sb3_data = dict(data)
  if args.normalize_observations:
    for k in ('observation', 'next_observation'):
      sb3_data[k] = norms.normalize(data[k], norms.obs.obs_rms).astype(dtype)
  if args.normalize_rewards:
    scaled = []
    for t in range(args.rollout_length):
      norms.replay.next = (data['next_observation'][t], data['reward'][t],
                           np.maximum(data['terminated'][t],
                                      data['truncated'][t]) > 0,
                           [{} for _ in range(args.num_envs)])
      scaled.append(norms.reward.step_wait()[1])
    sb3_data['reward'] = np.stack(scaled).astype(dtype)
  return sb3_data


def _our_rollout(args, nets, state, data: dict) -> Rollout:
  """Our ``Rollout`` of ``data``, with the behaviour log-probabilities of
  its (rounded) actions."""
  num_samples = args.rollout_length * args.num_envs
  obs = jnp.asarray(data['observation'])
  if args.normalize_observations:
    obs = ppo.normalize(state.obs_stats, obs)
  log_prob, _ = ppo.log_prob_and_entropy(
      nets, state.policy, obs.reshape(num_samples, -1),
      jnp.asarray(data['action']).reshape(
          (num_samples,) + data['action'].shape[2:]))
  return Rollout(**{k: jnp.asarray(v) for k, v in data.items()},
                 log_prob=log_prob.reshape(data['reward'].shape))


def _sb3_train_in_our_order(args, model, state) -> None:
  """SB3's ``train()`` with our update's shuffles (it splits ``state.key``
  into (next, shuffle)) as the env-major indices of SB3's flattened
  buffer, handed to its ``np.random.permutation``."""
  num_samples = args.rollout_length * args.num_envs
  order = np.asarray(ppo.minibatch_order(
      jax.random.split(state.key)[1], num_samples, args.epochs))
  sb3_order = iter((order % args.num_envs) * args.rollout_length
                   + order // args.num_envs)
  permutation = np.random.permutation
  np.random.permutation = lambda n, _it=sb3_order: next(_it)
  try:
    model.train()
  finally:
    np.random.permutation = permutation
  assert next(sb3_order, None) is None, 'SB3 ran fewer epochs than ours'


def _differences(args, state, metrics, model, norms: Normalizers,
                 has_log_std: bool) -> dict:
  """Each parameter group's largest relative difference after an
  iteration, the log-std's (continuous actions), the normalisation
  statistics' and the iteration's logged metrics'."""
  diffs = {name: max_rel_diff(OURS[name](state), modules)
           for name, modules in _sb3_ppo_parts(model.policy).items()}
  if has_log_std:
    mine = np.asarray(state.policy['~']['log_std'])
    diffs['log_std'] = relative_difference(
        model.policy.log_std.detach().numpy(), reference=mine)
  if args.normalize_observations:
    rms = norms.obs.obs_rms
    diffs['obs mean'] = relative_difference(state.obs_stats.mean, rms.mean)
    diffs['obs var'] = relative_difference(state.obs_stats.var, rms.var)
  if args.normalize_rewards:
    rms = norms.reward.ret_rms
    stats = state.reward_norm.stats
    diffs['return mean'] = relative_difference(stats.mean, rms.mean)
    diffs['return var'] = relative_difference(stats.var, rms.var)
    diffs['returns'] = relative_difference(state.reward_norm.returns,
                                           norms.reward.returns)
    assert float(stats.count) == rms.count
  logged = model.logger.name_to_value
  sb3_metrics = {
      'policy_loss': logged['train/policy_gradient_loss'],
      'value_loss': logged['train/value_loss'],
      'entropy': -logged['train/entropy_loss'],
      'clip_fraction': logged['train/clip_fraction'],
      'explained_variance': logged['train/explained_variance']}
  # Metrics near 0 (a policy loss of normalised advantages) have no
  # relative digits: their differences are taken relative to max(|x|, 1).
  for name, theirs in sb3_metrics.items():
    diffs[name] = abs(float(metrics[name]) - theirs) / max(abs(theirs), 1.0)
  return diffs


def compare(args) -> int:
  """``args.iterations`` PPO iterations, ours against SB3's; prints the
  differences and returns the exit status."""
  torch.set_num_threads(1)
  dtype = compared_dtype(args.float32)
  try:
    config = ppo.PPOConfig(
        rollout_length=args.rollout_length, num_envs=args.num_envs,
        batch_size=args.batch_size, epochs=args.epochs,
        normalize_observations=args.normalize_observations,
        normalize_rewards=args.normalize_rewards)
    envs = [make_env(args.env) for _ in range(args.num_envs)]
    spec = make_env_spec(envs[0])
    agent = agents_lib.make_agent('ppo', spec, config)
  except (gym.error.Error, ImportError, ValueError) as e:
    raise SystemExit(f'--env {args.env} with --agent ppo: {e}') from None
  hp, state = at_dtype(
      agent, agent.default_hparams()._replace(ent_coef=args.ent_coef),
      args.seed, dtype)
  update = jax.jit(lambda st, r: agent.update(st, hp, r))
  behave = jax.jit(lambda p, o, k: agent.behave(p, o, k, hp))

  norms = _sb3_normalizers(
      DummyVecEnv([lambda: make_env(args.env)] * args.num_envs),
      float(hp.discount), not args.float32)
  model = _sb3_model(args, hp, norms)
  for name, modules in _sb3_ppo_parts(model.policy).items():
    copy_into(OURS[name](state), modules)
  nets = ppo.make_networks(spec, config)
  if not nets.discrete:
    with torch.no_grad():
      model.policy.log_std.copy_(torch.as_tensor(
          np.array(state.policy['~']['log_std'])))
  perturb((model.policy,), args.perturb, args.seed)

  obs_now = [env.reset(seed=args.seed + e)[0] for e, env in enumerate(envs)]
  key = jax.random.PRNGKey(args.seed + 1)
  worst = 0.0
  for it in range(args.iterations):
    data, key = _rollout(envs, obs_now, behave, agent.policy_params(state),
                         key, args.rollout_length, dtype)
    _fill_sb3_buffer(model, _sb3_data(args, data, norms, dtype), dtype,
                     float(hp.discount))
    if args.normalize_observations:
      # At the end of the iteration, as our member (module docstring).
      norms.obs.obs_rms.update(data['observation'].reshape(
          args.rollout_length * args.num_envs, -1))
    rollout = _our_rollout(args, nets, state, data)
    _sb3_train_in_our_order(args, model, state)
    state, metrics = update(state, rollout)
    diffs = _differences(args, state, metrics, model, norms,
                         not nets.discrete)
    worst = max(worst, max(diffs.values()))
    print(f'iteration {it + 1}: value loss ours '
          f'{float(metrics["value_loss"]):.6g}, SB3 '
          f'{model.logger.name_to_value["train/value_loss"]:.6g}; '
          f'{differences_line(diffs)}', flush=True)
  return exit_status(f'ppo, {args.env}, {args.iterations} iterations', worst,
                     args.tolerance)
