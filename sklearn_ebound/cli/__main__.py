"""``python -m sklearn_ebound.cli`` runs the ``ebound`` command line."""

import sys

from ._main import main

sys.exit(main())
