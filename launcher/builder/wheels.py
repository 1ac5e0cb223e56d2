"""Execute a build plan: source tree, series, existing torch, then the compile steps.

Everything up to the compiler is cheap and deterministic (fetch the sdist,
unpack a fresh copy, apply the series, strip the torch pins, check with the
tree's own CMake that the requested archs survive), so it always runs and can
stop there (``--stop-before-compile``) leaving a tree ready to build plus the
exact env and commands. The compile steps log each to ``<work>/logs/`` and
print one progress line per step; nothing prompts, so containers can run it.
"""

from __future__ import annotations

import datetime as _dt
import glob
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from launcher import progress, pypi
from launcher.builder import cmake_archs, toolchain
from launcher.builder.plan import BuildPlan
from launcher.builder.preflight import PreflightResult
from launcher.errors import LauncherError

Echo = Callable[[str], None]
_PIN = re.compile(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)")


@dataclass
class SourceReport:
    tree: Path
    pins: dict[str, str]
    series: dict
    cmake: dict
    torch_stripped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def prepare_source(plan: BuildPlan, echo: Echo) -> SourceReport:
    """A patched source tree ready to compile, in ``plan.work_dir`` (or the given checkout)."""
    tree = _source_tree(plan, echo)
    warnings: list[str] = []
    pins = read_pins(tree)
    _check_pins(plan, pins, warnings)

    echo(f"applying the vLLM {plan.vllm_version} series to {tree}")
    series = _apply_series(tree)
    for r in series["results"]:
        echo(f"  {r['outcome']:<16} {r['id']}")

    cmake = _check_archs(plan, tree, warnings, echo)

    stripped = use_existing_torch(tree, plan.pins.use_existing_torch)
    echo(f"use_existing_torch: removed {len(stripped)} torch pin line(s)")
    return SourceReport(tree, pins, series, cmake, stripped, warnings)


def _source_tree(plan: BuildPlan, echo: Echo) -> Path:
    if plan.source == "checkout":
        raise LauncherError(
            f"the {plan.target.name} target builds from a checkout, not the PyPI sdist",
            hint=f"pass --source PATH: {plan.target.source_hint}; or skip the build: "
            "launcher install --wheel <a vllm-windows wheel> (installs it and applies the series)",
        )
    if plan.source != "pypi-sdist":
        tree = Path(plan.source)
        if not (tree / "setup.py").is_file() or not (tree / "CMakeLists.txt").is_file():
            raise LauncherError(f"--source {tree} is not a vLLM source tree (no setup.py + CMakeLists.txt)")
        return tree
    sdist = pypi.fetch("vllm", plan.vllm_version, "sdist")
    dest = plan.work_dir / "src"
    if dest.exists():
        shutil.rmtree(dest)  # a fresh copy each run: the series applies to a pristine tree
    dest.mkdir(parents=True)
    echo(f"unpacking {sdist.name} into {dest}")
    with tarfile.open(sdist) as tf:
        tf.extractall(dest, filter="data")
    tops = [p for p in dest.iterdir() if p.is_dir()]
    if len(tops) != 1:
        raise LauncherError(f"{sdist.name} does not hold exactly one top folder")
    return tops[0]


def read_pins(tree: Path) -> dict[str, str]:
    """``name==version`` pins from requirements/cuda.txt (lower-cased names)."""
    req = tree / "requirements" / "cuda.txt"
    pins = {}
    if req.is_file():
        for line in req.read_text().splitlines():
            m = _PIN.match(line)
            if m:
                pins[m.group(1).lower()] = m.group(2)
    return pins


def _check_pins(plan: BuildPlan, pins: dict[str, str], warnings: list[str]) -> None:
    want = {
        "torch": plan.pins.torch,
        "torchvision": plan.pins.torchvision,
        "torchaudio": plan.pins.torchaudio,
        "flashinfer-python": plan.pins.flashinfer,
    }
    if "flashinfer-cubin" in pins:
        want["flashinfer-cubin"] = plan.pins.flashinfer  # the three FlashInfer wheels share one version
    wrong = [f"{k}: tree pins {pins.get(k, 'nothing')}, build/targets.yaml {v}" for k, v in want.items() if pins.get(k) != v]
    if not wrong:
        return
    if plan.source == "pypi-sdist":
        raise LauncherError(
            f"vLLM {plan.vllm_version}'s requirements/cuda.txt disagrees with build/targets.yaml: " + "; ".join(wrong),
            hint="fix the pins in build/targets.yaml",
        )
    warnings += [f"checkout pin differs ({w})" for w in wrong]


def _apply_series(tree: Path) -> dict:
    from launcher.patching import engine

    report = engine.apply(tree)
    return {
        "version": report.series_version,
        "hash": report.series_hash,
        "results": [{"id": r.id, "outcome": r.outcome, "files": r.files} for r in report.results],
        "stamp": report.stamp_path,
    }


def _check_archs(plan: BuildPlan, tree: Path, warnings: list[str], echo: Echo) -> dict:
    """Run the tree's CMake arch filter: the target's archs must survive it (sm_121 must not become sm_120)."""
    t = plan.target
    if cmake_archs.find_cmake() is None:
        warnings.append("cmake not on PATH yet: the arch-survival check ran on the text only")
        text = (tree / "CMakeLists.txt").read_text()
        if t.requires_build_patch and "12.0;12.1\")" not in text:
            raise LauncherError("the patched CMakeLists.txt still drops 12.1 under CUDA 13")
        return {"checked": "text"}
    got = cmake_archs.resolve(tree, t.torch_cuda_arch_list)
    echo(f"CMake resolves TORCH_CUDA_ARCH_LIST={t.torch_cuda_arch_list} to CUDA_ARCHS={got.cuda_archs}, "
         f"{got.kernel_group}={got.kernel_archs}")
    if (got.cuda_archs, got.kernel_archs) != (t.vllm_cuda_archs, t.kernel_archs):
        raise LauncherError(
            f"vLLM's CMake would build {got.cuda_archs} / {got.kernel_group} {got.kernel_archs} "
            f"instead of {t.vllm_cuda_archs} / {t.kernel_archs} for {t.name}",
            hint="the build patch did not take effect (see patches/vllm/<version>/build/)",
        )
    return {"checked": "cmake", "cuda_archs": got.cuda_archs, "kernel_group": got.kernel_group,
            "kernel_archs": got.kernel_archs}


def use_existing_torch(tree: Path, script_rel: str) -> list[str]:
    """Run the tree's own use_existing_torch.py (``--prefix``, as vLLM's Dockerfile does):
    it edits only text files and needs no torch. Returns the removed lines."""
    script = tree / script_rel
    if not script.is_file():
        found = [p for p in (tree / "use_existing_torch.py", tree / "tools" / "use_existing_torch.py") if p.is_file()]
        if not found:
            raise LauncherError(f"{tree} has no use_existing_torch.py")
        script = found[0]
    proc = subprocess.run([sys.executable, str(script), "--prefix"], cwd=tree, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise LauncherError(f"{script.name} failed: {proc.stderr.strip()[:400]}")
    removed = [line.split(":", 1)[1].strip() for line in proc.stdout.splitlines() if line.startswith(">>> removed")]
    left = [str(p.relative_to(tree)) for p in (tree / "requirements").rglob("*.txt")
            if re.search(r"^torch\s*==", p.read_text(), re.M)]
    if left:
        raise LauncherError(f"torch is still pinned after {script.name}: {', '.join(left)}")
    return removed


# ------------------------------------------------------------------ steps


def resolve(value: str, places: dict[str, str], dist: Path) -> str:
    def wheel(m: re.Match) -> str:
        hits = sorted(glob.glob(str(dist / f"{m.group(1)}-*.whl")))
        if not hits:
            raise LauncherError(f"no {m.group(1)} wheel in {dist} for the next step")
        return hits[-1]

    value = re.sub(r"\{wheel:([A-Za-z0-9_]+)\}", wheel, value)
    for key, repl in places.items():
        value = value.replace("{" + key + "}", repl)
    return value


def placeholders(plan: BuildPlan, tree: Path) -> dict[str, str]:
    return {
        "python": sys.executable,
        "src": str(tree),
        "work": str(plan.work_dir),
        "flashinfer": str(plan.work_dir / "flashinfer"),
        "dist": str(plan.output_dir.resolve()),
    }


def write_scripts(plan: BuildPlan, tree: Path) -> dict[str, str]:
    """``build-env.sh`` and ``build-steps.sh`` in the work dir: the exact env and commands, runnable by hand."""
    places = placeholders(plan, tree)
    env_file = plan.work_dir / "build-env.sh"
    env_lines = ["# vllm-sm12x build env (generated by launcher build wheels)"]
    env_lines += [f"export {k}={shlex.quote(v)}" for k, v in plan.env.items()]
    env_file.write_text("\n".join(env_lines) + "\n")
    steps_file = plan.work_dir / "build-steps.sh"
    body = ["#!/usr/bin/env bash", "set -euo pipefail", f". {shlex.quote(str(env_file))}"]
    for s in plan.steps:
        # A wheel built by an earlier step stays a glob so the script finds it when it runs.
        argv = " ".join(a if a.endswith("-*.whl") else shlex.quote(a) for a in (resolve_safe(a, places) for a in s.argv))
        body.append(f"# {s.name}" + (f": {s.why}" if s.why else ""))
        # Step-only variables (FlashInfer's arch lists) go on the command, not into the shared env.
        extra = "".join(f"{k}={shlex.quote(plan.flashinfer_env[k])} " for k in s.env)
        body.append(f"(cd {shlex.quote(resolve_safe(s.cwd, places))} && {extra}{argv})")
    steps_file.write_text("\n".join(body) + "\n")
    steps_file.chmod(0o755)
    return {"env": str(env_file), "steps": str(steps_file)}


def resolve_safe(value: str, places: dict[str, str]) -> str:
    """Like resolve, but leaves ``{wheel:...}`` as a shell glob for the written script."""
    value = re.sub(r"\{wheel:([A-Za-z0-9_]+)\}", lambda m: places["dist"] + f"/{m.group(1)}-*.whl", value)
    for key, repl in places.items():
        value = value.replace("{" + key + "}", repl)
    return value


def run_steps(plan: BuildPlan, tree: Path, echo: Echo, done: list[dict],
              after: dict[str, Callable[[], None]] | None = None,
              heartbeat_s: float = progress.PLAIN_INTERVAL_S) -> list[dict]:
    """Run every step in order, appending one record per step to ``done`` (kept on failure too);
    ``after[name]`` runs once the step called ``name`` succeeded. Steps take up to hours: every
    ``heartbeat_s`` a line says how long the step has run and what its log said last."""
    places = placeholders(plan, tree)
    logs = plan.work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    for i, step in enumerate(plan.steps, 1):
        log = logs / f"{i:02d}-{step.name.replace(' ', '-')}.log"
        argv = [resolve(a, places, plan.output_dir) for a in step.argv]
        cwd = Path(resolve(step.cwd, places, plan.output_dir))
        env = {**os.environ, **plan.env, **{k: plan.flashinfer_env[k] for k in step.env}}
        echo(f"[{i}/{len(plan.steps)}] {step.name} (log: {log})")
        start = time.monotonic()
        with open(log, "w") as fh, progress.Heartbeat(f"[{i}/{len(plan.steps)}] {step.name}", log,
                                                      interval=heartbeat_s, say=echo):
            fh.write(f"$ (cd {cwd} && {' '.join(argv)})\n")
            fh.flush()
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=fh, stderr=subprocess.STDOUT)
        took = time.monotonic() - start
        done.append({"step": step.name, "seconds": round(took, 1), "log": str(log), "rc": proc.returncode})
        if proc.returncode != 0:
            tail = log.read_text(errors="replace").splitlines()[-25:]
            for line in tail:
                echo(f"    | {line}")
            raise LauncherError(f"build step '{step.name}' failed (exit {proc.returncode})", hint=f"full log: {log}")
        echo(f"      done in {took / 60:.1f} min")
        if after and step.name in after:
            after[step.name]()
    return done


# ------------------------------------------------------------------ manifest


def manifest(plan: BuildPlan, src: SourceReport | None, pre: PreflightResult | None, status: str,
             steps_run: list[dict], scripts: dict[str, str]) -> dict:
    wheels = []
    if plan.output_dir.is_dir():
        for whl in sorted(plan.output_dir.glob("*.whl")):
            wheels.append({"file": whl.name, "sha256": hashlib.sha256(whl.read_bytes()).hexdigest()})
    tc: dict = {"python": sys.version.split()[0], "cmake": cmake_archs.find_cmake(), **_toolchain_env()}
    if pre is not None:
        if pre.nvcc:
            tc["nvcc"] = {"path": str(pre.nvcc.path), "version": pre.nvcc.version_text,
                          "cuda_home": str(pre.nvcc.cuda_home) if pre.nvcc.cuda_home else None}
        if pre.host_compiler:
            tc["host_compiler"] = {"kind": pre.host_compiler.kind, "version": pre.host_compiler.version,
                                   "path": str(pre.host_compiler.path)}
        tc["preflight"] = [{"code": p.code, "ok": p.ok, "found": list(p.found)} for p in pre.probes]
    return {
        "schema": 1,
        "status": status,
        "written": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"os": toolchain.host_os(), "machine": platform.machine(), "wsl": toolchain.is_wsl(),
                 "cores": plan.jobs.cores, "mem_gb": plan.jobs.mem_gb},
        "plan": plan.to_dict(),
        "source_tree": str(src.tree) if src else None,
        "tree_pins": src.pins if src else None,
        "series_applied": src.series if src else None,
        "cmake_archs": src.cmake if src else None,
        "torch_pins_removed": src.torch_stripped if src else None,
        "toolchain": tc,
        "scripts": scripts,
        "steps_run": steps_run,
        "wheels": wheels,
        "warnings": plan.warnings + (src.warnings if src else []),
    }


def write_manifest(plan: BuildPlan, data: dict) -> Path:
    plan.output_dir.mkdir(parents=True, exist_ok=True)
    path = plan.output_dir / f"build-manifest-vllm-{plan.vllm_version}-{plan.target.name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def _toolchain_env() -> dict:
    keys = ("CUDA_HOME", "CUDA_PATH", "CUDACXX", "CUDAHOSTCXX")
    return {"env": {k: os.environ[k] for k in keys if k in os.environ}}


def _folder(path: Path, flag: str) -> None:
    """``path`` as a folder, made here where absent; a clear error where it cannot be made."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LauncherError(f"{flag} {path}: cannot make that folder ({exc.strerror})",
                            hint=f"pass a folder you can write to {flag}") from None


def build(plan: BuildPlan, *, preflight: PreflightResult | None, stop_before_compile: bool, echo: Echo) -> Path:
    """The whole ``build wheels`` flow; returns the manifest path."""
    # both checked before anything is fetched or patched: the manifest is written to the output
    # folder only at the end, after what may be hours of compiling
    folders = ((plan.work_dir, "--work-dir"), (plan.output_dir, "--output-dir"))
    for path, flag in folders:
        if path.exists() and not path.is_dir():
            raise LauncherError(f"{flag} {path} is a file, not a folder", hint=f"pass a folder to {flag}")
    for path, flag in folders:
        _folder(path, flag)
    src = prepare_source(plan, echo)
    scripts = write_scripts(plan, src.tree)
    echo(f"env and commands: {scripts['env']}, {scripts['steps']}")
    if stop_before_compile:
        path = write_manifest(plan, manifest(plan, src, preflight, "source-ready", [], scripts))
        echo(f"stopped before the compiler: {src.tree} is patched and ready; manifest {path}")
        return path
    free_gb = shutil.disk_usage(plan.work_dir).free // 2**30
    if free_gb < plan.target.disk_gb:
        src.warnings.append(f"only {free_gb} GB free in {plan.work_dir}; a {plan.target.name} build needs about "
                            f"{plan.target.disk_gb} GB")
        echo(f"warning: {src.warnings[-1]}")
    steps_run: list[dict] = []
    after = {}
    if src.cmake.get("checked") == "text":
        # cmake arrives with vLLM's build requirements: run the real arch check before compiling.
        def recheck() -> None:
            src.cmake = _check_archs(plan, src.tree, src.warnings, echo)

        after["build requirements"] = recheck
    try:
        run_steps(plan, src.tree, echo, steps_run, after)
    except LauncherError:
        write_manifest(plan, manifest(plan, src, preflight, "failed", steps_run, scripts))
        raise
    path = write_manifest(plan, manifest(plan, src, preflight, "built", steps_run, scripts))
    echo(f"wheels and manifest in {plan.output_dir}")
    return path
