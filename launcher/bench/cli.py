import typer


def register(root: typer.Typer) -> None:
    pass
