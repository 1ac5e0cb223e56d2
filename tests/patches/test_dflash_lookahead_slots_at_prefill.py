"""Regression test for dflash-lookahead-slots-at-prefill (0.21.0/0014; PR #43733).

``tests/integration/sched_sim_probe.py`` runs, in its own interpreter, the
tree's real ``Scheduler.__init__`` and ``Scheduler.schedule`` (the waiting-queue
branch the patch changes, with its prefix-cache lookups, ``allocate_slots`` and
preemption), ``update_from_output``, ``update_draft_token_ids`` and
``AsyncScheduler``, over the real ``KVCacheManager``, ``HybridKVCacheCoordinator``,
``SlidingWindowManager`` / ``FullAttentionManager``, ``BlockPool`` and ``Request``,
with Gemma 4 + DFlash's KV cache groups (five sliding-window groups, one full,
the drafter's group 6 of block size 32) and K = 15 drafts.

Stand-ins (what needs a GPU, compiled code or vLLM's other dependencies; listed
in the probe's docstring): ``torch``, the logger, ``vllm.envs``, the hash
function, event and metrics records, ``SamplingParams``, no multimodal or
structured-output inputs, ``vllm_config`` (a namespace with ``LLM(...)``'s values;
the speculative config's ``use_eagle`` / ``use_dflash`` / ``uses_draft_model`` as
vllm/config/speculative.py defines them), the engine loop, and the model
runner: the worker's per-request block tables, kept from the SchedulerOutputs
as ``GPUModelRunner._update_states`` keeps them, and DFlash's query positions
(the bonus token and K masks after the last accepted position, as
``copy_and_expand_dflash_inputs_kernel`` computes them); every draft rejected.
For the KV-connector cases, a connector stand-in that reports 128 externally
cached tokens of a 256-token prompt, loaded synchronously or asynchronously
(``get_num_new_matched_tokens`` -> ``(128, load_kv_async)``).

A query position past the request's block table has no block of its own: on
the GPU the kernel reads whatever id the persistent batch row holds there. The
released tree gives a request admitted from the waiting queue no lookahead
slots (``request.num_computed_tokens == 0``), so the drafter queries of the step
that finishes its prefill (positions P..P+15) land past its table; with the
patch it gets them unless its KV is loaded asynchronously.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.patch_trees import run_probe

VERSION = "0.21.0"
PATCH_ID = "dflash-lookahead-slots-at-prefill"
PROBE = Path(__file__).resolve().parent.parent / "integration" / "sched_sim_probe.py"
K = 15
PROMPT, EXTERNAL = 256, 128  # --single: a prompt that fills its blocks exactly, half of it cached remotely
MODES = {"async": [], "sync": ["--sync"]}
CONNECTORS = {"none": ["--connector", "none"], "sync load": ["--connector", "sync", "--external", str(EXTERNAL)]}

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def tree(vllm_tree):
    return vllm_tree(VERSION, PATCH_ID)


@pytest.fixture(scope="module")
def workload(tree):
    return {mode: run_probe(PROBE, tree, *args) for mode, args in MODES.items()}


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


@pytest.mark.parametrize("mode", MODES)
def test_no_drafter_query_write_lands_past_the_block_table(workload, mode):
    facts = workload[mode]
    assert facts["num_lookahead_tokens"] == K and facts["outputs_min_max"] == [128, 128]
    assert facts["preemptions"] > 0  # resumed prefills too, from the waiting queue
    beyond = facts["beyond_table"]
    # Every position of every group, target writes and drafter queries alike.
    assert beyond["by_kind"] == {}, beyond["events"][:5]
    assert beyond["count"] == 0 and beyond["steps"] == 0
    assert facts["null_block_writes"]["count"] == 0


@pytest.mark.parametrize("connector", CONNECTORS)
def test_admission_prefill_gets_the_lookahead_slots(tree, connector):
    facts = run_probe(PROBE, tree, "--single", str(PROMPT), *CONNECTORS[connector])
    rid = "single-0"
    assert facts["status"] == "RUNNING"
    assert facts["scheduled"] == {rid: PROMPT - (EXTERNAL if connector == "sync load" else 0)}
    # The whole prompt plus K lookahead slots, in every group (the released tree: the prompt only).
    assert facts["table_lens"] == [_blocks(PROMPT + K, bs) for bs in facts["block_sizes"]]
    assert facts["drafter_query"] == [list(range(PROMPT, PROMPT + K + 1))]
    assert facts["beyond_table"]["count"] == 0, facts["beyond_table"]["events"]


def test_async_kv_load_withholds_the_lookahead_as_before(tree, stock_tree):
    """P/D disaggregation: while the connector loads KV asynchronously no forward pass
    runs, and the request gets blocks for the loaded tokens only, as on the released tree."""
    args = ["--single", str(PROMPT), "--connector", "async", "--external", str(EXTERNAL)]
    facts = run_probe(PROBE, tree, *args)
    released = run_probe(PROBE, stock_tree(VERSION), *args)
    assert facts["status"] == "WAITING_FOR_REMOTE_KVS" and facts["scheduled"] == {}
    assert facts["num_computed_tokens"] == EXTERNAL
    assert facts["table_lens"] == [_blocks(EXTERNAL, bs) for bs in facts["block_sizes"]]
    for key in ("status", "scheduled", "num_computed_tokens", "table_lens", "connector_calls"):
        assert facts[key] == released[key], key


def test_released_tree_writes_drafter_queries_past_the_table_after_admission_prefills(stock_tree):
    """The baseline: what the patch removes is there on the released tree."""
    facts = run_probe(PROBE, stock_tree(VERSION), "--sync")
    beyond = facts["beyond_table"]
    assert beyond["count"] > 0 and set(beyond["by_kind"]) == {"drafter query"}
    for event in beyond["events"]:
        start, n, n_spec = event["scheduled"]
        assert n_spec == 0 and event["query"] == [start + n, start + n + K]
