"""The served speed pair run more than once on one host, side by side (issue 51).

``python tests/gpu/judging/speed_repeats.py [--archive A ...] [--exact ARCHIVE] [--out FILE]``

served.md keeps one speed row per release: the run that was planned. A second run of the same
command is evidence too, and is shown beside the row, never in its place. This reads each run's raw
archive (``results/served/served-speed-*-gated*.tar.xz``: the `launcher bench` files with their
outputs, and the served.json the run wrote) and records, per run:

* the speed-up at concurrency 1 and its ratio to the projection (the row served.py wrote);
* each side's outputs through the gate (gate.py: loops, distinct prompts);
* how each side's outputs relate to the exact-numerics no-drafter twins of the conformance run
  (the same target and prompts, reproduced 36/36): how many are identical, and, where one parts
  from its twin, the twin's top-1/top-2 raw-logit margin at that position. A small margin there
  says a near tie took the other branch; the speed runs use default numerics, which do not
  reproduce from run to run;

and per release, how many outputs each side repeated exactly from one run to the next.

Which run is served.md's row is read from ``results/served.json`` (the row's tok/s at
concurrency 1 equal the run's). Nothing here judges a bar: the row's verdict is served.md's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import gate  # noqa: E402

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
RESULTS = HERE / "results"
ARCHIVES = "served/served-speed-*-gated*.tar.xz"
EXACT = RESULTS / "conformance" / "84c26c18" / "served-raw.tar.xz"
# The exact twins in the conformance archive, by release (served.py's folder names)
EXACT_TWINS = {"0.21.0": "served/conformance-twin.json", "0.33.0": "served-v33/conformance-twin.json"}
SIDES = {"dflash": "dflash", "reference": "no-drafter"}  # the row's side names -> the bench files'


def _members(path: Path, wanted) -> dict[str, bytes]:
    """The archive's files whose base name ``wanted`` accepts (not its logs and step records)."""
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()
                if m.isfile() and wanted(m.name.rsplit("/", 1)[-1])}


def _run_file(name: str) -> bool:
    return name == "served.json" or name == "speed-prompts.jsonl" or \
        (name.startswith("served-bench-") and "-speed-" in name)


def _one(files: dict[str, bytes], archive: str, test, what: str) -> str:
    """The one member name ``test`` accepts; SystemExit naming the archive otherwise."""
    names = [n for n in files if test(n.rsplit("/", 1)[-1])]
    if len(names) != 1:
        raise SystemExit(f"{archive}: {len(names)} members are {what}, not one")
    return names[0]


def exact_twins(path: Path) -> dict[str, dict]:
    """Per release, the exact twin record (its rows: token_ids, margins, prompt_tokens)."""
    files = _members(path, lambda n: n == "conformance-twin.json")
    return {v: json.loads(files[name]) for v, name in EXACT_TWINS.items() if name in files}


def _bench(files: dict[str, bytes], archive: str, side: str) -> tuple[str, dict]:
    """(release, bench document) of the run's benchmark file of ``side`` (dflash or no-drafter)."""
    suffix = f"-speed-{side}.json"
    name = _one(files, archive, lambda n: n.startswith("served-bench-") and n.endswith(suffix),
                f"served-bench-*{suffix}")
    return name.rsplit("/", 1)[-1][len("served-bench-"):-len(suffix)], json.loads(files[name])


def _c1(entries: list[dict] | None) -> dict | None:
    return next((c for c in entries or [] if c.get("concurrency") == 1), None)


def _row(served: dict, vllm: str, tok_s: float) -> dict | None:
    """The speed row of ``vllm`` whose concurrency-1 tok/s with the drafter is ``tok_s``."""
    for row in served.get("servers") or []:
        one = _c1(row.get("speed"))
        if row.get("server") == "speed" and row.get("vllm") == vllm and one \
                and one["output_tok_s"].get("with_drafter") == tok_s:
            return row
    return None


def twins_unfit(twin: dict | None, row: dict | None, prompt_lengths: list[int]) -> str:
    """Why the exact twins are not this run's (another target or other prompts), or ""."""
    if not twin:
        return "no exact twin of this release"
    if row is None or row.get("target_sha256") != twin.get("target_sha256"):
        return "the run's target is not the twins'"
    if prompt_lengths != [r.get("prompt_tokens") for r in twin["rows"]]:
        return "the run's prompts are not the twins'"
    return ""


def first_divergence(tokens: list[int], twin: dict) -> tuple[int, float | None] | None:
    """Where ``tokens`` first part from the twin's, and the twin's margin there; None only when
    the two are the same tokens (one ending early parts where it ends, at no margin)."""
    theirs = twin["token_ids"]
    for pos, (a, b) in enumerate(zip(tokens, theirs)):
        if a != b:
            margins = twin.get("margins") or []
            return pos, (margins[pos] if pos < len(margins) else None)
    return None if len(tokens) == len(theirs) else (min(len(tokens), len(theirs)), None)


def side_record(tokens: list[list[int]], keys: list[int], twins: list[dict] | None, stored: dict | None) -> dict:
    """One side of one run from its raw tokens at concurrency 1 (gate.bench_outputs): the gate,
    whether its loops are those the row stored (``stored``: the row's nondegenerate block of this
    side), and its relation to the exact twins (``twins``: None where they are not this run's)."""
    if not tokens:
        return {"outputs": 0, "looping_prompts": [], "gate_failures": ["no output"]}
    block = gate.bench_block(tokens, keys)
    looping = block["looping_prompts"]
    out = {"outputs": len(tokens), "looping_prompts": looping, "gate_failures": gate.failures(block),
           "agrees_with_row": None if not stored else stored.get("looping_prompts") == looping}
    if twins:
        parts = {k: first_divergence(t, twins[k]) for k, t in zip(keys, tokens)}
        margins = [p[1] for p in parts.values() if p and p[1] is not None]
        looping_margins = [parts[k][1] for k in looping if parts[k] and parts[k][1] is not None]
        # each looping prompt: where it parts from its exact twin (the twin's margin there), or
        # that it does not part and whether the twin loops too
        explained = [{"prompt": k, "position": parts[k][0], "margin": parts[k][1]} if parts[k]
                     else {"prompt": k, "twin_loops": gate.looping(twins[k]["token_ids"])} for k in looping]
        out["exact"] = {
            "identical": sum(1 for p in parts.values() if p is None),
            "max_margin_at_first_divergence": max(margins) if margins else None,
            "looping_max_margin": max(looping_margins) if looping_margins else None,
            "looping": explained,
            # looping outputs neither parted from the twin at a margin nor equal to a looping twin
            "looping_unexplained": sum(1 for e in explained if e.get("margin") is None and not e.get("twin_loops")),
        }
    return out


def run_record(path: Path, twins: dict[str, dict], committed: dict) -> tuple[dict, dict]:
    """(the run's record, its c=1 outputs per side for the run-to-run comparison)."""
    files = _members(path, _run_file)
    vllm, dflash = _bench(files, path.name, SIDES["dflash"])
    _, baseline = _bench(files, path.name, SIDES["reference"])
    one = _c1(dflash.get("comparison"))
    if one is None:
        raise SystemExit(f"{path.name}: its dflash benchmark compared nothing at concurrency 1")
    served = json.loads(files[_one(files, path.name, lambda n: n == "served.json", "served.json")])
    row = _row(served, vllm, one["output_tok_s"]["with_drafter"])
    prompts = files.get(next((n for n in files if n.endswith("/speed-prompts.jsonl")), ""), b"")
    lengths = [len(json.loads(line)["prompt"]) for line in prompts.decode().splitlines() if line.strip()]
    unfit = twins_unfit(twins.get(vllm), row, lengths)
    rec = {"archive": path.name, "vllm": vllm,
           "row_on_served_md": _row(committed, vllm, one["output_tok_s"]["with_drafter"]) is not None,
           "speedup_c1": one["speedup"], "requests_c1": one["requests"],
           "measured_over_projected_c1": (_c1(row.get("speed")) or {}).get("measured_over_projected") if row else None,
           "mean_acceptance_length_c1": one.get("mean_acceptance_length"),
           "exact_twins": unfit or "this run's target and prompts"}
    outputs = {}
    for side, doc in (("dflash", dflash), ("reference", baseline)):
        stored = ((row or {}).get("nondegenerate") or {}).get(side)
        tokens, keys = gate.bench_outputs(doc) or ([], [])
        rec[side] = side_record(tokens, keys, None if unfit else twins[vllm]["rows"], stored)
        outputs[side] = dict(zip(keys, tokens))
    return rec, outputs


def repeats(runs: list[tuple[dict, dict]]) -> list[dict]:
    """Per release and side, for each pair of its runs: the prompts whose outputs are the same,
    of the prompts both answered."""
    out = []
    for i, (a, oa) in enumerate(runs):
        for b, ob in runs[i + 1:]:
            if a["vllm"] != b["vllm"]:
                continue
            same = {side: sum(1 for k, t in oa[side].items() if ob[side].get(k) == t) for side in oa}
            both = {side: len(set(oa[side]) & set(ob[side])) for side in oa}
            out.append({"vllm": a["vllm"], "runs": [a["archive"], b["archive"]], "identical": same, "prompts": both})
    return out


def build(archives: list[Path], exact: Path, served: Path) -> dict:
    twins = exact_twins(exact)
    committed = json.loads(served.read_text())
    # each release's served.md row first, then its other runs
    runs = sorted((run_record(p, twins, committed) for p in archives),
                  key=lambda r: (r[0]["vllm"], not r[0]["row_on_served_md"], r[0]["archive"]))
    return {"exact_twins": exact.name, "runs": [r for r, _ in runs], "repeats": repeats(runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive", type=Path, action="append",
                        help=f"a speed run's raw archive (default: results/{ARCHIVES}, sorted)")
    parser.add_argument("--exact", type=Path, default=EXACT, help="the conformance run's archive (exact twins)")
    parser.add_argument("--served", type=Path, default=RESULTS / "served.json")
    parser.add_argument("--out", type=Path, default=RESULTS / "served" / "speed-repeats.json")
    args = parser.parse_args(argv)
    archives = args.archive or sorted(RESULTS.glob(ARCHIVES))
    if not archives:
        parser.error(f"no speed archives (results/{ARCHIVES})")
    doc = build(archives, args.exact, args.served)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    for r in doc["runs"]:
        print(f"{r['archive']}: {r['speedup_c1']:.2f}x, loops dflash {len(r['dflash']['looping_prompts'])} "
              f"reference {len(r['reference']['looping_prompts'])}, row on served.md: {r['row_on_served_md']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
