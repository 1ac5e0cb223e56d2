"""The drift watch: do the series still fit the vLLM releases people run?

Checked releases: the newest vLLM on PyPI, the vLLM inside each NVIDIA NGC
vLLM container tag (from a tag list the caller fetched: the NGC registry is
not reachable from every machine, the scheduled CI job fetches it), and any
release named on the command line. Each release is checked, wheel and sdist
from PyPI, against its own series or, when it has none, against the nearest
release's series, so the report says per patch whether that fix is now
upstream, still applies, or conflicts.

"Already upstream" means the patched text is in the release. A fix that
landed upstream in another form shows as a conflict: the report then says
which hunk no longer matches, and a person reads the release's code (as the
series' NOTES.md do) to tell a fix that landed from one that needs porting.

NGC builds vLLM itself; the PyPI release of the same version stands in for
it here, which is right for the Python files the runtime patches touch as
long as NVIDIA carries no patches of its own there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from launcher.errors import LauncherError
from launcher.patching.engine import CheckRow, check_against
from launcher.patching.series import available_versions
from launcher.vllm_compat import nearest_release, parse_version

# NGC vLLM container tag -> the vLLM release inside it (NGC release notes).
# A tag newer than the newest entry is reported until someone adds it here.
NGC_VLLM: dict[str, str] = {
    "26.08-py3": "0.27.1",
    "26.09-py3": "0.29.0",
    "26.10-py3": "0.31.0",
}
_NGC_TAG = re.compile(r"^(\d{2})\.(\d{2})-py3$")


@dataclass
class ReleaseCheck:
    """One vLLM release against the series that fits it best."""

    version: str
    sources: list[str]
    series: str = ""
    own_series: bool = False
    rows: list[CheckRow] = field(default_factory=list)
    error: str = ""

    @property
    def verdict(self) -> str:
        results = {r.result for r in self.rows}
        if self.error:
            return "error"
        if not self.own_series:
            return "no series"
        if "conflicts" in results:
            return "conflicts"
        if "already upstream" in results:
            return "upstream"
        return "ok"

    def to_dict(self) -> dict:
        return {"version": self.version, "sources": self.sources, "series": self.series,
                "own_series": self.own_series, "verdict": self.verdict, "error": self.error,
                "rows": [r.to_dict() for r in self.rows]}


@dataclass
class NgcTag:
    tag: str
    vllm: str | None
    note: str = ""

    def to_dict(self) -> dict:
        return {"tag": self.tag, "vllm": self.vllm, "note": self.note}


@dataclass
class DriftReport:
    series_versions: list[str]
    releases: list[ReleaseCheck]
    ngc: list[NgcTag]
    ngc_given: bool

    @property
    def needs_attention(self) -> bool:
        return any(r.verdict != "ok" for r in self.releases) or any(t.vllm is None for t in self.ngc)

    def to_dict(self) -> dict:
        return {"series": self.series_versions, "needs_attention": self.needs_attention,
                "releases": [r.to_dict() for r in self.releases],
                "ngc": [t.to_dict() for t in self.ngc] if self.ngc_given else None}


def parse_ngc_tags(text: str) -> list[str]:
    """Tags from a registry ``tags/list`` answer (``{"tags": [...]}``), a JSON
    list, or one tag a line; only NGC's monthly ``YY.MM-py3`` tags are kept."""
    stripped = text.strip()
    if stripped.startswith(("{", "[")):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise LauncherError(f"the NGC tag list is not valid JSON: {exc}") from exc
        tags = data.get("tags") if isinstance(data, dict) else data
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise LauncherError('the NGC tag list must be {"tags": [...]} or a JSON list of strings')
    else:
        tags = [line.strip() for line in stripped.splitlines() if line.strip()]
    return sorted({t for t in tags if _NGC_TAG.match(t)}, key=_tag_key)


def _tag_key(tag: str) -> tuple[int, int]:
    m = _NGC_TAG.match(tag)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def map_ngc_tags(tags: list[str]) -> list[NgcTag]:
    """Known tags with their vLLM; tags newer than the table flagged; older ones left out."""
    oldest = min(map(_tag_key, NGC_VLLM))
    newest = max(map(_tag_key, NGC_VLLM))
    out = []
    for tag in tags:
        if tag in NGC_VLLM:
            out.append(NgcTag(tag, NGC_VLLM[tag]))
        elif _tag_key(tag) > newest:
            out.append(NgcTag(tag, None, "vLLM version unknown: read it off the NGC release notes and add "
                                         "the tag to NGC_VLLM in launcher/patching/drift.py"))
        elif _tag_key(tag) > oldest:
            out.append(NgcTag(tag, None, "a tag between known ones that NGC_VLLM lacks"))
    return out


def check_release(version: str, sources: list[str], patches_root=None) -> ReleaseCheck:
    """``version`` against its own series, else the nearest release's series."""
    have = available_versions(patches_root)
    if not have:
        raise LauncherError("there is no patch series to check")
    public = str(parse_version(version))
    own = public in {str(parse_version(v)) for v in have}
    series = public if own else nearest_release(public, have)
    check = ReleaseCheck(public, sources, series, own)
    try:
        check.rows = check_against(f"vllm=={public}", series_version=series, patches_root=patches_root)
    except LauncherError as exc:  # e.g. PyPI has no sdist: one release's failure is a finding
        check.error = exc.message
    return check


def watch(releases: list[str], *, newest: str | None = None, ngc_tags: list[str] | None = None,
          patches_root=None) -> DriftReport:
    """Check the newest PyPI release, the NGC tags' releases and ``releases``."""
    wanted: dict[str, list[str]] = {}
    if newest:
        wanted.setdefault(str(parse_version(newest)), []).append("PyPI newest")
    ngc = map_ngc_tags(ngc_tags) if ngc_tags is not None else []
    for tag in ngc:
        if tag.vllm:
            wanted.setdefault(str(parse_version(tag.vllm)), []).append(f"NGC {tag.tag}")
    for version in releases:
        wanted.setdefault(str(parse_version(version)), []).append("asked for")
    ordered = sorted(wanted, key=parse_version)
    checks = [check_release(v, wanted[v], patches_root) for v in ordered]
    return DriftReport(available_versions(patches_root), checks, ngc, ngc_tags is not None)


def read_tag_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LauncherError(f"cannot read the NGC tag list {path}: {exc.strerror or exc}") from exc
    return parse_ngc_tags(text)


def format_report(report: DriftReport) -> list[str]:
    """The report as text lines (also the CI job's step summary)."""
    lines = [f"series: {', '.join(report.series_versions)}"]
    for check in report.releases:
        against = "its own series" if check.own_series else f"the nearest series, {check.series} (it has none)"
        lines.append(f"vLLM {check.version} [{', '.join(check.sources)}] against {against}: {check.verdict}")
        if check.error:
            lines.append(f"  error: {check.error}")
        for row in check.rows:
            layout = {"site-packages": "wheel", "source": "sdist"}.get(row.layout, row.layout)
            lines.append(f"  {row.patch_id} ({layout}): {row.result}" + (f" - {row.detail}" if row.detail else ""))
    if report.ngc_given:
        lines.append("NGC vLLM tags:" if report.ngc else "NGC vLLM tags: none in the watched range")
        for tag in report.ngc:
            lines.append(f"  {tag.tag}: " + (f"vLLM {tag.vllm}" if tag.vllm else tag.note))
    else:
        lines.append("NGC vLLM tags: not checked (no --ngc-tags)")
    lines.append("needs attention" if report.needs_attention else "all releases fit their series")
    return lines
