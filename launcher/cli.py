"""The ``launcher`` console command: one typer app, one sub-app per concern.

Each sub-app lives beside the code it drives (``launcher.patching.cli``,
``launcher.builder.cli``, ...). Heavy imports (docker, NVML, torch) happen
inside commands so that ``serve --dry-run`` stays fast.
"""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from launcher.errors import LauncherError


class _Group(TyperGroup):
    """Turns a LauncherError anywhere below into one clear line and an exit code."""

    def invoke(self, ctx):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except LauncherError as exc:
            typer.echo(f"error: {exc.message}", err=True)
            if exc.hint:
                typer.echo(f"hint: {exc.hint}", err=True)
            raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=_Group,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="vLLM on consumer Blackwell (RTX 5090 sm_120, DGX Spark sm_121): recipes, patches, builds, images.",
)


def _register() -> None:
    from launcher import commands
    from launcher.bench.cli import register as register_bench
    from launcher.builder.cli import app as build_app
    from launcher.image_cli import app as image_app
    from launcher.models.cli import register as register_models
    from launcher.patching.cli import app as patch_app
    from launcher.quantize.cli import register as register_quantize

    commands.register(app)
    register_quantize(app)
    register_models(app)
    register_bench(app)
    app.add_typer(patch_app, name="patch", help="Apply, revert, inspect and check the vLLM patch series.")
    app.add_typer(build_app, name="build", help="Plan, preflight and build wheels for sm_120 / sm_121.")
    app.add_typer(image_app, name="image", help="An image's pinned inputs: manifest, labels, the entrypoint's preflight.")


_register()


def main() -> None:
    app(prog_name="launcher")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
