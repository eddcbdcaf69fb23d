"""The TD3 matrix of the learning report: each PBT variant (perturb,
resample, PB2, shared replay) against as many default seeds and against
random search from the prior (the papers' control arm), per task of the
suite, with what "better" takes at the seeds a side it has."""

from __future__ import annotations

from benchmarks import stats
from benchmarks.learning.suite import DEFAULT_POPULATION, HELD_OUT
from benchmarks.learning.tables import n_seeds, verdict_cell


# The question the benchmark is for: does PBT, with each of its explores
# (and with a shared replay), end ahead of as many members at the agent's
# defaults? Asked on every task of the suite at the budget it is run at on
# the 2-core machine, held-out tasks included.
MATRIX_TASKS = (('Pendulum-v1', 20_000), ('Hopper-v5', 50_000),
                ('HalfCheetah-v5', 50_000), ('Walker2d-v5', 50_000),
                ('Ant-v5', 50_000))
MATRIX_BASELINE = 'seeds-td3'
# The papers' control arm: the same population trained without exploit or
# explore, each member's hyperparameters drawn from the whole prior. The
# variants (MATRIX_RULES) start near the defaults, a head start it does
# not get: not the papers' comparison from the same prior.
MATRIX_CONTROL = 'random-td3'
MATRIX_RULES = ('pbt-td3', 'pbt-resample-td3', 'pbt-pb2-td3',
                'pbt-shared-td3')
MATRIX_NOTE = (
    f'PBT against {MATRIX_BASELINE}, then against random search from the '
    f'whole prior ({MATRIX_CONTROL}; the variants start near the defaults), '
    'per task: each variant\'s verdict, its probability of ending above a '
    'seed of the other arm with the 95% interval, and its seeds ("not '
    'run": no run yet).')


def matrix_summary(by: dict) -> list[str]:
  """Markdown: a table with a row per task of ``MATRIX_TASKS``, a column per
  PBT variant with its verdict against ``MATRIX_BASELINE``, and a line
  naming the tasks where one of them is better and those where one is
  worse; then the same against ``MATRIX_CONTROL``; then what "better"
  takes. Empty when no run of the matrix is in ``by``."""
  methods = (MATRIX_BASELINE, MATRIX_CONTROL) + MATRIX_RULES
  cells = [by.get((task, steps, DEFAULT_POPULATION), {})
           for task, steps in MATRIX_TASKS]
  if not any(m in runs for runs in cells for m in methods):
    return []
  control = (' (random search from the whole prior; the variants start '
             'near the defaults, a head start it does not get)')
  return (verdict_table(by, MATRIX_BASELINE) + ['']
          + verdict_table(by, MATRIX_CONTROL, control) + ['', power_note()])


def verdict_table(by: dict, baseline: str, aside: str = '') -> list[str]:
  """A row per task: ``baseline``'s seeds, then each of ``MATRIX_RULES``'s
  verdict against it; then the line counting the tasks where a variant is
  better or worse (``aside`` follows the baseline's name there) and those
  where every method of the table has its seeds."""
  methods = (baseline,) + MATRIX_RULES
  lines = ['| task | ' + ' | '.join(methods) + ' |',
           '|---|' + '---|' * len(methods)]
  found = {'better': [], 'worse': []}
  complete = 0  # tasks where every method has its MIN_SEEDS
  for task, steps in MATRIX_TASKS:
    finals = {m: [max(r['final_returns']) for r in runs]
              for m, runs in by.get((task, steps, DEFAULT_POPULATION),
                                    {}).items()}
    reference = finals.get(baseline)
    cells = [n_seeds(len(reference)) if reference else 'not run']
    cells += [verdict_cell(finals.get(m), reference) for m in MATRIX_RULES]
    complete += all(len(finals.get(m, [])) >= stats.MIN_SEEDS
                    for m in methods)
    name = f'{task} at {steps:,} env steps' + (
        ' (held out)' if task in HELD_OUT else '')
    for verdict, names in found.items():
      if any(cell.startswith(verdict + ':') for cell in cells[1:]):
        names.append(name)
    lines.append(f'| {name} | ' + ' | '.join(cells) + ' |')
  count = len(MATRIX_TASKS)
  return lines + [
      '', f'A PBT variant better than {baseline}{aside} on '
      f'{len(found["better"])} of {count} tasks'
      + (f' ({"; ".join(found["better"])})' if found['better'] else '')
      + f'; worse on {len(found["worse"])}'
      + (f' ({"; ".join(found["worse"])})' if found['worse'] else '')
      + f'. Every method has {stats.MIN_SEEDS} seeds or more on '
      f'{complete} of {count} tasks.']


def power_note() -> str:
  """What "better" takes at ``MIN_SEEDS`` seeds a side, so that "not
  distinguishable" reads as "no gain that large", not "no gain"."""
  n = stats.MIN_SEEDS
  p = stats.smallest_decisive_probability(n, n)
  return (f'With {n} seeds a side, a variant is called better only from P = '
          f'{p:.2f} ({round(p * n * n)} of the {n * n} pairs of seeds), '
          f'whatever the returns: for normally distributed returns of one '
          f'spread, a gap of {stats.normal_gap(p):.1f} standard deviations '
          f'between the means (P = Phi(gap / sqrt 2)). A smaller gain reads '
          f'"not distinguishable" at these seed counts.')
