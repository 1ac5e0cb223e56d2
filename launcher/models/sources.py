"""What a recipe asks ``models pull`` to fetch, and where it goes.

The folder is ``$MODELS_DIR/<name>``, the path ``serve`` already uses for
the recipe's target and drafter (``launcher.plan.assemble``), so a pull and a
serve agree without the user passing --model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import LauncherError
from launcher.recipe import COMMIT, Recipe


@dataclass(frozen=True)
class Source:
    """One model to fetch: a repo at a revision into a folder.

    ``revision_note`` says why this revision: pinned by the recipe, a branch
    the recipe marks unverified (resolved at pull time), or ``--revision``.
    """

    role: str  # "target" | "drafter"
    name: str
    repo: str
    revision: str
    revision_note: str
    dest: Path
    allow_patterns: list[str]
    approx_size_bytes: int | None = None
    expected_format: str | None = None
    evidence: list[str] = field(default_factory=list)

    @property
    def pinned(self) -> bool:
        return bool(COMMIT.match(self.revision))


def sources_for(
    rec: Recipe,
    models_dir: Path,
    *,
    target_revision: str | None = None,
    drafter_revision: str | None = None,
    only: str | None = None,
) -> list[Source]:
    """The recipe's target and drafter as Sources (``only``: "target" or "drafter")."""
    wanted = []
    if only in (None, "target"):
        wanted.append(("target", rec.target, target_revision, rec.target.format))
    if only in (None, "drafter"):
        if rec.drafter is None:
            if only == "drafter":
                raise LauncherError(f"recipe {rec.name} has no drafter")
        else:
            wanted.append(("drafter", rec.drafter, drafter_revision, None))
    if drafter_revision and (rec.drafter is None or only == "target"):
        raise LauncherError("--drafter-revision given but no drafter is fetched")
    if target_revision and only == "drafter":
        raise LauncherError("--revision is the target's; for the drafter use --drafter-revision")
    out = []
    for role, ref, override, fmt in wanted:
        hub = ref.hub
        if hub is None:
            raise LauncherError(
                f"recipe {rec.name}: the {role} {ref.name} has no hub source to download",
                hint=_no_hub_hint(role, ref.source, fmt, models_dir / ref.name),
            )
        if override:
            revision, note = override, "--revision" if role == "target" else "--drafter-revision"
        elif hub.pinned:
            revision, note = hub.revision, "pinned by the recipe"
        else:
            revision, note = hub.revision, "branch named by the recipe, UNVERIFIED: resolved at pull time"
        out.append(
            Source(
                role=role, name=ref.name, repo=hub.repo, revision=revision, revision_note=note,
                dest=models_dir / ref.name, allow_patterns=list(hub.allow_patterns),
                approx_size_bytes=hub.approx_size_bytes, expected_format=fmt, evidence=list(hub.evidence),
            )
        )
    return out


def _no_hub_hint(role: str, source: str | None, fmt: str | None, dest: Path) -> str:
    """What to do about a model the recipe names but pins no download for. Only a quantized
    target is made by `launcher quantize`; a bf16 model or a drafter is fetched as published."""
    flag = "--model" if role == "target" else "--drafter"
    origin = (source or "").split(" (", 1)[0] or None
    if role == "target" and fmt and fmt != "bf16":
        how = f"quantize {origin or 'its bf16 checkpoint'} with `launcher quantize`"
    elif origin:
        how = f"download {origin} from the Hugging Face hub"
    else:
        how = "fetch it by hand"
    return f"{how} into {dest}, or pass {flag} to serve"


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unknown"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1000
    return f"{n} B"  # pragma: no cover
