"""Which candidate target's served references pass the gate on every release (issue 51, item 2).

A target is fit for the proof's reruns only if vLLM's own references of it say something: the
no-drafter twin (``served.py``'s ``conformance-twin`` phase, exact numerics, one prompt at a time)
must pass the gate on each release the recipes cover, and a twin served again must give the
same tokens. The transformers probe a trainer runs is a forecast of that, not the thing itself:
083e4869 looped in 1 of 36 under transformers and in 4 of 36 served by 0.33.0.

Input: twin records labelled ``TARGET:RELEASE[:RUN]=PATH``. Output: per twin its gate block, per
(target, release) whether the runs agree token for token, per target the verdict, and which
target is kept: the first of ``--prefer`` whose every twin passes on every release, with at
least two agreeing runs on each (a reference that reproduces); none when no target does.

``python tests/gpu/judging/served_gate.py --twin 9b666f25:0.21.0:1=T.json ... --prefer 9b666f25,84c26c18 --out R.json``
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import gate  # noqa: E402


def parse_label(label: str) -> tuple[str, str, str]:
    """``TARGET:RELEASE[:RUN]`` as its three parts (RUN defaults to "1")."""
    parts = label.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"twin label {label!r}: TARGET:RELEASE[:RUN]")
    return parts[0], parts[1], parts[2] if len(parts) == 3 else "1"


def twin_block(record: dict) -> dict:
    """The gate over a twin record's rows, with the looping prompts by index and period."""
    rows = record.get("rows") or []
    block = gate.nondegenerate([{"token_ids": r.get("token_ids") or []} for r in rows])
    block["looping_prompts"] = [{"prompt": i, "period": gate.loop_period(r.get("token_ids") or [])}
                                for i, r in enumerate(rows) if gate.looping(r.get("token_ids") or [])]
    block["passes"] = gate.passes(block)
    block["series"] = record.get("series")
    return block


def judge(twins: dict[str, dict], prefer: list[str]) -> dict:
    """``twins``: label -> twin record. The verdict per target and the one kept (module doc)."""
    blocks = {label: twin_block(rec) for label, rec in twins.items()}
    by_pair: dict[tuple[str, str], list[str]] = {}
    for label in twins:
        target, release, _ = parse_label(label)
        by_pair.setdefault((target, release), []).append(label)
    pairs = {}
    for (target, release), labels in sorted(by_pair.items()):
        tokens = [[r.get("token_ids") for r in twins[lb].get("rows") or []] for lb in labels]
        pairs[f"{target}:{release}"] = {
            "runs": labels, "passes": all(blocks[lb]["passes"] for lb in labels),
            "looping_sequences": [blocks[lb]["looping_sequences"] for lb in labels],
            "reproduces": len(labels) >= 2 and all(t == tokens[0] for t in tokens[1:]),
        }
    releases = sorted({release for _, release in by_pair})
    targets = {}
    for target in sorted({t for t, _ in by_pair}):
        mine = [pairs.get(f"{target}:{r}") for r in releases]
        targets[target] = {
            "passes_every_release": all(p is not None and p["passes"] for p in mine),
            "reproduces_every_release": all(p is not None and p["reproduces"] for p in mine),
        }
    unknown = [t for t in prefer if t not in targets]
    if unknown:
        raise ValueError(f"--prefer names targets with no twin: {unknown}")
    kept = next((t for t in prefer if targets[t]["passes_every_release"] and targets[t]["reproduces_every_release"]),
                None)
    return {"releases": releases, "twins": blocks, "pairs": pairs, "targets": targets, "prefer": prefer,
            "kept": kept}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--twin", action="append", required=True, metavar="TARGET:RELEASE[:RUN]=PATH")
    parser.add_argument("--prefer", required=True, help="targets in the order to keep one, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    twins, seen_runs, seen_paths = {}, set(), {}
    for item in args.twin:
        label, sep, path = item.partition("=")
        if not sep:
            parser.error(f"--twin {item!r}: LABEL=PATH")
        try:
            run = parse_label(label)
        except ValueError as exc:
            parser.error(str(exc))
        if run in seen_runs:
            parser.error(f"--twin {label}: run {':'.join(run)} given twice")
        real = Path(path).resolve()
        if real in seen_paths:  # one file is one run: it never reproduces itself
            parser.error(f"--twin {label}: {path} is also {seen_paths[real]}")
        seen_runs.add(run)
        seen_paths[real] = label
        try:
            twins[label] = json.loads(real.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--twin {label}: {path}: {exc}")
    prefer = [t for t in args.prefer.split(",") if t]
    if not prefer:
        parser.error("--prefer: at least one target")
    try:
        verdict = judge(twins, prefer)
    except ValueError as exc:
        parser.error(str(exc))
    text = json.dumps(verdict, indent=2) + "\n"
    if args.out:
        args.out.write_text(text)
    for label, block in verdict["twins"].items():
        print(f"{label}: {block['looping_sequences']} of {block['sequences']} looping, passes {block['passes']}")
    print(f"kept: {verdict['kept']}")
    return 0 if verdict["kept"] else 1


if __name__ == "__main__":
    sys.exit(main())
