"""``models pull`` and ``models verify``: fetch a recipe's models, then check them
with the same checkpoint checks that ``serve`` preflight and ``doctor --model`` run."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher import checkpoint
from launcher.errors import LauncherError
from launcher.models import folders, hub
from launcher.models.sources import Source, human_bytes
from launcher.preflight import Reason

Echo = Callable[[str], None]

# Headroom beyond the bytes to download: the Hub writes *.incomplete files
# next to finished ones, and a full disk also stops vLLM's own caches.
_MIN_HEADROOM = 512 * 1024 * 1024


@dataclass
class Outcome:
    src: Source
    commit: str
    files: dict[str, int | None]
    repaired: str | None = None
    reasons: list[Reason] = field(default_factory=list)


def describe(sources: list[Source], echo: Echo) -> None:
    """The dry run: repos, revisions, sizes if known, folders and free space. No network."""
    check_folders(sources)
    total: int | None = 0
    for src in sources:
        echo(f"{src.role:8} {src.repo}")
        echo(f"  revision  {src.revision}  ({src.revision_note})")
        echo(f"  size      {'about ' + human_bytes(src.approx_size_bytes) if src.approx_size_bytes else 'unknown until resolved'}")
        echo(f"  folder    {src.dest}  [{folders.state(src.dest, src.repo, src.revision)}]")
        echo(f"  files     {', '.join(src.allow_patterns)}")
        total = None if total is None or src.approx_size_bytes is None else total + src.approx_size_bytes
    where = _existing_ancestor(sources[0].dest)
    fetch = f"about {human_bytes(total)} to fetch at most" if total else "sizes known once resolved"
    echo(f"disk      {human_bytes(shutil.disk_usage(where).free)} free at {where}; {fetch}")
    echo(f"hub       {hub.endpoint()}  auth: {hub.auth_state()}")


def pull(sources: list[Source], *, offline: bool, echo: Echo) -> list[Outcome]:
    """Fetch (or, offline, find) every source, then record and repair what arrived."""
    check_folders(sources)
    for src in sources:
        folders.guard_destination(src.dest, src.repo)
    created = [src.dest for src in sources if not src.dest.exists()]
    # the missing folders above them too (MODELS_DIR itself on a first pull), deepest first
    parents = sorted({p for d in created for p in d.parents if not p.exists()}, key=lambda p: len(p.parts),
                     reverse=True)
    try:
        with _writing(sources), folders.locked([src.dest for src in sources], echo):
            for src in sources:  # again, now that no other pull writes them
                folders.guard_destination(src.dest, src.repo)
            outcomes = [_pull_offline(src, echo) for src in sources] if offline else _pull_online(sources, echo, created)
            for out in outcomes:
                _finish(out, echo)
    except BaseException:
        for folder in [*created, *parents]:
            _remove_if_empty(folder)
        raise
    return outcomes


class _writing:
    """A write into the folders that fails (a read-only or full disk) is one error naming the folder."""

    def __init__(self, sources: list[Source]):
        self.where = ", ".join(str(src.dest) for src in sources)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if isinstance(exc, OSError):
            raise LauncherError(f"writing {self.where} failed: {exc.strerror or exc}"
                                + (f" ({exc.filename})" if exc.filename else ""),
                                hint="check that MODELS_DIR is writable and has room; the same pull resumes") from None
        return False


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass


def _pull_online(sources: list[Source], echo: Echo, created: list[Path]) -> list[Outcome]:
    echo(f"hub: {hub.endpoint()}  auth: {hub.auth_state()}")
    try:
        remotes = {src.role: _resolve(src, echo) for src in sources}
        _check_disk(sources, remotes)
    except LauncherError:
        for folder in created:
            folders.remove_if_untouched(folder)
        raise
    outcomes = []
    for src in sources:
        remote = remotes[src.role]
        if remote.to_download:
            size = human_bytes(sum(n or 0 for n in remote.to_download.values()))
            echo(f"{src.role}: fetching {len(remote.to_download)} file(s), {size}, into {src.dest}")
            hub.download(src, remote.commit)
        else:
            echo(f"{src.role}: {src.dest} already has every file at {remote.commit[:12]}")
        outcomes.append(Outcome(src, remote.commit, remote.files))
    return outcomes


def _resolve(src: Source, echo: Echo) -> hub.Remote:
    remote = hub.resolve(src)
    if not src.pinned:
        echo(f"{src.role}: {src.repo} revision {src.revision!r} resolved to commit {remote.commit} "
             f"({src.revision_note}); pin it with --revision {remote.commit} to repeat this download")
    elif remote.commit != src.revision:
        raise LauncherError(f"{src.repo}: asked for commit {src.revision} but the Hub answered {remote.commit}")
    return remote


def _check_disk(sources: list[Source], remotes: dict[str, hub.Remote]) -> None:
    """Refuse before the first byte when the files cannot fit (per filesystem)."""
    need: dict[int, tuple[Path, int]] = {}
    for src in sources:
        where = _existing_ancestor(src.dest)
        dev = os.stat(where).st_dev
        prev = need.get(dev, (where, 0))[1]
        need[dev] = (where, prev + sum(n or 0 for n in remotes[src.role].to_download.values()))
    for where, nbytes in need.values():
        if nbytes == 0:
            continue
        free = shutil.disk_usage(where).free
        wanted = nbytes + max(_MIN_HEADROOM, nbytes // 50)
        if free < wanted:
            raise LauncherError(
                f"not enough disk space at {where}: {human_bytes(nbytes)} to download (+ headroom) but {human_bytes(free)} free",
                hint="free some space, or set MODELS_DIR to a larger disk",
            )


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def check_folders(sources: list[Source]) -> None:
    """Each destination can be a folder: the dry run showed a file's disk as free room and
    ``[absent]``, and the pull then failed on "Not a directory"."""
    for src in sources:
        where = _existing_ancestor(src.dest)
        if not where.is_dir():
            raise LauncherError(f"{where} is a file, not a folder: {src.dest} cannot be made there",
                                hint="point MODELS_DIR at a folder (models pull writes each model into a folder under it)")


def _pull_offline(src: Source, echo: Echo) -> Outcome:
    """Complete by marker, else fill from the Hub cache, else say exactly what is missing."""
    marker = folders.read_marker(src.dest) if src.dest.is_dir() else None
    if marker is not None and _same_revision(marker, src.revision):
        missing = folders.missing_files(src.dest, marker.files)
        if not missing:
            echo(f"{src.role}: {src.dest} is complete ({marker.repo}@{marker.commit[:12]}); offline, nothing fetched")
            return Outcome(src, marker.commit, marker.files)
    else:
        missing = []
    cached = hub.from_cache(src)
    if cached is not None:
        commit, files = cached
        echo(f"{src.role}: filled {src.dest} from the Hub cache ({src.repo}@{commit[:12]}); offline, nothing fetched")
        return Outcome(src, commit, files)
    what = f"missing in {src.dest}: {', '.join(missing)}" if missing else f"{src.dest} has no complete pull of it"
    raise LauncherError(
        f"offline: {src.repo}@{src.revision} ({src.role}) is not available: {what}, and the Hub cache "
        f"({_hub_cache()}) has no complete snapshot of that revision",
        hint=f"run the pull with network access (without --offline / HF_HUB_OFFLINE=1)",
    )


def _same_revision(marker: folders.Marker, revision: str) -> bool:
    return revision in (marker.commit, marker.revision)


def _hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _finish(out: Outcome, echo: Echo) -> None:
    """Check every file arrived, record the marker, repair, verify."""
    missing = folders.missing_files(out.src.dest, out.files)
    if missing:
        raise LauncherError(f"{out.src.dest}: incomplete after the download: {', '.join(missing)}",
                            hint="run the same pull again: partial files resume")
    previous = folders.read_marker(out.src.dest)
    if previous is not None:
        # Another revision pulled here before: drop the files it had and this one has not
        # (vLLM would load a stale shard as part of the checkpoint).
        for name in sorted(set(previous.files) - set(out.files)):
            if not folders.pulled_here(out.src.dest, name, previous.files[name]):
                continue  # the marker is only a file: never let it name what to delete
            (out.src.dest / name).unlink()
            echo(f"{out.src.role}: removed {name} (from {previous.commit[:12]}, not in {out.commit[:12]})")
    if out.src.role == "target":
        out.repaired = folders.repair_global_head_dim(out.src.dest)
        if out.repaired:
            echo(f"target: repaired {out.repaired}")
    folders.write_marker(out.src.dest, folders.Marker(
        repo=out.src.repo, revision=out.src.revision, commit=out.commit, files=out.files, repaired=out.repaired))
    folders.done_pulling(out.src.dest)


def verify(outcomes: list[Outcome], vllm_versions: list[str], echo: Echo) -> bool:
    """The checks of ``doctor --model`` / serve preflight, for every vLLM the recipe supports."""
    target = next((o for o in outcomes if o.src.role == "target"), None)
    ok = True
    for version in vllm_versions:
        info = None
        if target is not None:
            info, target.reasons = checkpoint.inspect_target(
                target.src.dest, expected_format=target.src.expected_format, vllm_version=version)
            ok &= _report(target, version, echo, info.summary())
        for out in outcomes:
            if out.src.role == "drafter":
                out.reasons = checkpoint.inspect_drafter(out.src.dest, target=info)
                ok &= _report(out, version, echo, "DFlash drafter" if not out.reasons else "")
    return ok


def _report(out: Outcome, version: str, echo: Echo, summary: str) -> bool:
    blocking = [r for r in out.reasons if r.blocking]
    verdict = "FAILS" if blocking else "ok"
    echo(f"verify {out.src.role} for vLLM {version}: {verdict}" + (f" ({summary})" if summary else ""))
    for reason in out.reasons:
        echo("  " + reason.line())
    return not blocking
