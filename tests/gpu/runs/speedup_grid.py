"""The speed-up curve's grid (issue 53): its points, each point's oracle pattern and prompts, and the batches.

A point is one (vLLM release, speculative length K, concurrency, planned acceptance level,
variant) measured twice on the same prompts: without the drafter (the baseline) and with the
drafter whose proposals the oracle proposer (``oracle.py``) replaces so that the mean acceptance
length comes out near the planned level. The level is planned, never plotted: the curve's x-axis
is the acceptance vLLM's ``/metrics`` counters measure.

The grid (``GRID``): on patched 0.33.0, K = 3, 7 and 15, each at concurrency 1 and 4, at levels
from 1 up to K + 1 (``LEVELS``: at least four each, denser where the break-even lies); on 0.21.0
one K (15) at concurrency 1 (``SPOT_LEVELS``); and two variants of 0.33.0's K = 15, c = 1 point at
level 2.5: ``logprobs`` (every request asks for two logprobs) and ``long`` (prompts of
``LONG_INPUT`` tokens).

A second oracle, set before it ran (``TAIL_POINTS``, variant ``dtail``): at concurrency 4 the
oracle's cost against the real drafter was over its bar at K = 7 and 15 with the reference's
tokens past a proposal's first wrong position, and so was it at K = 3, concurrency 1
(``TAIL_CELLS``). The ``dtail`` points keep the real drafter's tokens there (the oracle's ``tail:
drafter``), so a verify step differs from the real drafter's only in the positions that set
acceptance; they run with the gather as a CUDA graph (``oracle_graph``), which the plain points
before it did not have. They share the plain points' prompts and references, and their baselines
where those were measured on the GPU of the dtail point's DFlash run (else the server without the
drafter measures one there); they have a control of their own (the same bar), and are not part of
the grid a record must hold.

A level L is made by the first-wrong pattern ``f_cycle(L)``: a proposal whose first wrong draft
is at position f is accepted for f tokens, and the step emits f + 1; the pattern repeats the
positions whose mean plus one is L (2.5: f = 1, 2, 1, 2, ...).

Batches: the work splits by server, each batch one server start, in the order the points need
them: per release the server without the drafter first (baselines, and with ``--refs-from
nodrafter`` the reference continuations the oracle needs), then the DFlash servers, the recipes'
K first (``K_ORDER``), so a run cut by its deadline has measured what the recipes use. A batch runs
as long as its points take: the record is saved after every point, so a batch cut short loses at
most the point it was on and a rerun measures only what is missing.
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
import bars  # noqa: E402

MAIN_VLLM = "0.33.0"
SPOT_VLLM = "0.21.0"
KS = (3, 7, 15)
K_ORDER = (15, 7, 3)  # the DFlash batches' order: the recipes' K (15) first
CONCURRENCY = (1, 4)
LEVELS = {3: (1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
          7: (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0),
          15: (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)}
SPOT_K = 15
SPOT_LEVELS = (1.0, 1.5, 2.5, 4.0, 8.0)  # 1.0: the oracle's cost against the real drafter
VARIANT_LEVEL = 2.5
MIN_REQUESTS = bars.get("speedup_curve", "min_requests")
MIN_LEVELS = bars.get("speedup_curve", "min_levels")
INPUT_LEN = 1024
LONG_INPUT = 2048
OUTPUT_LEN = 256
LOGPROBS = 2
# With references from it, the server without the drafter measures most (a baseline and a
# reference continuation per point, about a minute each at 32 requests of 256 tokens): a
# release's points split into up to
# this many batches, one for each lane of a host of two GPUs, by whole K (a K's DFlash server then
# needs the references of one batch alone), where there are at least MIN_SPLIT points a batch.
# A server start on 0.33.0 takes 4 to 7 minutes (results/speedup-frozen/): batches are as few as
# the lanes allow.
NODRAFTER_BATCHES = 2
MIN_SPLIT = 8
# How prompts are chosen (``prompts``): a record names it, and one made another way is refused.
PROMPTS = "random ids seeded by variant and concurrency"
TOKEN_BAND = (1000, 30000)  # launcher.bench.workload.RANDOM_TOKEN_RANGE: no special ids


TAIL_VARIANT = "dtail"  # the oracle with the real drafter's tokens past the first wrong position
TAIL_CONCURRENCY = 4


def requests_like(variant: str | None) -> str | None:
    """The variant whose requests a point of ``variant`` sends: a ``dtail`` point sends the plain
    point's, so it shares their references and baseline."""
    return "base" if variant == TAIL_VARIANT else variant


@dataclass(frozen=True)
class Point:
    vllm: str
    k: int
    concurrency: int
    level: float
    variant: str = "base"

    @property
    def id(self) -> str:
        return f"v{self.vllm}-k{self.k}-c{self.concurrency}-a{self.level:g}-{self.variant}"

    @property
    def tail(self) -> str:
        """What the oracle's proposals hold past their first wrong position (``oracle.TAILS``)."""
        return "drafter" if self.variant == TAIL_VARIANT else "reference"

    @property
    def requests_like(self) -> str:
        """The variant whose requests this point sends (``requests_like``)."""
        return requests_like(self.variant)

    @property
    def input_len(self) -> int:
        return LONG_INPUT if self.variant == "long" else INPUT_LEN

    @property
    def extra(self) -> dict:
        """What each request of the point adds to its body."""
        return {"logprobs": LOGPROBS} if self.variant == "logprobs" else {}

    @property
    def requests(self) -> int:
        """At least MIN_REQUESTS, a whole number per stream."""
        return self.concurrency * math.ceil(MIN_REQUESTS / self.concurrency)

    def as_dict(self) -> dict:
        return {"id": self.id, "vllm": self.vllm, "k": self.k, "concurrency": self.concurrency,
                "level": self.level, "variant": self.variant, "input_len": self.input_len,
                "output_len": OUTPUT_LEN, "requests": self.requests, "extra": self.extra}


def grid() -> list[Point]:
    """Every point of the curve, in batch order."""
    points = [Point(MAIN_VLLM, k, c, level) for k in KS for c in CONCURRENCY for level in LEVELS[k]]
    points += [Point(MAIN_VLLM, SPOT_K, 1, VARIANT_LEVEL, "logprobs"), Point(MAIN_VLLM, SPOT_K, 1, VARIANT_LEVEL, "long")]
    points += [Point(SPOT_VLLM, SPOT_K, 1, level) for level in SPOT_LEVELS]
    return points


GRID = grid()
# The second oracle's points: every level of each K at concurrency 4 on 0.33.0
# (K, concurrency) cells the second oracle measures: concurrency 4, and K = 3 at concurrency 1,
# whose plain control missed as those did
TAIL_CELLS = [(3, 1)] + [(k, TAIL_CONCURRENCY) for k in KS]
TAIL_POINTS = [Point(MAIN_VLLM, k, c, level, TAIL_VARIANT) for k, c in TAIL_CELLS for level in LEVELS[k]]


def f_cycle(level: float, k: int) -> list[int]:
    """First-wrong positions whose mean plus one is ``level`` (1 <= level <= k + 1, a multiple
    of 0.5): one position for a whole level, two alternating for a half."""
    if not 1 <= level <= k + 1 or (2 * level) != int(2 * level):
        raise ValueError(f"level {level} is not a multiple of 0.5 in 1..{k + 1}")
    low = math.floor(level - 1)
    return [low] if level - 1 == low else [low, low + 1]


def planned_acceptance(cycle: list[int]) -> float:
    return 1 + sum(cycle) / len(cycle)


def prompts(point: Point, vocab_size: int | None = None) -> list[list[int]]:
    """The point's prompts: random token ids seeded by its variant and concurrency, so every K,
    level and release of that variant and concurrency sends the same ones: the runs are paired,
    and one set of references serves a release, K, concurrency and variant. (Each run carries a
    cache salt of its own, so no run finds another's prompts in the prefix cache.)"""
    rng = random.Random(f"speedup/{point.requests_like}/c{point.concurrency}")
    low, high = TOKEN_BAND
    if vocab_size is not None:
        high = min(high, vocab_size)
    return [[rng.randrange(low, high) for _ in range(point.input_len)] for _ in range(point.requests)]


@dataclass(frozen=True)
class Batch:
    """One server and the points measured on it: ``server`` is ``nodrafter`` or ``k<K>``."""

    vllm: str
    server: str
    index: int
    points: tuple[Point, ...]
    split: str = ""  # "c<C>": one concurrency of a K (release_batches)

    @property
    def id(self) -> str:
        return f"v{self.vllm}-{self.server}-{self.split or self.index}"


def split_by_k(points: list[Point], n: int) -> list[list[Point]]:
    """``points`` in up to ``n`` groups of whole Ks, the largest K group first into the smallest
    group, each group in the points' own order; empty groups left out."""
    by_k: dict[int, list[Point]] = {}
    for p in points:
        by_k.setdefault(p.k, []).append(p)
    groups: list[list[int]] = [[] for _ in range(n)]
    for k in sorted(by_k, key=lambda k: -len(by_k[k])):
        min(groups, key=lambda g: sum(len(by_k[x]) for x in g)).append(k)
    return [[p for p in points if p.k in g] for g in groups if g]


def batches(points: list[Point] | None = None, nodrafter: int = NODRAFTER_BATCHES,
            by_concurrency: bool = False) -> list[Batch]:
    """Per release (0.33.0 first): the points without the drafter in up to ``nodrafter`` batches
    of whole Ks (one where there are too few to split), then one batch per K, or with
    ``by_concurrency`` one per K and concurrency (id ``...-k<K>-c<C>``), at the price of a
    server start each."""
    points = GRID + TAIL_POINTS if points is None else points
    out: list[Batch] = []
    for vllm in dict.fromkeys(p.vllm for p in points):
        mine = [p for p in points if p.vllm == vllm]
        # A dtail point's baseline is its plain twin's where that was measured on the GPU of its
        # DFlash run (shared, no server started); where not, the server without the drafter
        # measures one there: so the dtail points ride in these batches, counted apart in the split.
        plain = [p for p in mine if p.variant != TAIL_VARIANT]
        groups = split_by_k(plain, max(1, min(nodrafter, len(plain) // MIN_SPLIT)))
        tails = [p for p in mine if p.variant == TAIL_VARIANT]
        groups = [g + [t for t in tails if t.k in {p.k for p in g}] for g in groups]
        out += [Batch(vllm, "nodrafter", i + 1, tuple(g)) for i, g in enumerate(groups)]
        for k in sorted(dict.fromkeys(p.k for p in mine), key=K_ORDER.index):
            at_k = [p for p in mine if p.k == k]
            if not by_concurrency:
                out.append(Batch(vllm, f"k{k}", 1, tuple(at_k)))
                continue
            out += [Batch(vllm, f"k{k}", 1, tuple(p for p in at_k if p.concurrency == c), f"c{c}")
                    for c in dict.fromkeys(p.concurrency for p in at_k)]
    return out


def release_batches(vllm: str, refs_from: str = "dflash") -> list[Batch]:
    """A release's batches. With references made on the DFlash servers (``dflash``), one batch
    without the drafter (the baselines alone, a few runs) and one DFlash batch per K and
    concurrency: each then fits a 30-minute hold of one GPU (a K's batch of both concurrencies
    takes longer, and a cut batch starts its server again for what is left), and the lanes of a
    larger host share them. With references from the server without the drafter (``nodrafter``),
    one DFlash batch per K, in the lane that made its references (``lane_batches``)."""
    if refs_from == "dflash":
        return [b for b in batches(nodrafter=1, by_concurrency=True) if b.vllm == vllm]
    return [b for b in batches() if b.vllm == vllm]
