"""What the target was fed, per request and step: were a divergent request's inputs right?

Diagnosis only, read-only: ``install()`` wraps vLLM V1's ``GPUModelRunner._model_forward``
in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and, outside CUDA-graph capture,
copies the token ids and positions each scheduled request feeds the target (the
runner's own ``input_ids`` and ``positions`` buffers, so multimodal runs, which pass
embeddings, are covered too, and under async scheduling the draft tokens the GPU
filled in are what is read).

``check()`` replays a request's writes up to the step that fed its first divergent
token: every earlier position must hold the token of the reference sequence (prompt
plus reference output), or never have been fed (a prefix-cache hit). A mismatch there
means the request was fed a wrong token or position; none means its inputs were right
and its KV cache or attention metadata was not.
"""

from __future__ import annotations


class InputTrace:
    def __init__(self) -> None:
        self.group: str | None = None
        self.by_request: dict[str, dict] = {}

    def record(self, runner) -> None:
        n = runner.input_batch.num_reqs
        if n == 0:
            return
        bounds = runner.query_start_loc.np[:n + 1].tolist()
        total = bounds[-1]
        ids = runner.input_ids.gpu[:total].tolist()
        positions = runner.positions[:total].tolist()
        for i, rid in enumerate(runner.input_batch.req_ids[:n]):
            start, end = bounds[i], bounds[i + 1]
            entry = self.by_request.get(rid)
            if entry is None:
                prompt = list(runner.requests[rid].prompt_token_ids or [])
                entry = self.by_request[rid] = {"group": self.group, "prompt": prompt, "writes": []}
            pos = positions[start:end]
            # Contiguous positions (every step but a malformed one) are stored by their first.
            contiguous = pos == list(range(pos[0], pos[0] + len(pos))) if pos else True
            entry["writes"].append([pos[0] if contiguous and pos else pos, ids[start:end]])

    def summary(self, prompts: list[list[int]]) -> list[dict]:
        index = {tuple(p): i for i, p in enumerate(prompts)}
        return [{"group": e["group"], "prompt": index.get(tuple(e["prompt"])), "prompt_tokens": e["prompt"],
                 "writes": e["writes"]} for e in self.by_request.values()]


def _positions(write: list) -> list[int]:
    first, ids = write
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
    import torch
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    trace = InputTrace()
    forward = GPUModelRunner._model_forward

    def _model_forward(self, *args, **kwargs):
        if not torch.cuda.is_current_stream_capturing():
            trace.record(self)
        return forward(self, *args, **kwargs)

    GPUModelRunner._model_forward = _model_forward
    return trace
