"""Entry point of ``python -m perfgate.harness``; see :mod:`perfgate.harness.launch`."""

import sys

from perfgate.harness.launch import main

if __name__ == "__main__":
    sys.exit(main())
