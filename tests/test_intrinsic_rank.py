"""Data-only recovery of the static intrinsic rank."""

import itertools
import sys
import warnings
from textwrap import indent

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression, Ridge
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from sklearn_ebound import IntrinsicRankEstimator, ReducedRankRegressor
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.exceptions import RankEstimationWarning


def _task(n, p, q, rank, snr, input_corr, noise_corr, seed):
    """Planted task whose weakest direction stands ``snr`` times above the noise bulk.

    The noise part of the fitted values is a ``p x q`` Gaussian matrix whose largest singular
    value is about ``sigma (sqrt(p) + sqrt(q))``; the signal's smallest is ``s_min sqrt(n)``.
    """
    s_min = snr * (np.sqrt(p) + np.sqrt(q)) / np.sqrt(n)
    sv = s_min * np.linspace(2, 1, rank) if rank else None
    return make_static_task(n, p, q, rank=rank, singular_values=sv, noise=1.0,
                            input_correlation=input_corr, noise_correlation=noise_corr,
                            random_state=seed)


RECOVERY_GRID = list(itertools.product(
    [100, 400, 3000],  # n
    [8, 30],  # p
    [6, 20],  # q
    [1, 2, 5],  # r*
    [2.0, 4.0],  # signal-to-noise of the weakest direction
    [0.0, 0.6],  # input correlation
    [0.0, 0.5],  # noise correlation
))


def test_default_recovers_the_planted_rank_on_a_grid():
    hits = []
    for i, (n, p, q, r, snr, rx, re) in enumerate(RECOVERY_GRID):
        X, Y = _task(n, p, q, r, snr, rx, re, seed=i)
        # Correlated noise with too few samples to whiten it is flagged; nothing else is.
        flagged = re > 0 and n <= p + q + 1
        with pytest.warns(RankEstimationWarning) if flagged else _no_warning():
            hits.append(IntrinsicRankEstimator().fit(X, Y).rank_ == r)
    rate = np.mean(hits)
    print(f"recovery rate {rate:.3f} over {len(hits)} planted tasks")
    assert rate >= 0.95


class _no_warning:
    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", RankEstimationWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


@pytest.mark.parametrize("shape", [(60, 5, 5), (300, 30, 6), (2000, 30, 20), (500, 1, 1)])
def test_pure_noise_gives_rank_zero(shape):
    n, p, q = shape
    for seed in range(10):
        rng = np.random.default_rng(seed)
        est = IntrinsicRankEstimator().fit(rng.standard_normal((n, p)), rng.standard_normal((n, q)))
        assert est.rank_ == 0
        assert est.components_.shape == (0, p)


@pytest.mark.parametrize("criterion", ["threshold", "rsc", "cv", "energy"])
def test_every_criterion_recovers_a_clear_task(criterion):
    X, Y = make_static_task(3000, 15, 12, rank=4, noise=0.05, random_state=0)
    est = IntrinsicRankEstimator(criterion=criterion).fit(X, Y)
    assert est.rank_ == 4
    assert est.components_.shape == (4, 15)
    np.testing.assert_allclose(est.components_ @ est.components_.T, np.eye(4), atol=1e-10)


def test_rank_of_x_alone():
    rng = np.random.default_rng(0)
    latent = rng.standard_normal((1000, 3)) @ rng.standard_normal((3, 20)) * 3
    X = latent + 0.1 * rng.standard_normal((1000, 20))
    assert IntrinsicRankEstimator().fit(X).rank_ == 3
    assert IntrinsicRankEstimator().fit(rng.standard_normal((1000, 20))).rank_ == 0
    with pytest.raises(ValueError, match="needs targets"):
        IntrinsicRankEstimator(criterion="rsc").fit(X)


def test_pipeline_reduces_to_the_intrinsic_directions():
    X, Y = make_static_task(2000, 20, 10, rank=3, noise=0.2, random_state=0)
    pipe = make_pipeline(StandardScaler(), IntrinsicRankEstimator(), Ridge(alpha=1e-6)).fit(X, Y)
    assert pipe[1].rank_ == 3
    assert pipe[:-1].transform(X).shape == (2000, 3)
    names = pipe[:-1].get_feature_names_out()
    assert list(names) == [f"intrinsicrankestimator{i}" for i in range(3)]
    # Ridge on the 3 directions predicts as well as the rank-3 regression itself.
    rrr = make_pipeline(StandardScaler(), ReducedRankRegressor(rank=3)).fit(X, Y)
    assert pipe.score(X, Y) == pytest.approx(rrr.score(X, Y), abs=1e-3)
    assert pipe.score(X, Y) > LinearRegression().fit(X, Y).score(X, Y) - 0.01


def test_noise_free_task_is_exact():
    X, Y = make_static_task(200, 10, 8, rank=3, noise=0.0, input_correlation=0.5,
                            random_state=0)
    for criterion in ["threshold", "energy", "rsc"]:
        assert IntrinsicRankEstimator(criterion=criterion).fit(X, Y).rank_ == 3


def test_fewer_residual_dof_than_targets_answers_by_the_rotation_test(monkeypatch):
    # 19 residual degrees of freedom for 25 targets of correlated noise: the canonical test
    # cannot run, the rotation test (exact for any noise covariance) reads the rank alone
    # and has no approximate level to warn about.
    X, Y = make_static_task(30, 10, 25, rank=2, singular_values=[20, 15], noise=0.1,
                            noise_correlation=0.9, random_state=0)
    with _no_warning():
        est = IntrinsicRankEstimator().fit(X, Y)
    assert est.rank_ == 2
    assert est.noise_variance_ == pytest.approx(0.01, rel=0.5)
    assert est.p_values_[:2].max() < 1e-3 < est.p_values_[2]
    # Beyond the Monte Carlo law's budget, the ratio test with its shrinkage estimate.
    monkeypatch.setattr("sklearn_ebound._rules.static_rank_test.ROTATION_BUDGET", 0)
    with pytest.warns(RankEstimationWarning, match="shrinkage estimate"):
        assert IntrinsicRankEstimator().fit(X, Y).rank_ == 2
    # White noise needs no whitening: no warning, and the same answer.
    X, Y = make_static_task(30, 10, 25, rank=2, singular_values=[20, 15], noise=0.1,
                            random_state=0)
    with _no_warning():
        assert IntrinsicRankEstimator().fit(X, Y).rank_ == 2


def test_one_table_decides_which_criterion_reads_which_statistics():
    # The table of statistics kinds is what the errors and the docstring are written from:
    # every criterion it allows reads a rank, every other one is refused with its reason.
    import re
    import warnings

    from sklearn_ebound._rank_statistics import STATISTICS
    from sklearn_ebound.datasets import make_attention_task

    X, Y = make_static_task(300, 6, 5, rank=2, noise=0.3, random_state=0)
    Xs, Ys = make_attention_task("linear", 60, 8, 4, rank=2, value="identity", noise=0.05,
                                 random_state=0)
    data = {
        "inputs": (X, None, {}),
        "static": (X, Y, {}),
        "token_mixing": (Xs, Ys, {"operator": "static"}),
        "per_token": (Xs, Ys, {"operator": "attention", "attention": "linear"}),
        "kernel": (Xs, Ys, {"operator": "attention", "attention": "linear",
                            "value": "identity"}),
    }
    assert set(data) == set(STATISTICS)
    for name, (inputs, targets, params) in data.items():
        entry = STATISTICS[name]
        for criterion in ("threshold", "rsc", "cv", "energy"):
            estimator = IntrinsicRankEstimator(criterion=criterion, cv=3, **params)
            if criterion in entry.criteria:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RankEstimationWarning)
                    rank = estimator.fit(inputs, targets).rank_
                assert isinstance(rank, int) and rank >= 0
            else:
                with pytest.raises(ValueError, match=f"criterion='{criterion}' is not available"
                                                     f".*{re.escape(entry.why)}"):
                    estimator.fit(inputs, targets)
        row = f"- {entry.data}: " + ", ".join(f'``"{c}"``' for c in entry.criteria)
        assert " ".join(row.split()) in " ".join(IntrinsicRankEstimator.__doc__.split())
    # The docstring's list is pasted from the table's own rendering, word for word.
    from sklearn_ebound._rank_statistics import criteria_list

    assert indent(criteria_list(), " " * 8) in IntrinsicRankEstimator.__doc__


def test_float32_in_float32_out():
    X, Y = make_static_task(400, 8, 5, rank=2, noise=0.3, random_state=0)
    X32, Y32 = X.astype(np.float32), Y.astype(np.float32)
    estimator = IntrinsicRankEstimator().fit(X32, Y32)
    projected = estimator.transform(X32)
    assert projected.dtype == np.float32 and estimator.transform(X).dtype == np.float64
    np.testing.assert_allclose(projected, estimator.transform(X), rtol=1e-4, atol=1e-5)
    regressor = ReducedRankRegressor(rank=2).fit(X32, Y32)
    assert regressor.predict(X32).dtype == np.float32
    assert regressor.predict(X).dtype == np.float64
    assert ReducedRankRegressor(rank=1).fit(X32, Y32[:, 0]).predict(X32).dtype == np.float32


def test_pandas_output():
    pd = pytest.importorskip("pandas")
    X, Y = make_static_task(400, 8, 5, rank=2, noise=0.3, random_state=0)
    frame = IntrinsicRankEstimator().set_output(transform="pandas").fit(X, Y).transform(X)
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["intrinsicrankestimator0", "intrinsicrankestimator1"]


def test_pandas_output_names_the_pandas_extra(monkeypatch):
    # pandas is an extra: the README names it beside set_output, and without it the
    # transform says that pandas is what is missing.
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    use = readme[readme.index("## Use"):readme.index("## The main job")]
    around = use[use.index('set_output(transform="pandas")') - 200:][:400]
    assert '".[pandas]"' in around
    install = readme[readme.index("## Install"):readme.index("## Use")]
    assert '".[pandas]"' in install and 'set_output(transform="pandas")' in install
    X, Y = make_static_task(100, 4, 3, rank=1, random_state=0)
    estimator = IntrinsicRankEstimator().set_output(transform="pandas").fit(X, Y)
    monkeypatch.setitem(sys.modules, "pandas", None)  # pandas not installed
    with pytest.raises(ImportError, match="pandas"):
        estimator.transform(X)


def test_rank_zero_in_a_pipeline_is_said_in_the_estimators_words():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((300, 6)), rng.standard_normal((300, 3))
    pipe = make_pipeline(IntrinsicRankEstimator(), Ridge())
    with pytest.warns(RankEstimationWarning, match=r"intrinsic rank is 0.*shape \(300, 0\)"):
        with pytest.raises(ValueError, match="0 feature"):
            pipe.fit(X, Y)
    assert IntrinsicRankEstimator().fit(X, Y).transform(X).shape == (300, 0)


def _more_inputs_than_samples(seed, input_rank=None, rank=5, noise=True):
    """The reduced-rank-regression simulation with ``p > n``: n=40, p=100, q=50, rank 5 (the
    inputs of rank ``input_rank``, or full)."""
    rng = np.random.default_rng(seed)
    n, p, q = 40, 100, 50
    if input_rank is None:
        X = rng.standard_normal((n, p))
    else:
        X = rng.standard_normal((n, input_rank)) @ rng.standard_normal((input_rank, p))
    B = rng.standard_normal((p, rank)) @ rng.standard_normal((rank, q)) / np.sqrt(p)
    return X, X @ B * (1.0 if input_rank is None else 0.3) + rng.standard_normal((n, q))


@pytest.mark.parametrize("input_rank", [10, None])
def test_more_inputs_than_samples(input_rank):
    # rank(X) = 10 < n: the 10-dimensional row space leaves 29 residual degrees of freedom and
    # the Tracy–Widom test runs as usual. Full rank (39 = n - 1): no residual degrees of
    # freedom; the noise level comes from the median singular value and the same sequential
    # test runs, each step at about the level while the rank is small.
    ranks, null = [], []
    for seed in range(10):
        X, Y = _more_inputs_than_samples(seed, input_rank)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RankEstimationWarning)
            estimator = IntrinsicRankEstimator().fit(X, Y)
            ranks.append(estimator.rank_)
            noise = np.random.default_rng(100 + seed).standard_normal(Y.shape)
            null.append(IntrinsicRankEstimator().fit(X, noise).rank_)
        low, high = estimator.rank_interval_
        assert low == estimator.rank_ <= high
        assert estimator.detection_limit_ > 0
    assert ranks == [5] * 10
    assert null == [0] * 10
