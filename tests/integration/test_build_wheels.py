"""`launcher build wheels --stop-before-compile`, run for real.

The sdists come from PyPI (cached outside the clone); the series is applied
by the real patch engine; vLLM's own use_existing_torch.py and its own CMake
arch logic (cmake -P on the patched tree) run for real. Only the compiler
steps are left out: a full vLLM build takes hours.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launcher import pypi
from launcher.builder import cmake_archs
from launcher.builder.targets import load
from launcher.builder.wheels import read_pins
from launcher.cli import app
from launcher.patching import engine
from launcher.patching.series import series_for

pytestmark = pytest.mark.network  # first run downloads the sdists


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _stop_before_compile(tmp: Path, target: str, version: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    work, dist = tmp / "work", tmp / "dist"
    proc = subprocess.run(
        [sys.executable, "-m", "launcher", "build", "wheels", "--target", target, "--vllm-version", version,
         "--work-dir", str(work), "--output-dir", str(dist), "--stop-before-compile"],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )
    return proc, work, dist


@pytest.fixture(scope="module")
def amd64_0210(tmp_path_factory):
    sdist = pypi.fetch("vllm", "0.21.0", "sdist")
    before = _sha(sdist)
    proc, work, dist = _stop_before_compile(tmp_path_factory.mktemp("amd64"), "linux-amd64", "0.21.0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"proc": proc, "work": work, "dist": dist, "tree": work / "src" / "vllm-0.21.0",
            "sdist": sdist, "sdist_sha_before": before}


@pytest.fixture(scope="module")
def arm64_0330(tmp_path_factory):
    proc, work, dist = _stop_before_compile(tmp_path_factory.mktemp("arm64"), "linux-arm64", "0.33.0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"proc": proc, "work": work, "dist": dist, "tree": work / "src" / "vllm-0.33.0"}


def test_tree_is_patched_by_the_engine(amd64_0210):
    status = engine.status(amd64_0210["tree"])
    series = series_for("0.21.0")
    assert status.fully_applied, [(p.id, p.state) for p in status.patches]
    assert {p.id for p in status.patches} == {p.id for p in [*series.patches, *series.build_patches]}
    assert status.state_of("cmake-keep-sm121") == "applied"


def test_torch_pins_are_stripped_and_the_rest_kept(amd64_0210):
    tree = amd64_0210["tree"]
    for rel in ("requirements/cuda.txt", "requirements/build/cuda.txt"):
        assert not re.search(r"^torch\s*==", (tree / rel).read_text(), re.M), rel
    assert '"torch ==' not in (tree / "pyproject.toml").read_text()
    cuda_txt = (tree / "requirements" / "cuda.txt").read_text()
    assert "flashinfer-python==0.6.8.post1" in cuda_txt and "flashinfer-cubin==0.6.8.post1" in cuda_txt
    assert "cmake>=3.26.1" in (tree / "requirements" / "build" / "cuda.txt").read_text()


def test_download_cache_is_not_modified(amd64_0210):
    assert _sha(amd64_0210["sdist"]) == amd64_0210["sdist_sha_before"]


def test_manifest_records_versions_archs_series_and_toolchain(amd64_0210):
    m = json.loads((amd64_0210["dist"] / "build-manifest-vllm-0.21.0-linux-amd64.json").read_text())
    assert m["status"] == "source-ready"
    assert m["wheels"] == []
    assert m["plan"]["vllm_version"] == "0.21.0" and m["plan"]["local_version"] == "cu130sm120"
    assert m["plan"]["arch_lists"]["TORCH_CUDA_ARCH_LIST"] == "12.0"
    assert m["plan"]["arch_lists"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"
    assert m["series_applied"]["hash"] == series_for("0.21.0").hash
    assert m["cmake_archs"] == {"checked": "cmake", "cuda_archs": "12.0", "kernel_group": "FP4_ARCHS",
                                "kernel_archs": "12.0f"}
    assert "release 13.0" in m["toolchain"]["nvcc"]["version"]
    assert [p["code"] for p in m["toolchain"]["preflight"]] == ["sm_120", "sm_120f"]
    assert m["tree_pins"]["torch"] == "2.11.0"  # read before use_existing_torch stripped it


def test_env_and_commands_are_written_and_parse(amd64_0210):
    work, tree = amd64_0210["work"], amd64_0210["tree"]
    env = (work / "build-env.sh").read_text()
    assert "export TORCH_CUDA_ARCH_LIST=12.0\n" in env
    assert "export VLLM_VERSION_OVERRIDE=0.21.0+cu130sm120\n" in env
    assert "FLASHINFER_CUDA_ARCH_LIST" not in env  # step-only: set on the FlashInfer command
    steps = (work / "build-steps.sh").read_text()
    assert f"(cd {tree} && {sys.executable} -m pip wheel --no-build-isolation --no-deps -v -w" in steps
    assert "--branch v0.6.8.post1" in steps
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f TORCH_CUDA_ARCH_LIST=12.0f " in steps
    subprocess.run(["bash", "-n", str(work / "build-steps.sh")], check=True)
    assert "stopped before the compiler" in amd64_0210["proc"].stdout


def test_spark_tree_keeps_sm121(arm64_0330):
    """0.33.0 + the build patch: the tree's own CMake keeps 12.1a for CUDA_ARCHS and the FP4 kernels."""
    got = cmake_archs.resolve(arm64_0330["tree"], "12.1a")
    assert (got.cuda_archs, got.kernel_archs, got.kernel_group) == ("12.1a", "12.1a", "FP4_SM120_ARCHS")
    m = json.loads((arm64_0330["dist"] / "build-manifest-vllm-0.33.0-linux-arm64.json").read_text())
    assert m["cmake_archs"]["cuda_archs"] == "12.1a"
    assert m["plan"]["pins"]["flashinfer"] == "0.7.2.post1"
    # 0.33.0 keeps the script under tools/.
    assert not re.search(r"^torch\s*==", (arm64_0330["tree"] / "requirements/build/cuda.txt").read_text(), re.M)


def test_sm120_builds_are_unchanged_by_the_build_patch(amd64_0210):
    tree = amd64_0210["tree"]
    for requested, expected in [("12.0", ("12.0", "12.0f")), ("12.0a+PTX", ("12.0a", "12.0a")),
                                ("12.1a", ("12.1a", "12.1a"))]:
        got = cmake_archs.resolve(tree, requested)
        assert (got.cuda_archs, got.kernel_archs) == expected, requested


@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_targets_pins_match_the_real_sdist(version):
    tree = pypi.unpacked("vllm", version, "source")
    pins = read_pins(tree)
    want = load().vllm_versions[version]
    assert pins["torch"] == want.torch
    assert pins["torchvision"] == want.torchvision
    assert pins["torchaudio"] == want.torchaudio
    assert pins["flashinfer-python"] == want.flashinfer
    assert (tree / want.use_existing_torch).is_file()


def test_windows_build_needs_a_checkout():
    res = CliRunner().invoke(app, ["build", "wheels", "--target", "windows-amd64", "--skip-preflight",
                                   "--stop-before-compile"])
    assert res.exit_code == 2
    assert "builds from a checkout, not the PyPI sdist" in res.output
    assert "launcher install --wheel" in res.output
