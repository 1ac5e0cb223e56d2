"""`launcher build plan` for every target, against hand-written expectations.

The expectations below are written from the facts (FACTS.md, the sdists'
CMakeLists.txt, setup.py's MAX_JOBS/NVCC_THREADS handling), not copied from
plan output. The host is pinned with cores/mem_gb so the numbers do not
depend on the machine running the tests.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from launcher.builder import plan as build_plan
from launcher.builder import targets
from launcher.cli import app

# target -> (TORCH_CUDA_ARCH_LIST, FLASHINFER_CUDA_ARCH_LIST, probe codes, local version, wheel platform)
EXPECTED = {
    "linux-amd64": ("12.0", "12.0f", ["sm_120", "sm_120f"], "cu130sm120", "linux_x86_64"),
    "linux-arm64": ("12.1a", "12.1a", ["sm_121a"], "cu130sm121", "linux_aarch64"),
    "wsl": ("12.0", "12.0f", ["sm_120", "sm_120f"], "cu130sm120", "linux_x86_64"),
    "windows-amd64": ("12.0a+PTX", None, ["sm_120a", "compute_120a"], "cu130sm120", "win_amd64"),
}

LINUX_STEPS = [
    "torch", "build requirements", "flashinfer source", "flashinfer-python", "flashinfer-cubin",
    "flashinfer-python install", "flashinfer-jit-cache", "vllm",
]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_plan_matches_hand_written_expectations(name, tmp_path):
    torch_list, fi_list, probes, local, plat = EXPECTED[name]
    p = build_plan.plan(name, cores=16, mem_gb=64, work_dir=tmp_path / "w", output_dir=tmp_path / "d")

    assert p.vllm_version == "0.21.0"  # the user's base is the default
    assert p.env["TORCH_CUDA_ARCH_LIST"] == torch_list
    assert p.env["VLLM_TARGET_DEVICE"] == "cuda"
    assert p.env["VLLM_VERSION_OVERRIDE"] == f"0.21.0+{local}"
    assert p.target.probe_gencodes() == probes
    assert p.flashinfer_env.get("FLASHINFER_CUDA_ARCH_LIST") == fi_list
    # 16 cores, 64 GB at 4 GB per compile thread: 16 threads fit; one code per file -> 1 nvcc thread.
    assert (p.jobs.max_jobs, p.jobs.nvcc_threads) == (16, 1)
    assert p.env["MAX_JOBS"] == "16" and p.env["NVCC_THREADS"] == "1"
    assert p.outputs[0] == f"vllm-0.21.0+{local}-*-{plat}.whl"
    assert p.outputs[-1] == f"build-manifest-vllm-0.21.0-{name}.json"
    # torch 2.11.0 (cu130) is what vLLM 0.21.0's requirements/cuda.txt pins.
    assert p.steps[0].argv[4:7] == ("torch==2.11.0", "torchvision==0.26.0", "torchaudio==2.11.0")
    assert p.steps[0].argv[-1] == "https://download.pytorch.org/whl/cu130"
    assert p.steps[-1].name == "vllm" and "--no-build-isolation" in p.steps[-1].argv
    assert p.series.hash and "cmake-keep-sm121" in p.series.build_patches
    assert p.work_dir == tmp_path / "w" and p.output_dir == tmp_path / "d"


def test_linux_targets_build_the_three_flashinfer_wheels_at_one_version():
    for name in ("linux-amd64", "linux-arm64", "wsl"):
        p = build_plan.plan(name, cores=8, mem_gb=32)
        assert [s.name for s in p.steps] == LINUX_STEPS
        assert "--branch" in p.steps[2].argv and "v0.6.8.post1" in p.steps[2].argv
        fi_outputs = [o for o in p.outputs if o.startswith("flashinfer")]
        assert [o.split("-")[0] for o in fi_outputs] == ["flashinfer_python", "flashinfer_cubin", "flashinfer_jit_cache"]
        assert all(o.split("-")[1].startswith("0.6.8.post1") for o in fi_outputs)
        jit = p.steps[6]
        assert jit.env == ("FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST")
        # for the FlashInfer steps torch's list follows FlashInfer's; vLLM's own list is untouched
        assert p.flashinfer_env["TORCH_CUDA_ARCH_LIST"] == p.flashinfer_env["FLASHINFER_CUDA_ARCH_LIST"]


def test_flashinfer_version_follows_the_vllm_version():
    p = build_plan.plan("linux-arm64", "0.33.0", cores=8, mem_gb=32)
    assert "v0.7.2.post1" in p.steps[2].argv
    assert p.steps[0].argv[4] == "torch==2.14.0"
    assert p.env["VLLM_VERSION_OVERRIDE"] == "0.33.0+cu130sm121"


def test_windows_plan_uses_msvc_env_and_no_flashinfer():
    p = build_plan.plan("windows-amd64", cores=8, mem_gb=32)
    assert p.env["DISTUTILS_USE_SDK"] == "1"
    assert [s.name for s in p.steps] == ["torch", "build requirements", "vllm"]
    assert p.source == "checkout" and "vllm-windows" in p.source_detail
    assert not p.builds_flashinfer


@pytest.mark.parametrize(
    "cores,mem,jobs",
    [
        (16, 64, 16),  # cores bound
        (32, 64, 16),  # memory bound: 64 / 4
        (20, 119, 20),  # a Spark: 20 cores, ~119 GB visible
        (8, 6, 1),  # a small box: 6 // 4 = 1
        (2, 1, 1),  # never zero
    ],
)
def test_job_counts_from_cores_and_memory(cores, mem, jobs):
    data = targets.load()
    got = build_plan.job_counts(data.target("linux-amd64"), data.jobs, cores=cores, mem_gb=mem)
    assert (got.max_jobs, got.nvcc_threads) == (jobs, 1)


def test_two_codes_per_file_use_two_nvcc_threads_and_jobs_stay_a_thread_budget():
    data = targets.load()
    two = data.target("linux-amd64").model_copy(update={"vllm_cuda_archs": "12.0;12.1a"})
    got = build_plan.job_counts(two, data.jobs, cores=16, mem_gb=32)
    # 32 GB / 4 GB = 8 compile threads; setup.py runs MAX_JOBS // NVCC_THREADS = 4 jobs of 2 threads.
    assert (got.max_jobs, got.nvcc_threads) == (8, 2)


def test_jobs_override():
    p = build_plan.plan("linux-amd64", cores=16, mem_gb=64, jobs=3)
    assert p.env["MAX_JOBS"] == "3"


runner = CliRunner()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_cli_plan_every_target_without_a_version(name):
    res = runner.invoke(app, ["build", "plan", "--target", name, "--cores", "4", "--mem-gb", "16"])
    assert res.exit_code == 0, res.output
    assert f"vLLM 0.21.0 for {name}" in res.output
    assert f"TORCH_CUDA_ARCH_LIST      = {EXPECTED[name][0]}" in res.output
    assert "MAX_JOBS=4" in res.output


def test_cli_plan_json_with_version():
    res = runner.invoke(app, ["build", "plan", "--target", "linux-arm64", "--vllm-version", "0.33.0", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["vllm_version"] == "0.33.0"
    assert data["pins"]["flashinfer"] == "0.7.2.post1"
    assert data["arch_lists"]["FLASHINFER_CUDA_ARCH_LIST"] == "12.1a"
    assert data["runtime_env"]["TRITON_PTXAS_PATH"] == "/usr/local/cuda/bin/ptxas"


def test_cli_plan_refuses_unknown_target_and_version():
    res = runner.invoke(app, ["build", "plan", "--target", "macos"])
    assert res.exit_code == 2
    assert "unknown build target 'macos'" in res.output and "linux-amd64" in res.output
    res = runner.invoke(app, ["build", "plan", "--target", "linux-amd64", "--vllm-version", "0.19.0"])
    assert res.exit_code == 2
    assert "no build pins for vLLM 0.19.0" in res.output


def test_arch_spelling_is_validated():
    assert targets.gencodes("12.0a+PTX") == ["sm_120a", "compute_120a"]
    assert targets.gencodes("12.0f") == ["sm_120f"]
    assert targets.split_archs("12.0a 12.1a") == targets.split_archs("12.0a;12.1a") == ["12.0a", "12.1a"]
    with pytest.raises(ValueError):
        targets.gencodes("sm_120")


def test_cache_dirs_default_to_the_cache_and_respect_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLM_SM12X_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FETCHCONTENT_BASE_DIR", raising=False)
    p = build_plan.plan("linux-amd64", cores=4, mem_gb=16)
    assert p.env["FETCHCONTENT_BASE_DIR"] == str(tmp_path / "cache" / "build-cache" / "fetchcontent")
    # An image build points the caches at its BuildKit mounts.
    monkeypatch.setenv("FETCHCONTENT_BASE_DIR", "/mnt/fc")
    assert build_plan.plan("linux-amd64", cores=4, mem_gb=16).env["FETCHCONTENT_BASE_DIR"] == "/mnt/fc"


def test_plan_works_on_a_host_without_cuda(monkeypatch, tmp_path):
    """No nvcc anywhere (PATH emptied, CUDA variables unset, default install folders out of the search)."""
    from launcher.builder import toolchain

    for var in ("CUDACXX", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(toolchain, "_DEFAULT_CUDA_DIRS", ())
    p = build_plan.plan("linux-arm64", cores=20, mem_gb=119)
    assert p.nvcc == "not found" and "CUDA_HOME" not in p.env
    assert any("nvcc not found" in w for w in p.warnings)
    assert p.env["TORCH_CUDA_ARCH_LIST"] == "12.1a"


def test_cli_targets_lists_all_four():
    res = runner.invoke(app, ["build", "targets"])
    assert res.exit_code == 0, res.output
    for name in EXPECTED:
        assert name in res.output
    assert "vLLM versions: 0.21.0 (the default)" in res.output


def test_a_source_that_is_not_a_vllm_tree_is_refused_by_build_plan_too(tmp_path):
    """`build plan` showed `checkout /nonexistent (patched in place)` that `build wheels` refused."""
    from launcher.cli import app

    res = CliRunner().invoke(app, ["build", "plan", "-t", "linux-amd64", "--source", str(tmp_path / "none")])
    assert res.exit_code == 2 and "is not a vLLM source tree" in res.output and "patched in place" not in res.output


@pytest.mark.parametrize("flag", ["--work-dir", "--output-dir"])
def test_build_wheels_refuses_a_work_or_output_folder_that_cannot_be_one_before_anything_runs(flag, tmp_path):
    """A file, or a path under one, gave a Python traceback (the output folder only at the end of
    the build, hours in); a checkout that is not one made the work folder before it was refused."""
    from launcher.cli import app

    a_file = tmp_path / "afile"
    a_file.write_text("kept")
    base = ["build", "wheels", "-t", "linux-amd64", "--stop-before-compile", "--skip-preflight"]
    other = "--output-dir" if flag == "--work-dir" else "--work-dir"
    for bad, why in ((a_file, "is a file, not a folder"), (a_file / "x", "cannot make that folder")):
        res = CliRunner().invoke(app, [*base, flag, str(bad), other, str(tmp_path / "other")])
        assert res.exit_code == 2 and f"{flag} {bad}" in res.output and why in res.output, res.output
        assert res.exception is None or isinstance(res.exception, SystemExit)
    assert a_file.read_text() == "kept"
    res = CliRunner().invoke(app, [*base, "--source", str(tmp_path / "none"), "--work-dir", str(tmp_path / "new")])
    assert res.exit_code == 2 and not (tmp_path / "new").exists()
