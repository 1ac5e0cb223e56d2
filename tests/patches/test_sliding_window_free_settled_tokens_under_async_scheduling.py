"""Regression test for sliding-window-free-settled-tokens-under-async-scheduling (0.21.0/0013; PR #47728).

``tests/integration/sliding_window_async_probe.py`` runs the tree's real KV
cache manager stack as modules: ``KVCacheManager`` over the real coordinator
(``HybridKVCacheCoordinator`` with prefix caching, ``KVCacheCoordinatorNoPrefixCache``
without), ``SlidingWindowManager`` and ``FullAttentionManager``, ``BlockPool``
and its free-block queue, the ``kv_cache_interface.py`` specs and
``KVCacheConfig``, and the real ``Request``; and, executed from the tree's
source on ``object.__new__(AsyncScheduler)`` (``Scheduler`` for synchronous
scheduling), the real ``_update_after_schedule`` of both classes,
``update_from_output`` (with ``_update_request_with_output`` of both classes
and the real ``check_stop``) and ``_connector_finished``. Stand-ins (listed in
the probe's docstring): ``torch`` and the logger, ``vllm.envs``, the hash
functions, KV event and metrics records, ``SamplingParams`` (no stop token),
no structured output, the engine's event and finish-reason types, a recording
KV connector; the scheduler object carries only the attributes those methods
read. What ``Scheduler.schedule`` decides is written out in the probe: which
request gets how many tokens (1 + 15 drafts a decode step, 15 lookahead
slots), ``get_computed_blocks`` / ``allocate_slots`` called as it calls them,
and the model output (every draft rejected).

Layout: Gemma 4's in small, a sliding-window group (window 64) and a
full-attention group, block size 16, 33 usable blocks. A 200-token prompt (A),
then decode steps B, C, D of 16 tokens, each planned before the previous
step's output (async scheduling). B's drafts are all rejected, so C, planned
for positions 216..231, computes 201..216, whose window reaches back to
position 138: sliding block 8 (positions 128..143). The released tree frees
it when planning C (it frees below ``num_computed_tokens - 63`` = 216 - 63),
and a request admitted in the same step (64-token prompt, 10 blocks, exactly
what is free) gets that block. With the patch the freeing basis is the settled
216 - 16 = 200, block 8 stays the request's, and the newcomer waits.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.patch_trees import run_probe

VERSION = "0.21.0"
PATCH_ID = "sliding-window-free-settled-tokens-under-async-scheduling"
PROBE = Path(__file__).resolve().parent.parent / "integration" / "sliding_window_async_probe.py"
CACHING = ["prefix_caching", "no_prefix_caching"]
PROMPT = 200  # the probe's first request

pytestmark = pytest.mark.network  # first run downloads the release from PyPI


@pytest.fixture(scope="module")
def seen(vllm_tree):
    return run_probe(PROBE, vllm_tree(VERSION, PATCH_ID))


@pytest.fixture(scope="module")
def stock(stock_tree):
    return run_probe(PROBE, stock_tree(VERSION))


def _phase(log: list[dict], name: str) -> dict:
    return next(entry for entry in log if entry["phase"] == name)


def _window_indices(facts: dict, first: int, last: int) -> range:
    """Sliding-group block indices holding the keys that positions first..last attend to."""
    window, block = facts["window"], facts["block_size"]
    return range(max(0, first - window + 1) // block, last // block + 1)


def _in_flight_window(facts: dict, r: dict) -> range:
    # The in-flight step feeds the last sampled token and its drafts: it computes
    # positions num_tokens - 1 onwards, through num_computed_tokens - 1.
    first = r["num_tokens"] - 1
    return _window_indices(facts, first, r["num_computed_tokens"] - 1)


def _leading_nulls(table: list) -> int:
    return next((i for i, b in enumerate(table) if b is not None), len(table))


@pytest.mark.parametrize("caching", CACHING)
def test_window_of_the_in_flight_step_stays_allocated_after_rejection(seen, caching):
    facts = seen[caching]["async"]
    assert facts["managers"] == ["SlidingWindowManager", "FullAttentionManager"]
    assert facts["coordinator"] == ("HybridKVCacheCoordinator" if caching == "prefix_caching"
                                    else "KVCacheCoordinatorNoPrefixCache")
    after_b = _phase(facts["log"], "output B")
    r = after_b["requests"]["r"]
    # B's 15 drafts were rejected: one token each from A and B, and C (16 tokens)
    # in flight from position 201 on.
    assert r["num_tokens"] == PROMPT + 2
    assert r["num_computed_tokens"] == PROMPT + 1 + 1 + seen["drafts"]
    indices = _in_flight_window(seen, r)
    assert indices.start == (PROMPT + 1 - seen["window"] + 1) // seen["block_size"] == 8
    sliding, ref_cnt = r["tables"][0], r["ref_cnt"][0]
    other = after_b["requests"].get("other", {"tables": [[], []]})["tables"]
    for i in indices:
        assert sliding[i] is not None, f"sliding block {i} freed while the in-flight step attends to it"
        assert ref_cnt[i] >= 1
        assert sliding[i] not in other[0] + other[1]


@pytest.mark.parametrize("caching", CACHING)
def test_no_request_admitted_alongside_gets_a_block_of_the_in_flight_window(seen, caching):
    log = seen[caching]["async"]["log"]
    # The block ids the worker's table holds for the request when C is planned
    # (the scheduler sends only new ids; freed entries stay in the worker's table).
    held = _phase(log, "output A")["requests"]["r"]["tables"][0]
    after_c = _phase(log, "schedule C")
    r = _phase(log, "output B")["requests"]["r"]
    window_ids = {held[i] for i in _in_flight_window(seen, r) if i < len(held)}
    assert None not in window_ids and window_ids
    other = after_c["requests"].get("other")
    taken = set(other["tables"][0] + other["tables"][1]) if other else set()
    assert window_ids & taken == set()


@pytest.mark.parametrize("caching", CACHING)
def test_freeing_follows_the_settled_tokens(seen, caching):
    window, block = seen["window"], seen["block_size"]
    scheduled = [e for e in seen[caching]["async"]["log"] if e["phase"].startswith("schedule ")]
    assert [e["phase"] for e in scheduled] == ["schedule A", "schedule B", "schedule C", "schedule D"]
    for entry in scheduled:
        # Tokens whose output was processed when allocate_slots ran (the probe's own
        # count of the steps it had scheduled and not yet processed).
        settled = entry["allocated_at"]["r"] - entry["unsettled_at_allocation"]["r"]
        nulls = _leading_nulls(entry["requests"]["r"]["tables"][0])
        assert nulls == max(0, settled - window + 1) // block, entry["phase"]


@pytest.mark.parametrize("caching", CACHING)
def test_in_flight_tokens_count_the_unprocessed_steps(seen, caching):
    log = seen[caching]["async"]["log"]
    for entry in log:
        for rid, r in entry["requests"].items():
            assert r["num_in_flight_tokens"] == r["unsettled"], (entry["phase"], rid)
    assert log[-1]["phase"] == "output D"
    assert log[-1]["requests"]["r"]["num_in_flight_tokens"] == 0


@pytest.mark.parametrize("caching", CACHING)
def test_connector_gets_the_in_flight_window_on_finish(seen, caching):
    facts = seen[caching]["connector"]
    handed, before = facts["handed"], facts["before"]
    # Aborted while C (16 tokens, from position 201) is in flight.
    indices = _window_indices(seen, PROMPT + 1, facts["num_computed_tokens"] - 1)
    assert all(handed[0][i] != 0 for i in indices)  # 0: the null block
    # Nothing beyond what allocate_slots had freed on the settled basis.
    assert handed == [[0 if b is None else b for b in group] for group in before]


@pytest.mark.parametrize("scheduler", ["sync_scheduler", "sync_async_scheduler_class"])
@pytest.mark.parametrize("caching", CACHING)
def test_synchronous_scheduling_frees_as_before(seen, stock, caching, scheduler):
    def without_counter(log):
        return [{**e, "requests": {rid: {k: v for k, v in r.items() if k != "num_in_flight_tokens"}
                                   for rid, r in e["requests"].items()}} for e in log]

    log = seen[caching][scheduler]["log"]
    assert without_counter(log) == without_counter(stock[caching][scheduler]["log"])
    for entry in log:
        if entry["phase"].startswith("schedule "):
            # Every output processed before the next allocate_slots: the basis is
            # num_computed_tokens itself, and B's rejected drafts are rolled back first.
            assert entry["unsettled_at_allocation"]["r"] == 0
            nulls = _leading_nulls(entry["requests"]["r"]["tables"][0])
            assert nulls == max(0, entry["allocated_at"]["r"] - seen["window"] + 1) // seen["block_size"]
    assert _leading_nulls(_phase(log, "schedule B")["requests"]["r"]["tables"][0]) == 8


@pytest.mark.parametrize("caching", CACHING)
def test_full_attention_blocks_unchanged(seen, stock, caching):
    for facts in (seen, stock):
        for scenario in ("async", "sync_scheduler"):
            for entry in facts[caching][scenario]["log"]:
                for rid, r in entry["requests"].items():
                    assert None not in r["tables"][1], (scenario, entry["phase"], rid)
    assert [e["requests"]["r"]["tables"][1] for e in seen[caching]["sync_scheduler"]["log"]] == [
        e["requests"]["r"]["tables"][1] for e in stock[caching]["sync_scheduler"]["log"]]
