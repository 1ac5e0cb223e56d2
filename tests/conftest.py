"""Order of the test files when `make test` spreads them over pytest-xdist workers.

`make test` runs the suite with ``-n`` and ``--dist loadfile``: each file goes whole to one
worker (its module fixtures, such as a real quantization or a docker image build, are made
once), and a worker that finishes a file takes the next one in the queue. A long file taken
last would keep one worker busy after the others have run out of work, so the files that
take longest go out first, in the order below (each measured on a 2-core machine without
GPU); every other file keeps its place. Within a file the order never changes, and a run
without workers (``-n 0``, or pytest run by hand) keeps pytest's own order.
"""

from __future__ import annotations

# Longest first. A file missing here (renamed, removed) only loses its head start.
LONGEST_FIRST = (
    "tests/integration/test_quantize.py",
    "tests/patches/test_patch_tests.py",  # runs tests/patches again on the released trees
    "tests/integration/test_docker_images.py",
    "tests/unit/test_gpu_drafter_train.py",
    "tests/integration/test_models_pull.py",
    "tests/patches/test_triton_unified_attention_fully_masked_tile.py",
    "tests/integration/test_served_smoke.py",
    "tests/unit/test_gpu_rejudge.py",
    "tests/integration/test_series_0_26_to_0_32.py",
    "tests/unit/test_gpu_drafter_sweep.py",
    "tests/patches/test_dflash_lookahead_slots_at_prefill.py",
    "tests/integration/test_vllm_install.py",
    "tests/integration/test_docker_runtime.py",
)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # not an xdist worker: pytest's order
        return
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
