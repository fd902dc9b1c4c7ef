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


def agreement(old, new, index):
    """How many of the fits ``index`` two versions' runs read with the same ``"rank"`` and the
    same ``"interval"``, and the pairs of fits that differ."""
    same_rank = sum(old[i]["rank"] == new[i]["rank"] for i in index)
    same_interval = sum(old[i]["interval"] == new[i]["interval"] for i in index)
    differences = [(old[i], new[i]) for i in index
                   if (old[i]["rank"], old[i]["interval"]) != (new[i]["rank"], new[i]["interval"])]
    return same_rank, same_interval, differences


def print_totals(total_old, total_new, differences, case):
    """Print the two versions' total CPU seconds, their ratio and the fits that differ (named
    by the fields ``case``); return the ratio."""
    print(f"all fits: {total_old:.2f} s against {total_new:.2f} s, ratio "
          f"{total_old / total_new:.2f}")
    for a, b in differences:
        print(f"differs: {case} = {a['case']}: rank {a['rank']} -> {b['rank']}, "
              f"interval {a['interval']} -> {b['interval']}")
    return total_old / total_new
