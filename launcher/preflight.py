"""Preflight reasons: why a plan would (or would not) start for real.

Every check in the project (hardware, installed vLLM, patches, checkpoint,
drafter, docker) reports ``Reason`` objects; ``serve`` refuses to start when
any is blocking (unless ``--force``), and ``serve --dry-run`` prints them all
and exits non-zero if any is blocking.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    """One finding. ``area`` groups findings in the printed verdict."""

    area: str  # hardware | vllm | patches | checkpoint | drafter | docker | environment | recipe
    message: str
    blocking: bool = True
    hint: str | None = None

    def line(self) -> str:
        tag = "BLOCK" if self.blocking else "warn "
        text = f"[{tag}] {self.area}: {self.message}"
        if self.hint:
            text += f" ({self.hint})"
        return text


def blocking(reasons: list[Reason]) -> list[Reason]:
    return [r for r in reasons if r.blocking]
