"""Shared timing helper for the benchmarks: best of a few repeats, wall-clock seconds."""

import time


def best_time(func, repeats=3):
    """Return (best seconds, last result) over ``repeats`` calls of ``func()``."""
    best, result = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        result = func()
        best = min(best, time.perf_counter() - start)
    return best, result


def exported(revision, root, folder):
    """Export the package of git ``revision`` of the checkout ``root`` into ``folder`` (by
    ``git archive``); return ``folder``, to import that version from (``PYTHONPATH``)."""
    import subprocess

    archive = subprocess.run(["git", "archive", revision, "sklearn_ebound"], cwd=root,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def run_worker(script, package_root, arguments):
    """Run ``script --worker ARGUMENTS`` in a process importing ``sklearn_ebound`` from
    ``package_root``; return the JSON its last line prints."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(package_root))
    result = subprocess.run([sys.executable, str(script), "--worker", *arguments], env=env,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])
