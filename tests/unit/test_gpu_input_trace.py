"""tests/gpu/runs/input_trace.py's pure parts: recording a runner's inputs and checking a divergent
request's against its reference sequence, without vLLM or a GPU (the runner is a stand-in with
the buffers the hook reads, as CPU tensors)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from tests.unit.gpu_scripts import load as _load

it = _load("input_trace")


def _runner(req_ids, prompts, chunks):
    """chunks: per request, (first position, token ids) of this step, in batch order; one KV
    cache group whose slots are 100 + position."""
    bounds = np.cumsum([0] + [len(ids) for _, ids in chunks])
    ids = [t for _, c in chunks for t in c]
    positions = [p for first, c in chunks for p in range(first, first + len(c))]
    table = SimpleNamespace(slot_mapping=SimpleNamespace(gpu=torch.tensor([100 + p for p in positions] + [-1, -1])))
    return SimpleNamespace(
        input_batch=SimpleNamespace(num_reqs=len(req_ids), req_ids=list(req_ids),
                                    block_table=SimpleNamespace(block_tables=[table])),
        query_start_loc=SimpleNamespace(np=bounds),
        input_ids=SimpleNamespace(gpu=torch.tensor(ids + [0, 0], dtype=torch.int32)),  # padded, as graphs are
        positions=torch.tensor(positions + [0, 0]),
        requests={r: SimpleNamespace(prompt_token_ids=p) for r, p in zip(req_ids, prompts)})


def test_record_keeps_each_requests_writes_by_first_position_and_maps_prompts():
    trace = it.InputTrace()
    trace.group = "4"
    trace.record(_runner(["a", "b"], [[7, 8], [9]], [(0, [7, 8]), (0, [9])]))
    trace.record(_runner(["b"], [[9]], [(1, [5, 6, 6])]))
    rows = {r["prompt"]: r for r in trace.summary([[9], [7, 8]])}
    assert rows[1]["writes"] == [[0, [7, 8], [[100, 101]], 1]] and rows[1]["group"] == "4"
    assert rows[0]["writes"] == [[0, [9], [[100]], 1], [1, [5, 6, 6], [[101, 102, 103]], 2]]
    assert rows[0]["prompt_tokens"] == [9]


def test_check_finds_a_wrong_token_fed_before_the_divergence():
    expected = [1, 2, 3, 4, 5, 6]  # prompt [1, 2, 3], outputs [4, 5, 6]
    writes = [[0, [1, 2, 3]], [3, [4, 9, 9]], [4, [7, 9]], [5, [6]]]  # position 4 fed 7, not 5
    verdict = it.check(writes, expected, first_wrong=5)
    assert verdict["mismatches"] == 1 and verdict["first_mismatches"] == [[4, 7, 5]]
    assert verdict["steps_replayed"] == 3


def test_check_passes_rejected_drafts_overwritten_before_the_divergent_step():
    expected = [1, 2, 3, 4, 5, 6]
    # Drafts 9, 9 at positions 4, 5 are rejected; the next step rewrites position 4 with 5.
    writes = [[0, [1, 2, 3]], [3, [4, 9, 9]], [4, [5, 9]], [5, [8]]]
    verdict = it.check(writes, expected, first_wrong=5)
    assert verdict["mismatches"] == 0 and verdict["positions_fed"] == 5 and verdict["positions_not_fed"] == 0


def test_check_counts_prefix_cache_hits_as_not_fed():
    verdict = it.check([[2, [3]], [3, [4]]], [1, 2, 3, 4, 5], first_wrong=4)
    assert (verdict["positions_fed"], verdict["positions_not_fed"], verdict["mismatches"]) == (2, 2, 0)


SLIDING = [{"block_size": 2, "sliding_window": 4}]
FULL = [{"block_size": 2, "sliding_window": None}]


def _row(prompt, writes):
    """writes: (step, first position, slots) with one group."""
    return {"group": "2", "prompt": prompt, "writes": [[first, [0] * len(slots), [slots], step]
                                                       for step, first, slots in writes]}


def test_a_block_reused_while_its_owner_still_reads_it_is_a_conflict():
    # A writes positions 0..5 into blocks 10, 11, 12 (slots 20..25), then decodes on at 6 and 7.
    a = _row(0, [(1, 0, [20, 21, 22, 23, 24, 25]), (2, 6, [26]), (4, 7, [27])])
    # B takes block 10 (A's positions 0, 1) at step 2 and block 12 (positions 4, 5) at step 3.
    b = _row(1, [(2, 0, [20, 21]), (3, 2, [24, 25])])
    sliding = it.block_conflicts([a, b], SLIDING)
    # Window 4 at A's next query 7: positions 4..6 are read, so block 12, not block 10.
    assert sliding["conflicts"] == 1 and sliding["victims"] == [["2", 0]]  # one takeover, counted once
    assert {c["block"] for c in sliding["first"]} == {12}
    assert sliding["first"][0]["victim_positions"] == [4, 5]
    full = it.block_conflicts([a, b], FULL)
    assert {c["block"] for c in full["first"]} == {10, 12}


def test_blocks_of_an_ended_or_restarted_life_are_free_to_take():
    a = _row(0, [(1, 0, [20, 21, 22, 23]), (2, 4, [24]), (5, 0, [30, 31, 32, 33, 34])])  # restarts at 5
    b = _row(1, [(3, 0, [20, 21, 22, 23])])  # takes A's first life's blocks after A's preemption
    c = _row(2, [(6, 0, [24, 25])])  # A's first life never reads position 4 again
    assert it.block_conflicts([a, b, c], FULL)["conflicts"] == 0


def test_a_prefix_cache_block_rewritten_with_the_same_prompt_is_shared_not_taken():
    # A and B share the prompt's first 4 tokens; vLLM hands B A's cached blocks 10, 11 and,
    # when another group's hit is shorter, B recomputes positions 0..3 into them.
    a = {**_row(0, [(1, 0, [20, 21, 22, 23, 24]), (3, 5, [25]), (5, 6, [26])]), "prompt_tokens": [5, 6, 7, 8, 9]}
    b = {**_row(1, [(2, 0, [20, 21, 22, 23, 30]), (3, 5, [31]), (5, 6, [32])]), "prompt_tokens": [5, 6, 7, 8, 4]}
    assert it.block_conflicts([a, b], FULL)["conflicts"] == 0
    # The same slots with another prompt are a takeover: A still reads positions 0..3.
    c = {**b, "prompt": 2, "prompt_tokens": [1, 6, 7, 8, 4]}
    taken = it.block_conflicts([a, c], FULL)
    assert taken["conflicts"] == 2 and taken["victims"] == [["2", 0]]
    # And a write at another position into a shared block is one too, whoever shared it.
    d = {**_row(3, [(4, 7, [21])]), "prompt_tokens": [5, 6, 7, 8, 9]}
    late = it.block_conflicts([a, b, d], FULL)
    assert late["conflicts"] == 2 and sorted(late["victims"]) == [["2", 0], ["2", 1]]


def test_a_restart_preempted_during_its_recompute_is_a_life_of_its_own():
    # A restarts at 0 at step 3, is preempted again before decoding, and restarts at 0 at step 6:
    # the blocks of the step-3 life went back to the pool and B may take them at step 5.
    a = _row(0, [(1, 0, [20, 21]), (2, 2, [22]), (3, 0, [40, 41, 42]), (6, 0, [50, 51, 52]), (7, 3, [53])])
    b = _row(1, [(5, 0, [40, 41]), (8, 2, [42])])
    assert it.block_conflicts([a, b], FULL)["conflicts"] == 0
