"""The documentation: every relative link of README.md and docs/ resolves
in the repository (a page, a source file, a result file), every anchor to
a heading of its page, the MkDocs site builds in strict mode, and every
relative link of the built site opens a file of the site."""

import dataclasses
import glob
import html.parser
import os
import re
import subprocess
import sys
import urllib.parse

import pytest

from fastpbrl import launch
from fastpbrl.cli import commands
from fastpbrl.cli import reference as cli_reference
from fastpbrl.cli.commands import evaluate, info
from fastpbrl.rules import registry
from fastpbrl.rules.pbt import PBTRunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(ROOT, 'README.md'), os.path.join(ROOT, 'CHANGELOG.md'),
         *sorted(glob.glob(os.path.join(ROOT, 'docs', '**', '*.md'),
                           recursive=True))]
LINK = re.compile(r'\]\(([^)\s]+)\)')
FENCE = re.compile(r'^```.*?^```', re.S | re.M)


def links(path: str) -> list[str]:
  """The relative links of a Markdown page, outside code blocks."""
  with open(path) as f:
    text = FENCE.sub('', f.read())
  return [target for target in LINK.findall(text)
          if not re.match(r'[a-z]+:', target)]


def slug(heading: str) -> str:
  """A heading's anchor as MkDocs's ``toc`` makes it: lower case, no
  punctuation, runs of spaces and hyphens as one hyphen."""
  text = re.sub(r'[`*]', '', heading).strip().lower()
  text = re.sub(r'[^\w\s-]', '', text)
  return re.sub(r'[\s-]+', '-', text).strip('-')


def anchors(path: str) -> set[str]:
  with open(path) as f:
    text = FENCE.sub('', f.read())
  return {slug(line.lstrip('#')) for line in text.splitlines()
          if re.match(r'#{1,6} ', line)}


def test_slug_is_mkdocs_toc_slug():
  assert slug('The data path on a GPU (NVIDIA H100)') == (
      'the-data-path-on-a-gpu-nvidia-h100')
  assert slug('Fault injection, and a run killed and resumed') == (
      'fault-injection-and-a-run-killed-and-resumed')
  assert slug('`fastpbrl info`: agents') == 'fastpbrl-info-agents'


@pytest.mark.parametrize('page', PAGES,
                         ids=[os.path.relpath(p, ROOT) for p in PAGES])
def test_every_relative_link_resolves(page):
  broken = []
  for target in links(page):
    path, _, anchor = target.partition('#')
    resolved = (os.path.normpath(os.path.join(os.path.dirname(page), path))
                if path else page)
    if not os.path.exists(resolved):
      broken.append(f'{target} (no {os.path.relpath(resolved, ROOT)})')
    elif anchor and resolved.endswith('.md') and (
        anchor not in anchors(resolved)):
      broken.append(f'{target} (no heading #{anchor})')
  assert not broken, f'{os.path.relpath(page, ROOT)}: {broken}'


def test_the_readme_is_one_page_without_commits():
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  assert len(readme.splitlines()) < 200
  # A commit hash: 7 to 40 hex digits with at least one letter and digit.
  hashes = [w for w in re.findall(r'\b[0-9a-f]{7,40}\b', readme)
            if re.search(r'[a-f]', w) and re.search(r'\d', w)]
  assert not hashes, hashes


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  """The site, built once for this module's tests in strict mode."""
  pytest.importorskip('mkdocs', reason='the test (or docs) extra')
  site_dir = tmp_path_factory.mktemp('site')
  proc = subprocess.run(
      [sys.executable, '-m', 'mkdocs', 'build', '--strict', '--site-dir',
       str(site_dir)], cwd=ROOT, capture_output=True, text=True,
      timeout=600, env={**os.environ, 'NO_MKDOCS_2_WARNING': '1'})
  assert proc.returncode == 0, proc.stderr[-5000:]
  return site_dir


def test_the_site_builds_in_strict_mode(site):
  assert (site / 'guides' / 'add-a-rule' / 'index.html').exists()
  with open(site / 'reference' / 'api' / 'index.html') as f:
    api = f.read()
  # mkdocstrings rendered the docstrings it was pointed at.
  for name in ('fastpbrl.api.train', 'fastpbrl.rules.base.Rule.decide',
               'fastpbrl.trained.policy.Policy.predict',
               'fastpbrl.run.callbacks.Callback.after_call'):
    assert f'id="{name}"' in api, name


class _Links(html.parser.HTMLParser):
  """The ``href`` and ``src`` values of an HTML page."""

  def __init__(self):
    super().__init__()
    self.links = []

  def handle_starttag(self, tag, attrs):
    self.links += [value for name, value in attrs
                   if name in ('href', 'src') and value]


def test_every_relative_link_of_the_site_opens_a_file_of_it(site):
  """A link to a repository file (``../examples/api_example.py``) opens its
  copy in the site (docs/hooks.py), as does every link between pages."""
  broken, pages = [], glob.glob(str(site / '**' / '*.html'), recursive=True)
  for page in pages:
    parser = _Links()
    with open(page, encoding='utf-8') as f:
      parser.feed(f.read())
    for link in parser.links:
      path = urllib.parse.unquote(link.split('#', 1)[0].split('?', 1)[0])
      if not path or re.match(r'[a-z]+:|//', link):
        continue
      # An absolute path (404.html's, the site served from its root) is
      # the site's own.
      base = str(site) if path.startswith('/') else os.path.dirname(page)
      target = os.path.normpath(os.path.join(base, path.lstrip('/')))
      if os.path.isdir(target):
        target = os.path.join(target, 'index.html')
      if not os.path.isfile(target):
        broken.append(f'{os.path.relpath(page, site)}: {link}')
  assert len(pages) > 20
  assert not broken, broken
  # A page's link to a source file opens a page with the source.
  with open(site / 'repo' / 'examples' / 'api_example.py' / 'index.html') as f:
    assert 'fastpbrl' in f.read()


def test_the_cli_reference_is_the_generated_one():
  """``docs/reference/cli.md`` is what ``python -m fastpbrl.cli.reference``
  prints: regenerate it when a flag changes."""
  with open(os.path.join(ROOT, 'docs', 'reference', 'cli.md')) as f:
    assert f.read() == cli_reference.markdown(), (
        'docs/reference/cli.md is stale: python -m fastpbrl.cli.reference '
        '> docs/reference/cli.md')


def test_the_cli_reference_has_every_flag_and_its_help_text():
  page = cli_reference.markdown()
  docs = cli_reference.field_docs(PBTRunConfig)
  for field in dataclasses.fields(PBTRunConfig):
    assert f'`--{field.name.replace("_", "-")}' in page, field.name
  # The text --help shows for a flag (the field's docstring), whole.
  assert docs['ready_after'].startswith('Env steps per member between two '
                                        'exploit/explore decisions')
  assert ' '.join(docs['ready_after'].split()) in page


def test_the_cli_reference_has_every_command_and_its_arguments():
  page = cli_reference.markdown()
  for rule in registry.builtins():
    assert f'\n## fastpbrl {rule.name}\n' in page, rule.name
  for name in commands.COMMANDS:
    assert f'\n## fastpbrl {name}\n' in page, name
  assert '\n## python -m fastpbrl.launch\n' in page
  for parser in (evaluate.parser(), info.parser(), launch.parser()):
    for action in parser._actions:  # noqa: SLF001
      for flag in action.option_strings:
        if flag.startswith('--') and flag != '--help':
          assert f'`{flag}' in page, flag
