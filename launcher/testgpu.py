"""``serve --test-gpu``: plan a recipe on a Hopper test GPU standing in for its sm_12x card.

No sm_120/sm_121 card is at hand for the project's GPU runs; an H100/H200
(sm_90) is. Hopper lacks FlashAttention 4 as sm_12x does, so vLLM picks
attention backends there as on an RTX 5090 or a DGX Spark. But a few recipe
knobs name FP4 kernels that exist only on Blackwell (sm_100 and later): vLLM
raises at model load on Hopper with them. ``--force`` would start anyway but
also hides every other blocking reason (a missing patch above all), so the
test GPU gets its own switch that changes exactly those knobs, says which
``--set`` items it implies, and leaves every other preflight check as it is.

What it changes, and only where the user did not ``--set`` the field:

* ``intent.moe_fp4_backend`` and ``intent.nvfp4_gemm_backend``: a Blackwell-only
  FP4 kernel (CUTLASS, FlashInfer) becomes ``marlin``, the weight-only FP4
  path vLLM runs on Hopper (``MarlinNvFp4LinearKernel``, the ``MARLIN`` NvFp4
  MoE backend; tests/gpu/README.md);
* ``serve.gpu_memory_utilization``: the profile's card budget (its memory x
  its fraction, e.g. 32 GiB x 0.80 on the rtx5090 profile) re-expressed as a
  fraction of the test GPU, so the KV pool, and with it how many requests of
  ``max_model_len`` fit, is what that card would get. ``max_model_len`` stays
  the profile's: the memory budget is what it was chosen for.

Not changed: FlashAttention's version. On Hopper FLASH_ATTN runs FA3 by
default where sm_12x runs FA2; a run that must use what sm_12x uses adds
``-- --attention-config.flash_attn_version 2`` (the hint says so; the dotted form
joins the recipe's own ``--attention-config.*`` keys instead of replacing them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from launcher.hardware import GpuInfo
from launcher.profiles import PROFILES

# The GPUs that may stand in, by compute capability: what the project's GPU proofs run on.
STAND_INS: dict[tuple[int, int], str] = {(9, 0): "Hopper"}

# FP4 kernels that need Blackwell's FP4 tensor cores; vLLM 0.21.0's NvFP4 oracles
# (fused_moe/oracle/nvfp4.py, kernels/linear) refuse them on sm_90.
BLACKWELL_ONLY_MOE = frozenset({"cutlass", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cutedsl"})
BLACKWELL_ONLY_GEMM = frozenset({"cutlass", "flashinfer_cutlass", "flashinfer_trtllm", "flashinfer_cudnn"})
HOPPER_FP4 = "marlin"

FA2_HINT = ("sm_12x runs FLASH_ATTN as FlashAttention 2, Hopper as FA3: add "
            "-- --attention-config.flash_attn_version 2 to run what sm_12x runs")


@dataclass
class StandIn:
    """What ``--test-gpu`` decided for one plan."""

    gpu: GpuInfo
    profile: str
    # (recipe field, value, why), applied like ``--set FIELD=VALUE`` before the user's own --set
    sets: list[tuple[str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def set_args(self) -> list[str]:
        return [f"--set {key}={value}" for key, value, _ in self.sets]

    def to_dict(self) -> dict:
        profile = PROFILES[self.profile]
        return {"gpu": self.gpu.name, "sm": self.gpu.sm, "memory_gib": self.gpu.memory_gib,
                "stands_in_for": f"{profile.name} ({profile.sm})",
                "sets": [f"{key}={value}" for key, value, _ in self.sets],
                "why": {key: why for key, _, why in self.sets}, "notes": list(self.notes)}

    def line(self) -> str:
        profile = PROFILES[self.profile]
        implied = " ".join(self.set_args) or "no --set (no sm_12x-only knob in this recipe)"
        return f"{self.gpu.name} ({self.gpu.sm}) stands in for {profile.name} ({profile.sm}): {implied}"


def can_stand_in(gpu: GpuInfo | None) -> bool:
    return gpu is not None and gpu.capability in STAND_INS


def stand_in(rec, profile: str, gpu: GpuInfo, user_fields: dict[str, str]) -> StandIn:
    """The knobs ``gpu`` needs to run ``rec`` as planned for ``profile`` (``rec`` with the
    user's --set applied; ``user_fields``: those --set items, which always win)."""
    out = StandIn(gpu, profile)
    intent = rec.intent
    if "intent.moe_fp4_backend" not in user_fields and intent.moe_fp4_backend in BLACKWELL_ONLY_MOE:
        out.sets.append(("intent.moe_fp4_backend", HOPPER_FP4,
                         f"--moe-backend {intent.moe_fp4_backend} is an FP4 MoE kernel for sm_100+; "
                         f"{gpu.sm} runs NVFP4 MoE on Marlin"))
    if "intent.nvfp4_gemm_backend" not in user_fields and intent.nvfp4_gemm_backend in BLACKWELL_ONLY_GEMM:
        out.sets.append(("intent.nvfp4_gemm_backend", HOPPER_FP4,
                         f"the {intent.nvfp4_gemm_backend} NVFP4 GEMM needs sm_100+; {gpu.sm} runs it on Marlin"))
    scaled = scaled_memory_fraction(rec, profile, gpu, user_fields, out.notes)
    if scaled is not None:
        out.sets.append(("serve.gpu_memory_utilization", scaled[0], scaled[1]))
    out.notes.append(FA2_HINT)
    return out


def scaled_memory_fraction(rec, profile: str, gpu: GpuInfo, user_fields: dict[str, str],
                           notes: list[str]) -> tuple[str, str] | None:
    """(value, why) of the fraction that gives ``gpu`` the profile's card budget; None to keep it."""
    if "serve.gpu_memory_utilization" in user_fields:
        return None
    card = PROFILES[profile]
    fraction = rec.profiles[profile].serve.gpu_memory_utilization or rec.serve.gpu_memory_utilization
    if fraction is None:
        notes.append(f"no gpu_memory_utilization in the recipe: vLLM's default fraction of {gpu.memory_gib:g} GiB")
        return None
    # The card's budget is its CUDA-reported total x the fraction, as vLLM computes it there.
    card_gib = card.cuda_total_gib
    budget = card_gib * fraction
    if gpu.memory_gib <= card_gib:
        notes.append(f"{gpu.name} has {gpu.memory_gib:g} GiB, no more than {card.name}'s {card_gib:.2f} GiB: "
                     f"gpu_memory_utilization stays {fraction:g}")
        return None
    # Rounded down: never more than the card would get.
    scaled = math.floor(budget / gpu.memory_gib * 1000) / 1000
    return (f"{scaled:g}", f"{card.name}'s budget {card_gib:.2f} GiB (what CUDA reports there) x {fraction:g} = "
                           f"{budget:.1f} GiB of this GPU's {gpu.memory_gib:g} GiB")
