"""The documentation builds with warnings as errors, its gallery with a figure per example.

One build serves every check (the ``docs_build`` fixture of conftest.py, shared with
tests/test_examples.py): it runs the examples at their small size and is skipped without the
docs extra.
"""

import hashlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("plot_*.py"))


@pytest.fixture(scope="module")
def docs(docs_build):
    """The built copy of the docs, once sphinx has built it without a warning."""
    assert docs_build.status == 0, docs_build.log
    return docs_build.root


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
