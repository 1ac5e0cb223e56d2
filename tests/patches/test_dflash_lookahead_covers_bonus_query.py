"""Regression test for dflash-lookahead-covers-bonus-query (0.21.0/0015; PR #42971).

``tests/integration/sched_sim_probe.py`` runs, in its own interpreter, the
tree's real ``Scheduler.__init__`` (where the patch sets ``num_lookahead_tokens``)
and ``Scheduler.schedule`` (whose ``allocate_slots`` calls reserve that many
lookahead slots for running requests), ``update_from_output``,
``update_draft_token_ids`` and ``AsyncScheduler``, over the real
``KVCacheManager``, ``HybridKVCacheCoordinator``, ``SlidingWindowManager`` /
``FullAttentionManager``, ``BlockPool`` and ``Request``, with Gemma 4 + DFlash's
KV cache groups (five sliding-window groups, one full, the drafter's group 6 of
block size 32) and K = 15 drafts.

Stand-ins (what needs a GPU, compiled code or vLLM's other dependencies; listed
in the probe's docstring): ``torch``, the logger, ``vllm.envs``, the hash
function, event and metrics records, ``SamplingParams``, no multimodal or
structured-output inputs, ``vllm_config`` (a namespace with ``LLM(...)``'s values;
the speculative config's ``method`` and its ``use_eagle`` / ``use_dflash`` /
``uses_draft_model`` as vllm/config/speculative.py defines them), the engine
loop, and the model runner: here one that accepts every draft
(``--accept-all``: the drafts and a bonus token come back), the worker's
per-request block tables kept from the SchedulerOutputs as
``GPUModelRunner._update_states`` keeps them, and DFlash's query positions (the
token just sampled and K masks after the last accepted position, as
``copy_and_expand_dflash_inputs_kernel`` computes them). Every prompt is one
token longer than the probe's default (``--prompt-extra 1``), so that some
decode steps end where a drafter block ends.

A decode step schedules the last sampled token and K drafts, positions s..s+K,
and allocates through s+2K (K lookahead slots). When all K are accepted the
drafter queries s+K+1..s+2K+1: the last lies one slot past the allocation, and
past the block table when s+2K+1 starts a block. With K + 1 lookahead slots it
has its block. This tree lacks 0014 (lookahead slots on the step that finishes a
prefill), so drafter queries after admission prefills still land past the
table here; only steps that verified drafts are measured.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.patch_trees import run_probe

VERSION = "0.21.0"
PATCH_ID = "dflash-lookahead-covers-bonus-query"
PROBE = Path(__file__).resolve().parent.parent / "integration" / "sched_sim_probe.py"
K = 15
MODES = {"async": [], "sync": ["--sync"]}
ACCEPT_ALL = ["--accept-all", "--prompt-extra", "1"]
OTHER_METHODS = {"eagle": K, "eagle3": K, "mtp": K, "draft_model": K, "ngram": 0}

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def tree(vllm_tree):
    return vllm_tree(VERSION, PATCH_ID)


@pytest.fixture(scope="module")
def methods(tree, stock_tree):
    return {"patched": run_probe(PROBE, tree, "--lookahead-by-method")["methods"],
            "released": run_probe(PROBE, stock_tree(VERSION), "--lookahead-by-method")["methods"]}


@pytest.fixture(scope="module")
def accept_all(tree):
    return {mode: run_probe(PROBE, tree, *args, *ACCEPT_ALL) for mode, args in MODES.items()}


def _verify_steps(events: list[dict]) -> list[dict]:
    """Drafter writes past the table of steps that verified drafts (decode steps)."""
    return [e for e in events if e["scheduled"][2] > 0]


def test_dflash_reserves_a_lookahead_slot_for_the_bonus_query(methods):
    dflash = methods["patched"]["dflash"]
    assert dflash["use_eagle"] and dflash["num_spec_tokens"] == K
    assert dflash["num_lookahead_tokens"] == K + 1


@pytest.mark.parametrize("method", OTHER_METHODS)
def test_lookahead_of_other_methods_unchanged(methods, method):
    assert methods["patched"][method]["num_lookahead_tokens"] == OTHER_METHODS[method]
    assert methods["patched"][method] == methods["released"][method]


@pytest.mark.parametrize("mode", MODES)
def test_no_drafter_query_write_past_the_table_after_a_fully_accepted_step(accept_all, mode):
    facts = accept_all[mode]
    assert facts["accept_all"] and facts["accepted_steps"] > 300  # every decode step accepted all K
    assert facts["outputs_min_max"] == [128, 128]
    beyond = facts["beyond_table"]
    assert set(beyond["by_kind"]) <= {"drafter query"}  # target writes always have their blocks
    assert _verify_steps(beyond["events"]) == []
    assert facts["num_lookahead_tokens"] == K + 1


def test_released_tree_writes_the_last_query_past_the_table_after_a_fully_accepted_step(stock_tree):
    """The baseline: what the patch removes is there on the released tree, one slot per step."""
    facts = run_probe(PROBE, stock_tree(VERSION), "--sync", *ACCEPT_ALL)
    events = _verify_steps(facts["beyond_table"]["events"])
    assert events
    for event in events:
        start, n, n_spec = event["scheduled"]
        assert n == n_spec + 1 == K + 1 and event["query"] == [start + n, start + n + K]
        assert event["positions_beyond"] == 1 and (start + n + K) % 32 == 0
