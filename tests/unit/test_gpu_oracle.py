"""tests/gpu/runs/oracle.py on CPU (issue 24): the planner, the draft builder, the histogram
from vLLM's per-position counters, the runtime bookkeeping against a simulated engine
(batching, prefill chunks, preemption, trimmed drafts), and the hook points in the
released vLLM sources. The hooks themselves need vLLM on a GPU host: not run here."""

from __future__ import annotations

import ast
import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import GPU_DIR
from tests.unit.gpu_scripts import load as _load

oracle = _load("oracle")
K = 15
VOCAB = 4096
SPECIAL = (0, 1, 2, 3, 106)


# ------------------------------------------------------------------ planner


def test_first_wrong_is_a_permutation_per_cycle_and_deterministic_by_seed():
    for request in range(5):
        for cycle in range(3):
            fs = [oracle.first_wrong(7, request, cycle * (K + 1) + j, K) for j in range(K + 1)]
            assert sorted(fs) == list(range(K + 1))
    a = [oracle.first_wrong(7, 3, s, K) for s in range(64)]
    assert a == [oracle.first_wrong(7, 3, s, K) for s in range(64)]
    assert a != [oracle.first_wrong(8, 3, s, K) for s in range(64)]
    assert a != [oracle.first_wrong(7, 4, s, K) for s in range(64)]


def test_one_request_sees_every_f_once_it_has_enough_tokens():
    need = oracle.min_tokens_for_full_cycle(K)
    assert need == 137
    for seed in range(4):
        path = oracle.ideal_path(need, seed, 0, K)
        assert sorted(f for _, f in path[:K + 1]) == list(range(K + 1))
        assert path[0][0] == 1  # the first proposal follows prefill's one token
        for (n, f), (n2, _) in itertools.pairwise(path):
            assert n2 == n + f + 1
    # Fewer tokens cannot cover 0..15 with one request: sum(f+1) over all f is 136.
    assert not all(oracle.histogram((f for _, f in oracle.ideal_path(128, 0, 0, K)), K))


def test_plan_over_a_run_covers_every_f_and_is_reproducible():
    p = oracle.plan([128] * 4, seed=1, k=K)
    assert p["every_f_occurs"] and sum(p["histogram"]) == sum(len(s) for s in p["steps"])
    assert p == oracle.plan([128] * 4, seed=1, k=K)
    assert p["steps"] != oracle.plan([128] * 4, seed=2, k=K)["steps"]
    for r, fs in enumerate(p["steps"]):
        assert fs == [oracle.first_wrong(1, r, s, K) for s in range(len(fs))]


# ------------------------------------------------------------------ drafts


def _reference(length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(4, VOCAB) for _ in range(length)]


def test_draft_is_the_reference_up_to_f_and_differs_at_f():
    ref = _reference(300)
    ref[40] = VOCAB - 1  # (ref+1) % vocab wraps to 0, a special id
    ref[41] = 105  # ref+1 == 106, special
    for n in (1, 25, 40, 41, 200):
        for f in range(K + 1):
            draft, f_eff, tail = oracle.build_draft(ref, n, f, K, VOCAB, SPECIAL)
            assert len(draft) == K and f_eff == f and not tail
            assert draft[:f] == ref[n:n + f]
            if f < K:
                assert draft[f] != ref[n + f] and draft[f] not in SPECIAL
                assert draft[f + 1:] == ref[n + f + 1:n + K]
            else:
                assert draft == ref[n:n + K]
    assert oracle.wrong_token(VOCAB - 1, VOCAB, SPECIAL) == 4
    assert oracle.wrong_token(105, VOCAB, SPECIAL) == 107


def test_draft_at_the_end_of_the_reference_is_padded_and_marked():
    ref = _reference(100)
    draft, f_eff, tail = oracle.build_draft(ref, 90, 5, K, VOCAB, SPECIAL)
    assert draft[:5] == ref[90:95] and draft[5] != ref[95] and draft[6:10] == ref[96:100]
    assert len(draft) == K and f_eff == 5 and not tail  # wrong before the pad: still exact
    draft, f_eff, tail = oracle.build_draft(ref, 90, 12, K, VOCAB, SPECIAL)
    assert draft[:10] == ref[90:] and f_eff == 10 and tail
    assert all(t not in SPECIAL for t in draft[10:])
    draft, f_eff, tail = oracle.build_draft(ref, 100, 0, K, VOCAB, SPECIAL)
    assert len(draft) == K and f_eff == 0 and tail


# ------------------------------------------------------------------ vLLM's counters


def test_histogram_from_per_position_counters():
    rng = random.Random(3)
    fs = [rng.randrange(K + 1) for _ in range(500)] + list(range(K + 1))
    num_drafts, pos = oracle.counters_from_accepted(fs, K)
    assert num_drafts == len(fs) and len(pos) == K
    for i in range(K):
        assert pos[i] == sum(1 for f in fs if f > i)
    hist = oracle.hist_from_counters(num_drafts, pos)
    assert hist == oracle.histogram(fs, K)
    assert hist[0] == num_drafts - pos[0] and hist[K] == pos[K - 1]
    assert all(hist[i] == pos[i - 1] - pos[i] for i in range(1, K))


# ------------------------------------------------------------------ runtime vs a simulated engine


class _Engine:
    """A greedy target that follows its reference token by token, verifying drafts the way
    vLLM's rejection sampler does, and reporting each propose call's rows the way the
    hooks read them from the runner (seq_len before propose, rejected, drafts scheduled)."""

    def __init__(self, prompts, references, max_tokens, oracle_, k=K):
        self.prompts, self.refs, self.max_tokens, self.oracle, self.k = \
            prompts, references, max_tokens, oracle_, k
        self.accepted: list[int] = []  # what vLLM's SpecDecodingStats sees
        self.outputs = [[] for _ in prompts]

    def run(self, ids, chunked=(), preempt=(), trim=None):
        """ids: request indices run together; chunked: requests whose prefill takes two
        chunks; preempt: {(request, call)}: dropped then recomputed at that call;
        trim: {(request, call): d}: the scheduler schedules only d of the drafts."""
        state = {r: {"n": 0, "drafts": None, "chunks": 2 if r in chunked else 1} for r in ids}
        call = 0
        while state:
            call += 1
            rows, order = [], []
            for r, st in list(state.items()):
                prompt, ref = self.prompts[r], self.refs[r]
                rid = f"{r}-{r * 7919:08x}"  # vLLM-like: counter, random suffix
                if (r, call) in preempt:
                    st["drafts"] = None  # preempted: drafts dropped, all tokens recomputed
                    st["recompute"] = True
                    continue
                if st["chunks"] > 1:  # a prefill chunk that is not the last
                    st["chunks"] -= 1
                    rows.append(oracle.Row(rid, tuple(prompt), len(prompt) // 2, 0, 0,
                                           sampled=False, last_token=7))
                    order.append(r)
                    continue
                if st["n"] == 0 or st.pop("recompute", False):
                    seq_len, rej, d = len(prompt) + st["n"], 0, 0
                    st["n"] += 1
                else:
                    drafts = st["drafts"]
                    d = trim.get((r, call), len(drafts)) if trim else len(drafts)
                    drafts = drafts[:d]
                    a = 0
                    while a < d and drafts[a] == ref[st["n"] + a]:
                        a += 1
                    self.accepted.append(a)
                    seq_len, rej = len(prompt) + st["n"] + d, d - a
                    st["n"] += a + 1
                rows.append(oracle.Row(rid, tuple(prompt), seq_len, rej, d,
                                       last_token=ref[st["n"] - 1]))
                order.append(r)
            out = self.oracle.step(rows, self.k)
            for i, r in enumerate(order):
                st = state[r]
                if rows[i].sampled:
                    assert i in out
                    st["drafts"] = out[i]
            for r in [r for r, st in state.items() if st["n"] >= self.max_tokens[r]]:
                self.outputs[r] = self.refs[r][:self.max_tokens[r]]
                del state[r]
        return self


def _setup(tmp_path, num, max_tokens=137, shared_prefix=True, seed=0):
    rng = random.Random(seed)
    prefix = [rng.randrange(4, VOCAB) for _ in range(40)] if shared_prefix else []
    prompts = [prefix + [rng.randrange(4, VOCAB) for _ in range(5 + r)] for r in range(num)]
    refs = [_reference(max_tokens + K, seed=100 + r) for r in range(num)]
    plan_path = tmp_path / "plan.json"
    oracle.make_plan_file(plan_path, prompts, refs, [max_tokens] * num, VOCAB, SPECIAL, seed=5)
    o = oracle.Oracle(oracle.load_plan(plan_path), tmp_path / "oracle.jsonl")
    return prompts, refs, o


def test_oracle_log_gives_vllms_histogram_under_batching_chunks_preemption_and_trims(tmp_path):
    prompts, refs, o = _setup(tmp_path, 6)
    eng = _Engine(prompts, refs, [137] * 6, o)
    eng.run([0], chunked={0})
    eng.run([1, 2, 3, 4, 5], chunked={3}, preempt={(2, 5), (4, 9)},
            trim={(1, 4): 3, (5, 6): 0 + 1})
    records = oracle.read_log(tmp_path / "oracle.jsonl")
    res = oracle.analyse(records, K)
    num_drafts, pos = oracle.counters_from_accepted(eng.accepted, K)
    check = oracle.check_counters(res, num_drafts, pos)
    assert check["equal"], check
    assert res["num_mismatches"] == 0 and res["unplanned_verifies"] == 0
    assert res["last_token_mismatches"] == 0 and res["tail_drafts"] == 0
    assert res["trimmed_drafts"] == 2 and res["every_f_occurs"]
    assert res["verified"] == len(eng.accepted)
    # Preempted proposals were made and logged, but never verified, so not counted.
    assert o.proposals > res["verified"]
    # Request 0 alone covered every f with 137 tokens.
    alone = oracle.analyse([r for r in records if r.get("p") == 0], K)
    assert alone["every_f_occurs"]


class _BothPaths:
    """Each propose call through ``Oracle.step`` and through ``DeviceDrafts`` (CPU tensors):
    the drafts must be the same, row for row, call for call."""

    def __init__(self, o):
        self.o, self.device, self.calls, self.partial = o, oracle.DeviceDrafts(o), 0, 0

    def step(self, rows, k):
        torch = pytest.importorskip("torch")
        host = self.o.step(rows, k)
        prompts = {r.req_id: r.prompt for r in rows}
        drafts, use = self.device.drafts(
            [r.req_id for r in rows], lambda rid: prompts[rid] or self.o.prompts.get(rid),
            torch.tensor([r.seq_len for r in rows], dtype=torch.int32),
            torch.tensor([r.num_rejected for r in rows]), torch.tensor([r.sampled for r in rows]), k)
        device = {i: drafts[i].tolist() for i in range(len(rows)) if bool(use[i])}
        assert device == host, f"call {self.calls + 1}"
        # what each path writes over the real drafter's tokens (9s): the same, position for position
        written = [torch.full((len(rows), k), 9, dtype=torch.int64) for _ in range(2)]
        if k:
            oracle._write_drafts(written[0], host, k, self.o.lengths)
            oracle.DeviceDrafts.write(written[1], drafts, use, k, self.device.keep)
        assert written[0].tolist() == written[1].tolist(), f"call {self.calls + 1}"
        self.partial += sum(1 for row in written[0].tolist() if 9 in row and row != [9] * k)
        self.calls += 1
        return host


@pytest.mark.parametrize("tail", oracle.TAILS)
@pytest.mark.parametrize("short", [False, True])
def test_device_drafts_equal_the_host_oracle_under_batching_chunks_preemption_and_trims(tmp_path, short, tail):
    """The timed runs' path (ORACLE_LOG=off) against the logged one, on the engine above; with
    ``short`` the references end before max_tokens + K, so drafts run into the padding; with the
    ``drafter`` tail both set a proposal only up to its first wrong position."""
    prompts, refs, o = _setup(tmp_path, 6)
    cut = [r[:137 - 3 * i] for i, r in enumerate(refs)] if short else refs
    # short: the target still follows the whole reference; the plan holds less of it
    oracle.make_plan_file(tmp_path / "plan.json", prompts, cut, [137] * 6, VOCAB, SPECIAL, seed=5,
                          f_cycles=[[0, 1], [3], None, [15, 2], [1], None], tail=tail)
    o = oracle.Oracle(oracle.load_plan(tmp_path / "plan.json"), None)
    both = _BothPaths(o)
    eng = _Engine(prompts, refs, [137] * 6, both)
    eng.run([0], chunked={0})
    eng.run([1, 2, 3, 4, 5], chunked={3}, preempt={(2, 5), (4, 9)}, trim={(1, 4): 3, (5, 6): 1})
    assert both.calls > 30 and len(eng.accepted) > 30
    assert len(set(eng.accepted)) > 3  # drafts both accepted and rejected, at several lengths
    assert (both.partial > 0) == (tail == "drafter")  # rows whose tail kept the drafter's tokens
    # Unknown prompts and k = 0 keep the real drafter's tokens on both paths.
    assert both.step([oracle.Row("x", (9, 9, 9), 3, 0, 0)], K) == {}
    assert both.step([oracle.Row("y", tuple(prompts[0]), len(prompts[0]) + 1, 0, 0)], 0) == {}


@pytest.mark.gpu
@pytest.mark.parametrize("tail", oracle.TAILS)
def test_device_drafts_never_wait_for_the_gpu(tmp_path, tail):
    """On a CUDA device, with torch's sync debug mode raising on any synchronizing call: a run
    of propose calls (the first one builds the tables) writes what the host oracle writes."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: the check is that nothing synchronizes with one")
    prompts, refs, _ = _setup(tmp_path, 3)
    oracle.make_plan_file(tmp_path / "plan.json", prompts, refs, [137] * 3, VOCAB, SPECIAL, seed=5, tail=tail)
    o = oracle.Oracle(oracle.load_plan(tmp_path / "plan.json"), None)
    device = oracle.DeviceDrafts(o)
    host = oracle.Oracle(o.plan, None)
    rids = ["a", "b", "c"]
    n, got, want = [1, 1, 1], [], []
    for call in range(12):
        accepted = [(call + i) % 4 for i in range(3)] if call else [0, 0, 0]
        d = 0 if call == 0 else K
        n = [x + (a + 1 if call else 0) for x, a in zip(n, accepted)]
        seq = [len(prompts[i]) + n[i] - 1 + d - (d - accepted[i] if d else 0) for i in range(3)]
        rej = [d - a if d else 0 for a in accepted]
        cuda = [torch.tensor(v, device="cuda") for v in (seq, rej, [True] * 3)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            drafts, use = device.drafts(rids, dict(zip(rids, map(tuple, prompts))).get, *cuda, K)
            out = torch.full((3, K), 9, dtype=torch.long, device="cuda")
            oracle.DeviceDrafts.write(out, drafts, use, K, device.keep)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got.append(out.tolist())
        rows = [oracle.Row(rids[i], tuple(prompts[i]), seq[i], rej[i], d) for i in range(3)]
        written = torch.full((3, K), 9, dtype=torch.long)
        oracle._write_drafts(written, host.step(rows, K), K, host.lengths)
        want.append(written.tolist())
    assert got == want
    assert any(9 in row and row != [9] * K for call in got for row in call) == (tail == "drafter")


def _graph_calls(o, plan, rids, prompts, calls, k_of, torch, mode="default"):
    """``DeviceDrafts.timed`` over ``calls`` propose calls on CUDA, the batch shrinking and growing
    (rows 3, then 2, then 3 again), K changing, the plan adopted again (new tables) at call 6, the
    counters grown at call 7 and an int32 output at calls 9 and 10: each call's written output (9s:
    the real drafter's tokens), and the DeviceDrafts. ``mode``: torch's sync debug mode past the
    first call."""
    device = oracle.DeviceDrafts(o)
    prompt_of = dict(zip(rids, map(tuple, prompts))).get
    n, got = [1] * len(rids), []
    for call in range(calls):
        live = [0, 2] if 4 <= call < 8 else [0, 1, 2]
        accepted = [(call + i) % 4 for i in live]
        n = [x + 1 + (accepted[live.index(i)] if i in live else 0) for i, x in enumerate(n)]
        k = k_of(call)
        if call == 6:
            o.adopt(oracle.load_plan(plan))
        if call == 7:
            device._grow(2 * oracle.STEP_SLOTS, torch.device("cuda"))
        seq = torch.tensor([len(prompts[i]) + n[i] + k for i in live], dtype=torch.int32, device="cuda")
        rej = torch.tensor([k - a for a in accepted], dtype=torch.int32, device="cuda")
        sampled = torch.ones(len(live), dtype=torch.int32, device="cuda")
        dtype = torch.int32 if call in (9, 10) else torch.long
        out = torch.full((len(live), 15), 9, dtype=dtype, device="cuda")
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode(mode if call else "default")
        try:
            device.timed([rids[i] for i in live], prompt_of, seq, rej, sampled, lambda: out, k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        got.append(out.tolist())
    return got, device


@pytest.mark.gpu
@pytest.mark.parametrize("tail", oracle.TAILS)
def test_graphed_drafts_equal_the_eager_gather(tmp_path, tail, monkeypatch):
    """On a CUDA device the timed path replays a CUDA graph (oracle_graph): it writes what the
    eager gather writes, call for call, as the batch shrinks and grows, K changes, a new plan is
    adopted, the counters grow and the output's dtype changes, with nothing synchronizing after
    the first call; and it did capture again where it had to."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA graphs need one")
    prompts, refs, _ = _setup(tmp_path, 3)
    oracle.make_plan_file(tmp_path / "plan.json", prompts, refs, [137] * 3, VOCAB, SPECIAL, seed=5, tail=tail)
    rids = ["a", "b", "c"]
    k_of = lambda call: 3 if call % 5 == 4 else K  # noqa: E731
    o = oracle.Oracle(oracle.load_plan(tmp_path / "plan.json"), None)
    monkeypatch.setenv("ORACLE_GRAPHS", "0")
    want, eager = _graph_calls(o, tmp_path / "plan.json", rids, prompts, 12, k_of, torch)
    assert eager.graphs is None
    monkeypatch.setenv("ORACLE_GRAPHS", "1")
    o = oracle.Oracle(oracle.load_plan(tmp_path / "plan.json"), None)
    got, graphed = _graph_calls(o, tmp_path / "plan.json", rids, prompts, 12, k_of, torch, mode="error")
    assert graphed.graphs.failed is None and graphed.graphs.captures >= 8
    assert len({id(g.tables) for g in graphed.graphs.graphs.values()}) == 1  # the old plan's graphs dropped
    assert got == want
    assert any(row != [9] * 15 for call in got for row in call)


def test_device_drafts_write_only_the_used_rows():
    torch = pytest.importorskip("torch")
    out = torch.full((3, 4), 9, dtype=torch.int64)
    drafts = torch.arange(12).view(3, 4)[:2, :3]
    oracle.DeviceDrafts.write(out, drafts, torch.tensor([True, False]), 3)
    assert out.tolist() == [[0, 1, 2, 9], [9, 9, 9, 9], [9, 9, 9, 9]]


def test_divergence_from_the_reference_shows_as_mismatches(tmp_path):
    prompts, refs, o = _setup(tmp_path, 2)
    wrong = [list(r) for r in refs]
    wrong[1][60] = oracle.wrong_token(wrong[1][60], VOCAB, SPECIAL)  # the target "diverges"
    eng = _Engine(prompts, wrong, [137] * 2, o).run([0, 1])
    res = oracle.analyse(oracle.read_log(tmp_path / "oracle.jsonl"), K)
    assert res["num_mismatches"] > 0 or res["last_token_mismatches"] > 0
    assert res["mismatches"] and all(m["p"] == 1 for m in res["mismatches"])
    assert eng.outputs[0] == refs[0][:137]


def test_rows_with_unknown_prompts_or_no_drafts_keep_the_drafters_tokens(tmp_path):
    _, _, o = _setup(tmp_path, 1)
    prompt = tuple(o.requests[0]["prompt"])
    assert o.step([oracle.Row("y", prompt, len(prompt), 0, 0)], 0) == {}
    out = o.step([oracle.Row("x", (9, 9, 9), 3, 0, 0)], K)
    assert out == {}
    # V2 rows carry no prompt: it comes from RequestState.add_request.
    o.note_prompt("z", prompt)
    out = o.step([oracle.Row("z", None, len(prompt), 0, 0)], K)
    assert list(out) == [0] and len(out[0]) == K
    lines = (tmp_path / "oracle.jsonl").read_text().splitlines()
    assert [json.loads(x)["p"] for x in lines] == [0, None, 0]
    assert oracle.analyse(oracle.read_log(tmp_path / "oracle.jsonl"), K)["unknown_rows"] == 1


def test_warmup_rows_before_the_first_planned_request_are_not_unknown(tmp_path):
    # vLLM 0.33.0's warmup_kernels runs propose on its own "_warmup_N_" requests before
    # any user request (140 such rows on the H100, 2026-11-27). They keep the real
    # drafter's tokens and are logged apart; an unplanned row after that is a fault.
    _, _, o = _setup(tmp_path, 1)
    prompt = tuple(o.requests[0]["prompt"])
    o.note_prompt("_warmup_0_", (1, 2, 3))
    assert o.step([oracle.Row("_warmup_0_", None, 3, 0, 15, sampled=True)], K) == {}
    o.note_prompt("r0", prompt)
    out = o.step([oracle.Row("r0", None, len(prompt), 0, 0, sampled=True),
                  oracle.Row("stray", (7, 7), 2, 0, 0, sampled=True)], K)
    assert list(out) == [0]
    res = oracle.analyse(oracle.read_log(tmp_path / "oracle.jsonl"), K)
    assert res["warmup_rows"] == 1 and res["unknown_rows"] == 1


def test_a_stray_row_in_the_first_planned_call_is_a_fault_and_a_log_without_plan_is_all_fault():
    def rec(call, row, p):
        return {"call": call, "row": row, "req": f"r{call}-{row}", "p": p, "d": 0, "sampled": True}
    # Warm-up in call 1; call 2 holds the first planned row, with a stray before it.
    res = oracle.analyse([rec(1, 0, None), rec(2, 0, None), rec(2, 1, 0)], K)
    assert (res["warmup_rows"], res["unknown_rows"]) == (1, 1)
    nothing_planned = oracle.analyse([rec(1, 0, None), rec(2, 0, None)], K)
    assert (nothing_planned["warmup_rows"], nothing_planned["unknown_rows"]) == (0, 2)


def test_install_refuses_unknown_releases_and_a_missing_log(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="no hook"):
        oracle.install("0.26.0", tmp_path / "plan.json")
    monkeypatch.delenv("ORACLE_LOG", raising=False)
    with pytest.raises(ValueError, match="ORACLE_LOG"):
        oracle.install("0.21.0", tmp_path / "plan.json")


def test_module_imports_without_torch_or_vllm():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('o', {str(GPU_DIR / 'runs' / 'oracle.py')!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['o'] = m\n"
            "spec.loader.exec_module(m)\n"
            "assert 'torch' not in sys.modules and 'vllm' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------ hook points in the sources


def _classes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text())
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}


def _method(cls: ast.ClassDef, name: str):
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _params(fn) -> list[str]:
    a = fn.args
    return [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]


def _site(release: str) -> Path:
    # The released wheel's tree, downloaded and cached as the patch tests get it.
    from tests.integration.patch_trees import pristine

    root = pristine(release, "site-packages") / "vllm"
    assert root.is_dir(), f"no vllm/ in the released {release} tree at {root}"
    return root


def test_hook_points_in_vllm_0_21_0():
    root = _site("0.21.0")
    hook = oracle.HOOKS["0.21.0"]
    dflash = _classes(root / "v1/spec_decode/dflash.py")[hook["proposer_class"]]
    # DFlashProposer inherits propose: the hook patches it on the subclass.
    assert [b.id for b in dflash.bases if isinstance(b, ast.Name)] == ["SpecDecodeBaseProposer"]
    assert _method(dflash, "propose") is None
    init = _params(_method(dflash, "__init__"))
    assert "runner" in init
    base = _classes(root / "v1/spec_decode/llm_base_proposer.py")["SpecDecodeBaseProposer"]
    params = _params(_method(base, "propose"))
    assert params[0] == "self" and set(hook["propose_params"]) <= set(params)
    base_src = (root / "v1/spec_decode/llm_base_proposer.py").read_text()
    # The proposer keeps no runner: the hook takes it from propose_draft_token_ids.
    assert "self.runner" not in base_src
    # propose shrinks seq_lens in place: the hook reads them before calling it.
    assert "common_attn_metadata.seq_lens -= num_rejected_tokens_gpu" in base_src
    runner = _classes(root / "v1/worker/gpu_model_runner.py")["GPUModelRunner"]
    pdt = _params(_method(runner, hook["runner_method"]))
    assert pdt[:2] == ["self", "scheduler_output"]
    sched = _classes(root / "v1/core/sched/output.py")["SchedulerOutput"]
    fields = {n.target.id for n in sched.body if isinstance(n, ast.AnnAssign)}
    assert "scheduled_spec_decode_tokens" in fields
    runner_src = (root / "v1/worker/gpu_model_runner.py").read_text()
    assert "self.discard_request_mask = self._make_buffer(" in runner_src
    assert "DFlashProposer(self.vllm_config, self.device, self)" in runner_src
    assert "draft_token_ids = self.drafter.propose(" in runner_src
    assert "self.drafter = DFlashProposer(" in runner_src
    batch = _classes(root / "v1/worker/gpu_input_batch.py")
    assert _method(batch["InputBatch"], "req_ids") is not None
    assert "prompt_token_ids" in {n.target.id for n in batch["CachedRequestState"].body
                                  if isinstance(n, ast.AnnAssign)}


def test_hook_points_in_vllm_0_33_0():
    root = _site("0.33.0")
    hook = oracle.HOOKS["0.33.0"]
    spec = _classes(root / "v1/worker/gpu/spec_decode/dflash/speculator.py")
    propose = _method(spec[hook["proposer_class"]], "propose")
    assert propose is not None
    params = _params(propose)
    assert params[:2] == ["self", "input_batch"] and set(hook["propose_params"]) <= set(params)
    # model_runner.py calls it positionally: the hook binds by signature.
    assert "draft_tokens = self.speculator.propose(\n                    input_batch," in \
        (root / "v1/worker/gpu/model_runner.py").read_text()
    states = _classes(root / "v1/worker/gpu/states.py")[hook["states_class"]]
    assert _params(_method(states, "add_request"))[:4] == ["self", *hook["add_request_params"]]
    batch = _classes(root / "v1/worker/gpu/input_batch.py")["InputBatch"]
    fields = {n.target.id for n in batch.body if isinstance(n, ast.AnnAssign)}
    assert {"req_ids", "num_reqs", "seq_lens", "idx_mapping", "num_draft_tokens_per_req"} <= fields


# ------------------------------------------------------------------ the hooks, on stand-in classes
#
# The wrappers' mechanics (binding positional calls, reading the rows before the real
# propose, in-place overwrite of its output, dummy runs left alone) on CPU tensors, with
# stand-ins shaped like the released classes. Real vLLM on a GPU: not run here.


def _fake_modules(monkeypatch, names: dict):
    import types

    for name, attrs in names.items():
        parts = name.split(".")
        for i in range(1, len(parts)):
            parent = ".".join(parts[:i])
            if parent not in sys.modules or not isinstance(sys.modules[parent], types.ModuleType) \
                    or getattr(sys.modules[parent], "_oracle_fake", False):
                mod = types.ModuleType(parent)
                mod._oracle_fake = True
                monkeypatch.setitem(sys.modules, parent, mod)
        mod = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(mod, k, v)
        monkeypatch.setitem(sys.modules, name, mod)


def _ns(**kw):
    import types

    return types.SimpleNamespace(**kw)


def _no_read_back(monkeypatch, torch):
    """Make every host read of a tensor fail: the log-off hooks must leave all values on the
    device (a read waits for the verify step and stalls async scheduling)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a log-off hook read a tensor back to the host")
    for name in ("tolist", "item", "__bool__", "__int__", "numpy"):
        monkeypatch.setattr(torch.Tensor, name, refuse)


@pytest.mark.parametrize("log", ["jsonl", "off"])
def test_v1_hook_overwrites_the_real_drafts_in_place(tmp_path, monkeypatch, log):
    torch = pytest.importorskip("torch")
    prompts, refs, _ = _setup(tmp_path, 3)
    monkeypatch.setattr(oracle, "_INSTALLED", {})
    calls = []

    class SpecDecodeBaseProposer:
        def propose(self, target_token_ids, target_positions, target_hidden_states,
                    next_token_ids, token_indices_to_sample, common_attn_metadata,
                    sampling_metadata, mm_embed_inputs=None, num_rejected_tokens_gpu=None,
                    slot_mappings=None):
            calls.append("drafter")
            if num_rejected_tokens_gpu is not None:
                common_attn_metadata.seq_lens -= num_rejected_tokens_gpu  # as 0.21.0 does
            return torch.full((common_attn_metadata.seq_lens.shape[0], K), 9).view(-1, K)

    class DFlashProposer(SpecDecodeBaseProposer):
        pass

    class GPUModelRunner:
        def propose_draft_token_ids(self, scheduler_output, sampled, cad, rej, next_ids):
            return self.drafter.propose(target_token_ids=None, target_positions=None,
                                        target_hidden_states=None, next_token_ids=next_ids,
                                        token_indices_to_sample=None, common_attn_metadata=cad,
                                        sampling_metadata=None, num_rejected_tokens_gpu=rej)

    _fake_modules(monkeypatch, {"vllm.v1.spec_decode.dflash": {"DFlashProposer": DFlashProposer},
                                "vllm.v1.worker.gpu_model_runner": {"GPUModelRunner": GPUModelRunner}})
    o = oracle.install("0.21.0", tmp_path / "plan.json", tmp_path / "log.jsonl" if log == "jsonl" else oracle.LOG_OFF)
    assert DFlashProposer.propose is not SpecDecodeBaseProposer.propose

    runner = GPUModelRunner()
    runner.drafter = DFlashProposer()
    rids = ["7-aa", "8-bb", "9-cc"]
    runner.input_batch = _ns(req_ids=rids)
    runner.requests = {rid: _ns(prompt_token_ids=prompts[i]) for i, rid in enumerate(rids)}
    runner.discard_request_mask = _ns(np=[False, False, True])  # row 2: a prefill chunk
    n = [5, 20, 0]
    acc = [3, 0, 0]  # accepted in the verify step that just ran (d=15 for rows 0 and 1)
    seq = torch.tensor([len(prompts[0]) + n[0] - acc[0] - 1 + K,
                        len(prompts[1]) + n[1] - acc[1] - 1 + K, 10])
    rej = torch.tensor([K - acc[0], K - acc[1], 0])
    next_ids = torch.tensor([refs[0][n[0] - 1], refs[1][n[1] - 1], 0])
    sched = _ns(scheduled_spec_decode_tokens={rids[0]: [-1] * K, rids[1]: [-1] * K})
    with monkeypatch.context() as m:
        if log == "off":
            _no_read_back(m, torch)
        out = runner.propose_draft_token_ids(sched, None, _ns(seq_lens=seq), rej, next_ids)
    assert calls == ["drafter"] and out.dtype == torch.int64
    for row in (0, 1):
        f = oracle.first_wrong(5, row, 0, K)
        expect, _, _ = oracle.build_draft(refs[row], n[row], f, K, VOCAB, SPECIAL)
        assert out[row].tolist() == expect
    assert out[2].tolist() == [9] * K  # the real drafter's tokens stay
    if log == "off":
        assert not (tmp_path / "log.jsonl").exists()
        return
    recs = oracle.read_log(tmp_path / "log.jsonl")
    assert [r["n"] for r in recs[:2]] == n[:2] and all(r["last_ok"] for r in recs[:2])
    assert [r["d"] for r in recs] == [K, K, 0] and "f" not in recs[2]
    assert o.proposals == 2


@pytest.mark.parametrize("log", ["jsonl", "off"])
def test_v2_hook_binds_positional_calls_and_skips_dummy_runs(tmp_path, monkeypatch, log):
    torch = pytest.importorskip("torch")
    prompts, refs, _ = _setup(tmp_path, 2)
    monkeypatch.setattr(oracle, "_INSTALLED", {})

    class DFlashSpeculator:
        def __init__(self):
            self.draft_tokens = torch.zeros(8, K, dtype=torch.int64)

        @torch.inference_mode()
        def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states,
                    aux_hidden_states, num_sampled, num_rejected, last_sampled,
                    next_prefill_tokens, temperature, seeds, dp_sync_state=None,
                    dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None,
                    is_profile=False, num_speculative_tokens=None):
            self.draft_tokens[:input_batch.num_reqs] = 9
            return self.draft_tokens[:input_batch.num_reqs]

    class RequestState:
        def __init__(self):
            self.added = []

        def add_request(self, req_id, prompt_len, all_token_ids, num_computed_tokens, max_tokens):
            self.added.append(req_id)

    _fake_modules(monkeypatch, {
        "vllm.v1.worker.gpu.spec_decode.dflash.speculator": {"DFlashSpeculator": DFlashSpeculator},
        "vllm.v1.worker.gpu.states": {"RequestState": RequestState}})
    o = oracle.install("0.33.0", tmp_path / "plan.json", tmp_path / "log.jsonl" if log == "jsonl" else oracle.LOG_OFF)
    states = RequestState()
    # Request 1 resumes after preemption: all_token_ids holds its outputs too.
    states.add_request(req_id="r0", prompt_len=len(prompts[0]), all_token_ids=prompts[0],
                       num_computed_tokens=0, max_tokens=137)
    states.add_request("r1", len(prompts[1]), prompts[1] + refs[1][:4], 0, 137)
    assert states.added == ["r0", "r1"]

    spec = DFlashSpeculator()
    ib = _ns(num_reqs=2, req_ids=["r0", "r1"],
             seq_lens=torch.tensor([len(prompts[0]), len(prompts[1]) + 4, 0]),
             idx_mapping=torch.tensor([5, 3]), num_draft_tokens_per_req=None)
    # vLLM 0.33.0 keeps one column per request (v1/worker/gpu/states.py:
    # last_sampled_tokens = zeros(max_num_reqs, 1)); a flat fake hid the H100 crash.
    last = torch.zeros(8, 1, dtype=torch.int64)
    last[5], last[3] = refs[0][0], refs[1][4]
    args = (ib, {}, {}, None, None, torch.tensor([1, 1]), torch.tensor([0, 0]), last,
            None, None, None)
    out = spec.propose(*args, dummy_run=True)
    assert out.tolist() == [[9] * K] * 2 and not (tmp_path / "log.jsonl").exists()
    with monkeypatch.context() as m:
        if log == "off":
            _no_read_back(m, torch)
        out = spec.propose(*args, num_speculative_tokens=K)
    for row, n in ((0, 1), (1, 5)):
        f = oracle.first_wrong(5, row, 0, K)
        assert out[row].tolist() == oracle.build_draft(refs[row], n, f, K, VOCAB, SPECIAL)[0]
        assert spec.draft_tokens[row].tolist() == out[row].tolist()  # in place
    if log == "off":
        assert not (tmp_path / "log.jsonl").exists()
        return
    recs = oracle.read_log(tmp_path / "log.jsonl")
    assert [r["n"] for r in recs] == [1, 5] and all(r["last_ok"] for r in recs)
    # A step that proposes nothing (num_speculative_tokens=0) still logs its verify rows.
    spec.propose(*args, num_speculative_tokens=0)
    assert len(oracle.read_log(tmp_path / "log.jsonl")) == 4 and o.proposals == 2


def test_a_verify_after_the_request_reached_max_tokens_is_left_out_as_vllm_does():
    # vLLM's async scheduler schedules one more step for a request before the output that
    # finished it is processed; Scheduler.update_from_output skips the finished request, so
    # that step's drafts never reach the spec-decode counters (seen on the H100: 48 of 781).
    def rec(call, d, n, f, tail=False):
        return {"call": call, "row": 0, "req": "0-a", "p": 0, "d": d, "sampled": True, "n": n,
                "last_ok": True, "step": call - 1, "f": f, "f_eff": f, "k": K, "tail": tail}
    records = [rec(1, 0, 1, 4), rec(2, K, 6, 2), rec(3, K, 9, 5), rec(4, K, 15, 7, tail=True), rec(5, K, 23, 1)]
    everything = oracle.analyse(records, K)
    counted = oracle.analyse(records, K, max_tokens=[10])
    assert everything["verified"] == 4 and everything["tail_drafts"] == 1
    assert counted["verified"] == 3 and counted["after_finish_verifies"] == 1
    assert counted["expected_hist"] == oracle.histogram([4, 2, 5], K)
    # The discarded step may draft past the reference (tail) and still checks its tokens.
    assert counted["tail_drafts"] == 0 and counted["num_mismatches"] == 0
    wrong = records[:-1] + [rec(5, K, 22, 1)]  # accepted 6, planned 7: a mismatch all the same
    assert oracle.analyse(wrong, K, max_tokens=[10])["num_mismatches"] == 1


def test_a_plan_written_after_the_server_started_is_read_at_the_next_propose(tmp_path, monkeypatch):
    # The speed-up curve starts its DFlash server before the plan exists (ORACLE_PLAN_LATER=1),
    # makes references with the real drafter, then writes the plan: until then every row keeps
    # the drafter's tokens, from then on the plan's prompts get the oracle's drafts.
    prompts, refs, _ = _setup(tmp_path, 1)
    later = tmp_path / "later-plan.json"
    monkeypatch.setenv(oracle.PLAN_LATER_ENV, "1")
    monkeypatch.setattr(oracle, "_install_v2", lambda o, hook: None)  # vLLM's classes cannot be patched here
    monkeypatch.setattr(oracle, "_INSTALLED", {})
    o = oracle.install("0.33.0", later, log_path=oracle.LOG_OFF)
    prompt = tuple(prompts[0])
    o.note_prompt("r", prompt)
    assert o.step([oracle.Row("r", None, len(prompt), 0, 0)], K) == {}
    oracle.make_plan_file(later, prompts, refs, [137], VOCAB, SPECIAL, seed=5, k=K)
    assert not (tmp_path / "later-plan.json.partial").exists()
    out = o.step([oracle.Row("r", None, len(prompt), 0, 0)], K)
    assert list(out) == [0] and len(out[0]) == K
    assert oracle.adopted_marker(later).exists()  # the harness's proof that the plan was read
    # The next point's plan replaces it: read at the next propose, its marker left again.
    oracle.adopted_marker(later).unlink()
    o.step([oracle.Row("r", None, len(prompt) + 1, 0, 0)], K)
    assert not oracle.adopted_marker(later).exists()  # the same file: not read again
    oracle.make_plan_file(later, prompts, refs, [137], VOCAB, SPECIAL, seed=5, k=K, f_cycles=[[K]])
    o.note_prompt("r2", prompt)
    out = o.step([oracle.Row("r2", None, len(prompt), 0, 0)], K)
    assert out[0] == refs[0][1:1 + K]  # f = K: every draft right
    assert oracle.adopted_marker(later).exists() and o.plan["requests"][0]["f_cycle"] == [K]
    # The plan removed (the curve's control): the real drafter's tokens again, the drop marked.
    later.unlink()
    o.note_prompt("r3", prompt)
    assert o.step([oracle.Row("r3", None, len(prompt), 0, 0)], K) == {}
    assert oracle.dropped_marker(later).exists() and o.plan["requests"] == []
    oracle.make_plan_file(later, prompts, refs, [137], VOCAB, SPECIAL, seed=5, k=K, f_cycles=[[0]])
    o.note_prompt("r4", prompt)
    assert list(o.step([oracle.Row("r4", None, len(prompt), 0, 0)], K)) == [0]


def test_without_plan_later_a_missing_plan_is_an_error(tmp_path, monkeypatch):
    monkeypatch.delenv(oracle.PLAN_LATER_ENV, raising=False)
    monkeypatch.setattr(oracle, "_install_v2", lambda o, hook: None)
    monkeypatch.setattr(oracle, "_INSTALLED", {})
    with pytest.raises(FileNotFoundError):
        oracle.install("0.33.0", tmp_path / "absent.json", log_path=oracle.LOG_OFF)
