"""``fastpbrl bench``: the learner update-speed benchmark (host-side).

The benchmark, ``benchmarks/update_speed/``, ships with the repository and
not with the installed package (it carries PyTorch baselines and result
files). ``fastpbrl bench [flags]`` runs it when it can be imported: from a
checkout's root folder, or wherever ``benchmarks`` is on ``PYTHONPATH``; its
flags are those of ``python -m benchmarks.update_speed --help``. Anywhere
else it ends with a one-line error saying where to run it.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Optional, Sequence

NOT_HERE = ('error: fastpbrl bench runs benchmarks/update_speed/, which '
            'comes with a checkout of the repository, not with the installed '
            'package: run it from the checkout\'s root folder (fastpbrl bench, '
            'or python -m benchmarks.update_speed)')


def load_benchmark(cwd: Optional[str] = None):
  """``benchmarks.update_speed``, importable or found under ``cwd``.

  Raises:
    SystemExit: with ``NOT_HERE`` when neither.
  """
  try:
    return importlib.import_module('benchmarks.update_speed')
  except ImportError:
    pass
  cwd = os.getcwd() if cwd is None else cwd
  if not os.path.isfile(os.path.join(cwd, 'benchmarks', 'update_speed',
                                     '__init__.py')):
    raise SystemExit(NOT_HERE)
  sys.path.insert(0, cwd)  # a checkout's root: its benchmarks/ package
  try:
    return importlib.import_module('benchmarks.update_speed')
  except ImportError as e:
    raise SystemExit(f'{NOT_HERE} ({e})') from None


def main(argv: Optional[Sequence[str]] = None) -> int:
  status = load_benchmark().main(list(sys.argv[1:] if argv is None else argv))
  if status:
    raise SystemExit(status)
  return 0
