"""Caveats every results page states beside the rows they concern (one place, so reports agree)."""

from __future__ import annotations

TORCH_0_33_0 = (
    "> **vLLM 0.33.0 rows ran on torch 2.11.0+cu130**, the GPU host's torch, not the 2.14.0 that vLLM 0.33.0 "
    "pins: its compiled extensions resolve against 2.11, but inductor's generated kernels and torch's own "
    "kernels differ from what users of 0.33.0 run. A host whose torch is 2.14.0 reruns them with the same command."
)


def with_caveats(markdown: str) -> str:
    """``markdown`` with the torch caveat after its first paragraph that starts "Regenerate:",
    when a table row of the page is a vLLM 0.33.0 one."""
    if "| 0.33.0 |" not in markdown or TORCH_0_33_0 in markdown:
        return markdown
    lines = markdown.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("Regenerate:")), 0)
    return "\n".join([*lines[: at + 1], "", TORCH_0_33_0, *lines[at + 1:]])
