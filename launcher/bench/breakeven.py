"""The drafter's measured break-even: where DFlash stops paying, read from the committed speed-up curve.

The speed-up curve (the GPU harness's ``tests/gpu/results/speedup-curve.json``) measures output
tok/s with and without the drafter against the acceptance vLLM reports, per speculative length K
and concurrency. Its report writes the break-even acceptance of each (release, K, concurrency)
into ``breakeven.json`` beside this module, so an installed launcher carries it. ``interpolate``
is how a break-even is read off the measured points: linear between the two measured points on
either side of a speed-up of 1, never extrapolated past the points measured.

Until a curve is committed the table has no rows, and ``advice`` says that no measured break-even
exists; it never puts a number in its place.
"""

from __future__ import annotations

import json
from pathlib import Path

TABLE = Path(__file__).with_name("breakeven.json")
MEASURED, GAINS, LOSES = "measured", "gains at every acceptance measured", "loses at every acceptance measured"


def interpolate(points: list[tuple[float, float]]) -> dict:
    """``points``: (measured acceptance length, speed-up) of one K and concurrency. The
    acceptance where the speed-up first rises through 1, linear between the two points around
    it; or, without a crossing, which side of 1 every point lies on (``acceptance`` None)."""
    pts = sorted((float(a), float(s)) for a, s in points)
    if not pts:
        raise ValueError("no measured points")
    out = {"measured_range": [pts[0][0], pts[-1][0]], "points": len(pts)}
    if pts[0][1] >= 1.0:
        return {**out, "status": GAINS, "acceptance": None}
    for (a0, s0), (a1, s1) in zip(pts, pts[1:]):
        if s0 < 1.0 <= s1:
            return {**out, "status": MEASURED, "acceptance": a0 + (1.0 - s0) * (a1 - a0) / (s1 - s0)}
    return {**out, "status": LOSES, "acceptance": None}


def load(path: Path | None = None) -> dict | None:
    """The table (``TABLE`` unless ``path``), or None when there is no measured row."""
    try:
        table = json.loads(Path(path or TABLE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) and table.get("rows") else None


def lookup(table: dict | None, k: int | None, concurrency: int, vllm: str | None = None) -> dict | None:
    """The row for this K and concurrency: the server's release where the curve has it, else the
    curve's first release (its main one). No row for another K or concurrency: a break-even is
    never carried over from one to another."""
    if not table or k is None:
        return None
    rows = [r for r in table["rows"] if r.get("k") == k and r.get("concurrency") == concurrency]
    same = [r for r in rows if vllm and r.get("vllm") == vllm]
    return (same or rows or [None])[0]


def advice(table: dict | None, *, k: int | None, concurrency: int, acceptance: float | None,
           speedup: float | None, vllm: str | None = None, workload: str | None = None) -> list[str]:
    """What ``launcher bench --compare-without-drafter`` says beside one comparison row;
    ``workload`` names the row where a bench ran several at the same K and concurrency."""
    where = f"{workload + ', ' if workload else ''}K={k if k is not None else '?'}, concurrency {concurrency}"
    acc = "-" if acceptance is None else f"{acceptance:.2f}"
    lines = []
    if speedup is not None and speedup < 1.0:
        lines.append(f"  {where}: the drafter made this workload slower ({speedup:.2f}x): it is a loss here; "
                     "`--set drafter=null` serves without it")
    if table is None:
        return lines + [f"  {where}: acceptance {acc}; no measured break-even exists yet "
                        "(no speed-up curve is committed)"]
    row = lookup(table, k, concurrency, vllm)
    if row is None:
        held = [r for r in table.get("left_out") or [] if r.get("k") == k and r.get("concurrency") == concurrency]
        if held:  # measured, but its break-even was not shown to be the drafter's own
            return lines + [f"  {where}: acceptance {acc}; the speed-up curve measured here states no break-even: "
                            f"{held[0].get('why')} (vLLM {held[0].get('vllm')})"]
        have = sorted({(r.get("k"), r.get("concurrency")) for r in table["rows"]})
        return lines + [f"  {where}: acceptance {acc}; the speed-up curve has no points here, so no measured "
                        f"break-even (it covers K, concurrency {', '.join(f'{a}/{b}' for a, b in have)})"]
    src = f"vLLM {row.get('vllm')} curve" + ("" if not vllm or row.get("vllm") == vllm else f", not {vllm}")
    lo, hi = row.get("measured_range") or [None, None]
    if row.get("status") == LOSES:
        return lines + [f"  {where}: acceptance {acc}; the drafter lost at every acceptance measured, up to "
                        f"{hi:.2f} ({src}): it is a loss here"]
    if row.get("status") == GAINS:
        return lines + [f"  {where}: acceptance {acc}; the drafter gained at every acceptance measured, down to "
                        f"{lo:.2f} ({src})" + ("" if acceptance is None or acceptance >= lo else
                                              ": this acceptance is below the curve, its break-even unknown")]
    be = row["acceptance"]
    if acceptance is None:
        return lines + [f"  {where}: measured break-even {be:.2f} ({src}); the server reported no acceptance"]
    if acceptance < be:
        return lines + [f"  {where}: acceptance {acc} is below the measured break-even {be:.2f} ({src}): "
                        "the drafter is a loss here; `--set drafter=null` serves without it"]
    return lines + [f"  {where}: acceptance {acc} is above the measured break-even {be:.2f} ({src})"]


def speculative_tokens(spec: dict | None) -> int | None:
    """K as the server ran it: draft tokens per draft in ``/metrics`` (None without drafts)."""
    if not spec or not spec.get("drafts"):
        return None
    return round(spec["draft_tokens"] / spec["drafts"])
