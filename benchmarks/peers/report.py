"""The record of ``python -m benchmarks.peers`` as Markdown: the wall
times, the ratio, the settings of each side, what still differs, the
commands. Pure functions of the record (a dict, as ``peers.json`` holds
it), so ``--report-only`` rebuilds the page from the JSON alone.
"""

from __future__ import annotations

import statistics
from typing import Optional, Sequence

# fastpbrl-one-device: fastpbrl on one host device (FASTPBRL_CPU_DEVICES=1),
# what its default of one device per core gains; fastpbrl-pbt: the same
# run under PBT, deciding every 5% of the budget, what the rule costs
# (``--sides`` to run either).
SIDES = ('fastpbrl', 'fastpbrl-one-device', 'fastpbrl-pbt', 'rejax-vmap',
         'rejax-pmap')
DEFAULT_SIDES = ('fastpbrl', 'rejax-vmap', 'rejax-pmap')
REJAX_SIDES = SIDES[3:]

# What the two sides still do differently, for the page (each also
# written where the commands are built, benchmarks/peers/rows.py).
DIFFERENCES = (
    'Evaluation and files: fastpbrl runs with its default flags, so it '
    'evaluates every member every `eval_every` env steps (5,000; 5 '
    'episodes) and at the end, checkpoints every 5,000 env steps, and '
    'writes CSV and TensorBoard logs and two plots; rejax evaluates once, '
    'at the end (128 episodes per member: `eval_freq` = '
    '`total_timesteps`, `skip_initial_evaluation`), and writes nothing.',
    'Host round trips: fastpbrl returns to the host after every learner '
    'call (one PPO iteration; 50 TD3 updates); rejax runs '
    'the whole training in one compiled call.',
    'TD3 order: fastpbrl acts 50 env steps, then takes 50 updates, in each '
    'learner call (`--interleave 1`); rejax alternates one env step and '
    'one update. Both take one update per env step after the 1,000 '
    'random-action steps, and update the policy and targets every second '
    'critic step.',
    'TD3 replay: rejax\'s buffer holds exactly the run\'s env steps '
    '(`buffer_size` = `total_timesteps`), fastpbrl\'s a million: neither '
    'drops a transition. A larger rejax buffer only costs time, in '
    'proportion to its size (seen in a smoke test: the same returns, '
    'several times the training time with a million).',
    'PPO arithmetic (same layout and matrix shapes): rejax clips the value '
    'loss with `clip_eps`, keeps one Adam per network (eps 1e-8) and '
    'clips each gradient entry at `max_grad_norm` (`optax.clip`); '
    'fastpbrl (as SB3) does not clip the value loss, keeps one Adam (eps '
    '1e-5) and clips the global gradient norm. Initialisation differs '
    '(flax\'s LeCun normal against orthogonal; flax against haiku).',
    'PureJaxRL layout: PureJaxRL anneals the learning rate linearly; '
    'neither side does here.',
    'Devices: fastpbrl chooses its own (`--devices auto`); rejax is '
    'measured both on one device and with `pmap` over one host device '
    'per core, and the ratio takes its faster variant.',
)


def summary(seconds: Sequence[float]) -> dict:
  """Min and median of a side's repeats."""
  return {'min_s': min(seconds), 'median_s': statistics.median(seconds)}


def ratios(row: dict) -> dict:
  """fastpbrl's time over the faster rejax variant's, by min and by
  median (each variant's own best); empty where a side has no time."""
  sides = row['sides']
  fast = sides.get('fastpbrl', {})
  rejax = {s: sides[s] for s in REJAX_SIDES if 'min_s' in sides.get(s, {})}
  if 'min_s' not in fast or not rejax:
    return {}
  best = min(rejax, key=lambda s: rejax[s]['min_s'])
  return {'best_rejax': best,
          'ratio_min': fast['min_s'] / rejax[best]['min_s'],
          'ratio_median': fast['median_s'] / min(
              r['median_s'] for r in rejax.values())}


def over_default(row: dict, side: str) -> Optional[float]:
  """``side``'s time over fastpbrl's default (``seeds``, every core), min
  over repeats: one device's slow-down, or PBT's cost; None where either
  has no time."""
  other = row['sides'].get(side, {})
  default = row['sides'].get('fastpbrl', {})
  if 'min_s' not in other or 'min_s' not in default:
    return None
  return other['min_s'] / default['min_s']


def _ratio(x: Optional[float]) -> str:
  return '' if x is None else f'{x:.2f}'


def _seconds(side: Optional[dict], repeats: int) -> str:
  if not side:
    return 'not run'
  if 'min_s' not in side:
    return side.get('error', 'failed')[:120].replace('|', '/')
  if repeats > 1:
    return f'{side["min_s"]:,.1f} ({side["median_s"]:,.1f})'
  return f'{side["min_s"]:,.1f}'


def table(record: dict) -> str:
  """The wall-time table: one line per row."""
  repeats = record['settings']['repeats']
  cores = record['settings']['cores']
  lines = ['| row | task | members x env steps | fastpbrl (s) '
           '| fastpbrl, 1 device (s) | fastpbrl pbt (s) '
           f'| rejax, 1 device (s) | rejax, pmap over {cores} devices (s) '
           '| fastpbrl / best rejax | fastpbrl: 1 device / default '
           '| fastpbrl: pbt / seeds |',
           '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|']
  for row in record['rows']:
    r = ratios(row)
    ratio = '' if not r else (
        f'{r["ratio_min"]:.2f}' + (f' ({r["ratio_median"]:.2f})'
                                   if repeats > 1 else ''))
    s = row['settings']
    cells = [row['row'], f'{s["agent"].upper()} {s["env"]}',
             f'{s["members"]} x {s["env_steps"]:,}',
             *(_seconds(row['sides'].get(side), repeats) for side in SIDES),
             ratio, _ratio(over_default(row, 'fastpbrl-one-device')),
             _ratio(over_default(row, 'fastpbrl-pbt'))]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def _hparams(hparams: dict) -> str:
  return ', '.join(f'{k} {v:g}' for k, v in hparams.items())


def settings_table(record: dict) -> str:
  """Each row's shared settings: layout, network, hyperparameters."""
  lines = ['| row | layout | network | hyperparameters (fastpbrl\'s names; '
           'rejax\'s equal) |', '|---|---|---|---|']
  for row in record['rows']:
    s = row['settings']
    net = f'{"x".join(map(str, s["hidden"]))} {s["activation"]}'
    if s['agent'] == 'ppo':
      layout = (f'{s["layout"]}: {s["num_envs"]} env(s) x '
                f'{s["rollout_length"]} steps, {s["epochs"]} epochs of '
                f'minibatches of {s["minibatch_size"]}')
    else:
      layout = (f'batch {s["batch_size"]}, 1 update per env step after '
                f'{s["warmup_steps"]:,} random steps, noises x '
                f'{s["action_scale"]:g} in rejax (env units)')
    lines.append(f'| {row["row"]} | {layout} | {net} | '
                 f'{_hparams(s["hparams"])} |')
  return '\n'.join(lines)


def _versions(record: dict) -> str:
  v = record['versions']
  fast = v.get('fastpbrl', {})
  rejax = v.get('rejax') or {}
  text = f'fastpbrl side: jax {fast.get("jax")}, jaxlib {fast.get("jaxlib")}'
  if rejax:
    text += (f'; rejax side: rejax {rejax.get("rejax")}, jax '
             f'{rejax.get("jax")}, jaxlib {rejax.get("jaxlib")}, gymnax '
             f'{rejax.get("gymnax")}')
  return text


def markdown(record: dict) -> str:
  """The page of a run's ``record``."""
  m = record['machine']
  settings = record['settings']
  commands = []
  for row in record['rows']:
    commands.append(f'- {row["row"]}:')
    for side in SIDES:
      if side in row['commands']:
        commands.append(f'  - {side}: `{row["commands"][side]}`')
  return '\n'.join([
      '# fastpbrl against rejax: the same work, whole processes',
      '',
      'Each row trains one task with one layout and the same widths on '
      'both sides, each side in its own process, one after the other. '
      'Seconds are whole processes: start-up, imports, compilation and '
      'training (fastpbrl: its default evaluations, checkpoints and logs '
      f'too); the min of {settings["repeats"]} repeat(s)'
      + (', the median in brackets' if settings['repeats'] > 1 else '')
      + '. The ratio is fastpbrl\'s time over the faster rejax variant\'s '
      '(below 1: fastpbrl takes less time).',
      '',
      f'Machine: {m["cpu_model"]}, {m["cpus"]} cores '
      f'({m["cores_available"]} available), {m["platform"]}; '
      f'{_versions(record)}. Date {record["date"]}, commit '
      f'{record["commit"]} (code {record["code"]}).',
      f'Command: `{record["command"]}`',
      '',
      table(record),
      '',
      '## Settings',
      '',
      'Members differ by seed only on both sides (`fastpbrl seeds`; '
      'rejax: one config, `--members` keys).',
      '',
      settings_table(record),
      '',
      '## What still differs',
      '',
      *(f'- {d}' for d in record.get('differences', DIFFERENCES)),
      '',
      '## Commands',
      '',
      *commands,
      '',
  ])
