"""``launcher patch ...`` (filled in by the patch engine work)."""

import typer

app = typer.Typer(no_args_is_help=True)
