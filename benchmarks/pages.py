"""The figures of the benchmark pages, generated from the result files.

    python -m benchmarks.pages           # rewrites the generated blocks
    python -m benchmarks.pages --check   # exits 1, one line per stale page

A page marks each generated block with ``<!-- generated: NAME -->`` and
``<!-- end generated -->``; this module replaces what lies between them
with the block ``NAME`` of ``BLOCKS``, built from the files under
``benchmarks/results/`` that the benchmarks wrote, and followed by the
source file with the machine, date, command (and commit) that the file
records. Everything outside the markers is hand-written and left as it is.
Where a file does not record its machine, date or command, the block says
so rather than guessing.

Host-side only: it reads JSON, CSV and text, and imports nothing of
fastpbrl or JAX, so it runs in a second.
"""

import argparse
import glob
import json
import os
import re
import sys
from typing import Callable, Optional

from benchmarks.peers import report as peers_report

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join('benchmarks', 'results')
# The pages with generated blocks, relative to the repository root.
PAGES = (os.path.join('docs', 'benchmarks', 'speed.md'),
         os.path.join('docs', 'benchmarks', 'learning.md'))
# Where a page's links start from: the page's own folder.
PAGE_DIR = os.path.join('docs', 'benchmarks')

BLOCK = re.compile(r'(?P<open><!-- generated: (?P<name>[^>]*?) -->)'
                   r'(?P<body>.*?)(?P<close><!-- end generated -->)',
                   re.DOTALL)
OPEN = re.compile(r'<!-- generated: ')
CLOSE = re.compile(r'<!-- end generated -->')


class PageError(ValueError):
  """A page whose markers cannot be regenerated (one line, naming it)."""


# --------------------------------------------------------------------------
# Reading and formatting
# --------------------------------------------------------------------------


def _path(*parts: str) -> str:
  return os.path.join(ROOT, RESULTS, *parts)


def _json(*parts: str):
  with open(_path(*parts)) as f:
    return json.load(f)


def _link(*parts: str) -> str:
  """A Markdown link from a benchmark page to a result file."""
  rel = os.path.join(RESULTS, *parts)
  target = os.path.relpath(os.path.join(ROOT, rel),
                           os.path.join(ROOT, PAGE_DIR))
  return f'[`{rel}`]({target.replace(os.sep, "/")})'


def _table(header: list[str], align: str, rows: list[list[str]]) -> str:
  """A Markdown table; ``align`` has one letter per column (``l`` or
  ``r``)."""
  rule = ['---' if a == 'l' else '---:' for a in align]
  return '\n'.join('| ' + ' | '.join(cells) + ' |'
                   for cells in [header, rule, *rows])


def _g3(value: Optional[float]) -> str:
  """Three significant digits, trailing zeros kept (1.61, 2.00, 0.0113,
  150); blank where missing."""
  return '' if value is None else f'{value:#.3g}'.rstrip('.')


def _times(ratio: float) -> str:
  return f'{ratio:.1f}x' if ratio >= 1 else f'{ratio:.2f}x'


def _source(links: list[str], *facts: str) -> str:
  """The line under a generated table: its files, then what they record."""
  return ('Source: ' + ', '.join(links) + '; ' + '; '.join(
      f for f in facts if f) + '.')


def _command(command: Optional[str]) -> str:
  return f'command `{command}`' if command else 'no command recorded'


def _prefix(name: str, names: tuple) -> str:
  """Names the file a fact is about where a table has several."""
  return f'`{name}`: ' if len(names) > 1 else ''


def _commit(record: dict) -> str:
  return f'commit {record["commit"]}' if record.get('commit') else ''


# --------------------------------------------------------------------------
# Update speed (benchmarks/update_speed)
# --------------------------------------------------------------------------

IMPLEMENTATIONS = {
    'jax-vectorized': 'JAX vectorized (this project)',
    'jax-sequential': 'JAX sequential (loop of jitted single-member calls)',
    'torch-sequential': 'PyTorch sequential',
}


def _update_speed_machine(meta: dict) -> str:
  machine = meta['machine']
  text = machine['device']
  if machine.get('jax_backend') != 'cpu':
    text += (f' with {machine["available_cores"]} cores of '
             f'{machine["cpu_model"]}')
  versions = machine.get('versions', {})
  text += f', Python {machine["python"]}, jax {versions.get("jax")}'
  if versions.get('torch'):
    text += f', torch {versions["torch"]}'
  return (f'machine {text}; matmul peak '
          f'{meta["matmul_run_peak_flop_per_s"] / 1e9:,.0f} GFLOP/s')


def update_speed(folder: str, agent: str,
                 steps_per_call: Optional[int] = None) -> str:
  """ms per member-update-step of JAX vectorized, JAX sequential and
  PyTorch sequential by population size, then the speed-up of the
  vectorized update over the slowest sequential one and its fraction of
  the run's matmul peak (``steps_per_call``: the agent's default, the
  largest measured, unless given)."""
  data = _json(folder, 'update_speed.json')
  meta = data['meta']
  rows = [r for r in data['rows']
          if r['mode'] == 'independent' and r['agent'] == agent]
  steps = steps_per_call or max(r['steps_per_call'] for r in rows)
  rows = [r for r in rows if r['steps_per_call'] == steps]
  sizes = sorted({r['population_size'] for r in rows})
  ok = {(r['implementation'], r['population_size']): r for r in rows
        if r['status'] == 'ok'}
  shown = [i for i in IMPLEMENTATIONS if any(k[0] == i for k in ok)]

  def time(impl: str, n: int) -> Optional[float]:
    row = ok.get((impl, n))
    return row['time_per_member_step_ms'] if row else None

  body = [[IMPLEMENTATIONS[i], *(_g3(time(i, n)) for n in sizes)]
          for i in shown]
  base = 'torch-sequential' if 'torch-sequential' in shown else (
      'jax-sequential')
  peak = meta['matmul_run_peak_flop_per_s']
  speedup, xla, work = [], [], []
  for n in sizes:
    vec, slow = time('jax-vectorized', n), time(base, n)
    speedup.append(_times(slow / vec) if vec and slow else '')
    row = ok.get(('jax-vectorized', n))
    xla.append(f'{100 * row["fraction_of_matmul_peak"]:.0f}%'
               if row and row.get('fraction_of_matmul_peak') else '')
    torch = ok.get(('torch-sequential', n))
    if row and torch and torch.get('flops_per_call'):
      # The work one member-step does, as PyTorch counts it (matmuls and
      # convolutions that ran), over the vectorized update's time.
      flops = torch['flops_per_call'] / (steps * n)
      work.append(f'{100 * flops / (vec / 1e3) / peak:.0f}%')
    else:
      work.append('')
  def short(impl: str) -> str:
    return IMPLEMENTATIONS[impl].split(' (')[0]

  label = short(base)
  body.append([f'speed-up: {label} time ÷ JAX vectorized time', *speedup])
  body.append(['JAX vectorized, % of the matmul peak (XLA\'s FLOP count)',
               *xla])
  if any(work):
    body.append([('JAX vectorized, % of the matmul peak (PyTorch\'s FLOP '
                  'count: the work done)'), *work])
  header = [(f'{agent.upper()}, ms per member-step, {steps} '
             f'{"step" if steps == 1 else "steps"} per call'),
            *(f'N={n}' for n in sizes)]
  missing = [f'{short(r["implementation"])} N={r["population_size"]}'
             for r in rows if r['status'] != 'ok'
             and r['implementation'] in shown]
  notes = []
  if missing:
    notes.append('not measured: ' + ', '.join(missing))
  if not meta.get('finished', True):
    notes.append('the sweep did not finish (`finished: false`): it was '
                 'cut after the rows it has')
  return '\n\n'.join([
      _table(header, 'l' + 'r' * len(sizes), body),
      _source([_link(folder, 'update_speed.json')],
              _update_speed_machine(meta), f'date {meta["date"][:10]}',
              f'{meta["wall_s"] / 60:.0f} min for the whole sweep'
              if meta.get('wall_s') else '', _commit(meta),
              _command(meta.get('command')), *notes)])


# --------------------------------------------------------------------------
# The data path (benchmarks/sampling_inside, learner_wait, end_to_end)
# --------------------------------------------------------------------------


def sampling_inside(folder: str) -> str:
  """Host sampling + ``device_put`` against sampling inside the compiled
  call, from the table ``benchmarks/sampling_inside.py`` printed (it
  writes no JSON)."""
  with open(_path(folder, 'sampling_inside.txt')) as f:
    lines = f.read().splitlines()
  rows = []
  for line in lines:
    cells = [c.strip() for c in line.split('|')]
    if len(cells) == 6 and cells[0].isdigit():
      rows.append(cells)  # as the script formatted them
  header = ['N', 'host sample + put, ms', 'host sample + put + update, ms',
            'sampling inside the call, ms', 'host, µs per member-step',
            'inside, µs per member-step']
  return '\n\n'.join([
      _table(header, 'rrrrrr', rows),
      _source([_link(folder, 'sampling_inside.txt')],
              f'as the script printed it: {lines[0]}',
              'the file records no machine model, date, command or commit')])


def _learner_wait_machine(record: dict) -> str:
  machine = record['machine']
  return (f'machine {machine["device"]}, {machine["cpus"]} CPUs, '
          f'jax {machine["jax"]} ({machine["platform"]})')


def _ratio_asked(command: str) -> str:
  """The update-to-data ratio a run asked for: its ``--ratio`` flag, or
  the script's default of 1."""
  match = re.search(r'--ratio (\S+)', command)
  return f'{float(match.group(1)):g}' if match else '1'


def learner_wait(folder: str, *names: str) -> str:
  """The learner's wait for data through the whole pipeline, per data
  path, from one or more runs of ``benchmarks/learner_wait.py``; a column
  gives the ratio asked where the runs asked for different ones."""
  records = [_json(folder, name) for name in names]
  ratios = {_ratio_asked(r['command']) for r in records}
  header = ['N', 'path', 'learner wait', 'ms per call',
            'µs per member-step', 'achieved update-to-data ratio',
            'env steps/s']
  if len(ratios) > 1:
    header.insert(2, 'update-to-data ratio asked')
  rows = []
  for record in records:
    for row in record['rows']:
      us = row['us_per_member_step']
      cells = [str(row['members']), row['mode'],
               f'{100 * row["wait_fraction"]:.1f}%',
               f'{row["ms_per_call"]:.1f}',
               f'{us:.1f}' if us < 100 else f'{us:.0f}',
               f'{row["achieved_ratio"]:.2f}',
               f'{row["env_steps_per_s"]:,.0f}']
      if len(ratios) > 1:
        cells.insert(2, _ratio_asked(record['command']))
      rows.append(cells)
  facts = [_prefix(name, names) + f'{_learner_wait_machine(record)}, date '
           f'{record["date"]}, {_command(record["command"])}'
           + (f', {_commit(record)}' if _commit(record) else '')
           for name, record in zip(names, records, strict=True)]
  return '\n\n'.join([
      _table(header, 'rl' + 'r' * (len(header) - 2), rows),
      _source([_link(folder, name) for name in names], *facts)])


def end_to_end(folder: str, *names: str) -> str:
  """Whole PBT runs' training env steps per second, from one or more runs
  of ``benchmarks/end_to_end.py``."""
  records = [_json(folder, name) for name in names]
  rows = [[row['tree'], str(row['members']),
           f'{row["env_steps_per_s_member"]:.1f}',
           f'{row["population_env_steps_per_s"]:,.0f}',
           f'{row["wall_s"]:.0f}']
          for record in records for row in record['rows']]
  header = ['tree', 'N', 'env steps/s per member', 'env steps/s, population',
            'wall time, s']
  facts = [_prefix(name, names) + f'machine {record["machine"]}, '
           f'{record["cpus"]} CPUs, '
           f'date {record["date"]}, {_command(record["command"])}'
           + (f', {_commit(record)}' if _commit(record) else '')
           for name, record in zip(names, records, strict=True)]
  return '\n\n'.join([_table(header, 'lrrrr', rows),
                      _source([_link(folder, n) for n in names], *facts)])


def data_paths(folder: str) -> str:
  """The actor path against the on-device path, from
  ``benchmarks/data_paths.py``."""
  record = _json(folder, 'data_paths.json')
  rows = []
  for row in record['rows']:
    if 'error' in row:
      rows.append([str(row['members']), row['mode'], row.get('env', ''),
                   '', row['error'], '', '', ''])
      continue
    rows.append([str(row['members']), row['mode'], row['env'],
                 str(row.get('devices', 1)),
                 f'{row["env_steps_per_s"]:,.0f}',
                 f'{row["update_steps_per_s"]:,.0f}',
                 f'{100 * row["wait_fraction"]:.1f}%',
                 f'{row["peak_rss_bytes"] / 2**30:.2f} GiB'])
  header = ['N', 'path', 'env', 'devices', 'env steps/s', 'update steps/s',
            'learner wait', 'peak memory']
  settings = record['settings']
  machine = record['machine']
  facts = [f'TD3 {tuple(settings["hidden"])}, batch '
           f'{settings["batch_size"]}, {settings["steps_per_call"]} update '
           f'steps per call, ratio 1, {settings["seconds"]:g} s per row once '
           f'warm', f'machine {machine["device"]}, {machine["cpus"]} CPUs, '
           f'jax {machine["jax"]}', f'date {record["date"]}',
           _command(record['command'])]
  if _commit(record):
    facts.append(_commit(record))
  return '\n\n'.join([_table(header, 'rllrrrrr', rows),
                       _source([_link(folder, 'data_paths.json')], *facts)])


def actor_throughput(folder: str, name: str = 'actor_throughput.json') -> str:
  """Env steps per second of one actor process, serial beside vectorized,
  from ``benchmarks/actor_throughput.py``."""
  record = _json(folder, name)
  rows = [[row['env'], str(row['members']), row['batch'],
           f'{row["serial_per_cpu_s"]:,.0f}',
           f'{row["vectorized_per_cpu_s"]:,.0f}',
           f'{row["vectorized_per_cpu_s"] / row["serial_per_cpu_s"]:.2f}x',
           f'{row["serial"]:,.0f}', f'{row["vectorized"]:,.0f}',
           f'{row["vectorized"] / row["serial"]:.2f}x']
          for row in record['rows']]
  header = ['env', 'members per actor', 'batch', 'per CPU-second: serial',
            'vectorized', 'ratio', 'per wall second: serial', 'vectorized',
            'ratio']
  settings, machine = record['settings'], record['machine']
  plain = ', '.join(f'{env} {rate:,.0f}'
                    for env, rate in record['plain'].items())
  every = settings.get('eval_every', 0)
  played = (f'evaluations of {settings["eval_episodes"]} episodes every '
            f'{every:,} training env steps played beside training (the rates '
            f'count training steps)' if every else 'no evaluations')
  facts = [f'TD3 {tuple(settings["hidden"])} policy with exploration noise, '
           f'{played}, '
           f'one actor process, the mean of {settings["repeats"]} runs of '
           f'{settings["seconds"]:g} s per mode once warm, the modes '
           f'alternating', f'a plain gymnasium loop (one env, random '
           f'actions) did {plain} env steps/s',
           f'machine {machine.get("cpu_model", machine["platform"])}, '
           f'{machine["cores_available"]} cores, jax {machine["jax"]}', f'date {record["date"]}',
           _command(record['command'])]
  if _commit(record):
    facts.append(_commit(record))
  blocks = [_table(header, 'lrlrrrrrr', rows),
            _source([_link(folder, name)], *facts)]
  split = step_split_table(record)
  if split:
    blocks.append(split)
  return '\n\n'.join(blocks)


def step_split_table(record: dict) -> str:
  """Where an actor's step goes, for the rows that timed its shared parts
  (``actor_throughput.step_split``); empty for a record without them.
  Two more columns where the rows also timed the vectorized actor's own
  work alone."""
  timed = [r for r in record['rows'] if 'bound' in r]
  own = bool(timed) and all('extra_in_turn_us' in r for r in timed)
  rows = []
  for r in timed:
    physics = ('-' if r['physics_us'] is None else
               f'{r["physics_us"]:,.0f} ({r["physics_us"] / r["serial_us"]:.0%})')
    cells = [r['env'], str(r['members']), f'{r["serial_us"]:,.0f}',
             f'{r["vectorized_us"]:,.0f}', physics,
             f'{r["policy_us"]:,.0f} ({r["policy_us"] / r["serial_us"]:.0%})',
             f'{r["rest_serial_us"]:,.0f}', f'{r["rest_vectorized_us"]:,.0f}']
    if own:
      cells += [f'{r["bookkeeping_us"]:,.0f}', f'{r["extra_in_turn_us"]:,.0f}']
    rows.append(cells + [f'{r["bound"]:.2f}x'])
  if not rows:
    return ''
  header = ['env', 'members per actor', 'CPU µs per step: serial',
            'vectorized', 'physics alone', 'policy alone', 'rest: serial',
            'rest: vectorized']
  if own:
    header += ['vectorized own work alone', 'shared parts\' extra in turn']
  header.append('bound on the ratio')
  text = ('Where a step of all of a row\'s members goes, in CPU µs: each '
          'mode\'s from its rate above, and the two parts both modes share, '
          'timed alone in a process set up as an actor (MuJoCo\'s `mj_step` '
          'on each env; the jitted TD3 call with its noise), with their '
          'share of a serial step. Only the rest differs between the modes; '
          'if vectorizing removed all of it, the ratio per CPU-second would '
          'be serial / (physics + policy), the last column.')
  if own:
    text += (' The vectorized actor\'s own work alone is its real loop with '
             '`mj_step` doing nothing and constant actions in place of the '
             'policy call; the rest beyond it is what the physics and the '
             'policy cost more in turn with everything else than alone.')
  return text + '\n\n' + _table(header, 'l' + 'r' * (len(header) - 1), rows)


def actor_baseline_table(record: dict) -> str:
  """Each row's mean rates (env steps per wall second of one actor
  process): the earlier commit's actor, this tree's serial and vectorized
  actor, and the ratios to the earlier one."""
  rows = [[r['env'], str(r['members']), f'{r["baseline"]:,.0f}',
           f'{r["serial"]:,.0f}', f'{r["vectorized"]:,.0f}',
           f'{r["serial"] / r["baseline"]:.2f}x',
           f'{r["vectorized"] / r["baseline"]:.2f}x',
           f'{r["vectorized"] / r["serial"]:.2f}x']
          for r in record['rows']]
  header = ['env', 'members per actor', 'earlier actor', 'serial',
            'vectorized', 'serial / earlier', 'vectorized / earlier',
            'vectorized / serial']
  return _table(header, 'lrrrrrrr', rows)


def actor_baseline(folder: str) -> str:
  """Today's actor beside an earlier commit's, from
  ``benchmarks/actor_baseline.py``."""
  record = _json(folder, 'actor_baseline.json')
  settings, machine = record['settings'], record['machine']
  facts = [f'earlier actor: commit {record["baseline_commit"]}, measured by '
           f'its own benchmark in the same run', f'TD3 '
           f'{tuple(settings["hidden"])} policy with exploration noise, one '
           f'actor process, env steps per wall second, the mean of '
           f'{settings["repeats"]} runs of {settings["seconds"]:g} s per actor '
           f'once warm, the three alternating',
           f'machine {machine.get("cpu_model", machine["platform"])}, '
           f'{machine["cores_available"]} cores, jax {machine["jax"]}',
           f'date {record["date"]}', _command(record['command'])]
  if _commit(record):
    facts.append(_commit(record))
  return '\n\n'.join([actor_baseline_table(record),
                       _source([_link(folder, 'actor_baseline.json')],
                               *facts)])


def main_command(folder: str) -> str:
  """The README's main command, timed by ``benchmarks/main_command.py``."""
  record = _json(folder, 'main_command.json')
  rows = [[str(i + 1), f'{row["wall_s"] / 60:.1f} min',
           ', '.join(f'{r:.0f}' for r in row['final_returns']),
           str(row['replacements'])]
          for i, row in enumerate(record['rows'])]
  header = ['run', 'wall time', 'final returns of the 4 members',
            'PBT replacements']
  facts = [f'`{record["timed"]}`, the install not included; machine '
           f'{record["machine"]}, date {record["date"]}, '
           f'{_command(record["command"])}, {_commit(record)}']
  return '\n\n'.join([_table(header, 'lrlr', rows),
                       _source([_link(folder, 'main_command.json')], *facts)])


# --------------------------------------------------------------------------
# PPO populations (benchmarks/ppo_speed)
# --------------------------------------------------------------------------


def _machine_words(machine: dict) -> str:
  return f'{machine["cpu_model"]} ({machine["cpus"]} CPUs, {machine["device"]})'


def ppo_speed(folder: str, *names: str) -> str:
  """The tables ``benchmarks/ppo_speed.py`` wrote (``NAME.md`` beside
  each ``NAME.json``), one after the other, with what each file records."""
  parts, links, facts = [], [], []
  for name in names:
    record = _json(folder, f'{name}.json')
    with open(_path(folder, f'{name}.md')) as f:
      text = f.read()
    parts.append(text[text.index('\n|') + 1:].rstrip('\n'))
    links += [_link(folder, f'{name}.json'), _link(folder, f'{name}.md')]
    facts.append(f'{_prefix(name, names)}{_command(record["command"])}, '
                 f'machine {_machine_words(record["machine"])}, date '
                 f'{record["date"]}, {_commit(record)}')
    for added in record.get('additions', []):  # ppo_speed --merge
      rows = ', '.join(f'N={n} ({mode})' for n, mode in added['rows'])
      facts.append(f'rows {rows}: {_command(added["command"])}, date '
                   f'{added["date"]}, {_commit(added)}')
  return '\n\n'.join(parts + [_source(links, *facts)])


def _actor_processes(record: dict) -> str:
  """The actor processes of an actor-speed record; a record written before
  they were recorded ran the default of its time, the cores minus one."""
  recorded = record['fastpbrl'].get('actor_processes')
  if recorded is not None:
    return str(recorded)
  cores = int(record['machine'].get('cores_available') or
              record['machine']['cpus'])
  return f'{max(1, min(record["population_size"], cores - 1))} (cores - 1)'


def ppo_actor_speed(folder: str, *names: str) -> str:
  """``benchmarks/ppo_actor_speed.py``'s wall times, one row a file."""
  rows, links, facts = [], [], []
  for name in names:
    record = _json(folder, f'{name}.json')
    ours, sb3 = record['fastpbrl'], record['sb3']
    rows.append([f'`{name}`', record['env'],
                 f'{record["population_size"]} x '
                 f'{ours["env_steps_per_member"]:,}',
                 _actor_processes(record),
                 f'{ours["wall_s"]:.1f}', f'1 x {sb3["env_steps"]:,}',
                 f'{sb3["wall_s"]:.1f}', f'{record["wall_time_ratio"]:.2f}'])
    links.append(_link(folder, f'{name}.json'))
    facts.append(f'{_prefix(name, names)}{_command(record["command"])}, '
                 f'machine {record["machine"]["cpu_model"]} '
                 f'({record["machine"]["cpus"]} CPUs), date '
                 f'{record["date"][:10]}, {_commit(record)}')
  header = ['record', 'env', 'fastpbrl PPO members x env steps',
            'actor processes', 'seconds', 'SB3 PPO x env steps', 'seconds',
            'wall-time ratio']
  return '\n\n'.join([_table(header, 'llrrrrrr', rows),
                       _source(links, *facts)])


def peers(folder: str, name: str) -> str:
  """``benchmarks/peers``' wall times: fastpbrl against rejax, a row a
  task (the page of the record's own table)."""
  record = _json(folder, f'{name}.json')
  return '\n\n'.join([
      peers_report.table(record),
      _source([_link(folder, f'{name}.json')],
              f'{_command(record["command"])}, machine '
              f'{record["machine"]["cpu_model"]} '
              f'({record["machine"]["cpus"]} CPUs), date '
              f'{record["date"][:10]}, {_commit(record)}')])


def policy_call(folder: str, name: str = 'policy_call.json') -> str:
  """``benchmarks/policy_call.py``'s rows: the actors' policy call under
  XLA:CPU's two schedulers."""
  record = _json(folder, name)
  rows = [[r['agent'], f'`{r["call"]}`', str(r['members']),
           f'{r["us_in_order"]:.1f}', f'{r["us_concurrent"]:.1f}',
           f'{r["us_concurrent"] / r["us_in_order"]:.2f}x']
          for r in record['rows']]
  header = ['agent', 'call', 'members', 'in order, µs', 'concurrent, µs',
            'ratio']
  fact = (f'the median of {record["repeats"]} processes per scheduler, '
          f'{record["seconds"]:g} s of calls each; '
          f'{_command(record["command"])}, machine '
          f'{record["machine"]["cpu_model"]} ({record["machine"]["cpus"]} '
          f'CPUs), date {record["date"][:10]}, {_commit(record)}')
  return '\n\n'.join([_table(header, 'llrrrr', rows),
                       _source([_link(folder, name)], fact)])


# --------------------------------------------------------------------------
# Resume (benchmarks/resume_curve)
# --------------------------------------------------------------------------


def resume_curve() -> str:
  """Final returns and update steps of a run straight through and of the
  same run killed with ``kill -9`` and resumed: with the replay in its
  checkpoints, and refilled by the restored policies (fastpbrl's
  default)."""
  rows, sources, facts = [], [], []
  for name, how in (('resume_curve', 'replay checkpointed'),
                    ('resume_curve_refill', 'replay refilled')):
    r = _json('resume', f'{name}.json')
    resumed = (f'{how}: killed at {r["killed_at_env_steps"]:,} env steps '
               f'per member, resumed at learner call {r["resumed_at_call"]} '
               f'({r["learner_calls_lost"]} calls redone)')
    for label, key in ((f'{how}: uninterrupted', 'uninterrupted'),
                       (resumed, 'resumed')):
      rows.append([label, ', '.join(f'{v:.1f}'
                                    for v in r[f'{key}_final_returns']),
                   f'{r[f"{key}_mean"]:.1f}', f'{r[f"{key}_std"]:.1f}',
                   f'{r[f"{key}_update_steps"]:,}'])
    sources += [_link('resume', f'{name}.json'), _link('resume', f'{name}.png')]
    machine = r['machine']
    facts.append(f'{how}: {_command(r["command"])}, machine '
                 f'{machine["cpu_model"]} ({machine["cpus"]} CPUs), date '
                 f'{r["date"]}, commit {r["commit"][:7]}; the uninterrupted '
                 f'run took {r["uninterrupted_seconds"]:.0f} s')
  header = [(f'{r["env"]}, {r["population_size"]} members, '
             f'seed {r["seed"]}, {r["env_steps"]:,} env steps each'),
            'final returns (5 episodes each)', 'mean', 'std',
            'update steps per member']
  return '\n\n'.join([_table(header, 'llrrr', rows),
                      _source(sources, *facts)])


# --------------------------------------------------------------------------
# Learning (benchmarks/learning)
# --------------------------------------------------------------------------


def _runs(folder: str) -> list[dict]:
  runs = []
  for path in sorted(glob.glob(_path(folder, 'runs', '**', '*.json'),
                               recursive=True)):
    with open(path) as f:
      runs.append(json.load(f))
  return runs


def _markdown_table(folder: str) -> str:
  """The tables of the ``results.md`` that ``benchmarks/learning/report.py``
  rebuilt from the run JSONs (``--report-only``)."""
  with open(_path(folder, 'results.md')) as f:
    text = f.read()
  # From the first table on: the table of means, then the note and the
  # table over seeds (the header paragraph before it is said in the page).
  return text[text.index('\n|') + 1:].rstrip('\n')


def _runs_facts(runs: list[dict]) -> list[str]:
  machines = {}
  for r in runs:
    name = r['machine'] + (f' with device "{r["device"]}"'
                           if r.get('device') else '')
    machines[name] = machines.get(name, 0) + 1
  dates = sorted({r['date'] for r in runs})
  return [(f'{len(runs)} run JSONs, each with its command, machine, '
           'date and commit'),
          'machines ' + ' and '.join(f'{m} ({k} runs)'
                                     for m, k in sorted(machines.items())),
          'dates ' + (f'{dates[0]} to {dates[-1]}' if len(dates) > 1
                      else dates[0]),
          'commits: the `code` column']


def learning(folder: str) -> str:
  """The learning benchmark's table, as ``benchmarks/learning/report.py``
  built it from the run JSONs under ``folder``."""
  return '\n\n'.join([
      _markdown_table(folder),
      _source([_link(folder, 'results.md'), _link(folder, 'runs', '')],
              *_runs_facts(_runs(folder)))])


def learning_budgets(folder: str) -> str:
  """Each task's budget per member, as the run JSONs record it."""
  budgets = {}
  for r in _runs(folder):
    b = r['budget']
    # Runs since the interval flags count env steps per member record
    # phase_env_steps; at the ratio of 1 every run used, the same number.
    key = (r['task'], b['env_steps'], b['warmup_steps'], b['eval_every'],
           b['ready_after'], b.get('phase_update_steps',
                                   b.get('phase_env_steps')))
    budgets[key] = budgets.get(key, 0) + 1
  rows = [[task, *(f'{v:,}' for v in values), str(count)]
          for (task, *values), count in sorted(budgets.items())]
  header = ['task', 'env steps per member', 'warm-up steps',
            'evaluation every (env steps)',
            'PBT ready after (update steps)',
            'HyperTrick phase (update steps)', 'runs']
  return '\n\n'.join([
      _table(header, 'lrrrrrr', rows),
      _source([_link(folder, 'runs', '')],
              'each run JSON\'s `budget`; PBT\'s and HyperTrick\'s '
              'intervals as the runs counted them then, in update steps '
              '(newer runs record env steps per member, the same number: '
              'no run\'s command sets `--update-to-data-ratio`, whose '
              'default is 1)')])


# --------------------------------------------------------------------------
# The pages
# --------------------------------------------------------------------------

BLOCKS: dict[str, Callable[[], str]] = {
    'cpu-main-command': lambda: main_command('cpu'),
    'cpu-update-speed td3': lambda: update_speed('cpu', 'td3'),
    'cpu-update-speed sac': lambda: update_speed('cpu', 'sac'),
    'cpu-update-speed dqn': lambda: update_speed('cpu', 'dqn', 1),
    'gpu-update-speed td3': lambda: update_speed('gpu', 'td3'),
    'cpu-sampling-inside': lambda: sampling_inside('cpu'),
    'gpu-sampling-inside': lambda: sampling_inside('gpu'),
    'cpu-learner-wait': lambda: learner_wait('cpu', 'learner_wait.json'),
    'gpu-learner-wait': lambda: learner_wait(
        'gpu', 'learner_wait.json', 'learner_wait_ratio2.json'),
    'cpu-end-to-end': lambda: end_to_end('cpu', 'end_to_end.json'),
    'gpu-end-to-end': lambda: end_to_end('gpu', 'end_to_end.json',
                                         'end_to_end_80.json'),
    'cpu-data-paths': lambda: data_paths('cpu'),
    'cpu-actor-throughput': lambda: actor_throughput('cpu'),
    'cpu-actor-throughput-eval': lambda: actor_throughput(
        'cpu', 'actor_throughput_eval.json'),
    'cpu-actor-step-split': lambda: actor_throughput(
        'cpu', 'actor_step_split.json'),
    'cpu-actor-baseline': lambda: actor_baseline('cpu'),
    'cpu-policy-call': lambda: policy_call('cpu'),
    'resume-curve': resume_curve,
    'cpu-ppo-speed': lambda: ppo_speed('ppo', 'speed_cartpole'),
    'cpu-ppo-speed-256': lambda: ppo_speed('ppo', 'speed_cartpole_256'),
    'cpu-peers': lambda: peers('peers', 'peers'),
    'cpu-peers-rule': lambda: peers('peers', 'rule_cost'),
    'cpu-ppo-update-speed': lambda: update_speed(
        os.path.join('ppo', 'update_speed'), 'ppo'),
    'cpu-ppo-actor-speed': lambda: ppo_actor_speed(
        'ppo', 'actor_speed', 'actor_speed_100k', 'actor_speed_100k_1actor'),
    'learning budgets': lambda: learning_budgets('learning'),
    'learning results': lambda: learning('learning'),
    'rules learning results': lambda: learning(os.path.join('rules',
                                                            'learning')),
}


def render(text: str, page: str = 'page') -> str:
  """``text`` with every generated block rebuilt from the result files;
  raises ``PageError`` for an unknown block or an unclosed marker."""
  opened, closed = len(OPEN.findall(text)), len(CLOSE.findall(text))
  found = len(BLOCK.findall(text))
  if not opened == closed == found:
    raise PageError(f'{page}: {opened} "<!-- generated: NAME -->" markers '
                    f'but {closed} "<!-- end generated -->"; every block '
                    'needs both, in that order, not nested')

  def replace(match: re.Match) -> str:
    name = match.group('name').strip()
    if name not in BLOCKS:
      raise PageError(f'{page}: no generated block named {name!r}; known: '
                      f'{", ".join(sorted(BLOCKS))}')
    return (f'{match.group("open")}\n\n{BLOCKS[name]().strip()}\n\n'
            f'{match.group("close")}')

  return BLOCK.sub(replace, text)


def stale_pages(pages: Optional[tuple] = None,
                write: bool = False) -> list[str]:
  """The pages (relative to the root; default ``PAGES``) whose generated
  blocks differ from the result files; with ``write`` they are
  rewritten."""
  stale = []
  for page in PAGES if pages is None else pages:
    path = os.path.join(ROOT, page)
    with open(path) as f:
      text = f.read()
    new = render(text, page)
    if new != text:
      stale.append(page)
      if write:
        with open(path, 'w') as f:
          f.write(new)
  return stale


def main(argv: Optional[list] = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0])
  parser.add_argument('--check', action='store_true',
                      help='change nothing; exit 1 naming each page whose '
                           'generated blocks differ from the result files')
  args = parser.parse_args(argv)
  try:
    stale = stale_pages(write=not args.check)
  except (PageError, OSError) as e:  # a bad marker, a missing file
    print(f'error: {e}', file=sys.stderr)
    return 2
  for page in stale:
    print(f'{page}: differs from the result files; run python -m '
          'benchmarks.pages' if args.check else f'{page}: regenerated')
  return 1 if args.check and stale else 0


if __name__ == '__main__':
  sys.exit(main())
