"""The ``ebound`` command line: the Entropic Bound on a planted task or on your own data.

Every command prints a human-readable report, or one JSON document with ``--json``; files go
to ``--out`` only. Errors end with a one-line message and a non-zero exit code.

The commands live one module per command (or group): ``_demo``, ``_estimate``,
``_experiments`` (sweep, ladder, frontier) and ``_heads``, on the shared ``_core``. Each
imports scikit-learn, scipy, torch, matplotlib or transformers only when it runs (the package
itself loads its names lazily), so that ``ebound --help`` and an argument error answer about
as fast as ``import numpy``.
"""

from ._core import CLIError
from ._main import build_parser, main

__all__ = ["main", "build_parser", "CLIError"]
