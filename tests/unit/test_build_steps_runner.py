"""The compile-step runner: progress lines, one log per step, the failing log's tail, a manifest.

The real steps take hours, so the plan's steps are REPLACED by short Python
commands (written here); the runner, its placeholders, env handling and
manifest writing are the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from launcher.builder import plan as build_plan
from launcher.builder import wheels
from launcher.builder.plan import Step
from launcher.errors import LauncherError


def _plan(tmp_path: Path, steps: list[Step]) -> build_plan.BuildPlan:
    p = build_plan.plan("linux-arm64", cores=2, mem_gb=8, work_dir=tmp_path / "work", output_dir=tmp_path / "dist")
    return dataclasses.replace(p, steps=steps)


def test_steps_run_in_order_with_logs_env_and_placeholders(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    steps = [
        Step("make wheel", ("{python}", "-c", "import pathlib,sys; pathlib.Path(sys.argv[1], 'flashinfer_python-0.0-py3-none-any.whl').write_text('w')", "{dist}"), "{work}"),
        Step("use wheel", ("{python}", "-c", "import os,sys; print('got', os.path.basename(sys.argv[1]), os.environ['FLASHINFER_CUDA_ARCH_LIST'], os.environ['TORCH_CUDA_ARCH_LIST'])", "{wheel:flashinfer_python}"), "{src}", env=("FLASHINFER_CUDA_ARCH_LIST",)),
    ]
    p = _plan(tmp_path, steps)
    p.work_dir.mkdir(parents=True)
    lines: list[str] = []
    done: list[dict] = []
    hooked: list[int] = []  # the hook `build wheels` uses to re-run the CMake arch check once cmake is installed
    wheels.run_steps(p, tree, lines.append, done, {"make wheel": lambda: hooked.append(len(done))})
    assert hooked == [1]
    assert [d["step"] for d in done] == ["make wheel", "use wheel"] and all(d["rc"] == 0 for d in done)
    assert lines[0].startswith("[1/2] make wheel (log: ") and lines[2].startswith("[2/2] use wheel")
    log2 = Path(done[1]["log"]).read_text()
    assert "got flashinfer_python-0.0-py3-none-any.whl 12.1a 12.1a" in log2
    assert log2.startswith(f"$ (cd {tree} && {sys.executable} -c")


def test_a_failing_step_shows_its_log_tail_and_the_manifest_says_failed(tmp_path):
    steps = [Step("boom", ("{python}", "-c", "print('compiling...'); raise SystemExit('nvcc error: out of memory')"), "{work}")]
    p = _plan(tmp_path, steps)
    p.work_dir.mkdir(parents=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    lines: list[str] = []
    done: list[dict] = []
    with pytest.raises(LauncherError) as err:
        wheels.run_steps(p, tree, lines.append, done)
    assert "build step 'boom' failed (exit 1)" in err.value.message
    assert done[0]["log"] in err.value.hint
    assert "    | nvcc error: out of memory" in lines
    path = wheels.write_manifest(p, wheels.manifest(p, None, None, "failed", done, {}))
    m = json.loads(path.read_text())
    assert m["status"] == "failed" and m["steps_run"][0]["rc"] == 1
    assert path.name == "build-manifest-vllm-0.21.0-linux-arm64.json"


def test_written_step_script_keeps_wheel_globs(tmp_path):
    p = build_plan.plan("linux-amd64", cores=2, mem_gb=8, work_dir=tmp_path / "w", output_dir=tmp_path / "d")
    p.work_dir.mkdir(parents=True)
    scripts = wheels.write_scripts(p, tmp_path / "src")
    text = Path(scripts["steps"]).read_text()
    assert f"pip install --no-deps {(tmp_path / 'd').resolve()}/flashinfer_python-*.whl" in text


def test_a_long_step_has_a_heartbeat_with_elapsed_time_and_the_logs_last_line(tmp_path):
    code = "import sys, time\nfor i in range(5):\n    print(f'[{i}/5] Building CUDA object csrc/k{i}.cu.o', flush=True); time.sleep(0.5)"
    p = _plan(tmp_path, [Step("compile", ("{python}", "-c", code), "{work}")])
    p.work_dir.mkdir(parents=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    lines: list[str] = []
    wheels.run_steps(p, tree, lines.append, [], heartbeat_s=0.6)
    beats = [ln for ln in lines if ln.startswith("[1/1] compile: ")]
    assert len(beats) >= 2, lines
    assert beats[-1].split(": ")[1].split(" |")[0].endswith("s")  # elapsed, e.g. "2s"
    assert any("| [" in b and "Building CUDA object csrc/k" in b for b in beats)
