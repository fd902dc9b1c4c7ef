"""The documentation builds with warnings as errors (skipped without the docs extra)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")
pytest.importorskip("sphinx_gallery")
pytest.importorskip("pydata_sphinx_theme")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_without_warnings(tmp_path):
    # Build a copy, so that generated pages never land in the checkout.
    for folder in ["docs", "examples"]:
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("_build", "generated", "auto_examples"))
    out = tmp_path / "html"
    completed = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(tmp_path / "docs"), str(out)],
        capture_output=True, text=True, env={**os.environ, "MPLBACKEND": "Agg"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    for page in ["index.html", "user_guide.html", "api.html", "auto_examples/index.html",
                 "generated/sklearn_ebound.display.RankSweepDisplay.html"]:
        assert (out / page).is_file(), page
