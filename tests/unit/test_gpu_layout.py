"""The GPU harness's layout (issue 52): its Python grouped by concern in the folders gpu_paths.py
names, each module saying what it owns, and the method document's map matching the tree."""

from __future__ import annotations

import ast
import re

import gpu_paths

from tests.unit.gpu_scripts import GPU_DIR

README = (GPU_DIR / "README.md").read_text()
MAP = README[README.index("## The harness, by concern"):README.index("CPU tests of every pure part run in")]
# What stays at the top of tests/gpu: the path helper and pytest's entry
TOP = {"gpu_paths.py", "test_gpu_proof.py"}


def test_the_python_lives_in_the_group_folders():
    assert sorted(p.name for p in GPU_DIR.glob("*.py")) == sorted(TOP)
    folders = sorted(p.name for p in GPU_DIR.iterdir() if p.is_dir() and list(p.glob("*.py"))
                     and p.name not in ("oracle_plugin", "step_times"))
    assert folders == sorted(gpu_paths.GROUPS)


def test_every_module_says_in_its_first_line_what_it_owns():
    for path in GPU_DIR.glob("*/*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc and doc.splitlines()[0].strip(), f"{path.relative_to(GPU_DIR)}: no one-line docstring"


def test_the_map_puts_each_module_it_names_in_its_folder():
    named = 0
    for group, body in re.findall(r"- \*\*`(\w+)/`\*\*:(.*?)(?=\n- \*\*|\Z)", MAP, re.S):
        assert group in gpu_paths.GROUPS, group
        for module in re.findall(r"`(\w+)\.py`", body):
            assert (GPU_DIR / group / f"{module}.py").is_file(), f"the map puts {module}.py in {group}/"
            named += 1
    assert {g for g, _ in re.findall(r"- \*\*`(\w+)/`\*\*:(.*?)(?=\n- \*\*|\Z)", MAP, re.S)} == set(gpu_paths.GROUPS)
    assert named >= 40


def test_a_module_run_as_a_script_from_its_folder_imports_the_other_groups():
    # run as remote.sh runs them (python tests/gpu/<group>/x.py), with no tests/gpu on the path before
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(GPU_DIR / "reports" / "headline.py"), "--help"],
                         capture_output=True, text=True, cwd=GPU_DIR.parents[1] / "launcher")
    assert out.returncode == 0 and "ModuleNotFoundError" not in out.stderr, out.stderr
