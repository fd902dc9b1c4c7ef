"""Start-up time of the ``ebound`` command line against ``python -c "import numpy"``.

``ebound --help`` and an argument error must answer at most 3x the time of importing numpy,
measured in the same run (best of ``--repeats`` fresh processes each): the parser is built
without scikit-learn, scipy, torch, matplotlib or transformers.

    python benchmarks/bench_cli_startup.py [--repeats 7]
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from _timing import best_time

TARGET = 3.0


def _command():
    """The installed ``ebound`` entry point beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("ebound")
    if script.is_file():
        return [str(script)]
    found = shutil.which("ebound")
    return [found] if found else [sys.executable, "-m", "sklearn_ebound"]


def _run(argv, expect):
    completed = subprocess.run(argv, capture_output=True, text=True)
    if completed.returncode != expect:
        raise RuntimeError(f"{' '.join(argv)} exited {completed.returncode}, not {expect}: "
                           f"{completed.stderr.strip()}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    ebound = _command()
    cases = {
        'python -c "import numpy"': ([sys.executable, "-c", "import numpy"], 0),
        "ebound --help": ([*ebound, "--help"], 0),
        "ebound demo --rank x (argument error)": ([*ebound, "demo", "--rank", "x"], 2),
    }
    times = {name: best_time(lambda a=a, e=e: _run(a, e), args.repeats)[0]
             for name, (a, e) in cases.items()}
    baseline = times['python -c "import numpy"']
    print(f"best of {args.repeats} fresh processes, {' '.join(ebound)}")
    width = max(len(name) for name in times) + 8
    for name, seconds in times.items():
        print(f"  {name:{width}s} {seconds:7.3f} s")
    ratios = {name: seconds / baseline for name, seconds in list(times.items())[1:]}
    for name, ratio in ratios.items():
        print(f"  {'ratio, ' + name:{width}s} {ratio:7.2f}   (target <= {TARGET:g})  "
              f"{'ok' if ratio <= TARGET else 'MISSED'}")
    return {"baseline_s": baseline, "ratios": ratios}


if __name__ == "__main__":
    main()
