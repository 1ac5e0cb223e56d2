"""The staged bundles on the GPU host: their parts received, checked and put back together.

stage.py cuts each bundle (vLLM, FA2, packed checkpoints) into parts named in ``<stem>.json``
with a sha256 each and one for the whole. On the GPU host remote.sh copies what is staged into
its bundle folder and asks this module what it holds:

    parts.py receive STAGE DIR     copy the staged manifests and parts into DIR (a part already
                                   there with the same bytes is left alone)
    parts.py held DIR              per manifest in DIR: the parts held; a part whose sha256 fails
                                   is deleted and named
    parts.py missing DIR STEM      the parts of STEM not yet in DIR, one a line (exit 0 either way)
    parts.py incomplete DIR        each bundle in DIR with parts still to copy, as STEM HELD/ALL
                                   (nothing when every one is whole, or DIR holds none)
    parts.py sha DIR STEM          the whole's sha256 as the manifest names it
    parts.py assemble DIR STEM     every part's path in order, once all are there and their bytes
                                   together make the whole's sha256; else exit 1 and say which
    parts.py corpus DIR            the trained target's pinned wheels (corpus.json) are in DIR with
                                   their pinned bytes; else exit 1 and name the first that is not

Parts can arrive a few at a time (a host reached through a size-limited copy), so every command
answers for what is there now and changes nothing it was not asked to.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

PATTERNS = ("bundle*.json", "extras*.json")
CORPUS = Path(__file__).resolve().parents[1] / "corpus.json"


def manifest(folder: Path, stem: str) -> dict:
    path = folder / f"{stem}.json"
    if not path.is_file():
        raise SystemExit(f"no {stem}.json in {folder}: stage it first (tests/gpu/staging/stage.py), then receive")
    return json.loads(path.read_text())


def sha256(path: Path) -> str:
    """A file's sha256, read in blocks (parts are tens of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def receive(stage: Path, folder: Path) -> list[str]:
    """Copy staged manifests and parts into ``folder``; returns the part names copied. A part
    already received with the same bytes stays untouched: a background reader may be reading
    it, and rewriting a file under a reader once failed the whole sha256."""
    folder.mkdir(parents=True, exist_ok=True)
    copied = []
    for path in sorted(p for pattern in PATTERNS for p in stage.glob(pattern)):
        shutil.copyfile(path, folder / path.name)
        for part in sorted(stage.glob(f"{path.stem}.tar*.part*")):
            dest = folder / part.name
            if dest.exists() and dest.stat().st_size == part.stat().st_size and sha256(dest) == sha256(part):
                continue
            shutil.copyfile(part, dest)
            copied.append(part.name)
    return copied


def held(folder: Path) -> list[str]:
    """One line per manifest in ``folder``: the parts held. A part that fails its sha256 is
    deleted (a copy cut short), so the next receive copies it again."""
    lines = []
    for path in sorted(folder.glob("*.json")):
        m = json.loads(path.read_text())
        if "parts" not in m:
            continue
        have = []
        for p in m["parts"]:
            f = folder / p["name"]
            if not f.exists():
                continue
            if sha256(f) == p["sha256"]:
                have.append(p["name"])
            else:
                f.unlink()
                lines.append(f"bad checksum, dropped: {p['name']}")
        lines.append(f"{path.stem} parts held: {len(have)}/{len(m['parts'])} {have}")
    return lines


def missing(folder: Path, stem: str) -> list[str]:
    return [p["name"] for p in manifest(folder, stem)["parts"] if not (folder / p["name"]).exists()]


def incomplete(folder: Path) -> list[str]:
    """``STEM HELD/ALL`` for each bundle manifest in ``folder`` with parts not yet there: a verb
    started now would stop on them (remote.sh's bg refuses to start it detached)."""
    out = []
    for path in sorted(p for pattern in PATTERNS for p in folder.glob(pattern)) if folder.is_dir() else []:
        parts = json.loads(path.read_text()).get("parts") or []
        gone = missing(folder, path.stem) if parts else []
        if gone:
            out.append(f"{path.stem} {len(parts) - len(gone)}/{len(parts)}")
    return out


def assemble(folder: Path, stem: str) -> list[Path]:
    """The parts of ``stem`` in order, once all are present and together make the whole."""
    m = manifest(folder, stem)
    gone = missing(folder, stem)
    if gone:
        raise SystemExit(f"missing {stem} part {gone[0]}: copy it into .stage/ first (receive)")
    paths = [folder / p["name"] for p in m["parts"]]
    whole = hashlib.sha256()
    for path in paths:
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                whole.update(chunk)
    if whole.hexdigest() != m["sha256"]:
        raise SystemExit(f"{stem}: reassembled parts do not match the manifest's sha256")
    return paths


def corpus(folder: Path, pins: Path = CORPUS) -> None:
    """Every wheel corpus.json pins (the corpus and the training wheels) in ``folder``, byte-exact."""
    m = json.loads(pins.read_text())
    for art in m["wheels"] + m["training_wheels"]:
        path = folder / art["file"]
        if not path.is_file() or sha256(path) != art["sha256"]:
            raise SystemExit(f"corpus wheel {art['file']} missing or not the pinned bytes: copy .stage/corpus in")


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = ("usage: parts.py receive STAGE DIR | held DIR | missing DIR STEM | incomplete DIR | sha DIR STEM"
             " | assemble DIR STEM | corpus DIR")
    if not args:
        raise SystemExit(usage)
    cmd, rest = args[0], args[1:]
    arity = {"receive": 2, "held": 1, "missing": 2, "incomplete": 1, "sha": 2, "assemble": 2, "corpus": 1}
    if cmd not in arity or len(rest) != arity[cmd]:
        raise SystemExit(usage)
    if cmd == "receive":
        receive(Path(rest[0]), Path(rest[1]))
        return 0
    if cmd == "corpus":
        corpus(Path(rest[0]))
        return 0
    folder = Path(rest[0])
    if cmd == "held":
        out = held(folder)
    elif cmd == "missing":
        out = missing(folder, rest[1])
    elif cmd == "incomplete":
        out = incomplete(folder)
    elif cmd == "sha":
        out = [manifest(folder, rest[1])["sha256"]]
    else:
        out = [str(p) for p in assemble(folder, rest[1])]
    if out:
        print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
