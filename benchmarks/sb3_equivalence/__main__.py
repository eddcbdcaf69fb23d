"""``python -m benchmarks.sb3_equivalence``: the check's command line
(``benchmarks.sb3_equivalence.cli``)."""

import sys

from benchmarks.sb3_equivalence.cli import main

sys.exit(main())
