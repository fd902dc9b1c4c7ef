"""The suite's own machinery: under pytest-xdist the docs tests share one worker, which builds
the docs once, and a second build in one run fails it (conftest.py)."""

from pathlib import Path

import pytest
from conftest import (
    DOCS_GROUP,
    HEAVY_TESTS,
    SHARED_FIXTURE_GROUPS,
    _claim_the_docs_build,
    _in_docs_group,
    _shared_fixture_group,
    pytest_xdist_make_scheduler,
)

IDS = ["tests/test_docs.py::test_docs_build_without_warnings",
       "tests/test_a.py::test_one",
       "tests/test_examples.py::test_example[plot_x.py]",
       "tests/test_a.py::test_two[x@y]",
       "tests/test_docs.py::test_gallery_has_a_figure_per_example@docs",  # older xdist's id
       "tests/test_b.py::test_three"]


class _Config:
    """What a pytest-xdist scheduler reads of the configuration: two workers."""

    def __init__(self, dist):
        self.dist, self.loadscopereorder, self.maxschedchunk = dist, True, None

    def getoption(self, name, default=None):
        return getattr(self, name, default)

    def getvalue(self, name):
        return {"tx": ["2*popen"]}[name]

    @property
    def option(self):
        return self


class _Worker:
    """A worker that records the indices of the tests it is sent."""

    def __init__(self, name):
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent, self.shutting_down = [], False

    def send_runtest_some(self, indices):
        self.sent.extend(indices)

    def send_runtest_all(self):  # pragma: no cover - not used by the scope schedulers
        raise AssertionError

    def shutdown(self):
        self.shutting_down = True


def test_docs_tests_are_one_group_by_their_file():
    assert [_in_docs_group(nodeid) for nodeid in IDS] == [True, False, True, False, True,
                                                          False]


@pytest.mark.parametrize("dist", ["load", "loadgroup"])
def test_the_scheduler_sends_every_docs_test_to_the_first_worker(dist):
    pytest.importorskip("xdist")
    scheduler = pytest_xdist_make_scheduler(_Config(dist), None)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, IDS)
    scheduler.schedule()
    docs = {i for i, nodeid in enumerate(IDS) if _in_docs_group(nodeid)}
    # The docs group is the first work unit of the first worker, none of it elsewhere.
    assert set(workers[0].sent[:len(docs)]) == docs
    assert not docs & set(workers[1].sent)
    assert scheduler._split_scope(IDS[1]) == IDS[1]  # other tests are units of their own
    assert scheduler._split_scope(IDS[0]) == DOCS_GROUP


SHARED = ["tests/test_dask.py::test_one",
          "tests/test_heads_shrink.py::test_written_model_reloads_with_the_kept_widths[a-b]",
          "tests/test_heads_shrink.py::test_only_a_model_whose_dropped_channels_are_zero_is_"
          "written",
          "tests/test_dask.py::test_two[x]"]


def test_tests_sharing_a_costly_fixture_are_one_work_unit_on_one_worker():
    pytest.importorskip("xdist")
    assert [_shared_fixture_group(nodeid) for nodeid in SHARED] == [
        "test_dask.py::client", "test_heads_shrink.py::written", None, "test_dask.py::client"]
    scheduler = pytest_xdist_make_scheduler(_Config("loadgroup"), None)
    workers = [_Worker("gw0"), _Worker("gw1")]
    ids = IDS + SHARED
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, ids)
    scheduler.schedule()
    dask = {ids.index(SHARED[0]), ids.index(SHARED[3])}
    assert dask <= set(workers[0].sent) or dask <= set(workers[1].sent)
    # The docs group, the largest unit, is still the first one of the first worker.
    docs = {i for i, nodeid in enumerate(ids) if _in_docs_group(nodeid)}
    assert set(workers[0].sent[:len(docs)]) == docs


def test_every_shared_fixture_entry_names_a_test_that_uses_it():
    tests = Path(__file__).resolve().parent
    for fixture, entries in SHARED_FIXTURE_GROUPS.items():
        for entry in entries:
            module, _, function = entry.partition("::")
            source = (tests / module).read_text(encoding="utf-8")
            assert f"def {fixture}(" in source, entry  # the module-scoped fixture itself
            if function:
                signature = source.split(f"def {function}(", 1)[1].split(")", 1)[0]
                assert fixture in signature, entry


def test_the_docs_group_is_the_largest_work_unit(request):
    # The scheduler queues the work units largest first: the docs build must stay first.
    order = [item.nodeid for item in request.session.items]
    if not all(any(nodeid.split("::")[0].endswith(name) for nodeid in order)
               for name in ("test_docs.py", "test_dask.py", "test_heads_shrink.py")):
        pytest.skip("needs the whole suite collected")
    groups = [_shared_fixture_group(nodeid) for nodeid in order]
    docs = sum(map(_in_docs_group, order))
    for fixture in {group for group in groups if group}:
        assert 1 < groups.count(fixture) < docs, fixture


def test_other_distributions_keep_their_scheduler():
    assert pytest_xdist_make_scheduler(_Config("loadfile"), None) is None


class _TempPaths:
    def __init__(self, root, worker):
        self.root, self.worker = root, worker

    def getbasetemp(self):
        return self.root / self.worker


def test_a_second_docs_build_in_one_run_fails_it(tmp_path):
    def worker(name, run="run-1"):
        config = type("Config", (), {"workerinput": {"workerid": name, "testrunuid": run}})()
        return config, _TempPaths(tmp_path, name)

    assert _claim_the_docs_build(*worker("gw0")) == "gw0"
    with pytest.raises(pytest.fail.Exception, match="built a second time in this run, on gw1 "
                                                    "after gw0"):
        _claim_the_docs_build(*worker("gw1"))
    assert _claim_the_docs_build(*worker("gw1", run="run-2")) == "gw1"  # another run
    # One process builds once per session by itself.
    assert _claim_the_docs_build(object(), None) == "one process"


def test_every_heavy_test_named_exists():
    tests = Path(__file__).resolve().parent
    assert len(set(HEAVY_TESTS)) == len(HEAVY_TESTS)
    for entry in HEAVY_TESTS:
        module, function = entry.split("::")
        assert f"def {function}(" in (tests / module).read_text(encoding="utf-8"), entry


def test_the_docs_then_the_heavy_tests_run_first(request):
    order = [item.nodeid for item in request.session.items]
    if not all(any(nodeid.split("::")[0].endswith(name) for nodeid in order)
               for name in ("test_docs.py", "test_noise_edges.py")):
        pytest.skip("needs the whole suite collected")
    docs = [_in_docs_group(nodeid) for nodeid in order]
    assert docs == sorted(docs, reverse=True)  # the docs tests, then no more
    first_other = order[docs.count(True)]
    assert HEAVY_TESTS[0].split("::")[1] in first_other
