"""The check's command line: its flags, their ranges, and the comparison
of the agent asked for (``off_policy`` for TD3 and SAC, ``on_policy`` for
PPO)."""

from __future__ import annotations

import argparse
import importlib

import jax

# The .[torch] extra's packages.
EXTRA = ('stable_baselines3', 'torch')
PPO_COUNTS = ('iterations', 'rollout_length', 'num_envs', 'batch_size',
              'epochs')


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.sb3_equivalence',
      description="Our TD3, SAC and PPO updates against Stable-Baselines3's, "
      'step by step, from the same weights on the same batches and noise.')
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
  return parser


def parse_args(argv=None) -> argparse.Namespace:
  """The flags, each checked against its range (one line naming it)."""
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.agent == 'ppo':
    for flag in PPO_COUNTS:
      if getattr(args, flag) < 1:
        parser.error(f'--{flag.replace("_", "-")} must be at least 1, got '
                     f'{getattr(args, flag)}')
    if args.ent_coef < 0:
      parser.error(f'--ent-coef must be at least 0, got {args.ent_coef}')
    return args
  if args.perturb < 0:
    parser.error(f'--perturb must be at least 0, got {args.perturb}')
  if args.sb3_epsilon < 0:
    parser.error(f'--sb3-epsilon must be at least 0, got {args.sb3_epsilon}')
  if args.steps < 1:
    parser.error(f'--steps must be at least 1, got {args.steps}')
  return args


def main(argv=None) -> int:
  """Runs the comparison ``argv`` asks for; returns the exit status."""
  args = parse_args(argv)
  if not args.float32:
    jax.config.update('jax_enable_x64', True)
  # Imported here, not at the top: they import Stable-Baselines3 and
  # PyTorch (the .[torch] extra, which a checkout may lack), and our agents,
  # which must come after float64 is switched on above.
  name = 'on_policy' if args.agent == 'ppo' else 'off_policy'
  try:
    module = importlib.import_module(f'benchmarks.sb3_equivalence.{name}')
  except ImportError as e:
    if e.name not in EXTRA:
      raise
    raise SystemExit(f'needs Stable-Baselines3 ({e}); '
                     "pip install -e '.[torch]'") from None
  return module.compare(args)
