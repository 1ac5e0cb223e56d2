"""Toolchain preflight: prove, in seconds, that a multi-hour build can start.

For every code the target will ask nvcc for (``sm_120a``, ``sm_121a``,
``sm_120f``, ``compute_120a`` PTX, ...) a tiny kernel is really compiled with
the nvcc and host compiler the build will use, and the object is read back
with cuobjdump to check it holds exactly that code. Cheap checks run first
and stop the preflight (nvcc missing, CUDA too old, host compiler outside the
range nvcc accepts) so the reason printed is the first thing to fix.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from launcher.builder import toolchain
from launcher.builder.targets import Target, TargetsFile
from launcher.preflight import Reason

_PROBE_SOURCE = """\
// vllm-sm12x build preflight probe: one trivial kernel per requested code.
__global__ void sm12x_probe(float *x) { x[threadIdx.x] = 2.0f * x[threadIdx.x] + 1.0f; }
"""

_UNSUPPORTED_HOST = re.compile(r"unsupported (GNU|clang|Microsoft Visual Studio)[^!]*!", re.I)


@dataclass(frozen=True)
class ProbeResult:
    code: str  # sm_120a, compute_120a, ...
    ok: bool
    found: tuple[str, ...]  # what cuobjdump saw, e.g. ("elf sm_120a",)
    detail: str = ""


@dataclass
class PreflightResult:
    target: str
    nvcc: toolchain.Nvcc | None = None
    host_compiler: toolchain.HostCompiler | None = None
    cuobjdump: Path | None = None
    probes: list[ProbeResult] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(r.blocking for r in self.reasons)

    def lines(self) -> list[str]:
        out = [f"preflight for target {self.target}"]
        if self.nvcc:
            home = f" (CUDA_HOME {self.nvcc.cuda_home})" if self.nvcc.cuda_home else ""
            out.append(f"  nvcc: {self.nvcc.path} {self.nvcc.version_text}{home}")
        if self.host_compiler:
            hc = self.host_compiler
            out.append(f"  host compiler: {hc.kind} {hc.version} ({hc.path})")
        if self.cuobjdump:
            out.append(f"  cuobjdump: {self.cuobjdump}")
        for p in self.probes:
            mark = "ok  " if p.ok else "FAIL"
            seen = ", ".join(p.found) or "nothing"
            out.append(f"  [{mark}] {p.code:<14} binary holds: {seen}{'  ' + p.detail if p.detail else ''}")
        out += ["  " + r.line() for r in self.reasons]
        out.append("verdict: " + ("ready to build" if self.ok else "NOT ready (fix the BLOCK lines above)"))
        return out


def run(target: Target, data: TargetsFile, *, workdir: Path | None = None) -> PreflightResult:
    """Check everything the build of ``target`` needs from the toolchain; never raises for a finding."""
    result = PreflightResult(target=target.name)
    result.reasons += _host_reasons(target)

    nvcc_path = toolchain.find_nvcc_path()
    if nvcc_path is None:
        result.reasons.append(
            Reason(
                "toolchain",
                "nvcc not found (looked at $CUDACXX, $CUDA_HOME/bin, PATH, /usr/local/cuda/bin)",
                hint=_install_cuda_hint(target),
            )
        )
        return result
    try:
        result.nvcc = toolchain.nvcc_info(nvcc_path)
    except (ValueError, OSError, subprocess.SubprocessError) as exc:
        result.reasons.append(Reason("toolchain", f"cannot read the CUDA version from {nvcc_path}: {exc}"))
        return result

    version_reasons = cuda_version_reasons(target, data, result.nvcc.version)
    if version_reasons:
        result.reasons += version_reasons
        return result

    if toolchain.host_os() == target.os:
        host_reasons, result.host_compiler = host_compiler_reasons(target, data)
        if host_reasons:
            result.reasons += host_reasons
            return result

    result.cuobjdump = toolchain.find_cuobjdump(result.nvcc.cuda_home)
    if result.cuobjdump is None:
        result.reasons.append(
            Reason(
                "toolchain",
                "cuobjdump not found",
                hint="pip install nvidia-cuda-cuobjdump (a dependency of this launcher: reinstall it)",
            )
        )
        return result

    own_tmp = workdir is None
    work = Path(tempfile.mkdtemp(prefix="sm12x-probe-")) if own_tmp else workdir
    try:
        work.mkdir(parents=True, exist_ok=True)
        src = work / "probe.cu"
        src.write_text(_PROBE_SOURCE)
        for code in target.probe_gencodes():
            probe = _probe_one(result, src, code)
            result.probes.append(probe)
            if not probe.ok:
                result.reasons.append(Reason("toolchain", f"{code}: {probe.detail}", hint=_probe_hint(probe)))
    finally:
        if own_tmp:
            shutil.rmtree(work, ignore_errors=True)
    return result


def cuda_version_reasons(target: Target, data: TargetsFile, version: Version) -> list[Reason]:
    """Why this CUDA version cannot build ``target`` (empty when it can). Pure: tests feed fake versions."""
    reasons = []
    for code in target.probe_gencodes():
        need = data.min_cuda_for(code)
        if need and version < need:
            reasons.append(
                Reason(
                    "toolchain",
                    f"CUDA {version} is too old for {code} (needs CUDA >= {need})",
                    hint=_install_cuda_hint(target),
                )
            )
    floor = Version(target.cuda_min)
    if version < floor and not reasons:
        reasons.append(
            Reason(
                "toolchain",
                f"CUDA {version} is older than the {target.name} target's minimum {floor} "
                "(the torch builds both vLLM bases pin are cu130)",
                hint=_install_cuda_hint(target),
            )
        )
    if version.major > target.cuda_max_major:
        reasons.append(
            Reason(
                "toolchain",
                f"CUDA {version} is newer than the torch builds allow (CUDA {target.cuda_max_major}.x; "
                "torch's extension build refuses a different CUDA major)",
                hint=f"install CUDA {target.cuda_min} side by side and point CUDA_HOME at it",
            )
        )
    return reasons


def host_compiler_reasons(target: Target, data: TargetsFile) -> tuple[list[Reason], toolchain.HostCompiler | None]:
    rng = data.host_compilers.get(target.host_compiler)
    found = toolchain.find_host_compiler(target.host_compiler)
    if found is None:
        hint = (
            "install Visual Studio 2022 Build Tools (Desktop development with C++) and run from build.ps1, "
            "which loads vcvars64"
            if target.host_compiler == "msvc"
            else "install g++ (Debian/Ubuntu: apt-get install build-essential), or set CUDAHOSTCXX"
        )
        name = "cl.exe (MSVC)" if target.host_compiler == "msvc" else "g++"
        return [Reason("toolchain", f"no host C++ compiler: {name} not found", hint=hint)], None
    if rng is None or found.kind not in ("gcc", "msvc"):
        return [], found  # clang and friends: nvcc's own check (in the probe) decides
    if found.kind != target.host_compiler:
        return [
            Reason("toolchain", f"host compiler {found.path} is {found.kind}, the {target.name} target builds with {target.host_compiler}")
        ], found
    if not rng.min <= found.major <= rng.max:
        label = f"MSVC {found.version} (_MSC_VER {found.major})" if found.kind == "msvc" else f"GCC {found.version}"
        allowed = rng.products or f"GCC {rng.min} to {rng.max}"
        return [
            Reason(
                "toolchain",
                f"host compiler {label} at {found.path} is not supported for this build (supported: {allowed})",
                hint="install a supported compiler and point CUDAHOSTCXX at it (e.g. CUDAHOSTCXX=/usr/bin/g++-13)",
            )
        ], found
    return [], found


def _host_reasons(target: Target) -> list[Reason]:
    host = toolchain.host_os()
    machine = toolchain.host_machine()
    if host != target.os:
        return [
            Reason(
                "host",
                f"the {target.name} target builds on {target.os}; this host runs {host}",
                hint="the arch probe below still shows whether this nvcc can emit the target's codes",
            )
        ]
    reasons = []
    if machine.lower() != target.machine.lower():
        reasons.append(
            Reason(
                "host",
                f"the {target.name} target builds on {target.machine}; this host is {machine}",
                blocking=False,
                hint="build on the target machine; under emulation a build takes many times longer",
            )
        )
    if target.name == "wsl" and not toolchain.is_wsl():
        reasons.append(Reason("host", "not running under WSL2 (the build is the same Linux build)", blocking=False))
    return reasons


def _probe_one(result: PreflightResult, src: Path, code: str) -> ProbeResult:
    assert result.nvcc and result.cuobjdump
    num = code.split("_", 1)[1]
    obj = src.with_name(f"probe_{code}.o")
    argv = [str(result.nvcc.path), "-c", str(src), "-o", str(obj), "-gencode", f"arch=compute_{num},code={code}"]
    if result.host_compiler is not None and result.host_compiler.kind != "msvc":
        argv[1:1] = ["-ccbin", str(result.host_compiler.path)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip()
        m = _UNSUPPORTED_HOST.search(err)
        first = m.group(0) if m else (err.splitlines() or ["no output"])[0]
        return ProbeResult(code, False, (), f"nvcc failed: {first}")
    dump = subprocess.run([str(result.cuobjdump), str(obj)], capture_output=True, text=True, timeout=120)
    if dump.returncode != 0:
        return ProbeResult(code, False, (), f"cuobjdump failed: {(dump.stderr or dump.stdout).strip()[:200]}")
    found = tuple(fatbin_entries(dump.stdout))
    want = expected_entries(code)
    if set(found) != {want} or len(found) != 1:
        return ProbeResult(code, False, found, f"expected exactly '{want}'")
    return ProbeResult(code, True, found)


def fatbin_entries(cuobjdump_text: str) -> list[str]:
    """``cuobjdump <obj>`` -> ["elf sm_120f", "ptx sm_120a", ...] from its "Fatbin ... code:" headers.

    The header keeps the a/f suffix (``--list-elf`` prints a family cubin as plain sm_120), which
    is why the full dump is parsed.
    """
    entries = []
    kind = None
    for line in cuobjdump_text.splitlines():
        m = re.match(r"Fatbin (elf|ptx) code:", line.strip())
        if m:
            kind = m.group(1)
            continue
        m = re.match(r"arch = (\S+)", line.strip())
        if m and kind:
            entries.append(f"{kind} {m.group(1)}")
            kind = None
    return entries


def expected_entries(code: str) -> str:
    """sm_120f -> "elf sm_120f"; compute_120a -> "ptx sm_120a" (cuobjdump names PTX by sm_)."""
    kind, num = code.split("_", 1)
    return f"{'elf' if kind == 'sm' else 'ptx'} sm_{num}"


def _install_cuda_hint(target: Target) -> str:
    if target.os == "windows":
        return f"install the CUDA {target.cuda_min} toolkit for Windows and open a new shell (CUDA_PATH is set by it)"
    if target.name == "wsl":
        return f"install cuda-toolkit-{target.cuda_min.replace('.', '-')} from NVIDIA's wsl-ubuntu repository (no driver inside WSL)"
    return (
        f"install the CUDA {target.cuda_min} toolkit (apt: cuda-nvcc-{target.cuda_min.replace('.', '-')} from NVIDIA's "
        f"repository, or the nvidia/cuda:{target.cuda_min}.2-devel image) and set CUDA_HOME"
    )


def _probe_hint(probe: ProbeResult) -> str | None:
    if "unsupported" in probe.detail and ("GNU" in probe.detail or "Visual" in probe.detail or "clang" in probe.detail):
        return "install a host compiler this CUDA supports and set CUDAHOSTCXX"
    return None

