"""What the multi-node plan relies on, re-read in every released vLLM the recipes cover.

launcher.multinode renders vLLM's native multi-node flags and decides where a DFlash
drafter may run across nodes from vLLM's code; these tests read that code in the
released wheels (PyPI, cached by launcher.pypi.unpacked) and fail when a release says
otherwise.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from launcher import multinode
from launcher import recipe as recipes
from launcher.pypi import unpacked

COVERED = sorted({v for name in ("gemma4-31b-dflash", "gemma4-moe-dflash") for v in recipes.load(name).vllm_versions})


def tree(version: str) -> Path:
    return unpacked("vllm", version, "site-packages") / "vllm"


def function_source(path: Path, qualname: str) -> str:
    text = path.read_text(encoding="utf-8")
    node = ast.parse(text)
    for part in qualname.split("."):
        node = next(n for n in ast.iter_child_nodes(node)
                    if isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == part)
    return ast.get_source_segment(text, node)


def test_covered_releases():
    assert "0.21.0" in COVERED and "0.33.0" in COVERED


@pytest.mark.parametrize("version", COVERED)
def test_native_multi_node_flags_exist(version):
    root = tree(version)
    args = (root / "engine/arg_utils.py").read_text(encoding="utf-8")
    for flag in ("--nnodes", "--node-rank", "--master-addr", "--master-port", "--distributed-executor-backend",
                 "--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size"):
        assert re.search(rf'"{flag}"', args), f"vLLM {version} has no {flag}"
    # the serve options' module moved: openai/ (0.21.0 ...), launchers/ (0.29.0 ... 0.32.0), common/ (0.33.0)
    serve_args = [p for p in (root / "entrypoints/openai/cli_args.py", root / "entrypoints/launchers/cli_args.py",
                              root / "entrypoints/common/cli_args.py")
                  if p.exists() and '"--headless"' in p.read_text(encoding="utf-8")]
    assert serve_args, f"vLLM {version} has no --headless"
    parallel = (root / "config/parallel.py").read_text(encoding="utf-8")
    assert re.search(rf"master_port: int = {multinode.DEFAULT_MASTER_PORT}\b", parallel)
    assert re.search(rf"data_parallel_rpc_port: int = (Field\(default=)?{multinode.DP_RPC_PORT}\b", parallel)
    # --nnodes > 1 with a world size it must divide; the DP address defaults to --master-addr
    create = function_source(root / "engine/arg_utils.py", "EngineArgs.create_engine_config")
    assert "world_size % self.nnodes" in create and "self.master_addr or ParallelConfig.data_parallel_master_ip" in create


@pytest.mark.parametrize("version", COVERED)
def test_headless_runs_the_workers_of_a_multi_node_group(version):
    serve = (tree(version) / "entrypoints/cli/serve.py").read_text(encoding="utf-8")
    body = serve[serve.index("def run_headless"):]
    assert "node_rank_within_dp > 0" in body and "MultiprocExecutor" in body


@pytest.mark.parametrize("version", COVERED)
def test_dflash_drafter_shares_the_targets_tensor_parallel_group(version):
    root = tree(version)
    # the base proposer builds the drafter's config from the target's, replacing no parallel config
    base = function_source(root / "v1/spec_decode/llm_base_proposer.py", "SpecDecodeBaseProposer._create_draft_vllm_config")
    assert "parallel_config" not in base
    v2 = root / "v1/worker/gpu/spec_decode/dflash/utils.py"
    if v2.exists():
        assert "parallel_config" not in function_source(v2, "load_dflash_model")
    dflash_model = (root / "model_executor/models/qwen3_dflash.py").read_text(encoding="utf-8")
    assert "get_tensor_model_parallel_world_size" in dflash_model and "QKVParallelLinear" in dflash_model
    # draft_tensor_parallel_size reaches only the draft_model method's proposer, never a dflash file
    readers = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if "draft_parallel_config" in p.read_text(encoding="utf-8", errors="replace"))
    assert "v1/spec_decode/draft_model.py" in readers
    assert not [r for r in readers if "dflash" in r], readers


@pytest.mark.parametrize("version", COVERED)
def test_gemma4_pipeline_stages_drop_the_drafters_layers(version):
    forward = function_source(tree(version) / "model_executor/models/gemma4.py", "Gemma4Model.forward")
    assert "islice(self.layers, self.start_layer, self.end_layer)" in forward
    assert re.search(r"_maybe_add_hidden_state\(\s*aux_hidden_states, layer_idx \+ 1", forward)
    not_last = forward[forward.index("if not get_pp_group().is_last_rank"):]
    returned = not_last[:not_last.index("return IntermediateTensors")]
    assert "aux_hidden_states" not in returned  # only hidden_states (and per-layer inputs) go on


@pytest.mark.parametrize("version", COVERED)
def test_moe_experts_shard_over_data_parallel_ranks(version):
    config = (tree(version) / "model_executor/layers/fused_moe/config.py").read_text(encoding="utf-8")
    assert "def flatten_tp_across_dp" in config


def test_multi_node_data_parallel_needs_the_mp_backend():
    for version in ("0.21.0", "0.33.0"):
        create = function_source(tree(version) / "engine/arg_utils.py", "EngineArgs.create_engine_config")
        assert re.search(r'data_parallel_backend (==|!=) "mp"', create)
