"""``launcher patch apply|revert|status|check``: the patch engine from the command line.

Every command works on ``--target DIR`` (site-packages, a vLLM source tree,
or the vllm folder) or, without it, on the vLLM that ``serve`` runs and
``doctor`` checks (:mod:`launcher.vllm_env`: ``--vllm-python`` or
``$VLLM_PYTHON``, else this Python if it has vLLM, else the one behind the
first ``vllm`` on PATH), so the hint ``launcher patch apply`` of a blocked
plan patches the vLLM that plan read.
``--json`` prints the same result for scripts. Errors are LauncherErrors:
one line, non-zero exit, nothing changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from launcher.errors import LauncherError
from launcher.patching import engine

app = typer.Typer(no_args_is_help=True)

TargetOpt = typer.Option(
    None, "--target", help="site-packages, a vLLM source tree, or the vllm folder (default: the installed vLLM)"
)
JsonOpt = typer.Option(False, "--json", help="print the result as JSON")
VllmPythonOpt = typer.Option(
    None, "--vllm-python", envvar="VLLM_PYTHON",
    help="without --target: the python whose vLLM to use (default: as serve finds it: this Python if it "
         "has vLLM, else the one behind `vllm` on PATH)",
)


def _target(target: Path | None, vllm_python: str | None) -> Path:
    """``--target``, else the package folder of the vLLM ``serve`` would run."""
    from launcher import vllm_env

    if target is not None:  # the folder named wins over an interpreter ($VLLM_PYTHON may be set for good)
        return target
    env = vllm_env.resolve(vllm_python)
    if env is None:
        raise LauncherError(
            f"no vLLM found: not in this Python ({sys.executable}) nor behind a `vllm` on PATH",
            hint="pass --vllm-python with the python that has vLLM, or --target DIR "
                 "(install one, patched: launcher install)")
    if not env.has_vllm:
        raise LauncherError(f"no vLLM in {env.python} ({env.source})" + (f": {env.problem}" if env.problem else ""),
                            hint="pass --vllm-python with the python that has vLLM, or --target DIR")
    return Path(env.package_dir)


def _echo_json(data) -> None:
    typer.echo(json.dumps(data, indent=2))


def _print_report(report: engine.Report) -> None:
    typer.echo(f"vLLM {report.version} ({report.tree.layout}) at {report.tree.root}")
    if report.series_version:
        typer.echo(f"series {report.series_version} ({(report.series_hash or '')[:12]})")
    _table(["PATCH", "RESULT", "DETAIL"], [[r.id, r.outcome, r.detail] for r in report.results])
    typer.echo(report.message)


def _table(header: list[str], rows: list[list[str]]) -> None:
    if not rows:
        return
    # The last column (details, hunks) runs free; the others line up.
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths)] + [str(row[-1])]
        typer.echo("  ".join(cells).rstrip())


@app.command("apply")
def apply_cmd(
    target: Path | None = TargetOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="check every hunk and say what would change; write nothing"),
    as_json: bool = JsonOpt,
    vllm_python: str | None = VllmPythonOpt,
) -> None:
    """Apply the series for the tree's vLLM version (all patches or none)."""
    report = engine.apply(_target(target, vllm_python), dry_run=dry_run)
    _echo_json(report.to_dict()) if as_json else _print_report(report)


@app.command("revert")
def revert_cmd(target: Path | None = TargetOpt, as_json: bool = JsonOpt,
               vllm_python: str | None = VllmPythonOpt) -> None:
    """Undo the patches the launcher applied (from the stamp) and remove the stamp."""
    report = engine.revert(_target(target, vllm_python))
    _echo_json(report.to_dict()) if as_json else _print_report(report)


@app.command("status")
def status_cmd(target: Path | None = TargetOpt, as_json: bool = JsonOpt,
               vllm_python: str | None = VllmPythonOpt) -> None:
    """Show, per patch, whether it is applied, not applied, in conflict or modified since.

    Rolls back first what an interrupted apply or revert left. Exits 1 when
    a patch conflicts or the lines an applied patch changed were edited since
    (an edit elsewhere in a patched file leaves the patch applied).
    """
    st = engine.status(_target(target, vllm_python), recover_interrupted=True)
    broken = [p for p in st.patches if p.state in ("conflict", "modified")]
    if as_json:
        _echo_json(st.to_dict())
        if broken:
            raise typer.Exit(1)
        return
    typer.echo(f"vLLM {st.version} ({st.tree.layout}) at {st.tree.root}")
    stamp = "none" if st.stamp is None else f"{st.stamp.get('applied_at', '?')}"
    typer.echo(f"series {st.series_version} ({st.series_hash[:12]}), stamp: {stamp}")
    _table(["PATCH", "KIND", "STATE", "DETAIL"], [[p.id, p.kind, p.state, p.detail] for p in st.patches])
    for note in st.notes:
        typer.echo(f"note: {note}")
    if not st.patches:
        typer.echo("the series is empty")
    if broken:
        typer.echo(f"{len(broken)} patch(es) in conflict or modified since apply: "
                   + ", ".join(f"{p.id} ({p.state})" for p in broken), err=True)
        raise typer.Exit(1)


@app.command("check")
def check_cmd(
    target: Path | None = TargetOpt,
    against: str | None = typer.Option(
        None, "--against", help="vllm==X: check the series against X's wheel and sdist from PyPI (cached)"
    ),
    series: str | None = typer.Option(
        None, "--series", help="with --against: check this release's series instead (for a release that has none)"
    ),
    as_json: bool = JsonOpt,
    vllm_python: str | None = VllmPythonOpt,
) -> None:
    """Read-only drift check: per patch and layout, applies / already upstream / conflicts.

    Exits 1 when any patch conflicts.
    """
    if against and target:
        raise typer.BadParameter("give --target or --against, not both")
    if series and not against:
        raise typer.BadParameter("--series needs --against")
    tree = None if against else _target(target, vllm_python)
    rows = engine.check_against(against, series_version=series) if against else engine.check_tree(tree)
    if as_json:
        _echo_json([r.to_dict() for r in rows])
    else:
        version = rows[0].version if rows else (against or "")
        typer.echo(f"patch check: vLLM {version}" + (f" ({against}, wheel and sdist from PyPI)" if against else "")
                   + (f" at {tree}" if tree else "")
                   + (f", series {series}" if series else ""))
        layout_name = {"site-packages": "wheel", "source": "sdist"} if against else {}
        _table(
            ["PATCH", "LAYOUT", "RESULT", "DETAIL"],
            [[r.patch_id, layout_name.get(r.layout, r.layout), r.result, r.detail] for r in rows],
        )
        counts = {k: sum(1 for r in rows if r.result == k) for k in {r.result for r in rows}}
        typer.echo(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "the series is empty")
    if any(r.result == "conflicts" for r in rows):
        raise typer.Exit(1)


@app.command("drift")
def drift_cmd(
    release: list[str] = typer.Option([], "--release", help="also check this vLLM release (repeatable)"),
    newest: bool = typer.Option(True, "--newest/--no-newest", help="check the newest vLLM release on PyPI"),
    ngc_tags: str | None = typer.Option(
        None, "--ngc-tags", help="file with NGC's nvidia/vllm tag list (registry JSON or one tag a line)"
    ),
    as_json: bool = JsonOpt,
) -> None:
    """Drift watch: the newest vLLM, NGC's vLLM tags and --release against the series.

    Per release and patch: now upstream, still applies, or conflicts; a release
    without a series of its own is checked against the nearest one. Exits 1
    when anything needs attention (a conflict, a patch now upstream, a release
    or NGC tag without a series).
    """
    from launcher import pypi
    from launcher.patching import drift

    tags = drift.read_tag_file(ngc_tags) if ngc_tags else None
    latest = pypi.latest_release("vllm") if newest else None
    if not (latest or tags or release):
        raise typer.BadParameter("nothing to check: give --release, --ngc-tags, or leave --newest on")
    report = drift.watch(release, newest=latest, ngc_tags=tags)
    if as_json:
        _echo_json(report.to_dict())
    else:
        for line in drift.format_report(report):
            typer.echo(line)
    if report.needs_attention:
        raise typer.Exit(1)
