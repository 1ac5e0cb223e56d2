"""Does vLLM's scheduler hand a KV block to one (request, group) while another still reads it?

Usage: ``python sched_sim_probe.py TREE [--sync] [--seed N] [--num-blocks N] [--accept-all]
[--prompt-extra N]`` (every prompt N tokens longer);
prints one JSON object. Two more modes, for the per-patch tests of 0014 and 0015:
``--single P [--connector none|sync|async] [--external N]`` schedules one request of
a P-token prompt once (optionally with a KV connector stand-in that reports N
externally cached tokens, loaded synchronously or asynchronously) and reports the
blocks it got and where its drafter queries land; ``--lookahead-by-method`` builds
the real ``Scheduler`` for each speculative method and reports its
``num_lookahead_tokens``. ``TREE`` is a vLLM 0.21.0 site-packages tree (the
released one, or one with patches applied, e.g. 0013 through
``tests.integration.patch_trees.single_patch_tree``).

What runs for real (the tree's own code): ``Scheduler.__init__``,
``Scheduler.schedule`` (every branch this workload reaches: running requests,
preemption, waiting and resumed requests, prefix-cache lookups,
``_make_cached_request_data``, ``_update_after_schedule``),
``update_from_output``, ``update_draft_token_ids`` (synchronous scheduling),
``AsyncScheduler`` (``_update_after_schedule``, ``_update_request_with_output``),
``add_request``, ``_free_request``, ``check_stop``, and below them the real
``KVCacheManager``, ``HybridKVCacheCoordinator``, ``SlidingWindowManager`` /
``FullAttentionManager``, ``BlockPool``, ``Request``, the request queues
(``sched/request_queue.py``), ``SchedulerOutput`` / ``NewRequestData`` /
``CachedRequestData`` (``sched/output.py``), ``EncoderCacheManager``,
``resolve_kv_cache_block_sizes`` and the block hasher. The modules are loaded
with ``sliding_window_async_probe.install`` (real ``sys.modules`` names, hence a
subprocess); ``scheduler.py`` and ``async_scheduler.py`` are executed from their
source with ``tests/patches/vllm_source.py``.

Stand-ins (only what needs a GPU, compiled code or vLLM's other dependencies):
``torch``, the logger, ``vllm.envs`` (``VLLM_USE_V2_MODEL_RUNNER`` off, the
default), the hash function (SHA-256 of the pickle, as vLLM's ``sha256``), KV
and engine event classes, the KV event publisher, the metrics records,
``EngineCoreOutput(s)`` and ``PrefillStats`` (plain records), ``SamplingParams`` (the fields
``Request`` and ``check_stop`` read: max_tokens 128, no EOS/stop token, as
ignore_eos), the multimodal registry (no multimodal inputs), the structured
output manager (none), ``record_function_or_nullcontext`` (a null context),
and ``vllm_config`` (a namespace holding the configs ``Scheduler.__init__``
reads, with the values ``LLM(...)`` gives this setup: see ``CONFIG``).
The engine loop is written out: ``EngineCore.step`` (synchronous: schedule,
execute, ``update_from_output``, then ``update_draft_token_ids`` in
``post_step``) and ``EngineCore.step_with_batch_queue`` (async: queue of 2,
step N+1 scheduled before step N's output is processed; an empty step is
processed at once, as there). The model runner is written out too: it samples
one token per request that is not a partial prefill (every draft rejected; with
``--accept-all``, every draft accepted: the drafts and a bonus token),
drafts 15 random tokens (sync) and keeps the worker's per-request block tables
the way ``GPUModelRunner._update_states`` does (new requests' ``block_ids``,
running requests' ``new_block_ids`` appended, resumed requests' replaced,
finished requests dropped; the scheduler's null-block replacement of skipped
sliding-window blocks never reaches the worker), with positions corrected for
rejected drafts as its deferred spec-decode correction does.

Slots: every scheduled token's slot in every group (``table[g][pos // bs] * bs
+ pos % bs``), and DFlash's query writes (bonus + 15 masks at the positions
after the last accepted one, group 6, for every request of the step, as
``copy_and_expand_dflash_inputs_kernel`` computes them). A position beyond the
request's table (no block allocated there) gets slot -1 and is listed under
``beyond_table``: on the GPU it would read whatever id the persistent batch
row holds there. Ownership is checked by ``input_trace.block_conflicts`` (tests/gpu/runs/input_trace.py).

Not covered: the persistent batch itself (row moves in ``condense``, stale row
tails), the drafter's own metadata beyond its slot mapping, CUDA graphs.

What it shows (any seed: the schedule depends on lengths and prefix identity only):
the released tree under async scheduling gives sliding-window blocks to other
requests while their owner's window still reads them (210 conflicts, 17
preemptions); with 0013 none, async (22 preemptions) or sync (16), so the
scheduler side is clean. In every tree and mode DFlash's query writes after a
prefill admitted from the waiting queue reach past the request's group-6 table
(about 31 request-steps, 365-408 positions): ``Scheduler.schedule`` allocates
such a request no lookahead slots (``effective_lookahead_tokens = 0`` when
``request.num_computed_tokens == 0``), and ``copy_and_expand_dflash_inputs_kernel``
reads the block table row past its blocks (clamped only to the row's width),
where ``InputBatch.condense`` -> ``BlockTable.move_row`` leaves the moved
request's ids behind (the source row is not cleared).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_paths  # noqa: E402,F401  (the harness's group folders)

from tests.integration import series_0_21_0_probe as probe  # noqa: E402
from tests.integration import sliding_window_async_probe as swp  # noqa: E402
from input_trace import block_conflicts  # noqa: E402

PROMPTS = [16, 300, 40, 656, 1500, 96, 700, 688, 24, 1200, 160, 736, 64, 900, 256, 840, 20, 480, 128, 960,
           1000, 48, 360, 1140, 200, 800, 32, 664, 600, 1400, 80, 790]
FIRST_WAVE = 17
MAX_TOKENS = 128
SPEC = 15
WINDOW = 128
NUM_BLOCKS = 1000
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 32
# LLM(...) on an H100 (>= 70 GiB, not A100): max_num_batched_tokens 16384 (arg_utils
# get_batch_defaults, LLM_CLASS), min(16384, max_num_seqs * max_model_len = 65536).
# DFlash sets parallel_drafting, so max_num_new_slots_for_drafting = 15 - 1 = 14 and
# max_num_scheduled_tokens = 16384 - 14 * 32 = 15936 (VllmConfig._set_max_num_scheduled_tokens).
MAX_NUM_BATCHED_TOKENS = 16384
MAX_NUM_SCHEDULED_TOKENS = MAX_NUM_BATCHED_TOKENS - (SPEC - 1) * MAX_NUM_SEQS
CONFIG = {"max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS, "max_num_scheduled_tokens": MAX_NUM_SCHEDULED_TOKENS,
          "max_num_seqs": MAX_NUM_SEQS, "max_model_len": MAX_MODEL_LEN, "enable_chunked_prefill": True,
          "long_prefill_token_threshold": 0, "policy": "fcfs", "scheduler_reserve_full_isl": True,
          "enable_prefix_caching": True, "num_speculative_tokens": SPEC, "method": "dflash (use_eagle() True)"}
METHODS = ["dflash", "eagle", "eagle3", "mtp", "draft_model", "ngram"]
# (block_size, sliding_window) per KV cache group: 0-4 sliding, 5 full, 6 the drafter.
GROUPS = [(16, WINDOW)] * 5 + [(16, None), (32, None)]
DRAFTER_GID = 6
# The tree's files this probe reads (for a minimal patched tree).
READS = [
    "vllm/utils/math_utils.py", "vllm/utils/__init__.py", "vllm/v1/utils.py", "vllm/v1/kv_cache_interface.py",
    "vllm/v1/request.py", "vllm/v1/core/kv_cache_utils.py", "vllm/v1/core/kv_cache_metrics.py",
    "vllm/v1/core/block_pool.py", "vllm/v1/core/single_type_kv_cache_manager.py",
    "vllm/v1/core/kv_cache_coordinator.py", "vllm/v1/core/kv_cache_manager.py",
    "vllm/v1/core/encoder_cache_manager.py", "vllm/v1/core/sched/output.py",
    "vllm/v1/core/sched/request_queue.py", "vllm/v1/core/sched/interface.py", "vllm/v1/core/sched/utils.py",
    "vllm/v1/core/sched/scheduler.py", "vllm/v1/core/sched/async_scheduler.py",
]


def load(root: Path):
    swp.install(root)
    for name in ("vllm/v1/core/sched/output", "vllm/v1/core/sched/request_queue",
                 "vllm/v1/core/encoder_cache_manager"):
        probe._load(name.replace("/", "."), root / f"{name}.py")
    swp._module("vllm.multimodal", __path__=[], MULTIMODAL_REGISTRY=None, MultiModalRegistry=object)
    probe._load("vllm.v1.core.sched.interface", root / "vllm/v1/core/sched/interface.py")
    # PrefillStats: a record that keeps what set() is given (metrics only).
    sys.modules["vllm.v1.request"].PrefillStats = type(
        "PrefillStats", (), {"set": lambda self, **kwargs: self.__dict__.update(kwargs)})
    return swp.scheduler_classes(root, envs=types.SimpleNamespace(VLLM_USE_V2_MODEL_RUNNER=False),
                                 record_function_or_nullcontext=lambda name: contextlib.nullcontext())


def kv_cache_config(num_blocks: int):
    kvi = sys.modules["vllm.v1.kv_cache_interface"]
    groups = []
    for gid, (bs, window) in enumerate(GROUPS):
        layers = [f"model.layers.{gid * 5 + i}.self_attn.attn" for i in range(5)]
        if window:
            spec = kvi.SlidingWindowSpec(block_size=bs, num_kv_heads=8, head_size=256, dtype=probe.BF16,
                                         sliding_window=window)
        else:
            spec = kvi.FullAttentionSpec(block_size=bs, num_kv_heads=2 if gid == 5 else 4,
                                         head_size=512 if gid == 5 else 128, dtype=probe.BF16)
        groups.append(kvi.KVCacheGroupSpec(layers, spec))
    return kvi.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def speculative_config(method: str):
    """The SpeculativeConfig fields and predicates Scheduler.__init__ reads (as in vllm/config/speculative.py)."""
    return types.SimpleNamespace(
        num_speculative_tokens=SPEC, method=method,
        use_eagle=lambda: method in ("eagle", "eagle3", "mtp", "dflash"),
        use_dflash=lambda: method == "dflash", uses_draft_model=lambda: method == "draft_model")


def vllm_config(num_blocks: int, async_scheduling: bool, method: str = "dflash"):
    ns = types.SimpleNamespace
    spec = speculative_config(method)
    return ns(
        scheduler_config=ns(max_num_seqs=MAX_NUM_SEQS, max_num_scheduled_tokens=MAX_NUM_SCHEDULED_TOKENS,
                            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, policy="fcfs",
                            long_prefill_token_threshold=0, enable_chunked_prefill=True,
                            scheduler_reserve_full_isl=True, async_scheduling=async_scheduling),
        cache_config=ns(num_gpu_blocks=num_blocks, enable_prefix_caching=True, mamba_cache_mode="none",
                        block_size=16, hash_block_size=None),
        lora_config=None, kv_events_config=None, kv_transfer_config=None, ec_transfer_config=None,
        parallel_config=ns(data_parallel_index=0, decode_context_parallel_size=1,
                           prefill_context_parallel_size=1, pipeline_parallel_size=1),
        observability_config=ns(kv_cache_metrics=False, enable_mfu_metrics=False),
        model_config=ns(is_encoder_decoder=False, max_model_len=MAX_MODEL_LEN),
        speculative_config=spec,
    )


class Worker:
    """The GPU worker's view: per-request block tables and positions, from SchedulerOutputs only."""

    def __init__(self, async_scheduling: bool, rng: random.Random, label_of, accept_all: bool = False):
        self.async_scheduling = async_scheduling
        self.accept_all = accept_all
        self.accepted_steps = 0  # decode steps whose drafts were all accepted
        self.rng = rng
        self.label_of = label_of
        self.tables: dict[str, list[list[int]]] = {}
        self.tokens: dict[str, list[int]] = {}  # worker's token ids (prompt + settled outputs)
        self.next_pos: dict[str, int] = {}      # settled position after the last executed step
        self.prev_batch: dict[str, int] = {}    # rid -> drafts scheduled for it in the previous step
        self.rows: dict[str, dict] = {}
        self.past_rows: list[dict] = []  # rows of lives that ended in a preemption
        self.beyond_table: list[dict] = []
        self.beyond_steps: list[dict] = []  # per (request, step) with drafter query writes beyond the table
        self.null_writes: list[dict] = []
        self.position_checks = 0
        self.step = 0

    def _slots(self, rid: str, gid: int, positions, what: str) -> list[int]:
        bs = GROUPS[gid][0]
        table = self.tables[rid][gid]
        out = []
        for p in positions:
            i = p // bs
            if i >= len(table):
                out.append(-1)
                self.beyond_table.append({"step": self.step, "request": self.label_of(rid), "kv_group": gid,
                                          "position": p, "table_len": len(table), "what": what})
            else:
                if table[i] == 0:
                    self.null_writes.append({"step": self.step, "request": self.label_of(rid), "kv_group": gid,
                                             "position": p, "what": what})
                out.append(table[i] * bs + p % bs)
        return out

    def execute(self, so) -> dict:
        """Apply ``so`` as _update_states does, record every KV write, return the sampled tokens."""
        self.step += 1
        for rid in so.finished_req_ids:
            self.tables.pop(rid, None)
        starts: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            self.tables[new.req_id] = [list(ids) for ids in new.block_ids]
            self.tokens[new.req_id] = list(new.prompt_token_ids)
            starts[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            sent = cached.num_computed_tokens[i]
            if rid in cached.resumed_req_ids:
                # A new life of the request: its own row, so that block_conflicts does not
                # take the restart (at position 0 as often as not) for the same life.
                old = self.rows[rid]
                self.past_rows.append(old)
                life = old.get("life", 0) + 1
                wave = self.label_of(rid)[0]
                self.rows[rid] = {**old, "group": f"{wave} (life {life})", "writes": [], "drafter_writes": [],
                                  "life": life}
                self.tables[rid] = [list(ids) for ids in new_ids]
                # the scheduler sends all token ids of a resumed request
                self.tokens[rid] = list(cached.all_token_ids[rid])
                starts[rid] = sent
                continue
            if new_ids is not None:
                for table, ids in zip(self.tables[rid], new_ids):
                    table.extend(ids)
            # The worker's deferred correction: under async scheduling, a request that
            # was in the previous step's batch with drafts has num_computed_tokens
            # optimistic by that step's rejected drafts (all of them, or none with --accept-all).
            corrected = sent
            if self.async_scheduling and self.prev_batch.get(rid):
                corrected = sent - self.prev_batch[rid]
            if rid in self.next_pos:
                assert corrected == self.next_pos[rid], (rid, sent, corrected, self.next_pos[rid])
                self.position_checks += 1
            starts[rid] = corrected
        sampled: dict[str, list[int]] = {}
        batch: dict[str, int] = {}
        for rid, n in so.num_scheduled_tokens.items():
            start = starts[rid]
            n_spec = len(so.scheduled_spec_decode_tokens.get(rid, ()))
            positions = range(start, start + n)
            toks = self.tokens[rid]
            ids = [toks[p] if p < len(toks) else -1 for p in positions]
            slots = [self._slots(rid, g, positions, "target") for g in range(len(GROUPS))]
            row = self.rows[rid]
            row["writes"].append([start, ids, slots, self.step])
            partial = start + n - n_spec < len(toks)
            valid = n if self.accept_all else n - n_spec  # every draft accepted, or every one rejected
            if self.accept_all and n_spec:
                self.accepted_steps += 1
            last = start + valid - 1
            self.next_pos[rid] = start + valid
            # DFlash query: bonus + SPEC masks after the last accepted position.
            q = list(range(last + 1, last + 2 + SPEC))
            before = len(self.beyond_table)
            row["drafter_writes"].append([q, self._slots(rid, DRAFTER_GID, q, "drafter query"), DRAFTER_GID,
                                          self.step])
            if len(self.beyond_table) > before:
                kind = ("prefill (whole prompt)" if start == 0 and n == len(row["prompt_tokens"])
                        else "first prefill chunk" if start == 0
                        else "prefill chunk" if n_spec == 0 else "decode")
                self.beyond_steps.append({"step": self.step, "request": self.label_of(rid), "step_kind": kind,
                                          "scheduled": [start, n, n_spec], "query": [q[0], q[-1]],
                                          "drafter_table_len": len(self.tables[rid][DRAFTER_GID]),
                                          "positions_beyond": len(self.beyond_table) - before})
            if not partial:
                drafts = [t if t >= 0 else self.rng.randrange(1, 200_000)  # async: placeholders
                          for t in so.scheduled_spec_decode_tokens.get(rid, ())] if self.accept_all else []
                sampled[rid] = [*drafts, self.rng.randrange(1, 200_000)]
                toks.extend(sampled[rid])
            else:
                sampled[rid] = []
            batch[rid] = 0 if self.accept_all else n_spec  # rejected drafts
        self.prev_batch = batch
        return sampled


class Engine:
    def __init__(self, classes, root: Path, async_scheduling: bool, seed: int, num_blocks: int,
                 accept_all: bool = False, method: str = "dflash"):
        kcu = sys.modules["vllm.v1.core.kv_cache_utils"]
        self.request_mod = sys.modules["vllm.v1.request"]
        self.async_scheduling = async_scheduling
        config = kv_cache_config(num_blocks)
        vcfg = vllm_config(num_blocks, async_scheduling, method)
        block_size, hash_block_size = kcu.resolve_kv_cache_block_sizes(config, vcfg)
        self.block_sizes = {"scheduler_block_size": block_size, "hash_block_size": hash_block_size}
        kcu.init_none_hash(swp._sha256)
        self.hasher = kcu.get_request_block_hasher(hash_block_size, swp._sha256)
        cls = classes[1] if async_scheduling else classes[0]
        self.s = cls(vllm_config=vcfg, kv_cache_config=config, structured_output_manager=swp.Structured(),
                     block_size=block_size, hash_block_size=hash_block_size,
                     mm_registry=types.SimpleNamespace(supports_multimodal_inputs=lambda mc: False),
                     log_stats=False)
        self.rng = random.Random(seed)
        self.labels: dict[str, list] = {}
        self.worker = Worker(async_scheduling, random.Random(seed + 1),
                             lambda rid: self.labels[rid], accept_all)
        self.queue: list = []  # (scheduler_output, sampled) in flight
        self.preemptions: list[dict] = []

    def add(self, wave: str, index: int, prompt: list[int]):
        rid = f"{wave}-{index}"
        params = types.SimpleNamespace(
            max_tokens=MAX_TOKENS, extra_args=None, skip_reading_prefix_cache=None, min_tokens=0,
            eos_token_id=None, stop_token_ids=[], repetition_detection=None, num_logprobs=None,
        )
        req = self.request_mod.Request(request_id=rid, prompt_token_ids=list(prompt), sampling_params=params,
                                       pooling_params=None, block_hasher=self.hasher)
        self.labels[rid] = [wave, index]
        self.worker.rows[rid] = {"group": wave, "prompt": index, "prompt_tokens": list(prompt), "writes": [],
                                 "drafter_writes": []}
        self.s.add_request(req)

    def _schedule(self):
        so = self.s.schedule()
        for rid in so.preempted_req_ids:
            self.preemptions.append({"step": self.worker.step + 1 + len(self.queue), "request": self.labels[rid]})
        sampled = self.worker.execute(so)  # the GPU runs steps in order; outputs come back later
        return so, sampled

    def _output(self, so, sampled):
        rids = list(so.num_scheduled_tokens)
        out = types.SimpleNamespace(
            sampled_token_ids=[sampled[r] for r in rids], logprobs=None, prompt_logprobs_dict={},
            pooler_output=[], num_nans_in_logits=None, kv_connector_output=None, cudagraph_stats=None,
            req_id_to_index={r: i for i, r in enumerate(rids)}, routed_experts_dict=None,
        )
        self.s.update_from_output(so, out)
        return rids

    def step_sync(self):
        if not self.s.has_requests():
            return
        so, sampled = self._schedule()
        rids = self._output(so, sampled)
        if so.total_num_scheduled_tokens > 0:  # post_step: the drafter's proposals
            drafts = types.SimpleNamespace(req_ids=rids, draft_token_ids=[
                [self.rng.randrange(1, 200_000) for _ in range(SPEC)] for _ in rids])
            self.s.update_draft_token_ids(drafts)

    def step_batch_queue(self):
        """EngineCore.step_with_batch_queue with batch_queue_size 2; a step's future is never done early."""
        if self.s.has_requests():
            so, sampled = self._schedule()
            self.queue.append((so, sampled))
            if so.total_num_scheduled_tokens > 0 and len(self.queue) < 2:
                return
        elif not self.queue:
            return
        so, sampled = self.queue.pop(0)
        self._output(so, sampled)

    def run_to_completion(self):
        guard = 0
        while self.s.has_requests() or self.queue:
            (self.step_batch_queue if self.async_scheduling else self.step_sync)()
            guard += 1
            assert guard < 100_000


class Connector:
    """A KV connector (KVConnectorBase_V1, scheduler side) reporting ``external`` cached tokens."""

    def __init__(self, external: int, load_async: bool):
        self.external, self.load_async = external, load_async
        self.calls: list = []

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self.calls.append(["get_num_new_matched_tokens", num_computed_tokens])
        return self.external, self.load_async

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.calls.append(["update_state_after_alloc", [len(ids) for ids in blocks.get_block_ids()],
                           num_external_tokens])

    def build_connector_meta(self, scheduler_output):
        return None


def single(classes, root: Path, prompt_len: int, connector: str, external: int) -> dict:
    """One request, one Scheduler.schedule (synchronous scheduling), its blocks and drafter queries."""
    engine = Engine(classes, root, False, 0, NUM_BLOCKS)
    if connector != "none":
        engine.s.connector = Connector(external, connector == "async")
    rng = random.Random(0)
    prompt = [rng.randrange(1, 200_000) for _ in range(prompt_len)]
    engine.add("single", 0, prompt)
    so = engine.s.schedule()
    rid = "single-0"
    engine.worker.execute(so)
    request = engine.s.requests[rid]
    w = engine.worker
    return {
        "tree": str(root), "prompt": prompt_len, "connector": connector, "external": external,
        "num_lookahead_tokens": engine.s.num_lookahead_tokens,
        "block_sizes": [bs for bs, _ in GROUPS], "drafter_group": DRAFTER_GID,
        "scheduled": dict(so.num_scheduled_tokens), "status": request.status.name,
        "num_computed_tokens": request.num_computed_tokens,
        "table_lens": [len(ids) for ids in engine.s.kv_cache_manager.get_blocks(rid).get_block_ids()],
        "drafter_query": [q[0] for q in w.rows[rid]["drafter_writes"]],
        "beyond_table": {"count": len(w.beyond_table), "events": w.beyond_steps},
        "connector_calls": engine.s.connector.calls if connector != "none" else [],
    }


def lookahead_by_method(classes, root: Path) -> dict:
    out = {}
    for method in METHODS:
        engine = Engine(classes, root, False, 0, NUM_BLOCKS, method=method)
        out[method] = {"num_spec_tokens": engine.s.num_spec_tokens,
                       "num_lookahead_tokens": engine.s.num_lookahead_tokens, "use_eagle": engine.s.use_eagle}
    return {"tree": str(root), "num_speculative_tokens": SPEC, "methods": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--sync", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-blocks", type=int, default=NUM_BLOCKS)
    ap.add_argument("--accept-all", action="store_true", help="the model accepts every draft")
    ap.add_argument("--prompt-extra", type=int, default=0, help="every prompt this many tokens longer")
    ap.add_argument("--single", type=int, metavar="PROMPT_LEN", help="one request, one schedule() call")
    ap.add_argument("--connector", choices=["none", "sync", "async"], default="none")
    ap.add_argument("--external", type=int, default=0, help="tokens the connector reports cached")
    ap.add_argument("--lookahead-by-method", action="store_true")
    args = ap.parse_args()
    root = Path(args.tree)
    classes = load(root)
    if args.single is not None:
        print(json.dumps(single(classes, root, args.single, args.connector, args.external)))
        return
    if args.lookahead_by_method:
        print(json.dumps(lookahead_by_method(classes, root)))
        return
    engine = Engine(classes, root, not args.sync, args.seed, args.num_blocks, args.accept_all)
    rng = random.Random(args.seed)
    lengths = [n + args.prompt_extra for n in PROMPTS]
    prompts = [[rng.randrange(1, 200_000) for _ in range(n)] for n in lengths]
    for i in range(FIRST_WAVE):
        engine.add("wave1", i, prompts[i])
    engine.run_to_completion()
    for i in range(len(PROMPTS)):
        engine.add("wave2", i, prompts[i])
    engine.run_to_completion()
    w = engine.worker
    rows = w.past_rows + list(w.rows.values())
    # With --accept-all the worker keeps the tokens of a last step past max_tokens (check_stop drops them).
    outputs = {"/".join(map(str, engine.labels[rid])):
               min(len(w.tokens[rid]) - lengths[engine.labels[rid][1]], MAX_TOKENS) if args.accept_all
               else len(w.tokens[rid]) - lengths[engine.labels[rid][1]] for rid in w.rows}
    per_request: dict[str, int] = {}
    for p in engine.preemptions:
        key = "/".join(map(str, p["request"]))
        per_request[key] = per_request.get(key, 0) + 1
    kinds: dict[str, int] = {}
    for b in w.beyond_steps:
        kinds[b["step_kind"]] = kinds.get(b["step_kind"], 0) + 1
    groups = [{"block_size": bs, "sliding_window": win} for bs, win in GROUPS]
    beyond_by_what: dict[str, int] = {}
    for b in w.beyond_table:
        beyond_by_what[b["what"]] = beyond_by_what.get(b["what"], 0) + 1
    print(json.dumps({
        "tree": str(root), "mode": "sync" if args.sync else "async", "seed": args.seed,
        "num_blocks": args.num_blocks, "config": CONFIG, **engine.block_sizes,
        "prompt_extra": args.prompt_extra, "accept_all": args.accept_all, "accepted_steps": w.accepted_steps,
        "num_lookahead_tokens": engine.s.num_lookahead_tokens,
        "scheduler_class": type(engine.s).__name__,
        "coordinator": type(engine.s.kv_cache_manager.coordinator).__name__,
        "steps": w.step, "position_checks": w.position_checks,
        "outputs_min_max": [min(outputs.values()), max(outputs.values())],
        "preemptions": len(engine.preemptions), "preemptions_per_request": per_request,
        "preemption_events": engine.preemptions,
        "beyond_table": {"count": len(w.beyond_table), "by_kind": beyond_by_what,
                         "steps": len(w.beyond_steps), "step_kinds": kinds, "events": w.beyond_steps},
        "null_block_writes": {"count": len(w.null_writes), "first": w.null_writes[:10]},
        "block_conflicts": block_conflicts(rows, groups),
    }))


if __name__ == "__main__":
    main()
