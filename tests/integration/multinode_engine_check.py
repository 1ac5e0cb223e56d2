"""Every node's argv of a multi-node plan, through a released vLLM's own parser and engine config.

Usage, as serve_parser_check.py (whose GPU-less platform stand-in it shares):

    .venv/bin/python tests/integration/multinode_engine_check.py --dump DIR --version 0.33.0   # the plans
    VLLM_PY tests/integration/multinode_engine_check.py DIR                                     # vLLM's checks

The first step plans gemma4-31b-dflash and gemma4-moe-dflash on the
dgx-spark-x2 profile for every node (vLLM's native multi-node, and the Ray
head), and writes Gemma-4-shaped config.json files (no weights: the engine
config reads only configs) for a target and a DFlash drafter, whose paths
replace the recipe's model folders. The second runs, per node, vLLM's
``make_arg_parser``, ``validate_parsed_serve_args``,
``AsyncEngineArgs.from_cli_args`` and ``create_engine_config`` (with
``headless=True`` where the node runs ``--headless``, as ``run_headless``
does), under the plan's environment, and checks what vLLM made of the node
flags: node count and rank, TP/PP/DP, the data-parallel rank and local size
it infers, the address the other nodes meet at, and the drafter's parallel
config. What it cannot do here: start the workers (a second machine, a GPU).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

HEAD_ADDR = "192.0.2.10"  # TEST-NET-1: never a real host; nothing connects while building configs
RECIPES = ("gemma4-31b-dflash", "gemma4-moe-dflash")


def dump(out: Path, version: str) -> None:
    from launcher import multinode
    from launcher.checks import resolve
    from launcher.plan import Request
    from tests.gpu.models import make_checkpoints as mk
    from tests.unit.conftest import GB10, make_ctx

    target, drafter = out / "target", out / "drafter"
    target.mkdir(parents=True, exist_ok=True)
    drafter.mkdir(parents=True, exist_ok=True)
    shape = mk.TargetShape("multinode", num_layers=6)
    (target / "config.json").write_text(json.dumps(mk.gemma4_config_dict(shape, max_positions=262144)))
    d_shape = mk.DrafterShape("multinode-drafter", "multinode", num_layers=2, target_layer_ids=[1, 4])
    (drafter / "config.json").write_text(json.dumps(mk.drafter_config_dict(d_shape, max_positions=262144, num_target_layers=6)))
    cases = {}
    for name in RECIPES:
        for backend in ("mp", "ray"):
            if backend == "ray" and name == "gemma4-moe-dflash":
                continue  # data parallel: the plan refuses Ray (tested in tests/unit/test_multinode.py)
            nodes = multinode.request(2, 0, HEAD_ADDR, None, backend, None)
            req = Request(name, vllm_version=version, model=str(target), drafter=str(drafter), nodes=nodes)
            plan = resolve(req, make_ctx(GB10))
            for node in plan.nodes:
                argv = node.main
                if argv[:2] != ["vllm", "serve"]:
                    continue  # a Ray worker runs `ray start` only
                cases[f"{name} {backend} node{node.rank} ({node.role})"] = {
                    "argv": argv, "env": {**plan.env, **node.env},
                    "expect": {"nnodes": 2 if backend == "mp" else 1, "node_rank": node.rank if backend == "mp" else 0,
                               "tp": plan.cluster["tensor_parallel"], "pp": plan.cluster["pipeline_parallel"],
                               "dp": plan.cluster["data_parallel"], "headless": "--headless" in argv,
                               "backend": backend, "master_addr": HEAD_ADDR},
                }
    (out / "cases.json").write_text(json.dumps(cases, indent=1))


def _stand_in_flash_attn() -> None:
    """The engine config inspects the model class, whose imports reach ``vllm.vllm_flash_attn``;
    that package refuses to import without its CUDA extensions, which load only beside a GPU.
    Its three functions are stood in by names that raise if used: building the config never
    runs them (it imports the attention code; it runs no attention)."""
    import types

    try:
        import vllm.vllm_flash_attn  # noqa: F401
        return
    except ImportError:
        pass

    def absent(*args, **kwargs):
        raise RuntimeError("FlashAttention is not loaded: no GPU here")

    module = types.ModuleType("vllm.vllm_flash_attn")
    for name in ("flash_attn_varlen_func", "get_scheduler_metadata", "compile_flash_attn_varlen_func_from_specs"):
        setattr(module, name, absent)
    sys.modules["vllm.vllm_flash_attn"] = module


def check(out: Path, require_engine_config: bool = False) -> int:
    sys.path.insert(0, str(Path(__file__).parent))
    from serve_parser_check import serve_parser, stand_in_platform

    stand_in_platform()
    _stand_in_flash_attn()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.version import __version__

    make_serve_parser, validate = serve_parser()

    os.environ["HF_HUB_OFFLINE"] = "1"  # every config is a local file: never wait on the Hub
    failed = 0
    cases = json.loads((out / "cases.json").read_text())
    engine_skipped = 0
    for case, data in cases.items():
        want = data["expect"]
        saved = dict(os.environ)
        os.environ.update(data["env"])
        try:
            args = make_serve_parser().parse_args(data["argv"][2:])  # less "vllm serve"
            args.model = args.model_tag  # what ServeSubcommand.cmd does first (vllm/entrypoints/cli/serve.py)
            validate(args)
            engine = AsyncEngineArgs.from_cli_args(args)
            parsed = {"nnodes": engine.nnodes, "node_rank": engine.node_rank, "tp": engine.tensor_parallel_size,
                      "pp": engine.pipeline_parallel_size, "dp": engine.data_parallel_size,
                      "headless": bool(args.headless),
                      "backend": "ray" if engine.distributed_executor_backend == "ray" else "mp",
                      "master_addr": engine.master_addr if want["backend"] == "mp" else want["master_addr"]}
            wrong = {k: (parsed[k], want[k]) for k in want if parsed[k] != want[k]}
            if wrong:
                print(f"{case}: WRONG after vLLM's parser {wrong}")
                failed += 1
                continue
            try:
                config = engine.create_engine_config(headless=bool(args.headless))
            except Exception as exc:  # noqa: BLE001
                if require_engine_config or "failed to be inspected" not in str(exc):
                    raise
                engine_skipped += 1
                print(f"{case}: parser ok on vLLM {__version__} (nnodes {engine.nnodes}, node_rank {engine.node_rank}, "
                      f"TP {engine.tensor_parallel_size}, DP {engine.data_parallel_size}, headless {args.headless}, "
                      f"master {engine.master_addr}:{engine.master_port}, executor {engine.distributed_executor_backend}); "
                      "create_engine_config not reachable here: the model class inspection imports vLLM's CUDA ops, "
                      "which need a GPU")
                continue
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported per case (argparse exits on a bad flag)
            print(f"{case}: FAILED {type(exc).__name__}: {exc}")
            failed += 1
            continue
        finally:
            os.environ.clear()
            os.environ.update(saved)
        p = config.parallel_config
        spec = config.speculative_config
        got = {"nnodes": p.nnodes, "node_rank": p.node_rank, "tp": p.tensor_parallel_size,
               "pp": p.pipeline_parallel_size, "dp": p.data_parallel_size, "headless": bool(args.headless),
               "backend": "ray" if p.distributed_executor_backend == "ray" else "mp",
               "master_addr": p.master_addr if want["backend"] == "mp" else want["master_addr"]}
        wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
        if want["dp"] > 1:
            # vLLM infers the engine's DP rank and local size from --node-rank (create_engine_config).
            dp_facts = {"data_parallel_rank": (p.data_parallel_rank, want["node_rank"]),
                        "data_parallel_size_local": (p.data_parallel_size_local, 1),
                        "data_parallel_master_ip": (p.data_parallel_master_ip, want["master_addr"])}
            wrong.update({k: v for k, v in dp_facts.items() if v[0] != v[1]})
        if spec is not None and spec.draft_parallel_config.tensor_parallel_size != p.tensor_parallel_size:
            wrong["draft_tp"] = (spec.draft_parallel_config.tensor_parallel_size, p.tensor_parallel_size)
        if wrong:
            print(f"{case}: WRONG after create_engine_config {wrong}")
            failed += 1
            continue
        print(f"{case}: ok on vLLM {__version__} (nnodes {p.nnodes}, node_rank {p.node_rank}, TP {p.tensor_parallel_size}, "
              f"PP {p.pipeline_parallel_size}, DP {p.data_parallel_size} rank {p.data_parallel_rank} "
              f"local {p.data_parallel_size_local}, node_rank_within_dp {p.node_rank_within_dp}, "
              f"master {p.master_addr}:{p.master_port}, executor {p.distributed_executor_backend}, "
              f"drafter TP {spec.draft_parallel_config.tensor_parallel_size if spec else None}"
              f" method {spec.method if spec else None})")
    if engine_skipped:
        print(f"{engine_skipped} of {len(cases)}: parser only (run with --require-engine-config on a GPU host)")
    print(f"{len(cases) - failed} of {len(cases)} node argvs passed")
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1] == "--dump":
        dump(Path(sys.argv[2]), sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--version" else "0.33.0")
    else:
        sys.exit(check(Path(sys.argv[1]), "--require-engine-config" in sys.argv[2:]))
