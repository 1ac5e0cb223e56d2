"""The resolved Plan: exactly what will run, for every runtime.

recipe + hardware + vLLM version + user overrides --resolve()--> Plan
Plan --> native runtime | docker runtime | --dry-run (print)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from launcher.preflight import Reason


@dataclass
class PatchState:
    """A patch the recipe needs, and whether the vLLM that will run has it."""

    id: str
    applied: bool | None  # None: unknown (vLLM not installed here, or runs in an image)
    detail: str = ""


@dataclass
class Plan:
    recipe: str
    profile: str
    profile_source: str  # "detected" | "default (no GPU detected)" | "--profile"
    vllm_version: str
    vllm_version_source: str  # "installed" | "--vllm-version" | "recipe default"
    runtime: str  # "native" | "docker"
    model: Path
    drafter: Path | None
    host: str
    port: int
    # Environment the plan sets for vLLM (merged over the process environment
    # by the native runtime; the whole container env for docker).
    env: dict[str, str] = field(default_factory=dict)
    # Where each env value came from: "recipe" | "environment" | "--set".
    env_sources: dict[str, str] = field(default_factory=dict)
    # Variables to remove from the inherited environment (stale for this vLLM).
    env_unset: list[str] = field(default_factory=list)
    # The vLLM command line, starting with "vllm", "serve".
    argv: list[str] = field(default_factory=list)
    api_key: str | None = None  # passed as VLLM_API_KEY, never on argv, never printed
    image: str | None = None  # docker runtime: the image to run
    patches: list[PatchState] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)

    @property
    def blocking(self) -> list[Reason]:
        return [r for r in self.reasons if r.blocking]
