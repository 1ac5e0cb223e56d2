"""Re-judge the committed real-shape and served records under the current gate (issue 51, item 2).

``python tests/gpu/judging/rejudge.py [--results tests/gpu/results] [--out-dir tests/gpu/results]``

Reads every record of ``results/realshape.json`` and the raw records in the log tarballs of
``results/realshape-logs/`` (the committed records keep only the old gate's counts, not the
tokens), applies gate.py as it stands (loops, 32 distinct prompts of 128 tokens, at most 10 %
looping) and writes ``rejudge.json`` and ``rejudge.md``: per record the loops, distinct prompts,
the gate's verdict with its reasons, the recorded proof beside the proof under the new gate, and
whether the record ran on the current series (series_now.py). The rows of ``results/served.json``
are judged the same way from the served phases in ``results/served/``.

A raw record is taken for a committed record only when it is the same run: same name, target
and drafter, and the old gate's counts recomputed from its tokens (sequences, constant
sequences, median distinct fraction, near-ties, NaN positions) equal those the record stored.
Where no raw record matches, the record is judged on what it stored, which the new gate fails
("loops not counted"). A proof that fails the new gate is shown as "not proof", with the reason;
the recorded verdict stays beside it.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402
import caveats  # noqa: E402
import gate  # noqa: E402
import headline  # noqa: E402
import series_now  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
RESULTS = HERE / "results"
# The old gate's fields: a raw record is the committed record's run only if these agree.
OLD_FIELDS = ("sequences", "constant_sequences", "median_distinct_fraction", "near_ties", "nan_positions")
# The issue's own count beside the gate's: a tail where every token equals the one a period
# p <= 32 before it, over at least 32 tokens ("ends in an exact repeat of 32 or more tokens").
REPEAT_TOKENS = 32


def repeat_length(tokens: list, max_period: int = gate.LOOP_MAX_PERIOD) -> int:
    """The longest run of tokens at the end that each equal the token ``p`` before, over
    periods p <= max_period: how much of the tail repeats an earlier part exactly."""
    best = 0
    for p in range(1, max_period + 1):
        n, i = 0, len(tokens) - 1 - p
        while i >= 0 and tokens[i] == tokens[i + p]:
            n, i = n + 1, i - 1
        best = max(best, n)
    return best


def _outputs(raw: dict) -> tuple[list[dict], list[int]]:
    """A raw record's outputs and which prompt each answered (realshape.generated/_prompts)."""
    if raw.get("passes"):
        outs = raw["passes"][0]
        return outs, list(range(len(outs)))
    outs, keys = [], []
    for group in (raw.get("groups") or {}).values():
        outs += group
        keys += range(len(group))
    return outs, keys


def _members(tf: tarfile.TarFile, source: str):
    """(source, member name, bytes) of every JSON file in a tarball, nested tarballs included,
    in the order of their names. Read in the archive's own order, in one pass: reading a
    compressed tarball in another order seeks back, and each seek back decompresses it again
    from its start (most of this script's time, before)."""
    files = [(m.name, tf.extractfile(m).read()) for m in tf
             if m.isfile() and m.name.endswith((".tar.gz", ".tgz", ".tar.xz", ".tar", ".json"))]
    for name, data in sorted(files, key=lambda f: f[0]):  # stable: a name twice keeps the archive's order
        if name.endswith(".json"):
            yield source, name, data
        else:
            with tarfile.open(fileobj=io.BytesIO(data)) as inner:
                yield from _members(inner, f"{source}!{name}")


def load_raw(logs: Path, source: str) -> dict:
    """The whole raw record at ``source`` (``tarball!member``, nested tarballs joined by ``!``)."""
    parts = source.split("!")
    tf = tarfile.open(logs / parts[0])
    try:
        for inner in parts[1:-1]:
            tf = tarfile.open(fileobj=io.BytesIO(tf.extractfile(inner).read()))
        return json.loads(tf.extractfile(parts[-1]).read())
    finally:
        tf.close()


def raw_index(logs: Path) -> list[dict]:
    """Every raw run record in the tarballs under ``logs``: its identity, outputs and the old
    gate's counts. Duplicates (a run copied into several tarballs) stay: matching picks one."""
    return [entry for path in sorted(logs.glob("*.tar.*")) for entry in _archive_index(path)]


# What an archive's index is computed from besides its bytes: a change to any of them is a new key.
_INDEX_INPUTS = ("judging/rejudge.py", "judging/gate.py", "judging/compare.py", "judging/bars.py", "bars.yaml")


def _archive_index(path: Path) -> list[dict]:
    """raw_index of one tarball, kept in the cache under a key of its bytes and of the code that
    indexes it: decoding the raw records' logits takes about 20 s, and acceptance_report.py and
    this script index the same archives one after the other."""
    import hashlib
    import os
    import pickle

    from launcher.paths import cache_dir

    digest = hashlib.sha256(path.read_bytes())
    for name in _INDEX_INPUTS:
        digest.update((HERE / name).read_bytes())
    cached = cache_dir() / "raw-index" / f"{digest.hexdigest()}.pickle"
    if cached.exists():
        return pickle.loads(cached.read_bytes())
    found = [_index_entry(source, member, raw) for source, member, raw in _archive_members(path)
             if isinstance(raw, dict) and raw.get("name") and raw.get("ok") and (raw.get("passes") or raw.get("groups"))]
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        tmp.write_bytes(pickle.dumps(found, protocol=pickle.HIGHEST_PROTOCOL))
        os.replace(tmp, cached)  # a reader beside this one sees the whole file or none
    except OSError:
        pass  # no writable cache: computed each time, as before
    return found


def _index_entry(source: str, member: str, raw: dict) -> dict:
    outs, keys = _outputs(raw)
    return {"name": raw["name"], "source": f"{source}!{member}",
            "series": raw.get("series_hash"), "target_sha256": raw.get("target_sha256"),
            "drafter_sha256": raw.get("drafter_sha256"),
            "tokens": [o.get("token_ids") or [] for o in outs], "keys": keys, "block": gate.nondegenerate(outs, keys)}


def _archive_members(path: Path):
    """(tarball, member, parsed JSON) for every JSON file in one tarball."""
    with tarfile.open(path) as tf:
        for source, member, data in _members(tf, path.name):
            try:
                yield source, member, json.loads(data)
            except ValueError:
                continue


def _json_members(root: Path):
    """(tarball, member, parsed JSON) for every JSON file in the tarballs under ``root``."""
    for path in sorted(root.glob("*.tar.*")):
        yield from _archive_members(path)


def _same_run(stored: dict | None, raw: dict, name: str, rec: dict) -> bool:
    if raw["name"] != name:
        return False
    for key in ("target_sha256", "drafter_sha256"):
        if rec.get(key) and raw.get(key) and rec[key] != raw[key]:
            return False
    if stored is None:
        # No stored counts to compare (records before the gate): the same tree's run only.
        return bool(rec.get("series")) and raw.get("series") == rec.get("series")
    return all(stored.get(k) == raw["block"].get(k) for k in OLD_FIELDS if k in stored)


def match(index: list[dict], name: str | None, stored: dict | None, rec: dict) -> tuple[dict | None, str]:
    """The raw record of run ``name`` whose counts equal ``stored``; prefer the record's own
    series hash, then the first tarball by name. Returns (raw, note)."""
    if not name:
        return None, "no run named"
    # A record kept beside a newer run of its configuration was renamed with the superseded
    # target's tag (``-h8``, ``-h16``); its raw record keeps the run's own name.
    names = [name] + ([name.rsplit("-", 1)[0]] if rec.get("superseded_by") else [])
    hits = [r for n in names for r in index if _same_run(stored, r, n, rec)]
    if not hits:
        return None, "no raw record matches"
    hits.sort(key=lambda r: (r.get("series") != rec.get("series"), r["source"]))
    distinct = {json.dumps(r["tokens"]) for r in hits}
    return hits[0], "" if len(distinct) == 1 else f"{len(distinct)} raw records match with different tokens"


def _judge_side(raw: dict | None, stored: dict | None) -> dict:
    if raw is not None:
        block = gate.nondegenerate([{"token_ids": t} for t in raw["tokens"]], raw["keys"])
        # near-ties and NaN positions need the logits: the stored counts (equal by the match)
        block["near_ties"] = raw["block"]["near_ties"]
        block["nan_positions"] = raw["block"]["nan_positions"]
        seen, repeats = set(), 0
        for key, tokens in zip(raw["keys"], raw["tokens"]):
            if key not in seen:
                seen.add(key)
                repeats += repeat_length(tokens) >= REPEAT_TOKENS
        block["prompts_ending_in_repeat_32"] = repeats
        return {"raw": raw["source"], "block": block, "failures": gate.failures(block)}
    if stored is None:
        return {"raw": None, "block": None, "failures": ["no gate block recorded and no raw tokens identified"]}
    return {"raw": None, "block": stored, "failures": gate.failures(stored)}


def _noise_record(records: list[dict], rec: dict, name: str) -> dict | None:
    """The no-drafter twin's record of ``rec``'s configuration (realshape.NOISE_TWINS)."""
    same = ("vllm", "series", "target_sha256", "quantization", "batch_invariant")
    return next((r for r in records if r.get("name") == name and all(r.get(k) == rec.get(k) for k in same)), None)


def batch_noise_p99(records: list[dict], rec: dict, index: list[dict], logs: Path) -> dict | None:
    """A default-numerics row's "within batching noise" again, from the raw records of the
    run, its reference and its no-drafter twin, with the bound at bars.yaml's percentile of the
    twin's margin moves beside the widest move the record used. ``recomputed`` says whether the
    widest move recomputed here equals the one the record stored (the same three runs)."""
    stored = rec.get("batch_noise") or {}
    if "margin_bound" not in stored:
        return None
    import realshape

    noise_rec = _noise_record(records, rec, stored["run"])
    own, _ = match(index, rec.get("name"), rec.get("nondegenerate"), rec)
    ref, _ = match(index, rec.get("reference"), rec.get("reference_nondegenerate"), rec)
    noise, _ = match(index, stored["run"], (noise_rec or {}).get("nondegenerate"), noise_rec or rec) \
        if noise_rec else (None, "")
    if not (own and ref and noise):
        return {"run": stored["run"], "within": stored.get("within"), "margin_bound": stored["margin_bound"],
                "within_p99": None, "reason": "raw records of the run, its reference and its twin not all found"}
    got = realshape.within_batch_noise(load_raw(logs, ref["source"]), load_raw(logs, own["source"]),
                                       load_raw(logs, noise["source"]), stored["run"])
    keep = ("run", "within", "margin_bound", "own_margin_shift", "divergences", "unexplained", "unmeasured",
            "percentile", "margin_moves", "margin_bound_p99", "own_margin_shift_p99", "unexplained_p99",
            "unmeasured_p99", "within_p99")
    return {**{k: got.get(k) for k in keep}, "recorded_within": stored.get("within"),
            "recomputed": got.get("margin_bound") == stored["margin_bound"]
            and got.get("within") == stored.get("within")}


def judge_record(i: int, rec: dict, index: list[dict], records: list[dict] | None = None,
                 logs: Path | None = None) -> dict:
    stored = rec.get("nondegenerate")
    raw, note = match(index, rec.get("name"), stored, rec) if rec.get("ok") else (None, "run failed")
    own = _judge_side(raw, stored)
    out = {
        "index": i, "name": rec.get("name"), "vllm": rec.get("vllm"), "mode": rec.get("mode"),
        "series": rec.get("series"), "series_now": series_now.expected_hash(rec),
        "staleness": series_now.staleness(rec),
        "target_sha256": (rec.get("target_sha256") or "")[:8] or None,
        "drafter_sha256": (rec.get("drafter_sha256") or "")[:8] or None,
        "concurrency": rec.get("concurrency"),
        "gate": own, "match_note": note or None,
        "recorded_proof": rec.get("proof"),
        # whether the record names a bars.yaml committed before it (bars.provenance)
        "bars": bars.provenance(REPO, rec, "tests/gpu/results/realshape.json"),
    }
    needs_ref = rec.get("mode") in ("dflash", "oracle") and rec.get("reference")
    passes = not own["failures"]
    if needs_ref:
        ref_stored = rec.get("reference_nondegenerate")
        ref_raw, ref_note = match(index, rec["reference"], ref_stored, rec)
        out["reference"] = {"name": rec["reference"], **_judge_side(ref_raw, ref_stored),
                            "match_note": ref_note or None}
        passes = passes and not out["reference"]["failures"]
    out["gate_passes"] = passes
    if records is not None and logs is not None and rec.get("batch_noise"):
        out["batch_noise"] = batch_noise_p99(records, rec, index, logs)
    why = [f"gate: {w}" for w in own["failures"]]
    if needs_ref:
        why += [f"reference gate: {w}" for w in out["reference"]["failures"]]
    if rec.get("proof") is not True:
        why.insert(0, "recorded: not proof" if rec.get("proof") is False else "recorded: no proof verdict")
    out["proof"] = rec.get("proof") is True and passes
    out["verdict"] = "proof" if out["proof"] else "not proof"
    out["why"] = why
    return out


# ---------------------------------------------------------------- served rows (served.json)


def _served_outputs(phase: dict) -> tuple[list[dict], list] | None:
    """A served phase's outputs as served_report judged them (errors left out) and the request
    each answered: a reference phase's first pass, or every concurrency level of a DFlash phase."""
    if phase.get("passes"):
        outs = [o for o in phase["passes"][0] if not o.get("error")]
    elif phase.get("levels"):
        outs = [o for level in phase["levels"].values() for o in level if not o.get("error")]
    else:
        return None
    return outs, [o.get("id", i) for i, o in enumerate(outs)]


def served_index(served: Path) -> list[dict]:
    """Every served phase in the tarballs under ``served``: its server, release, outputs and the
    old gate's counts (for matching a served.json row to its phase)."""
    found = []
    for source, member, phase in _json_members(served):
        got = _served_outputs(phase) if isinstance(phase, dict) else None
        if not got or not got[0]:
            continue
        outs, keys = got
        found.append({"server": phase.get("server"), "vllm": phase.get("vllm"), "series": phase.get("series"),
                      "source": f"{source}!{member}", "kind": "reference" if phase.get("passes") else "dflash",
                      "tokens": [o.get("token_ids") or [] for o in outs], "keys": keys,
                      "block": gate.nondegenerate(outs)})
    return found


def _served_match(index: list[dict], stored: dict | None, kind: str, row: dict) -> dict | None:
    if not stored:
        return None
    hits = [p for p in index if p["kind"] == kind and p["vllm"] == row.get("vllm")
            and p["series"] == row.get("series")
            and all(stored.get(k) == p["block"].get(k) for k in OLD_FIELDS if k in stored)]
    return sorted(hits, key=lambda p: p["source"])[0] if hits else None


def speed_raw(results: Path, row: dict, side: str) -> dict | None:
    """A speed row's raw tokens: the outputs its `launcher bench` file recorded at concurrency 1
    (``bench`` with the drafter, ``baseline_bench`` without), request i keyed by the prompt it
    sent (i mod the prompt file's count; served.speed_gate keys them so)."""
    name = row.get("bench" if side == "dflash" else "baseline_bench")
    path = results / Path(name).name if name else None
    if path is None or not path.is_file():
        return None
    doc = json.loads(path.read_text(encoding="utf-8"))
    got = gate.bench_outputs(doc)
    if got is None:
        return None
    return {"source": path.name, "tokens": got[0], "keys": got[1],
            "block": {"near_ties": 0, "nan_positions": 0}}  # a benchmark keeps no logits


def judge_served(i: int, row: dict, index: list[dict], results: Path | None = None) -> dict:
    nd = row.get("nondegenerate")
    pair = isinstance(nd, dict) and "dflash" in nd
    sides = {"dflash": (nd or {}).get("dflash"), "reference": (nd or {}).get("reference")} if pair \
        else {"own": nd}
    out = {"index": i, "server": row.get("server"), "vllm": row.get("vllm"), "recipe": row.get("recipe"),
           "series": row.get("series"), "series_now": series_now.expected_hash(row),
           "staleness": series_now.staleness(row), "lossless": row.get("lossless")}
    why = []
    for side, stored in sides.items():
        kind = "reference" if side in ("own", "reference") and (side == "reference" or row.get("server") == "reference") \
            else "dflash"
        if row.get("server") == "speed":
            phase = speed_raw(results, row, side) if results is not None else None
        else:
            phase = _served_match(index, stored, kind, row)
        judged = _judge_side(phase, stored) if stored else {"raw": None, "block": None, "failures": ["no output"]}
        out[side] = judged
        why += [f"{side} gate: {w}" for w in judged["failures"]]
    out["gate_passes"] = bool(nd) and not why
    out["verdict"] = "gate passes" if out["gate_passes"] else "not proof"
    out["why"] = why if nd else ["no output recorded"]
    return out


# What each gate failure is about, for the summary: gate.failures' messages by their wording.
REASONS = (("looping", "more than 10 % looping"), ("prompts of", "fewer than 32 prompts of 128+ tokens"),
           ("median distinct", "median distinct fraction under 0.2"), ("constant", "constant sequences"),
           ("NaN", "NaN logits"), ("loops not counted", "loops not counted (no raw tokens)"),
           ("no gate block", "no gate block and no raw tokens"), ("no output", "no output"))


def reason_counts(rows: list[dict]) -> dict[str, int]:
    """How many records fail the gate (own output or reference) for each kind of reason."""
    counts = {label: 0 for _, label in REASONS}
    for r in rows:
        why = " ".join(w for w in r["why"] if not w.startswith("recorded"))
        for needle, label in REASONS:
            if needle in why:
                counts[label] += 1
    return counts


def rejudge(results: Path = RESULTS) -> dict:
    records = json.loads((results / "realshape.json").read_text(encoding="utf-8"))
    index = raw_index(results / "realshape-logs")
    rows = [judge_record(i, r, index, records, results / "realshape-logs") for i, r in enumerate(records)]
    gated = [r for r in rows if r["gate"]["raw"] is not None]
    served_doc = json.loads((results / "served.json").read_text(encoding="utf-8")) \
        if (results / "served.json").is_file() else {}
    sindex = served_index(results / "served")
    served_rows = [judge_served(i, r, sindex, results) for i, r in enumerate(served_doc.get("servers") or [])]
    return {
        "bars": bars.blob_hash(),
        "series_now": series_now.current_hashes(),
        "command": "python tests/gpu/judging/rejudge.py",
        "summary": {
            "records": len(rows),
            "judged_from_raw_tokens": len(gated),
            "gate_passes": sum(r["gate_passes"] for r in rows),
            "recorded_proof": sum(r["recorded_proof"] is True for r in rows),
            "proof": sum(r["proof"] for r in rows),
            "stale": sum(r["staleness"] == "stale" for r in rows),
            "current": sum(r["staleness"] == "current" for r in rows),
            "stock": sum(r["staleness"] == "stock" for r in rows),
            "predate_the_bars_file": sum(r["bars"] == "predates the bars file" for r in rows),
            "gate_failures_by_reason": reason_counts(rows),
            "batch_noise_rows": sum(bool(r.get("batch_noise")) for r in rows),
            "batch_noise_within_widest": sum((r.get("batch_noise") or {}).get("within") is True for r in rows),
            "batch_noise_within_p99": sum((r.get("batch_noise") or {}).get("within_p99") is True for r in rows),
            # rows whose widest-move verdict recomputed here equals the recorded one: the same twin
            "batch_noise_recomputed": sum((r.get("batch_noise") or {}).get("recomputed") is True for r in rows),
        },
        "records": rows,
        "served_summary": {
            "rows": len(served_rows),
            "judged_from_raw_tokens": sum(any((r.get(k) or {}).get("raw") for k in ("own", "dflash", "reference"))
                                          for r in served_rows),
            "gate_passes": sum(r["gate_passes"] for r in served_rows),
            "stale": sum(r["staleness"] == "stale" for r in served_rows),
        },
        "served": served_rows,
    }


def _cell(v) -> str:
    return "–" if v is None else str(v)


def _headline(report: dict) -> list[str]:
    """One row per page re-judged and release: the series, how many remain proof, how many pass the gate."""
    rows = []
    for what, records in (("realshape.json records", report["records"]), ("served.json rows", report.get("served") or [])):
        for vllm in sorted({r.get("vllm") for r in records if r.get("vllm")}):
            mine = [r for r in records if r.get("vllm") == vllm]
            proof = sum(r.get("verdict") == "proof" for r in mine)
            passes = sum(bool(r.get("gate_passes")) for r in mine)
            rows.append((what, vllm, headline.series_cell(mine), f"{proof} of {len(mine)} proof",
                         f"{passes} of {len(mine)} pass the gate"))
    return headline.table(rows)


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = [
        "# Re-judged real-shape records (issue 51)",
        "",
        *_headline(report),
        f"`{report['command']}` over `realshape.json` and the raw records in `realshape-logs/`, "
        f"under `bars.yaml` {report['bars'][:8]}. Generated; do not edit.",
        "",
        f"**{s['proof']} of {s['records']} records are proof under the new gate** "
        f"({s['recorded_proof']} were recorded as proof); {s['gate_passes']} pass the gate, "
        f"{s['judged_from_raw_tokens']} were judged from their raw tokens. "
        f"**{s['stale']} records are stale** (ran on a series other than the current one), "
        f"{s['current']} current, {s['stock']} stock. {s['predate_the_bars_file']} records predate "
        f"the bars file (they name no bars.yaml version).",
        "",
        "Records failing the gate, by reason (a record may have several): "
        + "; ".join(f"{label} {n}" for label, n in s["gate_failures_by_reason"].items() if n) + ".",
        "",
        "Current series: " + ", ".join(f"{v} {h[:8]}" for v, h in report["series_now"].items()) + ".",
        "",
        "Columns: loops = sequences whose last 64 tokens repeat with a period of 32 or less; "
        "repeat32 = prompts whose output ends in an exact repeat of 32+ tokens (period <= 32); "
        "prompts = distinct prompts with 128+ generated tokens / distinct prompts; ref = the same "
        "for the reference run the record is judged against.",
        "",
        "| # | record | vLLM | series | stale | loops | repeat32 | prompts | ref loops | ref repeat32 "
        "| ref prompts | recorded proof | verdict | why |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["records"]:
        b = r["gate"]["block"] or {}
        ref = (r.get("reference") or {}).get("block") or {}
        series = "stock" if r["series"] == "stock" else (r["series"] or "")[:8] or "–"
        loops = "–" if b.get("looping_sequences") is None else f"{b['looping_sequences']}/{b.get('sequences')}"
        rloops = "–" if ref.get("looping_sequences") is None else f"{ref['looping_sequences']}/{ref.get('sequences')}"
        prompts = "–" if b.get("prompts") is None else f"{b['prompts_full_length']}/{b['prompts']}"
        rprompts = "–" if ref.get("prompts") is None else f"{ref['prompts_full_length']}/{ref['prompts']}"
        stale = {"stale": "**stale**", "current": "current"}.get(r["staleness"], r["staleness"])
        lines.append(
            f"| {r['index']} | {r['name']} | {r['vllm']} | {series} | {stale} | {loops} "
            f"| {_cell(b.get('prompts_ending_in_repeat_32'))} | {prompts} | {rloops} "
            f"| {_cell(ref.get('prompts_ending_in_repeat_32'))} | {rprompts} | {_cell(r['recorded_proof'])} "
            f"| {'proof' if r['proof'] else '**not proof**'} | {'; '.join(r['why'])} |")
    ss = report.get("served_summary") or {}
    if report.get("served"):
        lines += [
            "", "## Served rows (served.json)", "",
            f"**{ss['gate_passes']} of {ss['rows']} served rows pass the gate**; {ss['judged_from_raw_tokens']} "
            f"judged from the raw phases in `served/`; **{ss['stale']} stale**.", "",
            "| # | server | vLLM | recipe | series | stale | loops | prompts | ref loops | ref prompts | lossless "
            "| verdict | why |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["served"]:
            own = (r.get("own") or r.get("dflash") or {}).get("block") or {}
            ref = (r.get("reference") or {}).get("block") or {}

            def frac(b, key, total):
                return "–" if b.get(key) is None else f"{b[key]}/{b.get(total)}"

            stale = {"stale": "**stale**", "current": "current"}.get(r["staleness"], r["staleness"])
            series = "stock" if r["series"] == "stock" else (r["series"] or "")[:8] or "–"
            lines.append(
                f"| {r['index']} | {r['server']} | {r['vllm']} | {_cell(r['recipe'])} | {series} | {stale} "
                f"| {frac(own, 'looping_sequences', 'sequences')} | {frac(own, 'prompts_full_length', 'prompts')} "
                f"| {frac(ref, 'looping_sequences', 'sequences')} | {frac(ref, 'prompts_full_length', 'prompts')} "
                f"| {_cell(r['lossless'])} | {'gate passes' if r['gate_passes'] else '**not proof**'} "
                f"| {'; '.join(r['why'])} |")
    noisy = [r for r in report["records"] if r.get("batch_noise")]
    if noisy:
        lines += [
            "", "## Within batching noise, the bound at the 99th percentile (bars.yaml)", "",
            f"{s['batch_noise_within_widest']} of {s['batch_noise_rows']} default-numerics rows are within the "
            "noise bound taken at the twin's widest margin move (as recorded); "
            f"**{s['batch_noise_within_p99']} of {s['batch_noise_rows']} with the bound at the 99th percentile** of "
            "the twin's moves over all positions of the same prompts. Not decided (null) is not a pass. "
            f"{s['batch_noise_recomputed']} of {s['batch_noise_rows']} reproduce the recorded widest-move verdict "
            "from the raw records; the others were judged against a twin run whose raw record is no longer the "
            "one realshape.json keeps (recomputed: False), so their p99 figures use the kept twin.", "",
            "| # | record | twin | widest move | own widest | within (widest) | moves | p99 bound | own p99 "
            "| divergences | beyond p99 | within (p99) | recomputed |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in noisy:
            n = r["batch_noise"]
            lines.append(
                f"| {r['index']} | {r['name']} | {n.get('run')} | {_cell(n.get('margin_bound'))} "
                f"| {_cell(n.get('own_margin_shift'))} | {_cell(n.get('within'))} | {_cell(n.get('margin_moves'))} "
                f"| {_cell(n.get('margin_bound_p99'))} | {_cell(n.get('own_margin_shift_p99'))} "
                f"| {_cell(n.get('divergences'))} | {_cell(n.get('unexplained_p99'))} | {_cell(n.get('within_p99'))} "
                f"| {_cell(n.get('recomputed', n.get('reason')))} |")
    return caveats.with_caveats("\n".join(lines) + "\n")


def write(report: dict, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "rejudge.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (out_dir / "rejudge.md").write_text(markdown(report), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    report = rejudge(args.results)
    write(report, args.out_dir)
    print(json.dumps(report["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
