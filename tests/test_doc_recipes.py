"""The documentation's recipes, executed.

**Commands.** Every line of a ``bash``, ``shell`` or ``sh`` block of
README.md and docs/**/*.md that runs ``fastpbrl RULE ...`` (a built-in rule,
or ``module:Rule``; after ``&&``, ``srun ...``, ``fastpbrl.launch ... --``
or ``VAR=value`` too) is run with ``--print-config`` appended through
``fastpbrl.cli.commands.main(argv)``: it must exit 0 and print the resolved
settings as JSON. The rule is then built from the same flags, which runs
every check a run makes before it starts a process (``config.validate``
and the rule's own), and must not refuse them. ``fastpbrl info ...`` and
``fastpbrl --help`` lines run as they are. All of them run in one Python
process started from the repository root (so ``examples/...`` resolves,
and the agents and rules they register stay out of the test session's
registries), with the line's ``VAR=value`` in its environment.

Skipped, each with its reason in the report:

- lines with a placeholder: a token with ``...``, ``<`` or ``>``, or an
  upper-case word standing for a value (``RUN_DIR``);
- ``--resume`` (needs a run folder; the Python recipes below resume one)
  and ``--rerun-lineage`` (needs a PBT run's lineage file);
- only the build check, for ``--track wandb|mlflow`` when that extra is
  not installed (the line installs it first).

``fastpbrl evaluate`` and ``fastpbrl bench`` lines are not collected:
they need a run folder or are benchmarks.

**Python recipes.** A ``python`` block right after ``<!-- recipe: NAME
-->`` in docs/ is a recipe; after ``<!-- recipe-file: NAME.py -->`` it is a
file the recipes import. The recipes in ``RECIPES`` order (train with a
learning rate, resume, load the best policy, train on your own env) run as
one script in one fresh ``python -c`` process, in a temporary folder
holding the files, so each uses what the one before it trained, as a
notebook would. The runs they leave are checked against what the run
folders say (its settings, hyperparameters, episodes and final
evaluation). The command-line recipe of the own-env guide runs as written
too, through the installed ``fastpbrl`` command.

**The Slurm script** of the preemption guide runs with ``srun`` and
``scontrol`` stubbed: which command each start runs, and when it requeues.
"""

import contextlib
import csv
import glob
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest

from fastpbrl.cli import commands
from fastpbrl.cli import parse as cli
from fastpbrl.config.errors import ConfigError
from fastpbrl.rules import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, 'README.md'),
         *sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'),
                           recursive=True))]
RULES = ('pbt', 'cemrl', 'dvd', 'hypertrick', 'seeds', 'random')
SHELLS = ('bash', 'shell', 'sh')
# A fenced block, indented or not (inside a list item): its indent,
# language and body.
FENCE = re.compile(r'^([ \t]*)```(\w*)[^\n]*\n(.*?)^\1```', re.S | re.M)
SEPARATORS = ('&&', '||', ';', '|', '&')
ASSIGNMENT = re.compile(r'^[A-Za-z_]\w*=')
PLACEHOLDER = re.compile(r'^[A-Z][A-Z_]*[A-Z]$')  # RUN_DIR, DIR, FILE

# The Python recipes, in the order they run (each may use the last one's
# variables), and the files they need.
RECIPES = ('train', 'resume', 'load-policy', 'own-env')
RECIPE_FILES = ('point_env.py',)
RECIPE = re.compile(r'^<!-- recipe(-file)?: ([\w.-]+) -->\n```python\n'
                    r'(.*?)^```', re.S | re.M)
# Appended to the recipes: what the test compares with the run folders.
EPILOGUE = '''
import json as _json
with open('recipes_out.json', 'w') as _f:
  _json.dump({'member': int(scores.member), 'mean': float(scores.mean),
              'returns': [float(r) for r in scores.returns]}, _f)
'''


class Command(NamedTuple):
  """One ``fastpbrl`` command of the docs."""

  where: str  # page:line
  argv: tuple  # after ``fastpbrl``
  env: tuple  # ((name, value), ...) set on the line
  skip: str  # why it is not run ('' : it is)


def shell_lines(text: str):
  """``(line number, logical line)`` of the shell blocks of a page, with
  continuation lines joined and the block's indent removed."""
  for match in FENCE.finditer(text):
    indent, language, body = match.groups()
    if language not in SHELLS:
      continue
    first = text.count('\n', 0, match.start(3)) + 1
    lines = [line.removeprefix(indent) for line in body.splitlines()]
    start, pending = None, ''
    for offset, line in enumerate(lines):
      start = first + offset if not pending else start
      if line.rstrip().endswith('\\'):
        pending += line.rstrip()[:-1] + ' '
        continue
      yield start, pending + line
      pending = ''


def segments(line: str) -> list[list[str]]:
  """A shell line's simple commands as token lists (comments dropped)."""
  lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
  lexer.whitespace_split = True
  out, current = [], []
  for token in lexer:
    if token in SEPARATORS:
      out.append(current)
      current = []
    else:
      current.append(token)
  return out + [current]


def skip_reason(argv: list[str]) -> str:
  for token in argv:
    if '...' in token or '<' in token or '>' in token or (
        PLACEHOLDER.match(token)):
      return f'placeholder {token!r}'
  for flag in ('--resume', '--rerun-lineage'):
    if any(a == flag or a.startswith(flag + '=') for a in argv):
      return f'{flag} needs a run of its own'
  return ''


def is_checked(argv: list[str]) -> bool:
  """A rule's command, ``info``, or the top-level help."""
  if not argv:
    return False
  first = argv[0]
  return (first in RULES or first == 'info' or first in ('--help', '-h')
          or (':' in first and not first.startswith('-')))


def doc_commands() -> list[Command]:
  found, seen = [], set()
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    for number, line in shell_lines(text):
      if 'fastpbrl' not in line:
        continue
      for tokens in segments(line):
        at = next((i for i, t in enumerate(tokens)
                   if os.path.basename(t) == 'fastpbrl'), None)
        if at is None or not is_checked(tokens[at + 1:]):
          continue
        env = tuple(tuple(t.split('=', 1)) for t in tokens[:at]
                    if ASSIGNMENT.match(t))
        argv = tuple(tokens[at + 1:])
        where = f'{os.path.relpath(page, ROOT)}:{number}'
        while where in seen:  # two commands on one line
          where += '+'
        seen.add(where)
        found.append(Command(where, argv, env, skip_reason(list(argv))))
  return found


COMMANDS = doc_commands()


def check_commands(argv) -> None:
  """In a fresh process from the repository root: runs each command of the
  JSON file ``argv[0]`` and writes what happened to ``argv[1]``."""
  with open(argv[0]) as f:
    todo = json.load(f)
  results = {}
  for where, command, env in todo:
    saved = {k: os.environ.get(k) for k, _ in env}
    os.environ.update(dict(env))
    out, err = io.StringIO(), io.StringIO()
    run = command + (['--print-config']
                     if command[0] not in ('info', '--help', '-h') else [])
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      try:
        status = commands.main(run)
      except SystemExit as e:
        status = e.code
      except Exception as e:  # noqa: BLE001 (reported by the test)
        status = f'{type(e).__name__}: {e}'
    refused = None
    if status == 0 and command[0] not in ('info', '--help', '-h') and (
        '--help' not in command and '-h' not in command):
      rule_cls = registry.get(command[0])
      try:
        flags = [a for a in command[1:] if a != '--print-config']
        config = cli.parse(rule_cls.presets, '', flags, command[0])
        rule_cls.from_config(config)
      except (ConfigError, SystemExit) as e:
        refused = str(e)
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    results[where] = {'status': status, 'stdout': out.getvalue()[-3000:],
                      'stderr': err.getvalue()[-3000:], 'refused': refused}
  with open(argv[1], 'w') as f:
    json.dump(results, f)


@pytest.fixture(scope='module')
def command_results(tmp_path_factory):
  folder = tmp_path_factory.mktemp('doc_commands')
  todo = [(c.where, list(c.argv), list(c.env)) for c in COMMANDS
          if not c.skip]
  with open(folder / 'todo.json', 'w') as f:
    json.dump(todo, f)
  proc = subprocess.run(
      [sys.executable, '-c', ('import sys; from tests.test_doc_recipes '
                              'import check_commands; '
                              'check_commands(sys.argv[1:])'),
       str(folder / 'todo.json'), str(folder / 'results.json')],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-5000:]
  with open(folder / 'results.json') as f:
    return json.load(f)


def test_the_docs_have_commands_to_check():
  where = {c.where.split(':')[0] for c in COMMANDS if not c.skip}
  assert 'README.md' in where
  assert 'docs/guides/own-env.md' in where
  assert 'docs/guides/preemption.md' in where  # the Slurm script's
  assert len([c for c in COMMANDS if not c.skip]) >= 15


@pytest.mark.parametrize('command', COMMANDS,
                         ids=[f'{c.where} {" ".join(c.argv)}'[:90]
                              for c in COMMANDS])
def test_a_documented_command_parses_and_is_valid(command, command_results):
  if command.skip:
    pytest.skip(command.skip)
  result = command_results[command.where]
  shown = f'fastpbrl {" ".join(command.argv)} ({command.where})'
  assert result['status'] == 0, (
      f'{shown}: exit status {result["status"]}\n{result["stderr"]}')
  trains = command.argv[0] in RULES or ':' in command.argv[0]
  if trains and '--help' not in command.argv:
    settings = json.loads(result['stdout'])  # the resolved config
    assert settings['env']
  refused = result['refused']
  if refused is not None:
    extra = re.search(r"pip install 'fastpbrl\[(\w+)\]'", refused)
    if extra and '--track' in command.argv:
      pytest.skip(f'the {extra.group(1)} extra is not installed here')
    pytest.fail(f'{shown}: refused before starting: {refused}')


def recipes() -> tuple[dict, dict]:
  """``({name: (page, code)}, {file name: code})`` of docs/ (a name found
  twice is an error)."""
  blocks, files = {}, {}
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    for is_file, name, code in RECIPE.findall(text):
      into = files if is_file else blocks
      assert name not in into, f'recipe {name} twice ({page})'
      into[name] = (os.path.relpath(page, ROOT), code)
  return blocks, files


def test_every_recipe_is_in_the_docs():
  blocks, files = recipes()
  assert set(blocks) == set(RECIPES)
  assert set(files) == set(RECIPE_FILES)
  # The Python recipes of the questions a newcomer asks first.
  assert "hparams={'policy_lr'" in blocks['train'][1]
  assert 'resume=' in blocks['resume'][1]
  assert 'fastpbrl.load_policy(' in blocks['load-policy'][1]
  assert "env='point_env:Point-v0'" in blocks['own-env'][1]


def write_recipe_files(folder) -> None:
  _, files = recipes()
  for name, (_, code) in files.items():
    (folder / name).write_text(code)


def read_csv(path: str) -> list[dict]:
  with open(path, newline='') as f:
    return list(csv.DictReader(f))


def one_run(folder, pattern: str) -> str:
  found = glob.glob(os.path.join(str(folder), 'runs', pattern))
  assert len(found) == 1, (pattern, os.listdir(os.path.join(str(folder),
                                                            'runs')))
  return found[0]


def training_episodes(run_dir: str, member: int) -> list[dict]:
  rows = read_csv(os.path.join(run_dir, 'members', f'member_{member:03d}.csv'))
  return [r for r in rows if r['evaluation'] == 'False']


def check_point_env_run(run_dir: str, population_size: int = 2) -> None:
  """A PBT run on the guide's env: its actors made that env (every episode
  is the 50 steps it registers), and the run finished."""
  with open(os.path.join(run_dir, 'config.json')) as f:
    assert json.load(f)['env'] == 'point_env:Point-v0'
  for member in range(population_size):
    episodes = training_episodes(run_dir, member)
    assert episodes
    assert {r['episode_length'] for r in episodes} == {'50'}
  with open(os.path.join(run_dir, 'lineage.jsonl')) as f:
    events = [json.loads(line) for line in f]
  assert [e['member'] for e in events if e['event'] == 'init'] == list(
      range(population_size))
  with open(os.path.join(run_dir, 'final_returns.json')) as f:
    final = json.load(f)
  assert final['env_steps'] >= 3000
  assert all(math.isfinite(r) for r in final['final_returns'])


@pytest.mark.slow
def test_the_python_recipes_run_in_order_in_one_process(tmp_path):
  blocks, _ = recipes()
  write_recipe_files(tmp_path)
  script = '\n\n'.join(
      f'# --- recipe {name} ({blocks[name][0]})\n{blocks[name][1]}'
      for name in RECIPES) + EPILOGUE
  proc = subprocess.run([sys.executable, '-c', script], cwd=tmp_path,
                        capture_output=True, text=True, timeout=1500)
  assert proc.returncode == 0, proc.stderr[-5000:]

  # train: every member trained with policy_lr 1e-3 (a float32), from the
  # first row of hparams.csv to the last.
  run_dir = one_run(tmp_path, 'seeds-td3-Pendulum-v1-*')
  rows = read_csv(os.path.join(run_dir, 'hparams.csv'))
  assert {r['member'] for r in rows} == {'0', '1'}
  assert {float(r['policy_lr']) for r in rows} == {float(np.float32(1e-3))}
  # resume: the same folder, trained on to the new budget, each episode of
  # the first part kept once (the logs were cut back to the checkpoint).
  with open(os.path.join(run_dir, 'config.json')) as f:
    assert json.load(f)['env_steps'] == 4000
  with open(os.path.join(run_dir, 'final_returns.json')) as f:
    final = json.load(f)
  assert final['env_steps'] >= 4000
  for member in (0, 1):
    steps = [int(r['env_steps']) for r in training_episodes(run_dir, member)]
    assert steps == sorted(set(steps)), steps  # no episode twice
    assert min(steps) < 3000 <= max(steps)
  # load-policy: evaluate's 5 episodes at seed 0 replay the run's own final
  # evaluation of its best member (5 episodes, seed 0). One observation at
  # a time against the run's batch of all members: float32 actions may
  # round apart (tests/test_api.py bounds the effect at 1e-4 relative).
  with open(tmp_path / 'recipes_out.json') as f:
    scores = json.load(f)
  returns = final['final_returns']
  assert scores['member'] == returns.index(max(returns))
  assert scores['mean'] == pytest.approx(max(returns), rel=1e-4)
  # own-env
  check_point_env_run(one_run(tmp_path, 'pbt-td3-point_env_Point-v0-*'))


@pytest.mark.slow
def test_the_own_env_command_runs_as_written(tmp_path):
  with open(os.path.join(ROOT, 'docs', 'guides', 'own-env.md')) as f:
    lines = [line for _, line in shell_lines(f.read())
             if 'fastpbrl pbt --env point_env:' in line]
  assert len(lines) == 1, lines
  write_recipe_files(tmp_path)
  # The fastpbrl command of this environment, as pip installed it.
  path = os.path.dirname(sys.executable) + os.pathsep + os.environ['PATH']
  env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
  proc = subprocess.run(['bash', '-c', lines[0]], cwd=tmp_path,
                        env={**env, 'PATH': path}, capture_output=True,
                        text=True, timeout=1200)
  assert proc.returncode == 0, proc.stderr[-5000:]
  check_point_env_run(one_run(tmp_path, 'pbt-td3-point_env_Point-v0-*'))


def test_the_slurm_script_starts_requeues_and_resumes_one_folder(tmp_path):
  """The guide's sbatch script, with ``srun`` and ``scontrol`` stubbed
  (they log their arguments; ``srun`` exits with ``$STATUS``): a first
  start trains into the fixed folder, SIGTERM's status 143 requeues the
  job, a start with a checkpoint resumes it, and one without a complete
  checkpoint starts again in an emptied folder."""
  with open(os.path.join(ROOT, 'docs', 'guides', 'preemption.md')) as f:
    scripts = [body for _, language, body in FENCE.findall(f.read())
               if language in SHELLS and '#SBATCH' in body]
  assert len(scripts) == 1
  (tmp_path / 'job.sbatch').write_text(scripts[0])
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  for name, status in (('srun', '${STATUS:-0}'), ('scontrol', '0')):
    (bin_dir / name).write_text(
        f'#!/bin/bash\necho "{name} $*" >> "$CALLS"\nexit {status}\n')
    (bin_dir / name).chmod(0o755)
  run = tmp_path / 'runs' / 'pbt-hopper'

  def start(status: int) -> tuple[int, list[str]]:
    calls = tmp_path / 'calls.txt'
    calls.unlink(missing_ok=True)
    proc = subprocess.run(
        ['bash', 'job.sbatch'], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, env={**os.environ, 'STATUS': str(status),
                         'CALLS': str(calls), 'SLURM_JOB_ID': '4242',
                         'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}'})
    return proc.returncode, calls.read_text().splitlines()

  fresh = ('srun fastpbrl pbt --env Hopper-v5 --population-size 8 '
           '--env-steps 1000000 --run-dir runs/pbt-hopper')
  # The first start, stopped by SIGTERM after its checkpoint: requeued.
  assert start(143) == (143, [fresh, 'scontrol requeue 4242'])
  # Requeued with a complete checkpoint (orbax names it by its call):
  # the same folder resumed, and a run that finishes ends the job.
  (run / 'checkpoints' / '260').mkdir(parents=True)
  assert start(0) == (0, ['srun fastpbrl pbt --resume runs/pbt-hopper'])
  # Preempted before its first complete checkpoint (only orbax's
  # temporary folder): the folder is emptied and the run starts again.
  (run / 'checkpoints' / '260').rmdir()
  (run / 'checkpoints' / '20.orbax-checkpoint-tmp-1').mkdir()
  (run / 'config.json').write_text('{}')
  assert start(0) == (0, [fresh])
  assert not run.exists()  # the stub trained nothing into it
