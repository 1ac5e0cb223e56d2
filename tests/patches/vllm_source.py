"""Load vLLM model classes from a tree's source, without importing vLLM, in this process.

``load(tree, rel)`` executes the module's own source; every name it imports
is bound to a ``Stub`` except the standard library (imported for real),
``torch`` (``TORCH`` below: real dtypes and ``torch.tensor``, stub modules)
and sibling modules loaded before (their real classes). So ``__init__`` and
plain methods run as written, while what needs vLLM's compiled code or a GPU
(layers, kernels, loaders) becomes a stub that accepts anything. Nothing is
registered in ``sys.modules``.

What this can show: which values the real code computes and passes on (an
embedding scale, a LogitsProcessor's soft cap, which class gets what). What
it cannot: anything a layer computes on a device.
"""

from __future__ import annotations

import __future__
import ast
import inspect
import sys
from pathlib import Path

import torch


class _ModuleBase:
    """What the classes use of torch.nn.Module: construction and register_buffer."""

    def __init__(self, *args, **kwargs):
        pass

    def register_buffer(self, name, value, persistent=True):
        setattr(self, name, value)


class Stub:
    """A stand-in for anything vLLM code imports that needs torch or a GPU.

    Attributes, calls and items give stubs; it is empty (no length, no
    items); called on one class or function it returns it (a decorator); as a
    base class it is a plain class with ``_ModuleBase``'s methods.
    """

    def __init__(self, name: str = "stub"):
        self._name = name

    def __getattr__(self, item: str) -> Stub:
        if item.startswith("__"):
            raise AttributeError(item)
        return Stub(f"{self._name}.{item}")

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (inspect.isclass(args[0]) or inspect.isfunction(args[0])):
            return args[0]
        return Stub(f"{self._name}()")

    def __getitem__(self, item) -> Stub:
        return Stub(f"{self._name}[]")

    def __len__(self) -> int:
        return 0

    def __iter__(self):
        return iter(())

    def __enter__(self) -> Stub:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def __mro_entries__(self, bases):
        return (type(self._name.rsplit(".", 1)[-1], (_ModuleBase,), {}),)

    def __or__(self, other):
        return self

    __ror__ = __or__

    def __repr__(self) -> str:
        return f"<stub {self._name}>"


def _namespace_stub(name: str, **known) -> Stub:
    """A stub with some real attributes; any other attribute is a stub."""
    stub = Stub(name)
    stub.__dict__.update(known)
    return stub


# Real torch (the CPU build of the test environment) for dtypes and small
# tensors, so values such as an embedding scale are rounded by torch itself;
# modules, kernels and device allocations stay stubs.
TORCH = _namespace_stub(
    "torch",
    **{name: getattr(torch, name) for name in ("bfloat16", "float16", "float32", "long", "tensor", "where")},
    nn=_namespace_stub("torch.nn", Module=_ModuleBase, ModuleList=lambda modules=(): list(modules)),
    compile=lambda fn, **kwargs: fn,
)


def _bindings(node: ast.Import | ast.ImportFrom, siblings: dict[str, dict]) -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            top = alias.name.split(".")[0]
            name = alias.asname or top
            if top == "torch":
                out[name] = TORCH
            elif top in sys.stdlib_module_names:
                out[name] = __import__(alias.name) if alias.asname is None else __import__(
                    alias.name, fromlist=["_"]
                )
            else:
                out[name] = Stub(alias.name)
        return out
    module = node.module or ""
    sibling = siblings.get(module) if node.level else None
    for alias in node.names:
        name = alias.asname or alias.name
        if sibling is not None and alias.name in sibling:
            out[name] = sibling[alias.name]
        elif node.level == 0 and module.split(".")[0] == "torch":
            out[name] = getattr(TORCH, alias.name, Stub(f"{module}.{alias.name}"))
        elif node.level == 0 and module.split(".")[0] in sys.stdlib_module_names:
            out[name] = getattr(__import__(module, fromlist=[alias.name]), alias.name)
        else:
            out[name] = Stub(f"{module}.{alias.name}")
    return out


def load(tree: Path, rel: str, siblings: dict[str, dict] | None = None,
         overrides: dict[str, object] | None = None) -> dict:
    """Execute ``tree/rel`` (a module of vllm/model_executor/models) and return its namespace.

    ``siblings`` maps relative module names (``qwen3_dflash``) to namespaces
    returned before, so ``from .qwen3_dflash import X`` gets the real class.
    ``overrides`` replace imported names before the module body runs (a
    stand-in base class, a decorator that must return what it wraps).
    """
    siblings = siblings or {}
    module = ast.parse((tree / rel).read_text(encoding="utf-8"))
    ns: dict[str, object] = {"__name__": rel.replace("/", ".").removesuffix(".py")}
    body = []
    for node in module.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            if not (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
                ns.update(_bindings(node, siblings))
        else:
            body.append(node)
    ns.update(overrides or {})
    code = compile(ast.Module(body=body, type_ignores=[]), str(tree / rel), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, ns)
    return ns
