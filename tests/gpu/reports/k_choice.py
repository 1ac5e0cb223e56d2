"""Which speculative length K the measured speed-up curve favours, for a drafter's acceptance (issue 53).

A drafter's per-position acceptance ``a_i`` (the share of drafts whose position i was accepted,
as vLLM's ``/metrics`` counts it at K = 15) gives its mean acceptance length at a shorter K by
truncation, ``tau(K) = 1 + a_1 + ... + a_K``: a DFlash drafter proposes a block's positions in
one forward pass, so a shorter block drafts the same first K tokens. The curve measured at each
K then reads the speed-up at ``tau(K)`` (piecewise linear between measured points, nothing read
outside them), and the K with the highest speed-up is the one the curve favours for that drafter
and concurrency.

The profiles (``profiles``): this project's trained drafter, its per-position acceptance
measured in vLLM 0.33.0 (``results/acceptance.json``), and published mean acceptance lengths of
other drafters, for which no source gives positions: those are spread as a geometric profile
(each position accepted with the same conditional rate), which says so in its name.
"""

from __future__ import annotations

# The trained drafter's row of results/acceptance.json the first profile reads.
TRAINED_ROW = {"run": "v33-trained-dflash-trained-fa2-cg-bf16", "vllm": "0.33.0", "drafter_sha256": "4f7c6c17"}
# Published mean acceptance lengths at K = 15, with their sources (../shared/FACTS.md, issue 53).
PUBLISHED = (
    ("z-lab's drafter on an H100, mean 7.8 published", 7.8),
    ("a drafter trained briefly, code prompts: served check of issue 53, mean 2.32", 2.32),
)
PROFILE_K = 15


def tau(per_position: list[float], k: int) -> float:
    """Mean acceptance length at K from the rates of K = 15's positions (truncation)."""
    if k > len(per_position):
        raise ValueError(f"K = {k} is longer than the profile's {len(per_position)} positions")
    return 1.0 + sum(per_position[:k])


def geometric(mean: float, k: int = PROFILE_K) -> list[float]:
    """Per-position rates ``alpha ** i`` whose mean acceptance length at ``k`` is ``mean``."""
    if not 1.0 <= mean <= k + 1:
        raise ValueError(f"a mean acceptance length of {mean} is not in 1..{k + 1}")
    low, high = 0.0, 1.0
    for _ in range(100):  # bisection: the length grows with alpha
        alpha = (low + high) / 2
        if 1.0 + sum(alpha ** i for i in range(1, k + 1)) < mean:
            low = alpha
        else:
            high = alpha
    return [alpha ** i for i in range(1, k + 1)]


def speedup_at(points: list[tuple[float, float]], x: float) -> float | None:
    """The speed-up at acceptance ``x`` on measured (acceptance, speed-up) points, linear between
    the two around it; None outside the measured range."""
    pts = sorted(points)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    if pts and x == pts[0][0]:
        return pts[0][1]
    return None


def trained_profile(acceptance_rows: list[dict]) -> dict | None:
    """The trained drafter's per-position acceptance from ``results/acceptance.json``'s rows."""
    for row in acceptance_rows:
        if (row.get("run") == TRAINED_ROW["run"] and row.get("vllm") == TRAINED_ROW["vllm"]
                and str(row.get("drafter_sha256", "")).startswith(TRAINED_ROW["drafter_sha256"])):
            rates = (row.get("per_position") or {}).get("vllm")
            if rates:
                return {"name": f"this project's trained drafter {TRAINED_ROW['drafter_sha256']} (its held-out "
                                f"prompts, vLLM {TRAINED_ROW['vllm']}; results/acceptance.json)",
                        "per_position": list(rates), "geometric": False}
    return None


def profiles(acceptance_rows: list[dict]) -> list[dict]:
    out = [p for p in (trained_profile(acceptance_rows),) if p]
    out += [{"name": f"{name}, spread geometrically", "per_position": geometric(mean), "geometric": True}
            for name, mean in PUBLISHED]
    return out


def choose(rows: list[dict], vllm: str, concurrency: int, profile: dict, usable=lambda k: True,
           variant_of=lambda k: "base") -> dict:
    """For one profile and concurrency: tau and the curve's speed-up at each measured K whose curve
    is ``usable(k)`` (read on the points of ``variant_of(k)``: the oracle that holds there), and
    the best K: None unless two Ks' curves reach their tau (one K alone is no choice)."""
    per_k = {}
    for k in sorted({r["k"] for r in rows if r["vllm"] == vllm and r["concurrency"] == concurrency}):
        if not usable(k):
            continue
        pts = [(r["acceptance"], r["speedup"]) for r in rows if r["vllm"] == vllm and r["k"] == k
               and r["concurrency"] == concurrency and r["variant"] == variant_of(k)]
        t = tau(profile["per_position"], k)
        per_k[k] = {"tau": t, "speedup": speedup_at(pts, t)}
    read = {k: v["speedup"] for k, v in per_k.items() if v["speedup"] is not None}
    return {"profile": profile["name"], "concurrency": concurrency, "per_k": per_k,
            "best_k": max(read, key=read.get) if len(read) > 1 else None}


def table(rows: list[dict], vllm: str, acceptance_rows: list[dict], usable=lambda k, c: True,
          variant_of=lambda k, c: "base") -> list[dict]:
    """Every profile at every concurrency the curve measured on ``vllm``; ``usable(k, c)``: that
    K and concurrency's curve may be read (its oracle was shown to cost nothing there), on the
    points of ``variant_of(k, c)``."""
    cs = sorted({r["concurrency"] for r in rows if r["vllm"] == vllm})
    return [choose(rows, vllm, c, p, lambda k, c=c: usable(k, c), lambda k, c=c: variant_of(k, c))
            for p in profiles(acceptance_rows) for c in cs]
