"""Sphinx configuration of the sklearn-ebound documentation.

Build with ``make html`` in this folder, or from the repository root::

    sphinx-build -W -b html docs docs/_build/html

The example gallery is rendered from ``examples/`` without running the scripts (the test
suite runs them). To run them and embed their output and figures, add
``-D plot_gallery=1`` (``make html-examples``).
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

# The gallery. `plot_gallery` is False by default: the examples are executed by the test
# suite (tests/test_examples.py); pass ``-D plot_gallery=1`` to run them here too.
plot_gallery = "False"
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
}



def _skip_metadata_request_methods(app, what, name, obj, skip, options):
    # scikit-learn generates set_{method}_request on every estimator; its docstrings link to
    # scikit-learn's own user guide, so they are left to scikit-learn's documentation.
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_request_methods)


html_theme = "pydata_sphinx_theme"
html_title = f"sklearn-ebound {version}"
html_static_path = []
html_theme_options = {"navigation_with_keys": False}
