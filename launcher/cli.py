"""The ``launcher`` console command: one typer app, one sub-app per concern.

Each sub-app lives beside the code it drives (``launcher.patching.cli``,
``launcher.builder.cli``, ...). Heavy imports (docker, NVML, torch) happen
inside commands so that ``serve --dry-run`` stays fast.
"""

from __future__ import annotations

import sys


def _quiet_interrupt(exc_type, exc, tb, _default=sys.excepthook) -> None:
    """Ctrl-C before a command runs (the imports below take a moment) is one line, not a
    traceback; Python still exits by SIGINT, so the shell sees 130."""
    if issubclass(exc_type, KeyboardInterrupt):
        sys.stderr.write("error: interrupted (SIGINT) while starting; nothing was done\n")
        return
    _default(exc_type, exc, tb)


if sys.excepthook is sys.__excepthook__:  # never replace a hook someone else installed (pytest, IDEs)
    sys.excepthook = _quiet_interrupt
from pathlib import Path
from typing import Annotated, get_args, get_origin

import typer
from typer.core import TyperGroup

from launcher.errors import EXIT_CODES_TABLE, LauncherError


class _Group(TyperGroup):
    """Turns a LauncherError anywhere below into one clear line and an exit code,
    and gives every command below plain help (see ``_plain_help``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _plain_help(self)

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except LauncherError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            if exc.hint:
                typer.echo(f"hint: {exc.hint}", err=True)
            raise typer.Exit(exc.exit_code) from None
        except RecursionError:
            # JSON or YAML nested thousands deep, read somewhere without its own check: still one line.
            typer.echo("error: an input (a JSON or YAML file, or a --set value) is nested too deep to read", err=True)
            raise typer.Exit(2) from None


def _plain_help(command) -> None:
    """Help as click (and vLLM's argparse) prints it, for ``command`` and all below.

    Typer's rich panels put a type column (``<bool>``, ``<list[str]>``) beside
    every option, flags included, and at 80 columns the table cuts what does
    not fit with an ellipsis, long option names too. Plain help wraps instead;
    an option shows click's type name (TEXT, INTEGER, PATH), a flag none.
    """
    command.rich_markup_mode = None
    for param in command.params:
        kind = getattr(param, "param_type_name", "")
        if kind == "option" and param.metavar is None \
                and not (getattr(param, "is_flag", False) or getattr(param, "count", False)):
            param.metavar = _type_name(param)
        elif kind == "argument" and hasattr(param, "type_descriptor"):
            # typer >= 0.2x lists arguments with their annotation (``files... <list[Path]>``):
            # the name says enough.
            param.display_type_rich = lambda ctx: None
    for sub in getattr(command, "commands", {}).values():
        _plain_help(sub)


_TYPE_NAMES = {str: "TEXT", int: "INTEGER", float: "FLOAT", Path: "PATH"}


def _type_name(param) -> str:
    """An option's value type as click names it; typer >= 0.2x keeps the annotation, older typer a click type."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:
        return param.type.name.upper().removesuffix(" RANGE")
    annotation = descriptor.annotation
    if get_origin(annotation) is list:
        (annotation,) = get_args(annotation)
    return _TYPE_NAMES.get(annotation, "VALUE")


def _version(value: bool) -> None:
    if value:
        from launcher import __version__

        typer.echo(f"launcher {__version__}")
        raise typer.Exit()


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="vLLM on consumer Blackwell (RTX 5090 sm_120, DGX Spark sm_121): recipes, patches, builds, images.",
    # \b keeps click from re-flowing the table into one paragraph.
    epilog="\b\n" + EXIT_CODES_TABLE,
)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_version,
                                          help="Print the launcher version and exit.")] = False,
) -> None:
    """vLLM on consumer Blackwell (RTX 5090 sm_120, DGX Spark sm_121): recipes, patches, builds, images."""


def _register() -> None:
    from launcher import commands
    from launcher.bench.cli import register as register_bench
    from launcher.builder.cli import app as build_app
    from launcher.image_cli import app as image_app
    from launcher.models.cli import register as register_models
    from launcher.patching.cli import app as patch_app
    from launcher.quantize.cli import register as register_quantize
    from launcher.vllm_install import install_cmd

    commands.register(app)
    register_quantize(app)
    register_models(app)
    register_bench(app)
    app.command("install")(install_cmd)
    app.add_typer(patch_app, name="patch", help="Apply, revert, inspect and check the vLLM patch series.")
    app.add_typer(build_app, name="build", help="Plan, preflight and build wheels for sm_120 / sm_121.")
    app.add_typer(image_app, name="image", help="An image's pinned inputs: manifest, labels, the entrypoint's preflight.")


_register()


def main() -> None:
    app(prog_name="launcher")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
