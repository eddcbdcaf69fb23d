"""Our TD3 update against Stable-Baselines3's, step by step, from the same
weights on the same batches (needs the ``.[torch]`` extra).

The learning benchmark's ``sb3-td3`` reference is ahead of our TD3 baseline
on Hopper-v5 over the last fifth of the budget, and ``sync-td3`` (our agent
in SB3's synchronous loop) is too. This script splits the agent from
everything else: it copies one member's initial parameters (online and
target, policy and both critics) into an SB3 ``TD3`` model, feeds both the
same sequence of batches (transitions from the task's environment under
random actions) and the same target smoothing noise (ours, handed to
SB3's draw), and after update steps prints the largest relative
difference of every parameter group and of the critic loss: twin critics,
clipped double-Q target with clipped smoothing noise, termination mask,
Adam, the delayed policy and target steps and Polyak averaging are all
compared.

By default both sides compute in float64, so that the comparison is
exact: in float32 a difference at rounding level (1e-7) grows to about
1% of the weights within 500 Hopper-v5 updates, for two runs of *our*
update as much as for ours against SB3's (Adam turns rounding-level
gradients into full-size steps), and then says nothing about the method.
``--perturb 1e-7`` shows that growth in float64: SB3 starts from our
weights changed at float32's rounding level.

    python -m benchmarks.sb3_td3_equivalence --env Hopper-v5 --steps 1000

Exit status 1 if any difference exceeds ``--tolerance``.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def haiku_linears(params: dict, prefix: str) -> list[tuple[np.ndarray, np.ndarray]]:
  """The ``(w [in, out], b)`` of the MLP under ``prefix`` in layer order."""
  names = sorted((k for k in params if k.startswith(prefix)),
                 key=lambda k: int(k.rsplit('_', 1)[1]))
  return [(np.asarray(params[k]['w']), np.asarray(params[k]['b']))
          for k in names]


def torch_linears(module) -> list:
  import torch  # noqa: PLC0415
  return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def copy_into(linears_src, torch_modules) -> None:
  import torch  # noqa: PLC0415
  assert len(linears_src) == len(torch_modules)
  with torch.no_grad():
    for (w, b), lin in zip(linears_src, torch_modules):
      lin.weight.copy_(torch.as_tensor(w.T.copy()))
      lin.bias.copy_(torch.as_tensor(b.copy()))


def max_rel_diff(linears_src, torch_modules) -> float:
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


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--env', default='Hopper-v5')
  parser.add_argument('--steps', type=int, default=200,
                      help='update steps to compare')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--target-noise', type=float, default=0.2,
                      help='target smoothing noise std on both sides')
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
  args = parser.parse_args(argv)
  if args.perturb < 0:
    parser.error(f'--perturb must be at least 0, got {args.perturb}')
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
  env = make_env(args.env)
  spec = make_env_spec(env)
  agent = agents_lib.make_agent('td3', spec)
  hp = agent.default_hparams()._replace(target_noise=args.target_noise)
  # The defaults are float32 arrays; str() gives their shortest decimal
  # (3e-4, not float32's 2.9999999e-4), which SB3 also uses.
  hp = jax.tree.map(lambda x: jnp.asarray(float(str(np.float32(x))), dtype),
                    hp)
  state = jax.jit(agent.init)(jax.random.PRNGKey(args.seed), hp)
  state = jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
      else x, state)
  update = jax.jit(lambda st, b: agent.update(st, hp, b))

  model = sb3.TD3('MlpPolicy', env, learning_rate=3e-4, batch_size=256,
                  tau=0.005, gamma=0.99, policy_delay=2,
                  target_policy_noise=args.target_noise, target_noise_clip=0.5,
                  policy_kwargs={'net_arch': [256, 256]}, seed=args.seed,
                  device='cpu', verbose=0)
  model.set_logger(Logger(folder=None, output_formats=[]))
  pairs = {
      'policy': (lambda s: s.policy, 'mlp', model.actor),
      'target_policy': (lambda s: s.target_policy, 'mlp', model.actor_target),
      'critic q1': (lambda s: s.critic, 'q1', model.critic.q_networks[0]),
      'critic q2': (lambda s: s.critic, 'q2', model.critic.q_networks[1]),
      'target_critic q1': (lambda s: s.target_critic, 'q1',
                           model.critic_target.q_networks[0]),
      'target_critic q2': (lambda s: s.target_critic, 'q2',
                           model.critic_target.q_networks[1]),
  }
  if not args.float32:
    for module in (model.actor, model.actor_target, model.critic,
                   model.critic_target):
      module.double()
  for get, prefix, module in pairs.values():
    copy_into(haiku_linears(get(state), prefix), torch_linears(module))
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
  for _ in range(max(256 * 4, 2000)):
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
    # The standard normals our update draws for its target smoothing noise
    # (TD3's update splits its key the same way), handed to SB3 in place
    # of the draw its train() makes with ``Tensor.normal_``.
    normals = np.asarray(jax.random.normal(
        jax.random.split(state.key)[1], batch['action'].shape, dtype))
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
    torch.Tensor.normal_ = (lambda t, mean=0.0, std=1.0, _z=normals:
                            t.copy_(torch.as_tensor(_z) * std + mean))
    try:
      model.train(gradient_steps=1, batch_size=256)
    finally:
      torch.Tensor.normal_ = draw
    sb3_loss = model.logger.name_to_value['train/critic_loss']

    diffs = {name: max_rel_diff(haiku_linears(get(state), prefix),
                                torch_linears(module))
             for name, (get, prefix, module) in pairs.items()}
    loss = float(metrics['critic_loss'])
    diffs['critic loss'] = abs(loss - sb3_loss) / max(abs(sb3_loss), 1e-12)
    worst = max(worst, max(diffs.values()))
    if step < 3 or (step + 1) % max(1, args.steps // 10) == 0:
      print(f'step {step + 1:4d}: critic loss ours {loss:.6g}, SB3 '
            f'{sb3_loss:.6g}; largest relative difference ' +
            ', '.join(f'{k} {v:.1e}' for k, v in diffs.items()), flush=True)
  ok = worst <= args.tolerance
  print(f'{args.env}, {args.steps} update steps: largest relative difference '
        f'{worst:.2e} ({"within" if ok else "above"} the tolerance '
        f'{args.tolerance:g})')
  return 0 if ok else 1


if __name__ == '__main__':
  sys.exit(main())
