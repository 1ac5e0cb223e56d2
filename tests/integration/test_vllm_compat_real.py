"""The env-var table checked against the real released vllm/envs.py files
(downloaded once from PyPI into the cache), for every release a recipe lists."""

from __future__ import annotations

import re

import pytest

from launcher import pypi, vllm_compat
from launcher import recipe as recipes
from launcher.plan import Request, resolve
from tests.unit.conftest import RTX5090, make_ctx

LISTED = [(v, name) for name in sorted(recipes.available()) for v in recipes.load(name).vllm_versions]
RELEASES = sorted({v for v, _ in LISTED}, key=vllm_compat.parse_version)


def _env_names(version: str) -> set[str]:
    text = (pypi.unpacked("vllm", version, "site-packages") / "vllm" / "envs.py").read_text()
    return set(re.findall(r'^\s*"(VLLM_[A-Z0-9_]+)":', text, re.M))


def test_the_recipes_list_the_releases_with_a_series():
    assert RELEASES == ["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.33.0"]


@pytest.mark.network
@pytest.mark.parametrize("version", RELEASES)
def test_lifetimes_match_release(version):
    names = _env_names(version)
    v = vllm_compat.parse_version(version)
    for name, life in vllm_compat.ENV_LIFETIMES.items():
        assert (name in names) == life.read_by(v), f"{name} in vLLM {version}"


@pytest.mark.network
@pytest.mark.parametrize(("version", "recipe"), LISTED, ids=[f"{r}-{v}" for v, r in LISTED])
def test_every_emitted_variable_and_flag_is_read_by_that_release(version, recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    names = _env_names(version)
    plan = resolve(Request(recipe, vllm_version=version), make_ctx(RTX5090, wsl=True))
    for key in plan.env:
        if key.startswith("VLLM_"):
            assert key in names, f"{key} is not read by vLLM {version}"
    flags = {a for a in plan.argv if a.startswith("--")}
    assert flags <= _defined_flags(version), f"flags vLLM {version} does not define: {flags - _defined_flags(version)}"
    for flag, literal in (("--moe-backend", "MoEBackend"), ("--linear-backend", "LinearBackend")):
        if flag in plan.argv:
            value = plan.argv[plan.argv.index(flag) + 1]
            assert value in _literal_values(version, literal), f"{flag} {value} is not a {literal} of vLLM {version}"


def _literal_values(version: str, name: str) -> set[str]:
    """The choices argparse offers for a backend flag: the Literal in vllm/config/kernel.py."""
    text = (pypi.unpacked("vllm", version, "site-packages") / "vllm" / "config" / "kernel.py").read_text()
    body = re.search(rf"^{name} = Literal\[(.*?)^\]", text, re.M | re.S)
    assert body, f"no {name} Literal in vLLM {version}'s config/kernel.py"
    return set(re.findall(r'"([a-z0-9_]+)"', body.group(1)))


def _defined_flags(version: str) -> set[str]:
    """vLLM derives most flags from EngineArgs / frontend dataclass fields and
    spells the rest out literally; either way the release defines them."""
    root = pypi.unpacked("vllm", version, "site-packages") / "vllm"
    text = "".join(p.read_text() for p in [root / "engine" / "arg_utils.py", *root.glob("entrypoints/**/cli_args.py")])
    fields = {"--" + f.replace("_", "-") for f in re.findall(r"^\s{4}([a-z_]+):", text, re.M)}
    return fields | set(re.findall(r'"(--[a-z0-9-]+)"', text))
