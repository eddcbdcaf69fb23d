"""MkDocs hook: the repository files that the pages link to become part of
the site, so that a link to code or to a result file opens it (build-time,
host-side; ``hooks:`` in ``mkdocs.yml``).

The pages link to files outside ``docs/`` by their path in the repository
(``../examples/api_example.py``, ``../../benchmarks/results/cpu/``), which
also works on GitHub and in an editor. A site holds only what is under
``docs/``, so this hook adds each such file under ``repo/`` in the site, at
its path in the repository, and rewrites the page's link to it:

* Python, shell and config files: a page showing the source
  (``repo/examples/api_example.py/``);
* Markdown files: a page (their own relative links are rewritten alike);
* a folder: a page listing its files and folders, each served in turn;
* anything else (JSON, CSV, PNG, text): the file itself, copied.

Everything comes from the checkout: the build reads no network and stays
right for the commit it is built from, where links to a hosted repository
would show another commit's files (``docs/libraries.md``). A link that
resolves to nothing is left as written, for MkDocs to report (strict mode:
the build fails).
"""

from __future__ import annotations

import os
import re

from mkdocs.structure.files import File, Files

SITE_FOLDER = 'repo'
LINK = re.compile(r'(\]\()([^)\s]+)(\))')
FENCE = re.compile(r'^ *(`{3,}|~{3,}).*?^ *\1', re.S | re.M)
SOURCE = {'.py': 'python', '.sh': 'bash', '.toml': 'toml', '.yml': 'yaml',
          '.yaml': 'yaml', '.cfg': 'ini'}


def _root(config) -> str:
  return os.path.dirname(os.path.abspath(config.config_file_path))


def _site_path(rel: str, root: str) -> str:
  """Where the repository path ``rel`` is in the site (a docs path)."""
  full = os.path.join(root, rel)
  if os.path.isdir(full):
    return f'{SITE_FOLDER}/{rel}/index.md'
  if os.path.splitext(rel)[1] in SOURCE:
    return f'{SITE_FOLDER}/{rel}.md'
  return f'{SITE_FOLDER}/{rel}'


def _outside_code(text: str, replace) -> str:
  """``LINK.sub(replace, text)`` outside fenced code blocks."""
  parts, end = [], 0
  for fence in FENCE.finditer(text):
    parts += [LINK.sub(replace, text[end:fence.start()]), fence.group(0)]
    end = fence.end()
  return ''.join(parts + [LINK.sub(replace, text[end:])])


def _linked(path: str, root: str, docs: str) -> set[str]:
  """Repository paths (files or folders outside ``docs``) that the Markdown
  file ``path`` links to."""
  found = set()

  def note(match):
    target = match.group(2).partition('#')[0]
    if target and not re.match(r'[a-z]+:', target):
      full = os.path.normpath(os.path.join(os.path.dirname(path), target))
      if (full.startswith(root + os.sep) and not full.startswith(docs + os.sep)
          and full != docs and os.path.exists(full)):
        found.add(os.path.relpath(full, root))
    return match.group(0)

  with open(path, encoding='utf-8') as f:
    _outside_code(f.read(), note)
  return found


def _listing(rel: str, root: str) -> str:
  """A folder's page: its folders, then its files, each linked."""
  lines = [f'# `{rel}/`', '']
  names = sorted(os.listdir(os.path.join(root, rel)))
  for name in names:
    if name.startswith('.') or name == '__pycache__':
      continue
    child = f'{rel}/{name}'
    target = os.path.relpath(_site_path(child, root),
                             f'{SITE_FOLDER}/{rel}')
    slash = '/' if os.path.isdir(os.path.join(root, child)) else ''
    lines.append(f'- [`{name}{slash}`]({target})')
  return '\n'.join(lines) + '\n'


def _source_page(rel: str, root: str) -> str:
  with open(os.path.join(root, rel), encoding='utf-8') as f:
    source = f.read()
  fence = '`' * max([3, *(len(run) + 1 for run in re.findall('`+', source))])
  language = SOURCE[os.path.splitext(rel)[1]]
  return f'# `{rel}`\n\n{fence}{language}\n{source}\n{fence}\n'


def on_files(files: Files, config) -> Files:
  """Adds every repository file or folder the pages link to (and, for a
  folder or a Markdown file, what it links to in turn)."""
  root, docs = _root(config), os.path.abspath(config.docs_dir)
  todo = set()
  for page in files.documentation_pages():
    todo |= _linked(page.abs_src_path, root, docs)
  done = set()
  while todo:
    rel = todo.pop()
    done.add(rel)
    full = os.path.join(root, rel)
    site_path = _site_path(rel, root)
    if os.path.isdir(full):
      file = File.generated(config, site_path, content=_listing(rel, root))
      children = {f'{rel}/{name}' for name in os.listdir(full)
                  if not name.startswith('.') and name != '__pycache__'}
      todo |= children - done
    elif site_path.endswith('.md') and not rel.endswith('.md'):
      file = File.generated(config, site_path, content=_source_page(rel, root))
    else:
      file = File.generated(config, site_path, abs_src_path=full)
      if rel.endswith('.md'):
        todo |= _linked(full, root, docs) - done
    files.append(file)
  return files


def on_page_markdown(markdown: str, page, config, files) -> str:
  """Rewrites a link to a repository file outside ``docs`` into a link to
  its copy in the site, relative to the page."""
  if page.file.abs_src_path is None:  # a folder's or a source file's page
    return markdown
  root, docs = _root(config), os.path.abspath(config.docs_dir)
  here = os.path.dirname(page.file.src_uri)

  def rewrite(match):
    target = match.group(2)
    path, hash_, anchor = target.partition('#')
    if not path or re.match(r'[a-z]+:', path):
      return match.group(0)
    full = os.path.normpath(os.path.join(
        os.path.dirname(page.file.abs_src_path), path))
    if full == docs or full.startswith(docs + os.sep):
      site_path = os.path.relpath(full, docs)
    elif full.startswith(root + os.sep) and os.path.exists(full):
      site_path = _site_path(os.path.relpath(full, root), root)
    else:
      return match.group(0)
    new = os.path.relpath(site_path, here or '.') + hash_ + anchor
    return match.group(1) + new + match.group(3)

  return _outside_code(markdown, rewrite)
