"""Our TD3, SAC and PPO updates against Stable-Baselines3's, step by
step, from the same weights on the same batches and noise (needs the
``.[torch]`` extra).

The learning benchmark's ``sb3-td3`` reference is ahead of our TD3 baseline
on Hopper-v5 over the last fifth of the budget (within seed noise), and
``sync-td3`` (our agent in SB3's synchronous loop) is too. This script
splits the agent from everything else: it copies one member's initial
parameters (policy, both critics, their targets; SAC's temperature) into an
SB3 model, feeds both the same sequence of batches (transitions from the
task's environment under random actions) and the same random normals (ours,
handed to SB3's draws), and after update steps prints the largest relative
difference of every parameter group and of the critic loss. TD3: twin
critics, clipped double-Q target with clipped smoothing noise, termination
mask, Adam, the delayed policy and target steps, Polyak averaging. SAC: the
tanh-Gaussian policy's samples and log-probabilities, the soft target, the
temperature's loss and step, and the order of the three steps.

By default both sides compute in float64, so that the comparison is
exact: in float32 a difference at rounding level (1e-7) grows to a few
percent of the weights within 500 Hopper-v5 updates, for two runs of *our*
update as much as for ours against SB3's (Adam turns rounding-level
gradients into full-size steps), and then says nothing about the method.
``--perturb 1e-7`` shows that growth in float64: SB3 starts from our
weights changed at float32's rounding level.

SAC's one known difference: SB3 adds 1e-6 inside ``log(1 - tanh(u)^2)``
(``SquashedDiagGaussianDistribution.epsilon``), where ours uses the exact
stable form; the check sets SB3's to ``--sb3-epsilon`` (default 0, so the
rest is compared exactly; 1e-6 shows what it changes).

    python -m benchmarks.sb3_equivalence --agent td3 --env Hopper-v5 --steps 1000
    python -m benchmarks.sb3_equivalence --agent sac --env Hopper-v5 --steps 1000
    python -m benchmarks.sb3_equivalence --agent ppo --env Pendulum-v1 --iterations 3
    python -m benchmarks.sb3_equivalence --agent ppo --env Pendulum-v1 \
        --normalize-observations --normalize-rewards

PPO (``compare_ppo``) compares whole iterations: each one collects a
rollout of ``--rollout-length`` steps in ``--num-envs`` envs with OUR
member's ``behave``, then runs our ``update`` on it and SB3's
``PPO.train()`` on SB3's ``RolloutBuffer`` filled as SB3's
``collect_rollouts`` fills it (SB3's own values and log-probabilities of
those observations and actions, its timeout bootstrap ``r + gamma
V(terminal obs)`` at truncations, its episode starts) and its
``compute_returns_and_advantage``. SB3 shuffles with
``np.random.permutation``; the check hands it our epochs' permutations
(``fastpbrl.agents.ppo.minibatch_order``), mapped from our time-major
flattening of ``[T, E]`` to its env-major one. Compared after each
iteration: every layer of policy and value, the log-std, and the
iteration's mean policy, value and entropy losses, clip fraction and
explained variance (SB3's ``approx_kl`` is the last epoch's mean, ours
the iteration's: not compared). Works for discrete and continuous
actions.

``--normalize-observations`` and ``--normalize-rewards`` turn on our
member's ``VecNormalize`` equivalents and put SB3's ``VecNormalize``
(prior count set to ours, 0) on its side. Rewards: SB3's own
``VecNormalize.step_wait``, replaying the rollout's rewards and episode
ends step by step, scales the rewards SB3's buffer gets (before its
timeout bootstrap, as in ``collect_rollouts``); its ``ret_rms`` and
``returns`` are compared with our member's after each iteration.
Observations: our member updates the statistics at the end of each
iteration (a documented departure from VecNormalize's per-step update),
so SB3's ``obs_rms`` is updated likewise, with ``RunningMeanStd.update``
on the rollout's raw observations, and the buffer's observations and
terminal observations are normalised with VecNormalize's formula under
the statistics the rollout was collected with; SB3's ``obs_rms`` is
compared with ours. In float64, SB3's float32 cast of normalised
observations and rewards is skipped (its formulas are used without it).

Exit status 1 if any difference exceeds ``--tolerance``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NamedTuple

import numpy as np

Linears = list  # [(w [in, out], b)] in layer order


def haiku_linears(params: dict, prefix: str) -> Linears:
  """The ``(w [in, out], b)`` of the MLP under ``prefix`` in layer order."""
  names = sorted((k for k in params if k.startswith(prefix)),
                 key=lambda k: int(k.rsplit('_', 1)[1]))
  return [(np.asarray(params[k]['w']), np.asarray(params[k]['b']))
          for k in names]


def split_head(linears: Linears, action_dim: int) -> Linears:
  """SAC's policy MLP ends in one layer of ``2 x action_dim`` outputs (mean,
  then log-std); SB3's has two heads (``mu``, ``log_std``)."""
  *body, (w, b) = linears
  return [*body, (w[:, :action_dim], b[:action_dim]),
          (w[:, action_dim:], b[action_dim:])]


def torch_linears(module) -> list:
  import torch  # noqa: PLC0415
  return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def copy_into(linears_src: Linears, torch_modules) -> None:
  import torch  # noqa: PLC0415
  assert len(linears_src) == len(torch_modules)
  with torch.no_grad():
    for (w, b), lin in zip(linears_src, torch_modules):
      lin.weight.copy_(torch.as_tensor(w.T.copy()))
      lin.bias.copy_(torch.as_tensor(b.copy()))


def max_rel_diff(linears_src: Linears, torch_modules) -> float:
  """The largest relative difference ``|A - B| / |A|`` (Frobenius norms)
  over the layers' weights and biases. Element-wise differences are not
  meaningful: Adam moves a parameter whose gradient is at rounding level
  by up to its full step in either direction, by the sign of that
  rounding."""
  worst = 0.0
  for (w, b), lin in zip(linears_src, torch_modules):
    for ours, theirs in ((w, lin.weight.detach().numpy().T),
                         (b, lin.bias.detach().numpy())):
      worst = max(worst, float(np.linalg.norm(theirs - ours) /
                               max(np.linalg.norm(ours), 1e-12)))
  return worst


class Pair(NamedTuple):
  """One parameter group: ours (from the agent's state) and SB3's modules."""

  ours: Callable  # state -> Linears
  theirs: list  # torch Linear modules in the same order


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--agent', choices=('td3', 'sac', 'ppo'),
                      default='td3')
  parser.add_argument('--env', default='Hopper-v5')
  parser.add_argument('--steps', type=int, default=200,
                      help='update steps to compare')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--target-noise', type=float, default=0.2,
                      help='TD3: target smoothing noise std on both sides')
  parser.add_argument('--sb3-epsilon', type=float, default=0.0,
                      help="SAC: SB3's epsilon in log(1 - tanh(u)^2 + eps) "
                      '(SB3 default 1e-6; ours is exact)')
  parser.add_argument('--tolerance', type=float, default=1e-6,
                      help='largest allowed relative difference')
  parser.add_argument('--float32', action='store_true',
                      help='compute in float32, as training does; the '
                      'default, float64, keeps rounding from growing into '
                      'differences of its own within the compared steps')
  parser.add_argument('--perturb', type=float, default=0.0,
                      help="multiply SB3's copy of the initial weights by "
                      '1 + PERTURB x N(0, 1), element by element, to see how '
                      'far a difference of that size grows')
  parser.add_argument('--iterations', type=int, default=2,
                      help='PPO: iterations (rollout + update) to compare')
  parser.add_argument('--rollout-length', type=int, default=128,
                      help='PPO: steps per env per iteration')
  parser.add_argument('--num-envs', type=int, default=2,
                      help='PPO: envs per iteration')
  parser.add_argument('--batch-size', type=int, default=32,
                      help='PPO: minibatch size')
  parser.add_argument('--epochs', type=int, default=4,
                      help='PPO: passes over each rollout')
  parser.add_argument('--normalize-observations', action='store_true',
                      help='PPO: observation normalisation on both sides')
  parser.add_argument('--normalize-rewards', action='store_true',
                      help="PPO: VecNormalize's reward scaling on both "
                      'sides')
  parser.add_argument('--ent-coef', type=float, default=0.01,
                      help="PPO: entropy weight on both sides (SB3's default "
                      '0 leaves the entropy term out of the comparison)')
  args = parser.parse_args(argv)
  if args.agent == 'ppo':
    for flag in ('iterations', 'rollout_length', 'num_envs', 'batch_size',
                 'epochs'):
      if getattr(args, flag) < 1:
        parser.error(f'--{flag.replace("_", "-")} must be at least 1, got '
                     f'{getattr(args, flag)}')
    if args.ent_coef < 0:
      parser.error(f'--ent-coef must be at least 0, got {args.ent_coef}')
    return compare_ppo(args)
  if args.perturb < 0:
    parser.error(f'--perturb must be at least 0, got {args.perturb}')
  if args.sb3_epsilon < 0:
    parser.error(f'--sb3-epsilon must be at least 0, got {args.sb3_epsilon}')
  if args.steps < 1:
    parser.error(f'--steps must be at least 1, got {args.steps}')

  try:
    import stable_baselines3 as sb3  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from stable_baselines3.common.logger import Logger  # noqa: PLC0415
    from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: PLC0415
  except ImportError as e:
    raise SystemExit(f'needs Stable-Baselines3 ({e}); '
                     "pip install -e '.[torch]'") from None
  import jax  # noqa: PLC0415
  if not args.float32:
    jax.config.update('jax_enable_x64', True)
  import jax.numpy as jnp  # noqa: PLC0415

  from fastpbrl import agents as agents_lib  # noqa: PLC0415
  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.types import Transition, make_env_spec  # noqa: PLC0415

  torch.set_num_threads(1)
  dtype = np.float32 if args.float32 else np.float64
  if not args.float32:
    # SB3 casts Box observations to float32 on the way into its networks.
    import stable_baselines3.common.policies as sb3_policies  # noqa: PLC0415
    sb3_policies.preprocess_obs = lambda obs, *_, **__: obs
  import gymnasium as gym  # noqa: PLC0415
  try:
    env = make_env(args.env)
    spec = make_env_spec(env)
    agent = agents_lib.make_agent(args.agent, spec)
  except (gym.error.Error, ImportError, ValueError) as e:
    raise SystemExit(f'--env {args.env} with --agent {args.agent}: {e}'
                     ) from None
  action_dim = int(spec.actions.shape[0])
  hp = agent.default_hparams()
  if args.agent == 'td3':
    hp = hp._replace(target_noise=args.target_noise)
  # The defaults are float32 arrays; str() gives their shortest decimal
  # (3e-4, not float32's 2.9999999e-4), which SB3 also uses.
  hp = jax.tree.map(lambda x: jnp.asarray(float(str(np.float32(x))), dtype),
                    hp)
  state = jax.jit(agent.init)(jax.random.PRNGKey(args.seed), hp)
  state = jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, state)
  update = jax.jit(lambda st, b: agent.update(st, hp, b))

  common = dict(learning_rate=3e-4, batch_size=256, tau=0.005, gamma=0.99,
                policy_kwargs={'net_arch': [256, 256]}, seed=args.seed,
                device='cpu', verbose=0)
  q_pairs = lambda st_field, critic: {  # noqa: E731
      f'{st_field} q{i + 1}': Pair(
          lambda s, i=i: haiku_linears(getattr(s, st_field), f'q{i + 1}'),
          torch_linears(critic.q_networks[i])) for i in range(2)}
  if args.agent == 'td3':
    model = sb3.TD3('MlpPolicy', env, policy_delay=2,
                    target_policy_noise=args.target_noise,
                    target_noise_clip=0.5, **common)
    pairs = {
        'policy': Pair(lambda s: haiku_linears(s.policy, 'mlp'),
                       torch_linears(model.actor)),
        'target_policy': Pair(lambda s: haiku_linears(s.target_policy, 'mlp'),
                              torch_linears(model.actor_target)),
        **q_pairs('critic', model.critic),
        **q_pairs('target_critic', model.critic_target)}
    modules = (model.actor, model.actor_target, model.critic,
               model.critic_target)

    def normals(st, shape):
      # TD3's update splits its key into (next key, smoothing-noise key).
      return [jax.random.normal(jax.random.split(st.key)[1], shape, dtype)]
  else:
    model = sb3.SAC('MlpPolicy', env, ent_coef='auto_1.0',
                    target_entropy='auto', **common)
    model.actor.action_dist.epsilon = args.sb3_epsilon
    actor = model.actor
    pairs = {
        'policy': Pair(
            lambda s: split_head(haiku_linears(s.policy, 'mlp'), action_dim),
            [*torch_linears(actor.latent_pi), actor.mu, actor.log_std]),
        **q_pairs('critic', model.critic),
        **q_pairs('target_critic', model.critic_target)}
    modules = (model.actor, model.critic, model.critic_target)
    if not args.float32:
      model.log_ent_coef.data = model.log_ent_coef.data.double()
    with torch.no_grad():
      model.log_ent_coef.fill_(float(state.log_alpha))

    def normals(st, shape):
      # SAC's update splits its key into (next, critic, policy); SB3 draws
      # the policy's sample on the batch first, then the target's.
      _, k_critic, k_policy = jax.random.split(st.key, 3)
      return [jax.random.normal(k, shape, dtype) for k in (k_policy, k_critic)]
  model.set_logger(Logger(folder=None, output_formats=[]))
  if not args.float32:
    for module in modules:
      module.double()
  for pair in pairs.values():
    copy_into(pair.ours(state), pair.theirs)
  if args.perturb:
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
      for module in (model.actor, model.critic):
        for p in module.parameters():
          p.mul_(1 + args.perturb * torch.randn(p.shape, generator=gen,
                                                dtype=p.dtype))

  # Transitions from the task under uniform random actions, with real
  # terminations (Hopper falls) and time-limit truncations.
  rng = np.random.default_rng(args.seed)
  obs, _ = env.reset(seed=args.seed)
  data = {k: [] for k in ('observation', 'action', 'reward',
                          'next_observation', 'terminated', 'truncated')}
  for _ in range(2000):
    action = rng.uniform(-1.0, 1.0, spec.actions.shape).astype(np.float32)
    nxt, r, term, trunc, _ = env.step(action)
    for k, v in (('observation', obs), ('action', action), ('reward', r),
                 ('next_observation', nxt), ('terminated', term),
                 ('truncated', trunc)):
      data[k].append(v)
    obs = env.reset()[0] if term or trunc else nxt
  data = {k: np.asarray(v, dtype) for k, v in data.items()}
  size = len(data['reward'])

  worst = 0.0
  for step in range(args.steps):
    idx = rng.integers(0, size, 256)
    batch = {k: v[idx] for k, v in data.items()}
    # The standard normals our update draws, handed to SB3's draws (its
    # train() makes them with ``Tensor.normal_``) in SB3's order.
    draws = iter([np.array(z) for z in normals(state, batch['action'].shape)])
    state, metrics = update(state, Transition(**{
        k: jnp.asarray(v) for k, v in batch.items()}))

    # SB3's train() on exactly this batch: its buffer's sample() is
    # replaced for the step. ``dones`` is the termination flag, as SB3's
    # buffer gives it with timeouts masked out.
    tensors = ReplayBufferSamples(
        observations=torch.as_tensor(batch['observation']),
        actions=torch.as_tensor(batch['action']),
        next_observations=torch.as_tensor(batch['next_observation']),
        dones=torch.as_tensor(batch['terminated'])[:, None],
        rewards=torch.as_tensor(batch['reward'])[:, None])
    model.replay_buffer.sample = lambda *a, _t=tensors, **k: _t
    draw = torch.Tensor.normal_
    torch.Tensor.normal_ = (lambda t, mean=0.0, std=1.0:
                            t.copy_(torch.as_tensor(next(draws)) * std + mean))
    try:
      model.train(gradient_steps=1, batch_size=256)
    finally:
      torch.Tensor.normal_ = draw
    leftover = next(draws, None)
    assert leftover is None, 'SB3 drew fewer normals than our update'
    sb3_loss = model.logger.name_to_value['train/critic_loss']

    diffs = {name: max_rel_diff(pair.ours(state), pair.theirs)
             for name, pair in pairs.items()}
    loss = float(metrics['critic_loss'])
    diffs['critic loss'] = abs(loss - sb3_loss) / max(abs(sb3_loss), 1e-12)
    extra = ''
    if args.agent == 'sac':
      ours_la = float(state.log_alpha)
      diffs['log alpha'] = (abs(ours_la - model.log_ent_coef.item())
                            / max(abs(ours_la), 1e-12))
      extra = f', log alpha {ours_la:.6g}'
    worst = max(worst, max(diffs.values()))
    if step < 3 or (step + 1) % max(1, args.steps // 10) == 0:
      print(f'step {step + 1:4d}: critic loss ours {loss:.6g}, SB3 '
            f'{sb3_loss:.6g}{extra}; largest relative difference ' +
            ', '.join(f'{k} {v:.1e}' for k, v in diffs.items()), flush=True)
  ok = worst <= args.tolerance
  print(f'{args.agent}, {args.env}, {args.steps} update steps: largest '
        f'relative difference {worst:.2e} ({"within" if ok else "above"} the '
        f'tolerance {args.tolerance:g})')
  return 0 if ok else 1


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
  import jax  # noqa: PLC0415
  from acme import specs  # noqa: PLC0415

  from fastpbrl.types import make_env_spec, scale_action  # noqa: PLC0415
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
  import torch  # noqa: PLC0415
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


def _sb3_normalizers(venv, gamma: float, float64: bool):
  """SB3's ``VecNormalize`` for observations (statistics only: the check
  updates them itself) and one for rewards over a replay of recorded
  steps (``replay.next``: what ``step_wait`` returns), both with the
  prior count 0, and a function ``(obs, rms) -> normalised obs``."""
  from stable_baselines3.common.vec_env import (  # noqa: PLC0415
      VecEnvWrapper, VecNormalize)

  class Replay(VecEnvWrapper):
    """Returns ``self.next`` from ``step_wait``: the recorded step."""

    next = None

    def reset(self):
      return self.venv.reset()

    def step_wait(self):
      return self.next

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
  return obs_norm, reward_norm, replay, normalize


def _rel(ours, theirs) -> float:
  ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
  return float(np.linalg.norm(ours - theirs)
               / max(np.linalg.norm(theirs), 1e-12))


def compare_ppo(args) -> int:
  """One or more PPO iterations, ours against SB3's (module docstring);
  returns the exit status."""
  try:
    import stable_baselines3 as sb3  # noqa: PLC0415
    import torch  # noqa: PLC0415
    from stable_baselines3.common.logger import Logger  # noqa: PLC0415
    from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: PLC0415
  except ImportError as e:
    raise SystemExit(f'needs Stable-Baselines3 ({e}); '
                     "pip install -e '.[torch]'") from None
  import jax  # noqa: PLC0415
  if not args.float32:
    jax.config.update('jax_enable_x64', True)
  import jax.numpy as jnp  # noqa: PLC0415

  from fastpbrl import agents as agents_lib  # noqa: PLC0415
  from fastpbrl.agents import ppo  # noqa: PLC0415
  from fastpbrl.envs import make_env  # noqa: PLC0415
  from fastpbrl.types import Rollout, make_env_spec  # noqa: PLC0415

  torch.set_num_threads(1)
  dtype = np.float32 if args.float32 else np.float64
  if not args.float32:
    import stable_baselines3.common.policies as sb3_policies  # noqa: PLC0415
    sb3_policies.preprocess_obs = lambda obs, *_, **__: obs
  import gymnasium as gym  # noqa: PLC0415
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
  hp = agent.default_hparams()._replace(ent_coef=args.ent_coef)
  # str() of the float32 defaults: their shortest decimals, SB3's values.
  hp = jax.tree.map(lambda x: jnp.asarray(float(str(np.float32(x))), dtype),
                    hp)
  state = jax.jit(agent.init)(jax.random.PRNGKey(args.seed), hp)
  state = jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, state)
  update = jax.jit(lambda st, r: agent.update(st, hp, r))
  behave = jax.jit(lambda p, o, k: agent.behave(p, o, k, hp))

  venv = DummyVecEnv([lambda: make_env(args.env)] * args.num_envs)
  obs_norm, reward_norm, replay, normalize = _sb3_normalizers(
      venv, float(hp.discount), not args.float32)
  model = sb3.PPO(
      'MlpPolicy', venv,
      learning_rate=float(hp.learning_rate), n_steps=args.rollout_length,
      batch_size=args.batch_size, n_epochs=args.epochs,
      gamma=float(hp.discount), gae_lambda=float(hp.gae_lambda),
      clip_range=float(hp.clip_range), ent_coef=float(hp.ent_coef),
      vf_coef=float(hp.vf_coef), max_grad_norm=float(hp.max_grad_norm),
      seed=args.seed, device='cpu', verbose=0)
  model.set_logger(Logger(folder=None, output_formats=[]))
  if not args.float32:
    model.policy.double()
  parts = _sb3_ppo_parts(model.policy)
  ours = {'policy': lambda s: haiku_linears(s.policy, 'policy'),
          'value': lambda s: haiku_linears(s.value, 'value')}
  for name, modules in parts.items():
    copy_into(ours[name](state), modules)
  nets = ppo.make_networks(spec, config)
  has_log_std = not nets.discrete
  if has_log_std:
    with torch.no_grad():
      model.policy.log_std.copy_(torch.as_tensor(
          np.array(state.policy['~']['log_std'])))
  if args.perturb:
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
      for p in model.policy.parameters():
        p.mul_(1 + args.perturb * torch.randn(p.shape, generator=gen,
                                              dtype=p.dtype))

  obs_now = [env.reset(seed=args.seed + e)[0] for e, env in enumerate(envs)]
  key = jax.random.PRNGKey(args.seed + 1)
  num_samples = args.rollout_length * args.num_envs
  worst = 0.0
  for it in range(args.iterations):
    data, key = _rollout(envs, obs_now, behave, agent.policy_params(state),
                         key, args.rollout_length, dtype)
    sb3_data = dict(data)
    if args.normalize_observations:
      for k in ('observation', 'next_observation'):
        sb3_data[k] = normalize(data[k], obs_norm.obs_rms).astype(dtype)
    if args.normalize_rewards:
      scaled = []
      for t in range(args.rollout_length):
        replay.next = (data['next_observation'][t], data['reward'][t],
                       np.maximum(data['terminated'][t],
                                  data['truncated'][t]) > 0,
                       [{} for _ in range(args.num_envs)])
        scaled.append(reward_norm.step_wait()[1])
      sb3_data['reward'] = np.stack(scaled).astype(dtype)
    _fill_sb3_buffer(model, sb3_data, dtype, float(hp.discount))
    if args.normalize_observations:
      # At the end of the iteration, as our member (module docstring).
      obs_norm.obs_rms.update(data['observation'].reshape(num_samples, -1))
    # The behaviour log-probabilities of the (rounded) actions.
    obs = jnp.asarray(data['observation'])
    if args.normalize_observations:
      obs = ppo.normalize(state.obs_stats, obs)
    log_prob, _ = ppo.log_prob_and_entropy(
        nets, state.policy, obs.reshape(num_samples, -1),
        jnp.asarray(data['action']).reshape(
            (num_samples,) + data['action'].shape[2:]))
    rollout = Rollout(**{k: jnp.asarray(v) for k, v in data.items()},
                      log_prob=log_prob.reshape(data['reward'].shape))
    # Our update's shuffles (it splits state.key into (next, shuffle)),
    # as the env-major indices of SB3's flattened buffer.
    order = np.asarray(ppo.minibatch_order(
        jax.random.split(state.key)[1], num_samples, args.epochs))
    sb3_order = iter((order % args.num_envs) * args.rollout_length
                     + order // args.num_envs)
    state, metrics = update(state, rollout)

    permutation = np.random.permutation
    np.random.permutation = lambda n, _it=sb3_order: next(_it)
    try:
      model.train()
    finally:
      np.random.permutation = permutation
    assert next(sb3_order, None) is None, 'SB3 ran fewer epochs than ours'

    diffs = {name: max_rel_diff(ours[name](state), modules)
             for name, modules in parts.items()}
    if has_log_std:
      mine = np.asarray(state.policy['~']['log_std'])
      theirs = model.policy.log_std.detach().numpy()
      diffs['log_std'] = float(np.linalg.norm(mine - theirs)
                               / max(np.linalg.norm(mine), 1e-12))
    if args.normalize_observations:
      diffs['obs mean'] = _rel(state.obs_stats.mean, obs_norm.obs_rms.mean)
      diffs['obs var'] = _rel(state.obs_stats.var, obs_norm.obs_rms.var)
    if args.normalize_rewards:
      rms = reward_norm.ret_rms
      diffs['return mean'] = _rel(state.reward_norm.stats.mean, rms.mean)
      diffs['return var'] = _rel(state.reward_norm.stats.var, rms.var)
      diffs['returns'] = _rel(state.reward_norm.returns, reward_norm.returns)
      assert float(state.reward_norm.stats.count) == rms.count
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
      mine = float(metrics[name])
      diffs[name] = abs(mine - theirs) / max(abs(theirs), 1.0)
    worst = max(worst, max(diffs.values()))
    print(f'iteration {it + 1}: value loss ours '
          f'{float(metrics["value_loss"]):.6g}, SB3 '
          f'{sb3_metrics["value_loss"]:.6g}; largest relative difference ' +
          ', '.join(f'{k} {v:.1e}' for k, v in diffs.items()), flush=True)
  ok = worst <= args.tolerance
  print(f'ppo, {args.env}, {args.iterations} iterations: largest relative '
        f'difference {worst:.2e} ({"within" if ok else "above"} the '
        f'tolerance {args.tolerance:g})')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
