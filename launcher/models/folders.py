"""The state of one ``$MODELS_DIR/<name>`` folder.

A pull leaves ``.launcher-source.json`` there: the repo, the commit it got
and every file with its size. That marker is what says a folder is complete
(offline, with no Hub to ask), whose it is (a pull never writes into a folder
that holds something else, e.g. a ``launcher quantize`` output), and which
commit ``models list`` shows.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launcher import checkpoint, dirlock
from launcher.dirlock import DirLock
from launcher.errors import LauncherError

MARKER = ".launcher-source.json"
#: Written before an offline pull fills the folder, removed with the marker's write: a killed
#: fill leaves a folder the next pull knows as its own (and resumes), not a stranger's.
PULLING = ".launcher-pulling.json"
# huggingface_hub keeps its resume state and tree listing here inside a local_dir.
HUB_STATE = Path(".cache") / "huggingface"


@dataclass
class Marker:
    repo: str
    revision: str  # as asked for (commit or branch)
    commit: str
    files: dict[str, int | None]  # repo path -> size in bytes (None: not known)
    pulled_at: str = ""
    repaired: str | None = None  # what `models pull` changed after download, if anything

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=2, sort_keys=True) + "\n"


def read_marker(folder: Path) -> Marker | None:
    path = folder / MARKER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Marker(**{k: data[k] for k in ("repo", "revision", "commit", "files")},
                      pulled_at=data.get("pulled_at", ""), repaired=data.get("repaired"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        raise LauncherError(f"{path} is unreadable ({exc})", hint="delete it and pull again") from None


def write_marker(folder: Path, marker: Marker) -> None:
    marker.pulled_at = marker.pulled_at or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = folder / (MARKER + ".tmp")
    tmp.write_text(marker.to_json(), encoding="utf-8")
    tmp.replace(folder / MARKER)


def missing_files(folder: Path, files: dict[str, int | None]) -> list[str]:
    """Files absent from ``folder`` or of another size than the Hub listed."""
    out = []
    for name in incomplete(folder, files):
        path = folder / name
        if not path.is_file():
            out.append(f"{name} (absent)")
        else:
            out.append(f"{name} ({path.stat().st_size} of {files[name]} bytes)")
    return out


def incomplete(folder: Path, files: dict[str, int | None]) -> list[str]:
    """The names of :func:`missing_files`, sorted."""
    out = []
    for name, size in sorted(files.items()):
        path = folder / name
        if not path.is_file() or (size is not None and path.stat().st_size != size):
            out.append(name)
    return out


def pulled_here(folder: Path, name: str, size: int | None) -> bool:
    """``name`` (from a marker) is a file a pull wrote inside ``folder``.

    Inside: the path, symlinks resolved, stays under the folder, and is a
    plain file. Written by a pull: the Hub kept its download record for it
    (an online pull), or it still has the size the marker recorded (a pull
    filled from the Hub cache keeps no record).
    """
    root = folder.resolve()
    path = folder / name
    try:
        inside = path.resolve().is_relative_to(root) and path.resolve() != root
    except (OSError, ValueError):
        return False
    if not inside or path.is_symlink() or not path.is_file():
        return False
    if (folder / HUB_STATE / "download" / f"{name}.metadata").is_file():
        return True
    return size is not None and path.stat().st_size == size


def hash_mismatches(folder: Path, names: list[str]) -> list[str]:
    """Files whose sha256 differs from the one the Hub gave when it downloaded them.

    For files the Hub keeps in LFS (the weights) that is their ETag, which
    huggingface_hub records under ``.cache/huggingface/download`` in the
    folder; files without such a record are left to the size checks.
    """
    out = []
    for name in sorted(names):
        expected = _recorded_sha256(folder, name)
        if expected is None or not (folder / name).is_file():
            continue
        digest = hashlib.sha256()
        with (folder / name).open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                digest.update(block)
        if digest.hexdigest() != expected:
            out.append(f"{name} (sha256 {digest.hexdigest()[:12]}, but the Hub's is {expected[:12]})")
    return out


def _recorded_sha256(folder: Path, name: str) -> str | None:
    # huggingface_hub's local_dir record: commit, ETag, timestamp, one a line.
    record = folder / HUB_STATE / "download" / f"{name}.metadata"
    try:
        lines = record.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    etag = lines[1].strip().strip('"') if len(lines) > 1 else ""
    return etag if re.fullmatch(r"[0-9a-f]{64}", etag) else None


def state(folder: Path, repo: str | None = None, revision: str | None = None) -> str:
    """One phrase for ``models list`` and the dry run; names what the folder
    holds when that is not ``repo`` at ``revision`` (what the recipe pins)."""
    if not folder.exists():
        return "absent"
    marker = read_marker(folder) if folder.is_dir() else None
    if marker is None:
        pulling = _pulling_repo(folder) if folder.is_dir() else None
        if pulling is not None:
            return f"an interrupted pull of {pulling}: `launcher models pull` resumes it"
        return "present, not pulled here"
    missing = missing_files(folder, marker.files)
    text = f"{len(missing)} file(s) missing" if missing else "complete"
    if (repo and marker.repo != repo) or (revision and revision not in (marker.commit, marker.revision)):
        text += f", holds {marker.repo}@{marker.commit[:12]}"
    return text


def guard_destination(folder: Path, repo: str) -> None:
    """Refuse to download into a folder that holds another model.

    A folder is ours when it is empty, or carries our marker for the same
    repo, or carries huggingface_hub's local_dir state (an interrupted pull,
    or ``hf download --local-dir``), which the Hub then completes or resumes.
    """
    if not folder.exists():
        return
    if not folder.is_dir():
        raise LauncherError(f"{folder} exists and is not a folder")
    marker = read_marker(folder)
    owner = marker.repo if marker is not None else _pulling_repo(folder)
    if owner is not None:
        if owner != repo:
            raise LauncherError(
                f"{folder} holds {owner}, not {repo}",
                hint="move that folder away, or set MODELS_DIR to another place",
            )
        return
    if (folder / HUB_STATE).is_dir() or not any(folder.iterdir()):
        return
    raise LauncherError(
        f"{folder} already holds files that `launcher models pull` did not put there",
        hint=f"move it away to pull {repo} there, or serve that folder as it is with --model/--drafter",
    )


def mark_pulling(folder: Path, repo: str) -> None:
    """Say, before the first file lands, that a pull of ``repo`` is filling ``folder``."""
    tmp = folder / f"{PULLING}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"repo": repo}) + "\n", encoding="utf-8")
    tmp.replace(folder / PULLING)


def done_pulling(folder: Path) -> None:
    (folder / PULLING).unlink(missing_ok=True)


def _pulling_repo(folder: Path) -> str | None:
    try:
        repo = json.loads((folder / PULLING).read_text(encoding="utf-8")).get("repo")
    except (OSError, ValueError, AttributeError):
        return None
    return repo if isinstance(repo, str) else None


@contextmanager
def locked(folders: list[Path], say: Callable[[str], None]) -> Iterator[None]:
    """One pull per folder at a time: a flock on each (made if absent), waited for as long as it takes.

    Pulls run for minutes to hours, so there is no time limit: Ctrl-C stops the wait.
    """
    held: list[DirLock] = []
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
            if not dirlock.supported:
                continue
            lock = DirLock(folder)
            held.append(lock)
            lock.acquire(float("inf"), lambda f=folder: say(f"waiting for another pull into {f} to finish"))
        yield
    finally:
        for lock in held:
            lock.release()


def unfinished_download(folder: Path) -> str | None:
    """What an interrupted download left, or None.

    The Hub keeps a partial file as ``*.incomplete`` under its state in the
    folder (named by hash, so they are counted, not named) until it is
    complete; a finished ``models pull`` or ``hf download --local-dir``
    leaves none.
    """
    state = folder / HUB_STATE / "download"
    partial = len(list(state.rglob("*.incomplete"))) if state.is_dir() else 0
    if partial:
        return f"{partial} partial file(s)"
    # An offline fill from the Hub cache keeps its partial copies in the folder itself.
    if (folder / PULLING).is_file() and not (folder / MARKER).is_file():
        copies = sum(1 for p in folder.rglob("*.part-*") if p.is_file())
        return f"{copies} partial file(s)" if copies else "no marker yet"
    return None


def remove_if_untouched(folder: Path) -> None:
    """Remove a folder that holds nothing but the Hub's lock/state files.

    The Hub's dry run creates ``<folder>/.cache/huggingface``; a pull that
    then refuses (disk, auth) must leave no trace of a folder it created.
    """
    if folder.is_dir() and all(p.name == ".cache" for p in folder.iterdir()):
        shutil.rmtree(folder)


def repair_global_head_dim(folder: Path) -> str | None:
    """Write ``text_config.global_head_dim`` back into a Gemma 4 config that lacks it.

    vLLM 0.21.x (with transformers <= 5.13) reads only that field and falls
    back to 512; exports made with transformers >= 5.15 keep the value in
    ``per_layer_config`` instead. The value comes from ``per_layer_config``
    of the first full-attention layer, else from that layer's q_proj rows.
    Returns what was changed, or None.
    """
    cfg_path = folder / checkpoint.CONFIG
    config = json.loads(cfg_path.read_text(encoding="utf-8"))
    tc = checkpoint.text_config(config)
    is_gemma4 = str(config.get("model_type") or "").startswith("gemma4")
    full = next((i for i, t in enumerate(tc.get("layer_types") or []) if t == "full_attention"), None)
    if not is_gemma4 or full is None or isinstance(tc.get("global_head_dim"), int):
        return None
    value, source = _full_layer_head_dim(folder, tc, full)
    if value is None:
        return None
    tc["global_head_dim"] = value
    tmp = cfg_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tmp.replace(cfg_path)
    return f"config.json: set text_config.global_head_dim = {value} (from {source}) for vLLM 0.21.x"


def _full_layer_head_dim(folder: Path, tc: dict, layer: int) -> tuple[int | None, str]:
    per_layer = tc.get("per_layer_config")
    if isinstance(per_layer, dict):
        entry = per_layer.get(str(layer)) or per_layer.get(layer)  # type: ignore[call-overload]
        if isinstance(entry, dict) and isinstance(entry.get("head_dim"), int):
            return entry["head_dim"], f"text_config.per_layer_config[{layer}].head_dim"
    try:
        found = checkpoint.weights_head_dim(checkpoint.read_tensor_index(folder), layer, tc.get("num_attention_heads"))
    except (OSError, ValueError, KeyError):
        found = None
    return (found[0], found[1]) if found else (None, "")
