"""The env-var table checked against the real released vllm/envs.py files
(downloaded once from PyPI into the cache), for every release a recipe lists."""

from __future__ import annotations

import json
import re

import pytest

from launcher import pypi, vllm_compat
from launcher import recipe as recipes
from launcher.checks import resolve
from launcher.plan import B12X_MOE_FROM, Request
from tests.unit.conftest import RTX5090, make_ctx

LISTED = [(v, name) for name in sorted(recipes.available()) for v in recipes.load(name).vllm_versions]
RELEASES = sorted({v for v, _ in LISTED}, key=vllm_compat.parse_version)


def _env_names(version: str) -> set[str]:
    text = (pypi.unpacked("vllm", version, "site-packages") / "vllm" / "envs.py").read_text()
    return set(re.findall(r'^\s*"(VLLM_[A-Z0-9_]+)":', text, re.M))


def test_the_recipes_list_the_releases_with_a_series():
    assert RELEASES == ["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0"]


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
    # A dotted flag (--attention-config.backend_per_kind.sliding_window) is its config's flag.
    flags = {a.split(".", 1)[0] for a in plan.argv if a.startswith("--")}
    assert flags <= _defined_flags(version), f"flags vLLM {version} does not define: {flags - _defined_flags(version)}"
    for flag in (a for a in plan.argv if a.startswith("--attention-config.backend_per_kind.")):
        kind, backend = flag.rsplit(".", 1)[1], plan.argv[plan.argv.index(flag) + 1]
        _check_backend_per_kind(version, kind, backend)
    for flag, literal in (("--moe-backend", "MoEBackend"), ("--linear-backend", "LinearBackend")):
        if flag in plan.argv:
            value = plan.argv[plan.argv.index(flag) + 1]
            assert value in _literal_values(version, literal), f"{flag} {value} is not a {literal} of vLLM {version}"


def _check_backend_per_kind(version: str, kind: str, backend: str) -> None:
    """AttentionConfig has backend_per_kind, ``kind`` is a KVCacheSpecKind value and
    ``backend`` an AttentionBackendEnum member, as that release's validator parses them."""
    root = pypi.unpacked("vllm", version, "site-packages") / "vllm"
    assert re.search(r"^\s+backend_per_kind:", (root / "config" / "attention.py").read_text(), re.M)
    kinds = re.search(r"class KVCacheSpecKind\(.*?\):(.*?)\n\n", (root / "v1" / "kv_cache_interface.py").read_text(), re.S)
    assert f'"{kind}"' in kinds.group(1), f"{kind} is not a KVCacheSpecKind of vLLM {version}"
    registry = (root / "v1" / "attention" / "backends" / "registry.py").read_text()
    assert re.search(rf"^\s+{backend} = ", registry, re.M), f"{backend} is not an attention backend of vLLM {version}"


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


# --- recipe facts, read off the released files ---------------------------------

import ast  # noqa: E402
import functools  # noqa: E402
from types import SimpleNamespace  # noqa: E402

from launcher import recipe as recipes  # noqa: E402
from tests.unit.conftest import GB10  # noqa: E402

# Variables a recipe may set that vLLM does not read itself, and who does.
READ_OUTSIDE_VLLM: dict[str, str] = {}


@functools.lru_cache(maxsize=None)
def _release_text(version: str) -> str:
    root = pypi.unpacked("vllm", version, "site-packages") / "vllm"
    return "\n".join(p.read_text(errors="replace") for p in root.rglob("*.py"))


def _plans():
    for name in recipes.available():
        rec = recipes.load(name)
        for version in rec.vllm_versions:
            for gpu in (RTX5090, GB10):
                yield name, version, gpu


@pytest.mark.network
@pytest.mark.parametrize("name, version, gpu", list(_plans()))
def test_every_recipe_variable_is_read_by_the_release(name, version, gpu, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    plan = resolve(Request(name, vllm_version=version), make_ctx(gpu, wsl=True))
    text = _release_text(version)
    for key in plan.env:
        if key in READ_OUTSIDE_VLLM:
            continue
        assert f'"{key}"' in text, f"{name}: {key} is read by no file of vLLM {version}"


def _literal_values_in(path, name: str) -> set[str]:
    """The strings of ``name = Literal[...]`` in a released file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    raise AssertionError(f"{name} not found in {path}")


@pytest.mark.network
def test_moe_intent_renders_as_the_flag_0_21_0_reads_first(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    root = pypi.unpacked("vllm", "0.21.0", "site-packages") / "vllm"
    plan = resolve(Request("gemma4-moe-dflash", vllm_version="0.21.0"), make_ctx(RTX5090))
    assert plan.argv[plan.argv.index("--moe-backend") + 1] == "cutlass"
    assert "VLLM_USE_FLASHINFER_MOE_FP4" not in plan.env
    # Every intent value is a MoEBackend of 0.21.0's KernelConfig (what --moe-backend parses
    # into), except those the plan refuses before the release that has them (B12X_MOE_FROM).
    intents = set(recipes.MoeBackend.__args__) - {"auto"} - set(B12X_MOE_FROM)
    assert intents <= _literal_values_in(root / "config" / "kernel.py", "MoEBackend")
    # The NvFP4 oracle maps cutlass to vLLM's own CUTLASS kernels, and reads the
    # flag before VLLM_USE_FLASHINFER_MOE_FP4 (which only removes FlashInfer).
    oracle = (root / "model_executor" / "layers" / "fused_moe" / "oracle" / "nvfp4.py").read_text()
    assert '"cutlass": NvFp4MoeBackend.VLLM_CUTLASS' in oracle
    body = oracle[oracle.index("def select_nvfp4_moe_backend"):]
    assert 0 < body.index("runner_backend = config.moe_backend") < body.index('envs.is_set("VLLM_USE_FLASHINFER_MOE_FP4")')


def _release_capture_size(version: str):
    """0.21.0's own default-capture-size statements (VllmConfig._set_cudagraph_sizes), runnable."""
    source = (pypi.unpacked("vllm", version, "site-packages") / "vllm" / "config" / "vllm.py").read_text()
    func = next(n for n in ast.walk(ast.parse(source))
                if isinstance(n, ast.FunctionDef) and n.name == "_set_cudagraph_sizes")
    for parent in ast.walk(func):
        body = getattr(parent, "body", None)
        if not isinstance(body, list):
            continue
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "max_cudagraph_capture_size is None":
                # The default, then the max_num_batched_tokens cap (the next two statements).
                code = compile(ast.Module(body=[stmt, *body[i + 1:i + 3]], type_ignores=[]), "vllm.py", "exec")

                def capture(max_num_seqs, spec_tokens, max_num_batched_tokens, explicit=None):
                    spec = SimpleNamespace(num_speculative_tokens=spec_tokens) if spec_tokens else None
                    ns = {"self": SimpleNamespace(
                        speculative_config=spec,
                        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs,
                                                         max_num_batched_tokens=max_num_batched_tokens),
                        compilation_config=SimpleNamespace(max_cudagraph_capture_size=explicit)),
                        "max_cudagraph_capture_size": explicit, "min": min}
                    exec(code, ns)
                    return ns["max_cudagraph_capture_size"]
                return capture
    raise AssertionError("the default capture size statements moved in vllm/config/vllm.py")


@pytest.mark.network
@pytest.mark.parametrize("seqs, spec, tokens, explicit", [
    (22, 15, 32768, None), (48, 15, 32768, None), (48, 15, 32768, 768), (32, 0, 8192, None), (8, 15, 64, None),
])
def test_capture_rule_matches_0_21_0(seqs, spec, tokens, explicit):
    capture = _release_capture_size("0.21.0")(seqs, spec, tokens, explicit)
    covered = vllm_compat.cudagraph_decode_cover(vllm_compat.parse_version("0.21.0"), max_num_seqs=seqs,
                                                 speculative_tokens=spec, max_num_batched_tokens=tokens,
                                                 capture_size=explicit)
    assert covered == min(seqs, capture // (1 + spec))


@pytest.mark.network
@pytest.mark.parametrize("name", list(recipes.available()))
def test_every_profile_keeps_full_decode_batches_in_cuda_graphs_on_0_21_0(name, tmp_path, monkeypatch):
    monkeypatch.setenv("MODELS_DIR", str(tmp_path))
    capture = _release_capture_size("0.21.0")
    for gpu in (RTX5090, GB10):
        argv = resolve(Request(name, vllm_version="0.21.0"), make_ctx(gpu)).argv
        if "--enforce-eager" in argv:
            continue
        value = lambda flag: int(argv[argv.index(flag) + 1]) if flag in argv else None  # noqa: E731
        spec = json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] \
            if "--speculative-config" in argv else 0
        seqs = value("--max-num-seqs")
        size = capture(seqs, spec, value("--max-num-batched-tokens") or 8192, value("--max-cudagraph-capture-size"))
        assert seqs * (1 + spec) <= size, f"{name} on {gpu.name}: {seqs} x {1 + spec} tokens > {size} captured"


@pytest.mark.network
@pytest.mark.parametrize(("backend", "since"), sorted(B12X_MOE_FROM.items()))
def test_b12x_moe_backends_appear_in_the_release_the_plan_names(backend, since):
    before = [v for v in RELEASES if vllm_compat.parse_version(v) < vllm_compat.parse_version(since)][-1]
    assert backend in _literal_values(since, "MoEBackend")
    assert backend not in _literal_values(before, "MoEBackend")


@pytest.mark.network
def test_b12x_attention_appears_in_the_release_the_plan_names():
    from launcher.plan import B12X_ATTENTION_FROM

    def has_b12x(version: str) -> bool:
        registry = pypi.unpacked("vllm", version, "site-packages") / "vllm" / "v1" / "attention" / "backends" / "registry.py"
        return re.search(r"^\s+B12X = ", registry.read_text(), re.M) is not None

    assert has_b12x(B12X_ATTENTION_FROM) and not has_b12x("0.29.0")
