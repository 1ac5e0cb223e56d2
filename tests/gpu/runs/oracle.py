"""Oracle proposer for the DFlash verify step (issue 24). Test-only: installed on the GPU
host for a run, never part of a recipe or the patch series.

With random drafters vLLM (almost) never accepts a draft, so the verify step's partial
acceptance (rejection, KV rollback, block-table and slot-mapping updates under batching and
preemption) never runs. The oracle forces it: the real DFlash proposer still runs (drafter
forward, its KV writes, its CUDA graphs), and its output is then overwritten in place with
the one-at-a-time reference continuation, made wrong at a first-wrong position ``f``
planned per request and proposal, so every accepted length 0..K occurs on purpose.

Pieces:

* planner (pure Python): ``first_wrong(seed, request, step, k)`` cycles through a shuffled
  permutation of 0..K per request, so every ``f`` occurs once in each K+1 proposals of a
  request; ``ideal_path``/``plan`` give the proposals and the histogram of a run without
  preemption; ``min_tokens_for_full_cycle(k)`` is the output length one request needs to
  see all K+1 values (137 for K=15).
* draft builder: ``build_draft(reference, n, f, k, ...)`` is ``reference[n:n+k]`` with
  position ``f`` replaced by a different, non-special token (f == k: all correct).
* vLLM's counters: ``counters_from_accepted`` (what ``SpecDecodingStats.observe_draft``
  accumulates) and ``hist_from_counters`` (hist[0] = drafts - pos[0],
  hist[i] = pos[i-1] - pos[i], hist[K] = pos[K-1]).
* runtime: ``Oracle.step(rows, k)`` decides each row's drafts and writes one JSON line per
  row to ``$ORACLE_LOG``; ``analyse(records, k)`` pairs each proposal with the step that
  verified it and returns the expected histogram (to equal vLLM's) and any step whose
  accepted length differs from the plan.
* ``install(release, plan_path)``: the hooks, 0.21.0 (V1 ``DFlashProposer.propose``) and
  0.33.0 (V2 ``DFlashSpeculator.propose``). torch and vLLM are imported inside functions,
  so this module imports on a CPU host without them.

Rows map to plan entries by prompt token ids (runner state), not by request id: LLM's
request counter runs on across ``generate`` calls (realshape runs 1, 4, 17, 32 in one
engine), and identical prompts have identical references anyway.
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import hooks  # noqa: E402

K_DEFAULT = 15
PLAN_VERSION = 1
TAILS = ("reference", "drafter")  # a proposal past its first wrong position (make_plan_file)
# ORACLE_LOG=off: no log line is written, and the drafts are gathered on the device (DeviceDrafts:
# nothing read back while a run is timed); they are the same drafts.
LOG_OFF = "off"
STEP_SLOTS = 65536  # DeviceDrafts' proposal counters: requests a server sees before they grow

# Hook points, by release (checked against the released sources in tests/unit/test_gpu_oracle.py).
HOOKS = {
    "0.21.0": {
        "runner": "v1",
        "proposer_module": "vllm.v1.spec_decode.dflash",
        "proposer_class": "DFlashProposer",
        "propose_params": ("target_token_ids", "next_token_ids", "common_attn_metadata",
                           "num_rejected_tokens_gpu"),
        "runner_module": "vllm.v1.worker.gpu_model_runner",
        "runner_method": "propose_draft_token_ids",
    },
    "0.33.0": {
        "runner": "v2",
        "proposer_module": "vllm.v1.worker.gpu.spec_decode.dflash.speculator",
        "proposer_class": "DFlashSpeculator",
        "propose_params": ("input_batch", "num_sampled", "num_rejected", "last_sampled",
                           "dummy_run", "num_speculative_tokens"),
        "states_module": "vllm.v1.worker.gpu.states",
        "states_class": "RequestState",
        "add_request_params": ("req_id", "prompt_len", "all_token_ids"),
    },
}


# ------------------------------------------------------------------ planner


def first_wrong(seed: int, request: int, step: int, k: int = K_DEFAULT) -> int:
    """First-wrong position f in 0..k of a request's ``step``-th proposal (f == k: all
    k drafts correct). Proposals step c*(k+1) .. c*(k+1)+k of a request are one shuffled
    permutation of 0..k, seeded by (seed, request, c): deterministic, and every f occurs
    once per k+1 proposals."""
    cycle, j = divmod(step, k + 1)
    perm = list(range(k + 1))
    random.Random(f"oracle/{seed}/{request}/{cycle}").shuffle(perm)
    return perm[j]


def planned_first_wrong(request: dict, seed: int, index: int, step: int, k: int = K_DEFAULT) -> int:
    """The first-wrong position of a plan request's ``step``-th proposal: its ``f_cycle``
    (a fixed pattern, repeated; a level of acceptance, issue 53) where the plan gives one, else
    ``first_wrong``'s permutation."""
    cycle = request.get("f_cycle")
    if cycle:
        return min(int(cycle[step % len(cycle)]), k)
    return first_wrong(seed, index, step, k)


def min_tokens_for_full_cycle(k: int = K_DEFAULT) -> int:
    """Output tokens one request needs so that a full cycle (every f once) is verified
    without preemption: one from prefill, then f+1 per proposal, sum over f=0..k, plus one
    so the last proposal is made before max_tokens."""
    return 1 + (k + 1) * (k + 2) // 2


def ideal_path(max_tokens: int, seed: int, request: int, k: int = K_DEFAULT) -> list[tuple[int, int]]:
    """(n, f) of each verified proposal of a request run alone, without preemption or
    trimmed drafts: n output tokens exist when it is proposed (1 after prefill), f is its
    first-wrong position; the verify step accepts f and samples one, n -> n+f+1. A proposal
    made at n >= max_tokens is never verified (the request has finished)."""
    path, n, step = [], 1, 0
    while n < max_tokens:
        f = first_wrong(seed, request, step, k)
        path.append((n, f))
        n += f + 1
        step += 1
    return path


def histogram(values, k: int = K_DEFAULT) -> list[int]:
    hist = [0] * (k + 1)
    for v in values:
        hist[v] += 1
    return hist


def plan(max_tokens: list[int], seed: int, k: int = K_DEFAULT) -> dict:
    """Per request (index into ``max_tokens``) the first-wrong position of each step on the
    ideal path, and the run's expected acceptance histogram (no preemption, full drafts)."""
    steps = [[f for _, f in ideal_path(m, seed, r, k)] for r, m in enumerate(max_tokens)]
    hist = histogram((f for fs in steps for f in fs), k)
    return {"k": k, "seed": seed, "steps": steps, "histogram": hist,
            "every_f_occurs": all(hist)}


# ------------------------------------------------------------------ drafts


def wrong_token(ref_token: int, vocab_size: int, special_ids=()) -> int:
    """A token id != ref_token, not special: (ref+1) % vocab, stepping on past specials."""
    special = set(special_ids)
    t = (ref_token + 1) % vocab_size
    while t == ref_token or t in special:
        t = (t + 1) % vocab_size
    return t


def build_draft(reference: list[int], n: int, f: int, k: int, vocab_size: int,
                special_ids=()) -> tuple[list[int], int, bool]:
    """The k draft tokens for a request with n output tokens: reference[n:n+k], with
    position f (< k) replaced by a different token. Positions past the reference's end are
    padded with a wrong-looking token; the target's own token there is unknown, so such a
    draft is marked ``tail`` (the reference should hold max_tokens + k tokens to avoid it).
    Returns (draft, f_eff, tail), f_eff = the first position that is not reference-correct
    (min(f, k, tokens left in the reference))."""
    avail = max(0, min(k, len(reference) - n))
    draft = list(reference[n:n + avail])
    f_eff = min(f, k)
    if f_eff < avail:
        draft[f_eff] = wrong_token(reference[n + f_eff], vocab_size, special_ids)
    # The first position not known to be correct is a pad: the accepted length is then
    # avail, or more if the target happens to produce the pad token.
    tail = avail < k and f_eff >= avail
    if avail < k:
        pad = wrong_token(reference[-1] if reference else 0, vocab_size, special_ids)
        draft += [pad] * (k - avail)
        f_eff = min(f_eff, avail)
    return draft, f_eff, tail


# ------------------------------------------------------------------ vLLM's counters


def counters_from_accepted(accepted: list[int], k: int = K_DEFAULT) -> tuple[int, list[int]]:
    """(num_drafts, num_accepted_tokens_per_pos) as SpecDecodingStats.observe_draft adds
    them up: pos[i] += 1 for i < accepted, per verified draft."""
    pos = [0] * k
    for a in accepted:
        for i in range(a):
            pos[i] += 1
    return len(accepted), pos


def hist_from_counters(num_drafts: int, pos: list[int]) -> list[int]:
    """Histogram of accepted lengths 0..K from vLLM's counters:
    hist[i] = pos[i-1] - pos[i] with pos[-1] = num_drafts and pos[K] = 0."""
    ext = [num_drafts] + list(pos) + [0]
    return [ext[i] - ext[i + 1] for i in range(len(pos) + 1)]


# ------------------------------------------------------------------ plan file


def make_plan_file(path, prompts: list[list[int]], references: list[list[int]],
                   max_tokens: list[int], vocab_size: int, special_ids=(), seed: int = 0,
                   k: int = K_DEFAULT, f_cycles: list | None = None, tail: str = "reference") -> dict:
    """The plan the oracle reads on the GPU host. ``references[i]`` is the one-at-a-time
    greedy continuation of ``prompts[i]``; it should hold max_tokens[i] + k tokens (a
    verify step may accept drafts past max_tokens, and vLLM's counters count them).
    ``f_cycles[i]``: the first-wrong pattern of request i (``planned_first_wrong``), or None.
    ``tail`` (``TAILS``): what a proposal holds past its first wrong position, which no verify
    accepts: the reference's tokens, or the real drafter's own (the oracle then sets only the
    positions acceptance needs, and a verify step sees the drafter's guesses after them)."""
    assert len(prompts) == len(references) == len(max_tokens)
    if tail not in TAILS:
        raise ValueError(f"tail {tail!r}: one of {', '.join(TAILS)}")
    cycles = [None] * len(prompts) if f_cycles is None else f_cycles
    assert len(cycles) == len(prompts)
    data = {"version": PLAN_VERSION, "k": k, "seed": seed, "vocab_size": vocab_size,
            "special_ids": sorted(set(special_ids)), **({"tail": tail} if tail != TAILS[0] else {}),
            "requests": [{"prompt": list(p), "reference": list(r), "max_tokens": m,
                          "short": len(r) < m + k, **({"f_cycle": list(fc)} if fc else {})}
                         for p, r, m, fc in zip(prompts, references, max_tokens, cycles)]}
    tmp = Path(str(path) + ".partial")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # whole or absent: a server may be waiting for it (ORACLE_PLAN_LATER)
    return data


# ORACLE_PLAN_LATER=1: the plan file may not exist yet when the server starts, and may be written
# again while it runs (the speed-up curve makes its references and its controls on the same server
# first, then writes one point's plan before each point): the oracle proposes nothing while there is
# none, and reads it again whenever the file is replaced.
PLAN_LATER_ENV = "ORACLE_PLAN_LATER"


def dropped_marker(plan_path) -> Path:
    """The file an oracle leaves once it has found its watched plan gone and let the real
    drafter propose again (the speed-up curve's control after a point's plan)."""
    return Path(str(plan_path) + ".dropped")


def gather_marker(plan_path) -> Path:
    """The file an oracle leaves beside a watched plan saying how its timed path gathers drafts:
    ``graph``, or ``eager: `` and why (no CUDA device, ``ORACLE_GRAPHS=0``, a capture that failed);
    written again when that changes."""
    return Path(str(plan_path) + ".gather")


def adopted_marker(plan_path) -> Path:
    """The file an oracle leaves beside a watched plan each time it has read it (the harness
    removes it before it writes the plan)."""
    return Path(str(plan_path) + ".adopted")


def empty_plan() -> dict:
    return {"version": PLAN_VERSION, "k": K_DEFAULT, "seed": 0, "vocab_size": 0, "requests": []}


def load_plan(path) -> dict:
    return plan_data(json.loads(Path(path).read_text()), path)


def plan_data(data: dict, path) -> dict:
    if data.get("version") != PLAN_VERSION:
        raise ValueError(f"oracle plan {path}: version {data.get('version')} != {PLAN_VERSION}")
    return data


# ------------------------------------------------------------------ runtime


@dataclass
class Row:
    """One row of a propose call, read from the runner before the real propose ran.

    seq_len: the verified batch's sequence length (computed + scheduled, drafts included);
    num_rejected: drafts rejected in that step (0 when none were scheduled);
    drafts: drafts verified in that step for this request (0 for a prefill);
    sampled: whether that step sampled a token for this request (False: a prefill chunk
    that is not the last, whose drafts vLLM drops);
    last_token: the token that step sampled (the drafter's next_token_ids), checked
    against reference[n-1] as a cross-check of n."""

    req_id: str
    prompt: tuple | None
    seq_len: int
    num_rejected: int
    drafts: int
    sampled: bool = True
    last_token: int | None = None


class Oracle:
    def __init__(self, plan_data: dict, log_path=None, later: Path | None = None):
        self.later = later  # a watched plan file (ORACLE_PLAN_LATER): read whenever it is replaced
        self.seen = None  # the watched file's identity when it was last read
        self.adopt(plan_data)
        self.log_path = Path(log_path) if log_path else None
        self.prompts: dict[str, tuple] = {}  # req_id -> prompt ids (V2: from add_request)
        self.steps: dict[str, int] = {}  # req_id -> proposals made so far
        self.calls = 0
        self.proposals = 0
        self.lengths: dict[int, int] = {}  # the last call's rows set only in part (``step``)
        self.device = DeviceDrafts(self)  # the log-off path (timed runs)

    def adopt(self, plan_data: dict) -> None:
        self.plan = plan_data
        self.k = plan_data["k"]
        self.seed = plan_data["seed"]
        self.vocab_size = plan_data["vocab_size"]
        self.special_ids = tuple(plan_data.get("special_ids", ()))
        self.tail = plan_data.get("tail", TAILS[0])
        self.requests = plan_data["requests"]
        self.by_prompt = {}
        for i, r in enumerate(self.requests):
            self.by_prompt.setdefault(tuple(r["prompt"]), i)

    def read_later_plan(self) -> bool:
        """The watched plan, adopted whenever its file is new, dropped when the file is gone (one
        stat a propose call). While there is none every row keeps the real drafter's tokens and
        this is False. Each adoption leaves ``adopted_marker``, each drop ``dropped_marker``."""
        if self.later is None:
            return True
        try:
            st = self.later.stat()
        except FileNotFoundError:
            if self.seen is not None:
                self.adopt(empty_plan())
                self.seen = None
                dropped_marker(self.later).touch()
            return False
        if (st.st_ino, st.st_mtime_ns, st.st_size) != self.seen:
            try:
                with self.later.open() as fh:  # identity and content from one open file
                    st = os.fstat(fh.fileno())
                    data = plan_data(json.load(fh), self.later)
            except FileNotFoundError:
                return self.read_later_plan()
            self.adopt(data)
            self.seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            adopted_marker(self.later).touch()  # the harness checks that this plan was read
        return True

    def note_prompt(self, req_id: str, prompt) -> None:
        self.prompts[req_id] = tuple(prompt)

    def step(self, rows: list[Row], k: int | None = None) -> dict[int, list[int]]:
        """Drafts for the rows of one propose call: {row index: k token ids}. Rows left
        out keep the real drafter's tokens (unknown prompt, prefill chunk, k == 0).
        Every row gets a log line, proposal or not, so ``analyse`` sees each verify step."""
        self.read_later_plan()
        k = self.k if k is None else k
        self.calls += 1
        out, lines = {}, []
        self.lengths = {}  # rows whose proposal is set only up to its first wrong position (tail "drafter")
        for i, row in enumerate(rows):
            prompt = row.prompt if row.prompt is not None else self.prompts.get(row.req_id)
            p = self.by_prompt.get(prompt) if prompt is not None else None
            rec = {"call": self.calls, "row": i, "req": row.req_id, "p": p,
                   "d": row.drafts, "sampled": bool(row.sampled)}
            if p is None:  # vLLM's warm-up or a mapping fault: analyse tells them apart
                lines.append(rec)
                continue
            ref = self.requests[p]["reference"]
            n = row.seq_len - row.num_rejected + 1 - len(prompt)
            rec["n"] = n
            if row.sampled and row.last_token is not None and 1 <= n <= len(ref):
                rec["last_ok"] = ref[n - 1] == row.last_token
            if row.sampled and n >= 1 and k > 0:
                step = self.steps.get(row.req_id, 0)
                self.steps[row.req_id] = step + 1
                f = planned_first_wrong(self.requests[p], self.seed, p, step, self.k)
                draft, f_eff, tail = build_draft(ref, n, min(f, k), k, self.vocab_size,
                                                 self.special_ids)
                rec.update(step=step, f=f, f_eff=f_eff, k=k, tail=tail, draft=draft)
                out[i] = draft
                if self.tail == "drafter" and f_eff + 1 < k:
                    self.lengths[i] = rec["set"] = f_eff + 1
                self.proposals += 1
            lines.append(rec)
        if self.log_path is not None:
            with self.log_path.open("a") as fh:
                for rec in lines:
                    fh.write(json.dumps(rec) + "\n")
        return out


class DeviceDrafts:
    """``Oracle.step``'s drafts computed on the device, for timed runs (``ORACLE_LOG=off``).

    ``Oracle.step`` needs each row's sequence length, rejected drafts and sampled flag on the
    host. Reading them back waits for the verify step to finish, and under async scheduling
    (vLLM 0.33.0's default for DFlash) that wait exposes the host's preparation of the next step,
    which a timed run would count as the drafter's cost. Here the plan becomes tensors once
    (references, their wrong tokens, first-wrong positions by step) and a propose call only
    gathers from them on the device: nothing is read back, and the host sends a call's row
    indices only when the batch's requests change (0.21.0's sampled flags, a host array there, go
    with each call, pinned and non-blocking). The drafts equal ``Oracle.step``'s
    (tests/unit/test_gpu_oracle.py runs both through the same simulated engine); no log is
    written, since the log needs the values on the host."""

    def __init__(self, oracle: "Oracle"):
        self.oracle = oracle
        self.tables = None  # (plan, device, refs, wrong, first_wrong, reference lengths)
        # the last call's [rows, k] mask of positions it sets (tail "drafter": up to the first
        # wrong one), or None (every position of a used row): ``write``'s ``keep``
        self.keep = None
        self.slots: dict[str, int] = {}  # req_id -> its proposal counter's index
        self.p_of: dict[str, int] = {}  # req_id -> plan request (-1: not planned)
        self.steps = None  # proposals made so far, per slot (device)
        self.rows_key, self.rows = None, None
        self.graphs = None  # oracle_graph.GraphedDrafts, made on the first CUDA call of a timed run
        self.gather = None  # how the last timed call gathered (gather_marker)

    def _build(self, device) -> None:
        import torch

        o = self.oracle
        reqs = o.requests
        width = max((len(r["reference"]) for r in reqs), default=0) + o.k + 1
        # A request proposes at most once per output token, and one proposal ends past max_tokens;
        # past that the steps wrap, which keeps an f_cycle (one or two values) exact at any step.
        horizon = max((r["max_tokens"] for r in reqs), default=0) + 2
        horizon += horizon % 2
        refs, wrong, first, lens = [], [], [], []
        for p, r in enumerate(reqs):
            lens.append([len(r["reference"])])
            ref = list(r["reference"])
            pad = wrong_token(ref[-1] if ref else 0, o.vocab_size, o.special_ids)
            fill = [pad] * (width - len(ref))
            refs.append(ref + fill)
            wrong.append([wrong_token(t, o.vocab_size, o.special_ids) for t in ref] + fill)
            first.append([planned_first_wrong(r, o.seed, p, step, o.k) for step in range(horizon)])

        def as_tensor(rows):
            host = torch.tensor(rows or [[0]], dtype=torch.long)
            return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)
        self.tables = (o.plan, device, as_tensor(refs), as_tensor(wrong), as_tensor(first), as_tensor(lens)[:, 0])
        self.p_of, self.rows_key = {}, None  # rows mapped under an earlier plan map again

    def _plan_request(self, req_id: str, prompt_of) -> int:
        if req_id not in self.p_of:
            prompt = prompt_of(req_id)
            p = self.oracle.by_prompt.get(tuple(prompt)) if prompt is not None else None
            self.p_of[req_id] = -1 if p is None else p
        return self.p_of[req_id]

    def row_tensors(self, req_ids: list[str], prompt_of, device):
        """(plan request, counter slot, prompt length) of each row, on the device: sent again
        only when the rows' requests change."""
        import torch

        key = tuple(req_ids)
        if key != self.rows_key:
            p = [self._plan_request(rid, prompt_of) for rid in req_ids]
            slot = [self.slots.setdefault(rid, len(self.slots)) for rid in req_ids]
            plen = [len(self.oracle.requests[i]["prompt"]) if i >= 0 else 0 for i in p]
            host = torch.tensor([p, slot, plen], dtype=torch.long)
            if device.type == "cuda":
                host = host.pin_memory()
            self.rows = host.to(device, non_blocking=True)
            self.rows_key = key
            self._grow(len(self.slots), device)
        return self.rows[0], self.rows[1], self.rows[2]

    def _grow(self, n: int, device) -> None:
        import torch

        if self.steps is None or self.steps.shape[0] < n:
            # room for a server's whole run (a slot a request), so that a timed run does not grow
            # it: the graphs read it by address and would be captured again
            steps = torch.zeros(max(STEP_SLOTS, 2 * n), dtype=torch.long, device=device)
            if self.steps is not None:
                steps[:self.steps.shape[0]] = self.steps
            self.steps = steps

    def drafts(self, req_ids: list[str], prompt_of, seq_lens, rejected, sampled, k: int):
        """(drafts [rows, k], use [rows]): ``use`` marks the rows ``Oracle.step`` would
        propose for (planned, sampled, at least one output token, k > 0); the others keep the
        real drafter's tokens. ``prompt_of(req_id)``: its prompt ids or None, asked once a
        request. ``seq_lens``, ``rejected``, ``sampled``: the rows' values on the device, read
        before the real propose runs (it edits seq_lens in place)."""
        import torch

        with torch.inference_mode():  # as vLLM's propose runs: the counters stay inference tensors
            return self._drafts(req_ids, prompt_of, seq_lens, rejected, sampled, k)

    def _drafts(self, req_ids, prompt_of, seq_lens, rejected, sampled, k: int):
        device = seq_lens.device
        self.ready(device)
        p, slot, plen = self.row_tensors(req_ids, prompt_of, device)
        out, use, self.keep = self.compute(p, slot, plen, seq_lens, rejected, sampled, k)
        return out, use

    def _say_gather(self, how: str) -> None:
        if how != self.gather and self.oracle.later is not None:
            gather_marker(self.oracle.later).write_text(how + "\n")
        self.gather = how

    def ready(self, device) -> None:
        """The plan's tables on ``device``, built again when the plan or the device changed."""
        if self.tables is None or self.tables[0] is not self.oracle.plan or self.tables[1] != device:
            self._build(device)

    def compute(self, p, slot, plen, seq_lens, rejected, sampled, k: int):
        """(drafts [rows, k], use [rows], keep [rows, k] or None) from the rows' tensors, and each
        used row's proposal counted: device operations only, nothing read back, so that a CUDA
        graph can hold them (``oracle_graph.GraphedDrafts``)."""
        import torch

        _, device, refs, wrong, first, lens = self.tables
        planned = p >= 0
        p = p.clamp(min=0)
        n = seq_lens.long() - rejected.long() + 1 - plen
        use = planned & sampled.bool() & (n >= 1) & (k > 0)
        step = self.steps[slot]
        f = first[p, step % first.shape[1]].clamp(max=k)
        cols = torch.arange(k, device=device)
        pos = (n.clamp(min=0)[:, None] + cols[None, :]).clamp(max=refs.shape[1] - 1)
        rows = p[:, None]
        out = torch.where(cols[None, :] == f[:, None], wrong[rows, pos], refs[rows, pos])
        self.steps.index_add_(0, slot, use.long())
        keep = None
        if self.oracle.tail == "drafter":  # the first position not reference-correct, as build_draft's f_eff
            f_eff = torch.minimum(f, (lens[p] - n).clamp(min=0))
            keep = cols[None, :] <= f_eff[:, None]
        return out, use, keep

    def timed(self, req_ids: list[str], prompt_of, seq_lens, rejected, sampled, run, k=None):
        """One propose call of a timed run: the rows' values copied (the real propose may edit
        seq_lens in place), ``run()`` (the real propose: its [rows, K] output), then the used
        rows' drafts written over that output, which is returned. ``rejected`` None: none;
        ``sampled``: a flag or count a row (a host tensor goes over non-blocking, pinned). On a
        CUDA device the gather is one graph replay (``oracle_graph``) unless ``ORACLE_GRAPHS=0``:
        at about 30 small operations a call its launches cost the host more than half a
        millisecond on an H200 host (results/speedup-oracle-overhead.json), which a short step
        does not hide."""
        import torch

        graphs = seq_lens.is_cuda and os.environ.get("ORACLE_GRAPHS", "1") != "0"
        if graphs and self.graphs is None:
            import oracle_graph

            self.graphs = oracle_graph.GraphedDrafts(self)
        if graphs and not self.graphs.failed:
            out = self.graphs.timed(req_ids, prompt_of, seq_lens, rejected, sampled, run, k)
        else:
            out = self._timed_eager(req_ids, prompt_of, seq_lens, rejected, sampled, run, k)
        why = "no CUDA device" if not seq_lens.is_cuda else "ORACLE_GRAPHS=0" if not graphs else self.graphs.failed
        self._say_gather("graph" if why is None else f"eager: {why}")
        return out

    def _timed_eager(self, req_ids, prompt_of, seq_lens, rejected, sampled, run, k):
        import torch

        seq = seq_lens.to(torch.long, copy=True)
        rej = rejected.to(torch.long, copy=True) if rejected is not None else torch.zeros_like(seq)
        on = sampled.to(seq.device, non_blocking=True) > 0
        out = run()
        k = out.shape[-1] if k is None else int(k)
        drafts, use = self.drafts(req_ids, prompt_of, seq, rej, on, k)
        self.write(out, drafts, use, k, self.keep)
        return out

    @staticmethod
    def write(out, drafts, use, k: int, keep=None) -> None:
        """Into the propose output ([rows, K]) in place, on the current stream: the used
        rows' drafts in its first k columns, only where ``keep`` ([rows, k]) is true if given."""
        import torch

        with torch.inference_mode():
            n = drafts.shape[0]
            mask = use[:, None] if keep is None else use[:, None] & keep
            out[:n, :k] = torch.where(mask, drafts.to(out.dtype), out[:n, :k])


def read_log(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def analyse(records: list[dict], k: int = K_DEFAULT, max_tokens: list[int] | None = None) -> dict:
    """Pair each proposal with the next record of its request. A next record with d > 0
    verified it: expected accepted = min(f_eff, d), observed = n_next - n - 1. A next record
    with d == 0 (preemption, then re-prefill) or none (the request finished) means it was
    never verified; vLLM does not count those either.

    Nor does it count a verify of a proposal made once the request already had its
    ``max_tokens[p]`` outputs: the async scheduler has scheduled that step before the
    output that finished the request was processed, and ``Scheduler.update_from_output``
    skips finished requests, spec-decode stats included. Found on the H100:
    those 48 of 781 verifies were exactly the difference between vLLM's histogram and
    this one. They stay in the mismatch check (the target still verified them)."""
    last: dict[str, dict] = {}
    expected, planned, observed, mismatches = [], [], [], []
    unplanned = trimmed = tail = last_bad = after_finish = 0
    for rec in records:
        if rec.get("p") is None:
            continue
        last_bad += rec.get("last_ok") is False
        prev = last.get(rec["req"])
        if rec["d"] > 0:
            if prev is None or "f" not in prev:
                unplanned += 1  # drafts verified that the oracle did not write
            else:
                e = min(prev["f_eff"], rec["d"])
                a = rec["n"] - prev["n"] - 1
                if max_tokens is not None and prev["n"] >= max_tokens[prev["p"]]:
                    after_finish += 1  # drafts past the reference's end are allowed here: discarded
                else:
                    expected.append(e)
                    planned.append(prev["f_eff"])
                    tail += bool(prev.get("tail"))
                observed.append(a)
                trimmed += rec["d"] < prev["k"]
                if a != e:
                    mismatches.append({"req": rec["req"], "p": rec["p"], "call": rec["call"],
                                       "n": prev["n"], "f": prev["f_eff"], "d": rec["d"],
                                       "accepted": a})
        last[rec["req"]] = rec
    hist = histogram(expected, k)
    return {"verified": len(expected), "expected_hist": hist,
            "planned_hist": histogram(planned, k), "observed_hist": histogram(observed, k),
            "every_f_occurs": all(hist), "mismatches": mismatches[:20],
            "num_mismatches": len(mismatches), "unplanned_verifies": unplanned,
            "trimmed_drafts": trimmed, "tail_drafts": tail, "after_finish_verifies": after_finish,
            "last_token_mismatches": last_bad,
            **_unplanned_rows(records)}


def _unplanned_rows(records: list[dict]) -> dict:
    """Rows of prompts the plan lacks: in propose calls before the first call with a planned
    row they are vLLM's own warm-up (0.33.0 runs propose on "_warmup_N_" requests at
    start-up), from that call on a fault. A log with no planned row at all is all fault."""
    first = min((r["call"] for r in records if r.get("p") is not None), default=None)
    unplanned = [r for r in records if r.get("p") is None]
    warmup = [r for r in unplanned if first is not None and r["call"] < first]
    return {"warmup_rows": len(warmup), "unknown_rows": len(unplanned) - len(warmup)}


def check_counters(analysis: dict, num_drafts: int, pos: list[int]) -> dict:
    """Does vLLM's histogram (from spec_decode_num_drafts and
    spec_decode_num_accepted_tokens_per_pos) equal the oracle's expected one?"""
    vllm_hist = hist_from_counters(num_drafts, pos)
    return {"vllm_hist": vllm_hist, "expected_hist": analysis["expected_hist"],
            "equal": vllm_hist == analysis["expected_hist"]}


# ------------------------------------------------------------------ hooks (GPU host)


def _write_drafts(out, drafts: dict[int, list[int]], k: int, lengths: dict[int, int] | None = None) -> None:
    """Overwrite rows of the propose output tensor in place ([num_reqs, K] int64 on the
    GPU), on the current stream, after the real drafter wrote it; a row in ``lengths`` only
    in its first ``lengths[row]`` columns (the rest keep the drafter's tokens)."""
    import torch

    if not drafts:
        return
    lengths = lengths or {}
    idx = sorted(i for i in drafts if i not in lengths)
    with torch.inference_mode():
        if idx:
            rows = torch.tensor(idx, dtype=torch.long, device=out.device)
            vals = torch.tensor([drafts[i] for i in idx], dtype=out.dtype, device=out.device)
            out[rows, :k] = vals
        for i, n in lengths.items():  # the logged path: not timed, a copy a row is fine
            out[i, :n] = torch.tensor(drafts[i][:n], dtype=out.dtype, device=out.device)


def _install_v1(oracle: Oracle, hook: dict) -> None:
    """0.21.0: GPUModelRunner.propose_draft_token_ids stashes the step's scheduler output
    (drafts scheduled per request) and itself on the drafter; DFlashProposer.propose (inherited from
    SpecDecodeBaseProposer) snapshots seq_lens / num_rejected (propose subtracts the rejected
    from seq_lens in place), runs, then its [batch, K] output is overwritten. Row i is
    runner.input_batch.req_ids[i]."""
    import importlib

    mod = importlib.import_module(hook["proposer_module"])
    rmod = importlib.import_module(hook["runner_module"])
    cls = getattr(mod, hook["proposer_class"])
    hooks.hand_runner_to_drafter(rmod.GPUModelRunner, hook["runner_method"])

    orig = cls.propose
    read = hooks.argument_reader(orig)

    def propose(self, *args, **kwargs):
        if hooks.capturing():
            return orig(self, *args, **kwargs)
        a = read(self, args, kwargs)
        runner = hooks.runner_of(self)
        if runner is None:  # not called from the runner's propose_draft_token_ids
            return orig(self, *args, **kwargs)
        if oracle.log_path is None:
            return _timed_v1(oracle, runner, a, lambda: orig(self, *args, **kwargs))
        batch = hooks.v1_batch(runner, a)
        seq = a["common_attn_metadata"].seq_lens[:len(batch.req_ids)].tolist()
        sched = getattr(runner, "_hooks_scheduler_output", None)
        spec = getattr(sched, "scheduled_spec_decode_tokens", None) or {}
        out = orig(self, *args, **kwargs)
        rows = []
        for i, rid in enumerate(batch.req_ids):
            state = runner.requests.get(rid)
            prompt = tuple(state.prompt_token_ids) if state is not None and \
                state.prompt_token_ids is not None else None
            rows.append(Row(rid, prompt, int(seq[i]), int(batch.rejected[i]), len(spec.get(rid, ())),
                            sampled=batch.sampled[i], last_token=int(batch.bonus[i])))
        k = out.shape[-1]
        _write_drafts(out, oracle.step(rows, k), k, oracle.lengths)
        return out

    cls.propose = propose


def _install_v2(oracle: Oracle, hook: dict) -> None:
    """0.33.0, model runner V2: RequestState.add_request records each request's prompt
    (all_token_ids[:prompt_len]); DFlashSpeculator.propose (called positionally from
    model_runner.py) is bound by signature, skipped on dummy runs, and its output
    (self.draft_tokens[:num_reqs], [num_reqs, K] int64) overwritten in its first
    num_speculative_tokens columns. Row i is input_batch.req_ids[i]."""
    import importlib

    mod = importlib.import_module(hook["proposer_module"])
    smod = importlib.import_module(hook["states_module"])
    cls = getattr(mod, hook["proposer_class"])
    states_cls = getattr(smod, hook["states_class"])

    orig_add = states_cls.add_request
    read_add = hooks.argument_reader(orig_add)

    def add_request(self, *args, **kwargs):
        a = read_add(self, args, kwargs)
        oracle.note_prompt(a["req_id"], list(a["all_token_ids"])[:a["prompt_len"]])
        return orig_add(self, *args, **kwargs)

    orig = cls.propose
    read = hooks.argument_reader(orig)

    def propose(self, *args, **kwargs):
        a = read(self, args, kwargs)
        if a.get("dummy_run") or hooks.capturing():
            return orig(self, *args, **kwargs)
        if oracle.log_path is None:
            return _timed_v2(oracle, a, lambda: orig(self, *args, **kwargs))
        ib = a["input_batch"]
        batch = hooks.v2_batch(a)
        nreq = len(batch.req_ids)
        seq = ib.seq_lens[:nreq].tolist()
        per_req = getattr(ib, "num_draft_tokens_per_req", None)
        drafts = [int(x) for x in per_req[:nreq]] if per_req is not None else [0] * nreq
        out = orig(self, *args, **kwargs)
        kspec = a.get("num_speculative_tokens")
        k = out.shape[-1] if kspec is None else int(kspec)
        rows = [Row(rid, None, int(seq[i]), int(batch.rejected[i]), drafts[i], sampled=batch.sampled[i],
                    last_token=int(batch.bonus[i])) for i, rid in enumerate(batch.req_ids)]
        _write_drafts(out, oracle.step(rows, k), k, oracle.lengths)
        return out

    states_cls.add_request = add_request
    cls.propose = propose


def _plan_read(oracle: Oracle) -> bool:
    """The watched plan read if it is new; False while there is none (every row then keeps the
    real drafter's tokens, and the hook does nothing else)."""
    return oracle.read_later_plan()


def _timed_v1(oracle: Oracle, runner, a: dict, run):
    """0.21.0 with the log off: ``DeviceDrafts.timed`` around the real propose (it edits seq_lens
    in place, so the rows' values are copied before it); a row is sampled unless the runner's
    discard mask holds it."""
    import torch

    if not _plan_read(oracle):
        return run()
    req_ids = list(runner.input_batch.req_ids)
    n = len(req_ids)
    seq = a["common_attn_metadata"].seq_lens[:n]
    rej = a.get("num_rejected_tokens_gpu")
    mask = getattr(getattr(runner, "discard_request_mask", None), "np", None)
    keep = torch.tensor([not bool(mask[i]) if mask is not None else True for i in range(n)])

    def prompt_of(rid):
        ids = getattr(runner.requests.get(rid), "prompt_token_ids", None)
        return tuple(ids) if ids is not None else None

    return oracle.device.timed(req_ids, prompt_of, seq, rej[:n] if rej is not None else None,
                               keep.pin_memory() if seq.is_cuda else keep, run)


def _timed_v2(oracle: Oracle, a: dict, run):
    """0.33.0 with the log off: as ``_timed_v1``; prompts come from ``add_request``."""
    if not _plan_read(oracle):
        return run()
    ib = a["input_batch"]
    n = ib.num_reqs
    return oracle.device.timed(list(ib.req_ids)[:n], oracle.prompts.get, ib.seq_lens[:n], a["num_rejected"][:n],
                               a["num_sampled"][:n], run, a.get("num_speculative_tokens"))


_INSTALLED: dict = {}


def install(release: str, plan_path, log_path=None) -> Oracle:
    """Patch the release's DFlash propose so the oracle's drafts replace the real ones.
    Call in the process that runs the model runner before ``LLM(...)`` is built
    (VLLM_ENABLE_V1_MULTIPROCESSING=0), or through ``plugin()``. 0.33.0 needs the V2
    model runner (VLLM_USE_V2_MODEL_RUNNER=1 pins it). ``log_path`` defaults to
    $ORACLE_LOG, one JSON line per row and propose call."""
    if release not in HOOKS:
        raise ValueError(f"oracle: no hook for vLLM {release} (known: {', '.join(HOOKS)})")
    if release in _INSTALLED:
        return _INSTALLED[release]
    log_path = log_path or os.environ.get("ORACLE_LOG")
    if not log_path:
        raise ValueError("oracle: set ORACLE_LOG (the JSONL file the oracle writes, or 'off')")
    log_path = None if log_path == LOG_OFF else log_path
    if os.environ.get(PLAN_LATER_ENV) == "1":
        oracle = Oracle(empty_plan(), log_path, later=Path(plan_path))
    else:
        oracle = Oracle(load_plan(plan_path), log_path)
    hook = HOOKS[release]
    (_install_v1 if hook["runner"] == "v1" else _install_v2)(oracle, hook)
    _INSTALLED[release] = oracle
    return oracle


def plugin() -> None:
    """A ``vllm.general_plugins`` entry point (runs in every vLLM process): installs the
    oracle when $ORACLE_PLAN is set. Release: $ORACLE_RELEASE, else vllm.__version__."""
    plan_path = os.environ.get("ORACLE_PLAN")
    if not plan_path:
        return
    release = os.environ.get("ORACLE_RELEASE")
    if not release:
        import vllm

        release = vllm.__version__
    install(release, plan_path)
