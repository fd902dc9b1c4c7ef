"""The documentation builds with warnings as errors, its gallery with a figure per example.

One build serves every check: it runs the examples at their small size (as
tests/test_examples.py does) and is skipped without the docs extra.
"""

import hashlib
import os
import re
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
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("plot_*.py"))


@pytest.fixture(scope="module")
def docs(tmp_path_factory):
    """Build a copy of the docs (generated pages never land in the checkout); return it."""
    tmp = tmp_path_factory.mktemp("docs")
    for folder in ["docs", "examples"]:
        shutil.copytree(ROOT / folder, tmp / folder,
                        ignore=shutil.ignore_patterns("_build", "generated", "auto_examples"))
    out = tmp / "html"
    completed = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         str(tmp / "docs"), str(out)],
        capture_output=True, text=True,
        env={**os.environ, "MPLBACKEND": "Agg", "EBOUND_EXAMPLE_SIZE": "small"},
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return tmp


def test_docs_build_without_warnings(docs):
    for page in ["index.html", "user_guide.html", "api.html", "auto_examples/index.html",
                 "generated/sklearn_ebound.display.RankSweepDisplay.html"]:
        assert (docs / "html" / page).is_file(), page


def _embedded_images(page):
    """The images an HTML page embeds, as paths relative to the page's folder."""
    return set(re.findall(r'<img [^>]*src="([^"]+)"', page.read_text(encoding="utf-8")))


def test_gallery_has_a_figure_per_example(docs):
    images = docs / "docs" / "auto_examples" / "images"
    html = docs / "html"
    gallery = _embedded_images(html / "auto_examples" / "index.html")
    thumbs = {}
    for name in EXAMPLES:
        figure = f"sphx_glr_{name}_001.png"
        thumb = f"sphx_glr_{name}_thumb.png"
        # sphinx-gallery saves the figures the example drew, and a thumbnail of the first ...
        assert (images / figure).is_file(), f"{name} drew no figure in the gallery"
        assert (images / "thumb" / thumb).is_file(), f"{name} has no thumbnail"
        # ... the example's page embeds the figure, the gallery's index the thumbnail ...
        assert f"../_images/{figure}" in _embedded_images(html / "auto_examples" / f"{name}.html")
        assert f"../_images/{thumb}" in gallery, f"the gallery card of {name} has no thumbnail"
        for image in [figure, thumb]:
            assert (html / "_images" / image).read_bytes().startswith(b"\x89PNG"), image
        thumbs[name] = hashlib.sha256((html / "_images" / thumb).read_bytes()).hexdigest()
    # ... and the thumbnails are the examples' own, not one placeholder shared by all.
    assert len(set(thumbs.values())) == len(EXAMPLES), thumbs
