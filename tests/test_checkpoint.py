"""An interrupted rank sweep keeps every finished rank; a rerun computes only the rest."""

import json

import joblib
import numpy as np
import pytest
from sklearn.base import BaseEstimator, RegressorMixin

from sklearn_ebound import ReducedRankRegressor
from sklearn_ebound.datasets import make_static_task
from sklearn_ebound.experiments import rank_sweep
from sklearn_ebound.experiments._sweep import _read_checkpoint, _write_checkpoint

_X, _Y = make_static_task(120, 6, rank=2, noise=0.3, random_state=0)
_RANKS = [0, 1, 2, 3, 4]

# GridSearchCV clones the estimator, so fits are counted (and failures planted) here, not on
# the instances. The fail rank is not a parameter: it must not change the checkpoint settings.
_FITS = []
_FAIL = {"rank": None, "error": KeyboardInterrupt}


class _Probe(RegressorMixin, BaseEstimator):
    """ReducedRankRegressor that logs each fit and raises at the planted rank."""

    def __init__(self, rank=None):
        self.rank = rank

    def fit(self, X, y):
        _FITS.append(self.rank)
        if self.rank == _FAIL["rank"]:
            raise _FAIL["error"](f"interrupted at rank {self.rank}")
        self.model_ = ReducedRankRegressor(rank=self.rank).fit(X, y)
        return self

    def predict(self, X):
        return self.model_.predict(X)


@pytest.fixture(autouse=True)
def _reset_probe():
    _FITS.clear()
    _FAIL["rank"] = None
    yield
    _FITS.clear()
    _FAIL["rank"] = None


def _stored(directory):
    return sorted(int(p.stem.split("-")[1]) for p in directory.glob("rank-*.json"))


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_interrupted_sweep_resumes_with_missing_ranks_only(tmp_path, error):
    expected = rank_sweep(_Probe(), _X, _Y, _RANKS, cv=3)
    _FITS.clear()
    _FAIL.update(rank=3, error=error)
    with pytest.raises(error, match="interrupted at rank 3"):
        rank_sweep(_Probe(), _X, _Y, _RANKS, cv=3, checkpoint=tmp_path)
    # The ranks finished before the interrupt are on disk, nothing else (no temp files).
    assert _stored(tmp_path) == [0, 1, 2]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank-{r}.json" for r in (0, 1, 2)]

    _FITS.clear()
    _FAIL["rank"] = None
    resumed = rank_sweep(_Probe(), _X, _Y, _RANKS, cv=3, checkpoint=tmp_path)
    assert sorted(_FITS) == [3, 3, 3, 4, 4, 4]
    assert _stored(tmp_path) == _RANKS
    assert resumed.to_dict() == expected.to_dict()
    assert resumed.knee == expected.knee

    # A third run reads everything back and fits nothing.
    _FITS.clear()
    again = rank_sweep(_Probe(), _X, _Y, _RANKS[::-1], cv=3, checkpoint=tmp_path)
    assert _FITS == [] and again.to_dict() == expected.to_dict()


def test_extending_the_grid_computes_only_new_ranks(tmp_path):
    rank_sweep(_Probe(), _X, _Y, [0, 1], cv=3, checkpoint=tmp_path)
    _FITS.clear()
    result = rank_sweep(_Probe(), _X, _Y, [0, 1, 2, 3], cv=3, checkpoint=tmp_path)
    assert sorted(_FITS) == [2, 2, 2, 3, 3, 3]
    assert result.to_dict()["rows"] == rank_sweep(_Probe(), _X, _Y, [0, 1, 2, 3],
                                                  cv=3).to_dict()["rows"]


def test_parallel_groups_write_every_rank(tmp_path):
    # 4 workers, 2 folds: groups of two ranks, each group one GridSearchCV.
    expected = rank_sweep(ReducedRankRegressor(), _X, _Y, _RANKS, cv=2)
    with joblib.parallel_backend("threading", n_jobs=4):
        result = rank_sweep(ReducedRankRegressor(), _X, _Y, _RANKS, cv=2, n_jobs=4,
                            checkpoint=tmp_path)
    assert _stored(tmp_path) == _RANKS
    np.testing.assert_allclose(result.column("risk"), expected.column("risk"), rtol=1e-12)


@pytest.mark.parametrize("change, differing", [
    (dict(cv=4), "cv_splits"),
    (dict(estimator=ReducedRankRegressor(alpha=1.0)), "estimator_params"),
    (dict(y=_Y + 1.0), "Y"),
])
def test_checkpoint_from_other_settings_is_refused(tmp_path, change, differing):
    rank_sweep(ReducedRankRegressor(), _X, _Y, [0, 1], cv=3, checkpoint=tmp_path)
    kwargs = dict(estimator=ReducedRankRegressor(), X=_X, y=_Y, ranks=[0, 1], cv=3)
    kwargs.update(change)
    with pytest.raises(ValueError, match=rf"`checkpoint` holds rank 0 .*differing: .*{differing}"):
        rank_sweep(**kwargs, checkpoint=tmp_path)


def test_checkpoint_files_are_strict_json_and_keep_non_finite_scores(tmp_path):
    settings = {"format": 1}
    _write_checkpoint(tmp_path, 7, [1.5, np.nan, -np.inf], settings)
    text = (tmp_path / "rank-7.json").read_text()

    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    record = json.loads(text, parse_constant=refuse)
    assert record["rank"] == 7 and record["settings"] == settings
    scores = _read_checkpoint(tmp_path, 7, settings)
    assert scores[0] == 1.5 and np.isnan(scores[1]) and scores[2] == -np.inf
    assert _read_checkpoint(tmp_path, 8, settings) is None


def test_foreign_file_in_checkpoint_is_refused(tmp_path):
    (tmp_path / "rank-0.json").write_text("not json")
    with pytest.raises(ValueError, match="`checkpoint` file rank-0.json is not a rank-sweep"):
        rank_sweep(ReducedRankRegressor(), _X, _Y, [0, 1], cv=3, checkpoint=tmp_path)
