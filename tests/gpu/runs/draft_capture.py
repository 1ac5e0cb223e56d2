"""Draft equivalence (issue 25, item 3): vLLM's DFlash drafts against the reference drafter,
fed the inputs vLLM's own drafter was fed.

``install(max_len, release)`` (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0) wraps,
read-only, vLLM 0.21.0's ``GPUModelRunner.propose_draft_token_ids`` (to hand the runner to
the drafter, as oracle.py does) and ``DFlashProposer.propose``, or 0.33.0's V2
``DFlashSpeculator.propose`` (its ``aux_hidden_states`` and ``input_batch``; the V2 runner is
0.33.0's default for DFlash, pinned by VLLM_USE_V2_MODEL_RUNNER=1). Per request it keeps what the
drafter received: the context features (``target_hidden_states``, the target's stream
after each ``target_layer_ids`` layer, before the drafter's ``fc``), their positions and
token ids, and per propose call the anchor (the bonus token's position), the bonus token
and the K drafts vLLM returned. Rows of rejected drafts (``num_rejected_tokens_gpu``) are
not context; a partial prefill chunk's drafts are discarded by vLLM and are not recorded.

``compare()`` runs dflash_reference.py's drafter (weights from the drafter checkpoint) on
the same features, positions and bonus tokens, one forward per request with every anchor,
and counts the contexts whose K drafts equal vLLM's, a draft counting as equal when the
reference's logit for vLLM's token is within one bf16 step of its own top one (compare.py's
tie rule). It also checks the features themselves against the Hugging Face target's
stream at the same layers for the same tokens (``features``: cosine similarity per row):
equal drafts on wrong features would hide a layer-offset bug.

Prefix caching must be off for these runs: a cached prefix feeds the drafter no features.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import hooks  # noqa: E402


@dataclass
class _Request:
    features: object  # torch tensor [max_len, F], bf16, CPU
    tokens: list[int]
    valid: list[bool]
    contexts: list[dict] = field(default_factory=list)


class Capture:
    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self.requests: dict[str, _Request] = {}
        self.calls = 0

    def _request(self, rid: str, width: int, dtype) -> _Request:
        import torch

        if rid not in self.requests:
            self.requests[rid] = _Request(torch.zeros(self.max_len, width, dtype=dtype),
                                          [0] * self.max_len, [False] * self.max_len)
        return self.requests[rid]

    def step(self, req_ids: list[str], bounds: list[int], positions: list[int], tokens: list[int],
             hidden, rejected: list[int], bonus: list[int], drafts: list[list[int]],
             sampled: list[bool]) -> None:
        """One propose call. ``hidden``: CPU [num_tokens, F]; row r of request i lies in
        bounds[i]:bounds[i + 1], its last ``rejected[i]`` rows were rejected drafts."""
        self.calls += 1
        for i, rid in enumerate(req_ids):
            start, end = bounds[i], bounds[i + 1] - rejected[i]
            if end <= start:
                continue
            req = self._request(rid, hidden.shape[1], hidden.dtype)
            keep = [row for row in range(start, end) if positions[row] < self.max_len]
            if keep:
                import torch

                # One indexed copy: a prefill chunk is thousands of rows, every propose call.
                req.features[torch.tensor([positions[row] for row in keep])] = hidden[torch.tensor(keep)]
                for row in keep:
                    req.tokens[positions[row]], req.valid[positions[row]] = tokens[row], True
            anchor = positions[end - 1] + 1
            if sampled[i] and anchor < self.max_len:
                req.contexts.append({"anchor": anchor, "bonus": bonus[i], "drafts": drafts[i]})


def install(max_len: int, release: str = "0.21.0") -> Capture:
    capture = Capture(max_len)
    if release == "0.21.0":
        _install_v1(capture)
    elif release == "0.33.0":
        _install_v2(capture)
    else:
        raise ValueError(f"draft_capture: no hook for vLLM {release} (0.21.0, 0.33.0)")
    return capture


def _install_v1(capture: Capture) -> None:
    import importlib

    hooks.hand_runner_to_drafter(importlib.import_module("vllm.v1.worker.gpu_model_runner").GPUModelRunner)
    proposer_cls = importlib.import_module("vllm.v1.spec_decode.dflash").DFlashProposer

    orig = proposer_cls.propose
    read = hooks.argument_reader(orig)

    def propose(self, *args, **kwargs):
        runner = hooks.runner_of(self)
        if runner is None or hooks.capturing():
            return orig(self, *args, **kwargs)
        a = read(self, args, kwargs)
        batch = hooks.v1_batch(runner, a)
        n = len(batch.req_ids)
        # Snapshots before the call: propose changes seq_lens in place, and the hidden
        # states are the raw features (combine_hidden_states runs inside).
        bounds = a["common_attn_metadata"].query_start_loc_cpu[:n + 1].tolist()
        total = bounds[-1]
        hidden = a["target_hidden_states"][:total].to("cpu")
        positions = a["target_positions"][:total].tolist()
        tokens = a["target_token_ids"][:total].tolist()
        out = orig(self, *args, **kwargs)
        capture.step(batch.req_ids, bounds, positions, tokens, hidden, batch.rejected, batch.bonus,
                     out[:n].tolist(), batch.sampled)
        return out

    proposer_cls.propose = propose


def _install_v2(capture: Capture) -> None:
    """0.33.0: DFlashSpeculator.propose gets the batch (``input_batch``: req_ids, token ids,
    positions, query_start_loc_np) and the target's ``aux_hidden_states`` itself; the bonus
    token is ``last_sampled[idx_mapping]``, a request drafts only with ``num_sampled > 0``, and
    the drafts are the first ``num_speculative_tokens`` columns of its output."""
    import importlib

    import torch

    cls = importlib.import_module("vllm.v1.worker.gpu.spec_decode.dflash.speculator").DFlashSpeculator
    orig = cls.propose
    read = hooks.argument_reader(orig)

    def propose(self, *args, **kwargs):
        a = read(self, args, kwargs)
        if a.get("dummy_run") or not a.get("aux_hidden_states") or hooks.capturing():
            return orig(self, *args, **kwargs)
        ib = a["input_batch"]
        batch = hooks.v2_batch(a)
        n, total = ib.num_reqs, ib.num_tokens
        bounds = ib.query_start_loc_np[:n + 1].tolist()
        hidden = torch.cat([h[:total] for h in a["aux_hidden_states"]], dim=-1).to("cpu")
        positions = ib.positions[:total].tolist()
        tokens = ib.input_ids[:total].tolist()
        out = orig(self, *args, **kwargs)
        k = a.get("num_speculative_tokens") or out.shape[-1]
        capture.step(batch.req_ids, bounds, positions, tokens, hidden, batch.rejected, batch.bonus,
                     out[:n, :k].tolist(), batch.sampled)
        return out

    cls.propose = propose


# ------------------------------------------------------------------ comparison


def reference_drafts(drafter, shared, features, anchors: list[int], bonus: list[int], semantics: str, k: int):
    """The reference's logits [A, K, V] for blocks at ``anchors`` over context rows
    ``features`` [T, F] (positions 0..T-1), each block seeing the rows before its anchor."""
    import torch

    import dflash_reference as ref

    device = next(drafter.parameters()).device
    feats = features.to(device)[None]
    ctx_pos = torch.arange(feats.shape[1], device=device)[None]
    anchor_t = torch.tensor(anchors, device=device)[None]
    bonus_t = torch.tensor(bonus, device=device)[None]
    with torch.no_grad():
        return ref.draft_logits(drafter, shared, feats, ctx_pos, bonus_t, anchor_t, semantics, k)[0]


def judge_context(logits, drafts: list[int]) -> str:
    """'equal' (vLLM's drafts are the reference's argmax), 'tie' (some differ, each within
    one bf16 step of the reference's top logit) or 'unequal'."""
    import compare

    differing = misses(logits, drafts)
    if not differing:
        return "equal"
    top_values = logits.max(-1).values
    ties = all(compare.is_tie(float(top_values[j]), float(logits[j, drafts[j]])) for j, _ in differing)
    return "tie" if ties else "unequal"


# vLLM's own warm-up requests (the 0.33.0 V2 runner's "_warmup_<i>_", made-up prompts and
# KV blocks before any user request): not contexts a user's drafter ever sees.
WARMUP_PREFIX = "_warmup_"


def misses(logits, drafts: list[int]) -> list[tuple[int, float]]:
    """(position, gap) where ``drafts`` is not the argmax of ``logits`` [K, V]: gap = the top
    logit minus the logit of the draft there (0 for an exact tie)."""
    top_values, top_ids = logits.max(-1)
    return [(j, float(top_values[j]) - float(logits[j, t])) for j, t in enumerate(drafts) if t != int(top_ids[j])]


def compare_capture(capture: Capture, drafter, shared, semantics: str, k: int, drafter_bf16=None) -> dict:
    """Draft equivalence over every recorded context whose context rows were all fed.

    The reference drafter runs in fp32; vLLM's in bf16, whose rounding moves logits by more
    than the one bf16 step of compare.py's tie rule. ``drafter_bf16`` (the same weights in
    bf16) measures that: where the bf16 reference's own drafts part from the fp32 reference's,
    their gaps are bf16 noise, and ``noise_bound`` is the largest. A context vLLM drafts
    differently is ``within_noise`` when every differing draft's gap is at most that bound:
    a correct bf16 implementation could have drafted it. A wrong input (features, embedding
    scale, mask, window) moves drafts by far more (the ablation rows)."""
    counts = {"equal": 0, "tie": 0, "unequal": 0}
    incomplete, warmup, first_unequal = 0, 0, []
    vllm_misses, ref16_misses = [], []  # per context: [(position, gap)]
    by_request: dict[str, int] = {}  # unequal contexts per request: spread out, or one request's?
    for rid, req in capture.requests.items():
        if rid.startswith(WARMUP_PREFIX):
            warmup += len(req.contexts)
            continue
        usable = [c for c in req.contexts if all(req.valid[:c["anchor"]])]
        incomplete += len(req.contexts) - len(usable)
        if not usable:
            continue
        width = max(c["anchor"] for c in usable)
        args = (req.features[:width], [c["anchor"] for c in usable], [c["bonus"] for c in usable], semantics, k)
        logits = reference_drafts(drafter, shared, *args)
        logits16 = reference_drafts(drafter_bf16, shared, *args) if drafter_bf16 is not None else None
        for i, (c, lg) in enumerate(zip(usable, logits)):
            lg = lg.float().cpu()
            verdict = judge_context(lg, c["drafts"][:k])
            counts[verdict] += 1
            vllm_misses.append(misses(lg, c["drafts"][:k]) if verdict == "unequal" else [])
            if logits16 is not None:
                ref16_misses.append(misses(lg, logits16[i].float().argmax(-1).tolist()))
            if verdict == "unequal":
                by_request[rid] = by_request.get(rid, 0) + 1
            if verdict == "unequal" and len(first_unequal) < 5:
                first_unequal.append({"request": rid, "anchor": c["anchor"], "vllm": c["drafts"][:k],
                                      "reference": lg.argmax(-1).tolist()})
    contexts = sum(counts.values())
    out = {"contexts": contexts, "equal": counts["equal"] + counts["tie"], "exact": counts["equal"],
           "ties": counts["tie"], "unequal": counts["unequal"], "incomplete_contexts": incomplete,
           "warmup_contexts_left_out": warmup,
           "equal_fraction": round((counts["equal"] + counts["tie"]) / contexts, 4) if contexts else None,
           "first_unequal": first_unequal, "semantics": semantics, "k": k,
           "unequal_positions": _position_histogram(vllm_misses, k),
           "unequal_requests": len(by_request),
           "unequal_most_in_one_request": sorted(by_request.items(), key=lambda kv: -kv[1])[:5]}
    if drafter_bf16 is not None:
        out["noise"] = bf16_noise_verdict(vllm_misses, ref16_misses, k)
    return out


def _position_histogram(per_context: list[list[tuple[int, float]]], k: int) -> list[int]:
    """How many differing drafts sit at each of the K positions."""
    hist = [0] * k
    for ms in per_context:
        for j, _ in ms:
            hist[j] += 1
    return hist


def bf16_noise_verdict(vllm_misses, ref16_misses, k: int) -> dict:
    """The calibrated verdict: vLLM's differing drafts against the bf16 reference's own."""
    ref_gaps = sorted(g for ms in ref16_misses for _, g in ms)
    bound = ref_gaps[-1] if ref_gaps else 0.0
    # One outlier sets the bound: the 99th percentile says how far the bulk of the noise goes
    p99 = ref_gaps[min(len(ref_gaps) - 1, int(0.99 * len(ref_gaps)))] if ref_gaps else 0.0
    unequal = [ms for ms in vllm_misses if ms]
    beyond = [ms for ms in unequal if max(g for _, g in ms) > bound]
    contexts = len(vllm_misses)
    vllm_gaps = sorted(g for ms in unequal for _, g in ms)
    return {"noise_bound": round(bound, 5), "noise_gap_p99": round(p99, 5),
            "reference_bf16_differing_drafts": len(ref_gaps),
            "vllm_unequal_beyond_p99": sum(1 for ms in unequal if max(g for _, g in ms) > p99),
            "reference_bf16_contexts_differing": sum(1 for ms in ref16_misses if ms),
            "reference_bf16_positions": _position_histogram(ref16_misses, k),
            "vllm_unequal_within_noise": len(unequal) - len(beyond),
            "vllm_unequal_beyond_noise": len(beyond),
            "vllm_max_gap": round(vllm_gaps[-1], 5) if vllm_gaps else None,
            "equal_or_within_noise_fraction":
                round((contexts - len(beyond)) / contexts, 4) if contexts else None}


def feature_agreement(capture: Capture, model, layer_ids, chunk_tokens: int = 32768) -> dict:
    """Captured feature rows against the Hugging Face target's stream at ``layer_ids`` for the
    same tokens (train_drafter.target_features): cosine similarity per row."""
    import torch

    import train_drafter

    cosines = []
    for rid, req in capture.requests.items():
        if rid.startswith(WARMUP_PREFIX):
            continue  # made-up prompts: not what any user's request feeds the drafter
        length = next((p for p, ok in enumerate(req.valid) if not ok), len(req.valid))
        if length < 2:
            continue
        feats, _, _ = train_drafter.target_features(model, [req.tokens[:length]], layer_ids, chunk_tokens)
        mine = req.features[:length].float()
        theirs = feats[0, :length].float().cpu()
        cosines.append(torch.nn.functional.cosine_similarity(mine, theirs, dim=-1))
    if not cosines:
        return {"rows": 0}
    allc = torch.cat(cosines)
    return {"rows": int(allc.numel()), "min_cosine": round(float(allc.min()), 5),
            "median_cosine": round(float(allc.median()), 5),
            "rows_below_0_99": int((allc < 0.99).sum())}
