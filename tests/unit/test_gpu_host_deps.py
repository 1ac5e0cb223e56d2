"""remote.sh's host_deps: reports that run on the GPU host's plain Python and name the current
series import launcher.patching, whose one dependency that Python lacks is unidiff. host_deps
links it from an installed bundle into a folder of its own. Runs remote.sh's own function; the
bundle is a stand-in folder holding a package named unidiff and one named vllm (a GPU host's
bundle cannot exist here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FUNCTIONS = (ROOT / "tests" / "gpu" / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
PROBE = "import unidiff, sys; print(unidiff.__file__); import vllm"


def _run(tmp_path: Path, script: str, **env) -> subprocess.CompletedProcess:
    (tmp_path / "f.sh").write_text(FUNCTIONS + "\n" + script + "\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "WORK": str(tmp_path / "work"), "PY": sys.executable, "SITE": str(tmp_path / "site"),
        "SITE33": str(tmp_path / "site33"), **env}
    return subprocess.run(["bash", str(tmp_path / "f.sh")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)


def _bundle(site: Path) -> None:
    for pkg in ("unidiff", "vllm"):
        (site / pkg).mkdir(parents=True)
        (site / pkg / "__init__.py").write_text("")


def test_host_deps_puts_unidiff_alone_on_the_path(tmp_path):
    _bundle(tmp_path / "site33")  # only 0.33.0's bundle installed
    done = _run(tmp_path, f'host_deps; host_deps; echo "PP=$PYTHONPATH"; "$PY" -c "{PROBE}"')
    assert "PP=" + str(tmp_path / "work" / "host-deps") + "\n" in done.stdout  # once, after two calls
    assert str(tmp_path / "work" / "host-deps" / "unidiff") in done.stdout
    # the bundle's vLLM does not come with it
    assert done.returncode != 0 and "No module named 'vllm'" in done.stderr


def test_without_a_bundle_host_deps_changes_nothing_and_succeeds(tmp_path):
    done = _run(tmp_path, 'set -e; host_deps; echo "rc=$? PP=${PYTHONPATH:-unset}"')
    assert done.returncode == 0, done.stderr
    assert "rc=0 PP=unset" in done.stdout and not (tmp_path / "work" / "host-deps").exists()
