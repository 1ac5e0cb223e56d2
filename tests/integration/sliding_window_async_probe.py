"""Which sliding-window KV blocks a request keeps under async scheduling with drafts, per vLLM tree.

Usage: ``python sliding_window_async_probe.py CODE_ROOT``; prints one JSON
object: for each scenario, the request's block tables and counters after every
scheduling step and every processed output.

What runs is the tree's own code, loaded as modules (``importlib``, real
``sys.modules`` names, hence a subprocess): ``vllm/v1/kv_cache_interface.py``
(``SlidingWindowSpec``, ``FullAttentionSpec``, ``KVCacheConfig``),
``vllm/v1/request.py`` (``Request``, ``RequestStatus``),
``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``, the free-block queue, the
block hasher), ``kv_cache_metrics.py``, ``block_pool.py``,
``single_type_kv_cache_manager.py`` (``SlidingWindowManager``,
``FullAttentionManager``), ``kv_cache_coordinator.py`` and
``kv_cache_manager.py`` (``KVCacheManager``). ``Scheduler`` and
``AsyncScheduler`` (``vllm/v1/core/sched/scheduler.py``,
``async_scheduler.py``) and ``check_stop`` (``sched/utils.py``) are executed
from their source with ``tests/patches/vllm_source.py``: names they import
from the modules above are the real ones, every other import is a ``Stub``.
The real methods that run: ``_update_after_schedule`` (both classes),
``update_from_output``, ``_update_request_with_output`` (both),
``make_spec_decoding_stats``, ``make_stats`` and ``_connector_finished``.

Stand-ins, for what cannot exist without vLLM's compiled code, torch build and
dependencies: ``torch`` and the logger (``series_0_21_0_probe._install_stand_ins``),
``vllm.envs`` (integer block hashes off, the default), the hash functions
(``sha256`` hashes the pickle as vLLM's does), the KV event classes (events
are off), the metrics records (``PrefixCacheStats``, ``PrefillStats``,
eviction events: plain objects; stats logging is off), ``SamplingParams``
(the fields ``Request`` and ``check_stop`` read: no stop token within the
run), ``StructuredOutputRequest`` (none), ``FinishReason``, the engine event
classes, multimodal and pooling types (unused), ``tensor_data`` (prompt
embeddings, unused). ``ConstantList`` and
``length_from_prompt_token_ids_or_embeds`` are the tree's own, cut out of
``vllm/v1/utils.py`` and ``vllm/utils/__init__.py``. The scheduler object is
``object.__new__(AsyncScheduler)`` (or ``Scheduler`` for synchronous
scheduling) with the attributes those methods read: the real
``KVCacheManager``, ``requests``, no KV connector (a recording one for
``_connector_finished``), no perf metrics, stats logging off, a structured
output manager that has nothing to advance. What ``Scheduler.schedule`` would
decide is written out here: which request gets how many tokens (1 + 15
drafts per decode step, 15 lookahead slots as a draft-model drafter gets),
``get_computed_blocks`` and ``allocate_slots`` called as it calls them, the
scheduler output and the model runner output as plain objects, and the
sampled tokens (every draft rejected: one token per step).

The model: Gemma 4's KV layout in small, one sliding-window group (window 64)
and one full-attention group, block size 16, a pool of ``NUM_BLOCKS``.
"""

from __future__ import annotations

import ast
import enum
import hashlib
import json
import pickle
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# vllm_source binds the real (CPU) torch for the scheduler's source; import it
# before the stand-in torch below takes the name in sys.modules.
from tests.patches import vllm_source  # noqa: E402
from tests.integration import series_0_21_0_probe as probe  # noqa: E402

WINDOW = 64
BLOCK = 16
PROMPT = 200
DRAFTS = 15  # DFlash recipe: 15 speculative tokens per step
NUM_BLOCKS = 34  # 33 usable (block 0 is the null block)
# The second request of the async scenario: 64 + 15 lookahead slots need 5 blocks
# a group, 10 in all, exactly what the released tree leaves free in step C.
OTHER_PROMPT = 64
MAX_MODEL_LEN = 4096
MAX_NUM_BATCHED_TOKENS = 8192


# ---------------------------------------------------------------- stand-ins


def _module(name: str, **attrs) -> types.ModuleType:
    mod = sys.modules.get(name) or types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)
    return mod


class _Plain:
    """A record type: keeps what it is given."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs

    @classmethod
    def new_event(cls, *args, **kwargs):
        return cls(*args, **kwargs)


def _sha256(value) -> bytes:
    # vllm.utils.hashing.sha256: the SHA-256 of the pickled value.
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _cut(path: Path, name: str, ns: dict) -> object:
    """Execute the top-level class or function ``name`` of ``path`` in ``ns``."""
    node = next(n for n in ast.parse(path.read_text(encoding="utf-8")).body
                if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name == name)
    probe._exec(ast.unparse(node), ns)
    return ns[name]


def install(root: Path) -> None:
    probe._install_stand_ins(root)
    sys.modules["torch"].Tensor = type("Tensor", (), {})  # request.py's annotations are evaluated
    for name in ("vllm.v1.core", "vllm.v1.core.sched", "vllm.distributed", "vllm.v1.metrics",
                 "vllm.v1.structured_output", "vllm.multimodal"):
        _module(name, __path__=[])
    _module("vllm.envs", VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=False)
    _module("vllm.config", VllmConfig=object)
    _module("vllm.utils.hashing", sha256=_sha256, sha256_cbor=lambda value: _sha256(("cbor", value)),
            xxhash_cbor=lambda value: _sha256(("xxhash", value)))
    _module("vllm.utils.mem_utils", format_gib=lambda n: n / (1 << 30))
    utils_ns = {"Generic": typing.Generic, "Sequence": Sequence, "T": typing.TypeVar("T"),
                "overload": typing.overload}
    _module("vllm.v1.utils", tensor_data=lambda tensor: tensor,
            ConstantList=_cut(root / "vllm/v1/utils.py", "ConstantList", utils_ns))
    _module("vllm.utils", length_from_prompt_token_ids_or_embeds=_cut(
        root / "vllm/utils/__init__.py", "length_from_prompt_token_ids_or_embeds", {}))
    _module("vllm.distributed.kv_events", MEDIUM_GPU="GPU", AllBlocksCleared=_Plain, BlockRemoved=_Plain,
            BlockStored=_Plain, KVCacheEvent=_Plain)
    _module("vllm.v1.metrics.stats", PrefixCacheStats=_Plain, KVCacheEvictionEvent=_Plain, PrefillStats=_Plain)
    _module("vllm.multimodal.inputs", MultiModalFeatureSpec=_Plain)
    _module("vllm.pooling_params", PoolingParams=_Plain)
    _module("vllm.sampling_params", SamplingParams=_Plain, RepetitionDetectionParams=_Plain)
    _module("vllm.v1.engine", EngineCoreEvent=_Plain, EngineCoreEventType=enum.Enum("E", "QUEUED SCHEDULED PREEMPTED"),
            EngineCoreRequest=_Plain,
            FinishReason=enum.IntEnum("FinishReason", {"STOP": 0, "LENGTH": 1, "ABORT": 2, "ERROR": 3,
                                                       "REPETITION": 4}))
    _module("vllm.v1.structured_output.request",
            StructuredOutputRequest=type("StructuredOutputRequest", (), {
                "from_sampling_params": staticmethod(lambda sampling_params: None)}))
    for name in ("vllm/v1/kv_cache_interface", "vllm/v1/request", "vllm/v1/core/kv_cache_utils",
                 "vllm/v1/core/kv_cache_metrics", "vllm/v1/core/block_pool",
                 "vllm/v1/core/single_type_kv_cache_manager", "vllm/v1/core/kv_cache_coordinator",
                 "vllm/v1/core/kv_cache_manager"):
        module = probe._load(name.replace("/", "."), root / f"{name}.py")
        parent, _, child = module.__name__.rpartition(".")
        setattr(sys.modules[parent], child, module)


def _real_imports(root: Path, rel: str) -> dict:
    """The names ``rel`` imports from modules loaded for real above."""
    out = {}
    for node in ast.parse((root / rel).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module in sys.modules:
            for alias in node.names:
                if hasattr(sys.modules[node.module], alias.name):
                    out[alias.asname or alias.name] = getattr(sys.modules[node.module], alias.name)
    return out


class SupportsHMA:
    """Stands in for the KV connector mix-in of the same name."""


class RecordingConnector(SupportsHMA):
    """A KV connector that records the block table it is handed when a request finishes."""

    def __init__(self):
        self.handed: list[list[int]] | None = None

    def request_finished_all_groups(self, request, block_ids):
        self.handed = [list(ids) for ids in block_ids]
        return False, None


def scheduler_classes(root: Path, **extra_overrides) -> tuple[type, type]:
    """The tree's Scheduler and AsyncScheduler; ``extra_overrides`` bind more of scheduler.py's
    imported names (what a probe that runs ``schedule()`` needs beyond the bookkeeping)."""
    rel = "vllm/v1/core/sched/utils.py"
    utils = vllm_source.load(root, rel, overrides=_real_imports(root, rel))
    rel = "vllm/v1/core/sched/scheduler.py"
    overrides = {**_real_imports(root, rel), "check_stop": utils["check_stop"],
                 "remove_all": utils["remove_all"], "SupportsHMA": SupportsHMA, **extra_overrides}
    scheduler = vllm_source.load(root, rel, overrides=overrides)["Scheduler"]
    rel = "vllm/v1/core/sched/async_scheduler.py"
    async_scheduler = vllm_source.load(root, rel, overrides={**_real_imports(root, rel),
                                                             "Scheduler": scheduler})["AsyncScheduler"]
    return scheduler, async_scheduler


# ---------------------------------------------------------------- the driver


class Structured:
    def should_advance(self, request) -> bool:
        return False


class Run:
    """One scheduler over a real KVCacheManager, stepped as Scheduler.schedule would."""

    def __init__(self, scheduler_cls: type, enable_caching: bool):
        kvi = sys.modules["vllm.v1.kv_cache_interface"]
        utils = sys.modules["vllm.v1.core.kv_cache_utils"]
        self.request_mod = sys.modules["vllm.v1.request"]
        sliding = kvi.SlidingWindowSpec(block_size=BLOCK, num_kv_heads=8, head_size=256, dtype=probe.BF16,
                                        sliding_window=WINDOW)
        full = kvi.FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=512, dtype=probe.BF16)
        config = kvi.KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
            kvi.KVCacheGroupSpec(["model.layers.0.self_attn.attn"], sliding),
            kvi.KVCacheGroupSpec(["model.layers.5.self_attn.attn"], full),
        ])
        self.manager = sys.modules["vllm.v1.core.kv_cache_manager"].KVCacheManager(
            kv_cache_config=config, max_model_len=MAX_MODEL_LEN, hash_block_size=BLOCK,
            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, enable_caching=enable_caching,
        )
        self.coordinator_class = type(self.manager.coordinator).__name__
        self.manager_classes = [type(m).__name__ for m in self.manager.coordinator.single_type_managers]
        utils.init_none_hash(_sha256)
        self.hasher = utils.get_request_block_hasher(BLOCK, _sha256) if enable_caching else None
        s = object.__new__(scheduler_cls)
        s.requests = {}
        s.running = []
        s.finished_req_ids = set()
        s.finished_req_ids_dict = None
        s.kv_cache_manager = self.manager
        s.kv_cache_config = config
        s.max_model_len = MAX_MODEL_LEN
        s.num_spec_tokens = s.num_lookahead_tokens = DRAFTS
        s._spec_token_placeholders = [-1] * DRAFTS
        s.connector = None
        s.perf_metrics = None
        s.log_stats = False
        s.structured_output_manager = Structured()
        s.recompute_kv_load_failures = True
        s.is_encoder_decoder = False
        self.s = s
        self.outstanding: list[tuple[str, dict]] = []  # steps scheduled, output not processed
        self.log: list[dict] = []
        self.next_token = 1000

    def new_request(self, rid: str, num_prompt: int, first_token: int):
        params = types.SimpleNamespace(
            max_tokens=1000, extra_args=None, skip_reading_prefix_cache=None, min_tokens=0,
            eos_token_id=None, stop_token_ids=[], repetition_detection=None, num_logprobs=None,
        )
        return self.request_mod.Request(
            request_id=rid, prompt_token_ids=list(range(first_token, first_token + num_prompt)),
            sampling_params=params, pooling_params=None, block_hasher=self.hasher,
        )

    def schedule(self, step: str, decode: dict, new: tuple = ()) -> dict[str, bool]:
        """Running requests in ``decode`` get 1 + DRAFTS tokens; each of ``new`` its prompt."""
        num_scheduled, spec, admitted = {}, {}, {}
        for rid in decode:
            request = self.s.requests[rid]
            blocks = self.manager.allocate_slots(request, 1 + DRAFTS, num_lookahead_tokens=DRAFTS)
            admitted[rid] = blocks is not None
            if blocks is not None:
                num_scheduled[rid] = 1 + DRAFTS
                spec[rid] = [-1] * DRAFTS
        for request in new:
            hits, num_hits = self.manager.get_computed_blocks(request)
            blocks = self.manager.allocate_slots(request, request.num_tokens - num_hits, num_hits, hits,
                                                 num_lookahead_tokens=DRAFTS)
            admitted[request.request_id] = blocks is not None
            if blocks is not None:
                request.status = self.request_mod.RequestStatus.RUNNING
                self.s.requests[request.request_id] = request
                self.s.running.append(request)
                request.num_computed_tokens = num_hits
                num_scheduled[request.request_id] = request.num_tokens - num_hits
        allocated_at = {rid: self.s.requests[rid].num_computed_tokens for rid in num_scheduled}
        output = types.SimpleNamespace(
            num_scheduled_tokens=num_scheduled, scheduled_spec_decode_tokens=spec,
            has_structured_output_requests=False, pending_structured_output_tokens=False,
            num_invalid_spec_tokens=None,
        )
        unsettled = {rid: sum(o.num_scheduled_tokens.get(rid, 0) for _, o in self.outstanding)
                     for rid in num_scheduled}
        self.s._update_after_schedule(output)
        self.outstanding.append((step, output))
        self.record(f"schedule {step}", allocated_at=allocated_at, unsettled_at_allocation=unsettled,
                    admitted=admitted)
        return admitted

    def process(self) -> None:
        """The oldest outstanding step's output: every draft rejected, one sampled token."""
        step, output = self.outstanding.pop(0)
        rids = list(output.num_scheduled_tokens)
        sampled = []
        for _ in rids:
            sampled.append([self.next_token])
            self.next_token += 1
        runner_output = types.SimpleNamespace(
            sampled_token_ids=sampled, logprobs=None, prompt_logprobs_dict={}, pooler_output=[],
            num_nans_in_logits=None, kv_connector_output=None, cudagraph_stats=None,
            req_id_to_index={rid: i for i, rid in enumerate(rids)}, routed_experts_dict=None,
        )
        self.s.update_from_output(output, runner_output)
        self.record(f"output {step}")

    def tables(self, rid: str) -> list[list[int | None]]:
        """Per group (sliding, full): the request's block ids, None where the null block is."""
        return [[None if b.is_null else b.block_id for b in m.req_to_blocks.get(rid, [])]
                for m in self.manager.coordinator.single_type_managers]

    def record(self, phase: str, **extra) -> None:
        pool = self.manager.block_pool
        entry = {"phase": phase, "free_blocks": pool.get_num_free_blocks(), **extra, "requests": {}}
        for rid, request in self.s.requests.items():
            entry["requests"][rid] = {
                "num_computed_tokens": request.num_computed_tokens,
                "num_tokens": request.num_tokens,
                "num_in_flight_tokens": getattr(request, "num_in_flight_tokens", None),
                "tables": self.tables(rid),
                "ref_cnt": [[pool.blocks[i].ref_cnt if i is not None else None for i in group]
                            for group in self.tables(rid)],
                "unsettled": sum(o.num_scheduled_tokens.get(rid, 0) for _, o in self.outstanding),
            }
        self.log.append(entry)


# ---------------------------------------------------------------- scenarios


def async_run(classes, caching: bool) -> dict:
    """Async scheduling: each step is planned before the previous step's output is back.

    A: the 200-token prompt. B: 1 + 15 drafts, planned before A's output. C:
    planned after A's output, before B's; a second request with a 64-token
    prompt arrives in the same step (on the released tree it needs exactly the
    pool's free blocks). B's output rejects its 15 drafts, so C really
    computes positions 201..216, not 216..231. D, then the outputs of C and D.
    """
    run = Run(classes[1], caching)
    r = run.new_request("r", PROMPT, 0)
    run.schedule("A", {}, (r,))
    run.schedule("B", {"r"})
    run.process()  # A
    other = run.new_request("other", OTHER_PROMPT, 50_000)
    run.schedule("C", {"r"}, (other,))
    run.process()  # B: 15 drafts rejected
    run.schedule("D", {"r"})
    run.process()  # C
    run.process()  # D
    return {"coordinator": run.coordinator_class, "managers": run.manager_classes, "log": run.log}


def sync_run(classes, scheduler: int, caching: bool) -> dict:
    """Every output processed before the next step is planned (no async scheduling)."""
    run = Run(classes[scheduler], caching)
    r = run.new_request("r", PROMPT, 0)
    run.schedule("A", {}, (r,))
    run.process()
    for step in "BCD":
        run.schedule(step, {"r"})
        run.process()
    return {"log": run.log}


def connector_run(classes, caching: bool) -> dict:
    """A request aborted while C is in flight: the block table the KV connector gets."""
    run = Run(classes[1], caching)
    r = run.new_request("r", PROMPT, 0)
    run.schedule("A", {}, (r,))
    run.schedule("B", {"r"})
    run.process()  # A
    run.schedule("C", {"r"})
    run.process()  # B: 15 drafts rejected
    before = run.tables("r")
    run.s.connector = RecordingConnector()
    r.status = run.request_mod.RequestStatus.FINISHED_ABORTED
    run.s._connector_finished(r)
    return {"before": before, "handed": run.s.connector.handed, "num_computed_tokens": r.num_computed_tokens}


def main(code_root: str) -> None:
    root = Path(code_root)
    install(root)
    classes = scheduler_classes(root)
    out = {"window": WINDOW, "block_size": BLOCK, "drafts": DRAFTS}
    for label, caching in (("prefix_caching", True), ("no_prefix_caching", False)):
        out[label] = {
            "async": async_run(classes, caching),
            "sync_scheduler": sync_run(classes, 0, caching),
            "sync_async_scheduler_class": sync_run(classes, 1, caching),
            "connector": connector_run(classes, caching),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
