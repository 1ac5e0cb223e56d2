"""What the target was fed, per request and step: were a divergent request's inputs right?

Diagnosis only, read-only: ``install()`` wraps vLLM V1's ``GPUModelRunner._model_forward``
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and, outside CUDA-graph capture,
copies the token ids and positions each scheduled request feeds the target (the
runner's own ``input_ids`` and ``positions`` buffers, so multimodal runs, which pass
embeddings, are covered too, and under async scheduling the draft tokens the GPU
filled in are what is read).

It also keeps, per write, the KV cache slot of every token in every KV cache group (the
runner's per-group ``slot_mapping``), and, for DFlash, the slots the drafter's query
tokens (bonus and masks) are written to in its own group: every KV write of the step.

``check()`` replays a request's writes up to the step that fed its first divergent
token: every earlier position must hold the token of the reference sequence (prompt
plus reference output), or never have been fed (a prefix-cache hit). A mismatch there
means the request was fed a wrong token or position; none means its inputs were right
and its KV cache or attention metadata was not.

``block_conflicts()`` then asks the KV question: did any write land in a block that
another request (or another group of the same request) had written and still reads?
Blocks are numbered in one pool for every group (slot // the group's block size), a
request reads a position of a sliding group while it lies within the window of its next
query position, and of a full group always, until the request restarts (preemption:
its writes start over at a lower position) or ends.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import hooks  # noqa: E402


class InputTrace:
    def __init__(self) -> None:
        self.group: str | None = None
        self.by_request: dict[str, dict] = {}
        self.step = 0

    def _entry(self, runner, rid: str) -> dict:
        entry = self.by_request.get(rid)
        if entry is None:
            prompt = list(runner.requests[rid].prompt_token_ids or [])
            entry = self.by_request[rid] = {"group": self.group, "prompt": prompt, "writes": [],
                                            "drafter_writes": []}
        return entry

    def record(self, runner) -> None:
        n = runner.input_batch.num_reqs
        if n == 0:
            return
        self.step += 1
        bounds = runner.query_start_loc.np[:n + 1].tolist()
        total = bounds[-1]
        ids = runner.input_ids.gpu[:total].tolist()
        positions = runner.positions[:total].tolist()
        tables = runner.input_batch.block_table.block_tables
        slots = [t.slot_mapping.gpu[:total].tolist() for t in tables]
        for i, rid in enumerate(runner.input_batch.req_ids[:n]):
            start, end = bounds[i], bounds[i + 1]
            pos = positions[start:end]
            # Contiguous positions (every step but a malformed one) are stored by their first.
            contiguous = pos == list(range(pos[0], pos[0] + len(pos))) if pos else True
            self._entry(runner, rid)["writes"].append(
                [pos[0] if contiguous and pos else pos, ids[start:end], [g[start:end] for g in slots], self.step])

    def record_drafter(self, runner, gid: int, positions: list[int], slots: list[int], per_request: int) -> None:
        """The drafter's query writes of this step (``per_request`` tokens a request, batch order)."""
        for i, rid in enumerate(runner.input_batch.req_ids[:runner.input_batch.num_reqs]):
            chunk = slice(i * per_request, (i + 1) * per_request)
            self._entry(runner, rid)["drafter_writes"].append([positions[chunk], slots[chunk], gid, self.step])

    def summary(self, prompts: list[list[int]]) -> list[dict]:
        index = {tuple(p): i for i, p in enumerate(prompts)}
        return [{"group": e["group"], "prompt": index.get(tuple(e["prompt"])), "prompt_tokens": e["prompt"],
                 "writes": e["writes"], "drafter_writes": e["drafter_writes"]} for e in self.by_request.values()]


def _positions(write: list) -> list[int]:
    first, ids = write[0], write[1]
    return list(range(first, first + len(ids))) if isinstance(first, int) else first


def check(writes: list[list], expected: list[int], first_wrong: int) -> dict:
    """``expected``: prompt + reference output; ``first_wrong``: the absolute position of
    the first divergent token. Replays the writes made before the first step that fed
    ``first_wrong`` as its first (verified) position, and compares positions below it."""
    state: dict[int, int] = {}
    steps = 0
    for write in writes:
        positions = _positions(write)
        if positions and positions[0] == first_wrong:
            break
        steps += 1
        state.update(zip(positions, write[1]))
    mismatches = [[p, state[p], expected[p]] for p in range(first_wrong)
                  if p in state and p < len(expected) and state[p] != expected[p]]
    return {"steps_replayed": steps, "positions_fed": sum(p in state for p in range(first_wrong)),
            "positions_not_fed": sum(p not in state for p in range(first_wrong)),
            "mismatches": len(mismatches), "first_mismatches": mismatches[:5]}


def install() -> InputTrace:
    from vllm.v1.spec_decode.dflash import DFlashProposer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    trace = InputTrace()
    forward = GPUModelRunner._model_forward

    def _model_forward(self, *args, **kwargs):
        if not hooks.capturing():
            trace.record(self)
        return forward(self, *args, **kwargs)

    hooks.hand_runner_to_drafter(GPUModelRunner)
    build = DFlashProposer.build_model_inputs_first_pass

    def build_model_inputs_first_pass(self, num_tokens, *args, **kwargs):
        runner = hooks.runner_of(self)
        if runner is not None and not hooks.capturing():
            per_request = 1 + self.num_speculative_tokens
            trace.record_drafter(runner, self.kv_cache_gid, self.positions[:num_tokens].tolist(),
                                 self._slot_mapping_buffer[:num_tokens].tolist(), per_request)
        return build(self, num_tokens, *args, **kwargs)

    GPUModelRunner._model_forward = _model_forward
    DFlashProposer.build_model_inputs_first_pass = build_model_inputs_first_pass
    return trace


# ------------------------------------------------------------------ KV block ownership


def _lives(writes: list[list]) -> list[list[list]]:
    """A request's writes split where it starts over (a first position at or below the last
    one's: recomputation after preemption). Every other step moves on by at least one token
    (a verify always keeps its bonus token), and a request preempted during its recompute
    prefill starts over at the same position 0 (seen on the H100)."""
    lives: list[list[list]] = [[]]
    last = -1
    for w in writes:
        first = _positions(w)[0] if _positions(w) else last
        if first <= last:
            lives.append([])
        lives[-1].append(w)
        last = first
    return lives


def block_conflicts(rows: list[dict], groups: list[dict], limit: int = 50) -> dict:
    """Writes into a block another (request, group) still reads. ``rows``: InputTrace.summary();
    ``groups``: the run's kv_cache_groups (block_size, sliding_window, per gid)."""
    events = []  # (step, order, request, life, gid, positions, slots)
    # Each request life's queries: (step, first position fed), in step order.
    next_query: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for r, row in enumerate(rows):
        lives = _lives(row["writes"])
        for life, writes in enumerate(lives):
            next_query[r, life] = [(w[3], _positions(w)[0]) for w in writes if _positions(w)]
            for w in writes:
                for gid, slots in enumerate(w[2]):
                    events.append((w[3], 0, r, life, gid, _positions(w), slots))
        for positions, slots, gid, step in row.get("drafter_writes") or []:
            life = max((n for n, lw in enumerate(lives) if lw and lw[0][3] <= step), default=0)
            events.append((step, 1, r, life, gid, positions, slots))
    events.sort(key=lambda e: (e[0], e[1]))
    owners: dict[int, dict] = {}  # block -> {"readers": {(request, life, gid): {positions}}, "slots": {slot: position}}
    conflicts = []
    for step, _, r, life, gid, positions, slots in events:
        size = groups[gid]["block_size"]
        for p, s in zip(positions, slots):
            if s < 0:
                continue
            b = s // size
            own = owners.get(b)
            me = (r, life, gid)
            if own is None or (me not in own["readers"] and not _shared(rows, own, me, p, s)):
                for reader, held in (own or {"readers": {}})["readers"].items():
                    needed = _still_read((*reader, held), step, next_query, groups)
                    if needed:
                        conflicts.append({"step": step, "block": b, "writer": _who(rows, r, gid, p),
                                          "victim": _who(rows, reader[0], reader[2], None),
                                          "victim_positions": needed[:8]})
                own = owners[b] = {"readers": {}, "slots": {}}
            own["readers"].setdefault(me, set()).add(p)
            own["slots"][s] = p
    victims = sorted({(c["victim"]["group"], c["victim"]["prompt"]) for c in conflicts}, key=str)
    return {"conflicts": len(conflicts), "victims": [list(v) for v in victims], "first": conflicts[:limit]}


def _shared(rows: list[dict], own: dict, me: tuple, position: int, slot: int) -> bool:
    """A prefix-cache block: ``me`` rewrites a slot at the position its readers wrote there,
    with the same prompt up to it (vLLM recomputes a cached block's tokens when another
    group's hit is shorter; the values are the same, so this takes nothing from anyone)."""
    if own["slots"].get(slot) != position:
        return False
    mine = rows[me[0]].get("prompt_tokens")
    for reader in own["readers"]:
        theirs = rows[reader[0]].get("prompt_tokens")
        if mine is None or theirs is None or position >= min(len(mine), len(theirs)) \
                or mine[:position + 1] != theirs[:position + 1]:
            return False
    return True


def _still_read(own: tuple, step: int, next_query: dict, groups: list[dict]) -> list[int]:
    """The positions of a block its owner (request, life, group) still reads after ``step``:
    those before the owner's next query position, within the group's window."""
    r, life, gid, positions = own
    later = [q for s, q in next_query.get((r, life), []) if s >= step]
    if not later:
        return []  # that life ended (finished or preempted): its blocks went back
    q = later[0]
    window = groups[gid].get("sliding_window")
    return sorted(p for p in positions if p < q and (window is None or p > q - window))


def _who(rows: list[dict], r: int, gid: int, position) -> dict:
    return {"group": rows[r]["group"], "prompt": rows[r]["prompt"], "kv_group": gid,
            **({"position": position} if position is not None else {})}
