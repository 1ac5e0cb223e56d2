"""The real-shape GPU proof (issue 11): Gemma 4 26B-A4B's layer mix with the public drafter's shape.

What it runs, per vLLM tree (stock or with the series), each run in its own
subprocess with the engine core in-process (so the runner can be inspected):

* ``reference``: the target alone, every prompt submitted on its own
  (``max_num_seqs=1``), prefix caching off, two passes in one engine. Batched no-drafter runs are
  not run-to-run deterministic on 0.21.0 (tests/gpu/README.md, "The criteria"),
  so the lossless reference is the one-at-a-time run, and it only counts when
  both passes agree token for token.
* ``dflash``: DFlash with 15 speculative tokens, groups of 1, 3, 5 and 17
  concurrent requests (each verify step then carries 16, 48, 80 or 272 query
  tokens; with the capture list below 16 is a CUDA-graph size, the others
  are padded up to one), prefix caching on.
* ``reference-batched`` (diagnostic): the 17 prompts in one batch, two passes,
  to record whether the batched target alone holds still.

``kv_blocks`` shrinks the KV pool (``num_gpu_blocks_override``) so that the
17 concurrent requests use most of it: on stock 0.21.0 the FLEX drafter's
``(2, num_blocks, ...)`` view of a tensor that TRITON target layers read as
``(num_blocks, 2, ...)`` then writes into pages of live target sequences.

Each DFlash run is judged against the reference of the same series and
quantization (``compare.compare_prompt``: identical, or the first divergence
is a tie of the reference with the DFlash token its runner-up).

Usage (device, after ``remote.sh install``; ``remote.sh realshape`` wraps it):
``python tests/gpu/runs/realshape.py --models DIR --site-stock S --site-patched P --runs a,b --out OUT.json``
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import random
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import gpu_paths  # noqa: E402,F401  (every folder of the harness on sys.path)
sys.path.insert(1, str(Path(__file__).resolve().parents[3]))  # the launcher's stamp layout
from launcher.patching.stamp import read_stamp  # noqa: E402
from launcher.patching.tree import Tree  # noqa: E402
import seeded  # noqa: E402
import bars  # noqa: E402
import caveats  # noqa: E402
import compare  # noqa: E402
import draft_capture  # noqa: E402
import input_trace  # noqa: E402
import gate  # noqa: E402
import headline  # noqa: E402
import lm_files  # noqa: E402
import oracle  # noqa: E402
import run_modes  # noqa: E402
import sched_events  # noqa: E402
import series_now  # noqa: E402

TARGET = "gemma4-a4b-r30"
DRAFTER = "dflash-r5-for-a4b-r30"
NUM_SPECULATIVE_TOKENS = 15
MAX_MODEL_LEN = 512
# Verify steps of 1/3/5/17 requests carry 16/48/80/272 tokens: 16 is captured,
# 48, 80 and 272 are padded to 64, 128 and 512. Decode steps of the
# one-at-a-time reference (1 token) are captured too.
CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
CONCURRENCY = (1, 3, 5, 17)
PROMPT_SEED = 20261126
# Crossing the target's 64-token window and the drafter's 128-token window.
PROMPT_LENGTHS = [300, 5, 70, 150, 40, 129, 200, 64, 260, 12, 100, 65, 180, 33, 220, 90, 130]
MAX_TOKENS = [96, 64, 48, 80, 96, 64, 72, 56, 96, 48, 64, 80, 56, 72, 64, 48, 88]
# One run's limit. On a host that limits a command to 600 s, 420 s leaves room for the merge; lanes that
# run in the background (remote.sh lanes-bg) outlive the command and raise it: a 0.33.0 capture
# took 392 s alone, and five engines starting side by side share 16 cores.
CHILD_TIMEOUT_S = int(os.environ.get("RS_CHILD_TIMEOUT_S", "420"))

# The trained target (train_target.py, issue 23): held-out text prompts of 16 to
# 1,500 tokens with 128 new tokens each (models/<target>/prompts.json), images
# allowed on the multimodal runs, up to 32 concurrent requests.
TRAINED_TARGET = "trained-a4b-r30"
TRAINED_DRAFTER = "dflash-r5-for-trained"
# Issue 25: the drafter train_drafter.py trains for the trained target (same shape and
# config as the random one), and the record it writes beside its weights.
TRAINED_DRAFTER_TRAINED = "dflash-r5-trained"
DRAFTER_RECORD = "drafter-train-record.json"
TRAINED_MAX_MODEL_LEN = 2048
TRAINED_CONCURRENCY = gate.TRAINED_CONCURRENCY
# Issue 25 measures acceptance at 1, 8 and 22 requests in flight.
ACCEPTANCE_CONCURRENCY = (1, 8, 22)
# ... and speed at 1, 4 and 16.
SPEED_CONCURRENCY = (1, 4, 16)
# Blocks of the shared KV pool for the small-pool runs. vLLM 0.21.0 sizes a
# block's bytes by the target's KV heads, so the count follows the target:
# with 8/4/1 heads it refused 400 ("estimated maximum model length is 1088"),
# with 4/2/1 heads (7b296e34) it refused 800 ("... is 1952"); one 2,048-token
# request needs about 800 x 2048 / 1952 = 840. 1000 holds one full-length
# request; the 32 concurrent requests of 700 tokens on average need about ten
# times that. The scheduler admits a request only when its prompt fits, so what
# preempts is growth: DFlash requests (15 lookahead slots a step) preempted 12
# times in 1000 blocks on the H100, the target alone none.
TRAINED_SMALL_POOL = 1000
# Just above the start-up minimum, for the target alone to preempt too.
TRAINED_TINY_POOL = 850
# vLLM 0.33.0 counts blocks otherwise: with the drafter every layer is a KV-cache
# group of its own, so a block is one layer's page (32 KiB here; 0.21.0's is five
# layers'), and its start-up check budgets each sliding layer for a whole chunked
# prefill, not its window. On the H100 1000 blocks were refused ("0.13 GiB KV
# cache is needed ... available 0.03 GiB", i.e. about 4,300 blocks). 4800 passes
# that check and still holds about half of what 17 requests of 700 tokens need
# once the windows slide (6 full layers x 44 + 29 sliding x 9 blocks each).
TRAINED_SMALL_POOL_V33 = 4800
# Logprobs kept per generated token (the earliest runs kept 2).
TOP_LOGPROBS = 5
# Issue 25: the drafter-side patches whose reversal the ablation measures, per release.
DRAFTER_SIDE_PATCHES = {"0.21.0": ("dflash-target-layer-ids-offset", "gemma4-dflash-embed-scale-logit-softcap"),
                        "0.33.0": ("gemma4-dflash-embed-scale-logit-softcap",)}
# Where the target name of records written before issue 23 comes from.
RANDOM_TARGET_NAME = "random-a4b-r30-postnorm0.15"

# vLLM 0.21.0's own lines (kernels/linear/__init__.py, fused_moe/oracle/nvfp4.py).
_LINEAR = re.compile(r"Using (\w+) for NVFP4 GEMM")
_MOE = re.compile(r"Using '(\w+)' NvFp4 MoE backend")


@dataclass(frozen=True)
class RunSpec:
    """One engine start. ``name`` is unique; ``key()`` is what records merge on."""

    name: str
    series: str  # "stock" | "patched"
    # "reference" | "reference-batched" | "dflash" | "init" (target and drafter loaded, no KV cache) |
    # "reference-grouped" (no drafter, the DFlash runs' concurrency groups and prefix caching: the
    # target's own batch-shape noise, judged like a DFlash run)
    mode: str
    quant: str = "bf16"  # "bf16" | "modelopt-nvfp4"
    drafter_backend: str | None = None  # None (auto) | "flash_attn" | "flex_attention"
    flash_attn_version: int | None = None  # forced FA version (2 as on sm_12x)
    cuda_graphs: bool = True
    kv_blocks: int | None = None
    batch_invariant: bool = False
    # torch.compile's backend for vLLM's piecewise graphs: None (vLLM's default, inductor) or
    # "eager" (dynamo splits the graph and CUDA graphs still capture it, but no generated
    # kernels run: every op is the ATen or vLLM custom op that batch invariance overrides).
    compile_backend: str | None = None
    diagnostic: bool = False
    concurrency: tuple[int, ...] = CONCURRENCY
    # True: the multimodal recipe (gemma4-moe-dflash): the target keeps its
    # mm-prefix. False: text-only serving (gemma4-moe-dflash-text), where the
    # series' per-layer backend patch puts the sliding layers on FLASH_ATTN.
    mm_prefix: bool = True
    # Diagnosis only: spec_probe hooks with CUDA_LAUNCH_BLOCKING=1, and the
    # async scheduler switched (None keeps vLLM's default).
    probe: bool = False
    async_scheduling: bool | None = None
    # Diagnosis only: input_trace records what the target was fed, per request and step
    # (a divergent request's inputs are checked against its reference sequence).
    trace_inputs: bool = False
    # Issue 25, item 3: draft_capture records what vLLM's drafter was fed and proposed, and the
    # reference drafter judges the drafts on the same inputs (prefix caching off: a cached
    # prefix feeds the drafter no features).
    capture_drafts: bool = False
    # Issue 25's ablation: the whole series less this patch id (remote.sh builds that tree
    # under --reverted-sites/<id>).
    revert: str | None = None
    # The release the run needs (remote.sh realshape / realshape-v33 run one each).
    vllm: str = "0.21.0"
    # Images allowed per prompt. Token-id prompts cannot pass vLLM's multimodal
    # input path without a tokenizer, so a run that allows images only loads
    # the target and the drafter (mode "init"): enough to see which backends the drafter gets.
    image_limit: int = 0
    # "random": the degenerate random target of issues 11/12; "trained": train_target.py's.
    target: str = "random"
    # The reference run this one is judged against (trained runs name it).
    reference: str | None = None
    # Issue 24: the DFlash engine as in ``mode`` "dflash", with tests/gpu/runs/oracle.py
    # overwriting the drafter's proposals from the reference's tokens (records say
    # mode "oracle"). Needs ``reference``: the plan is made from its recorded outputs.
    oracle: bool = False
    # A DFlash run's no-drafter twin (mode "reference-grouped"): how far the target's
    # own greedy output moves under the same batching, the floor its verdict is read against.
    noise: str | None = None
    # This run is ``twin_of``'s noise run (_noise_twin): its groups and prefix caching, no drafter.
    # Named in key(): trained-refgroups-bf16 has the same other fields but its own groups.
    twin_of: str | None = None
    # None: the mode's default (on for DFlash and grouped runs, off for captures and references).
    prefix_caching: bool | None = None
    # "random": the drafter of the shape (no draft ever accepted); "trained": train_drafter.py's
    # (issue 25), whose acceptance the engine's counters measure.
    drafter: str = "random"
    # Issue 25, item 5: each group generated twice, a warm-up and a pass timed by wall clock
    # and CUDA events per step (speed.py). Needs the GPU to itself: never in RS_PARALLEL lanes.
    speed: bool = False

    @property
    def has_drafter(self) -> bool:
        return self.mode in ("dflash", "init")

    @property
    def trained(self) -> bool:
        return self.target == "trained"

    def key(self) -> dict:
        # An oracle run has the engine of a DFlash run: its own mode keeps the two
        # records apart in merge() and in the markdown.
        mode = "oracle" if self.oracle else self.mode
        return {"series": self.series, "mode": mode, "quantization": self.quant,
                "image_limit": self.image_limit,
                "drafter_backend": self.drafter_backend or ("auto" if self.mode == "dflash" else None),
                "flash_attn_version": self.flash_attn_version, "cuda_graphs": self.cuda_graphs,
                "kv_blocks": self.kv_blocks, "batch_invariant": self.batch_invariant,
                **({"compile_backend": self.compile_backend} if self.compile_backend else {}),
                **({"trace_inputs": True} if self.trace_inputs else {}),
                **({"capture_drafts": True} if self.capture_drafts else {}),
                **({"revert": self.revert} if self.revert else {}),
                **({"speed": True} if self.speed else {}),
                **({"twin_of": self.twin_of} if self.twin_of else {}),
                "mm_prefix": self.mm_prefix, "probe": self.probe,
                "async_scheduling": self.async_scheduling, "target_kind": self.target,
                # Every run carries it (records written before issue 25 read as "random"), so a
                # trained-drafter record never replaces a random-drafter one in merge().
                "drafter_kind": self.drafter}


def _runs() -> list[RunSpec]:
    # Ranked: what the done-when rests on (FA2 + CUDA graphs + NVFP4, the
    # references they are judged against), then stock vs patched, then the
    # text-only recipe, then diagnosis.
    # One 512-token request needs ~176 blocks (0.21.0's startup check): 192 keeps
    # about two requests' worth, so 17 concurrent ones fill the pool.
    small_pool = 192
    nvfp4 = "modelopt-nvfp4"
    return [
        RunSpec("ref-nvfp4", "patched", "reference", nvfp4),
        RunSpec("patched-fa2-nvfp4", "patched", "dflash", nvfp4, "flash_attn", 2),
        RunSpec("ref-bf16", "patched", "reference"),
        RunSpec("patched-fa2-bf16", "patched", "dflash", "bf16", "flash_attn", 2),
        RunSpec("patched-auto-fa2-bf16", "patched", "dflash", "bf16", None, 2),
        RunSpec("patched-auto-fa2-nvfp4", "patched", "dflash", nvfp4, None, 2),
        RunSpec("patched-fa2-bf16-smallkv", "patched", "dflash", "bf16", "flash_attn", 2,
                kv_blocks=small_pool, concurrency=(17,)),
        RunSpec("patched-fa2-nvfp4-smallkv", "patched", "dflash", nvfp4, "flash_attn", 2,
                kv_blocks=small_pool, concurrency=(17,)),
        RunSpec("stock-fa-bf16", "stock", "dflash", "bf16", "flash_attn", 2),
        RunSpec("stock-auto-bf16", "stock", "dflash", "bf16", None, 2),
        RunSpec("stock-auto-bf16-smallkv", "stock", "dflash", "bf16", None, 2, kv_blocks=small_pool,
                concurrency=(17,)),
        RunSpec("stock-auto-nvfp4-smallkv", "stock", "dflash", nvfp4, None, 2,
                kv_blocks=small_pool, concurrency=(17,)),
        RunSpec("stock-fa-nvfp4", "stock", "dflash", nvfp4, "flash_attn", 2),
        # The text-only recipe (gemma4-moe-dflash-text): sliding layers on FA2.
        RunSpec("ref-nvfp4-text", "patched", "reference", nvfp4, None, 2, mm_prefix=False),
        RunSpec("patched-fa2-nvfp4-text", "patched", "dflash", nvfp4, "flash_attn", 2,
                mm_prefix=False),
        RunSpec("ref-bf16-text", "patched", "reference", "bf16", None, 2, mm_prefix=False),
        RunSpec("patched-fa2-bf16-text", "patched", "dflash", "bf16", "flash_attn", 2,
                mm_prefix=False),
        RunSpec("patched-fa3-bf16", "patched", "dflash", "bf16", "flash_attn", None),
        # Diagnosis of the NVFP4 + CUDA-graph device-side assert: with the
        # probe (spec_probe.py) and CUDA_LAUNCH_BLOCKING, with the async
        # scheduler off, without graphs, and on FA3.
        RunSpec("diag-fa2-nvfp4-probe", "patched", "dflash", nvfp4, "flash_attn", 2,
                diagnostic=True, probe=True, mm_prefix=False),
        RunSpec("diag-fa2-nvfp4-sync", "patched", "dflash", nvfp4, "flash_attn", 2,
                diagnostic=True, async_scheduling=False, mm_prefix=False),
        RunSpec("patched-fa2-nvfp4-eager", "patched", "dflash", nvfp4, "flash_attn", 2,
                cuda_graphs=False, diagnostic=True),
        RunSpec("patched-fa3-nvfp4", "patched", "dflash", nvfp4, "flash_attn", None,
                diagnostic=True),
        RunSpec("patched-fa2-bf16-eager", "patched", "dflash", "bf16", "flash_attn", 2, cuda_graphs=False),
        RunSpec("refbatch-bf16", "patched", "reference-batched", diagnostic=True),
        RunSpec("refbatch-bf16-invariant", "patched", "reference-batched", batch_invariant=True,
                diagnostic=True),
        *_runs_v33(nvfp4),
        *_runs_trained(nvfp4),
        *_runs_v33_trained(nvfp4),
    ]


def _runs_trained(nvfp4: str) -> list[RunSpec]:
    """The proof on the trained target (issue 23), vLLM 0.21.0, the whole series.

    With a tokenizer, images can be allowed (``image_limit=1``): the target keeps
    its mm-prefix as the multimodal recipe serves it, and the series' text-only
    patch leaves it alone, so no series-less-0008 tree is needed. The text-only
    recipe's runs use ``--language-model-only`` as that recipe does.
    """
    def run(name, series, mode, quant="bf16", backend=None, fa=2, **kw):
        kw.setdefault("image_limit", 1 if kw.get("mm_prefix", True) else 0)
        kw.setdefault("concurrency", TRAINED_CONCURRENCY)
        return RunSpec(name, series, mode, quant, backend, fa, target="trained", **kw)

    small = dict(kv_blocks=TRAINED_SMALL_POOL, concurrency=(17, 32))
    runs = [
        run("trained-ref-bf16", "patched", "reference"),
        run("trained-dflash-fa2-cg-bf16", "patched", "dflash", backend="flash_attn", reference="trained-ref-bf16",
            noise="trained-refgroups-bf16"),
        # The target alone in the same groups: on the first passing target the DFlash run
        # parted from the reference only at 0-3 bf16-step gaps, none one at a time.
        run("trained-refgroups-bf16", "patched", "reference-grouped", reference="trained-ref-bf16"),
        run("trained-ref-nvfp4", "patched", "reference", nvfp4),
        run("trained-dflash-fa2-cg-nvfp4", "patched", "dflash", nvfp4, "flash_attn", reference="trained-ref-nvfp4"),
        run("trained-dflash-fa2-cg-bf16-smallkv", "patched", "dflash", backend="flash_attn",
            # Judged against the full pool's no-drafter run: the target alone hardly
            # preempts in 1000 blocks, so its small-pool twin measures the same batching.
            reference="trained-ref-bf16", noise="trained-refgroups-bf16", **small),
        run("trained-refgroups-bf16-smallkv", "patched", "reference-grouped", reference="trained-ref-bf16",
            **small),
        # Stock 0.21.0 on auto: the drafter on FLEX_ATTENTION sharing TRITON_ATTN's tensors.
        # Judged by the same batching noise as the patched small-pool run. Found:
        # margins move by whole logits where batching moves them by under one. Stock also lacks
        # 0012-0015, so the two runs after it tell 0003's aliasing from the rest.
        run("trained-stock-auto-bf16-smallkv", "stock", "dflash", reference="trained-ref-bf16",
            noise="trained-refgroups-bf16", **small),
        run("trained-dflash-flex-bf16-smallkv", "patched", "dflash", backend="flex_attention",
            reference="trained-ref-bf16", noise="trained-refgroups-bf16", **small),
        run("trained-refbatch-bf16", "patched", "reference-batched"),
        # The text-only recipe: sliding layers on FLASH_ATTN with FA2 (sm_12x), and on
        # FA3 (Hopper's default; its scheduler plans with the model-wide head size 512).
        run("trained-ref-bf16-text", "patched", "reference", mm_prefix=False),
        run("trained-dflash-fa2-cg-bf16-text", "patched", "dflash", backend="flash_attn", mm_prefix=False,
            reference="trained-ref-bf16-text"),
        run("trained-ref-bf16-text-fa3", "patched", "reference", fa=None, mm_prefix=False),
        # Its target is the multimodal one's: on Hopper 0008 keeps every layer on TRITON_ATTN
        # rather than FA3 (measured: the two references' margins are equal), so the multimodal
        # grouped run measures its batching noise; the drafter alone runs FA3.
        run("trained-dflash-fa3-cg-bf16-text", "patched", "dflash", backend="flash_attn", fa=None,
            mm_prefix=False, reference="trained-ref-bf16-text-fa3", noise="trained-refgroups-bf16"),
        run("trained-dflash-fa2-cg-nvfp4-smallkv", "patched", "dflash", nvfp4, "flash_attn",
            reference="trained-ref-nvfp4", **small),
        # Issue 24: the trained-dflash-fa2-cg-* engines with the oracle's drafts, so every
        # accepted length 0..15 runs through the verify step. Last: each needs its
        # reference's raw record (main() also orders them after a reference asked for).
        run("trained-oracle-fa2-cg-bf16", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16", oracle=True),
        run("trained-oracle-fa2-cg-nvfp4", "patched", "dflash", nvfp4, "flash_attn",
            reference="trained-ref-nvfp4", oracle=True),
        run("trained-oracle-fa2-cg-bf16-smallkv", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16", oracle=True, **small),
        run("trained-oracle-fa2-cg-nvfp4-smallkv", "patched", "dflash", nvfp4, "flash_attn",
            reference="trained-ref-nvfp4", oracle=True, **small),
        # Issue 25: the trained-dflash-fa2-cg-* engines with the trained drafter, judged against the
        # same references, at the issue's 1, 8 and 22 in flight; the engine's spec-decode counters
        # give the acceptance length.
        run("trained-dflash-trained-fa2-cg-bf16", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16", drafter="trained", concurrency=ACCEPTANCE_CONCURRENCY,
            noise="trained-refgroups-bf16"),
        run("trained-dflash-trained-fa2-cg-nvfp4", "patched", "dflash", nvfp4, "flash_attn",
            reference="trained-ref-nvfp4", drafter="trained", concurrency=ACCEPTANCE_CONCURRENCY),
        # Issue 25, item 5: speed at this width, DFlash (trained drafter) against the target
        # alone, default numerics, 1, 4 and 16 in flight, through the offline engine until
        # `launcher serve` runs on the GPU. One at a time: each needs the GPU to itself.
        *[run(f"trained-speed-{kind}-fa2-cg-{q}", "patched", mode, quant, **extra, reference=f"trained-ref-{q}",
              concurrency=SPEED_CONCURRENCY, speed=True)
          for q, quant in (("bf16", "bf16"), ("nvfp4", nvfp4))
          for kind, mode, extra in (("dflash-trained", "dflash", {"backend": "flash_attn", "drafter": "trained"}),
                                    ("nodrafter", "reference-grouped", {}))],
        # Issue 25, item 3: draft equivalence with the reference drafter (1, 8 and 17 in flight:
        # 26 requests, about 27 verify steps each at the measured acceptance, so well over the
        # 200 contexts asked for; prefix caching off), judged against the same reference.
        run("trained-dflash-trained-fa2-cg-bf16-capture", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16", drafter="trained", capture_drafts=True, concurrency=(1, 8, 17)),
    ]
    # Issue 25's ablation: the capture run on the series less one drafter-side patch. Lossless
    # output stays expected (the target verifies); equivalence and acceptance say what it did.
    runs += [_without(runs[-1], pid) for pid in DRAFTER_SIDE_PATCHES["0.21.0"]]
    runs += _exact_ablation(runs, "trained-dflash-trained-fa2-cg-bf16-capture", "0.21.0")
    # The FLEX drafter on the whole series less 0003 alone: the aliasing, nothing else missing.
    runs.append(_without(next(r for r in runs if r.name == "trained-dflash-flex-bf16-smallkv"),
                         "reconcile-kv-layout-mixed-attention-backends"))
    # Found under exact numerics: DFlash in the small pool diverged with
    # preemption, the target alone there neither preempted nor diverged. These two
    # separate preemption from DFlash-with-preemption, and the async scheduler from both.
    exact = dict(batch_invariant=True, compile_backend="eager")
    runs += [
        run("trained-refgroups-bf16-tinykv-bi-noinductor", "patched", "reference-grouped",
            reference="trained-ref-bf16-bi-noinductor", kv_blocks=TRAINED_TINY_POOL, concurrency=(17, 32), **exact),
        run("trained-dflash-fa2-cg-bf16-smallkv-sync-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16-bi-noinductor", async_scheduling=False, **small, **exact),
        # With sliding-window-free-settled-tokens-under-async-scheduling the small
        # pool still parts at 2/49 (async) and 1/49 (sync), at requests never preempted nor
        # skipped: another request's KV writes? Without CUDA graphs, no padded or captured
        # drafter slot mapping can write anywhere.
        run("trained-dflash-eager-bf16-smallkv-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16-bi-noinductor", cuda_graphs=False, **small, **exact),
        # The same engine as trained-dflash-fa2-cg-bf16-smallkv-bi-noinductor with what the
        # target was fed recorded: were the divergent requests' inputs right?
        run("trained-dflash-fa2-cg-bf16-smallkv-trace-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="trained-ref-bf16-bi-noinductor", trace_inputs=True, **small, **exact),
    ]
    # The same on the series less 0014 (the tree the 2/49 ran on, but with 0015): its KV trace
    # should show the drafter's post-prefill queries landing in blocks other requests read.
    runs.append(_without(runs[-1], "dflash-lookahead-slots-at-prefill"))
    by_name = {r.name: r for r in runs}
    twins = [by_name[n] for n in BATCH_INVARIANT_TWINS]
    noise = [by_name[n] for n in ("trained-refgroups-bf16", "trained-refgroups-bf16-smallkv")]
    runs = runs + [_batch_invariant_twin(r) for r in twins] + \
        [_batch_invariant_twin(r, compile_backend="eager") for r in twins + noise]
    return _with_noise_twins(runs, NOISE_TWINS)


# The runs whose verdict also needs exact numbers: found on the H100 (target 7b296e34),
# the DFlash run parted from its reference only at 0-3 bf16-step near-ties, and only
# with several requests in flight, as the target alone does when batched. Batch
# invariance (fixed-tile GEMMs, fused-MoE config and 2D Triton attention, NVFP4 by
# emulation) is meant to make a row's logits independent of the rest of the step, so
# that a verify row equals the decode row it stands for and "lossless" means equal.
# Measured: that holds only without inductor (the -bi-noinductor twins).
BATCH_INVARIANT_TWINS = (
    "trained-ref-bf16", "trained-dflash-fa2-cg-bf16", "trained-ref-nvfp4", "trained-dflash-fa2-cg-nvfp4",
    "trained-dflash-fa2-cg-bf16-smallkv", "trained-oracle-fa2-cg-bf16", "trained-oracle-fa2-cg-nvfp4",
    "trained-oracle-fa2-cg-bf16-smallkv", "trained-dflash-fa2-cg-nvfp4-smallkv", "trained-oracle-fa2-cg-nvfp4-smallkv",
    "trained-dflash-trained-fa2-cg-bf16", "trained-dflash-trained-fa2-cg-nvfp4",
)


# DFlash runs whose noise run is their own twin (same groups, same prefix caching). Only bf16:
# the NVFP4 one-at-a-time reference does not reproduce under default numerics on the H100
# (Marlin; 12 of 36 prompts differ between its passes), so an NVFP4 twin has no
# reference to be judged against (its -bi-noinductor twins are the NVFP4 verdict).
NOISE_TWINS = {"trained-dflash-trained-fa2-cg-bf16-capture": "trained-refgroups-bf16-capture"}


def _noise_twin(spec: RunSpec, name: str) -> tuple[RunSpec, RunSpec]:
    """(``spec`` naming its noise run ``name``, that run): the same engine and groups without
    the drafter, judged against the same reference. trained-refgroups-bf16 runs 1/4/17/32 with
    prefix caching; a capture runs 1/8/17 without, the trained-drafter runs 1/8/22 with it, and
    the target's batch-shape noise is only a floor for the groups it was measured in."""
    twin = dataclasses.replace(spec, name=name, mode="reference-grouped", drafter_backend=None, drafter="random",
                               capture_drafts=False, noise=None, twin_of=spec.name,
                               prefix_caching=not spec.capture_drafts)
    return dataclasses.replace(spec, noise=name), twin


def _with_noise_twins(runs: list[RunSpec], twins: dict[str, str]) -> list[RunSpec]:
    """``runs`` with each run named in ``twins`` (run -> noise run) replaced by its noise-named
    self, and its twin right after it."""
    out = []
    for r in runs:
        if r.name in twins:
            out.extend(_noise_twin(r, twins[r.name]))
        else:
            out.append(r)
    return out


def _without(spec: RunSpec, patch_id: str) -> RunSpec:
    """``spec`` on the series less ``patch_id`` (remote.sh builds that tree)."""
    return dataclasses.replace(spec, name=f"{spec.name}-without-{patch_id}", revert=patch_id)


def _exact_ablation(runs: list[RunSpec], capture: str, vllm: str) -> list[RunSpec]:
    """The capture run and its ablation again under exact numerics (``-bi-noinductor``).

    Found on the H100: the capture run on the series less the layer offset gave
    an acceptance of 3.00 on one machine and 2.49 on the next, with the same feature cosine.
    Batched bf16 outputs part from the reference at ties, and which requests then fall into a
    loop the drafter predicts whole moves the mean. Under exact numerics every run emits the
    reference's tokens, so the patched run and each reverted one draft on the same contexts and
    their acceptance differs by the drafter's inputs alone.
    """
    exact = _batch_invariant_twin(next(r for r in runs if r.name == capture), compile_backend="eager")
    return [exact] + [_without(exact, pid) for pid in DRAFTER_SIDE_PATCHES[vllm]]


def _batch_invariant_twin(spec: RunSpec, compile_backend: str | None = None) -> RunSpec:
    """``spec`` under VLLM_BATCH_INVARIANT=1, judged against its reference's own twin.

    Found on the H100: with vLLM's default compile backend the ``-bi`` runs
    still parted from their references only with several requests in flight, as the
    target alone does in groups, while every run at concurrency 1 matched. With the
    ``eager`` backend (``-bi-noinductor``: CUDA graphs kept, no inductor-generated
    kernel, every op an ATen or vLLM custom op that batch invariance replaces) the
    target alone was invariant; which generated kernel breaks it is not isolated.
    Only the ``-bi-noinductor`` grouped targets exist, so only those twins name a noise run.
    """
    suffix = "-bi-noinductor" if compile_backend else "-bi"
    return dataclasses.replace(
        spec, name=spec.name + suffix, batch_invariant=True, compile_backend=compile_backend,
        noise=spec.noise + suffix if compile_backend and spec.noise else None,
        reference=spec.reference + suffix if spec.reference else None)


def _runs_v33(nvfp4: str) -> list[RunSpec]:
    """vLLM 0.33.0 (issue 12). With image and video limits of 0, 0.33.0 itself
    turns the target's mm-prefix off (``ModelConfig._supports_multimodal_for_mm_prefix``),
    so these runs are text-only serving (``mm_prefix=False``) on the whole
    series; the multimodal recipe's seed error needs images allowed, which only
    a model load can show here (``image_limit=1``, mode "init")."""
    v = "0.33.0"
    return [
        RunSpec("v33-ref-bf16", "patched", "reference", "bf16", None, 2, mm_prefix=False, vllm=v),
        RunSpec("v33-patched-fa2-bf16", "patched", "dflash", "bf16", "flash_attn", 2, mm_prefix=False, vllm=v),
        RunSpec("v33-ref-nvfp4", "patched", "reference", nvfp4, None, 2, mm_prefix=False, vllm=v),
        RunSpec("v33-patched-fa2-nvfp4", "patched", "dflash", nvfp4, "flash_attn", 2, mm_prefix=False, vllm=v),
        RunSpec("v33-stock-fa2-bf16-images", "stock", "init", "bf16", "flash_attn", 2, image_limit=1, vllm=v),
        RunSpec("v33-patched-fa2-bf16-images", "patched", "init", "bf16", "flash_attn", 2, image_limit=1,
                vllm=v),
        RunSpec("v33-stock-fa2-bf16", "stock", "dflash", "bf16", "flash_attn", 2, mm_prefix=False, vllm=v),
        RunSpec("v33-stock-fa2-nvfp4", "stock", "dflash", nvfp4, "flash_attn", 2, mm_prefix=False, vllm=v),
        RunSpec("v33-stock-fa2-nvfp4-images", "stock", "init", nvfp4, "flash_attn", 2, image_limit=1, vllm=v),
        RunSpec("v33-patched-fa2-nvfp4-images", "patched", "init", nvfp4, "flash_attn", 2, image_limit=1,
                vllm=v),
    ]


def _runs_v33_trained(nvfp4: str) -> list[RunSpec]:
    """The trained target on vLLM 0.33.0 (issues 24 and 25: "on both 0.21.0 and 0.33.0"), with
    images allowed as the multimodal recipe serves it: 0.33.0 turns the target's mm-prefix off
    only where every multimodal limit is 0, so here the drafter's FLASH_ATTN meets the
    mm-prefix check, which the stock run shows. The drafter runs on the V2 model runner
    (0.33.0's default for DFlash; the oracle pins it). Exact-numerics twins as on 0.21.0."""
    v = "0.33.0"

    def run(name, series, mode, quant="bf16", backend=None, **kw):
        kw.setdefault("image_limit", 1)
        kw.setdefault("concurrency", TRAINED_CONCURRENCY)
        return RunSpec(name, series, mode, quant, backend, 2, target="trained", vllm=v, **kw)

    small = dict(kv_blocks=TRAINED_SMALL_POOL_V33, concurrency=(17, 32))
    exact = dict(batch_invariant=True, compile_backend="eager")
    runs = [
        run("v33-trained-ref-bf16", "patched", "reference"),
        run("v33-trained-dflash-fa2-cg-bf16", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16", noise="v33-trained-refgroups-bf16"),
        # The target alone in the same groups: default numerics are not batch invariant, so
        # the DFlash run is judged by this run's margin shifts as on 0.21.0.
        run("v33-trained-refgroups-bf16", "patched", "reference-grouped", reference="v33-trained-ref-bf16"),
        run("v33-trained-stock-fa2-cg-bf16", "stock", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16"),
        run("v33-trained-ref-nvfp4", "patched", "reference", nvfp4),
        run("v33-trained-dflash-fa2-cg-nvfp4", "patched", "dflash", nvfp4, "flash_attn",
            reference="v33-trained-ref-nvfp4"),
        run("v33-trained-stock-fa2-cg-nvfp4", "stock", "dflash", nvfp4, "flash_attn",
            reference="v33-trained-ref-nvfp4"),
        run("v33-trained-dflash-trained-fa2-cg-bf16", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16", drafter="trained", concurrency=ACCEPTANCE_CONCURRENCY,
            noise="v33-trained-refgroups-bf16"),
        run("v33-trained-dflash-trained-fa2-cg-nvfp4", "patched", "dflash", nvfp4, "flash_attn",
            reference="v33-trained-ref-nvfp4", drafter="trained", concurrency=ACCEPTANCE_CONCURRENCY),
        *[run(f"v33-trained-speed-{kind}-fa2-cg-{q}", "patched", mode, quant, **extra,
              reference=f"v33-trained-ref-{q}", concurrency=SPEED_CONCURRENCY, speed=True)
          for q, quant in (("bf16", "bf16"), ("nvfp4", nvfp4))
          for kind, mode, extra in (("dflash-trained", "dflash", {"backend": "flash_attn", "drafter": "trained"}),
                                    ("nodrafter", "reference-grouped", {}))],
        run("v33-trained-ref-bf16-bi-noinductor", "patched", "reference", **exact),
        run("v33-trained-ref-nvfp4-bi-noinductor", "patched", "reference", nvfp4, **exact),
        run("v33-trained-dflash-fa2-cg-bf16-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16-bi-noinductor", **exact),
        # Default numerics compile with inductor: 0.33.0's first such engine took minutes.
        run("v33-trained-dflash-trained-fa2-cg-bf16-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16-bi-noinductor", drafter="trained",
            concurrency=ACCEPTANCE_CONCURRENCY, **exact),
        # NVFP4's lossless verdict: the default-numerics reference (Marlin) does not reproduce,
        # the emulated one does (v33-trained-ref-nvfp4-bi-noinductor, two passes identical).
        run("v33-trained-dflash-trained-fa2-cg-nvfp4-bi-noinductor", "patched", "dflash", nvfp4, "flash_attn",
            reference="v33-trained-ref-nvfp4-bi-noinductor", drafter="trained",
            concurrency=ACCEPTANCE_CONCURRENCY, **exact),
        run("v33-trained-oracle-fa2-cg-bf16-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16-bi-noinductor", oracle=True, **exact),
        run("v33-trained-oracle-fa2-cg-nvfp4-bi-noinductor", "patched", "dflash", nvfp4, "flash_attn",
            reference="v33-trained-ref-nvfp4-bi-noinductor", oracle=True, **exact),
        run("v33-trained-oracle-fa2-cg-bf16-smallkv-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16-bi-noinductor", oracle=True, **small, **exact),
        run("v33-trained-dflash-fa2-cg-bf16-smallkv-bi-noinductor", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16-bi-noinductor", **small, **exact),
        run("v33-trained-dflash-trained-fa2-cg-bf16-capture", "patched", "dflash", backend="flash_attn",
            reference="v33-trained-ref-bf16", drafter="trained", capture_drafts=True, concurrency=(1, 8, 17)),
    ]
    runs += [_without(runs[-1], pid) for pid in DRAFTER_SIDE_PATCHES[v]]
    runs += _exact_ablation(runs, "v33-trained-dflash-trained-fa2-cg-bf16-capture", v)
    return _with_noise_twins(runs, {f"v33-{dflash}": f"v33-{noise}" for dflash, noise in NOISE_TWINS.items()})


RUNS = {r.name: r for r in _runs()}


def prompts(token_limit: int) -> list[list[int]]:
    rng = random.Random(PROMPT_SEED)
    return [[rng.randrange(3, token_limit) for _ in range(n)] for n in PROMPT_LENGTHS]


def workload(spec: RunSpec, models: Path, token_limit: int) -> tuple[list[list[int]], list[int]]:
    """(prompt token ids, max new tokens per prompt) of a run."""
    if spec.trained:
        held = json.loads((models / TRAINED_TARGET / "prompts.json").read_text())
        return [p["token_ids"] for p in held], [p["max_tokens"] for p in held]
    return prompts(token_limit), list(MAX_TOKENS)


def drafter_dir(spec: RunSpec, models: Path) -> Path:
    """The drafter checkpoint a trained-target run loads."""
    return models / (TRAINED_DRAFTER_TRAINED if spec.drafter == "trained" else TRAINED_DRAFTER)


def drafter_identity(spec: RunSpec, models: Path, quantized_sha256: str | None = None) -> dict:
    """A trained-drafter run's drafter: its sha256, the target it was trained for, and the offline
    acceptance train_drafter.py measured on the same prompts under this release's attention
    semantics, weighted as this run's concurrency groups count requests (train-drafter record)."""
    if spec.drafter != "trained":
        return {}
    path = drafter_dir(spec, models) / DRAFTER_RECORD
    if not path.exists():
        return {"drafter_sha256": None, "acceptance_reference": None}
    rec = json.loads(path.read_text())
    ev = (rec.get("evaluation") or {}).get(f"vllm-{spec.vllm}") or {}
    identity = {"drafter_sha256": rec.get("drafter_sha256"), "drafter_target_sha256": rec.get("target_sha256"),
                "acceptance_reference": offline_acceptance(ev, spec.concurrency)}
    if spec.quant == "modelopt-nvfp4":
        # The offline walks on the NVFP4 target that ran this drafter and the copy this run loads
        # (target_identity's quantized_sha256).
        identity["acceptance_reference_nvfp4"] = nvfp4_walks(
            sorted(drafter_dir(spec, models).glob("nvfp4-evaluation*.json")), spec,
            rec.get("drafter_sha256"), quantized_sha256)
    return identity


def nvfp4_walks(paths: list[Path], spec: RunSpec, drafter_sha256: str | None, copy_sha: str | None) -> dict:
    """Of nvfp4_reference.py's records, those of this drafter and NVFP4 copy, by numerics (W4A4,
    W4A16), weighted as this run's groups weigh the prompts."""
    out = {}
    for path in paths:
        walk = json.loads(path.read_text())
        if walk.get("drafter_sha256") == drafter_sha256 and walk.get("quantized_sha256") == copy_sha:
            ev = (walk.get("evaluation") or {}).get(f"vllm-{spec.vllm}") or {}
            out[walk["numerics"]] = offline_acceptance(ev, spec.concurrency)
    return out


def nvfp4_numerics(raw: dict) -> str:
    """W4A16 where vLLM ran NVFP4 through Marlin (Hopper's default), else W4A4 (FP4 GEMMs, emulation)."""
    linear = _quant_backends("\n".join(raw.get("log_text_for_backends", []))).get("linear_backend") or []
    return "W4A16" if any(k.startswith("Marlin") for k in linear) else "W4A4"


def offline_acceptance(evaluation: dict, concurrency: tuple[int, ...]) -> dict | None:
    """train_drafter.py's offline acceptance weighted as this run's groups weigh the prompts
    (prompt i once per group that holds it), from its per-prompt verify steps; records
    without them keep the estimate train_drafter.py weighted for TRAINED_CONCURRENCY."""
    per_prompt = evaluation.get("per_prompt_steps")
    if not per_prompt:
        return evaluation.get("as_realshape_groups")
    return gate.acceptance_summary([f for steps in gate.as_groups(per_prompt, concurrency) for f in steps],
                                      NUM_SPECULATIVE_TOKENS)


def checkpoint_differs(a: dict, b: dict) -> str | None:
    """Which identity field tells two runs' checkpoints apart, or None: the target's sha256, then
    the NVFP4 copy's where both records name one (records from before quantized_sha256 have none)."""
    if a.get("target_sha256") != b.get("target_sha256"):
        return "target_sha256"
    copies = a.get("quantized_sha256"), b.get("quantized_sha256")
    return "quantized_sha256" if None not in copies and copies[0] != copies[1] else None


def target_identity(spec: RunSpec, models: Path) -> dict:
    """target_name and target_sha256 of the checkpoint a run loads (train_target.py's record)."""
    if not spec.trained:
        return {"target_name": RANDOM_TARGET_NAME, "target_sha256": None}
    rec = json.loads((models / TRAINED_TARGET / "train-record.json").read_text())
    identity = {"target_name": "trained-" + TRAINED_TARGET.removeprefix("trained-"),
                "target_sha256": rec["target_sha256"]}
    if spec.quant == "modelopt-nvfp4":
        # Each machine may quantize its own copy (remote.sh's trained_nvfp4, in the trained-target
        # verbs), and a reference seeded from another host must have run the same one.
        import train_target

        identity["quantized_sha256"] = train_target.checkpoint_sha256(models / (TRAINED_TARGET + "-nvfp4"))
    return identity


# ------------------------------------------------------------ oracle (issue 24)

# The plan's seed: every oracle run of a target then makes the same first-wrong choices.
ORACLE_SEED = 0


class OracleSetupError(RuntimeError):
    """An oracle run cannot start: its plan has nothing (sound) to be made from."""


def oracle_paths(spec: RunSpec, raw_dir: Path) -> tuple[Path, Path]:
    """(plan, log) of an oracle run, beside its raw record so the logs tarball carries them."""
    return raw_dir / f"{spec.name}.plan.json", raw_dir / f"{spec.name}.oracle.jsonl"


def oracle_max_tokens(reference_len: int, k: int = NUM_SPECULATIVE_TOKENS) -> int:
    """New tokens an oracle request may generate: its reference's length less K.

    A verify step may accept drafts past max_tokens and vLLM counts them, so every draft
    the oracle writes must come from the reference (oracle.build_draft marks the rest
    ``tail``). The trained references make 128 tokens, so oracle runs make 113. That is
    below oracle.min_tokens_for_full_cycle(15) = 137, the length one request needs to
    see every first-wrong position, so a single request does not cover 0..15; each
    request has its own permutation, and the run's histogram over the 1/4/17/32 groups
    does (at least 27 per length in oracle.plan; tests/unit/test_gpu_oracle_wiring.py).
    Longer oracle runs would need longer references, i.e. another prompts.json."""
    return reference_len - k


def _reference_raw(spec: RunSpec, raw_dir: Path) -> dict:
    path = raw_dir / f"{spec.reference}.raw.json"
    if not path.exists():
        raise OracleSetupError(
            f"oracle run {spec.name} needs its reference {spec.reference}: no {path} "
            f"(run {spec.reference} first, e.g. RUNS={spec.reference},{spec.name})")
    ref = json.loads(path.read_text())
    if not ref.get("ok") or not ref.get("passes"):
        raise OracleSetupError(f"oracle run {spec.name}: its reference {spec.reference} failed "
                               f"({(ref.get('error') or {}).get('root_cause')})")
    return ref


def prepare_oracle(spec: RunSpec, models: Path, raw_dir: Path) -> dict:
    """Parent side, before the child starts: the plan from the reference's first pass
    (oracle.make_plan_file) and the child's environment. Raises OracleSetupError."""
    ref = _reference_raw(spec, raw_dir)
    identity = target_identity(spec, models)
    if differs := checkpoint_differs(ref, identity):
        raise OracleSetupError(f"oracle run {spec.name}: reference {spec.reference} ran {differs} "
                               f"{ref.get(differs)}, this run loads {identity.get(differs)}")
    # Output records keep prompt lengths, not ids: the ids come from the workload both
    # runs read, checked against the lengths the reference recorded.
    prompts, _ = workload(spec, models, 0)
    outs = ref["passes"][0]
    if [o.get("prompt_len") for o in outs] != [len(p) for p in prompts]:
        raise OracleSetupError(f"oracle run {spec.name}: reference {spec.reference} ran other prompts")
    refs = [o["token_ids"] for o in outs]
    max_tokens = [oracle_max_tokens(len(r)) for r in refs]
    if min(max_tokens) < 1:
        raise OracleSetupError(f"oracle run {spec.name}: a reference output of {spec.reference} "
                               f"is not longer than K={NUM_SPECULATIVE_TOKENS}")
    plan_path, log_path = oracle_paths(spec, raw_dir)
    log_path.unlink(missing_ok=True)  # the oracle appends: a log of an earlier call would count twice
    oracle.make_plan_file(plan_path, prompts, refs, max_tokens, lm_files.VOCAB_SIZE,
                          lm_files.SPECIAL_TOKENS.values(), seed=ORACLE_SEED, k=NUM_SPECULATIVE_TOKENS)
    v2 = oracle.HOOKS[spec.vllm]["runner"] == "v2"
    # The hook patches one model runner class: pin the runner the release's hook is for.
    return {"ORACLE_PLAN": str(plan_path), "ORACLE_LOG": str(log_path),
            "VLLM_USE_V2_MODEL_RUNNER": "1" if v2 else "0"}


def install_oracle(spec: RunSpec):
    """Child side, before LLM(...) is built. oracle.install patches classes in this
    process, so the model runner must live here: with VLLM_ENABLE_V1_MULTIPROCESSING=1
    the engine core (and its runner) would run in a process the hook never reaches, and
    the run would silently verify the random drafter's drafts. Returns the oracle.Oracle."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
        raise RuntimeError("oracle runs need VLLM_ENABLE_V1_MULTIPROCESSING=0 (in-process engine core)")
    plan_path, log_path = os.environ["ORACLE_PLAN"], os.environ["ORACLE_LOG"]
    return oracle.install(spec.vllm, plan_path, log_path)


def oracle_workload(plan: dict, prompts: list[list[int]]) -> list[int]:
    """The oracle run's max_tokens per prompt (the plan's), after checking the plan was
    made for these prompts in this order (rows map to plan entries by prompt)."""
    if [r["prompt"] for r in plan["requests"]] != [list(p) for p in prompts]:
        raise RuntimeError("the oracle plan was made for other prompts")
    return [r["max_tokens"] for r in plan["requests"]]


def oracle_result(spec: RunSpec, raw_dir: Path, max_tokens: list[int] | None) -> dict:
    """Parent side, after the child: the oracle's log analysed into the raw record, so
    verdicts (and --merge-only) need only the raw records. ``max_tokens``: the child's
    per-prompt limits (``oracle_max_tokens``), which decide the verifies vLLM leaves uncounted."""
    _, log_path = oracle_paths(spec, raw_dir)
    lines = oracle.read_log(log_path) if log_path.exists() else []
    return {"oracle_log_lines": len(lines),
            "oracle_analysis": oracle.analyse(lines, NUM_SPECULATIVE_TOKENS, max_tokens)}


# --------------------------------------------------------------------- child


def engine_kwargs(spec: RunSpec, models: Path) -> dict:
    if spec.trained:
        return trained_engine_kwargs(spec, models)
    target = models / (TARGET + ("-nvfp4" if spec.quant == "modelopt-nvfp4" else ""))
    kwargs: dict = dict(
        model=str(target), skip_tokenizer_init=True, dtype="bfloat16",
        max_model_len=MAX_MODEL_LEN, seed=0, logprobs_mode="raw_logits",
        gpu_memory_utilization=0.5,
        # The reference computes every prompt from scratch: a prefix-cache hit
        # computes the rest of a prompt in another batch shape, which moves
        # near-tie argmaxes (seen on the H200: two passes differed at 4 of 17
        # prompts with caching on). The DFlash runs keep caching on, as served.
        enable_prefix_caching=spec.mode in ("dflash", "reference-grouped"),
        max_num_seqs=1 if spec.mode == "reference" else max(CONCURRENCY),
        # Token-id prompts: no HF processor or tokenizer needed (vLLM's
        # multimodal input path wants a tokenizer even for token prompts, so
        # the limits stay at 0). The target stays the multimodal model; with
        # the full series the per-layer backend patch reads limits of 0 as
        # text-only serving and turns its mm-prefix off, so the mm-prefix runs
        # use the series without that patch (remote.sh mm_patches_root).
        limit_mm_per_prompt={"image": spec.image_limit, "video": 0},
        enforce_eager=not spec.cuda_graphs,
    )
    if spec.image_limit:
        # The encoder's memory profile runs the HF processor, which needs a tokenizer.
        kwargs["skip_mm_profiling"] = True
    return kwargs | _run_knobs(spec, models / DRAFTER)


def _run_knobs(spec: RunSpec, drafter: Path) -> dict:
    """What every run sets the same way: graphs, FA version, KV pool, scheduler, the drafter."""
    knobs: dict = {}
    if spec.async_scheduling is not None:
        knobs["async_scheduling"] = spec.async_scheduling
    if spec.cuda_graphs:
        knobs["compilation_config"] = {"cudagraph_capture_sizes": CAPTURE_SIZES}
    if spec.compile_backend:
        knobs["compilation_config"] = knobs.get("compilation_config", {}) | {"backend": spec.compile_backend}
    if spec.flash_attn_version is not None:
        knobs["attention_config"] = {"flash_attn_version": spec.flash_attn_version}
    if spec.kv_blocks is not None:
        knobs["num_gpu_blocks_override"] = spec.kv_blocks
    if spec.has_drafter:
        sc = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": NUM_SPECULATIVE_TOKENS}
        if spec.drafter_backend:
            sc["attention_backend"] = spec.drafter_backend
        knobs["speculative_config"] = sc
    return knobs


def trained_engine_kwargs(spec: RunSpec, models: Path) -> dict:
    """The trained target as the recipes serve it: its tokenizer, images allowed on the
    multimodal runs (vLLM builds the Gemma 4 processor and profiles the vision encoder
    with it), ``--language-model-only`` on the text-only ones."""
    target = models / (TRAINED_TARGET + ("-nvfp4" if spec.quant == "modelopt-nvfp4" else ""))
    kwargs: dict = dict(
        model=str(target), dtype="bfloat16", max_model_len=TRAINED_MAX_MODEL_LEN, seed=0,
        logprobs_mode="raw_logits", disable_log_stats=False, **_memory_share(),
        # One-at-a-time references compute every prompt from scratch (see engine_kwargs).
        enable_prefix_caching=spec.prefix_caching if spec.prefix_caching is not None
        else spec.mode in ("dflash", "reference-grouped") and not spec.capture_drafts,
        max_num_seqs=1 if spec.mode == "reference" else max(TRAINED_CONCURRENCY),
        enforce_eager=not spec.cuda_graphs,
    )
    if spec.mm_prefix:
        kwargs["limit_mm_per_prompt"] = {"image": spec.image_limit, "video": 0}
        # Found on the H100 (issue 23): with the processor cache on, vLLM 0.21.0 runs
        # the HF processor on the dummy text alone ("\t<|image|>"), and transformers
        # 5.13.1's Gemma4Processor.validate_inputs refuses image tokens without images
        # ("Found 1 <|image|> tokens in the text but no images were passed").
        kwargs["mm_processor_cache_gb"] = 0
    else:
        kwargs["language_model_only"] = True
    return kwargs | _run_knobs(spec, drafter_dir(spec, models))


def _memory_share() -> dict:
    """GPU memory of one engine. remote.sh runs several engines side by side on one GPU
    (RS_PARALLEL): then each takes a fixed KV cache (``kv_cache_memory_bytes``, which
    skips vLLM's profiling, where another engine's growth would be read as this
    one's) and a utilisation share small enough for the others to start."""
    util = float(os.environ.get("RS_GPU_UTIL", "0.5"))
    kv_gib = os.environ.get("RS_KV_CACHE_GIB")
    share: dict = {"gpu_memory_utilization": util}
    if kv_gib:
        share["kv_cache_memory_bytes"] = int(float(kv_gib) * 2**30)
    return share


_COUNTERS = {"vllm:num_preemptions": "preemptions", "vllm:prefix_cache_hits": "prefix_cache_hits",
             "vllm:prefix_cache_queries": "prefix_cache_queries",
             "vllm:spec_decode_num_drafts": "spec_drafts",
             "vllm:spec_decode_num_draft_tokens": "spec_draft_tokens",
             "vllm:spec_decode_num_accepted_tokens": "spec_accepted_tokens"}


def engine_counters(llm) -> dict:
    """The engine's own Prometheus counters (vLLM's names mapped to the record's)."""
    out: dict = {}
    for m in llm.get_metrics():
        if m.name in _COUNTERS:
            out[_COUNTERS[m.name]] = int(getattr(m, "value", 0))
        elif m.name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            out["spec_accepted_per_pos"] = [int(v) for v in getattr(m, "values", [])]
    return out


def _generate(llm, params, batch: list[list[int]]) -> list[dict]:
    outs = llm.generate([{"prompt_token_ids": p} for p in batch], params[:len(batch)],
                        use_tqdm=False)
    return [run_modes._output_record(p, o) for p, o in zip(batch, outs)]


def draft_equivalence(spec: RunSpec, models: Path, captured) -> dict:
    """Child side, after generation: vLLM's drafts against dflash_reference.py's drafter on the
    captured inputs, and the captured features against the Hugging Face target's (bf16 target
    folder: the NVFP4 copy keeps the embedding in bf16, and the features are judged as fed)."""
    import torch

    import train_drafter

    drafter = train_drafter.load_drafter(drafter_dir(spec, models), "cuda")
    target_dir = models / TRAINED_TARGET
    model = train_drafter.load_target(target_dir, "cuda")
    shared = train_drafter.shared_from_target(model, target_dir)
    # The same weights in bf16, as vLLM runs them: the noise a correct bf16 drafter shows
    drafter_bf16 = copy.deepcopy(drafter).to(torch.bfloat16)
    out = draft_capture.compare_capture(captured, drafter, shared, f"vllm-{spec.vllm}", NUM_SPECULATIVE_TOKENS,
                                        drafter_bf16)
    out["features"] = draft_capture.feature_agreement(captured, model, list(drafter.g.target_layer_ids))
    out["propose_calls"] = captured.calls
    del model, drafter, drafter_bf16
    torch.cuda.empty_cache()
    return out


def load_models_only(kwargs: dict):
    """The executor alone: the model runner with the target and the drafter loaded,
    as ``LLM(**kwargs)`` builds them, without LLM's front end or the scheduler. With
    images allowed both build the model's HF processor, which needs a tokenizer that
    the random checkpoints lack (seen on the H200: the front end, then the
    scheduler's encoder budget). Each layer picks its attention backend at load.
    Returns (executor, its model runner)."""
    from vllm.config import AttentionConfig, CompilationConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.executor import Executor

    kw = dict(kwargs)
    # LLM() turns these dicts into config objects before EngineArgs sees them.
    for key, cls in (("compilation_config", CompilationConfig), ("attention_config", AttentionConfig)):
        if isinstance(kw.get(key), dict):
            kw[key] = cls(**kw[key])
    config = EngineArgs(**kw).create_engine_config()
    # The executor loads the target and the drafter (each layer picks its attention
    # backend there); EngineCore's scheduler would then build the HF processor.
    executor = Executor.get_class(config)(config)
    return executor, executor.driver_worker.worker.model_runner


def _engine_facts(runner) -> dict:
    facts: dict = {}
    try:
        cfg = runner.vllm_config
        facts["capture_sizes"] = list(cfg.compilation_config.cudagraph_capture_sizes or [])
        facts["cudagraph_mode"] = str(cfg.compilation_config.cudagraph_mode)
        kv = getattr(runner, "kv_cache_config", None)
        facts["num_kv_blocks"] = getattr(kv, "num_blocks", None)
    except Exception as exc:  # recorded, not fatal
        facts["facts_error"] = f"{type(exc).__name__}: {exc}"
    return facts


def run_child(spec: RunSpec, models: Path, token_limit: int) -> dict:
    result: dict = {"name": spec.name, "ok": False}
    t0 = time.time()
    try:
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm_version"] = vllm.__version__
        if spec.probe:
            import spec_probe

            shapes = json.loads((models / "shapes.json").read_text())
            spec_probe.install(os.environ["REALSHAPE_PROBE_OUT"], shapes["vocab"],
                               shapes.get("max_position_embeddings", 4096))
        orc = install_oracle(spec) if spec.oracle else None
        # Small pools: which request was preempted (a divergence there is judged by it).
        events = sched_events.install() if spec.kv_blocks and spec.mode != "init" else None
        trace = input_trace.install() if spec.trace_inputs else None
        captured = draft_capture.install(TRAINED_MAX_MODEL_LEN, spec.vllm) if spec.capture_drafts else None
        if spec.mode == "init":
            llm, (_executor, runner) = None, load_models_only(engine_kwargs(spec, models))
            result["started"] = "executor (models loaded; no KV cache, no scheduler)"
        else:
            llm = LLM(**engine_kwargs(spec, models))
            runner = run_modes._runner(llm)
        result["init_s"] = round(time.time() - t0, 1)
        result.update(run_modes.inspect_runner(runner))
        result.update(_engine_facts(runner))
        toks, max_tokens = workload(spec, models, token_limit)
        if orc is not None:
            max_tokens = result["oracle_max_tokens"] = oracle_workload(orc.plan, toks)
        # Five logprobs: a default-numerics divergence between the third and fourth token
        # has both tokens' margins only when both are listed (within_batch_noise).
        params = [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, logprobs=TOP_LOGPROBS,
                                 detokenize=False) for m in max_tokens]
        result.update(target_identity(spec, models))
        result.update(drafter_identity(spec, models, result.get("quantized_sha256")))
        t1 = time.time()
        if llm is None:
            pass  # models loaded: nothing to generate
        elif spec.mode == "reference":
            result["passes"] = [[_generate(llm, [params[i]], [p])[0] for i, p in enumerate(toks)]
                                for _ in range(2)]
        elif spec.mode == "reference-batched":
            result["passes"] = [_generate(llm, params, toks) for _ in range(2)]
        elif spec.speed:
            import speed

            result["speed"] = speed.measure(llm, runner, params, toks, spec.concurrency, _generate, engine_counters)
            result["groups"] = {c: g.pop("outputs") for c, g in result["speed"].items()}
        else:
            result["groups"] = {}
            for c in spec.concurrency:
                for recorder in (events, trace):
                    if recorder is not None:
                        recorder.group = str(c)
                result["groups"][str(c)] = _generate(llm, params, toks[:c])
        result["generate_s"] = round(time.time() - t1, 2)
        if llm is not None and spec.trained:
            result["counters"] = engine_counters(llm)
        if events is not None:
            result["sched_events"] = events.summary(toks)
        if trace is not None:
            result["input_trace"] = trace.summary(toks)
        if captured is not None:
            result["draft_equivalence"] = draft_equivalence(spec, models, captured)
        if orc is not None:  # calls == 0: the hook never ran (the drafter's own drafts were verified)
            result["oracle_calls"] = {"calls": orc.calls, "proposals": orc.proposals}
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - every failure is a result here
        traceback.print_exc()
        result["error"] = {"root_cause": run_modes._root_cause(exc),
                           "raised": f"{type(exc).__name__}: {exc}"}
    result["wall_s"] = round(time.time() - t0, 1)
    return result


# ------------------------------------------------------------------ verdicts


def passes_agree(passes: list[list[dict]]) -> dict:
    """Do two passes of the same run give the same tokens? (run-to-run determinism)"""
    a, b = passes
    differ = [i for i, (x, y) in enumerate(zip(a, b)) if x["token_ids"] != y["token_ids"]]
    first = {}
    for i in differ:
        pos = next((j for j, (x, y) in enumerate(zip(a[i]["token_ids"], b[i]["token_ids"]))
                    if x != y), None)
        first[str(i)] = pos
    return {"stable": not differ, "prompts_differing": differ, "first_difference": first}


def judge(reference: dict | None, run: dict) -> dict:
    """Lossless verdict of a DFlash run's groups against a one-at-a-time reference."""
    if reference is None or not reference.get("ok"):
        return {"lossless": None, "reason": "no reference run"}
    stable = passes_agree(reference["passes"])
    if not stable["stable"]:
        return {"lossless": None, "reason": "reference not deterministic", "reference": stable}
    if not run.get("ok"):
        return {"lossless": None, "reason": "run failed"}
    differs = checkpoint_differs(reference, run)
    if differs:
        what = "target" if differs == "target_sha256" else "NVFP4 copy"
        return {"lossless": None, "reason": f"reference ran another {what} ({differs} differs)"}
    ref = reference["passes"][0]
    # Small-pool runs record scheduler events; a request without any had none.
    events = ({(e["group"], e["prompt"]): e for e in run["sched_events"]}
              if "sched_events" in run else None)
    traced = {(e["group"], e["prompt"]): e for e in run.get("input_trace") or []}
    divergences, identical, total = [], 0, 0
    for group, outs in run["groups"].items():
        for i, out in enumerate(outs):
            total += 1
            d = compare.compare_prompt(i, ref[i], out)
            if d is None:
                identical += 1
            else:
                divergences.append({"concurrency": int(group), **d, **(
                    {} if events is None else _events_before(events.get((group, i)), d["position"]))})
                if (group, i) in traced:
                    row = traced[group, i]
                    divergences[-1]["inputs"] = input_trace.check(
                        row["writes"], row["prompt_tokens"] + ref[i]["token_ids"],
                        len(row["prompt_tokens"]) + d["position"])
    verdict = {"lossless": all(d["tie"] for d in divergences), "prompt_runs": total,
               "identical": identical, "divergences": divergences}
    if events is not None:
        verdict["preemption"] = _preemption_split(run, divergences)
    if run.get("input_trace") and run.get("kv_cache_groups"):
        kv = input_trace.block_conflicts(run["input_trace"], run["kv_cache_groups"])
        victims = {tuple(v) for v in kv["victims"]}
        for d in divergences:
            d["kv_victim"] = (str(d["concurrency"]), d["prompt"]) in victims
        verdict["kv_conflicts"] = kv
    return verdict


def _events_before(seen: dict | None, position: int) -> dict:
    """A divergent request's scheduler events up to its first divergence. Every request is
    left out of one step once it holds max_tokens - 1 outputs (the async scheduler's
    extra step), so only earlier absences count."""
    if seen is None:
        return {"preempted_before": 0, "unscheduled_before": 0}
    return {"preempted_before": sum(e["output_tokens"] <= position for e in seen["preempted"]),
            "unscheduled_before": sum(e["output_tokens"] <= position for e in seen["unscheduled"]),
            "first_steps": seen.get("first_steps")}


def _preemption_split(run: dict, divergences: list[dict]) -> dict:
    """Small pools: prompt runs whose request was preempted, and how many of each kind diverged."""
    preempted = {(e["group"], e["prompt"]) for e in run["sched_events"] if e["preempted"]}
    diverged = {(str(d["concurrency"]), d["prompt"]) for d in divergences}
    return {"prompt_runs_preempted": len(preempted),
            "diverged_preempted": len(diverged & preempted),
            "diverged_not_preempted": len(diverged - preempted)}


def truncated(reference: dict, lengths: list[int]) -> dict:
    """The reference with prompt i's outputs (token ids and logits, both passes) cut to
    lengths[i] tokens."""
    def cut(i: int, out: dict) -> dict:
        n = lengths[i]
        return dict(out, token_ids=out["token_ids"][:n], top=(out.get("top") or [])[:n])
    return dict(reference, passes=[[cut(i, o) for i, o in enumerate(p)] for p in reference["passes"]])


def judge_oracle(reference: dict | None, run: dict) -> dict:
    """An oracle run against its reference cut to the oracle's length: the oracle run
    asked for K fewer tokens (oracle_max_tokens), so an uncut reference would differ in
    length everywhere. The cut is per prompt, to what the run asked for (not to what it
    made): a short output still counts as a divergence."""
    lengths = run.get("oracle_max_tokens")
    if run.get("ok") and not lengths:
        return {"lossless": None, "reason": "oracle run recorded no oracle_max_tokens"}
    if reference and reference.get("ok") and lengths:
        reference = truncated(reference, lengths)
    return judge(reference, run)


def accepted_hist(counters: dict) -> list[int] | None:
    """vLLM's own accepted-length histogram (spec_decode_num_drafts and
    spec_decode_num_accepted_tokens_per_pos, as engine_counters names them)."""
    if counters.get("spec_drafts") is None or counters.get("spec_accepted_per_pos") is None:
        return None
    return oracle.hist_from_counters(counters["spec_drafts"], counters["spec_accepted_per_pos"])


def oracle_log_clean(analysis: dict) -> bool:
    """The oracle's own cross-checks (oracle.analyse; tests/gpu/README.md, "Oracle proposer"):
    every verified step accepted what the plan said, every row matched a plan entry, each
    step's sampled token was the reference's, and no draft ran past the reference."""
    return bool(analysis) and all(analysis.get(k) == 0 for k in (
        "num_mismatches", "unplanned_verifies", "last_token_mismatches", "tail_drafts", "unknown_rows"))


def oracle_fields(raw: dict, reference: dict | None, block: dict | None) -> dict:
    """Issue 24's record fields and verdict. planned_hist is analyse's expected_hist: the
    plan's first-wrong position of each proposal vLLM verified, capped by the drafts the
    scheduler kept (a trimmed draft cannot accept past its end); this is the histogram
    vLLM's counters must equal (oracle.check_counters). analyse's untrimmed planned_hist
    is kept in ``oracle``."""
    analysis = raw.get("oracle_analysis") or {}
    accepted, planned = accepted_hist(raw.get("counters") or {}), analysis.get("expected_hist")
    ref_block = gate.nondegenerate(reference["passes"][0]) if reference and reference.get("ok") else None
    every = accepted is not None and len(accepted) == NUM_SPECULATIVE_TOKENS + 1 and all(c > 0 for c in accepted)
    checks = {"lossless": judge_oracle(reference, raw).get("lossless") is True,
              "nondegenerate": gate.passes(block) and gate.passes(ref_block),
              "every_length": every,
              "hist_equal": accepted is not None and accepted == planned,
              "oracle_log_clean": oracle_log_clean(analysis)}
    return {"accepted_hist": accepted, "planned_hist": planned, "hist_equal": checks["hist_equal"],
            "oracle_checks": checks, "reference_nondegenerate": ref_block,
            "oracle_max_tokens": raw.get("oracle_max_tokens"), "oracle_calls": raw.get("oracle_calls"),
            "oracle": {k: v for k, v in analysis.items() if k != "expected_hist"},
            "proof": bool(raw.get("ok")) and all(checks.values())}


def reference_for(spec: RunSpec) -> RunSpec | None:
    """The one-at-a-time reference a run is judged against: same quantization
    and the same multimodal semantics (text-only moves the target's sliding
    layers to FLASH_ATTN, so its reference must run them there too). Trained
    runs name theirs."""
    if spec.reference:
        return RUNS[spec.reference]
    return next((r for r in RUNS.values() if r.mode == "reference" and r.series == "patched"
                 and r.quant == spec.quant and r.mm_prefix == spec.mm_prefix and r.vllm == spec.vllm
                 and not r.trained), None)


def _backend(names: dict) -> str | None:
    kinds = sorted(set(names.values()))
    return "+".join(kinds) if kinds else None


def _quant_backends(log_text: str) -> dict:
    linear = sorted({m.group(1) for m in _LINEAR.finditer(log_text)})
    moe = sorted({m.group(1) for m in _MOE.finditer(log_text)})
    return {"linear_backend": linear or None, "moe_backend": moe or None}


def _series_of(spec: RunSpec, raw: dict, meta: dict) -> str | None:
    """The hash of the tree a patched run used: the one its tree's stamp named when it ran
    (run_tree_hash), so a raw record seeded on a later host keeps its own. Raw records
    written before stamps were kept have none: the merge's meta, where mm-prefix runs use the
    series less the text-only patch where remote.sh built one."""
    if raw.get("series_hash"):
        return raw["series_hash"]
    if spec.mm_prefix and meta.get("series_hash_mm") and not spec.trained:
        return meta["series_hash_mm"]
    return meta.get("series_hash")


def record(spec: RunSpec, raw: dict, reference: dict | None, meta: dict, noise: dict | None = None) -> dict:
    """One results record (the issue's fields plus what explains them)."""
    backends = raw.get("backends") or {}
    rec = {
        "name": spec.name, **spec.key(),
        "vllm": raw.get("vllm_version") or meta.get("vllm"),
        "series": "stock" if spec.series == "stock" else _series_of(spec, raw, meta),
        "target": {"sliding": 25, "full": 5},
        "drafter_layers": 5 if spec.has_drafter else None,
        "drafter_backend_observed": _backend(backends.get("drafter", {})),
        "target_backend_observed": _backend(backends.get("target", {})),
        "ok": bool(raw.get("ok")),
        "error": raw.get("log_error_line") or (raw.get("error") or {}).get("root_cause"),
        "diagnostic": spec.diagnostic,
        "concurrency": list(spec.concurrency) if spec.mode in ("dflash", "reference-grouped") else None,
        "capture_sizes": raw.get("capture_sizes"),
        "num_kv_blocks": raw.get("num_kv_blocks"),
        "kv_cache_groups": [{k: g.get(k) for k in ("gid", "spec", "block_size", "head_size", "sliding_window")}
                            | {"layers": len(g["layers"]), "drafter_layers": len(g["drafter_layers"])}
                            for g in raw.get("kv_cache_groups") or []],
        "num_kv_cache_tensors": raw.get("num_kv_cache_tensors"),
        "wall_s": raw.get("wall_s"),
        **_quant_backends("\n".join(raw.get("log_text_for_backends", []))),
    }
    if raw.get("stale_compile_artifacts"):
        found = raw["stale_compile_artifacts"]
        rec["ok"] = False
        rec["stale_compile_artifacts"] = found
        rec["error"] = (f"loaded compiled graph {found[0]['artifact'][:8]} that {', '.join(found[0]['saved_by'])} "
                        f"saved from another vLLM tree ({', '.join(t[:8] for t in found[0]['trees'])}): "
                        "its target is not this tree's")
    if raw.get("seeded"):
        rec["seeded"] = True
    if raw.get("assert_lines"):
        rec["assert_lines"] = raw["assert_lines"]
    if raw.get("probe") is not None:
        rec["probe_reports"] = raw["probe"][:12]
    if raw.get("draft_equivalence") is not None:
        rec["draft_equivalence"] = raw["draft_equivalence"]
    if spec.mode in ("dflash", "reference-grouped"):
        v = judge_oracle(reference, raw) if spec.oracle else judge(reference, raw)
        rec["lossless"] = v.get("lossless")
        rec["divergences"] = v.get("divergences", [])
        rec["verdict"] = {k: v[k] for k in v if k not in ("lossless", "divergences")}
    else:
        rec["lossless"] = None
        rec["divergences"] = []
        if raw.get("ok") and spec.mode != "init":
            rec["determinism"] = passes_agree(raw["passes"])
    if spec.trained:
        rec.update(trained_fields(spec, raw, reference))
    if spec.noise:
        rec["batch_noise"] = within_batch_noise(reference, raw, noise, spec.noise)
    if raw.get("speed"):
        import speed

        rec["speed"] = speed.summary(raw["speed"], spec.has_drafter, NUM_SPECULATIVE_TOKENS)
    return rec


def _paired_outputs(reference: dict, run: dict):
    """(reference output, run output) for every output of a run: group output i is prompt i."""
    ref = reference["passes"][0]
    for c, group in run.get("groups", {}).items():
        yield from zip(ref[:int(c)], group)


def _top(output: dict, t: int) -> list:
    top = output.get("top") or []
    return top[t] if t < len(top) and top[t] else []


def _logit(top: list, token: int) -> float | None:
    return next((entry[1] for entry in top if entry[0] == token), None)


def margin_moves(reference: dict, run: dict) -> list[float]:
    """Every change of the top-1/top-2 logit margin between a run and its reference at
    positions where both still agree on the tokens so far (so on the top-1 token) and on the
    runner-up: how far the run's numerics move margins without any change of input."""
    moves = []
    for ref, out in _paired_outputs(reference, run):
        for t, (a, b) in enumerate(zip(ref["token_ids"], out["token_ids"])):
            if a != b:
                break
            rt, ot = _top(ref, t), _top(out, t)
            if len(rt) > 1 and len(ot) > 1 and rt[1][0] == ot[1][0]:
                moves.append(abs((rt[0][1] - rt[1][1]) - (ot[0][1] - ot[1][1])))
    return moves


def margin_shift(reference: dict, run: dict) -> float:
    """The widest of margin_moves (0 where none)."""
    return max(margin_moves(reference, run), default=0.0)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank q-th percentile: the smallest value with at least q % of the values at
    or below it (0 for no values)."""
    if not values:
        return 0.0
    ranked = sorted(values)
    return ranked[max(0, math.ceil(q / 100 * len(ranked)) - 1)]


def divergence_swings(reference: dict, run: dict) -> list[dict]:
    """At each output's first divergence: how far the two tokens' margin swung between the
    reference (its token ahead by m_ref) and the run (its token ahead by m_run). Where a
    token is outside the other side's listed logprobs its margin is at least that side's
    top-1 minus its last listed logit, so the swing is a lower bound (``exact`` False)."""
    swings = []
    for i, (ref, out) in enumerate(_paired_outputs(reference, run)):
        d = compare.compare_prompt(i, ref, out)
        if d is None:
            continue
        t = d["position"]
        rt, ot = _top(ref, t), _top(out, t)
        # A length difference (no numerics ends a sequence early) or no logprobs there.
        if "baseline_token" not in d or not rt or not ot:
            swings.append({"position": t, "swing": math.inf, "exact": False})
            continue
        a, b = d["baseline_token"], d["dflash_token"]
        lr, lo = _logit(rt, b), _logit(ot, a)
        m_ref = rt[0][1] - (lr if lr is not None else rt[-1][1])
        m_run = ot[0][1] - (lo if lo is not None else ot[-1][1])
        swings.append({"position": t, "swing": m_ref + m_run, "exact": lr is not None and lo is not None})
    return swings


def within_batch_noise(reference: dict | None, run: dict, noise: dict | None, noise_name: str) -> dict:
    """Are a run's divergences from its one-at-a-time reference what the target's own
    numerics do when batched?

    Without batch-invariant kernels the target served in groups, with no drafter at all,
    parts from its one-at-a-time reference: batch shape changes GEMM and attention
    rounding, and that moves top-1/top-2 margins (on the H100 by up to 0.72-0.875
    logits on 0.21.0 and 1.81 on 0.33.0 at positions where the tokens still agreed). That widest move, measured on the
    no-drafter run ``noise``, is the bound. A DFlash divergence is explained by numerics
    when the two tokens' margin swung by no more than it; a wrong KV row or position swings
    margins by whole logits. The DFlash run's own margin moves at agreeing positions must
    stay within the bound too. ``within`` is None while a swing is only a lower bound
    under it (the token was outside the listed logprobs). Kept apart from ``lossless``,
    which stays strict."""
    if noise is None or not noise.get("ok"):
        return {"run": noise_name, "within": None, "reason": "no batch-noise run"}
    if not run.get("ok"):
        return {"run": noise_name, "within": None, "reason": "the run failed"}
    if not reference or not reference.get("ok") or not passes_agree(reference["passes"])["stable"]:
        return {"run": noise_name, "within": None, "reason": "reference not deterministic"}
    # A seeded raw record of another target (or NVFP4 copy) must not set the bound.
    if checkpoint_differs(reference, noise) or checkpoint_differs(reference, run):
        return {"run": noise_name, "within": None, "reason": "runs of different targets"}
    noise_moves, own_moves = margin_moves(reference, noise), margin_moves(reference, run)
    bound, own = max(noise_moves, default=0.0), max(own_moves, default=0.0)
    swings = divergence_swings(reference, run)
    unexplained = sum(1 for x in swings if x["swing"] > bound)
    unmeasured = sum(1 for x in swings if x["swing"] <= bound and not x["exact"])
    within = False if unexplained or own > bound else (None if unmeasured else True)
    # bars.yaml's procedure beside it: the bound is the percentile of the twin's moves over all
    # positions, never its widest move; the run's own moves are taken at the same percentile.
    q = bars.get("noise", "margin_move_percentile")
    bound_q, own_q = percentile(noise_moves, q), percentile(own_moves, q)
    unexplained_q = sum(1 for x in swings if x["swing"] > bound_q)
    unmeasured_q = sum(1 for x in swings if x["swing"] <= bound_q and not x["exact"])
    within_q = False if unexplained_q or own_q > bound_q else (None if unmeasured_q else True)
    return {"run": noise_name, "margin_bound": bound, "own_margin_shift": own, "divergences": len(swings),
            "explained": len(swings) - unexplained - unmeasured, "unmeasured": unmeasured,
            "unexplained": unexplained, "widest_swing": max((x["swing"] for x in swings), default=0.0),
            "within": within,
            "percentile": q, "margin_moves": len(noise_moves), "margin_bound_p99": bound_q,
            "own_margin_shift_p99": own_q, "unexplained_p99": unexplained_q, "unmeasured_p99": unmeasured_q,
            "within_p99": within_q}


def generated(raw: dict) -> list[dict]:
    """Every output record a run produced (a reference's first pass, every DFlash group)."""
    if raw.get("passes"):
        return raw["passes"][0]
    return [o for outs in (raw.get("groups") or {}).values() for o in outs]


def generated_prompts(raw: dict) -> list[int]:
    """Which prompt each of ``generated(raw)`` answered: a group of c serves the first c prompts
    (gate.as_groups), so a grouped run of 1/8/22 holds 31 outputs of 22 distinct prompts."""
    if raw.get("passes"):
        return list(range(len(raw["passes"][0])))
    return [i for outs in (raw.get("groups") or {}).values() for i in range(len(outs))]


def prefix_cache_hits(raw: dict) -> int | None:
    """Prompt tokens served from the prefix cache over the run.

    The sum of each request's ``num_cached_tokens`` where the run recorded them:
    vLLM 0.21.0's ``prefix_cache_hits`` counter loses every group after the first
    (the scheduler drains its stats on a step that produced no output, which async
    scheduling leaves queued at the end of each ``generate``; fixed upstream by
    PR #48668 in 0.29.0). The counter is the fallback for records made before."""
    cached = [o.get("num_cached_tokens") for o in generated(raw)]
    if cached and all(c is not None for c in cached):
        return sum(cached)
    return (raw.get("counters") or {}).get("prefix_cache_hits")


def trained_fields(spec: RunSpec, raw: dict, reference: dict | None) -> dict:
    """What issue 23 asks of every trained-target record, and whether it is a proof:
    outputs worth comparing (gate.py) and, for DFlash, lossless against a
    reproducing reference of the same target."""
    counters = raw.get("counters") or {}
    # A run that failed made no output: an empty block (0 sequences) that fails the gate, not a missing one.
    block = gate.nondegenerate(generated(raw), generated_prompts(raw)) if raw.get("ok") else gate.nondegenerate([])
    fields = {"target_name": raw.get("target_name"), "target_sha256": raw.get("target_sha256"),
              # the criteria this record was judged by (bars.yaml's blob hash)
              "bars": bars.blob_hash(),
              "nondegenerate": block, "preemptions": counters.get("preemptions"),
              "prefix_cache_hits": prefix_cache_hits(raw), "counters": counters,
              "reference": spec.reference,
              **({"quantized_sha256": raw["quantized_sha256"]} if raw.get("quantized_sha256") else {})}
    if spec.oracle:
        fields.update(oracle_fields(raw, reference, block))
    elif spec.mode == "dflash":
        ref_block = gate.nondegenerate(reference["passes"][0]) if reference and reference.get("ok") else None
        fields["reference_nondegenerate"] = ref_block
        fields["proof"] = bool(gate.passes(block) and gate.passes(ref_block) and
                               judge(reference, raw).get("lossless") is True)
        fields["acceptance"] = acceptance(counters)
        if spec.drafter == "trained":
            fields.update(drafter_fields(raw, fields["acceptance"]))
    elif spec.mode in ("reference", "reference-batched"):
        fields["proof"] = bool(gate.passes(block) and passes_agree(raw["passes"])["stable"]) \
            if raw.get("ok") else False
    return fields


def acceptance(counters: dict, k: int = NUM_SPECULATIVE_TOKENS) -> dict | None:
    """vLLM's own acceptance metrics from its spec-decode counters: mean acceptance length
    (1 + accepted drafts per verify step: the bonus token counts one), accepted drafts per step
    and the per-position acceptance rates (gate.acceptance_summary, offline, is the same)."""
    drafts, accepted = counters.get("spec_drafts"), counters.get("spec_accepted_tokens")
    if not drafts or accepted is None:
        return None
    per_pos = counters.get("spec_accepted_per_pos") or []
    return {"drafts": drafts, "mean_acceptance_length": round(1 + accepted / drafts, 4),
            "accepted_per_step": round(accepted / drafts, 4),
            "per_position": [round(c / drafts, 4) for c in per_pos[:k]],
            "histogram": accepted_hist(counters)}


def drafter_fields(raw: dict, measured: dict | None) -> dict:
    """A trained-drafter run's drafter identity and its acceptance beside the offline reference:
    the walk on the model the run computed, the NVFP4 one of its numerics where it exists, else
    the bf16 target (``acceptance_reference_model`` says which); and, where walk_along.py ran, the
    same walk along the text this run wrote, which takes the target's numerics out of the gap."""
    offline, model = raw.get("acceptance_reference") or {}, "bf16"
    numerics = nvfp4_numerics(raw) if "acceptance_reference_nvfp4" in raw else None
    if numerics and (raw["acceptance_reference_nvfp4"] or {}).get(numerics):
        offline, model = raw["acceptance_reference_nvfp4"][numerics], f"nvfp4-{numerics}"
    along = raw.get("acceptance_along_output")  # walk_along.py: the same walk on this run's own text
    return {"drafter_sha256": raw.get("drafter_sha256"),
            "drafter_for_this_target": raw.get("drafter_target_sha256") == raw.get("target_sha256"),
            "acceptance_reference": offline or None,
            "acceptance_reference_model": model,
            "acceptance_ratio_to_reference": _ratio(measured, offline),
            "acceptance_along_output": along,
            "acceptance_ratio_along_output": _ratio(measured, along)}


def _ratio(measured: dict | None, reference: dict | None) -> float | None:
    if not measured or not (reference or {}).get("mean_acceptance_length"):
        return None
    return round(measured["mean_acceptance_length"] / reference["mean_acceptance_length"], 4)


def _key_value(field: str, value):
    # A speed run's record holds its measurement under "speed", where the key asks only
    # "speed run?": a rerun with other numbers is the same configuration.
    if field == "speed":
        return bool(value)
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def merge(existing: list[dict], new: list[dict]) -> list[dict]:
    """Records with the same configuration (vllm, series, key fields) are replaced, except by a
    record of a seeded raw."""
    # RunSpec.key()'s fields; a record written before a field existed had its default.
    # compile_backend is in key() only when set, so name it: a -bi-noinductor record must
    # not replace its -bi twin.
    defaults = {**RunSpec("", "patched", "reference").key(), "compile_backend": None, "trace_inputs": False,
                "capture_drafts": False, "revert": None, "speed": False, "twin_of": None}

    def ident(r: dict) -> tuple:
        # A patched record replaces the same configuration's record of an
        # older series hash: the file holds the newest run of each, and its
        # "series" field says which series that was.
        series = "stock" if r.get("series") == "stock" else "patched"
        # A retrained drafter is another configuration: its runs sit beside the last drafter's
        # (whose ablation rows were measured against them), not over them.
        drafter = r.get("drafter_sha256") if r.get("drafter_kind") == "trained" else None
        # So is a retrained target: a reference run on it sits beside the last target's, whose
        # drafters' rows are judged against that one (the report keeps each to its own target).
        name = r.get("target_name", RANDOM_TARGET_NAME)
        target = r.get("target_sha256") if name != RANDOM_TARGET_NAME else None
        return (r.get("vllm"), series, json.dumps(r.get("target"), sort_keys=True), r.get("drafter_layers"),
                name, target, drafter,
                *(_key_value(k, r.get(k, d)) for k, d in defaults.items() if k != "series"))
    # A record made from a seeded raw (remote.sh seed_raw: another host's reference, an input
    # here) fills a gap but never replaces the record of its configuration: that one may be newer.
    held = {ident(r) for r in existing}
    new = [r for r in new if not (r.get("seeded") and ident(r) in held)]
    fresh = {ident(r) for r in new}
    # A run that failed before it loaded the target has no target fields, so its ident
    # differs from its own rerun's: the rerun of the same name replaces it all the same.
    rerun = {(r["name"], r.get("vllm")) for r in new if r.get("name")}
    return [r for r in existing if ident(r) not in fresh
            and not (not r.get("ok") and (r.get("name"), r.get("vllm")) in rerun)] + new


def _gate_now(r: dict) -> list[str]:
    """The gate as it stands over the blocks a record stored: its own and, for a record judged
    against a reference, the reference's."""
    why = gate.failures(r.get("nondegenerate"))
    if r.get("mode") in ("dflash", "oracle") and r.get("reference"):
        why += [f"reference: {w}" for w in gate.failures(r.get("reference_nondegenerate"))]
    return why


def _gate_now_cell(r: dict) -> str:
    why = _gate_now(r)
    return "passes" if not why else "**not proof**: " + "; ".join(why)


def _series_now_cell(r: dict) -> str:
    state = series_now.staleness(r)
    return "**stale**" if state == "stale" else state


def _stale_headline(records: list[dict]) -> list[str]:
    stale = sum(series_now.staleness(r) == "stale" for r in records)
    failing = sum(bool(_gate_now(r)) for r in records)
    now = ", ".join(f"{v} {series_now.current_hash(v)[:8]}" for v in sorted({r["vllm"] for r in records if r.get("vllm")})
                    if series_now.current_hash(v))
    return [f"**{stale} of {len(records)} records are stale** (ran on a series other than the current one: {now}); "
            f"**{failing} of {len(records)} fail the gate as it stands and are not proof.**", ""]


def _headline(trained: list[dict], oracles: list[dict], earlier: list[dict]) -> list[str]:
    """One row per kind of record and release: the series, how many are proof under the gate as
    it stands, and how many were recorded lossless."""
    rows = []
    for what, records in (("trained target: lossless", trained), ("oracle proposer", oracles),
                          ("random target: start-up only", earlier)):
        for vllm in sorted({r.get("vllm") for r in records if r.get("vllm")}):
            mine = [r for r in records if r.get("vllm") == vllm]
            proof = sum(bool(r.get("proof")) and not _gate_now(r) for r in mine)
            lossless = sum(r.get("lossless") is True for r in mine)
            rows.append((what, vllm, headline.series_cell(mine), f"{proof} of {len(mine)} proof",
                         f"{lossless} of {len(mine)} lossless"))
    return headline.table(rows)


def markdown(records: list[dict], meta: dict) -> str:
    trained = [r for r in records if r.get("target_kind") == "trained" and r.get("mode") != "oracle"]
    oracles = [r for r in records if r.get("mode") == "oracle"]
    earlier = [r for r in records if r.get("target_kind") != "trained"]
    lines = [
        "# Real-shape GPU proof: Gemma 4 26B-A4B layer mix + the public drafter's shape",
        "",
        *_headline(trained, oracles, earlier),
        f"Regenerate: {meta.get('command', 'bash tests/gpu/remote.sh realshape')}. "
        "Target: 30 layers (25 sliding head_dim 256 + 5 full head_dim 512, K=V), MoE top-8; "
        "drafter: 5 layers (4 sliding + 1 full). Lossless = identical to the one-at-a-time "
        "reference, or first divergence on a reference tie (tests/gpu/README.md).",
        "",
        "## Trained target (train_target.py: hidden 256, 32 experts, CPython-stdlib BPE 8k)",
        "",
        "A record is a proof only when its outputs pass the non-degeneracy gate (no constant "
        f"sequence, median distinct-token fraction >= {gate.MIN_MEDIAN_DISTINCT_FRACTION}, no NaN logits, at most "
        f"{gate.MAX_LOOPING_FRACTION:.0%} of sequences whose last {gate.LOOP_WINDOW} tokens repeat with a period of "
        f"{gate.LOOP_MAX_PERIOD} or less, at least {gate.MIN_PROMPTS} distinct prompts of {gate.MIN_GENERATED_TOKENS}+ "
        "tokens; bars.yaml) and, "
        "for DFlash, it is lossless against a reproducing reference of the same target_sha256. \"proof\" is the "
        "verdict recorded with the run; \"gate now\" applies the gate as it stands to the blocks the record "
        "stored (rejudge.md applies it to the raw tokens).",
        "",
        *_stale_headline(trained),
        "| run | series | series now | target sha256 | inputs | quant | drafter (asked → got) | target backend | FA "
        "| KV blocks | sequences / constant / median distinct / near-ties / NaN positions | preemptions | prefix hits "
        "| accepted / drafted | ok | lossless | proof | gate now | detail |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in trained:
        nd = r.get("nondegenerate") or {}
        gate_cell = (f"{nd.get('sequences')} / {nd.get('constant_sequences')} / "
                     f"{nd.get('median_distinct_fraction')} / {nd.get('near_ties')} / "
                     f"{nd.get('nan_positions', '-')}") if nd else "-"
        c = r.get("counters") or {}
        acc = f"{c.get('spec_accepted_tokens')} / {c.get('spec_draft_tokens')}" if r.get("mode") == "dflash" else "-"
        lines.append(
            f"| {r['name']} | {_series_cell(r)} | {_series_now_cell(r)} | {str(r.get('target_sha256') or '-')[:12]} | {_inputs(r)} | "
            f"{r.get('quantization')} | {r.get('drafter_backend') or '-'} → {r.get('drafter_backend_observed') or '-'} | "
            f"{r.get('target_backend_observed') or '-'} | {r.get('flash_attn_version') or 'default'} | "
            f"{r.get('num_kv_blocks') or '-'}{' (override)' if r.get('kv_blocks') else ''} | {gate_cell} | "
            f"{r.get('preemptions')} | {r.get('prefix_cache_hits')} | {acc} | {'yes' if r.get('ok') else 'no'} | "
            f"{r.get('lossless')} | {r.get('proof')} | {_gate_now_cell(r)} | {_detail(r)} |")
    lines += _drafter_section([r for r in trained if r.get("drafter_kind") == "trained"])
    lines += _oracle_section(oracles)
    lines += [
        "",
        "## Earlier records: random target (degenerate)",
        "",
        "Kept as run, but they prove start-up and no crash only: that target copied each prompt's "
        "last token forever (every reference sequence constant), and the random drafter had no "
        "draft accepted, so no lossless verdict below could have failed.",
        "",
        "| vLLM | series | run | inputs | quant | drafter backend (asked → got) | target backend | FA | graphs | KV blocks | ok | lossless | error / divergences |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in earlier:
        label = r["name"] + (" (diagnostic)" if r.get("diagnostic") else "")
        lines.append(
            f"| {r.get('vllm')} | {_series_cell(r)} | {label} | "
            f"{_inputs(r)} | {r.get('quantization')} | "
            f"{r.get('drafter_backend') or '-'} → {r.get('drafter_backend_observed') or '-'} | "
            f"{r.get('target_backend_observed') or '-'} | "
            f"{r.get('flash_attn_version') or '-'} | {'on' if r.get('cuda_graphs') else 'eager'} | "
            f"{r.get('num_kv_blocks') or '-'}{' (override)' if r.get('kv_blocks') else ''} | "
            f"{'yes' if r.get('ok') else 'no'} | {r.get('lossless')} | {_detail(r)} |")
    return caveats.with_caveats("\n".join(lines) + "\n")


def _drafter_section(records: list[dict]) -> list[str]:
    """Issue 25: the trained drafter's acceptance in vLLM beside train_drafter.py's offline estimate."""
    if not records:
        return []
    lines = [
        "",
        "## Trained drafter (issue 25): acceptance from vLLM's spec-decode counters",
        "",
        "Mean acceptance length = 1 + accepted drafts per verify step (vLLM's definition), over every "
        "request of the run's concurrency groups. Offline: train_drafter.py's PyTorch estimate on the same "
        "prompts, the same groups and this release's attention semantics, on the bf16 target.",
        "",
        "| run | quant | drafter sha256 | for this target | verify steps | mean acceptance length (vLLM) "
        "| offline | vLLM / offline | per-position rates (vLLM, 1..15) | lossless | proof |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        acc = r.get("acceptance") or {}
        off = r.get("acceptance_reference") or {}
        rates = " ".join(f"{x:.2f}" for x in acc.get("per_position") or []) or "-"
        lines.append(
            f"| {r['name']} | {r.get('quantization')} | {str(r.get('drafter_sha256') or '-')[:12]} | "
            f"{r.get('drafter_for_this_target')} | {acc.get('drafts', '-')} | "
            f"{acc.get('mean_acceptance_length', '-')} | {off.get('mean_acceptance_length', '-')} | "
            f"{r.get('acceptance_ratio_to_reference') or '-'} | {rates} | {r.get('lossless')} | {r.get('proof')} |")
    return lines


def _oracle_section(records: list[dict]) -> list[str]:
    """Issue 24: oracle runs, their histograms and the checks a proof needs."""
    if not records:
        return []
    lines = [
        "",
        "## Oracle runs (issue 24): every accepted length through the verify step",
        "",
        "The DFlash engine of the run above it, with tests/gpu/runs/oracle.py overwriting each proposal "
        "by the reference's continuation, wrong at a planned position, so drafts of every accepted "
        f"length 0..{NUM_SPECULATIVE_TOKENS} are verified. Proof = lossless against the reference cut "
        "to the oracle's length (reference length - K), both gates pass, vLLM's histogram (from "
        "spec_decode_num_drafts and _per_pos) has every length and equals the oracle's, and the "
        "oracle's log is clean (no mismatch, unplanned verify, unknown row, wrong sampled token, tail draft).",
        "",
        "| run | reference | quant | KV blocks | new tokens | accepted_hist (vLLM, lengths 0..15) "
        "| planned_hist (oracle) | equal | every length | lossless (cut) | gates | log clean "
        "| preemptions | prefix hits | proof | detail |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        checks = r.get("oracle_checks") or {}
        lengths = sorted(set(r.get("oracle_max_tokens") or [])) or ["-"]
        lines.append(
            f"| {r['name']} | {r.get('reference') or '-'} | {r.get('quantization')} | "
            f"{r.get('num_kv_blocks') or '-'}{' (override)' if r.get('kv_blocks') else ''} | "
            f"{'/'.join(map(str, lengths))} | {_hist_cell(r.get('accepted_hist'))} | "
            f"{_hist_cell(r.get('planned_hist'))} | {r.get('hist_equal')} | {checks.get('every_length')} | "
            f"{r.get('lossless')} | {checks.get('nondegenerate')} | {checks.get('oracle_log_clean')} | "
            f"{r.get('preemptions')} | {r.get('prefix_cache_hits')} | {r.get('proof')} | {_detail(r)} |")
    return lines


def _hist_cell(hist: list[int] | None) -> str:
    return " ".join(map(str, hist)) if hist else "-"


def _series_cell(r: dict) -> str:
    return r["series"] if r["series"] == "stock" else f"series {str(r['series'])[:8]}"


def _detail(r: dict) -> str:
    if r.get("error"):
        return str(r["error"])
    if r.get("mode") in ("dflash", "oracle", "reference-grouped"):
        v = r.get("verdict", {})
        divs = r.get("divergences") or []
        detail = f"{v.get('identical', '?')}/{v.get('prompt_runs', '?')} identical"
        if divs:
            worst = max((d.get("gap") or 0 for d in divs), default=0)
            detail += f"; {len(divs)} divergent (ties: {sum(d['tie'] for d in divs)}, max gap {worst:.3g})"
        if v.get("reason"):
            detail += f"; {v['reason']}"
        split = v.get("preemption")
        if split and divs:
            detail += (f"; divergent with their request preempted: {split['diverged_preempted']}, "
                       f"not preempted: {split['diverged_not_preempted']} "
                       f"({split['prompt_runs_preempted']} prompt runs preempted)")
        if any(d.get("inputs") for d in divs):
            wrong = sum(bool((d.get("inputs") or {}).get("mismatches")) for d in divs)
            detail += f"; fed a wrong token before diverging: {wrong} of {len(divs)}"
        if v.get("kv_conflicts") is not None:
            detail += (f"; KV blocks taken while still read: {v['kv_conflicts']['conflicts']} "
                       f"(divergent victims: {sum(bool(d.get('kv_victim')) for d in divs)} of {len(divs)})")
        eq = r.get("draft_equivalence")
        if eq:
            detail += (f"; drafts equal to the reference's: {eq.get('equal')}/{eq.get('contexts')} contexts "
                       f"({eq.get('ties')} on ties)")
        noise = r.get("batch_noise")
        if noise and "margin_bound" in noise:
            verdict = {True: "yes", False: "no", None: "not decided"}[noise["within"]]
            detail += (f"; within the batching noise of {noise['run']} (margin moves up to "
                       f"{noise['margin_bound']:.3g}, here {noise['own_margin_shift']:.3g}; divergences "
                       f"{noise['explained']} explained, {noise['unmeasured']} unmeasured, "
                       f"{noise['unexplained']} not): {verdict}")
        if r.get("mode") == "oracle":
            o = r.get("oracle") or {}
            detail += (f"; {o.get('verified', '?')} verified, {o.get('num_mismatches', '?')} mismatches, "
                       f"{o.get('trimmed_drafts', '?')} trimmed")
        return detail
    if r.get("mode") == "init":
        return "target and drafter loaded (images allowed: load only, no KV cache)" if r.get("ok") else "-"
    det = r.get("determinism") or {}
    return "two passes identical" if det.get("stable") else f"passes differ: prompts {det.get('prompts_differing')}"


def _inputs(r: dict) -> str:
    if r.get("image_limit"):
        return f"images allowed ({r['image_limit']})"
    return "mm-prefix" if r.get("mm_prefix", True) else "text-only"


# ------------------------------------------------------------------- parent


def run_one(spec: RunSpec, models: Path, site: str, logs: Path, token_limit: int,
            timeout: float) -> dict:
    env = dict(os.environ)
    if spec.drafter == "trained" and not (drafter_dir(spec, models) / "config.json").exists():
        return {"name": spec.name, "ok": False, "exit": None,
                "error": {"root_cause": f"no trained drafter at {drafter_dir(spec, models)}: "
                                        "run remote.sh train-drafter first"}}
    if spec.oracle:
        try:
            env.update(prepare_oracle(spec, models, logs))
        except OracleSetupError as exc:  # a failed run with the reason, never a skip
            return {"name": spec.name, "ok": False, "exit": None, "error": {"root_cause": str(exc)}}
    # The engine core in this child's process: run_modes._runner inspects the runner,
    # and the oracle's hooks (install_oracle) patch it there.
    env.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", PYTHONUNBUFFERED="1")
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if spec.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    env["VLLM_CACHE_ROOT"] = str(compile_cache_root(env, spec.vllm, site))
    res_file, log_file = logs / f"{spec.name}.json", logs / f"{spec.name}.log"
    probe_file = logs / f"{spec.name}.probe.jsonl"
    # A result left by an earlier command on this host must not stand in for a child
    # that died before writing its own.
    res_file.unlink(missing_ok=True)
    if spec.probe:
        env.update(CUDA_LAUNCH_BLOCKING="1", REALSHAPE_PROBE_OUT=str(probe_file))
        probe_file.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--child", spec.name, "--models", str(models),
           "--token-limit", str(token_limit), "--result", str(res_file)]
    rc = run_modes.run_logged(cmd, env, log_file, timeout)
    text = log_file.read_text(errors="replace")
    raw = json.loads(res_file.read_text()) if res_file.exists() else {
        "name": spec.name, "ok": False, "error": {"root_cause": f"child exit {rc}"}}
    raw["exit"] = rc
    raw.update(run_modes.parse_log(text))
    raw["log_text_for_backends"] = [ln for ln in text.splitlines() if "NvFp4" in ln or "NVFP4" in ln][:20]
    raw["log_tail"] = text.splitlines()[-30:]
    if probe_file.exists():
        raw["probe"] = [json.loads(ln) for ln in probe_file.read_text().splitlines() if ln.strip()]
    # The failing kernel and the lines around a device-side assert.
    raw["assert_lines"] = [ln for ln in text.splitlines()
                           if "Assertion" in ln or "index out of bounds" in ln][:10]
    if spec.oracle:
        raw.update(oracle_result(spec, logs, raw.get("oracle_max_tokens")))
    return raw


def compile_cache_root(env: dict, vllm: str, site: str | None) -> Path:
    """vLLM's cache folder for the tree a run imports. The AOT compile cache keys a graph by the
    config and the forward's name, not by the runner that set the DFlash target's aux hidden-state
    layers on the model, so the series less `dflash-target-layer-ids-offset` and the series less
    another patch share a key: a run of the second once loaded the first's graph and fed
    its drafter layers one too early. One folder per tree keeps each tree's graphs its own."""
    base = Path(env.get("VLLM_CACHE_ROOT") or Path.home() / ".cache" / "vllm")
    return base / "trees" / f"{vllm}-{(run_tree_hash(site) or 'stock')[:16]}"


def stale_compile_artifacts(raws: dict[str, dict]) -> dict[str, list[dict]]:
    """Per run, the compiled graphs it loaded that only runs on other vLLM trees saved (the raw
    records of one raw folder, one machine): its target may not be the one its tree builds."""
    savers: dict[str, list[tuple[str, str | None]]] = {}
    for name, raw in raws.items():
        for key in (raw.get("compile_artifacts") or {}).get("saved", []):
            savers.setdefault(key, []).append((name, raw.get("series_hash")))
    stale = {}
    for name, raw in raws.items():
        found = [{"artifact": key, "saved_by": [n for n, _ in savers[key]],
                  "trees": sorted({str(t) for _, t in savers[key]})}
                 for key in (raw.get("compile_artifacts") or {}).get("loaded", [])
                 if key in savers and all(t != raw.get("series_hash") for _, t in savers[key])]
        if found:
            stale[name] = found
    return stale


def _with_compile_artifacts(raw: dict, log: Path) -> dict:
    """Raw records written before they carried ``compile_artifacts``: read them from the run's log."""
    if "compile_artifacts" in raw or not log.exists():
        return raw
    return raw | {"compile_artifacts": run_modes.parse_log(log.read_text(errors="replace"))["compile_artifacts"]}


def load_raws(raw_dir: Path, walks_dir: Path | None = None) -> dict[str, dict]:
    """The raw records of a folder, by run name, with what the merge reads beside them: compiled
    graphs from the runs' logs where a record predates them, the runs that loaded another tree's
    graph, the runs seeded from another host (``seeded``), and (``walks_dir``) the NVFP4
    walks of NVFP4 runs recorded before those existed."""
    raws = {p.name[:-len(".raw.json")]: _with_compile_artifacts(json.loads(p.read_text()),
                                                                 raw_dir / p.name.replace(".raw.json", ".log"))
            for p in sorted(raw_dir.glob("*.raw.json"))}
    for name in seeded_runs(raw_dir) & raws.keys():
        raws[name] = raws[name] | {"seeded": True}
    for name, found in stale_compile_artifacts(raws).items():
        raws[name] = raws[name] | {"stale_compile_artifacts": found}
    walks = sorted(walks_dir.glob("nvfp4-evaluation*.json")) if walks_dir else []
    for name, raw in raws.items():
        spec = RUNS.get(name)
        if walks and spec and spec.quant == "modelopt-nvfp4" and spec.drafter == "trained":
            # A run that ended while the walks ran beside it holds those that existed then.
            found = nvfp4_walks(walks, spec, raw.get("drafter_sha256"), raw.get("quantized_sha256"))
            raws[name] = raw | {"acceptance_reference_nvfp4": found | (raw.get("acceptance_reference_nvfp4") or {})}
    return raws


def seeded_runs(raw_dir: Path) -> set[str]:
    """The runs whose raw record in ``raw_dir`` was seeded from another host, not run here."""
    return {n[:-len(".raw.json")] for n in seeded.names(raw_dir) if n.endswith(".raw.json")}


def order_runs(names: list[str]) -> list[str]:
    """Names in the order asked, except that an oracle run listed before its reference
    moves to just after it (the oracle's plan is made from the reference's raw record)."""
    out = list(names)
    for name in reversed(names):  # reversed: oracle runs sharing a reference keep their order
        ref = RUNS[name].reference if RUNS[name].oracle else None
        if ref in out and out.index(ref) > out.index(name):
            out.remove(name)
            out.insert(out.index(ref) + 1, name)
    return out


def lane_gpus(lanes: int, gpus: list[str] | None) -> list[str | None]:
    """The GPU each of ``lanes`` lanes runs on: ``gpus`` (RS_LANE_GPUS) round-robin, or None
    for every lane where none are named (all on the first GPU, as before GPUs were named)."""
    return [gpus[i % len(gpus)] if gpus else None for i in range(lanes)]


def lane_problems(lanes: str, raw_dir: Path, gpus: list[str] | None = None, vllm: str | None = None) -> list[str]:
    """RS_PARALLEL lanes ("a,b;c,d") run side by side: an oracle run needs its reference
    in its own lane (order_runs puts it first), or a raw record of it from an earlier
    command that no lane rewrites meanwhile. A speed run (issue 25) times the GPU: it runs
    only in a lane that has its GPU to itself (one lane, or RS_LANE_GPUS giving it a GPU
    no other lane of this command gets). Every name must be a run of ``vllm`` (where given):
    checked here, before a GPU machine spends its time installing for a typo."""
    split = [[n for n in lane.split(",") if n] for lane in lanes.split(";")]
    placed = lane_gpus(len(split), gpus)
    problems = [f"{n}: no such run (realshape.RUNS)" for lane in split for n in lane if n not in RUNS]
    if vllm:
        problems += [f"{n}: a vLLM {RUNS[n].vllm} run in the {vllm} lanes"
                     for lane in split for n in lane if n in RUNS and RUNS[n].vllm != vllm]
    for lane, gpu in zip(split, placed):
        if placed.count(gpu) > 1:
            problems += [f"{n}: a speed run needs the GPU to itself: run it with RUNS, or give its lane a GPU of "
                         f"its own (RS_LANE_GPUS)" for n in lane if n in RUNS and RUNS[n].speed]
    for lane in split:
        for name in lane:
            spec = RUNS.get(name)
            if spec is None or not spec.oracle or spec.reference in lane:
                continue
            elsewhere = any(spec.reference in other for other in split if other is not lane)
            if elsewhere or not (raw_dir / f"{spec.reference}.raw.json").exists():
                problems.append(f"{name}: its reference {spec.reference} runs in another lane or has no raw record "
                                f"yet: put {spec.reference} in the same lane")
    return problems


# What a lane's process is given unless the caller's environment says otherwise: each lane's
# engines share one GPU with the other lanes' (RS_GPU_UTIL of its memory, RS_KV_CACHE_GIB of KV)
LANE_ENV_DEFAULTS = {"RS_GPU_UTIL": "0.25", "RS_KV_CACHE_GIB": "6"}
# The options of a lanes run that its lanes' processes are not given
_LANES_ONLY = ("--run-lanes", "--lane-gpus", "--lane-stagger-s")


def lane_jobs(argv: list[str], lanes: str, raw_dir: Path, gpus: list[str] | None, environ=os.environ,
              script: Path | None = None) -> list:
    """RS_PARALLEL lanes ("a,b;c,d") as processes side by side: each ``script`` (this one) with
    ``argv`` less the lanes options and with ``--runs`` its lane, on its GPU (``lane_gpus``),
    logging to ``<raw_dir>-lane-I.log`` (named by the raw folder: two releases' lanes may run at once)."""
    import side_by_side

    rest = side_by_side.without_options(argv, _LANES_ONLY)
    split = [lane for lane in lanes.split(";") if lane]
    env = {k: environ.get(k, v) for k, v in LANE_ENV_DEFAULTS.items()}
    script = Path(__file__).resolve() if script is None else script
    return [side_by_side.Job([sys.executable, str(script), *rest, "--runs", lane],
                             raw_dir.parent / f"{raw_dir.name}-lane-{i}.log",
                             {**env, **({"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {})})
            for i, (lane, gpu) in enumerate(zip(split, lane_gpus(len(split), gpus)))]


def run_tree_hash(site: str | None) -> str | None:
    """The series hash stamped into the vLLM tree a run imported (the first entry of its
    PYTHONPATH), or None for an unpatched tree."""
    if not site:
        return None
    stamp = read_stamp(Tree(Path(site.split(":")[0]), "site-packages"))
    return stamp.get("series_hash") if stamp else None


def _reverted_site(args, patch_id: str) -> str:
    """The PYTHONPATH of the tree without ``patch_id``: that tree, then the rest of
    --site-patched's path (the bundle's site with vLLM's dependencies)."""
    if not args.reverted_sites:
        raise SystemExit(f"a run reverts {patch_id}: pass --reverted-sites")
    tree = Path(args.reverted_sites) / patch_id
    if not tree.is_dir():
        # Otherwise the run would import the stock vLLM further down the path and be
        # recorded as the whole series.
        raise SystemExit(f"a run reverts {patch_id}, but {tree} does not exist (remote.sh reverted_sites)")
    rest = args.site_patched.split(":", 1)[1:] if args.site_patched else []
    return ":".join([str(tree), *rest])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child")
    parser.add_argument("--result", type=Path)
    parser.add_argument("--token-limit", type=int, default=4080)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--site-stock")
    parser.add_argument("--site-patched", help="vLLM with the whole series (text-only runs)")
    parser.add_argument("--site-patched-mm", help="vLLM with the series less the text-only patch "
                        "(mm-prefix runs; default: --site-patched)")
    parser.add_argument("--reverted-sites", help="folder of vLLM trees, one per reverted patch id "
                        "(<folder>/<id>: the series less that patch), for runs with a revert")
    parser.add_argument("--runs", help=f"comma-separated, from {list(RUNS)} (default: all, ranked)")
    parser.add_argument("--reverts-of", help="print the patch ids the named runs revert, and exit")
    parser.add_argument("--raw-dir", type=Path, help="per-run raw results and logs")
    parser.add_argument("--out", type=Path, help="realshape.json to merge into")
    parser.add_argument("--md", type=Path)
    parser.add_argument("--meta", type=Path)
    parser.add_argument("--nvfp4-walks", type=Path, metavar="DIR",
                        help="with --merge-only: nvfp4_reference.py's records (nvfp4-evaluation*.json) for NVFP4 "
                             "runs recorded before them")
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--vllm", help="the release under --site-*: only its runs (default 0.21.0; with "
                        "--check-lanes, each lane's runs must be its)")
    parser.add_argument("--merge-only", action="store_true",
                        help="run nothing: judge the raw runs in --raw-dir and merge them into --out")
    parser.add_argument("--check-lanes", metavar="RS_PARALLEL",
                        help="run nothing: exit 2 if an oracle run of these lanes may start before its reference")
    parser.add_argument("--lane-gpus", metavar="IDS",
                        help="with --check-lanes or --run-lanes: the GPUs the lanes take round-robin (RS_LANE_GPUS, "
                             "e.g. 0,1,2,3)")
    parser.add_argument("--run-lanes", metavar="RS_PARALLEL",
                        help="the lanes side by side, each this script with its runs (--runs) and the other options; "
                             "raw records only (a merge judges them after); a lane that fails does not stop the others")
    parser.add_argument("--lane-stagger-s", type=float, default=20.0, help="with --run-lanes: seconds between lane starts")
    args = parser.parse_args(argv)
    gpus = [g for g in (args.lane_gpus or "").split(",") if g] or None
    if args.check_lanes is not None:
        problems = lane_problems(args.check_lanes, args.raw_dir or Path("/tmp/realshape-raw"), gpus, args.vllm)
        print("\n".join(problems) or "lanes ok", flush=True)
        return 2 if problems else 0
    if args.run_lanes is not None:
        import side_by_side

        if args.raw_dir is None:
            parser.error("--run-lanes needs --raw-dir")
        # the lanes run the script this process runs as (a stand-in's, under test)
        jobs = lane_jobs(sys.argv[1:] if argv is None else argv, args.run_lanes, args.raw_dir, gpus,
                         script=Path(sys.argv[0]).resolve() if sys.argv[0].endswith(".py") else None)
        codes = side_by_side.run(jobs, args.lane_stagger_s)
        print("lanes ended: " + ", ".join(f"{j.log.name} rc {c}" for j, c in zip(jobs, codes)), flush=True)
        return 0
    args.vllm = args.vllm or "0.21.0"
    if args.reverts_of is not None:
        # None named: the runs remote.sh runs when neither RUNS nor RS_PARALLEL narrows them.
        names = [n for n in re.split(r"[,;]", args.reverts_of) if n] or \
            [n for n, r in RUNS.items() if r.trained and r.vllm == args.vllm]
        print(" ".join(sorted({RUNS[n].revert for n in names
                               if n in RUNS and RUNS[n].revert and RUNS[n].vllm == args.vllm})))
        return 0
    if args.child:
        res = run_child(RUNS[args.child], args.models, args.token_limit)
        args.result.write_text(json.dumps(res) + "\n")
        return 0
    names = [] if args.merge_only else \
        args.runs.split(",") if args.runs else [n for n, r in RUNS.items() if r.vllm == args.vllm]
    unknown = set(names) - set(RUNS)
    if unknown:
        parser.error(f"unknown run(s) {sorted(unknown)}")
    names = order_runs(names)
    other = sorted(n for n in names if RUNS[n].vllm != args.vllm)
    if other:
        parser.error(f"run(s) {other} need another vLLM than --vllm {args.vllm}")
    meta = json.loads(args.meta.read_text()) if args.meta else {}
    raw_dir = args.raw_dir or Path("/tmp/realshape-raw")
    raw_dir.mkdir(parents=True, exist_ok=True)
    shapes = args.models / "shapes.json"
    token_limit = json.loads(shapes.read_text())["prompt_token_limit"] if shapes.exists() else 0
    started = time.time()
    for name in names:
        spec = RUNS[name]
        left = args.deadline_s - (time.time() - started)
        if left < 45:
            print(f"[{name}] skipped: deadline", flush=True)
            continue
        # Trained runs allow images (multimodal recipe) or are text-only, so the
        # whole series serves both; the series-less-0008 tree is for token-id
        # prompts with limits of 0 on the random target.
        site = (args.site_stock if spec.series == "stock"
                else _reverted_site(args, spec.revert) if spec.revert
                else args.site_patched_mm if spec.mm_prefix and args.site_patched_mm and not spec.trained
                else args.site_patched)
        print(f"[{name}] ...", flush=True)
        t0 = time.time()
        raw = run_one(spec, args.models, site, raw_dir, token_limit, min(CHILD_TIMEOUT_S, left + 30))
        raw["series_hash"] = run_tree_hash(site)
        (raw_dir / f"{name}.raw.json").write_text(json.dumps(raw) + "\n")
        seeded.unseed(raw_dir, f"{name}.raw.json")
        status = "ok" if raw.get("ok") else f"FAILED: {raw.get('log_error_line') or raw.get('error')}"
        print(f"    {time.time() - t0:.0f}s {status}", flush=True)
    # Verdicts use every raw result present (earlier commands on this host too).
    raws = load_raws(raw_dir, args.nvfp4_walks)
    records = []
    for name, raw in raws.items():
        if name not in RUNS or RUNS[name].vllm != args.vllm:
            continue
        spec = RUNS[name]
        if spec.oracle and oracle_paths(spec, raw_dir)[1].exists():
            raw.update(oracle_result(spec, raw_dir, raw.get("oracle_max_tokens")))  # this analysis, not the run's
        ref_spec = reference_for(spec)
        reference = raws.get(ref_spec.name) if ref_spec else None
        records.append(record(spec, raw, reference, meta, raws.get(spec.noise) if spec.noise else None))
    if args.out:
        existing = json.loads(args.out.read_text()) if args.out.exists() else []
        merged = merge(existing, records)
        args.out.write_text(json.dumps(merged, indent=1) + "\n")
        if args.md:
            args.md.write_text(markdown(merged, meta))
    for r in records:
        print(f"{r['name']}: ok={r['ok']} lossless={r['lossless']} drafter={r['drafter_backend_observed']} "
              f"err={r['error']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
