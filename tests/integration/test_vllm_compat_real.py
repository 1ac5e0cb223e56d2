"""The env-var table checked against the real released vllm/envs.py files
(downloaded once from PyPI into the cache)."""

from __future__ import annotations

import re

import pytest

from launcher import pypi, vllm_compat
from launcher.plan import Request, resolve
from tests.unit.conftest import RTX5090, make_ctx


def _env_names(version: str) -> set[str]:
    text = (pypi.unpacked("vllm", version, "site-packages") / "vllm" / "envs.py").read_text()
    return set(re.findall(r'^\s*"(VLLM_[A-Z0-9_]+)":', text, re.M))


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_lifetimes_match_release(version):
    names = _env_names(version)
    v = vllm_compat.parse_version(version)
    for name, life in vllm_compat.ENV_LIFETIMES.items():
        assert (name in names) == life.read_by(v), f"{name} in vLLM {version}"


@pytest.mark.network
@pytest.mark.parametrize("version", ["0.21.0", "0.33.0"])
def test_every_emitted_variable_and_flag_is_read_by_that_release(version, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    names = _env_names(version)
    plan = resolve(Request("gemma4-moe-dflash", vllm_version=version), make_ctx(RTX5090, wsl=True))
    for key in plan.env:
        if key.startswith("VLLM_"):
            assert key in names, f"{key} is not read by vLLM {version}"
    flags = {a for a in plan.argv if a.startswith("--")}
    assert flags <= _defined_flags(version), f"flags vLLM {version} does not define: {flags - _defined_flags(version)}"


def _defined_flags(version: str) -> set[str]:
    """vLLM derives most flags from EngineArgs / frontend dataclass fields and
    spells the rest out literally; either way the release defines them."""
    root = pypi.unpacked("vllm", version, "site-packages") / "vllm"
    text = "".join(p.read_text() for p in [root / "engine" / "arg_utils.py", *root.glob("entrypoints/**/cli_args.py")])
    fields = {"--" + f.replace("_", "-") for f in re.findall(r"^\s{4}([a-z_]+):", text, re.M)}
    return fields | set(re.findall(r'"(--[a-z0-9-]+)"', text))
