"""Ask a vLLM source tree's own CMake which archs it will really build.

vLLM filters the requested archs twice: globally against
``CUDA_SUPPORTED_ARCHS`` and per kernel group with
``cuda_archs_loose_intersection`` (cmake/utils.cmake). Reading that logic is
how sm_121 silently became sm_120 under CUDA 13, so instead of re-implementing
it, this module runs the tree's own code in ``cmake -P`` script mode: the
supported-arch block of CMakeLists.txt plus utils.cmake, with a chosen CUDA
version. No compiler or torch is needed; it takes well under a second.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from launcher.builder.targets import split_archs
from launcher.errors import LauncherError

# The SM12x NVFP4 GEMM group: FP4_ARCHS (0.21.0) / FP4_SM120_ARCHS (0.33.0);
# its first declaration is the CUDA >= 13 branch.
_KERNEL_DECL = re.compile(r'cuda_archs_loose_intersection\((FP4_ARCHS|FP4_SM120_ARCHS)\s+"([^"]+)"')


@dataclass(frozen=True)
class ResolvedArchs:
    cuda_archs: str  # CMake's CUDA_ARCHS after the CUDA_SUPPORTED_ARCHS filter
    kernel_archs: str  # what the SM12x FP4 kernel group is built for
    kernel_group: str  # its CMake variable, for messages


def find_cmake() -> str | None:
    """cmake on PATH, else the one pip put beside this interpreter (a venv not on PATH)."""
    beside = Path(sys.executable).parent
    return shutil.which("cmake") or shutil.which("cmake", path=str(beside))


def resolve(tree: Path, requested: str, cuda_version: str = "13.0", cmake: str | None = None) -> ResolvedArchs:
    """Run ``tree``'s CMake arch logic for TORCH_CUDA_ARCH_LIST=``requested``.

    ``requested`` uses torch's spelling; "+PTX" is dropped the way vLLM's
    ``extract_unique_cuda_archs_ascending`` drops it from torch's gencode flags.
    """
    cmake = cmake or find_cmake()
    if not cmake:
        raise LauncherError("cmake not found", hint="pip install 'cmake>=3.26' (vLLM's build needs it anyway)")
    text = (tree / "CMakeLists.txt").read_text()
    decl = _KERNEL_DECL.search(text)
    if not decl:
        raise LauncherError(f"{tree}/CMakeLists.txt declares no FP4 kernel arch list this launcher knows")
    out = _run_script(tree, requested, cuda_version, cmake, [
        f'cuda_archs_loose_intersection(KERNEL_ARCHS "{decl.group(2)}" "${{CUDA_ARCHS}}")',
        'message(STATUS "SM12X CUDA_ARCHS=${CUDA_ARCHS}")',
        'message(STATUS "SM12X KERNEL_ARCHS=${KERNEL_ARCHS}")',
    ])
    values = dict(re.findall(r"SM12X (\w+)=(.*)", out))
    return ResolvedArchs(values.get("CUDA_ARCHS", "").strip(), values.get("KERNEL_ARCHS", "").strip(), decl.group(1))


def _supported_block(text: str) -> str:
    """The ``if(... CMAKE_CUDA_COMPILER_VERSION ...) set(CUDA_SUPPORTED_ARCHS ...) endif()`` block."""
    start = text.find("# Supported NVIDIA architectures.")
    if start < 0:
        raise LauncherError("CMakeLists.txt has no '# Supported NVIDIA architectures.' block")
    end = re.compile(r"^endif\(\)\s*$", re.M).search(text, start)
    if not end:
        raise LauncherError("CMakeLists.txt: unterminated supported-arch block")
    return text[start : end.end()]


def resolve_groups(tree: Path, requested: str, groups: list[str], cuda_version: str = "13.0",
                   cmake: str | None = None) -> dict[str, str]:
    """What each named kernel group (``FP4_ARCHS``, ``MARLIN_BF16_ARCHS``...) resolves to for
    TORCH_CUDA_ARCH_LIST=``requested``: its first declaration in CMakeLists.txt (the CUDA >= 13
    branch) intersected, by the tree's own cmake/utils.cmake, with the filtered CUDA_ARCHS."""
    cmake = cmake or find_cmake()
    if not cmake:
        raise LauncherError("cmake not found", hint="pip install 'cmake>=3.26' (vLLM's build needs it anyway)")
    text = (tree / "CMakeLists.txt").read_text()
    lines = []
    for group in groups:
        decl = re.search(rf'cuda_archs_loose_intersection\({re.escape(group)}\s+"([^"]+)"', text)
        if not decl:
            raise LauncherError(f"{tree}/CMakeLists.txt declares no arch list {group}")
        lines += [f'cuda_archs_loose_intersection({group} "{decl.group(1)}" "${{CUDA_ARCHS}}")',
                  f'message(STATUS "SM12X {group}=${{{group}}}")']
    out = _run_script(tree, requested, cuda_version, cmake, lines)
    values = dict(re.findall(r"SM12X (\w+)=(.*)", out))
    return {g: values.get(g, "").strip() for g in groups}


def _run_script(tree: Path, requested: str, cuda_version: str, cmake: str, lines: list[str]) -> str:
    """The tree's supported-arch block and global filter, then ``lines``, in ``cmake -P``."""
    block = _supported_block((tree / "CMakeLists.txt").read_text())
    archs = ";".join(a.replace("+PTX", "") for a in split_archs(requested))
    utils = (tree / "cmake" / "utils.cmake").as_posix()
    script = "\n".join([
        "cmake_policy(VERSION 3.25)",
        f'include("{utils}")',
        f"set(CMAKE_CUDA_COMPILER_VERSION {cuda_version})",
        block,
        f'set(CUDA_ARCHS "{archs}")',
        'cuda_archs_loose_intersection(CUDA_ARCHS "${CUDA_SUPPORTED_ARCHS}" "${CUDA_ARCHS}")',
        *lines,
    ])
    with tempfile.TemporaryDirectory(prefix="sm12x-cmake-") as tmp:
        path = Path(tmp) / "archs.cmake"
        path.write_text(script)
        proc = subprocess.run([cmake, "-P", str(path)], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise LauncherError(f"cmake could not evaluate {tree}'s arch logic: {out.strip()[:400]}")
    return out
