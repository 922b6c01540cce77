"""``python -m sim.demo``: see :mod:`.cli`."""

import sys

from .cli import main

sys.exit(main())
