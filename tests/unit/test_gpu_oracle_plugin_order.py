"""The oracle plugin installs its hooks after the module they patch has run whole (issue 53).

On vLLM 0.21.0, ``vllm/v1/worker/gpu_model_runner.py`` imports ``vllm.v1.spec_decode.dflash``
near its top and defines ``GPUModelRunner`` further down. A plugin that installed as soon as
the proposer's module loaded read ``GPUModelRunner`` from a half-loaded runner module and broke
the worker's import. vLLM itself cannot be imported here without its torch build, so a stand-in
package with 0.21.0's import order (module names, class and method names as the hook names them)
takes its place; the plugin and oracle.py are the real ones, and the order the stand-in copies is
checked against the released 0.21.0 source.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.unit.gpu_scripts import script

PLUGIN = Path(script("oracle")).resolve().parents[1] / "oracle_plugin"

STAND_IN = {
    "vllm/__init__.py": '__version__ = "0.21.0"\n',
    "vllm/v1/__init__.py": "",
    "vllm/v1/spec_decode/__init__.py": "",
    "vllm/v1/spec_decode/dflash.py": textwrap.dedent("""
        class DFlashProposer:
            def propose(self, target_token_ids, next_token_ids, common_attn_metadata,
                        num_rejected_tokens_gpu=None):
                return "drafted"
        """),
    "vllm/v1/worker/__init__.py": "",
    # 0.21.0's order: the proposer's module first, the runner class after it
    "vllm/v1/worker/gpu_model_runner.py": textwrap.dedent("""
        from vllm.v1.spec_decode.dflash import DFlashProposer

        class GPUModelRunner:
            def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
                return None
        """),
}

PROBE = textwrap.dedent("""
    import sys
    import vllm_oracle
    vllm_oracle.register()
    import vllm.v1.worker.gpu_model_runner as runner
    from vllm.v1.spec_decode.dflash import DFlashProposer
    print(getattr(runner.GPUModelRunner, "_hooks_hands_runner", False),
          DFlashProposer.propose.__qualname__)
    """)


def test_the_plugin_hooks_0_21_0_after_the_runner_module_has_run(tmp_path):
    for rel, text in STAND_IN.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    sys.path.insert(0, str(PLUGIN.parent / "runs"))
    try:
        import oracle
    finally:
        sys.path.pop(0)
    plan = tmp_path / "plan.json"
    oracle.make_plan_file(plan, [[5, 6, 7]], [[8, 9, 10, 11, 12]], [2], 100, k=3)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{PLUGIN}", "ORACLE_PLAN": str(plan),
           "ORACLE_LOG": "off", "ORACLE_RELEASE": "0.21.0"}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    handed, qualname = proc.stdout.split()
    # the runner hands itself to its drafter, and the proposer's propose is the oracle's
    assert handed == "True"
    assert qualname != "DFlashProposer.propose", json.dumps(proc.stdout)


def test_the_stand_in_has_the_released_runner_modules_import_order():
    # The released 0.21.0 tree (downloaded and cached as the patch tests get it): its runner
    # module imports the proposer's module at the top and defines GPUModelRunner after it.
    from tests.integration.patch_trees import pristine

    sys.path.insert(0, str(PLUGIN.parent / "runs"))
    try:
        import oracle
    finally:
        sys.path.pop(0)
    hook = oracle.HOOKS["0.21.0"]
    runner = pristine("0.21.0", "site-packages") / Path(*hook["runner_module"].split(".")).with_suffix(".py")
    body = ast.parse(runner.read_text()).body
    imports = [n.lineno for n in body if isinstance(n, ast.ImportFrom) and n.module == hook["proposer_module"]]
    classes = [n.lineno for n in body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner"]
    assert imports and classes and imports[0] < classes[0]
    stand_in = ast.parse(STAND_IN["vllm/v1/worker/gpu_model_runner.py"]).body
    assert isinstance(stand_in[0], ast.ImportFrom) and stand_in[0].module == hook["proposer_module"]
