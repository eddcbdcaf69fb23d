"""``fastpbrl evaluate``: play a trained member's evaluation policy.

    fastpbrl evaluate runs/pbt-td3-Pendulum-v1-20260101-120000
    fastpbrl evaluate RUN_DIR --member 3 --episodes 20 --video-dir videos

Rebuilds the agent from RUN_DIR/config.json, restores the latest checkpoint,
plays ``--episodes`` noise-free episodes (DQN: epsilon 0.05) of the member
and prints the mean and standard deviation of their returns. ``best`` is the
member with the highest final evaluation of the run (final_returns.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional, Sequence


class _Parser(argparse.ArgumentParser):
  """Refuses bad input with one line, ``error: ...`` (no usage block)."""

  def error(self, message):
    raise SystemExit(f'error: {message}')


def parser() -> argparse.ArgumentParser:
  p = _Parser(prog='fastpbrl evaluate',
              description=__doc__.replace('``', ''),  # no RST in --help
              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument('run_dir', metavar='RUN_DIR',
                 help='a run folder (holds config.json and checkpoints/)')
  p.add_argument('--member', default='best',
                 help='best (highest final evaluation) or a member index '
                      '(default: best)')
  p.add_argument('--episodes', default='10',
                 help='episodes to play (default: 10)')
  p.add_argument('--video-dir', default=None,
                 help="record every episode as an MP4 in this folder (pip "
                      "install 'fastpbrl[video]')")
  p.add_argument('--seed', default='0',
                 help='seeds the episodes\' resets (default: 0; the run\'s '
                      '--seed with --episodes equal to its --eval-episodes '
                      'replays its final evaluation)')
  p.add_argument('--json', action='store_true',
                 help='print the result as one JSON object')
  return p


def _int(flag: str, text: str, minimum: int) -> int:
  try:
    value = int(text)
  except ValueError:
    raise SystemExit(f'error: {flag} must be an integer, got {text!r}') from None
  if value < minimum:
    raise SystemExit(f'error: {flag} must be >= {minimum}, got {value}')
  return value


def main(argv: Optional[Sequence[str]] = None):
  args = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
  episodes = _int('--episodes', args.episodes, 1)
  seed = _int('--seed', args.seed, 0)
  if not os.path.isfile(os.path.join(args.run_dir, 'config.json')):
    raise SystemExit(f'error: RUN_DIR {args.run_dir!r} has no config.json '
                     '(is it a fastpbrl run folder?)')
  if args.video_dir is not None and os.path.isfile(args.video_dir):
    raise SystemExit(f'error: --video-dir {args.video_dir!r} is a file')
  from fastpbrl.api import evaluate  # noqa: PLC0415 (imports jax)
  from fastpbrl.config.errors import ConfigError  # noqa: PLC0415 (imports jax)

  try:
    result = evaluate(args.run_dir, args.member, episodes, args.video_dir, seed)
  except ConfigError as e:
    raise SystemExit(f'error: {e}') from None
  except FileNotFoundError as e:  # no complete checkpoint
    raise SystemExit(f'error: {str(e).splitlines()[0]}') from None
  if args.json:
    print(json.dumps({'member': result.member, 'mean': result.mean,
                      'std': result.std, 'returns': result.returns,
                      'videos': result.videos}))
  else:
    print(f'member {result.member}: return {result.mean:.2f} +- '
          f'{result.std:.2f} over {episodes} episodes')
    for path in result.videos:
      print(f'video: {path}')
  return result
