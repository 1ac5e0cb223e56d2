"""Find the build toolchain: nvcc (and its CUDA version), the host compiler, cuobjdump.

Discovery follows what vLLM's build will use, so the preflight tests the same
binaries: ``$CUDACXX``, then ``$CUDA_HOME/bin/nvcc``, then ``nvcc`` on PATH,
then the default install folders. Nothing here compiles; ``preflight`` does.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

_DEFAULT_CUDA_DIRS = ("/usr/local/cuda/bin", "C:/Program Files/NVIDIA GPU Computing Toolkit/CUDA/v13.0/bin")
_EXE = ".exe" if os.name == "nt" else ""


@dataclass(frozen=True)
class Nvcc:
    path: Path
    version: Version
    version_text: str  # the "release X.Y, VX.Y.Z" line, for the manifest
    cuda_home: Path | None


@dataclass(frozen=True)
class HostCompiler:
    kind: str  # gcc | clang | msvc | unknown
    path: Path
    version: str  # gcc "12.2.0", msvc "19.38.33135"
    major: int  # gcc major, or _MSC_VER for msvc (1938)


def find_nvcc_path() -> Path | None:
    candidates = []
    if os.environ.get("CUDACXX"):
        candidates.append(os.environ["CUDACXX"])
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            candidates.append(os.path.join(os.environ[var], "bin", "nvcc" + _EXE))
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(on_path)
    candidates += [os.path.join(d, "nvcc" + _EXE) for d in _DEFAULT_CUDA_DIRS]
    for cand in candidates:
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return Path(cand)
    return None


def parse_nvcc_version(text: str) -> tuple[Version, str]:
    """``nvcc --version`` output -> (13.0, "release 13.0, V13.0.88"). Raises ValueError if absent."""
    m = re.search(r"release (\d+\.\d+), V([\d.]+)", text) or re.search(r"release (\d+\.\d+)", text)
    if not m:
        raise ValueError("no 'release X.Y' line in nvcc --version output")
    try:
        return Version(m.group(1)), m.group(0)
    except InvalidVersion as exc:
        raise ValueError(str(exc)) from exc


def nvcc_info(path: Path) -> Nvcc:
    out = _run([str(path), "--version"])
    version, text = parse_nvcc_version(out)
    return Nvcc(path=path, version=version, version_text=text, cuda_home=_cuda_home(path))


def _cuda_home(nvcc: Path) -> Path | None:
    """The toolkit root. Wrapper scripts (``/usr/local/bin/nvcc`` exec'ing the real one) are
    common, so ask nvcc itself: ``--dryrun`` prints ``TOP=<root>/bin/..``."""
    direct = nvcc.resolve().parent.parent
    if (direct / "include" / "cuda.h").exists() or (direct / "include" / "cuda_runtime.h").exists():
        return direct
    try:
        out = _run([str(nvcc), "--dryrun", "-c", "cuda_home_probe.cu"])
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"TOP=(\S+)", out)
    if m:
        top = Path(m.group(1)).resolve()
        if (top / "include").is_dir():
            return top
    return None


def find_host_compiler(kind: str) -> HostCompiler | None:
    """The C++ compiler nvcc will call: ``$CUDAHOSTCXX`` if set, else g++ (Linux) or cl (Windows)."""
    explicit = os.environ.get("CUDAHOSTCXX")
    name = explicit or ("cl" if kind == "msvc" else "g++")
    path = shutil.which(name) if not os.path.isabs(name) else (name if os.path.isfile(name) else None)
    if not path:
        return None
    if kind == "msvc":
        proc = subprocess.run([path], capture_output=True, text=True, timeout=60)
        m = re.search(r"Version (\d+)\.(\d+)\.(\d+)", proc.stderr + proc.stdout)
        if not m:
            return HostCompiler("unknown", Path(path), "?", 0)
        return HostCompiler("msvc", Path(path), ".".join(m.groups()), int(m.group(1)) * 100 + int(m.group(2)))
    banner = (_run([path, "--version"]).splitlines() or [""])[0]
    full = _run([path, "-dumpfullversion", "-dumpversion"]).strip()
    kind_found = "clang" if "clang" in banner.lower() else "gcc"
    try:
        major = int(full.split(".")[0])
    except ValueError:
        return HostCompiler("unknown", Path(path), full, 0)
    return HostCompiler(kind_found, Path(path), full, major)


def find_cuobjdump(cuda_home: Path | None = None) -> Path | None:
    """cuobjdump from the ``nvidia-cuda-cuobjdump`` wheel (a project dependency), else the toolkit's."""
    try:
        dist = importlib.metadata.distribution("nvidia-cuda-cuobjdump")
        for f in dist.files or []:
            if f.name in ("cuobjdump", "cuobjdump.exe"):
                path = Path(dist.locate_file(f))
                if path.is_file():
                    if os.name != "nt" and not os.access(path, os.X_OK):
                        path.chmod(path.stat().st_mode | 0o111)
                    return path
    except importlib.metadata.PackageNotFoundError:
        pass
    if cuda_home:
        cand = cuda_home / "bin" / ("cuobjdump" + _EXE)
        if cand.is_file():
            return cand
    found = shutil.which("cuobjdump")
    return Path(found) if found else None


def host_os() -> str:
    return "windows" if os.name == "nt" else platform.system().lower()


def host_machine() -> str:
    return platform.machine()


def is_wsl() -> bool:
    try:
        return "microsoft" in Path("/proc/version").read_text().lower()
    except OSError:
        return False


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    return proc.stdout + proc.stderr
