"""``python -m sklearn_ebound`` runs the ``ebound`` command line."""

import sys

from .cli import main

sys.exit(main())
