"""A vLLM general plugin that installs the oracle proposer (tests/gpu/runs/oracle.py) in a served vLLM.

vLLM loads ``vllm.general_plugins`` entry points in every process; the drafter's module is
imported only in the worker. So nothing is imported here: when ``ORACLE_PLAN`` is set, a finder
waits for the release's proposer module (``oracle.HOOKS``) and installs the oracle right after
that module runs. ``ORACLE_RELEASE`` names the release (else ``vllm.__version__``);
``ORACLE_LOG`` the log file, or ``off`` while timing. The entry point is declared by
``vllm_oracle-0.1.dist-info`` beside this file: putting this folder on PYTHONPATH installs it.
Test harness only; nothing of it ships.
"""

from __future__ import annotations

import importlib.abc
import os
import sys
from pathlib import Path


def register() -> None:
    plan = os.environ.get("ORACLE_PLAN")
    if not plan:
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import gpu_paths  # noqa: F401  (tests/gpu/runs, where oracle.py lives, on the path)
    import oracle

    release = os.environ.get("ORACLE_RELEASE")
    if not release:
        import vllm

        release = vllm.__version__
    hook = oracle.HOOKS[release]
    # Install once the module that defines what the hook patches has run whole: on 0.21.0 the
    # runner module imports the proposer's before it defines GPUModelRunner, so waiting for the
    # proposer's module would patch a half-loaded runner module.
    module = hook.get("runner_module") or hook["proposer_module"]
    if module in sys.modules:
        oracle.install(release, plan)
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder(module, lambda: oracle.install(release, plan)))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for ``module`` it lets the other finders find it and wraps the
    loader so that ``then`` runs right after the module does."""

    def __init__(self, module: str, then):
        self.module, self.then = module, then

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, self.then)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, then):
        self.loader, self.then = loader, then

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.then()
