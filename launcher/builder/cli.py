"""``launcher build plan|preflight|wheels``: wheels for sm_120 / sm_121 from one targets file.

No command prompts: the docker images run ``build wheels`` in their build
stages, so every choice is an option with a safe default.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from launcher.errors import LauncherError

app = typer.Typer(no_args_is_help=True, help="Plan, preflight and build wheels for sm_120 / sm_121.")

_TARGET = typer.Option(..., "--target", "-t", help="linux-amd64 | linux-arm64 | wsl | windows-amd64")
_VERSION = typer.Option(None, "--vllm-version", help="vLLM release to build (default: the pinned base, 0.21.0)")


@app.command("targets")
def targets_cmd() -> None:
    """List the build targets."""
    from launcher.builder.targets import load

    data = load()
    for name, t in data.targets.items():
        typer.echo(f"{name:<14} {t.description}  [TORCH_CUDA_ARCH_LIST={t.torch_cuda_arch_list}]")
    others = [v for v in data.vllm_versions if v != data.default_vllm_version]
    typer.echo(f"vLLM versions: {data.default_vllm_version} (the default)" + "".join(f", {v}" for v in others))


@app.command("plan")
def plan_cmd(
    target: str = _TARGET,
    vllm_version: Optional[str] = _VERSION,
    source: Optional[str] = typer.Option(None, "--source", help="'pypi' (default) or a vLLM checkout to patch in place"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="where sources and logs go"),
    output_dir: Optional[Path] = typer.Option(None, "--output-dir", "-o", help="where wheels and the manifest go (default ./dist)"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="override MAX_JOBS"),
    cores: Optional[int] = typer.Option(None, "--cores", min=1, help="plan for this many cores instead of this host's"),
    mem_gb: Optional[int] = typer.Option(None, "--mem-gb", min=1, help="plan for this much RAM instead of this host's"),
    as_json: bool = typer.Option(False, "--json", help="print the plan as JSON"),
) -> None:
    """Print the whole build plan (versions, arch lists, env, jobs, caches, steps, outputs). Works on any host."""
    from launcher.builder.plan import plan

    p = plan(target, vllm_version, source=source, work_dir=work_dir, output_dir=output_dir,
             cores=cores, mem_gb=mem_gb, jobs=jobs)
    if as_json:
        typer.echo(json.dumps(p.to_dict(), indent=2))
    else:
        typer.echo("\n".join(p.lines()))


@app.command("preflight")
def preflight_cmd(
    target: str = _TARGET,
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
) -> None:
    """Compile a probe kernel for every arch of the target with the found nvcc and check the binary."""
    from launcher.builder import preflight
    from launcher.builder.targets import load

    data = load()
    _windows_toolchain(data.target(target))
    result = preflight.run(data.target(target), data)
    if as_json:
        typer.echo(json.dumps({
            "target": result.target,
            "ok": result.ok,
            "nvcc": result.nvcc.version_text if result.nvcc else None,
            "probes": [{"code": p.code, "ok": p.ok, "found": list(p.found), "detail": p.detail} for p in result.probes],
            "reasons": [{"area": r.area, "message": r.message, "blocking": r.blocking, "hint": r.hint}
                        for r in result.reasons],
        }, indent=2))
    else:
        typer.echo("\n".join(result.lines()))
    if not result.ok:
        raise typer.Exit(1)


def _windows_toolchain(target) -> None:
    """On Windows, an MSVC target loads vcvars64's environment here (build.ps1 only starts the launcher)."""
    if target.host_compiler == "msvc" and os.name == "nt":
        from launcher.builder import msvc

        msvc.prepare(os.environ, typer.echo)


@app.command("wheels")
def wheels_cmd(
    target: str = _TARGET,
    vllm_version: Optional[str] = _VERSION,
    source: Optional[str] = typer.Option(None, "--source", help="'pypi' (default) or a vLLM checkout to patch in place"),
    work_dir: Optional[Path] = typer.Option(None, "--work-dir", help="where sources and logs go (default: the cache)"),
    output_dir: Path = typer.Option(Path("dist"), "--output-dir", "-o", help="where wheels and the manifest go"),
    jobs: Optional[int] = typer.Option(None, "--jobs", min=1, help="override MAX_JOBS"),
    stop_before_compile: bool = typer.Option(
        False, "--stop-before-compile", help="prepare the patched tree, env and commands, then stop"),
    skip_preflight: bool = typer.Option(False, "--skip-preflight", help="do not run the nvcc probe first"),
    only: Optional[str] = typer.Option(
        None, "--only", help="build one part: 'flashinfer' (its three wheels) or 'vllm' (image stages build them apart)"),
) -> None:
    """Fetch the sdist, apply the series, build FlashInfer's three wheels and vLLM; write a manifest."""
    from launcher.builder import preflight, wheels
    from launcher.builder.plan import plan, select_steps
    from launcher.builder.targets import load

    data = load()
    p = plan(target, vllm_version, source=source, work_dir=work_dir, output_dir=output_dir, jobs=jobs, data=data)
    p.steps = select_steps(p.steps, only)
    typer.echo("\n".join(p.lines()))
    _windows_toolchain(p.target)
    pre = None
    if not skip_preflight:
        pre = preflight.run(p.target, data)
        typer.echo("\n".join(pre.lines()))
        if not pre.ok:
            first = next(r for r in pre.reasons if r.blocking)
            raise LauncherError(f"preflight failed: {first.message}", hint=first.hint)
    wheels.build(p, preflight=pre, stop_before_compile=stop_before_compile, echo=typer.echo)


@app.command("proof")
def proof_cmd(
    target: str = _TARGET,
    vllm_version: Optional[str] = _VERSION,
    root: Optional[Path] = typer.Option(
        None, "--root", help="build venv, work trees and source copies (default ~/.cache/vllm-sm12x-build)"),
    sources: Optional[Path] = typer.Option(
        None, "--sources", help="local copies of what vLLM's configure fetches from GitHub (default <root>/sources)"),
    results_dir: Path = typer.Option(Path("build/results"), "--results-dir", help="where the result JSON goes"),
    flashinfer: bool = typer.Option(True, "--flashinfer/--no-flashinfer", help="also compile one FlashInfer family"),
) -> None:
    """Configure vLLM for real and compile the sm_12x objects the recipe runs; check their codes with cuobjdump."""
    from launcher.builder import proof

    base = root or proof.default_root()
    opts = proof.ProofRun(target=target, vllm_version=vllm_version, root=base, sources=sources or base / "sources",
                          results_dir=results_dir, flashinfer=flashinfer)
    proof.run(opts, typer.echo)
