"""``python -m rlbook train ...``: the same as the console script ``rlbook`` (see :mod:`rlbook.cli`)."""

import sys

from rlbook.cli import main

sys.exit(main())
