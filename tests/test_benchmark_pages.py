"""The benchmark pages are the ones ``python -m benchmarks.pages`` generates,
and its tables agree with an independent reading of the result files."""

import glob
import json
import os
import statistics

import pytest

# Each import binds its module as learning.<module>.
import benchmarks.learning.matrix  # noqa: F401
import benchmarks.learning.population  # noqa: F401
import benchmarks.learning.store  # noqa: F401
import benchmarks.learning.suite  # noqa: F401
import benchmarks.learning.tables  # noqa: F401
from benchmarks import learning, pages

ROOT = pages.ROOT
RESULTS = os.path.join(ROOT, 'benchmarks', 'results')


def table_rows(block: str) -> dict[str, dict[str, str]]:
  """The rows of a generated Markdown table, by their first cell, each a
  dict from column header to cell."""
  lines = [[c.strip() for c in line.strip('|').split('|')]
           for line in block.splitlines() if line.startswith('|')]
  header, body = lines[0], lines[2:]
  return {cells[0]: dict(zip(header[1:], cells[1:], strict=True))
          for cells in body}


@pytest.mark.parametrize('page', pages.PAGES)
def test_the_benchmark_pages_are_the_generated_ones(page):
  """Every generated block of the page is what the result files give:
  regenerate the page when a result file changes."""
  with open(os.path.join(ROOT, page)) as f:
    text = f.read()
  assert '<!-- generated: ' in text
  assert text == pages.render(text, page), (
      f'{page} is stale: python -m benchmarks.pages')


def test_check_names_each_stale_page_and_exits_1(tmp_path, monkeypatch,
                                                 capsys):
  page = tmp_path / 'page.md'
  page.write_text('Prose.\n\n<!-- generated: resume-curve -->\n| old |\n'
                  '<!-- end generated -->\n\nMore prose.\n')
  fresh = tmp_path / 'fresh.md'
  fresh.write_text(pages.render(page.read_text()))
  monkeypatch.setattr(pages, 'PAGES', (str(page), str(fresh)))
  assert pages.main(['--check']) == 1
  out = capsys.readouterr().out.splitlines()
  assert len(out) == 1 and out[0].startswith(f'{page}: ')
  # --check wrote nothing; a plain run rewrites the stale page only, and
  # keeps the prose around the block.
  assert '| old |' in page.read_text()
  assert pages.main([]) == 0
  assert page.read_text() == fresh.read_text()
  assert page.read_text().startswith('Prose.\n\n<!-- generated: ')
  assert page.read_text().endswith('<!-- end generated -->\n\nMore prose.\n')


def test_an_unknown_or_unclosed_block_is_refused_in_one_line():
  with pytest.raises(pages.PageError, match=r"no generated block named "
                     r"'nope'; known: .*cpu-update-speed td3"):
    pages.render('<!-- generated: nope -->\n<!-- end generated -->', 'p.md')
  with pytest.raises(pages.PageError, match='1 "<!-- generated: NAME -->" '
                     'markers but 0'):
    pages.render('<!-- generated: resume-curve -->\n', 'p.md')
  for broken in ('<!-- generated: nope -->\n<!-- end generated -->',
                 '<!-- end generated -->'):
    with pytest.raises(pages.PageError) as error:
      pages.render(broken, 'p.md')
    assert '\n' not in str(error.value)
    assert str(error.value).startswith('p.md: ')


def test_a_cpu_update_speed_cell_is_the_json_row():
  """TD3 at N = 8, 50 steps per call: the median call time over the
  member-steps of a call, and PyTorch's time over ours, from the rows."""
  with open(os.path.join(RESULTS, 'cpu', 'update_speed.json')) as f:
    data = json.load(f)

  def call_ms(implementation):
    (row,) = [r for r in data['rows'] if r['mode'] == 'independent'
              and r['agent'] == 'td3' and r['steps_per_call'] == 50
              and r['population_size'] == 8
              and r['implementation'] == implementation]
    return row['time_per_call_ms']

  vectorized, torch = call_ms('jax-vectorized'), call_ms('torch-sequential')
  block = pages.BLOCKS['cpu-update-speed td3']()
  rows = table_rows(block)
  assert float(rows['JAX vectorized (this project)']['N=8']) == (
      pytest.approx(vectorized / (50 * 8), abs=0.005))
  speedup = rows['speed-up: PyTorch sequential time ÷ JAX vectorized time']
  assert float(speedup['N=8'].rstrip('x')) == pytest.approx(
      torch / vectorized, abs=0.05)
  # The line under the table is read from the file too.
  assert data['meta']['date'][:10] in block
  assert data['meta']['command'] in block


def test_the_learning_table_agrees_with_the_run_jsons():
  """Seeds and best member's final (mean ± sample std over seeds of a run's
  best final) of every row, and each rule's probability of improving on
  its seeds row (every pair of seeds counted), recomputed from the run
  JSONs."""
  runs, superseded = {}, {}
  for path in glob.glob(os.path.join(RESULTS, 'learning', 'runs', '**',
                                     '*.json'), recursive=True):
    with open(path) as f:
      run = json.load(f)
    key = (run['task'], f'{run["budget"]["env_steps"]:,}',
           str(run['population_size']), run['method'])
    if learning.store.superseded_by(run):  # left out, shown apart at the end
      superseded.setdefault(key, []).append(run)
      continue
    runs.setdefault(key, []).append(max(run['final_returns']))
  block = pages.BLOCKS['learning results']()
  means, over_seeds = block.split(learning.tables.STATISTICS_NOTE)
  over_seeds, matrix = over_seeds.split(learning.matrix.MATRIX_NOTE)
  over_seeds, reference = over_seeds.split(learning.tables.REFERENCE_NOTE)
  matrix, apart = matrix.split(learning.tables.SUPERSEDED_NOTE)
  matrix, population = matrix.split(learning.population.POPULATION_NOTE)
  # The runs left out: each row's seeds, codes and best final over seeds.
  seen = {}
  for cells in body_rows(apart):
    task, steps, members, method, seeds, codes, _, best = (
        c.strip() for c in cells[:8])
    seen[(task, steps, members, method)] = (seeds, codes, best)
  assert set(seen) == set(superseded)
  for key, group in superseded.items():
    group.sort(key=lambda r: r['seed'])
    bests = [max(r['final_returns']) for r in group]
    assert seen[key][:2] == (
        ', '.join(str(r['seed']) for r in group),
        ', '.join(sorted({r['code'] for r in group}))), key
    assert _mean_std_shown(seen[key][2], bests), key
  seen = {}
  for cells in body_rows(means):
    task, steps, members, method, seeds, best = (c.strip()
                                                 for c in cells[:6])
    seen[(task, steps, members, method)] = (int(seeds), best)
  assert set(seen) == set(runs)
  for key, bests in runs.items():
    assert seen[key][0] == len(bests), key
    assert _mean_std_shown(seen[key][1], bests), key
  compared = 0
  for cells in body_rows(over_seeds):
    task, steps, members, method, _, _, poi = (c.strip() for c in cells[:7])
    baseline = learning.suite.baseline_of(method)
    if (task, steps, members, baseline) not in runs:
      assert poi == ''
      continue
    x = runs[(task, steps, members, method)]
    y = runs[(task, steps, members, baseline)]
    assert poi.split(' ')[0] == f'{win_share(x, y):.2f}', cells
    compared += 1
  assert compared >= 10
  # Ours against SB3: each pair's seeds and P, from the same runs.
  for cells in body_rows(reference):
    task, steps, members, ours, theirs, n_ours, n_theirs = (
        c.strip() for c in cells[:7])
    x = runs[(task, steps, members, ours)]
    y = runs[(task, steps, members, theirs)]
    assert (int(n_ours), int(n_theirs)) == (len(x), len(y))
    assert cells[9].strip().split(' ')[0] == f'{win_share(x, y):.2f}', cells
  # The matrix, a table against the default seeds, then one against random
  # search: every PBT explore's seeds and P against the table's baseline.
  against_seeds, against_random = matrix.split('\nA PBT variant better')[:2]
  for text, baseline in ((against_seeds, learning.matrix.MATRIX_BASELINE),
                         (against_random, learning.matrix.MATRIX_CONTROL)):
    check_matrix_table(text[text.index('|'):], baseline, runs)
  # The larger populations, in three tables (PBT and PB2 from the same
  # prior, then from near the defaults, then PBT with resampling from the
  # same prior on the 16-member cells): each arm's seeds, and each rule's
  # P against random search and against default seeds, from the same runs.
  same_prior, rest = population.split('From near the defaults')
  near, resample = rest.split(learning.population.RESAMPLE_HEADING)
  all_cells = learning.population.POPULATION_CELLS
  larger = tuple(cell for cell in all_cells if cell[2] == 16)
  for text, rules, cells in (
      (same_prior, learning.population.POPULATION_RULES, all_cells),
      (near, learning.population.POPULATION_NEAR_RULES, all_cells),
      (resample, learning.population.POPULATION_RESAMPLE_RULES, larger)):
    check_population_table(text[text.index('|'):], rules, runs, cells)


def check_matrix_table(text: str, baseline: str, runs: dict) -> None:
  """Checks a table of ``verdict_table`` against ``baseline`` with
  ``runs``, comparing one probability at least."""
  rows = table_rows(text)
  assert len(rows) == len(learning.matrix.MATRIX_TASKS)
  compared = 0
  for name, cells in rows.items():
    task, steps = name.split(' at ')
    steps = steps.split(' env steps')[0]
    members = str(learning.suite.DEFAULT_POPULATION)
    y = runs.get((task, steps, members, baseline))
    assert cells[baseline] == (seed_count(len(y)) if y else 'not run')
    for method in learning.matrix.MATRIX_RULES:
      x = runs.get((task, steps, members, method))
      if x is None:
        assert cells[method] == 'not run'
        continue
      assert cells[method].endswith(f', {seed_count(len(x))}'), cells[method]
      if y:
        assert f': P {win_share(x, y):.2f}' in cells[method]
        compared += 1
  assert compared, f'no variant compared with {baseline}'


def check_population_table(text: str, rules: tuple, runs: dict,
                           cells: tuple) -> None:
  """Checks a table of ``population_table`` over ``cells`` against
  ``runs``, comparing one probability at least."""
  rows = table_rows(text)
  assert len(rows) == len(cells)
  compared = 0
  for (task, steps, members, _), (name, row) in zip(cells, rows.items()):
    assert name.startswith(f'{task}, {members} members, {steps:,} env')
    key = (task, f'{steps:,}', str(members))
    for arm in (learning.population.POPULATION_BASELINE,
                learning.population.POPULATION_CONTROL):
      y = runs.get((*key, arm))
      assert row[arm].endswith(f', {seed_count(len(y))}' if y else
                               'not run'), row[arm]
    for rule in rules:
      x = runs.get((*key, rule))
      for other in (learning.population.POPULATION_CONTROL,
                    learning.population.POPULATION_BASELINE):
        y = runs.get((*key, other))
        if x and y:
          assert f': P {win_share(x, y):.2f}' in row[f'{rule} vs {other}']
          compared += 1
  assert compared, f'no probability of {rules} compared'


def seed_count(count: int) -> str:
  """'1 seed', '5 seeds': how the matrix gives a row's seeds."""
  return f'{count} seed' + ('' if count == 1 else 's')


def win_share(x: list, y: list) -> float:
  """The share of pairs of seeds where ``x``'s seed ends above ``y``'s
  (ties count a half): the probability of improvement, counted."""
  wins = sum((a > b) + 0.5 * (a == b) for a in x for b in y)
  return wins / (len(x) * len(y))


def body_rows(text: str) -> list[list[str]]:
  """The body rows of the markdown tables in ``text``, split into cells."""
  return [line.strip('|').split('|') for line in text.splitlines()
          if line.startswith('| ') and not line.startswith('| task')]


def _shown(printed: str, value: float) -> bool:
  """``printed`` is ``value`` rounded to the digits it shows (fixed
  decimals or scientific notation), and not 0 for a nonzero value."""
  mantissa, _, exponent = printed.partition('e')
  decimals = len(mantissa.partition('.')[2])
  unit = 10.0 ** (int(exponent or 0) - decimals)
  # Half a unit of the last digit shown, and a float's relative error.
  close = abs(float(printed) - value) <= unit / 2 + 1e-9 * abs(value)
  return close and (float(printed) != 0 or value == 0)


def _mean_std_shown(cell: str, values: list) -> bool:
  """A "mean ± sample std" cell (the value alone for one seed) shows the
  mean and standard deviation of ``values``."""
  if len(values) == 1:
    return _shown(cell, values[0])
  mean, std = cell.split(' ± ')
  return (_shown(mean, statistics.fmean(values))
          and _shown(std, statistics.stdev(values)))
