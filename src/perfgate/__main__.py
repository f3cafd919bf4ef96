"""``python -m perfgate`` is the ``perfgate`` command."""

import sys

from perfgate.cli import main

sys.exit(main())
