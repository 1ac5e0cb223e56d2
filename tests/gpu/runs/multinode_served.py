"""Issue 54 on a host with two GPUs: two `launcher serve` nodes against one process.

Every server is `launcher serve --recipe gemma4-moe-dflash --test-gpu` on the patched vLLM
given, with the trained target, served.py's --set items and vLLM arguments, and exact numerics
(VLLM_BATCH_INVARIANT=1, compile backend eager). The servers, one after another:

* ``tp1``: one process on GPU 0 (``--profile dgx-spark``), tensor parallel 1;
* ``tp2``: one process on GPUs 0 and 1, ``-- --tensor-parallel-size 2``;
* ``nodes2``: two processes, ``--nnodes 2 --master-addr 127.0.0.1 --ifname lo``, node 0 (the
  head, the API) on GPU 0 and node 1 (headless) on GPU 1; the recipe's dgx-spark-x2 profile
  with tensor parallel 2 and data parallel 1 by ``--set``, so the two nodes hold one model;
* ``tp2-dflash``, ``nodes2-dflash``: the same two with the drafter.

Each answers the target's gated prompts (prompts.json: token ids, 128 greedy tokens, eos
ignored), all in flight at once; ``tp2`` twice, since a reference must reproduce. ``tp1``, ``tp2`` and
``nodes2`` then serve the speed levels of bars.yaml (tok/s at 1, 4, 16 in flight), and
``nodes2`` ends with its head killed (SIGKILL to node 0's launcher and everything it started):
what node 1 does, what a client sees, and how long a restarted pair takes to answer again.

Verdicts (bars.yaml, ``multinode``): ``nodes2`` token-identical to ``tp2`` on every prompt
(and ``nodes2-dflash`` to ``tp2-dflash`` and to ``tp2``); ``tp2`` against ``tp1`` strict
first, then within the margin-move noise bound. The gate (gate.py) judges the reference's
outputs. Everything goes to ``--out``/multinode.json and multinode.md.

``python tests/gpu/runs/multinode_served.py --model M --drafter D --site S --work W --out O``
(``remote.sh multinode-bg`` runs it detached, ``multinode-wait`` reports).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
sys.path.insert(0, str(HERE))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import caveats  # noqa: E402
import conformance  # noqa: E402
import gate  # noqa: E402
import headline  # noqa: E402
import served  # noqa: E402
import served_report as report  # noqa: E402

BARS = bars.load()["multinode"]
SPEED_LEVELS = [int(c) for c in str(BARS["speed_levels"]).split(",")]
NOISE_PERCENTILE = bars.get("noise", "margin_move_percentile")
SERVERS = ("tp1", "tp2", "nodes2", "tp2-dflash", "nodes2-dflash")
X2 = "profiles.dgx-spark-x2.cluster"
# The two nodes hold one model: tensor parallel 2 across them (the profile's own layout for the
# 26B-A4B is data parallel 2, which would answer from two copies).
NODE_SETS = [f"{X2}.tensor_parallel=2", f"{X2}.data_parallel=1"]
NODE_FLAGS = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--ifname", "lo"]
MASTER_PORT = 29501
KV_BYTES = 4 * 1024**3  # an explicit KV cache: no memory profile to size one from


# --------------------------------------------------------------- servers


def serve_args(name: str, args, port: int) -> list[str]:
    """The `launcher serve` arguments of ``name`` (one process, or any node of ``nodes2``)."""
    drafter = name.endswith("-dflash")
    # Prefix caching off: the second pass of a reference would otherwise compute every prompt
    # from a cache hit, in another batch shape (served.REFERENCE_SETS says why that matters).
    sets = list(args.set) + served.REFERENCE_SETS[1:] + ([] if drafter else ["drafter=null"])
    more = [f"--kv-cache-memory-bytes={KV_BYTES}", *served.REFERENCE_EXTRA, *served.EXACT_ARGS]
    if name.startswith(("tp2", "nodes2")):
        # vLLM's custom all-reduce opens CUDA IPC handles, which fail on a host that refuses them
        # ("custom_all_reduce.cuh:164 'invalid argument'" on a two-H200 host); NCCL serves both
        # layouts alike, and with two ranks a sum is the same in either order.
        more += ["--disable-custom-all-reduce"]
    if name.startswith("tp2"):
        more += ["--tensor-parallel-size", "2"]
    if name.startswith("nodes2"):
        sets += NODE_SETS
    base = served.serve_args("dflash", str(args.model), str(args.drafter), port, sets, more)
    if not drafter:
        cut = base.index("--drafter")
        base = base[:cut] + base[cut + 2:]
    return base if name.startswith("nodes2") else served._with_flags(base, "--profile", "dgx-spark")


def node_args(base: list[str], rank: int, master_port: int) -> list[str]:
    return served._with_flags(base, *NODE_FLAGS, "--node-rank", str(rank), "--master-port", str(master_port))


class Pair:
    """One server: one process, or the two nodes of ``nodes2`` (node 0 serves the API)."""

    def __init__(self, name: str, args, master_port: int = MASTER_PORT, tag: str = ""):
        self.name, self.args = name, args
        self.port = args.port
        self.url = f"http://127.0.0.1:{self.port}"
        self.cwd = args.work / "cwd"
        self.cwd.mkdir(parents=True, exist_ok=True)
        base = serve_args(name, args, self.port)
        if name.startswith("nodes2"):
            self.plans = [(node_args(base, r, master_port), {"CUDA_VISIBLE_DEVICES": str(r)}) for r in (0, 1)]
        else:
            self.plans = [(base, {"CUDA_VISIBLE_DEVICES": "0,1" if name.startswith("tp2") else "0"})]
        self.logs = [args.work / f"{name}{tag}-node{i}.log" for i in range(len(self.plans))]
        self.procs: list[served.Launched] = []

    def start(self, timeout: float) -> float | None:
        """Every node started (the workers first), then node 0 waited for: seconds to ready."""
        t0 = time.time()
        for (argv, env), log in reversed(list(zip(self.plans, self.logs))):
            self.procs.insert(0, served.Launched(argv, self.args.site, self.cwd, log, timeout, env=env))
        ready = self.procs[0].wait_ready(timeout + 30)
        return None if ready is None else round(time.time() - t0, 1)

    def started_by(self) -> list[str]:
        return [p.started_by for p in self.procs]

    def stop(self) -> list[int | None]:
        return [p.stop() for p in self.procs]

    def tails(self, lines: int = 15) -> list[list[str]]:
        return [p.text().splitlines()[-lines:] for p in self.procs]


# --------------------------------------------------------------- requests


def answer(url: str, model: str, prompts: list[dict], tokens: int) -> dict:
    """Every prompt once, all in flight together (exact numerics is batch invariant: a token
    does not depend on what else is in the batch, which is why it is the mode compared here);
    acceptance from /metrics around all of them."""
    before = served.scrape(url)
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        rows = list(pool.map(lambda p: served.complete_tokens(url, model, p["token_ids"], tokens), prompts))
    return {"rows": rows, "acceptance": report.acceptance(before, served.scrape(url))}


def speed(url: str, model: str, prompts: list[dict], tokens: int, levels: list[int]) -> list[dict]:
    """Output tok/s with ``c`` requests in flight (4c requests, at least 8), per level."""
    out = []
    for c in levels:
        batch = [prompts[i % len(prompts)] for i in range(max(8, 4 * c))]
        t0 = time.time()
        with ThreadPoolExecutor(max_workers=c) as pool:
            rows = list(pool.map(lambda p: served.complete_tokens(url, model, p["token_ids"], tokens), batch))
        wall = time.time() - t0
        done = sum(len(r.get("token_ids") or []) for r in rows)
        out.append({"concurrency": c, "requests": len(batch), "errors": sum(1 for r in rows if r.get("error")),
                    "output_tokens": done, "wall_s": round(wall, 2), "tok_s": round(done / wall, 1)})
    return out


# --------------------------------------------------------------- verdicts


def identical(a: list[dict], b: list[dict]) -> dict:
    """Prompts whose token ids are equal (both answered), strict."""
    same = [i for i, (x, y) in enumerate(zip(a, b)) if x.get("token_ids") and x["token_ids"] == y.get("token_ids")]
    parted = [i for i in range(min(len(a), len(b))) if i not in same]
    return {"identical": len(same), "prompts": min(len(a), len(b)), "parted": parted,
            "fraction": round(len(same) / max(1, min(len(a), len(b))), 4)}


def first_part(x: list[int], y: list[int]) -> int | None:
    return next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), None)


def within_noise(ref: list[dict], cand: list[dict]) -> dict:
    """``cand`` (TP=2) against ``ref`` (TP=1), by the procedure conformance.py applies to z-lab:
    the bound is the NOISE_PERCENTILE (nearest rank) of |margin move| over every position before
    the two part; a prompt that parts is within noise when ref's margin there is at most the bound."""
    answered = [(r, c) for r, c in zip(ref, cand) if r.get("token_ids") and c.get("token_ids")]
    moves = conformance.margin_moves([r for r, _ in answered], [c for _, c in answered])
    bound = conformance.percentile(moves, NOISE_PERCENTILE) if moves else None
    parts = []
    for i, (r, c) in enumerate(zip(ref, cand)):
        j = first_part(r.get("token_ids") or [], c.get("token_ids") or [])
        if j is not None:
            margin = (r.get("margins") or [])[j] if j < len(r.get("margins") or []) else None
            parts.append({"prompt": i, "position": j, "margin": margin,
                          "within_noise": margin is not None and bound is not None and margin <= bound})
    n = min(len(ref), len(cand))
    # a prompt either side did not answer is not within noise: it is not compared at all
    inside = len(answered) - sum(1 for p in parts if not p["within_noise"])
    return {"bound": bound, "positions": len(moves), "parts": parts, "within_noise": inside, "prompts": n,
            "fraction": round(inside / max(1, n), 4)}


def verdicts(rec: dict) -> dict:
    s = rec["servers"]
    rows = {k: v["passes"][0]["rows"] for k, v in s.items() if v.get("passes")}
    out: dict = {}
    if "tp2" in rows:
        out["gate"] = gate.nondegenerate(rows["tp2"])
        out["gate_failures"] = gate.failures(out["gate"])
        passes = s["tp2"]["passes"]
        if len(passes) > 1:
            out["tp2_reproduces"] = identical(passes[0]["rows"], passes[1]["rows"])
    for a, b in (("nodes2", "tp2"), ("nodes2-dflash", "tp2-dflash"), ("tp2-dflash", "tp2"), ("nodes2-dflash", "tp2")):
        if a in rows and b in rows:
            v = identical(rows[a], rows[b])
            v["holds"] = v["fraction"] >= BARS["min_identical_fraction_tp2"]
            out[f"{a}_vs_{b}"] = v
    if "tp1" in rows and "tp2" in rows:
        strict = identical(rows["tp2"], rows["tp1"])
        noise = within_noise(rows["tp1"], rows["tp2"])
        noise["holds"] = noise["fraction"] >= BARS["min_within_noise_fraction_tp1"]
        out["tp2_vs_tp1"] = {"strict": strict, "noise": noise}
    return out


# --------------------------------------------------------------- the run


def run_server(name: str, args, rec: dict, prompts: list[dict]) -> None:
    entry = rec["servers"].setdefault(name, {})
    pair = Pair(name, args)
    try:
        entry["ready_s"] = pair.start(args.start_timeout)
        entry["started_by"] = pair.started_by()
        if entry["ready_s"] is None:
            entry["error"] = "not ready"
            return
        model = "gemma4"
        entry["passes"] = [answer(pair.url, model, prompts, args.tokens)
                           for _ in range(2 if name == "tp2" else 1)]
        if name in ("tp1", "tp2", "nodes2"):
            entry["speed"] = speed(pair.url, model, prompts, args.tokens, SPEED_LEVELS)
        if name == "nodes2":
            entry["kill"] = kill_and_recover(pair, args, prompts[:4], entry["passes"][0]["rows"][:4])
    except Exception as exc:  # noqa: BLE001 - every failure is a result here
        traceback.print_exc()
        entry["error"] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        entry["exit_codes"] = pair.stop() if pair.procs else None
        entry["log_tails"] = pair.tails() if pair.procs else None


def kill_and_recover(pair: Pair, args, prompts: list[dict], before: list[dict]) -> dict:
    """SIGKILL to node 0's launcher and everything it started (a head that loses power), then:
    does node 1 exit by itself within worker_exit_s, what does a client get, how long until a
    restarted pair (the worker too, where it stayed) answers the first prompts as before."""
    head, worker = pair.procs
    family = served._descendants(head.proc.pid)
    t0 = time.time()
    for p in [head.proc, *family]:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    served._wait_gone(family)
    client = served.complete_tokens(pair.url, "gemma4", prompts[0]["token_ids"], 8)
    end = t0 + BARS["worker_exit_s"]
    while time.time() < end and worker.proc.poll() is None:
        time.sleep(2)
    out = {"client_after_kill": client.get("error") or "answered",
           "worker_exited": worker.proc.poll() is not None,
           "worker_exit_code": worker.proc.poll(),
           "worker_exit_s": round(time.time() - t0, 1) if worker.proc.poll() is not None else None,
           "worker_log_tail": worker.text().splitlines()[-12:]}
    pair.stop()
    # A new master port: the killed head's may still be held by sockets closing.
    again = Pair(pair.name, args, master_port=MASTER_PORT + 10, tag="-restart")
    try:
        t1 = time.time()
        ready = again.start(BARS["recover_s"])
        out.update(restarted="both nodes", ready_s=ready, recover_s=round(time.time() - t0, 1))
        if ready is not None:
            rows = answer(again.url, "gemma4", prompts, args.tokens)["rows"]
            out["answers_as_before"] = identical(rows, before)
        out["restart_s"] = round(time.time() - t1, 1)
    finally:
        out["restart_exit_codes"] = again.stop()
    return out


def meta(args) -> dict:
    record = json.loads((args.model / "train-record.json").read_text()) if (args.model / "train-record.json").exists() else {}
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": args.gpu, "vllm": args.vllm, "series": args.series_hash, "target_sha256": record.get("target_sha256"),
            "drafter": str(args.drafter), "bars": report.bars.blob_hash(), "tokens": args.tokens,
            "numerics": "exact: VLLM_BATCH_INVARIANT=1, compile backend eager", "command": args.command,
            "sets": served.SETS + list(args.set), "node_sets": NODE_SETS, "node_flags": NODE_FLAGS}


def merged(records: list[dict]) -> dict:
    """One record from runs on hosts of one kind (the same GPUs) and checkout state (same target,
    series and bars): exact numerics make tokens a function of these alone. Each server as the latest run that got it answering has it, else as the latest run that
    tried it. Each server names its run; verdicts are computed again by the same procedure."""
    keys = ("gpu", "target_sha256", "series", "bars", "vllm", "tokens", "numerics")
    for r in records[1:]:
        if [r["meta"].get(k) for k in keys] != [records[0]["meta"].get(k) for k in keys]:
            raise SystemExit("these runs differ in " + ", ".join(
                k for k in keys if r["meta"].get(k) != records[0]["meta"].get(k)) + ": not one record")
    servers: dict = {}
    drafter = records[-1]["meta"].get("drafter")
    for i, r in enumerate(records):
        for name, entry in r["servers"].items():
            # a drafter server of a run with another drafter measured that drafter, not the
            # record's (the newest run's): it is left out, never merged under the wrong name
            if name.endswith("-dflash") and r["meta"].get("drafter") != drafter:
                continue
            if entry.get("passes") or not (servers.get(name) or {}).get("passes"):
                servers[name] = {**entry, "run": i}
    return {"meta": {**records[-1]["meta"], "runs": [r["meta"] for r in records]},
            "prompts": records[-1]["prompts"], "servers": servers}


def runs_in(paths: list[Path]) -> list[dict]:
    """The records named, a folder standing for its multinode*.json; oldest first (meta date)."""
    files = [f for p in paths for f in (sorted(p.glob("multinode*.json")) if p.is_dir() else [p])]
    if not files:
        raise SystemExit("no multinode*.json in " + ", ".join(map(str, paths)))
    return sorted((json.loads(f.read_text()) for f in files), key=lambda r: r["meta"]["date"])


def save(rec: dict, out: Path) -> None:
    rec["verdicts"] = verdicts(rec)
    out.mkdir(parents=True, exist_ok=True)
    (out / "multinode.json").write_text(json.dumps(rec, indent=1) + "\n")
    (out / "multinode.md").write_text(markdown(rec))


def headline_rows(rec: dict) -> list[tuple]:
    """What a reader needs first: each verdict against its bar, strict counts as the key number."""
    m, v = rec["meta"], rec.get("verdicts", {})
    series = headline.series_cell([{"series": m.get("series"), "vllm": m.get("vllm")}])
    row = lambda what, verdict, key: (what, m.get("vllm"), series, verdict, key)  # noqa: E731
    rows = []
    for a, b, what in (("nodes2", "tp2", "two nodes vs one TP 2 process"),
                       ("nodes2-dflash", "tp2-dflash", "two nodes vs one TP 2 process, with the drafter")):
        got = v.get(f"{a}_vs_{b}")
        rows.append(row(what, ("holds" if got["holds"] else "misses") if got else "not run",
                        f"{got['identical']}/{got['prompts']} identical" if got else "-"))
    if "tp2_vs_tp1" in v:
        st, no = v["tp2_vs_tp1"]["strict"], v["tp2_vs_tp1"]["noise"]
        rows.append(row("TP 2 vs TP 1", "holds" if no["holds"] else "misses",
                        f"{st['identical']}/{st['prompts']} identical, {no['within_noise']}/{no['prompts']} within noise"))
    if "gate" in v:
        rows.append(row("gate on TP 2's outputs", "fails" if v["gate_failures"] else "passes",
                        f"{v['gate']['looping_sequences']}/{v['gate']['sequences']} looping"))
    return rows


def markdown(rec: dict) -> str:
    m, v, s = rec["meta"], rec.get("verdicts", {}), rec["servers"]
    lines = ["# Two nodes, one model: `launcher serve --nnodes 2` on two GPUs", "",
             *headline.table(headline_rows(rec)),
             f"{m['date']}, {m['gpu']}, vLLM {m['vllm']} patched (series {m['series']}), "
             f"target {str(m['target_sha256'])[:8]}, {m['numerics']}, {m['tokens']} tokens per prompt.", "",
             "Regenerate: `make gpu-multinode` on a host with two GPUs.", ""]
    if m.get("vllm") == "0.33.0":
        lines += [caveats.TORCH_0_33_0, ""]
    if len(m.get("runs", [])) > 1:
        lines += [f"Servers from {len(m['runs'])} runs, one after the other, each on {m['gpu']}: "
                  + "; ".join(f"run {i} at {r['date']}: " + ", ".join(n for n, e in s.items() if e.get("run") == i)
                              for i, r in enumerate(m["runs"])) + ".", ""]
    lines += ["| comparison | identical (strict) | holds |", "|---|---|---|"]
    for key, val in v.items():
        if key.endswith("_vs_tp2") or key == "nodes2-dflash_vs_tp2-dflash":
            lines.append(f"| {key.replace('_vs_', ' vs ')} | {val['identical']}/{val['prompts']} | {val['holds']} |")
    if "tp2_vs_tp1" in v:
        st, no = v["tp2_vs_tp1"]["strict"], v["tp2_vs_tp1"]["noise"]
        lines.append(f"| tp2 vs tp1 | {st['identical']}/{st['prompts']} | within noise {no['within_noise']}/"
                     f"{no['prompts']} (bound {no['bound']}): {no['holds']} |")
    if "tp2_reproduces" in v:
        lines += ["", f"tp2 reproduces: {v['tp2_reproduces']['identical']}/{v['tp2_reproduces']['prompts']}."]
    if "gate" in v:
        g = v["gate"]
        lines += [f"Gate on tp2's outputs: {'passes' if not v['gate_failures'] else 'fails: ' + '; '.join(v['gate_failures'])}"
                  f" ({g['looping_sequences']} looping of {g['sequences']}, median distinct {g['median_distinct_fraction']})."]
    lines += ["", "| server | ready (s) | tok/s at " + ", ".join(map(str, SPEED_LEVELS)) + " | acceptance |",
              "|---|---|---|---|"]
    for name in SERVERS:
        e = s.get(name)
        if not e:
            continue
        sp = ", ".join(str(x["tok_s"]) for x in e.get("speed", [])) or "-"
        acc = ((e.get("passes") or [{}])[0].get("acceptance") or {}).get("mean_acceptance_length")
        lines.append(f"| {name} | {e.get('ready_s')} | {sp} | {acc if acc is None else round(acc, 3)} |"
                     + (f" error: {e['error']}" if e.get("error") else ""))
    kill = (s.get("nodes2") or {}).get("kill")
    if kill:
        lines += ["", "Head killed (SIGKILL): a client got `" + str(kill["client_after_kill"])[:120] + "`; node 1 "
                  + (f"exited by itself after {kill['worker_exit_s']} s (exit {kill['worker_exit_code']})"
                     if kill["worker_exited"] else f"was still running after {BARS['worker_exit_s']} s")
                  + f"; both restarted, ready in {kill.get('ready_s')} s"
                  + (f", first prompts as before: {kill['answers_as_before']['identical']}/"
                     f"{kill['answers_as_before']['prompts']}" if kill.get("answers_as_before") else "") + "."]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path)
    p.add_argument("--drafter", type=Path)
    p.add_argument("--site", help="PYTHONPATH of the patched vLLM (and its own site)")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--servers", default=",".join(SERVERS))
    p.add_argument("--tokens", type=int, default=gate.MIN_GENERATED_TOKENS)
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--start-timeout", type=float, default=480)
    p.add_argument("--set", action="append", default=[])
    p.add_argument("--gpu", default="")
    p.add_argument("--vllm", default="")
    p.add_argument("--series-hash", default=None)
    p.add_argument("--command", default="bash tests/gpu/remote.sh multinode-bg")
    p.add_argument("--merge", nargs="+", type=Path, metavar="RECORD",
                   help="no servers: one record (--out) from these multinode.json runs (a folder: its multinode*.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.merge:
        save(merged(runs_in(args.merge)), args.out)
        return 0
    missing = [f"--{k}" for k in ("model", "drafter", "site", "work") if getattr(args, k) is None]
    if missing:
        parser.error("the servers need " + ", ".join(missing) + " (or --merge RECORD...)")
    for key in ("model", "drafter", "work", "out"):
        setattr(args, key, getattr(args, key).resolve())
    args.work.mkdir(parents=True, exist_ok=True)
    os.environ.update(served.EXACT_ENV)
    prompts = json.loads((args.model / "prompts.json").read_text())
    rec = {"meta": meta(args), "prompts": len(prompts), "servers": {}}
    for name in [n for n in args.servers.split(",") if n]:
        if name not in SERVERS:
            raise SystemExit(f"unknown server {name!r}: {', '.join(SERVERS)}")
        print(f"[{name}] ...", flush=True)
        run_server(name, args, rec, prompts)
        save(rec, args.out)
        print(f"[{name}] ready_s={rec['servers'][name].get('ready_s')} error={rec['servers'][name].get('error')}",
              flush=True)
    print(json.dumps(rec["verdicts"], default=str)[:4000], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
