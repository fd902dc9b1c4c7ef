"""Sphinx configuration of the sklearn-ebound documentation.

Build with ``make html`` in this folder, or from the repository root::

    EBOUND_EXAMPLE_SIZE=small sphinx-build -W -b html docs docs/_build/html

The build runs every example of the gallery (``examples/plot_*.py``) and embeds what it
prints and draws. ``EBOUND_EXAMPLE_SIZE=small`` runs them on the small problems of the test
suite; without it they run at their full size, in about twice the time. ``-D plot_gallery=0``
(``make html-noplot``) renders the examples as code only, without running them.

A later build reruns only the examples that changed, unless the size changed too: the size of
the last run is kept beside the gallery's pages (``auto_examples/.example_size``).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("MPLBACKEND", "Agg")

import sklearn_ebound  # noqa: E402

project = "sklearn-ebound"
author = "The sklearn-ebound developers"
copyright = "The sklearn-ebound developers"
version = release = sklearn_ebound.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "sphinx_gallery.gen_gallery",
]

templates_path = ["_templates"]
exclude_patterns = ["_build", "auto_examples/*.ipynb", "auto_examples/*.py"]
root_doc = "index"
default_role = "literal"

# API pages: one generated page per public name.
autosummary_generate = True
autodoc_default_options = {"inherited-members": False}
# The class template (_templates/autosummary/class.rst) documents the members with autodoc;
# numpydoc's member tables would repeat them.
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

# The gallery runs every example (sphinx-gallery's `plot_gallery`, on unless
# ``-D plot_gallery=0``) at the size the examples read from EBOUND_EXAMPLE_SIZE.
plot_gallery = "True"
EXAMPLE_SIZE = "small" if os.environ.get("EBOUND_EXAMPLE_SIZE") == "small" else "full"
_SIZE_FILE = Path(__file__).resolve().parent / "auto_examples" / ".example_size"


def _last_example_size():
    """The size the gallery's examples last ran at, or None before the first run."""
    return _SIZE_FILE.read_text().strip() if _SIZE_FILE.is_file() else None


sphinx_gallery_conf = {
    "examples_dirs": "../examples",
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "reset_modules": ("matplotlib",),
    "within_subsection_order": "FileNameSortKey",
    "remove_config_comments": True,
    # No sg_execution_times.rst in the source folder.
    "write_computation_times": False,
    # sphinx-gallery skips an example whose source has not changed since it last ran; its
    # output is stale too when it ran at another size.
    "run_stale_examples": _last_example_size() != EXAMPLE_SIZE,
}


def _skip_metadata_request_methods(app, what, name, obj, skip, options):
    # scikit-learn generates set_{method}_request on every estimator; its docstrings link to
    # scikit-learn's own user guide, so they are left to scikit-learn's documentation.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def _record_example_size(app, exception):
    # Only a build that ran the examples, to its end, makes their output of this size.
    if exception is None and app.config.sphinx_gallery_conf["plot_gallery"]:
        _SIZE_FILE.parent.mkdir(parents=True, exist_ok=True)
        _SIZE_FILE.write_text(EXAMPLE_SIZE + "\n")


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_methods)
    app.connect("build-finished", _record_example_size)


html_theme = "pydata_sphinx_theme"
html_title = f"sklearn-ebound {version}"
html_static_path = []
html_theme_options = {"navigation_with_keys": False}
