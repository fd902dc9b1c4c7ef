"""Run every CPU benchmark in turn; each prints its own ratios against a same-run baseline.

    python benchmarks/run_all.py            # full sizes (several minutes)
    python benchmarks/run_all.py --quick    # reduced sizes, a smoke run

The GPU benchmark (``bench_attention_gpu.py``) is run on its own where CUDA is available; the
accuracy runs (masks, tokens, power oracle, pretrained heads and their predictors, the decoder
plan and its peers, the default decoder run) take minutes
to hours and are run on their own, each with its command in its docstring.
"""

import argparse
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).parent
QUICK = {
    "bench_intrinsic_rank_speed.py": ["--n-samples", "20000", "--n-features", "64"],
    "bench_rank_path_cv.py": ["--n-samples", "5000", "--n-features", "32", "--max-rank", "8"],
    "bench_attention_wrapper.py": ["--n-samples", "1024", "--repeats", "2"],
    "bench_recovery_accuracy.py": ["--quick", "--n-jobs", "1"],
    "bench_null_calibration.py": ["--quick", "--n-jobs", "1"],
    "bench_scaling.py": ["--quick"],
    "bench_attention_scale.py": ["--quick"],
    "bench_cli_startup.py": ["--repeats", "3"],
    "bench_diagnostics_overhead.py": ["--repeats", "3"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    for name in QUICK:
        print(f"== {name}")
        sys.argv = [name] + (QUICK[name] if args.quick else [])
        runpy.run_path(str(HERE / name), run_name="__main__")
        print()


if __name__ == "__main__":
    main()
