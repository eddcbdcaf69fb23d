"""``python -m benchmarks.learning``: the learning benchmark's command line
(``benchmarks.learning.cli``)."""

from benchmarks.learning.cli import main

main()
