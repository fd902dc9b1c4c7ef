"""ReducedRankRegressorCV (one decomposition per fold) against GridSearchCV refits.

Both must select the same rank with the same per-rank scores (1e-8 relative); target: the
rank path at least 20x faster.

    python benchmarks/bench_rank_path_cv.py [--n-samples 200000] [--n-features 256]
"""

import argparse

import numpy as np
from _timing import best_time
from sklearn.model_selection import GridSearchCV, KFold

from sklearn_ebound import ReducedRankRegressor, ReducedRankRegressorCV
from sklearn_ebound.datasets import make_static_task


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=200_000)
    parser.add_argument("--n-features", type=int, default=256)
    parser.add_argument("--max-rank", type=int, default=32)
    args = parser.parse_args(argv)
    X, Y = make_static_task(args.n_samples, args.n_features, rank=8, decay=0.8, noise=1.0,
                            random_state=0)
    ranks = list(range(1, args.max_rank + 1))
    cv = KFold(5)
    t_path, path = best_time(lambda: ReducedRankRegressorCV(ranks=ranks, cv=cv).fit(X, Y), 1)
    t_grid, grid = best_time(
        lambda: GridSearchCV(ReducedRankRegressor(), {"rank": ranks}, cv=cv).fit(X, Y), 1)
    a = path.cv_results_["mean_test_score"]
    b = grid.cv_results_["mean_test_score"]
    rel = float(np.max(np.abs(a - b) / np.abs(b)))
    same_rank = path.rank_ == grid.best_params_["rank"]
    speedup = t_grid / t_path
    print(f"N={args.n_samples} p=q={args.n_features} ranks 1..{args.max_rank}, 5 folds")
    print(f"  GridSearchCV refits          {t_grid:8.2f} s   rank={grid.best_params_['rank']}")
    print(f"  ReducedRankRegressorCV path  {t_path:8.2f} s   rank={path.rank_}")
    print(f"  same rank: {same_rank}   max relative score difference: {rel:.2e} (<= 1e-8)")
    print(f"  speed-up {speedup:6.1f}x  (target >= 20)  {'ok' if speedup >= 20 else 'MISSED'}")
    return {"speedup": speedup, "same_rank": same_rank, "max_rel_score_diff": rel}


if __name__ == "__main__":
    main()
