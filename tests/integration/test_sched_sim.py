"""vLLM 0.21.0's real scheduler under the Gemma-4 + DFlash small-pool workload (sched_sim_probe.py).

What the simulation shows, deterministically (the schedule depends on prompt lengths and
prefix identity only, so every seed gives the same numbers):

* the released tree under async scheduling hands sliding-window blocks to other requests
  while their owner's window still reads them (the bug patch 0013 fixes);
* with 0013 applied, no block reaches a second (request, group) while the first still
  reads it, async or sync, although requests are preempted;
* in every tree and mode, DFlash's query writes after a request's prefill reach past the
  request's group-6 block table: the scheduler allocates no lookahead slots for a request
  it admits from the waiting queue (``effective_lookahead_tokens = 0``), so on the GPU
  those writes go wherever the persistent-batch row holds an id there (worker side).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.patch_trees import pristine, run_probe, single_patch_tree
from tests.patches.conftest import patch_named

pytestmark = pytest.mark.network  # first run downloads the release from PyPI

PROBE = Path(__file__).resolve().parent / "sched_sim_probe.py"
PATCH_ID = "sliding-window-free-settled-tokens-under-async-scheduling"


def _run(tree: Path, *args: str) -> dict:
    return run_probe(PROBE, tree, *args, timeout=300)  # the whole workload: minutes on a slow CI core


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from tests.integration.sched_sim_probe import READS

    patched = single_patch_tree("0.21.0", patch_named("0.21.0", PATCH_ID), tmp_path_factory.mktemp("sched-sim"),
                                extra=READS)
    stock = pristine("0.21.0", "site-packages")
    return {"stock async": _run(stock), "0013 async": _run(patched), "0013 sync": _run(patched, "--sync")}


def test_released_tree_reuses_blocks_the_window_still_reads_under_async(runs):
    facts = runs["stock async"]
    assert facts["scheduler_class"] == "AsyncScheduler"
    assert facts["block_conflicts"]["conflicts"] > 0
    first = facts["block_conflicts"]["first"][0]
    assert first["victim"]["kv_group"] < 5  # a sliding-window group


@pytest.mark.parametrize("mode", ["0013 async", "0013 sync"])
def test_with_0013_no_block_reaches_a_second_reader(runs, mode):
    facts = runs[mode]
    assert facts["preemptions"] > 0  # the pool is under pressure
    assert facts["outputs_min_max"] == [128, 128]
    assert facts["block_conflicts"]["conflicts"] == 0
    assert facts["null_block_writes"]["count"] == 0


@pytest.mark.parametrize("mode", ["stock async", "0013 async", "0013 sync"])
def test_drafter_query_writes_past_the_table_follow_admission_prefills(runs, mode):
    beyond = runs[mode]["beyond_table"]
    assert beyond["count"] > 0
    assert set(beyond["by_kind"]) == {"drafter query"}  # target writes always have their blocks
    for event in beyond["events"]:
        start, n, n_spec = event["scheduled"]
        assert n_spec == 0  # a prefill step (admitted or resumed from the waiting queue)
        assert event["query"][0] == start + n
