"""``python -m audiomask``: the same as the ``audiomask`` command."""

import sys

from audiomask.cli import main

sys.exit(main())
