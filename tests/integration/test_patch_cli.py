"""``launcher patch ...`` through the installed console script, in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.patching.series import series_for
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import TEST_PATCHES, mini_tree, pristine, snapshot

LAUNCHER = Path(sys.executable).parent / ("launcher.exe" if os.name == "nt" else "launcher")
BACKEND = "vllm/v1/attention/backend.py"


def run(*args: str, patches: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("VLLM_SM12X_PATCHES", None)
    if patches is not None:
        env["VLLM_SM12X_PATCHES"] = str(patches)
    return subprocess.run([str(LAUNCHER), "patch", *args], capture_output=True, text=True, env=env, timeout=300)


def test_console_script_apply_status_revert(tmp_path):
    root = mini_tree("0.33.0", "source", tmp_path / "tree", [BACKEND])
    before = snapshot(root)

    out = run("status", "--target", str(root), patches=TEST_PATCHES)
    assert out.returncode == 0, out.stderr
    assert "backend-two-hunks" in out.stdout and "not-applied" in out.stdout

    out = run("apply", "--target", str(root), patches=TEST_PATCHES)
    assert out.returncode == 0, out.stderr
    assert "applied 4 patch(es)" in out.stdout

    out = run("status", "--target", str(root), "--json", patches=TEST_PATCHES)
    data = json.loads(out.stdout)
    assert data["version"] == "0.33.0" and data["layout"] == "source"
    assert [(p["id"], p["state"]) for p in data["patches"]] == [
        ("backend-two-hunks", "applied"), ("new-module", "applied"),
        ("backend-on-top", "applied"), ("cmake-message", "applied"),
    ]
    assert all("diff" not in p for p in data["stamp"]["patches"])

    out = run("revert", "--target", str(root / "vllm"), "--json", patches=TEST_PATCHES)  # the vllm folder works too
    assert out.returncode == 0, out.stderr
    assert [r["outcome"] for r in json.loads(out.stdout)["results"]] == ["reverted"] * 4
    assert snapshot(root) == before


def test_status_exits_1_on_conflict_and_on_modified_since_apply(tmp_path):
    root = mini_tree("0.21.0", "site-packages", tmp_path / "tree", [BACKEND])
    backend = root / BACKEND
    edit = ("forward_includes_kv_cache_update: bool = True", "forward_includes_kv_cache_update: bool = False")
    backend.write_text(backend.read_text().replace(*edit))
    out = run("status", "--target", str(root), patches=TEST_PATCHES)
    assert out.returncode == 1 and "conflict" in out.stdout and "(conflict)" in out.stderr
    backend.write_text(backend.read_text().replace(edit[1], edit[0]))
    assert run("status", "--target", str(root), patches=TEST_PATCHES).returncode == 0  # not applied is no failure
    assert run("apply", "--target", str(root), patches=TEST_PATCHES).returncode == 0
    backend.write_text(backend.read_text().replace("sm12x_patched: ClassVar[bool] = True",
                                                   "sm12x_patched: ClassVar[bool] = False"))
    out = run("status", "--target", str(root), "--json", patches=TEST_PATCHES)
    assert out.returncode == 1 and "modified" in {p["state"] for p in json.loads(out.stdout)["patches"]}


def test_console_script_refusal_is_one_line_and_changes_nothing(tmp_path):
    root = mini_tree("0.21.0", "site-packages", tmp_path / "tree", [BACKEND])
    backend = root / BACKEND
    backend.write_text(backend.read_text().replace("forward_includes_kv_cache_update: bool = True",
                                                   "forward_includes_kv_cache_update: bool = False"))
    before = snapshot(root)
    out = run("apply", "--target", str(root), patches=TEST_PATCHES)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    first = out.stderr.splitlines()[0]
    assert first.startswith("error: ") and BACKEND in first and "hunk 1/2" in first
    assert out.stderr.splitlines()[1].startswith("hint: ")
    assert snapshot(root) == before


def test_check_against_prints_the_table_and_fails_on_conflict(tmp_path):
    out = run("check", "--against", "vllm==0.21.0", patches=TEST_PATCHES)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].split() == ["PATCH", "LAYOUT", "RESULT", "DETAIL"]
    assert ["backend-two-hunks", "wheel", "applies"] in [line.split() for line in lines]
    assert ["cmake-message", "sdist", "applies"] in [line.split() for line in lines]

    patches = tmp_path / "patches"
    shutil.copytree(TEST_PATCHES, patches)
    p1 = patches / "vllm" / "0.21.0" / "0001-backend-two-hunks.patch"
    p1.write_text(p1.read_text().replace(" forward_includes_kv_cache_update: bool = True",
                                         " forward_includes_kv_cache_update: bool = Maybe"))
    out = run("check", "--against", "vllm==0.21.0", patches=patches)
    assert out.returncode == 1
    assert "conflicts" in out.stdout and "hunk 1/2" in out.stdout and "bool = Maybe" in out.stdout


def test_make_patch_check_covers_every_real_series():
    # `make patch-check` itself, with this Python's launcher (the venv step skipped).
    from launcher.patching.series import available_versions

    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    env.pop("VLLM_SM12X_PATCHES", None)
    make = subprocess.run(
        ["make", "--no-print-directory", "patch-check", f"BIN={LAUNCHER.parent}", "-o", "venv", "-o", ".venv/.deps-stamp"],
        cwd=repo, capture_output=True, text=True, env=env, timeout=600,
    )
    assert make.returncode == 0, make.stdout + make.stderr
    checked = [line.split()[3] for line in make.stdout.splitlines() if line.startswith("patch check: vLLM ")]
    assert checked == available_versions() and {"0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.33.0"} <= set(checked)
    for version in checked:
        series = series_for(version)
        out = run("check", "--against", f"vllm=={version}")
        rows = [line.split()[:3] for line in out.stdout.splitlines()[2:-1]]
        assert rows == (
            [[p.id, "wheel", "applies"] for p in series.for_layout("site-packages")]
            + [[p.id, "sdist", "applies"] for p in series.for_layout("source")]
        )


def test_real_series_on_a_full_wheel_tree(tmp_path):
    # The whole released site-packages tree once, not just the touched files.
    root = tmp_path / "site-packages"
    shutil.copytree(pristine("0.21.0", "site-packages"), root, ignore=shutil.ignore_patterns(".complete"))
    before = snapshot(root)
    out = run("apply", "--target", str(root))
    assert out.returncode == 0, out.stderr
    assert (root / STAMP_REL).is_file()
    out = run("status", "--target", str(root), "--json")
    assert {p["state"] for p in json.loads(out.stdout)["patches"]} == {"applied"}
    out = run("revert", "--target", str(root))
    assert out.returncode == 0, out.stderr
    assert snapshot(root) == before


@pytest.mark.parametrize("args", [["apply", "--dry-run"], ["status"]])
def test_without_target_uses_the_installed_vllm(args):
    import importlib.util

    out = run(*args)
    spec = importlib.util.find_spec("vllm")
    if spec is None:
        # The test venv normally has no vLLM (nor a `vllm` on PATH): the default target must say so, not crash.
        assert out.returncode == 2
        assert "no vLLM found" in out.stderr and "--vllm-python" in out.stderr and "--target" in out.stderr
    else:
        assert str(Path(spec.submodule_search_locations[0]).parent) in out.stdout + out.stderr
