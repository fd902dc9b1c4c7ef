"""Test settings shared by the whole suite."""

import pytest


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    # The models under test are tiny: one intra-op thread is fastest, and several threads on a
    # shared 2-core machine slow them down by an order of magnitude.
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True, scope="session")
def _blas_threads_per_worker():
    # Under pytest-xdist every worker is a process of its own: BLAS threads beyond its share
    # of the cores oversubscribe them, and OpenBLAS then crawls. One share per worker.
    import os

    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        yield
        return
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=max(1, (os.cpu_count() or 1) // workers)):
        yield


class WordTokenizer:
    """A stand-in Hugging Face tokenizer: one id per word, right padding."""

    pad_token = "[PAD]"

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size

    def __call__(self, texts, padding=True, truncation=True, max_length=128,
                 return_tensors="pt"):
        import torch

        ids = [[1 + sum(map(ord, w)) % (self.vocab_size - 1) for w in t.split()][:max_length]
               for t in texts]
        n = max(map(len, ids))
        return {"input_ids": torch.tensor([x + [0] * (n - len(x)) for x in ids]),
                "attention_mask": torch.tensor([[1] * len(x) + [0] * (n - len(x))
                                                for x in ids])}


def dense_and_matrix_free_solves(V, attention, X, Y, lengths=None, **pattern):
    """The kernel least squares of ``X, Y`` solved by the dense normal matrix and by the
    matrix-free conjugate gradients (to ``tol=1e-13``, no softmax refinement), after checking
    that the two agree on the kernel and its spectrum; returns ``(dense, free)``."""
    import numpy as np

    from sklearn_ebound._kernel_moments import KernelMoments

    dense, free = [KernelMoments(V, attention, solver=solver, refine=False, **pattern)
                   .update(X, Y, lengths).solve(tol=1e-13) for solver in ("dense", "cg")]
    assert (dense.solver, free.solver) == ("dense", "cg")
    np.testing.assert_allclose(free.kernel, dense.kernel,
                               atol=1e-8 * np.abs(dense.kernel).max())
    np.testing.assert_allclose(free.singular_values, dense.singular_values, rtol=1e-8)
    return dense, free


def word_level_tokenizer(texts):
    """A real Hugging Face fast tokenizer, one id per word of ``texts`` (``[PAD]`` 0, ``[UNK]``
    1), that ``save_pretrained`` writes and ``AutoTokenizer`` loads back."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = sorted({w for t in texts for w in t.split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]"] + words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]",
                                                unk_token="[UNK]")


@pytest.fixture(scope="session")
def word_tokenizer():
    """The stand-in tokenizer class, for tests that run tiny Hugging Face models."""
    return WordTokenizer


# --- one documentation build for the docs tests and the examples' checks -------------------
#
# The gallery runs every example while the docs build; tests/test_examples.py checks the
# numbers each example reports on its module globals. Both use this one build: an image
# scraper added to the build's configuration keeps each example's globals, so no example runs
# twice. Under pytest-xdist the tests of DOCS_MODULES share one worker and start first, since
# the build is the suite's longest single step.
#
# The worker is chosen by the scheduler below, from each test's file, which is part of the test
# id every pytest sends to the pytest-xdist controller. pytest-xdist's own `--dist loadgroup`
# appends the `xdist_group` mark to a private node-id attribute of pytest's items, which pytest
# 9.2 no longer reads: there every worker would take some of the docs tests and build the docs.
# A second build in one run fails the run (`_claim_the_docs_build`), and the terminal summary
# says where and in how long the docs were built.

DOCS_GROUP = "docs"
DOCS_MODULES = ("test_docs.py", "test_examples.py")
_DOCS_BUILDS = pytest.StashKey[list]()

# Tests that read one costly module-scoped fixture (file::function, every parameter; a file
# alone: all its tests), by the fixture: each group is one work unit, so that the fixture is
# built once in a run, not once on every worker that takes some of its tests (seconds each,
# measured on two workers of a shared 2-core machine; tests/test_suite_grouping.py checks
# that each entry names a test that uses the fixture).
SHARED_FIXTURE_GROUPS = {
    "written": (  # five models compressed and reloaded in a fresh process: 16 s
        "test_heads_shrink.py::test_written_model_reloads_with_the_kept_widths",
        "test_heads_shrink.py::test_rotary_planes_are_whole_shared_by_the_group_and_within_"
        "the_budget"),
    "client": ("test_dask.py",),  # a local dask cluster of two processes: 2 s
}


def _in_docs_group(nodeid):
    """Whether a test id (``tests/test_docs.py::test_x``) belongs to DOCS_MODULES."""
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1] in DOCS_MODULES


def _shared_fixture_group(nodeid):
    """The SHARED_FIXTURE_GROUPS fixture whose group a test id belongs to, or None."""
    path, _, name = nodeid.partition("::")
    module = path.rsplit("/", 1)[-1]
    function = f"{module}::{name.split('[', 1)[0].split('@', 1)[0]}"
    for fixture, entries in SHARED_FIXTURE_GROUPS.items():
        if module in entries or function in entries:
            return f"{module}::{fixture}"
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    # `--dist loadgroup` (and plain `-n`, `--dist load`) with the docs group read from the
    # test ids: one work unit for the tests of DOCS_MODULES (first in the queue, being the
    # largest), one per group of SHARED_FIXTURE_GROUPS, one per other test.
    if config.getoption("dist", None) not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class DocsOnOneWorkerScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            if _in_docs_group(nodeid):
                return DOCS_GROUP
            return _shared_fixture_group(nodeid) or super()._split_scope(nodeid)

    return DocsOnOneWorkerScheduling(config, log)


def _record_docs_build(config, line):
    config.stash.setdefault(_DOCS_BUILDS, []).append(line)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: tell the controller
        config.workeroutput["docs_builds"] = config.stash[_DOCS_BUILDS]


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    # The controller of a pytest-xdist run collects each worker's docs builds.
    builds = getattr(node, "workeroutput", {}).get("docs_builds", [])
    node.config.stash.setdefault(_DOCS_BUILDS, []).extend(builds)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    builds = config.stash.get(_DOCS_BUILDS, [])
    if builds and not hasattr(config, "workeroutput"):
        terminalreporter.write_line(
            f"docs built {len(builds)} time{'s' * (len(builds) != 1)} in this run: "
            + "; ".join(builds))


def _claim_the_docs_build(config, tmp_path_factory):
    """This process's name; under pytest-xdist, fail if another worker built the docs in
    this run (each worker leaves its name in a folder of the run's temporary folder, which
    they share)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return "one process"  # a session fixture runs once per process
    worker = workerinput["workerid"]
    claims = tmp_path_factory.getbasetemp().parent / f"docs-builds-{workerinput['testrunuid']}"
    claims.mkdir(exist_ok=True)
    (claims / worker).touch()
    others = sorted(p.name for p in claims.iterdir() if p.name != worker)
    if others:
        pytest.fail(f"the docs are being built a second time in this run, on {worker} after "
                    f"{', '.join(others)}: the tests of {', '.join(DOCS_MODULES)} must share "
                    "one pytest-xdist worker (run with --dist loadgroup)", pytrace=False)
    return worker


_CAPTURE_MODULE = "_ebound_gallery_capture"
_CAPTURE_CONF = f"""

# Added by the test suite: keep each example's globals for tests/test_examples.py.
import sys as _sys

sphinx_gallery_conf["image_scrapers"] = (
    *sphinx_gallery_conf.get("image_scrapers", ("matplotlib",)),
    _sys.modules["{_CAPTURE_MODULE}"].keep_globals)
# A callable in the configuration cannot be pickled with the environment; this build is
# thrown away, so its cache does not matter.
suppress_warnings = [*globals().get("suppress_warnings", []), "config.cache"]
"""


def docs_dependencies_missing():
    """The name of the first missing module the docs build needs, or None."""
    import importlib.util

    for module in ["sphinx", "numpydoc", "sphinx_gallery", "pydata_sphinx_theme", "matplotlib"]:
        if importlib.util.find_spec(module) is None:
            return module
    return None


class DocsBuild:
    """A finished build: ``root`` (the copied ``docs``/``examples`` and ``html``), sphinx's
    exit ``status`` and output ``log``, and ``example_globals[name]``, the globals of each
    example it ran."""

    def __init__(self, root, status, log, example_globals):
        self.root, self.status, self.log = root, status, log
        self.example_globals = example_globals


@pytest.fixture(scope="session")
def docs_build(tmp_path_factory, pytestconfig):
    """Build a copy of the docs in this process, examples at their small size; see above."""
    import contextlib
    import io
    import os
    import shutil
    import sys
    import time
    import types
    from pathlib import Path

    missing = docs_dependencies_missing()
    if missing:
        pytest.skip(f"the docs build needs {missing} (the docs extra)")
    builder = _claim_the_docs_build(pytestconfig, tmp_path_factory)
    start = time.perf_counter()
    import torch
    from sphinx.cmd.build import build_main

    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("docs")
    for folder in ["docs", "examples"]:
        shutil.copytree(root / folder, tmp / folder,
                        ignore=shutil.ignore_patterns("_build", "generated", "auto_examples"))
    with open(tmp / "docs" / "conf.py", "a", encoding="utf-8") as conf:
        conf.write(_CAPTURE_CONF)

    kept = {}
    capture = types.ModuleType(_CAPTURE_MODULE)

    def keep_globals(block, block_vars, gallery_conf):
        # Called after every code block: the example's globals dict, the same object for all
        # its blocks, holds its final state once the example has run.
        kept[Path(block_vars["src_file"]).name] = block_vars["example_globals"]
        return ""

    capture.keep_globals = keep_globals
    saved_env = {key: os.environ.get(key) for key in ["EBOUND_EXAMPLE_SIZE", "MPLBACKEND"]}
    os.environ.update(EBOUND_EXAMPLE_SIZE="small", MPLBACKEND="Agg")
    sys.modules[_CAPTURE_MODULE] = capture
    n_threads = torch.get_num_threads()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            status = build_main(["-W", "--keep-going", "-q", "-b", "html", str(tmp / "docs"),
                                 str(tmp / "html")])
    finally:
        del sys.modules[_CAPTURE_MODULE]
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        torch.set_num_threads(n_threads)  # the examples set one thread
        import matplotlib.pyplot as plt

        plt.close("all")
    _record_docs_build(pytestconfig, f"on {builder}, in {time.perf_counter() - start:.0f} s")
    return DocsBuild(tmp, status, log.getvalue(), kept)


# The longest tests (file::function, every parameter), longest first: they start right after
# the docs build, so that under pytest-xdist the many short tests fill the end of the run on
# every worker, not one long test on one worker while the others idle. Seconds measured with
# the whole suite on two workers of a shared 2-core machine; tests/test_suite_grouping.py
# checks that each entry names a test.
HEAVY_TESTS = (
    "test_noise_edges.py::test_correlated_noise_alone_reads_rank_zero",  # 340 s, 4 tests
    "test_benchmarks_smoke.py::test_recovery_accuracy_quick",  # 175 s
    "test_benchmarks_smoke.py::test_encoder_cli_quick",  # 159 s
    "test_attention_regressor.py::test_gradient_descent_recovers_the_planted_rank",  # 92 s
    "test_heads_cli.py::test_heads_compress_refined",  # 88 s
    "test_intrinsic_rank.py::test_default_recovers_the_planted_rank_on_a_grid",  # 87 s
    "test_heads_cli.py::test_heads_compress_reports_each_layer_and_resumes",  # 60 s
    "test_noise_edges.py::test_rotation_law_gives_uniform_p_values_for_any_covariance",  # 57 s
    "test_experiments.py::test_interpolation_ladder_localises_the_failure",  # 57 s
    "test_heads_cli.py::test_heads_compress_budget",  # 56 s
    "test_experiments.py::test_frontier_softmax_holds_for_vocabulary_tokens_at_every_"
    "logit_scale",  # 49 s
    "test_benchmarks_smoke.py::test_influence_speed_quick",  # 49 s
    "test_benchmarks_smoke.py::test_null_calibration_quick",  # 47 s
    "test_attention_regressor.py::test_grid_search_named_scoring",  # 41 s
    "test_heads_cli.py::test_heads_compress_refit_writes_the_fit_on_every_line",  # 40 s
    "test_cli.py::test_demo_reaches_the_planted_rank",  # 40 s
    "test_benchmarks_smoke.py::test_lack_of_fit_quick",  # 38 s
    "test_attention_intrinsic_rank.py::test_unknown_value_map_at_scale",  # 36 s
)


def _run_order(item):
    """The docs tests first, then HEAVY_TESTS longest first, then the rest as collected."""
    if _in_docs_group(item.nodeid):
        return 0
    function = f"{item.path.name}::{getattr(item, 'originalname', None) or item.name}"
    return 1 + HEAVY_TESTS.index(function) if function in HEAVY_TESTS else 1 + len(HEAVY_TESTS)


def pytest_collection_modifyitems(config, items):
    # The docs build first: under pytest-xdist its worker starts on it while the others take
    # the rest of the suite, the longest tests first. The mark names the group for
    # pytest-xdist versions whose own loadgroup works; the scheduler above does not need it.
    for item in items:
        if _in_docs_group(item.nodeid):
            item.add_marker(pytest.mark.xdist_group(DOCS_GROUP))
    items.sort(key=_run_order)
