"""tests/gpu/staging/abi_check.py on shared libraries compiled here with gcc (no wheel, no GPU).

A "torch" library exports one symbol; an "extension" imports it, one symbol
nothing exports, and symbols of the two families resolved elsewhere at load
time (the Python C API, the CUDA runtime). Only the unexported one may be
reported, and an extension that imports nothing missing must count as loading.
"""

from __future__ import annotations

import subprocess
import zipfile

import pytest

from tests.unit.gpu_scripts import load as _load

abi = _load("abi_check")

# gcc and nm (binutils) are installed by tests/engines.sh when missing, as root.


def _so(path, source, *link):
    src = path.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(src), *link], check=True)
    return path


@pytest.fixture
def libs(tmp_path):
    torch_lib = _so(tmp_path / "libtorch_fake.so", "int torch_present(void) { return 1; }\n")
    decls = "int torch_present(void); int torch_absent(void); int PyErr_Occurred(void); int cudaMalloc(void);\n"
    broken = _so(tmp_path / "_broken.abi3.so", decls +
                 "int f(void) { return torch_present() + torch_absent() + PyErr_Occurred() + cudaMalloc(); }\n")
    fine = _so(tmp_path / "_fine.abi3.so", decls + "int g(void) { return torch_present() + PyErr_Occurred(); }\n")
    return torch_lib, broken, fine


def test_only_symbols_nothing_exports_are_unresolved(libs):
    torch_lib, broken, fine = libs
    provided = abi.exported([torch_lib])
    assert "torch_present" in provided
    missing = abi.unresolved([broken, fine], provided)
    assert missing == {"_broken.abi3.so": ["torch_absent"], "_fine.abi3.so": []}


def test_check_reads_both_wheels(libs, tmp_path):
    torch_lib, broken, fine = libs
    vllm_whl, torch_whl = tmp_path / "vllm-0-py3-none-any.whl", tmp_path / "torch-0-py3-none-any.whl"
    with zipfile.ZipFile(vllm_whl, "w") as zf:
        zf.write(broken, "vllm/_broken.abi3.so")
        zf.write(fine, "vllm/sub/_fine.abi3.so")
    with zipfile.ZipFile(torch_whl, "w") as zf:
        zf.write(torch_lib, "torch/lib/libtorch_fake.so")
    result = abi.check(vllm_whl, torch_whl)
    assert result["extensions"] == 2
    assert result["loads"] == ["_fine.abi3.so"]
    assert result["unresolved"] == {"_broken.abi3.so": ["torch_absent"]}
