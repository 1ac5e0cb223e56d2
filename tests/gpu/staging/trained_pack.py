"""Move the trained checkpoints to a later GPU host in parts instead of training them again (issue 23).

Training takes about 7.5 minutes of GPU time. The checkpoints (target, its
NVFP4 copy once made, the drafters, prompts: about 350 MB) travel in parts:
``remote.sh pack-trained`` tars ``/tmp/models-trained`` into an extras bundle
of 15.9 MB parts and puts four of them and the manifest into ``$OUT`` per
command; here ``collect`` checks each part against the manifest and files it
under ``.stage/``, where staging copies it back like any other extras bundle
(``remote.sh receive``, then ``extras`` unpacks it into ``$MODELS_TRAINED``). ``train-target`` then checks
the checkpoint against its train record (``target_sha256``) and skips training.

``repeat`` compares two train records of the same recipe: ``remote.sh
train-target`` with ``TRAIN_REPEAT=1`` trains again next to a staged
checkpoint, which is the run-to-run determinism check the recipe claims.

``remote.sh pack-drafter`` packs a retrained drafter alone (about 11 MB, one part) as the
``extras-update-drafter`` bundle: ``extras`` installs bundles in name order, so it lands over
the drafter that ``extras-trained`` holds.

    python tests/gpu/staging/trained_pack.py manifest PACK_DIR TRAIN_RECORD [--stem S]     (device)
    python tests/gpu/staging/trained_pack.py collect FILES_AT [--stage .stage] [--stem S]  (here)
    python tests/gpu/staging/trained_pack.py repeat RECORD_A RECORD_B           (device)
    python tests/gpu/staging/trained_pack.py better NEW_DRAFTER_RECORD OLD_DRAFTER_RECORD  (device)
    DRAFTER_SWEEP='[{...}, ...]' python tests/gpu/staging/trained_pack.py sweep-plan --gpus N    (device)
    python tests/gpu/staging/trained_pack.py choose-polish long=RECORD long-heavy=RECORD  (device)

``better`` decides whether a retrained drafter replaces the one on disk: only when its held-out
acceptance (the train record's own evaluation, on the same prompts and target) is not lower.
A retrain is an experiment; the runs after it must not quietly lose acceptance to one.

``sweep-plan`` checks ``remote.sh drafter-sweep``'s recipes before any GPU time goes into them:
one line a GPU, ``slot<TAB>needs the extra corpus (0/1)<TAB>override``, or a refusal that names
the recipe and its fault.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

STEM = "extras-trained"
# After STEM in name order (extras() installs extras*.json sorted), so its drafter wins.
DRAFTER_STEM = "extras-update-drafter"


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
from parts import sha256 as _sha256  # noqa: E402  (the one hasher of staged parts)


def write_manifest(pack: Path, record: dict, stem: str = STEM) -> dict:
    """The extras manifest remote.sh's receive/assemble read: parts in order, each part's
    and the whole's sha256, plus the target_sha256 the checkpoint must have."""
    parts = sorted(pack.glob(f"{stem}.tar.part*"))
    if not parts:
        raise SystemExit(f"no {stem}.tar.part* in {pack}")
    whole = hashlib.sha256()
    for p in parts:
        with p.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                whole.update(block)
    manifest = {"target_sha256": record["target_sha256"], "sha256": whole.hexdigest(),
                "bytes": sum(p.stat().st_size for p in parts),
                "parts": [{"name": p.name, "bytes": p.stat().st_size, "sha256": _sha256(p)} for p in parts]}
    (pack / f"{stem}.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def collect(files_at: Path, stage: Path, stem: str = STEM) -> list[str]:
    """Copy the parts a pack-trained call brought back into ``stage``, each checked against
    the manifest that came with it. A manifest of another checkpoint than the one already
    staged is refused: parts of two checkpoints must never mix."""
    manifest_path = files_at / f"{stem}.json"
    if not manifest_path.exists():
        raise SystemExit(f"{manifest_path} missing: every pack-trained call brings the manifest back")
    manifest = json.loads(manifest_path.read_text())
    staged = stage / f"{stem}.json"
    if staged.exists() and json.loads(staged.read_text())["sha256"] != manifest["sha256"]:
        raise SystemExit(f"{staged} describes another pack (sha256 differs): remove the old "
                         f"{stem}.* files from {stage} first")
    expected = {p["name"]: p["sha256"] for p in manifest["parts"]}
    stage.mkdir(parents=True, exist_ok=True)
    copied = []
    for part in sorted(files_at.glob(f"{stem}.tar.part*")):
        if part.name not in expected:
            raise SystemExit(f"{part.name} is not in the manifest")
        if _sha256(part) != expected[part.name]:
            raise SystemExit(f"{part.name}: sha256 differs from the manifest (damaged in transfer)")
        shutil.copyfile(part, stage / part.name)
        copied.append(part.name)
    shutil.copyfile(manifest_path, staged)
    missing = sorted(set(expected) - {p.name for p in stage.glob(f"{stem}.tar.part*")})
    print(f"staged {len(copied)} part(s); still missing: {missing or 'none'}")
    return missing


def _curve(record: dict) -> list:
    """A loss curve without its wall-clock times, which differ from run to run and machine to machine."""
    return [{k: v for k, v in p.items() if k != "elapsed_s"} if isinstance(p, dict) else p
            for p in record["loss_curve"]]


def _common(first: dict | None, again: dict | None) -> tuple[bool, list[str]]:
    """Equal on the keys both hold, and the keys only one holds: a record written by a later
    harness names settings (defaults, probe details) that an earlier one left unwritten."""
    first, again = first or {}, again or {}
    shared = set(first) & set(again)
    return all(first[k] == again[k] for k in shared), sorted(set(first) ^ set(again))


def repeat(first: dict, again: dict) -> dict:
    """Did the same recipe give the same checkpoint twice? Target or drafter train records."""
    key = "drafter_sha256" if "drafter_sha256" in first else "target_sha256"
    config_equal, config_one_side = _common(first.get("train_config"), again.get("train_config"))
    out = {"checkpoint": key, "first": first[key], "again": again[key],
           "identical": first[key] == again[key],
           "loss_curves_equal": _curve(first) == _curve(again),
           "train_config_equal": first.get("train_config") == again.get("train_config"),
           "train_config_equal_where_both_record": config_equal,
           "train_config_recorded_by_one": config_one_side,
           "first_gpu": first.get("gpu"), "again_gpu": again.get("gpu")}
    if "greedy_probe" in first and "greedy_probe" in again:
        out["greedy_probe_equal_where_both_record"] = _common(first["greedy_probe"], again["greedy_probe"])[0]
    return out


def held_out_acceptance(record: dict) -> float:
    """The mean over releases of the held-out acceptance length a drafter train record reports."""
    ev = record.get("evaluation") or {}
    vals = [v["all_prompts"]["mean_acceptance_length"] for k, v in sorted(ev.items())
            if k.startswith("vllm-") and isinstance(v, dict) and "all_prompts" in v]
    if not vals:
        raise ValueError("the drafter train record has no evaluation.vllm-*.all_prompts")
    return sum(vals) / len(vals)


def better(new: dict, old: dict) -> dict:
    """Should the new drafter replace the old? Only for the same target and no lower acceptance."""
    a_new, a_old = held_out_acceptance(new), held_out_acceptance(old)
    same_target = new.get("target_sha256") == old.get("target_sha256")
    return {"new": new.get("drafter_sha256"), "old": old.get("drafter_sha256"),
            "acceptance_new": round(a_new, 4), "acceptance_old": round(a_old, 4),
            "same_target": same_target, "replace": bool(not same_target or a_new >= a_old)}


def sweep_plan(text: str, gpus: int) -> list[str]:
    """DRAFTER_SWEEP's recipes as drafter-sweep launches them, each checked as train_drafter.py
    would check it (unknown fields and out-of-range values are refused here, not on the GPU)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
    import train_drafter

    try:
        recipes = json.loads(text)
    except json.JSONDecodeError as e:
        raise SystemExit(f"DRAFTER_SWEEP is not JSON: {e}") from None
    if not isinstance(recipes, list) or not recipes or not all(isinstance(r, dict) for r in recipes):
        raise SystemExit("DRAFTER_SWEEP: a non-empty JSON list of DrafterTrainConfig overrides (objects)")
    if len(recipes) > gpus:
        raise SystemExit(f"DRAFTER_SWEEP has {len(recipes)} recipes and this machine {gpus} GPUs: one a GPU")
    lines = []
    for slot, recipe in enumerate(recipes):
        try:
            cfg = train_drafter.config_from(None, recipe)
        except SystemExit as e:
            raise SystemExit(f"DRAFTER_SWEEP recipe {slot}: {e}") from None
        lines.append(f"{slot}\t{int(cfg.extra_fraction > 0)}\t{json.dumps(recipe, separators=(',', ':'))}")
    return lines


def probe_gate(record: dict) -> int:
    """0 when the target's greedy probe passes the gate as it stands (gate.failures), else 3 with
    the reasons: a drafter is worth training only for a target whose references can be proof."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
    import gate

    why = gate.failures(record.get("greedy_probe"))
    print(f"target {record.get('target_sha256', '?')[:12]}: " + ("greedy probe passes the gate" if not why
                                                                   else "greedy probe fails the gate: " + "; ".join(why)))
    return 0 if not why else 3


def choose_polish(records: dict[str, dict]) -> str | None:
    """Which second polish to keep, by the rule train_target.POLISH_LONG's comment fixed before
    either ran: among the records (by recipe name) whose greedy probe passes the gate, the one
    whose last validation probe loops least; a tie keeps "long". None when none passes."""
    import gate  # (on sys.path through gpu_paths, imported above)

    def loops(record: dict) -> int:
        probes = (record.get("sequence_phase") or {}).get("validation_probes") or []
        return probes[-1]["looping_sequences"] if probes else 10 ** 9

    sources = {(rec.get("polished_from") or {}).get("target_sha256") for rec in records.values()}
    watched = {json.dumps([(rec.get("train_config") or {}).get(k) for k in ("validation_count", "validation_lengths")])
               for rec in records.values()}
    if len(sources) > 1 or len(watched) > 1:
        raise ValueError("the polishes compared must start from one target and be watched on the same prompts")
    passing = [name for name, rec in records.items() if not gate.failures(rec.get("greedy_probe"))]
    return min(passing, key=lambda name: (loops(records[name]), name != "long"), default=None)


def polished_by(record: dict, name: str) -> bool:
    """Whether a train record is the named polish's (train_target.POLISH_RECIPES) as it stands: its
    recorded recipe, and every setting of the recipe in its train_config (no override beside it)."""
    import train_target

    recipe = train_target.POLISH_RECIPES.get(name)
    if recipe is None:
        return False
    want = json.loads(json.dumps(recipe))
    config = record.get("train_config") or {}
    return (record.get("polished_from") or {}).get("recipe") == want and all(config.get(k) == v for k, v in want.items())


def _field(path: Path, key: str):
    """``key`` of the JSON object in ``path`` (``a.b``: b inside a); None where the file is
    missing or not JSON, or the key is not there."""
    try:
        value = json.loads(path.read_text())
        for part in key.split("."):
            value = value.get(part)
        return value
    except (OSError, ValueError, AttributeError):
        return None


def identity(trained: Path) -> int:
    """0 when the checkpoint in ``trained`` hashes to the target_sha256 its train record names."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
    import train_target

    want = _field(trained / "train-record.json", "target_sha256")
    got = train_target.checkpoint_sha256(trained)
    if want != got:
        print(f"trained target on disk ({got}) is not its record's ({want})", file=sys.stderr)
        return 1
    print(f"trained target {got} (matches its train record)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("manifest")
    m.add_argument("pack", type=Path)
    m.add_argument("record", type=Path)
    m.add_argument("--stem", default=STEM, choices=[STEM, DRAFTER_STEM])
    c = sub.add_parser("collect")
    c.add_argument("files_at", type=Path)
    c.add_argument("--stage", type=Path, default=Path(".stage"))
    c.add_argument("--stem", default=STEM, choices=[STEM, DRAFTER_STEM])
    r = sub.add_parser("repeat")
    r.add_argument("first", type=Path)
    r.add_argument("again", type=Path)
    b = sub.add_parser("better")
    b.add_argument("new", type=Path)
    b.add_argument("old", type=Path)
    w = sub.add_parser("sweep-plan")
    w.add_argument("--gpus", type=int, required=True)
    g = sub.add_parser("gate", help="exit 0 when a target's train record passes the gate (its greedy probe)")
    g.add_argument("record", type=Path)
    h = sub.add_parser("has", help="exit 0 when RECORD is a JSON object whose KEY is truthy")
    h.add_argument("record", type=Path)
    h.add_argument("key")
    s = sub.add_parser("same", help="exit 0 when records A and B hold the same KEY, and it is set")
    s.add_argument("a", type=Path)
    s.add_argument("b", type=Path)
    s.add_argument("key")
    i = sub.add_parser("identity", help="exit 0 when a trained checkpoint is the one its train record names")
    i.add_argument("trained", type=Path)
    cp = sub.add_parser("choose-polish", help="which second polish to keep (choose_polish): its RECIPE=RECORD "
                                              "printed, exit 0; exit 3 when none passes the gate")
    cp.add_argument("records", nargs="+", metavar="RECIPE=RECORD")
    pb = sub.add_parser("polished-by", help="exit 0 when RECORD is the named polish's (polished_by)")
    pb.add_argument("record", type=Path)
    pb.add_argument("recipe")
    args = parser.parse_args(argv)
    if args.cmd == "polished-by":
        try:
            record = json.loads(args.record.read_text())
        except (OSError, ValueError):
            return 1
        return 0 if isinstance(record, dict) and polished_by(record, args.recipe) else 1
    if args.cmd == "choose-polish":
        pairs = [arg.split("=", 1) for arg in args.records]
        if any(len(p) != 2 for p in pairs) or len({p[0] for p in pairs}) != len(pairs):
            print("choose-polish: RECIPE=RECORD, each recipe once", file=sys.stderr)
            return 2
        paths = dict(pairs)
        records = {name: json.loads(Path(path).read_text()) for name, path in paths.items()}
        for name, rec in records.items():  # each record was made by the recipe it is named for
            if not polished_by(rec, name):
                print(f"{paths[name]}: not a record of the {name!r} polish", file=sys.stderr)
                return 2
        try:
            chosen = choose_polish(records)
        except ValueError as exc:
            print(f"choose-polish: {exc}", file=sys.stderr)
            return 2
        print(f"{chosen}={paths[chosen]}" if chosen else "no second polish passes the gate")
        return 0 if chosen else 3
    if args.cmd == "has":
        return 0 if _field(args.record, args.key) else 1
    if args.cmd == "same":
        a = _field(args.a, args.key)
        return 0 if a is not None and a == _field(args.b, args.key) else 1
    if args.cmd == "identity":
        return identity(args.trained)
    if args.cmd == "gate":
        return probe_gate(json.loads(args.record.read_text()))
    if args.cmd == "manifest":
        man = write_manifest(args.pack, json.loads(args.record.read_text()), args.stem)
        print(f"{len(man['parts'])} parts, {man['bytes'] / 2**20:.0f} MiB, target {man['target_sha256'][:12]}")
    elif args.cmd == "collect":
        collect(args.files_at, args.stage, args.stem)
    elif args.cmd == "sweep-plan":
        print("\n".join(sweep_plan(os.environ.get("DRAFTER_SWEEP", ""), args.gpus)))
    elif args.cmd == "better":
        verdict = better(json.loads(args.new.read_text()), json.loads(args.old.read_text()))
        print(json.dumps(verdict))
        return 0 if verdict["replace"] else 1
    else:
        print(json.dumps(repeat(json.loads(args.first.read_text()), json.loads(args.again.read_text())), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
