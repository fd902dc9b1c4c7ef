"""IntrinsicRankEstimator against PCA(n_components="mle") and the X.T @ X floor.

Targets (issue: the static Entropic Bound): at most 0.25x PCA-mle's time, within 4x of one
``X.T @ X`` (the estimator cannot beat reading the data once).

    python benchmarks/bench_intrinsic_rank_speed.py [--n-samples 200000] [--n-features 256]
        [--noise-correlation 0.5]

With ``--noise-correlation`` the residuals are not white, and the default criterion takes its
correlated-noise path (the fitted values against the residuals, and the canonical correlations).
"""

import argparse

from _timing import best_time
from sklearn.decomposition import PCA

from sklearn_ebound import IntrinsicRankEstimator
from sklearn_ebound.datasets import make_static_task


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-samples", type=int, default=200_000)
    parser.add_argument("--n-features", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--noise-correlation", type=float, default=0.0)
    args = parser.parse_args(argv)
    X, Y = make_static_task(args.n_samples, args.n_features, rank=8, noise=0.5,
                            noise_correlation=args.noise_correlation, random_state=0)

    t_floor, _ = best_time(lambda: X.T @ X, args.repeats)
    t_ours, est = best_time(lambda: IntrinsicRankEstimator().fit(X, Y), args.repeats)
    t_pca, pca = best_time(lambda: PCA(n_components="mle").fit(X), max(1, args.repeats - 2))

    print(f"N={args.n_samples} p=q={args.n_features} noise correlation {args.noise_correlation}")
    print(f"  X.T @ X (floor)              {t_floor:8.3f} s")
    print(f"  IntrinsicRankEstimator       {t_ours:8.3f} s   rank_={est.rank_}")
    print(f"  PCA(n_components='mle')      {t_pca:8.3f} s   n_components_={pca.n_components_}")
    ratio_pca, ratio_floor = t_ours / t_pca, t_ours / t_floor
    print(f"  ratio to PCA-mle   {ratio_pca:6.3f}  (target <= 0.25)  "
          f"{'ok' if ratio_pca <= 0.25 else 'MISSED'}")
    print(f"  ratio to X.T @ X   {ratio_floor:6.3f}  (target <= 4)     "
          f"{'ok' if ratio_floor <= 4 else 'MISSED'}")
    return {"ratio_to_pca_mle": ratio_pca, "ratio_to_gram": ratio_floor}


if __name__ == "__main__":
    main()
