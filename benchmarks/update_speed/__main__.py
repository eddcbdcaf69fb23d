"""``python -m benchmarks.update_speed [flags]``: runs ``main``."""

import sys

from benchmarks.update_speed import main
from benchmarks.update_speed.sweep import _exit_on_sigterm

if __name__ == '__main__':
  _exit_on_sigterm()
  sys.exit(main())
