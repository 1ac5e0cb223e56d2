"""``launcher models pull|list|verify|path``.

Only option parsing and printing live here; huggingface_hub is imported by
``launcher.models.hub`` when a command needs it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from launcher.errors import EXIT_PROBLEMS, LauncherError

app = typer.Typer(no_args_is_help=True, help="Fetch, list, verify and locate the models recipes serve.")

_RECIPE = typer.Option("--recipe", "-r", help="Recipe name (launcher recipes list) or a YAML file.")
_ONLY = typer.Option("--only", help="target | drafter (default: both).")


def _sources(recipe: str, only: str | None, revision: str | None = None, drafter_revision: str | None = None):
    from launcher import recipe as recipes
    from launcher.models.sources import sources_for
    from launcher.paths import models_dir

    if only not in (None, "target", "drafter"):
        raise LauncherError(f"--only {only!r}: expected target or drafter")
    rec = recipes.load(recipe)
    return rec, sources_for(rec, models_dir(), target_revision=revision, drafter_revision=drafter_revision, only=only)


@app.command("pull")
def pull_cmd(
    recipe: Annotated[str, _RECIPE],
    only: Annotated[Optional[str], _ONLY] = None,
    revision: Annotated[Optional[str], typer.Option("--revision", help="Fetch the target at this commit/branch instead of the recipe's.")] = None,
    drafter_revision: Annotated[Optional[str], typer.Option("--drafter-revision", help="Fetch the drafter at this commit/branch instead of the recipe's.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print repos, revisions, sizes and folders; fetch nothing (no network).")] = False,
    offline: Annotated[bool, typer.Option("--offline", help="Never touch the network (as HF_HUB_OFFLINE=1): use the folder or the Hub cache.")] = False,
    no_verify: Annotated[bool, typer.Option("--no-verify", help="Skip the checkpoint checks after the download.")] = False,
) -> None:
    """Fetch the recipe's target and drafter into $MODELS_DIR/<name> at pinned revisions.

    Checks free disk first, resumes partial downloads, and verifies the result
    with the checkpoint checks `serve` runs. HF_TOKEN (or `hf auth login`) is
    used for gated repos and never printed.
    """
    from launcher.models import hub, pull

    rec, sources = _sources(recipe, only, revision, drafter_revision)
    if dry_run:
        pull.describe(sources, typer.echo)
        return
    outcomes = pull.pull(sources, offline=hub.offline_requested(offline), echo=typer.echo)
    if no_verify:
        return
    if not pull.verify(outcomes, rec.vllm_versions, typer.echo):
        raise LauncherError("the downloaded files fail the checkpoint checks above",
                            hint=f"see the reasons; `launcher serve --recipe {rec.name} --dry-run` shows the same")
    typer.echo(f"ready: launcher serve --recipe {rec.name}")


@app.command("verify")
def verify_cmd(
    recipe: Annotated[Optional[str], typer.Option("--recipe", "-r", help="Verify this recipe's folders.")] = None,
    model: Annotated[Optional[Path], typer.Option("--model", help="Verify one checkpoint folder instead.")] = None,
    only: Annotated[Optional[str], _ONLY] = None,
) -> None:
    """Check folders are complete (against what the pull recorded) and loadable (checkpoint checks)."""
    from launcher.models import folders, pull

    if (recipe is None) == (model is None):
        raise LauncherError("give exactly one of --recipe or --model")
    if model is not None:
        from launcher import checkpoint, versions

        version = versions.installed("vllm") or "0.21.0"
        info, reasons = checkpoint.inspect_target(model, expected_format=None, vllm_version=version)
        typer.echo(f"{model}: {info.summary()} (checked as vLLM {version} reads it)")
        for r in reasons:
            typer.echo("  " + r.line())
        if any(r.blocking for r in reasons):
            raise typer.Exit(1)
        return
    rec, sources = _sources(recipe, only)
    absent = [src for src in sources if not src.dest.exists()]
    if absent:
        # Nothing to check there: one line each, with the command that fetches it.
        for src in absent:
            typer.echo(f"{src.role}: {src.dest} is not there; fetch it with: "
                       f"launcher models pull --recipe {recipe} --only {src.role}")
        raise typer.Exit(1)
    outcomes = []
    for src in sources:
        marker = folders.read_marker(src.dest) if src.dest.is_dir() else None
        files = marker.files if marker else {}
        missing = folders.missing_files(src.dest, files) if marker else []
        state = f"{marker.repo}@{marker.commit[:12]}" if marker else "not pulled by the launcher: checked as found"
        typer.echo(f"{src.role}: {src.dest}  [{state}]" + (f"  missing: {', '.join(missing)}" if missing else ""))
        if missing:
            raise LauncherError(f"{src.dest} is incomplete", hint=f"launcher models pull --recipe {recipe} --only {src.role}",
                                exit_code=EXIT_PROBLEMS)
        corrupt = folders.hash_mismatches(src.dest, list(files))
        if corrupt:
            raise LauncherError(f"{src.dest}: files differ from what the Hub sent: {', '.join(corrupt)}",
                                hint=f"delete them and run `launcher models pull --recipe {recipe} --only {src.role}`",
                                exit_code=EXIT_PROBLEMS)
        outcomes.append(pull.Outcome(src, marker.commit if marker else "", files))
    if not pull.verify(outcomes, rec.vllm_versions, typer.echo):
        raise typer.Exit(1)


@app.command("list")
def list_cmd() -> None:
    """Every model the shipped recipes use: repo, revision, folder and its state."""
    from launcher import recipe as recipes
    from launcher.models.folders import state as folder_state
    from launcher.models.sources import human_bytes, sources_for
    from launcher.paths import models_dir

    root = models_dir()
    typer.echo(f"MODELS_DIR {root}")
    seen: dict[Path, list[str]] = {}
    rows = {}
    for name, path in recipes.available().items():
        rec = recipes.load_file(path)
        for ref, role in ((rec.target, "target"), (rec.drafter, "drafter")):
            if ref is None:
                continue
            dest = root / ref.name
            seen.setdefault(dest, []).append(name)
            if dest not in rows:
                src = sources_for(rec, root, only=role)[0] if ref.hub else None
                origin = f"{src.repo}@{src.revision[:12]}" if src else \
                    f"(models pull does not fetch it; from {ref.source or 'elsewhere: make it yourself'})"
                size = human_bytes(ref.hub.approx_size_bytes) if ref.hub and ref.hub.approx_size_bytes else "?"
                rows[dest] = (ref.name, origin, size, folder_state(dest, src.repo if src else None, src.revision if src else None))
    for dest, (name, origin, size, state) in rows.items():
        typer.echo(f"{name:34} {size:>9}  {origin}  [{', '.join(seen[dest])}]: {state}")
    others = sorted(p.name for p in root.iterdir() if p.is_dir() and p not in rows) if root.is_dir() else []
    if others:
        typer.echo("other folders: " + ", ".join(others))


@app.command("path")
def path_cmd(
    recipe: Annotated[str, _RECIPE],
    drafter: Annotated[bool, typer.Option("--drafter", help="Print the drafter's folder alone.")] = False,
    target: Annotated[bool, typer.Option("--target", help="Print the target's folder alone.")] = False,
) -> None:
    """Print the folders `serve` uses: the target's, then the drafter's (one a line)."""
    from launcher import recipe as recipes
    from launcher.paths import models_dir

    rec = recipes.load(recipe)
    if drafter and target:
        raise LauncherError("give --target or --drafter, not both", hint="without either, both are printed")
    if drafter and rec.drafter is None:
        raise LauncherError(f"recipe {rec.name} has no drafter")
    refs = [rec.drafter] if drafter else [rec.target] if target else [r for r in (rec.target, rec.drafter) if r]
    for ref in refs:
        typer.echo(str(models_dir() / ref.name))


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="models", help="Fetch (pull), list, verify and locate the models recipes serve.")
