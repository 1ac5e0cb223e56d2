"""A newcomer's first steps, as the README gives them (issue 29.3): the launcher is
installed before the first `launcher` command, and no text names a PyPI package
that does not exist (the launcher installs from a checkout)."""

from __future__ import annotations

import re
from pathlib import Path

import launcher
from launcher.quantize.config import install_hint

REPO = Path(launcher.__file__).resolve().parents[1]


def _first_block(readme: str, heading: str) -> list[str]:
    section = readme.split(heading, 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_readme_installs_the_launcher_before_its_first_launcher_command():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = _first_block(readme, "## From nothing to a served model")
    first_launcher = next(i for i, c in enumerate(commands) if c.startswith("launcher "))
    installs = commands[:first_launcher]
    assert any("make venv" in c or "pip install" in c for c in installs), commands
    assert any("activate" in c for c in installs), "the bare `launcher` below needs .venv/bin on PATH"
    # What `make venv` does is what the README says it does: an editable install into .venv/.
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^venv: \$\(STAMP\)$", makefile, re.M) and "$(BIN)/python -m pip install -q -e ." in makefile
    assert '"launcher.cli:main"' in (REPO / "pyproject.toml").read_text(encoding="utf-8")


def test_no_text_sends_users_to_a_pypi_package_that_does_not_exist():
    texts = [REPO / "README.md", *sorted((REPO / "launcher").rglob("*.py"))]
    offenders = [str(p.relative_to(REPO)) for p in texts
                 if re.search(r"pip install\s+'?vllm-sm12x-launcher", p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_the_quantize_extra_hint_installs_from_this_checkout():
    assert install_hint() == f"pip install -e '{REPO}[quantize]'"


def test_the_quickstart_installs_a_patched_vllm_before_serving():
    """Issue 57, item 1: venv -> launcher install -> models pull -> serve; each command runs as written."""
    from typer.testing import CliRunner

    from launcher.cli import app

    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = [c for c in _first_block(readme, "## From nothing to a served model") if c.startswith("launcher ")]
    order = [c.split()[1] for c in commands]
    assert order.index("install") < order.index("models") < order.index("serve"), commands
    for command in commands[:order.index("serve") + 1]:
        args = command.split()[1:]
        res = CliRunner().invoke(app, [*args, "--dry-run"])
        assert res.exit_code == 0, (command, res.output)
