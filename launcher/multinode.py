"""One model over several machines: vLLM's native multi-node, or Ray.

What the user asks for (``NodeRequest``, validated here, at the edge) and
what the recipe's multi-node profile says (``recipe.Cluster``: TP, PP, DP,
the socket interface) become one command per node (``Node``). The plan
(``launcher.plan``) uses ``render``; nothing here imports the plan.

Native multi-node, read from vLLM's own sources (0.21.0 ... 0.33.0, the same
in each): ``--nnodes``, ``--node-rank``, ``--master-addr`` and ``--master-port``
are parallel options of ``EngineArgs`` (``vllm/engine/arg_utils.py``,
``add_cli_args``), default master port 29501 (``ParallelConfig.master_port``);
``--headless`` is a serve option (``vllm/entrypoints/openai/cli_args.py`` in 0.21.0,
``launchers/cli_args.py`` in 0.29.0 ... 0.32.0, ``common/cli_args.py`` in 0.33.0). ``EngineArgs.create_engine_config``
requires ``--data-parallel-backend mp`` with ``--nnodes`` > 1 and a world size
(TP x PP x DP) that ``--nnodes`` divides; it infers the data-parallel rank and
local size from ``--node-rank``, and the data-parallel address from
``--master-addr``. ``run_headless`` (``vllm/entrypoints/cli/serve.py``) then
runs the TP/PP workers of a node that is not a group's first
(``node_rank_within_dp > 0``), or its data-parallel engines, which connect to
the head at ``--master-addr``: the head serves the API, the others none.

Ray (``--distributed-executor-backend ray``): no node flags; the head starts a
Ray cluster, every other node joins it, and vLLM on the head places its
workers over the cluster, waiting up to 1800 s for the GPUs to appear
(``PG_WAIT_TIMEOUT`` in ``vllm/v1/executor/ray_utils.py``).
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from dataclasses import dataclass, field

from launcher.errors import LauncherError

# ParallelConfig.master_port and .data_parallel_rpc_port (vllm/config/parallel.py), 0.21.0 and 0.33.0.
DEFAULT_MASTER_PORT = 29501
DP_RPC_PORT = 29550
DEFAULT_RAY_PORT = 6379
BACKENDS = ("mp", "ray")
# The variables that pin NCCL, Gloo (torch.distributed's CPU groups) and UCX to one interface.
SOCKET_VARIABLES = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


@dataclass(frozen=True)
class NodeRequest:
    """``launcher serve --nnodes N --node-rank R --master-addr A [--master-port P]``."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int = DEFAULT_MASTER_PORT
    backend: str = "mp"  # mp: vLLM's native multi-node; ray: --distributed-executor-backend ray
    ifname: str | None = None  # --ifname: beats the profile's cluster.socket_ifname
    ray_port: int = DEFAULT_RAY_PORT

    @property
    def head(self) -> bool:
        return self.node_rank == 0

    def role(self, rank: int | None = None) -> str:
        return "head" if (self.node_rank if rank is None else rank) == 0 else "worker"


def request(nnodes: int | None, node_rank: int | None, master_addr: str | None, master_port: int | None,
            backend: str | None, ifname: str | None) -> NodeRequest | None:
    """The command line's node options as a NodeRequest (None: one node); every error names its option."""
    given = {"--node-rank": node_rank, "--master-addr": master_addr, "--master-port": master_port,
             "--distributed-executor-backend": backend, "--ifname": ifname}
    if nnodes is None or nnodes == 1:
        stray = [k for k, v in given.items() if v is not None]
        if nnodes is None and stray:
            raise LauncherError(f"{', '.join(stray)} without --nnodes: these place this machine in a cluster",
                                hint="add --nnodes N (the number of machines serving the model together)")
        if nnodes == 1 and stray:
            raise LauncherError(f"--nnodes 1 with {', '.join(stray)}: one machine has no other node to meet",
                                hint="drop --nnodes 1, or give the number of machines")
        return None
    if nnodes < 1:
        raise LauncherError(f"--nnodes {nnodes}: the number of machines is 1 or more")
    if node_rank is None:
        others = "1 on the other" if nnodes == 2 else f"1 to {nnodes - 1} on the others"
        raise LauncherError(f"--nnodes {nnodes} needs --node-rank: 0 on the head (it serves the API), {others}")
    if not 0 <= node_rank < nnodes:
        raise LauncherError(f"--node-rank {node_rank}: with --nnodes {nnodes} a node's rank is 0 to {nnodes - 1}")
    if not master_addr:
        raise LauncherError(
            f"--nnodes {nnodes} needs --master-addr: the head node's address on the link between the nodes",
            hint="the head listens there (on --master-port, and for data parallel also on port "
                 f"{DP_RPC_PORT}) for the other nodes, so it must be an address they reach, e.g. the QSFP "
                 "port's 192.168.177.11 or 169.254.x.y; the API itself stays on --host (127.0.0.1 by default)")
    _check_master_addr(master_addr)
    port = DEFAULT_MASTER_PORT if master_port is None else master_port
    if not 1 <= port <= 65535:
        raise LauncherError(f"--master-port {port}: a TCP port is 1 to 65535")
    if port == DP_RPC_PORT:
        # the head would bind it twice where the profile runs data parallel
        raise LauncherError(f"--master-port {port} is the port vLLM's data-parallel engines meet on",
                            hint=f"pick another, e.g. the default {DEFAULT_MASTER_PORT}")
    chosen = backend or "mp"
    if chosen not in BACKENDS:
        raise LauncherError(f"--distributed-executor-backend {chosen!r}: use mp (vLLM's native multi-node) or ray")
    if ifname is not None:
        from launcher.recipe import IFNAME

        if not IFNAME.match(ifname):
            raise LauncherError(f"--ifname {ifname!r} is not a network interface name",
                                hint="letters, digits and _.:- , at most 15 characters, e.g. enp1s0f1np1 "
                                     "(`ip -br link` lists them)")
    return NodeRequest(nnodes=nnodes, node_rank=node_rank, master_addr=master_addr, master_port=port,
                       backend=chosen, ifname=ifname)


def _check_master_addr(addr: str) -> None:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        labels = addr.rstrip(".").split(".")
        if labels[-1].isdigit() or len(addr) > 253 or not all(_HOST_LABEL.match(label) for label in labels):
            raise LauncherError(f"--master-addr {addr!r} is neither an IP address nor a host name",
                                hint="the head node's address on the link between the nodes, e.g. 192.168.177.11")
        return
    if ip.is_unspecified:
        raise LauncherError(f"--master-addr {addr}: the other nodes connect to it, so it must be the head's own "
                            "address, not the any-address", hint="e.g. the head's address on the QSFP link")


def is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


@dataclass
class Node:
    """What one node runs: its steps in order (the last is the one that stays up) and the
    environment the cluster adds there (the socket interface variables)."""

    rank: int
    role: str  # head | worker
    steps: list[list[str]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    launcher: str = ""  # the `launcher serve` line that plans this node (printed for the other nodes)

    @property
    def main(self) -> list[str]:
        return self.steps[-1]


def interface_env(ifname: str) -> dict[str, str]:
    return {name: ifname for name in SOCKET_VARIABLES}


def parallel_args(cluster) -> list[str]:
    """TP, PP and DP as the profile sets them (only those above 1: vLLM's default is 1)."""
    out: list[str] = []
    for flag, value in (("--tensor-parallel-size", cluster.tensor_parallel),
                        ("--pipeline-parallel-size", cluster.pipeline_parallel),
                        ("--data-parallel-size", cluster.data_parallel)):
        if value > 1:
            out += [flag, str(value)]
    return out


def node_args(req: NodeRequest, rank: int) -> list[str]:
    """The flags that place one node in the cluster."""
    if req.backend == "ray":
        return ["--distributed-executor-backend", "ray"]
    args = ["--nnodes", str(req.nnodes), "--node-rank", str(rank),
            "--master-addr", req.master_addr, "--master-port", str(req.master_port)]
    return args + (["--headless"] if rank > 0 else [])


def without_address(argv: list[str]) -> list[str]:
    """A headless node serves no API: its command carries no --host / --port."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        flag = arg.split("=", 1)[0]
        if flag in ("--host", "--port"):
            skip = "=" not in arg
            continue
        out.append(arg)
    return out


def check_layout(req: NodeRequest, cluster, profile: str) -> None:
    """What vLLM itself would refuse, said before anything starts, naming the option."""
    if cluster.world_size % req.nnodes:
        raise LauncherError(
            f"--nnodes {req.nnodes}: profile {profile} puts the model on {cluster.world_size} GPUs "
            f"(TP {cluster.tensor_parallel} x PP {cluster.pipeline_parallel} x DP {cluster.data_parallel}), "
            f"which {req.nnodes} nodes cannot share evenly (vLLM: --nnodes must divide the world size)")
    if req.backend == "ray" and cluster.data_parallel > 1:
        raise LauncherError(
            f"--distributed-executor-backend ray: profile {profile} is data parallel (DP {cluster.data_parallel}), "
            "and vLLM runs multi-node data parallel on its mp backend only "
            "(create_engine_config: --nnodes > 1 requires --data-parallel-backend mp)",
            hint="drop --distributed-executor-backend ray (the native multi-node runs it)")


def render(req: NodeRequest, cluster, profile: str, argv_for_rank, ifname: str) -> list[Node]:
    """Every node's commands. ``argv_for_rank(rank)`` is the plan's ``vllm serve`` line for that node
    (with the cluster's flags); the ray steps wrap it."""
    check_layout(req, cluster, profile)
    nodes = []
    for rank in range(req.nnodes):
        argv = argv_for_rank(rank)
        if req.backend == "ray":
            if rank == 0:
                steps = [["ray", "start", "--head", "--port", str(req.ray_port), "--node-ip-address", req.master_addr],
                         argv]
            else:
                steps = [["ray", "start", "--address", f"{req.master_addr}:{req.ray_port}", "--block"]]
        else:
            steps = [argv if rank == 0 else without_address(argv)]
        nodes.append(Node(rank=rank, role=req.role(rank), steps=steps, env=interface_env(ifname)))
    return nodes


def host_ip_line(ifname: str) -> str:
    """A shell line that sets VLLM_HOST_IP to this machine's IPv4 address on ``ifname``."""
    return (f"export VLLM_HOST_IP=$(ip -4 -o addr show {shlex.quote(ifname)} | "
            "awk '{print $4}' | cut -d/ -f1 | head -n1)")


# --- DFlash across nodes ---------------------------------------------------------

# What decides it, read in every release the recipes cover (0.21.0, 0.26.0, 0.27.1, 0.29.0,
# 0.30.0, 0.31.0, 0.32.0, 0.33.0); tests/integration/test_multinode_vllm_sources.py re-reads it.
DRAFTER_TP_SOURCES = (
    "the DFlash drafter is built with the target's own parallel config, so it is sharded over the "
    "target's tensor-parallel group, across the nodes: V1 runner SpecDecodeBaseProposer._create_draft_vllm_config "
    "(vllm/v1/spec_decode/llm_base_proposer.py) replaces only the attention (and MoE kernel) config, V2 runner "
    "load_dflash_model (vllm/v1/worker/gpu/spec_decode/dflash/utils.py, 0.26.0 on) only the attention, cache "
    "and load config; DFlashQwen3Attention (vllm/model_executor/models/qwen3_dflash.py) splits its heads by "
    "get_tensor_model_parallel_world_size(), and speculative_config.draft_tensor_parallel_size is read only "
    "by the draft_model method (vllm/v1/spec_decode/draft_model.py), never for dflash"
)
DRAFTER_PP_SOURCES = (
    "Gemma4Model.forward (vllm/model_executor/models/gemma4.py) collects the drafter's target-layer hidden "
    "states by the layer's index within its own pipeline stage (enumerate(islice(self.layers, start_layer, "
    "end_layer))) and a stage that is not the last passes on only hidden_states (IntermediateTensors), so "
    "the layers of the first stage never reach the drafter on the last"
)


def drafter_heads(drafter_config: dict | None) -> tuple[int | None, int | None]:
    if not drafter_config:
        return None, None
    heads = drafter_config.get("num_attention_heads")
    kv = drafter_config.get("num_key_value_heads", heads)
    return heads, kv


def drafter_verdict(cluster, drafter_config: dict | None) -> tuple[str | None, str]:
    """(refusal or None, what the plan says about the drafter across the nodes)."""
    if cluster.pipeline_parallel > 1:
        return (f"a DFlash drafter cannot run with pipeline parallel {cluster.pipeline_parallel} on Gemma 4: "
                + DRAFTER_PP_SOURCES), ""
    tp = cluster.tensor_parallel
    heads, kv = drafter_heads(drafter_config)
    if tp > 1 and heads is not None:
        if heads % tp:
            return (f"the drafter's {heads} attention heads do not split over tensor parallel {tp} "
                    "(DFlashQwen3Attention asserts total_num_heads % tp_size == 0)"), ""
        if kv and (kv % tp if kv >= tp else tp % kv):
            return (f"the drafter's {kv} KV heads do not split over tensor parallel {tp} "
                    "(DFlashQwen3Attention: tp_size must divide them, or they it)"), ""
    if cluster.data_parallel > 1 and tp == 1:
        layout = (f"each of the {cluster.data_parallel} data-parallel engines runs its own drafter on its own "
                  "GPU (tensor parallel 1)")
    elif tp == 1:
        layout = "the drafter runs on the node of the target's last stage"
    else:
        layout = f"the drafter runs tensor parallel {tp} across the nodes with the target: " + DRAFTER_TP_SOURCES
    return None, layout
