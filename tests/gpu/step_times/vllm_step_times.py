"""A vLLM general plugin that times a server's engine steps (issue 25, item 5).

`launcher bench` measures output tok/s through `vllm serve`; bench_report's projection needs
the step times behind it, measured in the same server: the target's step (verify) and the
drafter's ``propose``. This plugin attaches bench_steps.StepTimer to the model runner once its
model is loaded, in streaming mode (no device synchronisation), and appends one JSON line per
finished step to the file ``VLLM_STEP_TIMES`` names. Without that variable it does nothing.

vLLM loads ``vllm.general_plugins`` entry points in every process (API server, engine core,
workers); the runner exists only in the worker, so the wrap matters only there. The entry
point is declared by ``vllm_step_times-0.1.dist-info`` beside this file: putting this folder on
PYTHONPATH is the whole installation. Test harness only; nothing of it ships.
"""

from __future__ import annotations

import importlib.abc
import json
import os
import sys
from pathlib import Path

ENV = "VLLM_STEP_TIMES"
RUNNERS = ("vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner")


def register() -> None:
    if not os.environ.get(ENV):
        return
    for name in RUNNERS:
        if name in sys.modules:
            _wrap_runner(sys.modules[name])
    # Not imported yet (the usual case): wrap it when the worker imports it. Importing the
    # runner here would pull torch's CUDA side into the API server process, which forks.
    if not any(isinstance(f, _RunnerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _RunnerFinder())


def _wrap_runner(module) -> None:
    cls = getattr(module, "GPUModelRunner", None)
    if cls is not None and not getattr(cls.load_model, "_step_times", False):
        cls.load_model = _timed_load(cls.load_model, Path(os.environ[ENV]))


class _RunnerFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a runner module, it lets the other finders find it and
    wraps the loader so the class is patched right after the module runs."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in RUNNERS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _wrap_runner(module)


def _timed_load(load_model, path: Path):
    def load_model_then_time(self, *args, **kwargs):
        out = load_model(self, *args, **kwargs)
        attach(self, path)
        return out

    load_model_then_time._step_times = True
    return load_model_then_time


def attach(runner, path: Path):
    """A streaming StepTimer on ``runner``, its records appended to ``path`` (one per line)."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import gpu_paths  # noqa: F401  (tests/gpu/runs, where bench_steps.py lives, on the path)
    import bench_steps

    path.parent.mkdir(parents=True, exist_ok=True)

    def sink(records: list[dict]) -> None:
        with path.open("a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    timer = bench_steps.StepTimer(torch, runner, sink=sink)
    timer.active = True
    runner._step_timer = timer
    return timer
