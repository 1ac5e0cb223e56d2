"""The Hugging Face Hub side of ``models pull``, through ``huggingface_hub``.

Online: the revision is resolved and the file list read with a dry run of
``snapshot_download`` (sizes, what is already there), then the files are
downloaded into the folder with ``local_dir`` (the Hub resumes partial files
from its state under ``<folder>/.cache/huggingface`` and draws its own
progress bars). Offline (``--offline`` or ``HF_HUB_OFFLINE=1``): nothing
touches the network; a folder is complete by its marker, else it is filled
from the Hub cache (``$HF_HOME/hub``) if the revision is there.

Auth is the Hub's own: ``HF_TOKEN`` from the environment, else the token
``hf auth login`` stored. The launcher only says which one is in use, never
the token.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.models import folders
from launcher.models.sources import Source
from launcher.paths import inside


def offline_requested(flag: bool) -> bool:
    """``--offline``, or the Hub's own switch in the environment."""
    value = os.environ.get("HF_HUB_OFFLINE", "").strip().lower()
    return flag or value in ("1", "true", "yes", "on")


def _hub(offline: bool):
    # The Hub reads HF_HUB_OFFLINE once, at import: set it first so that no
    # code path inside huggingface_hub can reach the network either.
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import huggingface_hub
    except ImportError:  # pragma: no cover - a declared dependency
        raise LauncherError("huggingface_hub is not installed", hint="pip install 'huggingface_hub>=1.0'") from None
    return huggingface_hub


def endpoint() -> str:
    """The Hub's address as shown to the user: a login inside HF_ENDPOINT is masked."""
    _hub(offline=False)  # a clear error when huggingface_hub is missing
    from huggingface_hub import constants

    from launcher import redact

    return redact.url_credentials(constants.ENDPOINT)


def auth_state() -> str:
    """Where the token comes from, never what it is."""
    if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN"):
        return "HF_TOKEN from the environment"
    _hub(offline=False)
    from huggingface_hub import constants

    token_file = Path(constants.HF_TOKEN_PATH)
    try:
        stored = token_file.is_file() and token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        # e.g. written by `sudo hf auth login`: the Hub library will not read it either
        return f"unreadable token file {token_file} ({getattr(exc, 'strerror', None) or 'not UTF-8'})"
    if stored:
        return "the token stored by `hf auth login`"
    return "none (public repos only)"


@dataclass
class Remote:
    """What the Hub says about a Source: the commit and the files to fetch."""

    commit: str
    files: dict[str, int | None]  # path -> size (None: the Hub did not say)
    to_download: dict[str, int | None]  # the subset not yet complete in the folder


def resolve(src: Source) -> Remote:
    """Resolve the revision and list the files (a dry run: nothing is written)."""
    hub = _hub(offline=False)
    with _hub_errors(src):
        # With local_dir, will_download is judged against the folder itself
        # (the dry run creates only its lock files there).
        infos = hub.snapshot_download(
            src.repo, revision=src.revision, local_dir=src.dest, allow_patterns=src.allow_patterns, dry_run=True,
        )
    if not infos:
        raise LauncherError(
            f"{src.repo}@{src.revision}: no files match {src.allow_patterns}",
            hint="check the recipe's hub.allow_patterns",
        )
    files = {i.filename: i.file_size for i in infos}
    for name in files:
        _inside(src, name)
    # will_download is False for a file already in the Hub cache ($HF_HOME/hub)
    # even when the folder lacks it: the folder itself decides.
    absent = set(folders.incomplete(src.dest, files))
    todo = {i.filename: i.file_size for i in infos if i.will_download or i.filename in absent}
    return Remote(commit=infos[0].commit_hash, files=files, to_download=todo)


def download(src: Source, commit: str) -> None:
    """Fetch the files at ``commit`` into the folder; the Hub resumes partial files."""
    hub = _hub(offline=False)
    src.dest.mkdir(parents=True, exist_ok=True)
    with _hub_errors(src):
        hub.snapshot_download(src.repo, revision=commit, local_dir=src.dest, allow_patterns=src.allow_patterns)


def from_cache(src: Source) -> tuple[str, dict[str, int]] | None:
    """Fill the folder from the Hub cache without the network.

    Returns (commit, files) or None when the cache lacks that revision.
    Files are hard-linked when the cache is on the same filesystem (no
    extra space), copied otherwise: symlinks into the cache would break
    inside a container that mounts only ``$MODELS_DIR``.
    """
    hub = _hub(offline=True)
    from huggingface_hub import errors, utils

    try:
        tree = hub.get_cached_repo_tree(src.repo, revision=src.revision)
        snapshot = Path(hub.snapshot_download(src.repo, revision=src.revision, local_files_only=True,
                                              allow_patterns=src.allow_patterns))
    except (errors.CachedRepoTreeNotFoundError, errors.LocalEntryNotFoundError):
        return None
    except ValueError as exc:  # e.g. a cached file name with a '..' segment
        raise LauncherError(f"{src.repo}@{src.revision} cannot be pulled from the Hub cache: {exc}") from None
    wanted = set(utils.filter_repo_objects([f.path for f in tree], allow_patterns=src.allow_patterns))
    files = {f.path: f.size for f in tree if f.path in wanted}
    targets = {name: _inside(src, name) for name in files}
    if any(not (snapshot / name).is_file() for name in files):
        return None
    src.dest.mkdir(parents=True, exist_ok=True)
    folders.mark_pulling(src.dest, src.repo)
    for name, dest in targets.items():
        _link_or_copy((snapshot / name).resolve(), dest)
    return snapshot.name, files


def _inside(src: Source, name: object) -> Path:
    """A file name from the Hub (or its cache), as a path inside the folder: never ``../`` or absolute."""
    return inside(src.dest, name, f"{src.repo} lists a file that", hint="that repo cannot be pulled into a folder")


def _link_or_copy(blob: Path, dest: Path) -> None:
    """Hard-link ``blob`` to ``dest``, else copy it, through a temporary name of this run's own.

    The temporary name carries the blob's hash: what a killed copy left (its
    pid is gone; the folder's lock keeps any other pull out) is resumed when
    it is part of the same blob, and removed otherwise.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    size = blob.stat().st_size
    if dest.is_file() and not dest.is_symlink() and dest.stat().st_size == size:
        return
    tmp = dest.with_name(f"{dest.name}.{blob.name[:16]}.part-{os.getpid()}")
    _claim_leftover(dest, blob, tmp)
    if not tmp.exists():
        try:
            os.link(blob, tmp)
        except OSError:
            pass
    have = tmp.stat().st_size if tmp.exists() else 0  # a hard link, or a resumed copy, holds these already
    if have < size:  # never opened for writing when complete: a hard link shares the cache's (read-only) blob
        with blob.open("rb") as src, tmp.open("ab") as out:
            src.seek(have)
            shutil.copyfileobj(src, out, 1 << 24)
            out.flush()
            os.fsync(out.fileno())
    tmp.replace(dest)


def _claim_leftover(dest: Path, blob: Path, tmp: Path) -> None:
    """Take over the largest partial copy of ``blob`` that a killed pull left; remove the others."""
    pattern = re.compile(re.escape(dest.name) + r"\.(?:([0-9a-f]{1,16})\.)?part(?:-\d+)?")
    same, other = [], []
    for path in dest.parent.iterdir():
        m = pattern.fullmatch(path.name)
        if m and path != tmp and path.is_file() and not path.is_symlink():
            fits = m.group(1) == blob.name[:16] and path.stat().st_size <= blob.stat().st_size
            (same if fits else other).append(path)
    same.sort(key=lambda p: p.stat().st_size)
    if same:
        same.pop().replace(tmp)
    for path in same + other:
        path.unlink(missing_ok=True)


def _hub_answer(exc: BaseException, errors) -> BaseException:
    """The Hub's HTTP error behind ``exc`` (its cause chain), else ``exc`` itself."""
    seen, cur = set(), exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, errors.HfHubHTTPError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return exc


class _hub_errors:
    """Turn huggingface_hub's exceptions into one LauncherError with a hint."""

    def __init__(self, src: Source):
        self.src = src

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None or isinstance(exc, LauncherError):
            return False
        from huggingface_hub import errors

        where = f"{self.src.repo}@{self.src.revision}"
        # huggingface_hub wraps a refused file request in LocalEntryNotFoundError ("cannot
        # locate the file") when no cached copy exists: the Hub's own answer is its cause.
        exc = _hub_answer(exc, errors)
        if isinstance(exc, errors.GatedRepoError):
            raise LauncherError(f"{where} is gated", hint="accept its terms on the Hub, then set HF_TOKEN or run `hf auth login`") from None
        if isinstance(exc, errors.RevisionNotFoundError):
            raise LauncherError(f"{self.src.repo} has no revision {self.src.revision!r}",
                                hint="check the recipe's hub.revision or --revision") from None
        if isinstance(exc, errors.RepositoryNotFoundError):
            raise LauncherError(f"{self.src.repo} was not found on {endpoint()}",
                                hint="check the repo id; a private repo needs HF_TOKEN or `hf auth login`") from None
        if isinstance(exc, errors.HfHubHTTPError):
            status = getattr(getattr(exc, "response", None), "status_code", "?")
            if status in (401, 403):  # a gated repo whose terms are not accepted, or a token without access
                raise LauncherError(f"the Hub refused access to {where} (HTTP {status}): the repo is gated or private",
                                    hint="accept its terms on the repo's Hub page, then set HF_TOKEN or run "
                                         "`hf auth login` with an account that has access") from None
            raise LauncherError(f"the Hub answered HTTP {status} for {where}",
                                hint="run the same command again: finished files are kept and partial ones resume") from None
        if isinstance(exc, (errors.LocalEntryNotFoundError, ConnectionError)) or type(exc).__module__.startswith("httpx"):
            raise LauncherError(f"cannot reach the Hub at {endpoint()} for {where} ({type(exc).__name__})",
                                hint="check the network (or HF_ENDPOINT), or pull offline from a filled cache with --offline") from None
        if isinstance(exc, ValueError):  # e.g. a listed file name with a '..' segment
            raise LauncherError(f"{where} cannot be pulled: {exc}",
                                hint="the repo's file list is unusable; ask its owner, or pull another revision") from None
        if isinstance(exc, OSError):
            raise LauncherError(f"writing {where} into {self.src.dest} failed: {exc.strerror or exc}",
                                hint="check free space and permissions there; the same command resumes") from None
        return False
