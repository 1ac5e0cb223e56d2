"""Build proof: vLLM's own configure, then the sm_120 / sm_121 objects the recipe runs, compiled for real.

A full build does not fit a small machine, but the part that breaks on these
cards does. ``launcher build proof`` prepares the tree exactly as ``build
wheels`` does (sdist, series, build patch, arch check, use_existing_torch),
installs the pinned CUDA torch into a build venv, and lets vLLM's setup.py run
its real CMake configure; a ``cmake`` shim on PATH stops setup.py at the
build step it would run next. Then each object from ``build/proof.yaml`` is
compiled through the generated build (its own per-object ninja target), timed,
and read back with cuobjdump; its codes must equal what the plan expects. One
FlashInfer kernel family goes the same way through FlashInfer's own JIT spec.
The result is ``build/results/build-proof-<version>-<target>.json``.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from launcher import pypi
from launcher.builder import cmake_archs, preflight, proof_report, toolchain, wheels
from launcher.builder.plan import BuildPlan, host_cores, host_mem_gb, job_counts, plan
from launcher.builder.targets import load as load_targets
from launcher.errors import LauncherError

Echo = Callable[[str], None]
SHIM_STOP = 75  # the shim's exit code for the build step setup.py would run after configure
_SOURCE_STAMP = ".proof-source.json"
# Runs a command and reports its wall time and the peak RSS of the largest process under it.
_MEASURE = textwrap.dedent("""\
    import resource, subprocess, sys, time
    t = time.monotonic()
    rc = subprocess.call(sys.argv[1:])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(f"\\nPROOF-MEASURE rc={rc} s={time.monotonic() - t:.2f} peak_kb={peak}", flush=True)
    sys.exit(rc)
""")


def default_root() -> Path:
    """Build venv, work trees and local source copies: outside any clone, reused between runs."""
    root = os.environ.get("VLLM_SM12X_PROOF_DIR")
    return Path(root) if root else Path.home() / ".cache" / "vllm-sm12x-build"


@dataclass(frozen=True)
class Measured:
    rc: int
    seconds: float
    peak_rss_mb: float
    log: str


@dataclass
class ProofRun:
    """One proof: a target and a vLLM version, with where everything goes."""

    target: str
    vllm_version: str | None
    root: Path
    sources: Path
    results_dir: Path
    flashinfer: bool = True


def run(opts: ProofRun, echo: Echo) -> Path:
    """The whole proof; returns the result JSON path. Raises when an object's codes differ from the plan
    (after writing the JSON, so the evidence stays)."""
    data = load_targets()
    version = opts.vllm_version or data.default_vllm_version
    work = opts.root / "work" / f"vllm-{version}-{opts.target}"
    p = plan(opts.target, version, work_dir=work, output_dir=work / "dist", jobs=1, data=data)
    spec = proof_report.load().for_vllm(version)
    echo("\n".join(p.lines()))

    src = wheels.prepare_source(p, echo)
    venv_python = ensure_venv(opts.root / "venv", p, src.tree, echo)
    cuda_home = Path(p.env.get("CUDA_HOME") or "")
    if not (cuda_home / "bin" / "nvcc").is_file():
        raise LauncherError("no CUDA toolkit found for the proof (nvcc)", hint="set CUDA_HOME to a CUDA 13 toolkit")
    host_env, adaptations = host_cuda_env(cuda_home, venv_python, opts.root / "cuda-link", p.pins.cuda)
    source_env, sources = supply_sources(spec.sources, src.tree, opts.sources)
    env = build_env(p, venv_python, cuda_home, {**host_env, **source_env})

    build_dir = work / "build"
    configure_s, setup_targets = configure(src.tree, build_dir, env, venv_python, work / "shim", echo)
    objects = build_objects(build_dir, setup_targets, env)
    echo(f"configure: {configure_s:.0f} s; the generated build compiles {len(objects)} objects "
         f"for {', '.join(setup_targets)}")

    expected = expected_codes(src.tree, p, spec)
    records = [compile_object(build_dir, objects, o.source, env, cuobjdump(), o.role, o.klass, expected[o.source],
                              echo) for o in spec.objects]
    samples = [compile_sample(build_dir, objects, s, env, echo) for s in spec.class_samples]

    extra: dict = {}
    if p.target.requires_build_patch and spec.without_build_patch:
        extra["without_build_patch"] = without_build_patch(p, src.tree, spec, env, venv_python, echo)
    if opts.flashinfer and p.target.flashinfer_cuda_arch_list:
        extra["flashinfer"] = flashinfer_proof(p, venv_python, env, work / "flashinfer", echo)

    extrapolation = full_build(objects, spec.classes, records + samples, job_counts(p.target, data.jobs).max_jobs)
    out = proof_report.result(
        vllm=version, target=p.target.name, configure_s=configure_s, objects=records, extrapolation=extrapolation,
        class_samples=samples,
        command=f"make build-proof TARGET={p.target.name}" + (f" VLLM_VERSION={version}" if opts.vllm_version else ""),
        arch_lists={"TORCH_CUDA_ARCH_LIST": p.target.torch_cuda_arch_list, "vllm_cuda_archs": p.target.vllm_cuda_archs,
                    "sm12x_kernel_archs": p.target.kernel_archs,
                    "FLASHINFER_CUDA_ARCH_LIST": p.target.flashinfer_cuda_arch_list},
        series=src.series["results"], setup_py_targets=setup_targets,
        sources=sources, host_adaptations=adaptations, toolchain=toolchain_record(cuda_home, venv_python),
        host={"machine": platform.machine(), "cores": host_cores(), "mem_gb": host_mem_gb(),
              "load_avg": [round(x, 1) for x in os.getloadavg()], "MAX_JOBS": p.env["MAX_JOBS"],
              "NVCC_THREADS": p.env["NVCC_THREADS"]},
        **extra,
    )
    opts.results_dir.mkdir(parents=True, exist_ok=True)
    path = opts.results_dir / f"build-proof-{version}-{p.target.name}.json"
    path.write_text(json.dumps(out, indent=2) + "\n")
    echo(f"result: {path}")
    bad = [o["source"] for o in records if not o["match"]]
    bad += [o["source"] for part in ("without_build_patch", "flashinfer") for o in extra.get(part, {}).get("objects", [])
            if not o.get("match", True)]
    if bad:
        raise LauncherError(f"codes differ from the plan for: {', '.join(bad)}", hint=f"see {path}")
    return path


def full_build(objects: list[str], rules: list[proof_report.ClassRule], timed: list[dict], host_jobs: int) -> dict:
    """Extrapolate the whole generated build from the timed objects, at this host's jobs and at
    16 / 20 jobs (a 16-core workstation, a Spark's 20 cores) with the same per-object times."""
    seconds: dict[str, list[float]] = {}
    for rec in timed:
        seconds.setdefault(rec["class"], []).append(rec["compile_s"])
    counts = proof_report.classify(objects, rules)
    out = proof_report.extrapolate(counts, seconds, host_jobs)
    out["hours_by_jobs"] = {str(j): proof_report.extrapolate(counts, seconds, j)["hours"]
                            for j in sorted({host_jobs, 16, 20})}
    return out


# ------------------------------------------------------------------ environment


def ensure_venv(venv: Path, p: BuildPlan, tree: Path, echo: Echo) -> Path:
    """The build venv: the pinned torch from PyPI (its CUDA build), vLLM's build requirements
    (torch pins already stripped by use_existing_torch) and cuobjdump."""
    python = venv / "bin" / "python"
    if not python.is_file():
        echo(f"creating the build venv {venv}")
        _check([sys.executable, "-m", "venv", str(venv)], "venv")
    reqs = tree / "requirements" / "build" / "cuda.txt"
    if not reqs.is_file():
        reqs = tree / "requirements" / "build.txt"
    echo(f"build venv: torch=={p.pins.torch} + {reqs.relative_to(tree)} (pip; no-op when present)")
    _check([str(python), "-m", "pip", "install", "-q", f"torch=={p.pins.torch}", "-r", str(reqs),
            "nvidia-cuda-cuobjdump"], "pip install (build venv)", timeout=3600)
    cuda = subprocess.run([str(python), "-c", "import torch; print(torch.version.cuda or '')"],
                          capture_output=True, text=True, timeout=300).stdout.strip()
    if not cuda.startswith(p.pins.cuda.split(".")[0] + "."):
        raise LauncherError(f"torch {p.pins.torch} in {venv} is built for CUDA {cuda or 'none'}, "
                            f"the pins say CUDA {p.pins.cuda}",
                            hint=f"pip install torch=={p.pins.torch} --index-url {p.pins.torch_index}")
    return python


def host_cuda_env(cuda_home: Path, python: Path, link_dir: Path, cuda: str) -> tuple[dict, list[str]]:
    """Fill what a minimal CUDA toolkit lacks from torch's own CUDA wheels.

    torch's CMake config wants cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE, NVRTC and the
    driver library, and its headers include cublas_v2.h & co. A toolkit made of nvcc and
    cudart alone (as on this project's machines) has none of them; the torch wheel's
    ``nvidia/cu<major>`` packages carry the same CUDA major's headers and libraries. Nothing
    is linked by the proof, so a missing driver library gets an empty stub to satisfy CMake.
    """
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, timeout=120).stdout.strip())
    wheel_cuda = site / "nvidia" / f"cu{cuda.split('.')[0]}"
    env: dict[str, str] = {}
    notes: list[str] = []
    if not (cuda_home / "include" / "cublas_v2.h").exists() and (wheel_cuda / "include" / "cublas_v2.h").exists():
        env["CPATH"] = os.pathsep.join(filter(None, [str(wheel_cuda / "include"), os.environ.get("CPATH")]))
        notes.append(f"{cuda_home} has no CUDA math library headers: CPATH={wheel_cuda / 'include'} "
                     "(torch's own CUDA wheels)")
    link_dir.mkdir(parents=True, exist_ok=True)
    libs = [d for d in (cuda_home / "lib64", cuda_home / "lib", cuda_home / "lib64" / "stubs") if d.is_dir()]
    linked = []
    for lib in ("cublas", "cublasLt", "cufft", "curand", "cusolver", "cusparse", "nvrtc", "nvJitLink", "cufile"):
        if any((d / f"lib{lib}.so").exists() for d in libs):
            continue
        found = sorted((wheel_cuda / "lib").glob(f"lib{lib}.so.*"))
        if found:
            link = link_dir / f"lib{lib}.so"
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(found[0])
            linked.append(lib)
    if linked:
        notes.append(f"{cuda_home} lacks lib{{{','.join(linked)}}}.so: linked from {wheel_cuda / 'lib'} "
                     f"into {link_dir}")
    if not any((d / "libcuda.so").exists() for d in libs):
        stub = link_dir / "libcuda.so"
        if not stub.exists():
            c_file = link_dir / "cuda_stub.c"
            c_file.write_text("/* CMake needs a libcuda.so to define CUDA::cuda_driver; the proof links nothing. */\n"
                              "void vllm_sm12x_proof_cuda_stub(void) {}\n")
            _check(["gcc", "-shared", "-fPIC", "-o", str(stub), str(c_file)], "libcuda stub")
        notes.append(f"no driver library (no GPU here): an empty {stub} satisfies CMake's CUDA::cuda_driver; "
                     "no object is linked")
    if linked or "libcuda.so" in str(notes):
        env["CMAKE_ARGS"] = " ".join(filter(None, [os.environ.get("CMAKE_ARGS"), f"-DCMAKE_LIBRARY_PATH={link_dir}"]))
    return env, notes


def supply_sources(pins: dict[str, proof_report.SourcePin], tree: Path, root: Path) -> tuple[dict, list[dict]]:
    """Local copies of what vLLM's configure would fetch from GitHub, through vLLM's own variables."""
    env, records, missing = {}, [], []
    for name, pin in pins.items():
        path = Path(os.environ.get(pin.env) or root / name)
        if not path.is_dir() or not any(path.iterdir()):
            missing.append(f"{name} ({pin.repository}) at {path} or ${pin.env}")
            continue
        pinned = proof_report.pinned_revision((tree / pin.pinned_in).read_text(), pin.pinned_regex)
        stamp_file = path / _SOURCE_STAMP
        stamp = json.loads(stamp_file.read_text()) if stamp_file.is_file() else None
        env[pin.env] = str(path)
        records.append(proof_report.source_record(name, pin, pinned, stamp, str(path)))
    if missing:
        raise LauncherError(
            "vLLM's configure downloads these from GitHub, which this build cannot reach: " + "; ".join(missing),
            hint=f"put a copy of each pinned revision under {root}/<name> (or set the variable) with a "
            f"{_SOURCE_STAMP} naming its revision; see build/README.md (Build proof)",
        )
    return env, records


def build_env(p: BuildPlan, python: Path, cuda_home: Path, extra: dict) -> dict:
    path = os.pathsep.join([str(cuda_home / "bin"), str(python.parent), os.environ.get("PATH", "")])
    # Proof timings are cold compiles: no compiler cache.
    return {**os.environ, **p.env, **extra, "PATH": path, "CCACHE_DISABLE": "1"}


# ------------------------------------------------------------------ configure


def configure(tree: Path, build_dir: Path, env: dict, python: Path, shim_dir: Path, echo: Echo) -> tuple[float, list[str]]:
    """Run vLLM's setup.py (build_ext) until its CMake configure is done.

    setup.py calls ``cmake <src> -G Ninja ...`` (configure), then ``cmake --build . --target ...``.
    A ``cmake`` shim first on PATH passes everything to the real cmake except that build call,
    which it records (the targets setup.py builds) and refuses with exit 75.
    """
    real = shutil.which("cmake", path=str(python.parent)) or shutil.which("cmake")
    if not real:
        raise LauncherError("cmake not found in the build venv")
    shim_dir.mkdir(parents=True, exist_ok=True)
    for f in ("configure-times", "build-args"):
        (shim_dir / f).unlink(missing_ok=True)
    shim = shim_dir / "cmake"
    shim.write_text(shim_script(real, shim_dir))
    shim.chmod(0o755)
    if build_dir.exists():
        shutil.rmtree(build_dir)  # a fresh configure each run, so configure_s is a real one
    build_dir.mkdir(parents=True)
    log = build_dir.parent / "logs" / f"configure-{build_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    echo(f"configure: {python.name} setup.py build_ext (vLLM's own CMake configure; log {log})")
    run_env = {**env, "PATH": f"{shim_dir}{os.pathsep}{env['PATH']}"}
    with open(log, "w") as fh:
        proc = subprocess.run([str(python), "setup.py", "build_ext", "--build-temp", str(build_dir)], cwd=tree,
                              env=run_env, stdout=fh, stderr=subprocess.STDOUT, timeout=3600)
    times = (shim_dir / "configure-times").read_text().split() if (shim_dir / "configure-times").exists() else []
    build_args = (shim_dir / "build-args").read_text() if (shim_dir / "build-args").exists() else ""
    if not build_args or len(times) < 3 or times[2] != "0":
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise LauncherError(f"vLLM's CMake configure failed (setup.py exit {proc.returncode}):\n{tail}",
                            hint=f"full log: {log}")
    return float(times[1]) - float(times[0]), parse_build_targets(build_args)


def shim_script(real_cmake: str, record_dir: Path) -> str:
    rec = shlex.quote(str(record_dir))
    return textwrap.dedent(f"""\
        #!/bin/sh
        # launcher build proof: configure goes to the real cmake; the build call is recorded, not run.
        for a in "$@"; do
          if [ "$a" = "--build" ]; then printf '%s\\n' "$*" > {rec}/build-args; exit {SHIM_STOP}; fi
        done
        case " $* " in *" --version "*|*" -E "*|*" -P "*) exec {shlex.quote(real_cmake)} "$@";; esac
        start=$(date +%s.%N)
        {shlex.quote(real_cmake)} "$@"
        rc=$?
        printf '%s %s %s\\n' "$start" "$(date +%s.%N)" "$rc" > {rec}/configure-times
        exit $rc
        """)


def parse_build_targets(build_args: str) -> list[str]:
    """``--build . -j=1 --target=_C --target=_moe_C`` -> ["_C", "_moe_C"]."""
    return re.findall(r"--target[= ](\S+)", build_args)


def build_objects(build_dir: Path, targets: list[str], env: dict) -> list[str]:
    """Every object file the targets setup.py would build depend on (ninja's own graph)."""
    proc = subprocess.run(["ninja", "-C", str(build_dir), "-t", "inputs", *targets], capture_output=True, text=True,
                          env=env, timeout=300)
    if proc.returncode != 0:
        raise LauncherError(f"ninja -t inputs failed: {proc.stderr.strip()[:300]}")
    return sorted({line.strip() for line in proc.stdout.splitlines() if line.strip().endswith(".o")})


def expected_codes(tree: Path, p: BuildPlan, spec: proof_report.VllmProof) -> dict[str, list[str]]:
    """What the plan says each object holds: its CMake group evaluated for the target's list.
    SM12x kernels must also resolve to the target's planned kernel_archs."""
    groups = sorted({o.arch_group for o in spec.objects})
    resolved = cmake_archs.resolve_groups(tree, p.target.torch_cuda_arch_list, groups)
    for o in spec.objects:
        if o.sm12x and resolved[o.arch_group] != p.target.kernel_archs:
            raise LauncherError(f"{o.source}: CMake resolves {o.arch_group} to {resolved[o.arch_group]!r}, "
                                f"the {p.target.name} plan says {p.target.kernel_archs!r}")
    return {o.source: proof_report.fatbin_codes(resolved[o.arch_group]) for o in spec.objects}


# ------------------------------------------------------------------ compile + inspect


def cuobjdump() -> Path:
    found = toolchain.find_cuobjdump()
    if not found:
        raise LauncherError("cuobjdump not found", hint="pip install nvidia-cuda-cuobjdump")
    return found


def find_object(objects: list[str], source: str) -> str:
    hits = [o for o in objects if o.endswith("/" + source + ".o")]
    if len(hits) != 1:
        raise LauncherError(f"the generated build has {len(hits)} objects for {source}",
                            hint="the source list of build/proof.yaml does not match this vLLM version")
    return hits[0]


def measure(argv: list[str], cwd: Path, env: dict, log: Path) -> Measured:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as fh:
        fh.write(f"$ (cd {cwd} && {' '.join(argv)})\n")
        fh.flush()
        subprocess.run([sys.executable, "-c", _MEASURE, *argv], cwd=cwd, env=env, stdout=fh,
                       stderr=subprocess.STDOUT, timeout=6 * 3600)
    text = log.read_text(errors="replace")
    m = re.search(r"PROOF-MEASURE rc=(-?\d+) s=([\d.]+) peak_kb=(\d+)", text)
    if not m:
        raise LauncherError(f"no measurement in {log}")
    return Measured(int(m.group(1)), float(m.group(2)), int(m.group(3)) / 1024, text)


def compile_target(build_dir: Path, obj: str, env: dict, log: Path, echo: Echo) -> Measured:
    """One object through the generated build (``cmake --build --target <object>``), always recompiled."""
    (build_dir / obj).unlink(missing_ok=True)
    echo(f"compiling {obj} (log {log})")
    got = measure(["cmake", "--build", str(build_dir), "--target", obj, "-j", "1"], build_dir, env, log)
    if got.rc != 0:
        tail = "\n".join(got.log.splitlines()[-30:])
        raise LauncherError(f"compiling {obj} failed:\n{tail}", hint=f"full log: {log}")
    echo(f"  {got.seconds:.0f} s, peak RSS {got.peak_rss_mb:.0f} MB")
    return got


def _log_for(build_dir: Path, obj: str) -> Path:
    """One log per object, named after its whole path (two Marlin objects share a file name)."""
    return build_dir.parent / "logs" / f"{build_dir.name}-{obj.replace('/', '_')}.log"


def inspect(obj: Path, tool: Path) -> tuple[list[str], str]:
    dump = subprocess.run([str(tool), str(obj)], capture_output=True, text=True, timeout=600)
    if dump.returncode != 0:
        raise LauncherError(f"cuobjdump {obj} failed: {(dump.stderr or dump.stdout).strip()[:300]}")
    with open(obj, "rb") as fh:
        host = proof_report.elf_machine(fh.read(20))
    return preflight.fatbin_entries(dump.stdout), host


def compile_object(build_dir: Path, objects: list[str], source: str, env: dict, tool: Path, role: str, klass: str,
                   expected: list[str], echo: Echo) -> dict:
    obj = find_object(objects, source)
    got = compile_target(build_dir, obj, env, _log_for(build_dir, obj), echo)
    codes, host = inspect(build_dir / obj, tool)
    rec = proof_report.object_record(source=source, role=role, klass=klass, codes=codes, expected=expected,
                                     compile_s=got.seconds, peak_rss_mb=got.peak_rss_mb, host_code=host)
    echo(f"  codes {', '.join(rec['codes'])} (plan: {', '.join(rec['expected'])}) host {host}"
         f"{'' if rec['match'] else '  MISMATCH'}")
    return rec


def compile_sample(build_dir: Path, objects: list[str], sample: proof_report.ClassSample, env: dict,
                   echo: Echo) -> dict:
    hits = [o for o in objects if re.search(sample.match, o)]
    if not hits:
        raise LauncherError(f"no object of the generated build matches {sample.match!r}")
    got = compile_target(build_dir, hits[0], env, _log_for(build_dir, hits[0]), echo)
    return {"object": hits[0], "class": sample.klass, "compile_s": round(got.seconds, 1),
            "peak_rss_mb": round(got.peak_rss_mb)}


# ------------------------------------------------------------------ without the build patch


def without_build_patch(p: BuildPlan, tree: Path, spec: proof_report.VllmProof, env: dict, python: Path,
                        echo: Echo) -> dict:
    """The same object from a tree whose CMakeLists.txt is the released one: what the Spark gets unpatched."""
    bare = tree.parent.parent / "src-without-build-patch" / tree.name
    if bare.parent.exists():
        shutil.rmtree(bare.parent)
    shutil.copytree(tree, bare, symlinks=True)
    released = _released_file(p, "CMakeLists.txt")
    (bare / "CMakeLists.txt").write_bytes(released)
    echo(f"without the build patch {p.target.requires_build_patch}: released CMakeLists.txt in {bare}")
    work = tree.parent.parent
    configure_s, targets = configure(bare, work / "build-without-build-patch", env, python,
                                     work / "shim-without-build-patch", echo)
    objects = build_objects(work / "build-without-build-patch", targets, env)
    obj = next(o for o in spec.objects if o.source == spec.without_build_patch)
    resolved = cmake_archs.resolve_groups(bare, p.target.torch_cuda_arch_list, [obj.arch_group])[obj.arch_group]
    rec = compile_object(work / "build-without-build-patch", objects, obj.source, env, cuobjdump(), obj.role,
                         obj.klass, proof_report.fatbin_codes(resolved), echo)
    planned = proof_report.fatbin_codes(p.target.kernel_archs)
    rec["differs_from_plan"] = rec["codes"] != planned
    return {"build_patch": p.target.requires_build_patch, "configure_s": round(configure_s, 1),
            "resolved": {obj.arch_group: resolved}, "plan": planned, "objects": [rec]}


def _released_file(p: BuildPlan, member: str) -> bytes:
    sdist = pypi.fetch("vllm", p.vllm_version, "sdist")
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            if m.name.split("/", 1)[-1] == member:
                fh = tf.extractfile(m)
                if fh:
                    return fh.read()
    raise LauncherError(f"{sdist.name} has no {member}")


# ------------------------------------------------------------------ FlashInfer


_FI_DRIVER = textwrap.dedent("""\
    # Generate one FlashInfer kernel family's sources and build.ninja the way flashinfer.aot does
    # (compile_and_package_modules points jit_env at a build dir, then builds the family's JitSpec).
    import importlib, json, sys
    from pathlib import Path
    build, module, family = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    import flashinfer
    import flashinfer.jit.env as jit_env
    jit_env.FLASHINFER_WORKSPACE_DIR = build
    jit_env.FLASHINFER_JIT_DIR = build / "cached_ops"
    jit_env.FLASHINFER_GEN_SRC_DIR = build / "generated"
    jit_env.FLASHINFER_JIT_DIR.mkdir(parents=True, exist_ok=True)
    jit_env.FLASHINFER_GEN_SRC_DIR.mkdir(parents=True, exist_ok=True)
    spec = getattr(importlib.import_module(module), family)()
    spec.write_ninja()
    print("PROOF-SPEC " + json.dumps({"version": flashinfer.__version__, "build_dir": str(spec.build_dir),
                                      "ninja": str(spec.ninja_path)}))
""")


def flashinfer_proof(p: BuildPlan, python: Path, env: dict, build: Path, echo: Echo) -> dict:
    """One AOT kernel family of FlashInfer (the version vLLM pins), from its sdist, for the target's list."""
    fi = proof_report.load().for_flashinfer(p.pins.flashinfer)
    sdist = pypi.fetch("flashinfer-python", p.pins.flashinfer, "sdist")
    have = subprocess.run([str(python), "-m", "pip", "show", "flashinfer-python"], capture_output=True, text=True,
                          timeout=120).stdout
    if f"Version: {p.pins.flashinfer}\n" not in have:
        echo(f"installing flashinfer-python {p.pins.flashinfer} from {sdist.name} into the build venv")
        _check([str(python), "-m", "pip", "install", "-q", "--no-build-isolation", str(sdist)],
               "pip install flashinfer sdist", timeout=3600)
    fi_env = {**env, **p.flashinfer_env}
    if build.exists():
        shutil.rmtree(build)
    build.mkdir(parents=True)
    driver = subprocess.run([str(python), "-c", _FI_DRIVER, str(build), fi.module, fi.family], capture_output=True,
                            text=True, env=fi_env, timeout=1800)
    m = re.search(r"^PROOF-SPEC (.*)$", driver.stdout, re.M)
    if driver.returncode != 0 or not m:
        raise LauncherError(f"FlashInfer {fi.family} failed to generate: {(driver.stderr or driver.stdout)[-1500:]}")
    spec = json.loads(m.group(1))
    build_dir = Path(spec["build_dir"])
    family_objects = ninja_compile_outputs(Path(spec["ninja"]).read_text())
    objs = [o for o in family_objects if re.search(fi.object_regex, o)]
    if len(objs) != 1:
        raise LauncherError(f"FlashInfer {fi.family}: {len(objs)} objects match {fi.object_regex!r}")
    rel = objs[0]  # the ninja target exactly as build.ninja spells it
    obj = Path(rel) if Path(rel).is_absolute() else build_dir / rel
    log = build / "logs" / f"{obj.name}.log"
    obj.unlink(missing_ok=True)
    echo(f"compiling FlashInfer {fi.family}: {rel} (log {log})")
    got = measure(["ninja", "-C", str(build_dir), rel], build_dir, fi_env, log)
    if got.rc != 0:
        tail = "\n".join(got.log.splitlines()[-30:])
        raise LauncherError(f"FlashInfer {rel} failed to compile:\n{tail}", hint=f"full log: {log}")
    codes, host = inspect(obj, cuobjdump())
    rec = proof_report.object_record(source=f"{fi.family}: {obj.name}", role=fi.role, klass="flashinfer", codes=codes,
                                     expected=proof_report.fatbin_codes(p.target.flashinfer_cuda_arch_list or ""),
                                     compile_s=got.seconds, peak_rss_mb=got.peak_rss_mb, host_code=host)
    echo(f"  {got.seconds:.0f} s, peak RSS {got.peak_rss_mb:.0f} MB, codes {', '.join(codes)}"
         f"{'' if rec['match'] else '  MISMATCH'}")
    return {"version": spec["version"], "sdist": sdist.name, "family": fi.family,
            "FLASHINFER_CUDA_ARCH_LIST": p.target.flashinfer_cuda_arch_list,
            "family_objects": len(family_objects), "objects": [rec]}


def ninja_compile_outputs(ninja_text: str) -> list[str]:
    """Object outputs of a build.ninja's compile edges (``build <obj>: cuda_compile|compile <src>``)."""
    return re.findall(r"^build (\S+\.o): (?:cuda_)?compile ", ninja_text, re.M)


# ------------------------------------------------------------------ helpers


def toolchain_record(cuda_home: Path, python: Path) -> dict:
    nvcc = toolchain.nvcc_info(cuda_home / "bin" / "nvcc")
    host = toolchain.find_host_compiler("gcc")
    torch = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=300).stdout.strip()
    cmake = subprocess.run([str(python.parent / "cmake"), "--version"], capture_output=True, text=True,
                           timeout=60).stdout.split("\n")[0]
    dump = subprocess.run([str(cuobjdump()), "--version"], capture_output=True, text=True, timeout=60).stdout
    return {"nvcc": nvcc.version_text, "cuda_home": str(cuda_home), "host_compiler": host.version if host else None,
            "torch": torch, "cmake": cmake, "cuobjdump": toolchain.parse_nvcc_version(dump)[1]}


def _check(argv: list[str], what: str, timeout: int = 600) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise LauncherError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
