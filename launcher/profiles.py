"""Hardware profiles: the consumer Blackwell machines the recipes are tuned for."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HardwareProfile:
    """One machine class. Recipes override serve settings per profile because a
    32 GB card and a 128 GB unified-memory Spark want different context
    lengths, batch sizes and memory fractions for the same model."""

    name: str
    description: str
    capability: tuple[int, int]
    memory_gib: float
    unified_memory: bool
    platform: str  # docker platform of the matching image
    # What cudaMemGetInfo reports as the total, in bytes: vLLM's gpu_memory_utilization is a
    # fraction of it, and it is less than the marketed size (the driver keeps some; the Spark's
    # OS shares its memory). A rehearsal on a larger GPU gives the recipe this x the fraction.
    cuda_total_bytes: int
    # Machines of this class serving one model together (vLLM's native multi-node:
    # launcher.multinode). Memory, context and batch stay per card: each node has one.
    nodes: int = 1

    @property
    def cuda_total_gib(self) -> float:
        return self.cuda_total_bytes / 2**30

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


PROFILES: dict[str, HardwareProfile] = {
    "rtx5090": HardwareProfile(
        name="rtx5090",
        description="GeForce RTX 5090, 32 GB GDDR7",
        capability=(12, 0),
        memory_gib=32.0,
        unified_memory=False,
        platform="linux/amd64",
        cuda_total_bytes=33_668_857_856,  # 31.36 GiB (nvidia-smi: 32607 MiB); tests/gpu/judging/memfit.py has the sources
    ),
    "dgx-spark": HardwareProfile(
        name="dgx-spark",
        description="DGX Spark GB10, 128 GB unified memory, arm64",
        capability=(12, 1),
        memory_gib=128.0,
        unified_memory=True,
        platform="linux/arm64",
        cuda_total_bytes=128_501_256_192,  # 119.68 GiB (121.69 on later DGX OS kernels: the smaller holds on both)
    ),
    "dgx-spark-x2": HardwareProfile(
        name="dgx-spark-x2",
        description="two DGX Spark GB10 linked by their ConnectX-7 QSFP ports, one model across both",
        capability=(12, 1),
        memory_gib=128.0,
        unified_memory=True,
        platform="linux/arm64",
        cuda_total_bytes=128_501_256_192,
        nodes=2,
    ),
}

DEFAULT_PROFILE = "rtx5090"


def profile_for_nodes(capability: tuple[int, int], nodes: int) -> HardwareProfile | None:
    """The profile of ``nodes`` machines of this card (dgx-spark-x2 for two GB10s)."""
    return next((p for p in PROFILES.values() if p.capability == capability and p.nodes == nodes), None)


def profile_for_capability(capability: tuple[int, int]) -> HardwareProfile | None:
    for profile in PROFILES.values():
        if profile.capability == capability and profile.nodes == 1:
            return profile
    return None
