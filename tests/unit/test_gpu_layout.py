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


def test_the_vllm_plugins_find_the_harness_modules_they_load():
    # The oracle and step-time plugins load in vLLM's worker with only their own folder on the
    # path; they reach oracle.py and bench_steps.py in runs/ through gpu_paths
    import subprocess
    import sys

    code = ("import os, sys; sys.path[:0] = [sys.argv[1]]; import vllm_oracle; "
            "os.environ.update(ORACLE_PLAN='plan.json', ORACLE_RELEASE='0.21.0'); vllm_oracle.register(); "
            "import oracle; assert oracle.__file__.endswith('runs/oracle.py'), oracle.__file__")
    out = subprocess.run([sys.executable, "-c", code, str(GPU_DIR / "oracle_plugin")], capture_output=True,
                         text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    step_times = (GPU_DIR / "step_times" / "vllm_step_times.py").read_text()
    body = step_times[step_times.index("def attach("):]
    assert body.index("import gpu_paths") < body.index("import bench_steps")


def test_every_file_outside_the_groups_imports_gpu_paths_before_a_harness_module():
    # A file outside tests/unit (whose conftest puts the folders on the path for every test) that
    # imports a harness module by name must import gpu_paths first: pytest's GPU entry run alone,
    # the vLLM plugins, the integration probes.
    harness = {p.stem for p in GPU_DIR.glob("*/*.py")}
    tests = GPU_DIR.parents[0]
    files = [*GPU_DIR.glob("*.py"), *GPU_DIR.glob("*_plugin/*.py"), *(GPU_DIR / "step_times").glob("*.py"),
             *(tests / "integration").glob("*.py")]
    checked = 0
    for path in files:
        tree = ast.parse(path.read_text())
        seen_paths = False
        imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
        for node in sorted(imports, key=lambda n: n.lineno):  # in the file's order
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            if "gpu_paths" in names:
                seen_paths = True
            bare = [n for n in names if n in harness]
            if bare:
                checked += 1
                assert seen_paths, f"{path.relative_to(tests)}:{node.lineno} imports {bare} before gpu_paths"
    assert checked >= 5


def test_the_method_document_stays_a_method_document():
    # issue 52: what a reviewer needs in about 400 lines, no dated log (test_docs_narration covers
    # the phrases); a dated section heading would be the diary coming back
    lines = README.splitlines()
    assert len(lines) <= 400, f"tests/gpu/README.md has {len(lines)} lines"
    assert not [h for h in lines if h.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", h)]
