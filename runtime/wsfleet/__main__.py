"""``python -m wsfleet``: the operators' CLI (see ``wsfleet.cli``), as the ``wsfleet``
command that ``pip install ./runtime`` installs."""

import sys

from .cli import main

sys.exit(main())
