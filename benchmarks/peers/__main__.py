"""``python -m benchmarks.peers [flags]``: runs ``main``."""

from benchmarks.peers import main

if __name__ == '__main__':
  main()
