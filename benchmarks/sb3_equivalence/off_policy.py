"""TD3 and SAC against Stable-Baselines3's, update by update: SB3's model
with our initial weights, both sides fed the same batches of transitions
and the same standard normals, every parameter group and the critic loss
compared after each update step."""

from __future__ import annotations

from typing import Callable, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import stable_baselines3 as sb3
import torch
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from benchmarks.sb3_equivalence.weights import (
    Pair, at_dtype, compared_dtype, copy_into, differences_line, exit_status,
    haiku_linears, max_rel_diff, perturb, split_head, torch_linears)
from fastpbrl import agents as agents_lib
from fastpbrl.core.types import Transition, make_env_spec
from fastpbrl.envs.gym import make_env

BATCH_SIZE = 256
RANDOM_STEPS = 2000  # transitions the batches are drawn from


class SB3Side(NamedTuple):
  """SB3's model and how it lines up with ours."""

  model: object
  pairs: dict  # parameter group name -> Pair
  modules: tuple  # its torch modules, cast to the compared dtype
  # (our state, action shape, dtype) -> our update's standard normals, in
  # the order SB3's train() draws them.
  normals: Callable


def td3_normals(state, shape, dtype) -> list:
  """TD3's update splits its key into (next key, smoothing-noise key)."""
  return [jax.random.normal(jax.random.split(state.key)[1], shape, dtype)]


def sac_normals(state, shape, dtype) -> list:
  """SAC's update splits its key into (next, critic, policy); SB3 draws
  the policy's sample on the batch first, then the target's."""
  _, k_critic, k_policy = jax.random.split(state.key, 3)
  return [jax.random.normal(k, shape, dtype) for k in (k_policy, k_critic)]


def _q_pairs(state_field: str, critic) -> dict:
  return {f'{state_field} q{i + 1}': Pair(
      lambda s, i=i: haiku_linears(getattr(s, state_field), f'q{i + 1}'),
      torch_linears(critic.q_networks[i])) for i in range(2)}


def sb3_side(args, env, state, action_dim: int) -> SB3Side:
  """SB3's TD3 or SAC (``args.agent``) at our defaults, its parameter
  groups paired with ours; SAC's temperature set to ours."""
  common = dict(learning_rate=3e-4, batch_size=BATCH_SIZE, tau=0.005,
                gamma=0.99, policy_kwargs={'net_arch': [256, 256]},
                seed=args.seed, device='cpu', verbose=0)
  if args.agent == 'td3':
    model = sb3.TD3('MlpPolicy', env, policy_delay=2,
                    target_policy_noise=args.target_noise,
                    target_noise_clip=0.5, **common)
    pairs = {
        'policy': Pair(lambda s: haiku_linears(s.policy, 'mlp'),
                       torch_linears(model.actor)),
        'target_policy': Pair(lambda s: haiku_linears(s.target_policy, 'mlp'),
                              torch_linears(model.actor_target)),
        **_q_pairs('critic', model.critic),
        **_q_pairs('target_critic', model.critic_target)}
    return SB3Side(model, pairs, (model.actor, model.actor_target,
                                  model.critic, model.critic_target),
                   td3_normals)
  model = sb3.SAC('MlpPolicy', env, ent_coef='auto_1.0',
                  target_entropy='auto', **common)
  model.actor.action_dist.epsilon = args.sb3_epsilon
  actor = model.actor
  pairs = {
      'policy': Pair(
          lambda s: split_head(haiku_linears(s.policy, 'mlp'), action_dim),
          [*torch_linears(actor.latent_pi), actor.mu, actor.log_std]),
      **_q_pairs('critic', model.critic),
      **_q_pairs('target_critic', model.critic_target)}
  if not args.float32:
    model.log_ent_coef.data = model.log_ent_coef.data.double()
  with torch.no_grad():
    model.log_ent_coef.fill_(float(state.log_alpha))
  return SB3Side(model, pairs, (model.actor, model.critic,
                                model.critic_target), sac_normals)


def random_transitions(env, spec, rng, seed: int, dtype) -> dict:
  """``RANDOM_STEPS`` transitions from the task under uniform random
  actions, with real terminations (Hopper falls) and time-limit
  truncations, as arrays of ``dtype``."""
  obs, _ = env.reset(seed=seed)
  data = {k: [] for k in ('observation', 'action', 'reward',
                          'next_observation', 'terminated', 'truncated')}
  for _ in range(RANDOM_STEPS):
    action = rng.uniform(-1.0, 1.0, spec.actions.shape).astype(np.float32)
    nxt, r, term, trunc, _ = env.step(action)
    for k, v in (('observation', obs), ('action', action), ('reward', r),
                 ('next_observation', nxt), ('terminated', term),
                 ('truncated', trunc)):
      data[k].append(v)
    obs = env.reset()[0] if term or trunc else nxt
  return {k: np.asarray(v, dtype) for k, v in data.items()}


def sb3_train_on(model, batch: dict, normals: list) -> float:
  """SB3's ``train()`` for one gradient step on exactly ``batch`` (its
  buffer's ``sample()`` replaced for the step), its ``Tensor.normal_``
  draws taking ``normals`` in order; returns its critic loss. ``dones``
  is the termination flag, as SB3's buffer gives it with timeouts masked
  out."""
  tensors = ReplayBufferSamples(
      observations=torch.as_tensor(batch['observation']),
      actions=torch.as_tensor(batch['action']),
      next_observations=torch.as_tensor(batch['next_observation']),
      dones=torch.as_tensor(batch['terminated'])[:, None],
      rewards=torch.as_tensor(batch['reward'])[:, None])
  model.replay_buffer.sample = lambda *a, _t=tensors, **k: _t
  draws = iter(normals)
  draw = torch.Tensor.normal_
  torch.Tensor.normal_ = (lambda t, mean=0.0, std=1.0:
                          t.copy_(torch.as_tensor(next(draws)) * std + mean))
  try:
    model.train(gradient_steps=1, batch_size=BATCH_SIZE)
  finally:
    torch.Tensor.normal_ = draw
  assert next(draws, None) is None, 'SB3 drew fewer normals than our update'
  return model.logger.name_to_value['train/critic_loss']


def step_differences(state, loss: float, side: SB3Side,
                     sb3_loss: float) -> dict:
  """Each parameter group's largest relative difference after a step, the
  critic loss's, and (SAC) the temperature's."""
  diffs = {name: max_rel_diff(pair.ours(state), pair.theirs)
           for name, pair in side.pairs.items()}
  diffs['critic loss'] = abs(loss - sb3_loss) / max(abs(sb3_loss), 1e-12)
  if hasattr(state, 'log_alpha'):
    ours = float(state.log_alpha)
    diffs['log alpha'] = (abs(ours - side.model.log_ent_coef.item())
                          / max(abs(ours), 1e-12))
  return diffs


def compare(args) -> int:
  """``args.steps`` updates of ``args.agent`` (TD3 or SAC), ours against
  SB3's; prints the differences and returns the exit status."""
  torch.set_num_threads(1)
  dtype = compared_dtype(args.float32)
  try:
    env = make_env(args.env)
    spec = make_env_spec(env)
    agent = agents_lib.make_agent(args.agent, spec)
  except (gym.error.Error, ImportError, ValueError) as e:
    raise SystemExit(f'--env {args.env} with --agent {args.agent}: {e}'
                     ) from None
  hp = agent.default_hparams()
  if args.agent == 'td3':
    hp = hp._replace(target_noise=args.target_noise)
  hp, state = at_dtype(agent, hp, args.seed, dtype)
  update = jax.jit(lambda st, b: agent.update(st, hp, b))
  side = sb3_side(args, env, state, int(spec.actions.shape[0]))
  side.model.set_logger(Logger(folder=None, output_formats=[]))
  if not args.float32:
    for module in side.modules:
      module.double()
  for pair in side.pairs.values():
    copy_into(pair.ours(state), pair.theirs)
  perturb((side.model.actor, side.model.critic), args.perturb, args.seed)

  rng = np.random.default_rng(args.seed)
  data = random_transitions(env, spec, rng, args.seed, dtype)
  worst = 0.0
  for step in range(args.steps):
    idx = rng.integers(0, len(data['reward']), BATCH_SIZE)
    batch = {k: v[idx] for k, v in data.items()}
    normals = [np.array(z) for z in
               side.normals(state, batch['action'].shape, dtype)]
    state, metrics = update(state, Transition(**{
        k: jnp.asarray(v) for k, v in batch.items()}))
    sb3_loss = sb3_train_on(side.model, batch, normals)
    loss = float(metrics['critic_loss'])
    diffs = step_differences(state, loss, side, sb3_loss)
    worst = max(worst, max(diffs.values()))
    if step < 3 or (step + 1) % max(1, args.steps // 10) == 0:
      extra = (f', log alpha {float(state.log_alpha):.6g}'
               if 'log alpha' in diffs else '')
      print(f'step {step + 1:4d}: critic loss ours {loss:.6g}, SB3 '
            f'{sb3_loss:.6g}{extra}; {differences_line(diffs)}', flush=True)
  return exit_status(f'{args.agent}, {args.env}, {args.steps} update steps',
                     worst, args.tolerance)
