"""The vLLM trees on the GPU host: a series applied, the series a tree carries, a run's meta.

remote.sh keeps each vLLM in a folder of its own ($SITE, $SITE_PATCHED, 0.33.0's beside them) and
asks this module about them, through the launcher's patch engine:

    sites.py apply DEST [--patches-root R]      apply the series (R: another patches root) to DEST
    sites.py stamp SITE [--patches-root R]      the series hash stamped into SITE ("" if none)
    sites.py current SITE [--patches-root R]    exit 0 when SITE carries this checkout's series
    sites.py meta OUT --gpu-file F --command C [--series-hash H] [--series-hash-mm H]
                  [--post-norm-scale S] [--series-label L]
                                                a run's meta (date, GPU, vLLM and torch as
                                                imported, series) as JSON into OUT

A plain apply without --patches-root is what a user runs (`launcher patch apply --target`);
remote.sh uses that command itself for the shipped series.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))


def _root(value: str | None) -> str | None:
    return value or None


def stamp(site: Path, patches_root: str | None = None) -> str:
    """The series hash the patch engine stamped into ``site``; "" when it carries none."""
    from launcher.patching.engine import status

    if not (site / "vllm").is_dir():
        return ""
    return ((status(str(site), patches_root=_root(patches_root)).stamp or {}).get("series_hash")) or ""


def current(site: Path, patches_root: str | None = None) -> bool:
    """True when ``site`` carries the series this checkout holds (a stale tree is rebuilt)."""
    from launcher.patching.engine import status

    if not (site / "vllm").is_dir():
        return False
    s = status(str(site), patches_root=_root(patches_root))
    return bool(s.stamp) and s.stamp.get("series_hash") == s.series_hash


def apply(dest: Path, patches_root: str | None = None) -> list[str]:
    from launcher.patching.engine import apply as engine_apply

    r = engine_apply(str(dest), patches_root=_root(patches_root))
    return [r.message, f"series hash {r.series_hash}", *(f"  {p.outcome} {p.name}" for p in r.results)]


def meta(gpu_file: Path, command: str, **series) -> dict:
    """Date, GPU, and the vLLM and torch this Python imports (PYTHONPATH picks the tree)."""
    import torch
    import vllm

    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "gpu": gpu_file.read_text().strip(), "vllm": vllm.__version__, "torch": torch.__version__,
            **{k: (v or None) for k, v in series.items()}, "command": command}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("apply", "stamp", "current"):
        p = sub.add_parser(name)
        p.add_argument("site", type=Path)
        p.add_argument("--patches-root", default=None)
    m = sub.add_parser("meta")
    m.add_argument("out", type=Path)
    m.add_argument("--gpu-file", type=Path, required=True)
    m.add_argument("--command", required=True)
    m.add_argument("--series-hash")
    m.add_argument("--series-hash-mm")
    m.add_argument("--post-norm-scale")
    m.add_argument("--series-label", help="a record's series field as text (run_modes' results.json)")
    args = parser.parse_args(argv)
    if args.cmd == "stamp":
        print(stamp(args.site, args.patches_root))
    elif args.cmd == "current":
        return 0 if current(args.site, args.patches_root) else 1
    elif args.cmd == "apply":
        print("\n".join(apply(args.site, args.patches_root)))
    else:
        if args.series_label is not None:
            series = {"series": args.series_label}
        else:
            series = {"series_hash": args.series_hash, "series_hash_mm": args.series_hash_mm,
                      "post_norm_scale": args.post_norm_scale}
        args.out.write_text(json.dumps(meta(args.gpu_file, args.command, **series), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
