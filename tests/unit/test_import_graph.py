"""The launcher's modules import one another without a cycle, lazy imports inside
functions included: dependencies point one way (recipe -> plan -> checks/runtime -> CLI).

Read from the sources with ``ast`` (every ``import``/``from`` node anywhere in a
module, ``if TYPE_CHECKING`` blocks too), not from ``sys.modules``: a lazy import
runs only when its function does, so importing the package would miss it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import launcher

PACKAGE = Path(launcher.__file__).resolve().parent


def module_files() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("launcher",) + path.relative_to(PACKAGE).with_suffix("").parts
        if "_data" in parts:
            continue
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``name`` imports (``from a import b`` gives a and a.b)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            found.add(source)
            found.update(f"{source}.{alias.name}" for alias in node.names)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the launcher modules it imports (a name resolves to its longest module prefix)."""
    files = module_files()
    graph = {}
    for name, path in files.items():
        deps = set()
        for dotted in imported_names(name, path):
            while dotted and dotted not in files:
                dotted = dotted.rpartition(".")[0]
            if dotted and dotted != name and dotted != "launcher":
                deps.add(dotted)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph.get(node, ())):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_lazy_and_relative_imports_and_reports_a_cycle(tmp_path):
    """The checker itself: a lazy import inside a function closes a cycle it must report."""
    mod = tmp_path / "m.py"
    mod.write_text("def f():\n    from launcher.cli import app\n    from . import sibling\n", encoding="utf-8")
    assert {"launcher.cli.app", "launcher.cli", "launcher", "launcher.sibling"} <= imported_names("launcher.m", mod)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_launcher_has_no_import_cycle():
    graph = import_graph()
    assert {"launcher.cli", "launcher.plan", "launcher.checks", "launcher.image"} <= set(graph)
    assert cycles(graph) == []


def test_lower_layers_do_not_import_the_ones_above():
    """recipe -> plan -> checks/runtime -> CLI: the two cycles of issue 29 were plan <-> checks
    and cli -> image_cli -> image -> cli."""
    graph = import_graph()
    assert "launcher.checks" not in graph["launcher.plan"]
    assert not {"launcher.plan", "launcher.checks", "launcher.cli"} & graph["launcher.recipe"]
    assert "launcher.cli" not in graph["launcher.image"]
    for name, deps in graph.items():
        if name not in ("launcher.cli", "launcher.__main__"):
            assert "launcher.cli" not in deps, f"{name} imports the CLI app"


def test_the_image_command_list_comes_from_the_running_cli_and_matches_the_entrypoint():
    """image.launcher_commands imported the CLI app (the cycle); the list now comes from the
    command tree that runs `image write-manifest`. docker/entrypoint.sh keeps its own list for
    images without the file: the two must agree."""
    import re

    import click
    import typer

    from launcher.cli import app
    from launcher.image_cli import launcher_commands

    root_cmd = typer.main.get_command(app)
    root = click.Context(root_cmd, info_name="launcher")
    image_ctx = click.Context(root_cmd.get_command(root, "image"), info_name="image", parent=root)
    names = launcher_commands(image_ctx)
    entrypoint = (PACKAGE.parent / "docker" / "entrypoint.sh").read_text(encoding="utf-8")
    listed = re.search(r"\n\s*(serve \|[^)]*)\) return 0", entrypoint).group(1)
    assert names == sorted(w.strip() for w in listed.split("|"))
