"""``launcher build ...`` (filled in by the build-system work)."""

import typer

app = typer.Typer(no_args_is_help=True)
