"""Start-up of ``ebound`` and of ``import sklearn_ebound``: nothing heavy before it is used.

Not a timing test (machines are noisy; ``benchmarks/bench_cli_startup.py`` measures the time):
each check runs in a fresh interpreter and inspects ``sys.modules``.
"""

import json
import subprocess
import sys

import pytest

import sklearn_ebound

HEAVY = ["sklearn", "scipy", "torch", "matplotlib", "transformers"]


def _fresh(code):
    """Run ``code`` in a fresh interpreter; returns the JSON it prints last."""
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def _heavy_loaded():
    return ("import json, sys; print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} "
            f"& set({HEAVY!r}))))")


def test_import_of_the_package_and_cli_loads_nothing_heavy():
    assert _fresh("import sklearn_ebound, sklearn_ebound.cli; " + _heavy_loaded()) == []


def test_parser_and_every_help_load_nothing_heavy():
    # The parser and the help of the top level and of every command; each --help exits.
    code = ("import contextlib, io\n"
            "from sklearn_ebound.cli import build_parser, main\n"
            "build_parser().format_help()\n"
            "for argv in [[], ['demo'], ['estimate'], ['sweep'], ['ladder'], ['frontier'],"
            " ['heads']]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()):\n"
            "        try:\n"
            "            main([*argv, '--help'])\n"
            "        except SystemExit:\n"
            "            pass\n" + _heavy_loaded())
    assert _fresh(code) == []


def test_argument_error_loads_nothing_heavy():
    code = ("import contextlib, io\n"
            "from sklearn_ebound.cli import main\n"
            "with contextlib.redirect_stderr(io.StringIO()):\n"
            "    try:\n"
            "        main(['demo', '--rank', 'x'])\n"
            "    except SystemExit:\n"
            "        pass\n" + _heavy_loaded())
    assert _fresh(code) == []


def test_python_dash_m_help_loads_nothing_heavy():
    code = ("import contextlib, io, runpy, sys\n"
            "sys.argv = ['sklearn_ebound', '--help']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        runpy.run_module('sklearn_ebound', run_name='__main__')\n"
            "    except SystemExit:\n"
            "        pass\n" + _heavy_loaded())
    assert _fresh(code) == []


def test_every_public_name_loads_on_access():
    # In a fresh interpreter: each name of __all__ resolves, as an attribute and by import.
    code = ("import json, sklearn_ebound\n"
            "names = list(sklearn_ebound.__all__)\n"
            "ok = [n for n in names if getattr(sklearn_ebound, n) is not None]\n"
            "exec('from sklearn_ebound import ' + ', '.join(names))\n"
            "print(json.dumps(ok))")
    assert _fresh(code) == sklearn_ebound.__all__


@pytest.mark.parametrize("name", sklearn_ebound.__all__)
def test_public_names_are_the_defining_modules_objects(name):
    value = getattr(sklearn_ebound, name)
    module = sys.modules[value.__module__]
    assert getattr(module, value.__name__) is value
    exec(f"from sklearn_ebound import {name} as imported", namespace := {})
    assert namespace["imported"] is value
    assert name in dir(sklearn_ebound)


def test_version_all_and_errors():
    assert sklearn_ebound.__version__ == "0.1.0"
    assert len(set(sklearn_ebound.__all__)) == len(sklearn_ebound.__all__)
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        sklearn_ebound.not_a_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from sklearn_ebound import not_a_name", {})


def test_subpackages_are_attributes():
    code = ("import json, sklearn_ebound\n"
            "print(json.dumps([sklearn_ebound.exceptions.__name__, "
            "sklearn_ebound.datasets.__name__]))")
    assert _fresh(code) == ["sklearn_ebound.exceptions", "sklearn_ebound.datasets"]
