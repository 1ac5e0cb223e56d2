"""Top-level commands: serve, doctor, recipes, version (filled in by the launcher work)."""


def register(app) -> None:
    pass
