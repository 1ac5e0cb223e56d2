"""The frozen step-time model (issue 53): its record, and the speed-up it predicts from that record alone.

The record (``results/speedup-frozen.json``) holds the step times measured on the full-size
random-weight checkpoint served by ``launcher serve`` (rtx5090 profile): the decode step without
a drafter at each concurrency, and for each speculative length K the verify step and the draft
step (``propose``) at each concurrency. ``speedup_frozen.py`` measures them on the GPU host;
``frozen_record`` builds the record from the step-time plugin's lines (``step_times/``), through
``speed.step_times`` (bench_report's medians over the steady steps).

The prediction is bars.yaml's speed formula, ``tau * T_decode / (T_draft + T_verify)``
(``bench_report.projected_speedup``), with the record's numbers for that K and concurrency: it is
never fitted to the measured curve. The predicted break-even is the acceptance length at which
that speed-up is 1: ``(T_draft + T_verify) / T_decode``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bench_report  # noqa: E402
import speed  # noqa: E402

KIND = "speedup-frozen"
KS = (3, 7, 15)
CONCURRENCY = (1, 4)
PROFILE = "rtx5090"
FORMULA = "tau * T_decode / (T_draft + T_verify)"


def server_label(k: int | None) -> str:
    """The frozen run's server for speculative length ``k`` (None: without a drafter)."""
    return "frozen-nodrafter" if k is None else f"frozen-k{k}"


def frozen_record(decode_steps: list[dict], verify_steps: dict[int, list[dict]], *, meta: dict,
                  ks=KS, concurrency=CONCURRENCY) -> dict:
    """The record from the step-time plugin's lines: ``decode_steps`` of the server without a
    drafter, ``verify_steps[K]`` of the DFlash server at K. ``meta``: series, date, gpu, vllm,
    bars (and anything else the run knows)."""
    decode, dflash = {}, {}
    for c in concurrency:
        d = speed.step_times(decode_steps, c, 0, False)
        decode[str(c)] = {**d, "period_ms": speed.step_period_ms(decode_steps, c)}
    for k in ks:
        steps = verify_steps.get(k) or []
        dflash[str(k)] = {}
        for c in concurrency:
            v = speed.step_times(steps, c, k, True)
            dflash[str(k)][str(c)] = {**v, "period_ms": speed.step_period_ms(steps, c * (k + 1))}
    return {"kind": KIND, **meta, "profile": meta.get("profile", PROFILE), "ks": list(ks),
            "concurrency": list(concurrency), "formula": FORMULA, "decode": decode, "dflash": dflash}


def missing(record: dict) -> list[str]:
    """What the record lacks for a prediction at every K and concurrency it names: empty when
    complete. A step time of None (no steady step was timed) counts as missing."""
    out = []
    for key in ("series", "date", "gpu", "vllm", "bars"):
        if not record.get(key):
            out.append(key)
    for c in record.get("concurrency", []):
        if not (record.get("decode", {}).get(str(c)) or {}).get("t_decode_ms"):
            out.append(f"decode c={c}")
    for k in record.get("ks", []):
        for c in record.get("concurrency", []):
            row = (record.get("dflash", {}).get(str(k)) or {}).get(str(c)) or {}
            for key in ("t_verify_ms", "t_draft_ms"):
                if row.get(key) is None:
                    out.append(f"{key[2:-3]} K={k} c={c}")
    return out


def times(record: dict, k: int, concurrency: int) -> tuple[float, float, float]:
    """(T_decode, T_draft, T_verify) in ms for K and concurrency; KeyError when not recorded."""
    decode = record["decode"][str(concurrency)]["t_decode_ms"]
    row = record["dflash"][str(k)][str(concurrency)]
    if None in (decode, row.get("t_draft_ms"), row.get("t_verify_ms")):
        raise KeyError(f"the frozen record has no step times for K={k} at concurrency {concurrency}")
    return decode, row["t_draft_ms"], row["t_verify_ms"]


def predict(record: dict, acceptance: float, k: int, concurrency: int) -> float:
    """The speed-up the frozen record predicts at mean acceptance length ``acceptance``."""
    decode, draft, verify = times(record, k, concurrency)
    return bench_report.projected_speedup(acceptance, decode, draft, verify)


def break_even(record: dict, k: int, concurrency: int) -> float:
    """The acceptance length at which the predicted speed-up is 1."""
    decode, draft, verify = times(record, k, concurrency)
    return (draft + verify) / decode
