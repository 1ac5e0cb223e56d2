"""Preflight fails fast, with the reason to fix first.

Conditions this machine does not have are staged with fakes, named as such:
an old CUDA is a FAKE nvcc script that only prints a 12.8 version string; an
unsupported host compiler is a FAKE g++ script that reports GCC 16. A missing
nvcc is real: PATH and the CUDA variables are emptied and the default install
folders are taken out of the search list (this machine has a real
/usr/local/cuda/bin/nvcc, which would otherwise be found).
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from launcher.builder import preflight, targets, toolchain
from launcher.cli import app


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def data():
    return targets.load()


@pytest.fixture
def fake_old_nvcc(tmp_path, monkeypatch):
    """FAKE nvcc: prints CUDA 12.8's version banner and nothing else (never compiles)."""
    nvcc = _script(
        tmp_path / "nvcc",
        'echo "nvcc: NVIDIA (R) Cuda compiler driver"\n'
        'echo "Cuda compilation tools, release 12.8, V12.8.93"\n',
    )
    monkeypatch.setenv("CUDACXX", str(nvcc))
    return nvcc


def test_cuda_too_old_for_sm121_is_refused_before_compiling(data, fake_old_nvcc):
    result = preflight.run(data.target("linux-arm64"), data)
    assert not result.ok
    assert result.nvcc.version == Version("12.8")
    assert result.probes == []  # stopped before any compile
    messages = [r.message for r in result.reasons if r.blocking]
    assert messages == ["CUDA 12.8 is too old for sm_121a (needs CUDA >= 13.0)"]
    assert "CUDA 13.0 toolkit" in result.reasons[-1].hint


def test_cli_preflight_exit_code_and_message_with_old_cuda(fake_old_nvcc):
    res = CliRunner().invoke(app, ["build", "preflight", "--target", "linux-arm64"])
    assert res.exit_code == 1
    assert "[BLOCK] toolchain: CUDA 12.8 is too old for sm_121a" in res.output
    assert "NOT ready" in res.output


def test_version_rules_per_code(data):
    amd = data.target("linux-amd64")
    # FAKE version strings fed to the pure check: 12.8 lacks family targets, 12.9 has them but
    # is below the cu130 torch floor, 13.0 passes, 14.0 is a different CUDA major than torch's.
    r128 = [r.message for r in preflight.cuda_version_reasons(amd, data, Version("12.8"))]
    assert r128 == ["CUDA 12.8 is too old for sm_120f (needs CUDA >= 12.9)"]
    r129 = [r.message for r in preflight.cuda_version_reasons(amd, data, Version("12.9"))]
    assert len(r129) == 1 and "older than the linux-amd64 target's minimum 13.0" in r129[0]
    assert preflight.cuda_version_reasons(amd, data, Version("13.0")) == []
    r14 = preflight.cuda_version_reasons(amd, data, Version("14.0"))
    assert len(r14) == 1 and "newer than the torch builds allow" in r14[0].message


def test_parse_nvcc_version_rejects_garbage():
    assert preflight.toolchain.parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88")[0] == Version("13.0")
    with pytest.raises(ValueError):
        toolchain.parse_nvcc_version("command not found")


def test_nvcc_missing_says_what_to_install(data, monkeypatch, tmp_path):
    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvcc on PATH
    monkeypatch.setattr(toolchain, "_DEFAULT_CUDA_DIRS", ())
    result = preflight.run(data.target("linux-amd64"), data)
    assert not result.ok and result.nvcc is None and result.probes == []
    (reason,) = result.reasons
    assert reason.message.startswith("nvcc not found")
    assert "cuda-nvcc-13-0" in reason.hint and "CUDA_HOME" in reason.hint


def test_unsupported_host_compiler_is_refused(data, monkeypatch, tmp_path):
    """FAKE g++ reporting GCC 16, newer than CUDA 13.0's host_config.h accepts (max 15)."""
    gxx = _script(
        tmp_path / "g++",
        'case "$1" in\n'
        '  --version) echo "g++ (FAKE) 16.1.0";;\n'
        '  *) echo "16.1.0";;\n'
        "esac\n",
    )
    monkeypatch.setenv("CUDAHOSTCXX", str(gxx))
    result = preflight.run(data.target("linux-amd64"), data)
    assert not result.ok and result.probes == []
    (reason,) = [r for r in result.reasons if r.blocking]
    assert reason.message == f"host compiler GCC 16.1.0 at {gxx} is not supported for this build (supported: GCC 9 to 15)"
    assert "CUDAHOSTCXX" in reason.hint


def test_missing_host_compiler(data, monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAHOSTCXX", "g++-that-does-not-exist")
    result = preflight.run(data.target("linux-amd64"), data)
    assert not result.ok
    assert [r.message for r in result.reasons if r.blocking] == ["no host C++ compiler: g++ not found"]


def test_fatbin_parsing_keeps_family_and_ptx_suffixes():
    # Hand-written in cuobjdump's format: --list-elf would print the family cubin as plain sm_120.
    text = (
        "\nFatbin elf code:\n================\narch = sm_120f\ncode version = [1,8]\nhost = linux\n"
        "\nFatbin ptx code:\n================\narch = sm_120a\ncode version = [9,0]\n"
    )
    assert preflight.fatbin_entries(text) == ["elf sm_120f", "ptx sm_120a"]
    assert preflight.expected_entries("compute_120a") == "ptx sm_120a"
    assert preflight.expected_entries("sm_121a") == "elf sm_121a"
