"""``python -m powerflow`` is the same as the ``powerflow`` command."""

import sys

from powerflow.cli import main

sys.exit(main())
