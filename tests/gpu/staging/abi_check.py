"""Do a vLLM wheel's compiled extensions link against another torch? (issue 12, staging 0.33.0)

vLLM 0.33.0 pins torch 2.14; the offline GPU host has torch 2.11 preinstalled,
and carrying torch 2.14 means about 1.5 GB in 64 MiB calls. The first question
is whether 0.33.0's extensions (built on torch's stable ABI, ``*.abi3.so``)
resolve their symbols against torch 2.11's libraries at all. This answers
that without a GPU: for every ``.so`` in the vLLM wheel, the dynamic symbols
it imports, less those torch's ``lib/*.so`` export, less those of the system
libraries (libc, libstdc++, ...), less the two families resolved elsewhere
at load time: the Python C API (the interpreter) and the CUDA runtime
(``cuda*``/``__cuda*``: libcudart and libcuda from the host). What is left
would fail to load (``undefined symbol``).

A clean result is necessary, not sufficient: vLLM's Python code may use
torch 2.14 APIs, and the stable ABI has runtime version checks; only a run
on the GPU host settles it.

Usage: ``python tests/gpu/staging/abi_check.py VLLM.whl TORCH.whl [--json OUT]``
(wheels from PyPI; any Python tag of torch will do, the libraries are the same).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SYSTEM_LIBS = ["libc.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libm.so.6", "libdl.so.2",
               "libpthread.so.0", "ld-linux-x86-64.so.2"]
# Resolved at load time by the interpreter (Python C API) or the host's CUDA.
ELSEWHERE = re.compile(r"^(Py|_Py|cu|CU|__cuda|nvrtc|__gmon_start__|_ITM_|_Jv_|__cxa_finalize)")


def dynamic_symbols(lib: Path, defined: bool) -> set[str]:
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, str(lib)], capture_output=True, text=True, check=False).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def system_libraries(names: list[str]) -> list[Path]:
    """The x86-64 paths of ``names`` in the dynamic linker's cache (one ``ldconfig -p``)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    found: dict[str, Path] = {}
    for line in out.splitlines():
        name = line.strip().split(" ", 1)[0]
        if name in names and "x86-64" in line and name not in found:
            found[name] = Path(line.rsplit("=>", 1)[1].strip())
    return list(found.values())


def exported(libs: list[Path]) -> set[str]:
    names: set[str] = set()
    for lib in libs:
        names |= dynamic_symbols(lib, defined=True)
    return names


def unresolved(extensions: list[Path], provided: set[str]) -> dict[str, list[str]]:
    """Per extension, the imported symbols nothing in ``provided`` or ELSEWHERE resolves."""
    return {ext.name: sorted(s for s in dynamic_symbols(ext, defined=False) - provided
                             if not ELSEWHERE.match(s))
            for ext in extensions}


def _unpack(wheel: Path, pattern: str, dest: Path) -> list[Path]:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if re.search(pattern, n)]
        for n in names:
            zf.extract(n, dest)
    return [dest / n for n in names]


def check(vllm_wheel: Path, torch_wheel: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        exts = _unpack(vllm_wheel, r"\.so$", Path(tmp) / "vllm")
        torch_libs = _unpack(torch_wheel, r"^torch/lib/[^/]+\.so(\.\d+)*$", Path(tmp) / "torch")
        system = system_libraries(SYSTEM_LIBS)
        missing = unresolved(exts, exported(torch_libs) | exported(system))
    return {"vllm_wheel": vllm_wheel.name, "torch_wheel": torch_wheel.name,
            "extensions": len(missing), "loads": sorted(k for k, v in missing.items() if not v),
            "unresolved": {k: v for k, v in missing.items() if v}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("vllm_wheel", type=Path)
    parser.add_argument("torch_wheel", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = check(args.vllm_wheel, args.torch_wheel)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['vllm_wheel']} against {result['torch_wheel']}: "
          f"{len(result['loads'])}/{result['extensions']} extensions resolve every symbol")
    for ext, syms in result["unresolved"].items():
        print(f"  {ext}: {len(syms)} unresolved, e.g. {', '.join(syms[:4])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
