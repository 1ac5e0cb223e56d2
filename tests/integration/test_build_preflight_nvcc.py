"""The preflight compiled for real with this machine's nvcc (CUDA 13.0) and read back
with cuobjdump from the nvidia-cuda-cuobjdump wheel."""

from __future__ import annotations

import subprocess

import pytest
from typer.testing import CliRunner

from launcher.builder import preflight, targets, toolchain
from launcher.cli import app


@pytest.fixture(scope="module")
def data():
    return targets.load()


@pytest.mark.parametrize(
    "name,codes,entries",
    [
        # hand-written: what each code must look like inside the object
        ("linux-amd64", ["sm_120", "sm_120f"], [("elf sm_120",), ("elf sm_120f",)]),
        ("linux-arm64", ["sm_121a"], [("elf sm_121a",)]),
    ],
)
def test_probe_compiles_and_holds_exactly_the_planned_codes(data, name, codes, entries):
    result = preflight.run(data.target(name), data)
    assert result.nvcc is not None and result.nvcc.version.major == 13
    assert result.cuobjdump is not None and "nvidia" in str(result.cuobjdump)  # the PyPI wheel's binary
    assert [p.code for p in result.probes] == codes
    assert [p.found for p in result.probes] == entries
    assert all(p.ok for p in result.probes)
    assert result.ok, result.lines()


def test_windows_target_probes_its_codes_here_but_is_blocked_on_linux(data):
    result = preflight.run(data.target("windows-amd64"), data)
    assert [(p.code, p.found, p.ok) for p in result.probes] == [
        ("sm_120a", ("elf sm_120a",), True),
        ("compute_120a", ("ptx sm_120a",), True),
    ]
    assert not result.ok
    assert [r.area for r in result.reasons if r.blocking] == ["host"]


def test_the_inspection_sees_every_code_in_a_binary(tmp_path):
    """The "exactly" check would notice extra code: an object built for two codes lists both."""
    nvcc = toolchain.find_nvcc_path()
    src = tmp_path / "k.cu"
    src.write_text("__global__ void k(int *x) { x[0] = 1; }\n")
    obj = tmp_path / "k.o"
    subprocess.run(
        [str(nvcc), "-c", str(src), "-o", str(obj),
         "-gencode", "arch=compute_120a,code=sm_120a", "-gencode", "arch=compute_121a,code=sm_121a"],
        check=True, capture_output=True,
    )
    out = subprocess.run([str(toolchain.find_cuobjdump()), str(obj)], capture_output=True, text=True, check=True)
    assert sorted(preflight.fatbin_entries(out.stdout)) == ["elf sm_120a", "elf sm_121a"]


def test_cli_preflight_spark_target_passes_here():
    res = CliRunner().invoke(app, ["build", "preflight", "--target", "linux-arm64"])
    assert res.exit_code == 0, res.output
    assert "sm_121a        binary holds: elf sm_121a" in res.output
    assert "verdict: ready to build" in res.output
