"""Multi-node plans (issue 54). A second machine cannot exist here: each node is planned from
this one, its network described by HostInfo.interfaces (the probe itself is checked for real
against this machine's own interfaces at the end)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from launcher import multinode
from launcher.checks import resolve
from launcher.cli import app
from launcher.errors import LauncherError
from launcher.hardware import network_interfaces
from launcher.plan import Request, format_nodes, format_plan
from launcher.runtime import docker as docker_runtime
from tests.unit.conftest import GB10, make_ctx

HEAD = "192.168.177.11"
WORKER = "192.168.177.12"


def ctx_on(address: str, ifname: str = "enp1s0f1np1"):
    ctx = make_ctx(GB10)
    ctx.host.interfaces = {"lo": ["127.0.0.1"], ifname: [address]}
    return ctx


def plan_for(recipe: str, rank: int, *, address: str | None = None, backend: str | None = None,
             ifname: str | None = None, **kw):
    nodes = multinode.request(2, rank, HEAD, None, backend, ifname)
    return resolve(Request(recipe, vllm_version=kw.pop("version", "0.33.0"), nodes=nodes, **kw),
                   ctx_on(address or (HEAD if rank == 0 else WORKER)))


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_31b_tensor_parallel_over_two_sparks(models):
    head, worker = plan_for("gemma4-31b-dflash", 0), plan_for("gemma4-31b-dflash", 1)
    assert head.profile == worker.profile == "dgx-spark-x2"
    for plan, rank in ((head, 0), (worker, 1)):
        assert flag(plan.argv, "--tensor-parallel-size") == "2"
        assert flag(plan.argv, "--nnodes") == "2" and flag(plan.argv, "--node-rank") == str(rank)
        assert flag(plan.argv, "--master-addr") == HEAD and flag(plan.argv, "--master-port") == "29501"
        assert plan.env["NCCL_SOCKET_IFNAME"] == plan.env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert plan.env["UCX_NET_DEVICES"] == "enp1s0f1np1"
    # the head serves the API; the worker runs headless, with no address of its own to bind
    assert "--headless" not in head.argv and flag(head.argv, "--host") == "127.0.0.1"
    assert "--headless" in worker.argv and "--host" not in worker.argv and "--port" not in worker.argv
    assert head.env["VLLM_HOST_IP"] == HEAD and worker.env["VLLM_HOST_IP"] == WORKER
    # both plans hold both nodes' commands, the same but for rank and role
    assert [n.role for n in head.nodes] == ["head", "worker"]
    assert head.nodes[1].main == worker.argv
    assert not [r for r in head.reasons if r.area == "network" or "across" in r.message]


def test_moe_data_parallel_with_its_own_drafter_per_engine(models):
    plan = plan_for("gemma4-moe-dflash", 1)
    assert flag(plan.argv, "--data-parallel-size") == "2" and "--tensor-parallel-size" not in plan.argv
    assert "--speculative-config" in plan.argv and "--headless" in plan.argv
    assert "own drafter" in plan.cluster["drafter"]
    assert "29550" in plan.cluster["listens"]  # the DP engines' handshake port on the head
    assert "flatten_tp_across_dp" in plan.cluster["note"]


def test_dry_run_prints_every_node_and_a_block_for_the_other(models):
    plan = plan_for("gemma4-31b-dflash", 0)
    text = format_plan(plan) + "\n" + format_nodes(plan)
    assert "node 0 (head)  (this node)" in text and "node 1 (worker)" in text
    assert ("launcher serve --recipe gemma4-31b-dflash --nnodes 2 --node-rank 1 --master-addr " + HEAD) in text
    assert "export NCCL_SOCKET_IFNAME=enp1s0f1np1" in text
    assert "export VLLM_HOST_IP=$(ip -4 -o addr show enp1s0f1np1" in text
    assert text.count("--headless") == 2  # the worker's command, twice: in the list and in its block


def test_the_paste_block_never_prints_a_secret_nor_pastes_a_mask(models):
    """A token in this node's environment is neither shown nor pasted as "***" (which would set
    the other node's token to three stars): the line keeps that node's own value, or refuses."""
    import subprocess

    ctx = ctx_on(HEAD)
    ctx.environ.update({"HF_TOKEN": "hf_abcdefgh12345678", "VLLM_LOGGING_LEVEL": "DEBUG"})
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0",
                           nodes=multinode.request(2, 0, HEAD, None, None, None)), ctx)
    text = format_nodes(plan)
    assert "hf_abcdefgh12345678" not in text and "HF_TOKEN=***" not in text
    line = next(x.strip() for x in text.splitlines() if x.strip().startswith("export HF_TOKEN="))
    assert "export VLLM_LOGGING_LEVEL=DEBUG" in text  # not a secret: pasted as it is
    # run as a shell would on the other node: its own token kept, a missing one named
    kept = subprocess.run(["bash", "-c", f'{line}; echo "$HF_TOKEN"'], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_theirs"})
    assert kept.returncode == 0 and kept.stdout.strip() == "hf_theirs"
    missing = subprocess.run(["bash", "-c", f"{line}; echo pasted"], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"})
    assert missing.returncode != 0 and "set HF_TOKEN on this node first" in missing.stderr
    assert "pasted" not in missing.stdout


def test_cli_dry_run_of_both_nodes(models):
    result = CliRunner().invoke(app, ["serve", "--recipe", "gemma4-moe-dflash", "--nnodes", "2", "--node-rank", "0",
                                      "--master-addr", HEAD, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["profile"] == "dgx-spark-x2" and data["cluster"]["data_parallel"] == 2
    assert [n["role"] for n in data["nodes"]] == ["head", "worker"]
    assert "--headless" in data["nodes"][1]["steps"][-1]


def test_ray_start_sequence(models):
    head = plan_for("gemma4-31b-dflash", 0, backend="ray")
    worker = plan_for("gemma4-31b-dflash", 1, backend="ray")
    assert head.steps == [["ray", "start", "--head", "--port", "6379", "--node-ip-address", HEAD]]
    assert flag(head.argv, "--distributed-executor-backend") == "ray" and "--nnodes" not in head.argv
    assert worker.argv == ["ray", "start", "--address", f"{HEAD}:6379", "--block"] and not worker.serves_api


def _vllm_env(ray: str | None):
    from launcher.vllm_env import VllmEnv

    return VllmEnv(python="/opt/vllm/bin/python", source="--vllm-python", vllm_version="0.33.0",
                   transformers_version="5.17.0", package_dir="/opt/vllm/lib/vllm", ray_version=ray)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_ray_node_without_ray_beside_vllm_is_blocked_with_the_install(models, rank):
    # vLLM 0.33.0 on a GPU host without ray: create_engine_config raised "Failed to import Ray"
    # for the Ray head's argv; a worker runs `ray start` from that environment.
    from launcher.plan import Request

    nodes = multinode.request(2, rank, HEAD, None, "ray", None)
    ctx = ctx_on(HEAD if rank == 0 else WORKER)
    ctx.installed_vllm, ctx.vllm = "0.33.0", _vllm_env(None)
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0", nodes=nodes, runtime="native"), ctx)
    ray = [r for r in plan.reasons if "ray package is not installed" in r.message]
    assert len(ray) == 1 and ray[0].blocking
    assert "/opt/vllm/bin/python -m pip install ray" in ray[0].hint

    ctx.vllm = _vllm_env("2.49.2")
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0", nodes=nodes, runtime="native"), ctx)
    assert not [r for r in plan.reasons if "ray" in r.message.lower() and "not installed" in r.message]


def test_the_native_multinode_needs_no_ray(models):
    from launcher.plan import Request

    ctx = ctx_on(HEAD)
    ctx.installed_vllm, ctx.vllm = "0.33.0", _vllm_env(None)
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0", runtime="native",
                           nodes=multinode.request(2, 0, HEAD, None, None, None)), ctx)
    assert not [r for r in plan.reasons if "ray package" in r.message]


def test_the_probe_reports_ray_as_absent_from_an_environment_without_it():
    import sys

    from launcher import vllm_env

    env = vllm_env.inspect(sys.executable, "test")
    assert env.ray_version is None  # the launcher's venv does not install ray


def test_ray_refuses_data_parallel(models):
    with pytest.raises(LauncherError, match="mp backend only"):
        plan_for("gemma4-moe-dflash", 0, backend="ray")


@pytest.mark.parametrize("args, message", [
    ((2, None, HEAD, None, None, None), "needs --node-rank"),
    ((2, 2, HEAD, None, None, None), "--node-rank 2"),
    ((2, 0, None, None, None, None), "needs --master-addr"),
    ((2, 0, "0.0.0.0", None, None, None), "not the any-address"),
    ((2, 0, "300.1.1.1", None, None, None), "--master-addr"),
    ((2, 0, HEAD, 70000, None, None), "--master-port 70000"),
    ((2, 0, HEAD, None, "mpi", None), "--distributed-executor-backend 'mpi'"),
    ((2, 0, HEAD, None, None, "eth0; rm"), "--ifname"),
    ((None, 1, None, None, None, None), "without --nnodes"),
    ((1, 0, HEAD, None, None, None), "--nnodes 1 with"),
])
def test_bad_node_options_name_the_option(args, message):
    with pytest.raises(LauncherError, match=message.replace("(", r"\(").replace("'", ".")):
        multinode.request(*args)


def test_profile_and_node_count_must_agree(models):
    with pytest.raises(LauncherError, match="say which one this is"):
        resolve(Request("gemma4-31b-dflash", profile="dgx-spark-x2"), make_ctx(GB10))
    with pytest.raises(LauncherError, match="no profile for 2 machines"):
        resolve(Request("gemma4-e4b", nodes=multinode.request(2, 0, HEAD, None, None, None)), make_ctx(GB10))
    with pytest.raises(LauncherError, match="does not fit profile dgx-spark"):
        resolve(Request("gemma4-31b-dflash", profile="dgx-spark", nodes=multinode.request(2, 0, HEAD, None, None, None)),
                make_ctx(GB10))


def test_interface_must_exist_on_this_node(models):
    plan = plan_for("gemma4-31b-dflash", 0, ifname="enP2p1s0f1np1")
    blocking = [r.message for r in plan.blocking if r.area == "network"]
    assert blocking and "enP2p1s0f1np1" in blocking[0] and "enp1s0f1np1" in blocking[0]  # it lists what exists


def test_head_must_own_the_master_address_and_a_worker_must_not(models):
    wrong_head = plan_for("gemma4-31b-dflash", 0, address=WORKER)
    assert any("not an address of this node" in r.message for r in wrong_head.blocking)
    wrong_worker = plan_for("gemma4-31b-dflash", 1, address=HEAD)
    assert any("is not the head" in r.message for r in wrong_worker.blocking)


def test_environment_beats_the_profile_interface_and_set_beats_it(models):
    nodes = multinode.request(2, 0, HEAD, None, None, None)
    ctx = ctx_on(HEAD, "bond0")
    ctx.environ["NCCL_SOCKET_IFNAME"] = "bond0"
    plan = resolve(Request("gemma4-31b-dflash", nodes=nodes, sets=["GLOO_SOCKET_IFNAME=bond0"]), ctx)
    assert plan.env["NCCL_SOCKET_IFNAME"] == "bond0" and plan.env_sources["NCCL_SOCKET_IFNAME"] == "environment"
    assert plan.env_sources["GLOO_SOCKET_IFNAME"] == "--set"


def test_pipeline_parallel_refuses_the_drafter_with_the_reason(models):
    plan = plan_for("gemma4-31b-dflash", 0, sets=["profiles.dgx-spark-x2.cluster.pipeline_parallel=2",
                                                  "profiles.dgx-spark-x2.cluster.tensor_parallel=1"])
    refusal = [r.message for r in plan.blocking if r.area == "drafter"]
    assert refusal and "Gemma4Model.forward" in refusal[0] and "IntermediateTensors" in refusal[0]
    assert flag(plan.argv, "--pipeline-parallel-size") == "2"
    unblocked = plan_for("gemma4-31b-dflash", 0, sets=["profiles.dgx-spark-x2.cluster.pipeline_parallel=2",
                                                       "profiles.dgx-spark-x2.cluster.tensor_parallel=1",
                                                       "drafter=null"])
    assert not [r for r in unblocked.blocking if r.area == "drafter"]


def test_drafter_heads_that_tensor_parallel_cannot_split(tmp_path, models):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"num_attention_heads": 3, "num_key_value_heads": 1}))
    plan = plan_for("gemma4-31b-dflash", 0, drafter=str(drafter))
    assert any("3 attention heads" in r.message for r in plan.blocking if r.area == "drafter")


def test_world_size_the_nodes_cannot_share(models):
    with pytest.raises(LauncherError, match="cannot share evenly"):
        multinode.check_layout(multinode.request(2, 0, HEAD, None, None, None),
                               type("C", (), {"world_size": 3, "tensor_parallel": 3, "pipeline_parallel": 1,
                                              "data_parallel": 1})(), "x")


def test_cluster_flags_after_dashdash_are_refused(models):
    with pytest.raises(LauncherError, match="--tensor-parallel-size is set by the multi-node plan"):
        plan_for("gemma4-31b-dflash", 0, extra_args=["--tensor-parallel-size", "4"])


def test_docker_node_runs_on_host_network_with_its_role(models):
    head = plan_for("gemma4-31b-dflash", 0, runtime="docker", image="vllm-sm12x:0.33.0-sm121-arm64")
    worker = plan_for("gemma4-31b-dflash", 1, runtime="docker", image="vllm-sm12x:0.33.0-sm121-arm64")
    hs, ws = docker_runtime.container_spec(head), docker_runtime.container_spec(worker)
    assert hs["network_mode"] == ws["network_mode"] == "host" and hs["ports"] == ws["ports"] == {}
    assert hs["image"] == ws["image"]
    assert hs["labels"]["org.vllm-sm12x.node-role"] == "head" and ws["labels"]["org.vllm-sm12x.node-role"] == "worker"
    assert ws["health_url"] is None and hs["health_url"] == "http://127.0.0.1:8000/health"
    assert hs["env"]["NCCL_SOCKET_IFNAME"] == ws["env"]["UCX_NET_DEVICES"] == "enp1s0f1np1"
    # host networking: vLLM binds the plan's own --host / --port, not the container's 0.0.0.0:8000
    assert flag(hs["command"], "--host") == "127.0.0.1" and "--host" not in ws["command"]
    assert "--network host" in docker_runtime.format_container_spec(ws)

    class Container:  # what `launcher ps` reads from the daemon (no daemon here)
        name, status = ws["name"], "running"
        labels = ws["labels"]
        attrs = {"HostConfig": {}, "Config": {"Image": ws["image"]}}

    assert docker_runtime.describe(Container())["role"] == "worker 1/2"


def test_single_machine_plans_are_unchanged(models):
    plan = resolve(Request("gemma4-31b-dflash", vllm_version="0.33.0"), make_ctx(GB10))
    assert plan.profile == "dgx-spark" and plan.cluster is None and not plan.nodes
    assert "--nnodes" not in plan.argv and "NCCL_SOCKET_IFNAME" not in plan.env
    spec = docker_runtime.container_spec(resolve(Request("gemma4-31b-dflash", runtime="docker", image="x:y"),
                                                 make_ctx(GB10)))
    assert spec["network_mode"] == "bridge" and spec["ports"]


def test_this_machines_interfaces_are_read():
    found = network_interfaces()
    assert found is not None and "lo" in found and found["lo"] == ["127.0.0.1"]


@pytest.mark.parametrize("ports, why", [
    (["--master-port", "29550"], "--master-port 29550 is the port vLLM's data-parallel engines meet on"),
    (["--master-port", "8000"], "--master-port 8000 is also the API's --port"),
    (["--master-port", "9100", "--port", "9100"], "--master-port 9100 is also the API's --port"),
])
def test_a_master_port_the_head_already_listens_on_is_refused(ports, why):
    """The plan printed `listens head A:29550 (store), A:29550 (handshake)` and went on."""
    res = CliRunner().invoke(app, ["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--nnodes", "2",
                                   "--node-rank", "0", "--master-addr", "192.0.2.2", *ports])
    assert res.exit_code == 2 and why in res.output, res.output
    ok = CliRunner().invoke(app, ["serve", "--recipe", "gemma4-moe-dflash", "--dry-run", "--json", "--nnodes", "2",
                                  "--node-rank", "0", "--master-addr", "192.0.2.2", "--master-port", "29502"])
    assert "is the port vLLM" not in ok.output and "also the API's" not in ok.output
