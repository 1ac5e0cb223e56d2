"""Trees and probes for the per-patch regression tests (tests/patches/test_<id>.py).

Every test here runs the real code of the released vLLM wheel (unpacked from
PyPI by ``launcher.pypi``, cached outside the clone) with ONE patch of the
series applied, alone, through the project's patch engine: the ``vllm_tree``
fixture. Nothing else of the series is in that tree, so a test that passes
there passes because of that patch.

Set ``VLLM_SM12X_PATCH_TESTS_ON=stock`` to run the same tests on the released
tree instead: every regression test must then fail, apart from those named
``..._unchanged`` or ``..._as_before``, which check that what worked before
still does. ``test_patch_tests.py`` runs the suite that way and checks it.

vLLM itself cannot be imported here: it needs its own torch build, CUDA
libraries and compiled extensions (the test environment has a CPU torch of
another version, for the quantize tests). The code under test is cut out of
the tree's files and run against stand-ins for what cannot exist on a
CPU-only machine: the KV cache and config probes in tests/integration (one
subprocess per tree, because their stand-ins register ``torch`` and ``vllm``
names in ``sys.modules``; the KV byte layout uses real CPU torch tensors),
and ``vllm_source.py`` for model classes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launcher.patching.series import series_for
from launcher.paths import cache_dir
from tests.integration.patch_trees import pristine, single_patch_tree
from tests.integration.sched_sim_probe import READS as SCHED_SIM_READS

STOCK_ENV = "VLLM_SM12X_PATCH_TESTS_ON"
PROBES = Path(__file__).resolve().parent.parent / "integration"

# Files the probes and vllm_source read, on top of those the patch changes.
READS = [
    "vllm/config/model.py",
    "vllm/config/model_arch.py",
    "vllm/config/vllm.py",
    "vllm/utils/math_utils.py",
    "vllm/utils/hashing.py",
    "vllm/utils/torch_utils.py",
    "vllm/v1/kv_cache_interface.py",
    "vllm/v1/core/kv_cache_utils.py",
    "vllm/v1/attention/backend.py",
    "vllm/v1/attention/backends/triton_attn.py",
    "vllm/v1/attention/backends/flash_attn.py",
    "vllm/v1/attention/backends/flex_attention.py",
    "vllm/v1/worker/gpu_model_runner.py",
    "vllm/v1/cudagraph_dispatcher.py",
    "vllm/config/compilation.py",
    "vllm/forward_context.py",
    "vllm/v1/spec_decode/llm_base_proposer.py",
    "vllm/v1/spec_decode/dflash.py",
    "vllm/v1/spec_decode/gemma4.py",
    "vllm/v1/worker/gpu/spec_decode/dflash/utils.py",
    "vllm/v1/worker/gpu/spec_decode/gemma4/speculator.py",
    "vllm/model_executor/models/qwen3_dflash.py",
    "vllm/model_executor/models/utils.py",
    "vllm/model_executor/models/qwen3_dflash2.py",
    "vllm/model_executor/models/qwen3_dspark.py",
    "vllm/model_executor/models/qwen3_xpress.py",
    "vllm/model_executor/models/lilicorr.py",
    "vllm/v1/core/block_pool.py",
    "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py",
    "vllm/v1/core/kv_cache_metrics.py",
    "vllm/v1/core/sched/async_scheduler.py",
    "vllm/v1/core/sched/utils.py",
    "vllm/v1/utils.py",
    "vllm/utils/__init__.py",
    # tests/integration/sched_sim_probe.py (the real Scheduler): its own list
    *SCHED_SIM_READS,
]


def on_stock() -> bool:
    return os.environ.get(STOCK_ENV) == "stock"


# --- the stock run of test_patch_tests.py, started as soon as it is known to be needed ------------
#
# test_patch_tests_fail_on_the_released_tree runs this whole folder again on the released trees,
# in a pytest of its own: about 200 s on 2 cores, the longest test of `make test`. Nothing in it
# depends on this run, so it starts in the background once collection shows that test selected,
# and overlaps the tests before it; the test then waits for it and reads its report. Run alone
# (or with this folder only), the test starts it itself, as before.

STOCK_RUN_TEST = "tests/patches/test_patch_tests.py::test_patch_tests_fail_on_the_released_tree"
STOCK_RUN_TIMEOUT_S = 900


def _start_stock_run(folder: Path) -> tuple[subprocess.Popen, Path]:
    here = Path(__file__).resolve().parent
    report = folder / "stock.xml"
    log = open(folder / "stock.log", "wb")  # noqa: SIM115 (the child writes it; closed with the run)
    # A pytest of its own, not one more xdist worker: the variables pytest-xdist sets in a
    # worker's environment stay out of it.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
         f"--ignore={here / 'test_patch_tests.py'}", str(here)],
        cwd=here.parent.parent, env={**env, STOCK_ENV: "stock"}, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, report


def pytest_collection_finish(session):
    if on_stock() or not any(item.nodeid == STOCK_RUN_TEST for item in session.items):
        return
    if hasattr(session.config, "workerinput"):
        # A pytest-xdist worker: every worker collects every test, and only one of them gets
        # this test. The test starts the run itself; its worker then waits on it while the
        # other workers go on, which keeps the cores as busy as the overlap does.
        return
    folder = Path(tempfile.mkdtemp(prefix="sm12x-stock-run-"))
    session.config._sm12x_stock_run = (*_start_stock_run(folder), folder)


def pytest_sessionfinish(session):
    run = getattr(session.config, "_sm12x_stock_run", None)
    if run is not None:
        proc, _, folder = run
        if proc.poll() is None:  # the test did not run to its wait (-x, Ctrl-C): stop our child
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def stock_run_report(config, tmp_path: Path) -> Path:
    """The JUnit report of this folder's tests on the released trees: from the run started at
    collection, or from one started now."""
    run = getattr(config, "_sm12x_stock_run", None)
    proc, report = run[:2] if run is not None else _start_stock_run(tmp_path)
    proc.wait(timeout=STOCK_RUN_TIMEOUT_S)
    return report


def patch_named(version: str, patch_id: str):
    series = series_for(version)
    matches = [p for p in series.patches if p.id == patch_id]
    assert matches, f"{patch_id} is not in the {version} series"
    return matches[0]


@pytest.fixture(scope="session")
def vllm_tree(tmp_path_factory):
    """``vllm_tree(version, patch_id)``: the tree under test (see the module docstring)."""
    made: dict[tuple[str, str], Path] = {}

    def get(version: str, patch_id: str) -> Path:
        patch = patch_named(version, patch_id)
        if on_stock():
            return pristine(version, "site-packages")
        if (version, patch_id) not in made:
            dest = tmp_path_factory.mktemp(f"{version}-{patch_id}")
            made[version, patch_id] = single_patch_tree(version, patch, dest, extra=READS)
        return made[version, patch_id]

    return get


@pytest.fixture(scope="session")
def stock_tree():
    """``stock_tree(version)``: the released wheel's tree, for what must stay as it was."""
    return lambda version: pristine(version, "site-packages")


@pytest.fixture(scope="session")
def probe():
    """``probe(version, tree, *sections)``: the JSON the version's tests/integration probe
    prints for ``tree`` (0.21.0's takes section names; 0.33.0's prints everything)."""
    seen: dict[tuple, dict] = {}

    def run(version: str, tree: Path, *sections: str) -> dict:
        key = (tree, sections)
        if key not in seen:
            script = PROBES / f"series_{version.replace('.', '_')}_probe.py"
            done = subprocess.run(
                [sys.executable, str(script), str(tree), *sections], capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, done.stderr[-4000:]
            seen[key] = json.loads(done.stdout)
        return seen[key]

    return run


@pytest.fixture(scope="session")
def probe_section(vllm_tree, stock_tree, probe):
    """``probe_section(version, section, patch_id)``: one section of the version's probe on the
    tree with that patch alone; ``patch_id=None``: on the released tree."""
    def run(version: str, section: str, patch_id: str | None) -> dict:
        tree = stock_tree(version) if patch_id is None else vllm_tree(version, patch_id)
        return probe(version, tree, section)[section]

    return run


TRITON = "3.9.0"
TRITON_PROBE = Path(__file__).resolve().parent / "triton_attention_probe.py"


def _triton_dir() -> Path:
    """Triton is not in the test venv (about 1 GB installed, needed only by the Triton
    kernel tests): installed once, pinned, into the project's cache, under a file lock and
    renamed into place whole, so parallel or interrupted runs never see half an install."""
    root = cache_dir() / "test-tools"
    target = root / f"triton-{TRITON}"
    if (target / "triton").is_dir():
        return target
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"triton-{TRITON}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "triton").is_dir():
            tmp = root / f".triton-{TRITON}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(tmp),
                 f"triton=={TRITON}"],
                check=True, timeout=1200,
            )
            os.replace(tmp, target)
    return target


@pytest.fixture(scope="session")
def triton_probe():
    """``triton_probe(tree, *args)``: triton_attention_probe.py's JSON for ``tree``, run by
    Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU; no GPU here)."""
    triton_dir = _triton_dir()
    # One run per tree and arguments: the probe reads nothing but them, and on the released
    # trees (the stock run of test_patch_tests.py) the patched test and its baseline ask for
    # the same one. Each caller gets its own copy.
    seen: dict[tuple, str] = {}

    def run(tree: Path, *args: str) -> dict:
        key = (str(tree), args)
        if key not in seen:
            env = {**os.environ, "TRITON_INTERPRET": "1",
                   "PYTHONPATH": os.pathsep.join([str(triton_dir), os.environ.get("PYTHONPATH", "")])}
            done = subprocess.run([sys.executable, str(TRITON_PROBE), str(tree), *args], env=env,
                                  capture_output=True, text=True, timeout=600, check=False)
            assert done.returncode == 0, done.stderr[-4000:]
            seen[key] = done.stdout.strip().splitlines()[-1]
        return json.loads(seen[key])

    return run
