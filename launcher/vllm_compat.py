"""What each vLLM release reads: env vars that came and went, kernel flags.

Read off the released ``vllm/envs.py`` and ``vllm/engine/arg_utils.py`` of
0.21.0 – 0.33.0 on PyPI (tests/integration/test_vllm_compat_real.py re-checks
this table against the real 0.21.0 and 0.33.0 files). A recipe states intent
(``Intent``); this module turns it into what the target version reads, and
never emits a variable that version ignores: 0.33.0 only logs "Unknown vLLM
environment variable detected" for a stale one, so a stale recipe would
silently lose its setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from launcher.errors import LauncherError


def parse_version(text: str) -> Version:
    """The public version (``0.21.0+cu132`` from a Windows wheel is 0.21.0)."""
    try:
        return Version(Version(text).public)
    except InvalidVersion as exc:
        raise LauncherError(f"not a vLLM version: {text!r}", hint="use a release number such as 0.21.0") from exc


def newest(releases) -> str:
    """The newest of ``releases`` by version order (0.10.0 after 0.9.1), as given."""
    return max(releases, key=parse_version)


def nearest_release(version: Version | str, releases) -> str:
    """The release in ``releases`` closest to ``version``: fewest minor
    releases away, then fewest patch releases; a tie goes to the newer one
    (later releases carry more of the fixes upstream)."""
    wanted = parse_version(str(version))

    def distance(candidate: str):
        have = parse_version(candidate)
        minor = lambda v: v.major * 1000 + v.minor  # noqa: E731
        return (abs(minor(have) - minor(wanted)), abs(have.micro - wanted.micro), -minor(have), -have.micro)

    if not releases:
        raise LauncherError("no supported vLLM release to compare with")
    return min(releases, key=distance)


@dataclass(frozen=True)
class EnvLifetime:
    """The releases that read an env var: [added, removed)."""

    added: str | None = None
    removed: str | None = None
    replacement: str = ""

    def read_by(self, version: Version) -> bool:
        if self.added and version < Version(self.added):
            return False
        if self.removed and version >= Version(self.removed):
            return False
        return True


ENV_LIFETIMES: dict[str, EnvLifetime] = {
    "VLLM_USE_FLASHINFER_MOE_FP4": EnvLifetime(
        removed="0.24.0", replacement="--moe-backend (recipe field intent.moe_fp4_backend)"
    ),
    "VLLM_FLASHINFER_MOE_BACKEND": EnvLifetime(
        removed="0.24.0", replacement="--moe-backend (recipe field intent.moe_fp4_backend)"
    ),
    "VLLM_NVFP4_GEMM_BACKEND": EnvLifetime(
        removed="0.24.0", replacement="--linear-backend (recipe field intent.nvfp4_gemm_backend)"
    ),
    "VLLM_TEST_FORCE_FP8_MARLIN": EnvLifetime(
        removed="0.29.0", replacement="--linear-backend marlin / --moe-backend marlin"
    ),
    # WSL2: pinned memory is opt-in from 0.24.0; the V2 runner needs it (UVA),
    # else "RuntimeError: UVA is not available" (vLLM #47387).
    "VLLM_WSL2_ENABLE_PIN_MEMORY": EnvLifetime(added="0.24.0"),
}

# --moe-backend exists from 0.21.0 (0.21.0 reads both it and the env vars,
# the flag first); --linear-backend arrives with the env var removals in 0.24.0.
LINEAR_BACKEND_FLAG_SINCE = Version("0.24.0")
MOE_BACKEND_FLAG_SINCE = Version("0.21.0")
ENV_KNOBS_UNTIL = Version("0.24.0")


def env_read_by(name: str, version: Version) -> bool:
    """True unless ``name`` is known to be ignored by ``version``."""
    life = ENV_LIFETIMES.get(name)
    return life is None or life.read_by(version)


def stale_replacement(name: str, version: Version) -> str | None:
    """For a variable ``version`` no longer reads: what replaced it."""
    life = ENV_LIFETIMES.get(name)
    if life is None or life.read_by(version) or not life.removed:
        return None
    return life.replacement or "nothing"


@dataclass(frozen=True)
class RenderedIntent:
    env: dict[str, str]
    args: list[str]
    notes: list[str]


# intent value -> VLLM_NVFP4_GEMM_BACKEND value (0.21.x spells it with dashes)
_GEMM_ENV = {
    "cutlass": "cutlass",
    "flashinfer_cutlass": "flashinfer-cutlass",
    "flashinfer_trtllm": "flashinfer-trtllm",
    "flashinfer_cudnn": "flashinfer-cudnn",
    "marlin": "marlin",
    "emulation": "emulation",
}


def render_intent(intent, version: Version) -> RenderedIntent:
    """Turn a recipe's ``Intent`` into env vars and flags that ``version`` reads."""
    env: dict[str, str] = {}
    args: list[str] = []
    notes: list[str] = []
    _render_moe(intent.moe_fp4_backend, version, env, args)
    _render_gemm(intent.nvfp4_gemm_backend, version, env, args)
    if intent.force_fp8_marlin is not None:
        if env_read_by("VLLM_TEST_FORCE_FP8_MARLIN", version):
            env["VLLM_TEST_FORCE_FP8_MARLIN"] = "1" if intent.force_fp8_marlin else "0"
        elif intent.force_fp8_marlin:
            notes.append(
                f"intent.force_fp8_marlin has no switch in vLLM {version} (VLLM_TEST_FORCE_FP8_MARLIN "
                "was removed in 0.29.0); choose marlin through intent.moe_fp4_backend / nvfp4_gemm_backend"
            )
    if intent.sampler != "auto":
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "1" if intent.sampler == "flashinfer" else "0"
    if intent.allow_long_max_model_len:
        env["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    _render_attention_per_kind(intent.attention_per_kind, version, args, notes)
    return RenderedIntent(env, args, notes)


# AttentionConfig.backend_per_kind (vllm/config/attention.py) first appears in 0.29.0.
BACKEND_PER_KIND_SINCE = Version("0.29.0")


def _render_attention_per_kind(per_kind: dict[str, str], version: Version, args: list[str],
                               notes: list[str]) -> None:
    if not per_kind:
        return
    if version < BACKEND_PER_KIND_SINCE:
        notes.append(
            f"intent.attention_per_kind has no knob in vLLM {version} (AttentionConfig.backend_per_kind "
            f"from {BACKEND_PER_KIND_SINCE}); the recipe's patches choose the backends there"
        )
        return
    # Dotted keys: vLLM merges every --attention-config.X into one config, so a
    # user's own --attention-config.flash_attn_version 2 joins them instead of
    # replacing them.
    for kind, backend in sorted(per_kind.items()):
        args += [f"--attention-config.backend_per_kind.{kind}", backend.upper()]


def _render_moe(backend: str, version: Version, env: dict[str, str], args: list[str]) -> None:
    if backend == "auto":
        return
    if version >= MOE_BACKEND_FLAG_SINCE:
        # The flag names the backend; 0.21.0's NvFP4 oracle (select_nvfp4_moe_backend)
        # takes it before any env var. VLLM_USE_FLASHINFER_MOE_FP4=0 only struck
        # FlashInfer off the list, leaving the choice to whatever came next.
        args += ["--moe-backend", backend]
    elif backend == "cutlass":
        # Before the flag: strike FlashInfer off, the closest these releases come.
        env["VLLM_USE_FLASHINFER_MOE_FP4"] = "0"
    elif backend == "flashinfer_cutlass":
        env["VLLM_USE_FLASHINFER_MOE_FP4"] = "1"
        env["VLLM_FLASHINFER_MOE_BACKEND"] = "throughput"
    elif backend == "flashinfer_trtllm":
        env["VLLM_USE_FLASHINFER_MOE_FP4"] = "1"
        env["VLLM_FLASHINFER_MOE_BACKEND"] = "latency"
    else:
        raise LauncherError(f"vLLM {version} has no way to choose the MoE backend {backend!r}")


# Read off 0.21.0's VllmConfig._set_cudagraph_sizes: without an explicit
# max_cudagraph_capture_size the largest captured batch is
# min(max_num_seqs * (1 + num_speculative_tokens) * 2, 512) tokens, capped by
# max_num_batched_tokens; a decode step wider than that runs eagerly. 0.33.0
# appends the uniform decode sizes (max_num_seqs x query length) instead;
# releases in between are held to the 0.21.0 rule (not checked one by one).
DECODE_SIZES_APPENDED_SINCE = Version("0.33.0")
DEFAULT_MAX_GRAPH_TOKENS = 512


def cudagraph_decode_cover(version: Version, *, max_num_seqs: int, speculative_tokens: int,
                           max_num_batched_tokens: int | None, capture_size: int | None) -> int:
    """How many requests' decode step still fits the largest CUDA graph ``version`` captures."""
    query = 1 + speculative_tokens
    if capture_size is None:
        if version >= DECODE_SIZES_APPENDED_SINCE:
            return max_num_seqs
        capture_size = min(max_num_seqs * query * 2, DEFAULT_MAX_GRAPH_TOKENS)
    if max_num_batched_tokens is not None:
        capture_size = min(capture_size, max_num_batched_tokens)
    return min(max_num_seqs, capture_size // query)


def _render_gemm(backend: str, version: Version, env: dict[str, str], args: list[str]) -> None:
    if backend == "auto":
        return
    if version < ENV_KNOBS_UNTIL:
        env["VLLM_NVFP4_GEMM_BACKEND"] = _GEMM_ENV[backend]
    else:
        args += ["--linear-backend", backend]
