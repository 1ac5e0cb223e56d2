"""The resolved Plan: exactly what will run, for every runtime.

recipe + hardware + vLLM version + user overrides --assemble()--> Plan
Plan --checks.resolve() adds the preflight reasons--> native runtime | docker runtime | --dry-run (print)

Dependencies point one way: recipe -> plan -> checks/runtime -> CLI. This
module never imports ``launcher.checks``; callers that want the preflight
(every command) call ``launcher.checks.resolve``.
"""

from __future__ import annotations

import ipaddress
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from launcher import multinode, passthrough, redact
from launcher import recipe as recipes
from launcher import vllm_compat
from launcher.errors import LauncherError
from launcher.hardware import HostInfo
from launcher.paths import models_dir
from launcher.preflight import Reason
from launcher.profiles import DEFAULT_PROFILE, PROFILES, profile_for_capability
from launcher.testgpu import StandIn, can_stand_in, stand_in
from launcher.vllm_env import VllmEnv


@dataclass
class PatchState:
    """A patch the recipe needs, and whether the vLLM that will run has it."""

    id: str
    applied: bool | None  # None: unknown (vLLM not installed here, or runs in an image)
    detail: str = ""


@dataclass
class Plan:
    recipe: str
    profile: str
    profile_source: str  # "detected" | "default (no GPU detected)" | "--profile"
    vllm_version: str
    vllm_version_source: str  # "installed" | "--vllm-version" | "image TAG" | "recipe default: ..."
    runtime: str  # "native" | "docker"
    model: Path
    drafter: Path | None
    host: str
    port: int
    # Environment the plan sets for vLLM (merged over the process environment
    # by the native runtime; the whole container env for docker).
    env: dict[str, str] = field(default_factory=dict)
    # Where each env value came from: "recipe" | "environment" | "--set".
    env_sources: dict[str, str] = field(default_factory=dict)
    # Variables to remove from the inherited environment (stale for this vLLM).
    env_unset: list[str] = field(default_factory=list)
    # The vLLM command line, starting with "vllm", "serve".
    argv: list[str] = field(default_factory=list)
    api_key: str | None = None  # passed as VLLM_API_KEY, never on argv, never printed
    image: str | None = None  # docker runtime: the image to run
    # native runtime: the interpreter whose vLLM was inspected and will run
    vllm_python: str | None = None
    patches: list[PatchState] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)
    # The recipe as resolved (--set and the profile applied): what the checks read.
    spec: recipes.Recipe | None = field(default=None, repr=False, compare=False)
    # --test-gpu: the GPU standing in for the profile's card and the --set items it implied
    # (launcher.testgpu); None without --test-gpu or when nothing could stand in.
    test_gpu: StandIn | None = None
    # --recipe as given (a shipped name or a file): what a hint's command repeats.
    recipe_arg: str = ""
    # Multi-node (launcher.multinode): every node's commands, this node's rank, and what the
    # plan says about the layout; None / empty on one machine.
    nodes: list[multinode.Node] = field(default_factory=list)
    node_rank: int | None = None
    cluster: dict | None = None
    # Commands this node runs before ``argv`` (ray start --head on a Ray head).
    steps: list[list[str]] = field(default_factory=list)

    @property
    def role(self) -> str:
        """head (serves the API) or worker (headless); one machine is its own head."""
        return "worker" if self.node_rank else "head"

    @property
    def serves_api(self) -> bool:
        return self.argv[:2] == ["vllm", "serve"] and "--headless" not in self.argv

    @property
    def blocking(self) -> list[Reason]:
        return [r for r in self.reasons if r.blocking]


# --- resolution --------------------------------------------------------------


_ENV_KEY = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Variables from the shell that the plan carries (into a container too) even
# when the recipe does not set them: everything vLLM reads, HF auth and offline mode
# (HF_HOME is the docker runtime's mount, see launcher/runtime/docker.py). VLLM_PYTHON is the
# launcher's own (--vllm-python): a host path, and a variable vLLM does not know.
_INHERITED = re.compile(r"^(VLLM_(?!PYTHON$)|HF_TOKEN$|HUGGING_FACE_HUB_TOKEN$|HF_HUB_OFFLINE$)")
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


@dataclass
class Request:
    """What the user asked for on the command line."""

    recipe: str
    model: str | None = None
    drafter: str | None = None
    profile: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    runtime: str = "native"
    vllm_version: str | None = None
    image: str | None = None
    sets: list[str] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    # Plan for a Hopper test GPU standing in for the profile's sm_12x card (launcher.testgpu).
    test_gpu: bool = False
    # --nnodes / --node-rank / --master-addr ...: this machine's place in a cluster (None: alone).
    nodes: multinode.NodeRequest | None = None


@dataclass(frozen=True)
class LocalImage:
    """A vllm-sm12x image the Docker daemon has, as its labels describe it."""

    tag: str
    vllm_version: str | None  # org.vllm-sm12x.vllm-version (an NGC base's may carry +local)
    target: str | None  # sm120 | sm121
    arch: str | None  # amd64 | arm64
    created: str = ""  # ISO time: the newest build wins the default


@dataclass
class Context:
    """What the machine says; injected by tests, probed for real otherwise."""

    host: HostInfo
    environ: Mapping[str, str]
    installed_vllm: str | None
    installed_transformers: str | None
    # The environment native serve runs (launcher.vllm_env); None: none found,
    # or a test describing versions only.
    vllm: VllmEnv | None = None
    # Docker runtime: the images the daemon has (every tag; labels where they are
    # vllm-sm12x's). None: not looked (native runtime, a test) or the daemon did
    # not answer (docker_error says why).
    images: list[LocalImage] | None = None
    docker_error: str | None = None


def split_sets(sets: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``--set`` items → (env vars, recipe fields). An upper-case KEY is an env
    var; a dotted lower-case path is a recipe field."""
    env: dict[str, str] = {}
    fields: dict[str, str] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise LauncherError(f"--set {item!r}: expected KEY=VALUE")
        (env if _ENV_KEY.match(key) else fields)[key] = value
    return env, fields


_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")


def url_host(host: str) -> str:
    """``host`` as a URL spells it: an IPv6 address in brackets (``http://[::]:8000``, not ``http://:::8000``)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def validate_address(host: str, port: int) -> None:
    """An address vLLM can bind: a port in 1..65535, an IP address or a host name (RFC 1123)."""
    if not 1 <= port <= 65535:
        raise LauncherError(f"--port {port}: a TCP port is 1 to 65535")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    if host.rstrip(".").rsplit(".", 1)[-1].isdigit():
        # A name never ends in a number (RFC 3696): this was meant as an IPv4 address.
        raise LauncherError(f"--host {host!r} is not an IPv4 address: four numbers 0 to 255, like 127.0.0.1")
    if len(host) > 253 or not all(_HOST_LABEL.match(label) for label in host.rstrip(".").split(".")):
        raise LauncherError(f"--host {host!r} is neither an IP address nor a host name",
                            hint="e.g. 127.0.0.1 (this machine only), 0.0.0.0 (every interface) or a name like myhost.lan")


def assemble(req: Request, ctx: Context) -> Plan:
    """The plan without the preflight checks (``launcher.checks.resolve`` runs them on it)."""
    validate_address(req.host, req.port)
    env_sets, field_sets = split_sets(req.sets)
    rec = recipes.load(req.recipe)
    for dotted, value in field_sets.items():
        rec = recipes.set_field(rec, dotted, value)

    reasons: list[Reason] = []
    warnings: list[str] = []
    profile, profile_source = _choose_profile(req, rec, ctx.host, reasons)
    standing_in = _test_gpu(req, rec, profile, ctx.host, field_sets, warnings)
    if standing_in is not None:
        # Applied as --set items that come before the user's (stand_in skips every field the user set).
        for dotted, value, _ in standing_in.sets:
            rec = recipes.set_field(rec, dotted, value)
        field_sets = {**{k: v for k, v, _ in standing_in.sets}, **field_sets}
        profile_source = ("--profile" if req.profile else "the recipe's default") + \
            f", on a {standing_in.gpu.sm} test GPU (--test-gpu)"
    rec = _sets_beat_profile(rec, profile, field_sets)
    built = _built_image(req, rec, profile, ctx) if req.runtime == "docker" else None
    version, version_source = _choose_version(req, rec, ctx, reasons, built)
    rec, since = _serve_for_release(rec, profile, version, field_sets)
    if since:
        profile_source += f"; {since}"

    override = rec.profiles.get(profile)
    env, sources = _recipe_env(rec, override, ctx.host.wsl, version, warnings)
    cluster = override.cluster if override else None
    if req.nodes is not None:
        if req.nodes.backend == "mp" and req.nodes.master_port == req.port:
            # the head's torch.distributed store listens on every interface: the API could not bind
            raise LauncherError(f"--master-port {req.port} is also the API's --port",
                                hint=f"pick another for one of them, e.g. --master-port {multinode.DEFAULT_MASTER_PORT}")
        _cluster_env(req.nodes, cluster, profile, ctx.host, env, sources)
    env_unset = _merge_environment(env, sources, ctx.environ, version, warnings)
    _apply_env_sets(env, sources, env_unset, env_sets, version)

    model = Path(req.model).expanduser() if req.model else models_dir() / rec.target.name
    drafter = None
    if req.drafter and not rec.drafter:
        # dropped silently, the user would believe a drafter serves
        raise LauncherError(f"--drafter {req.drafter}: recipe {rec.name} serves without a drafter",
                            hint="choose a recipe with one (launcher recipes list: the *-dflash ones), "
                                 "or leave --drafter out")
    if rec.drafter:
        drafter = Path(req.drafter).expanduser() if req.drafter else models_dir() / rec.drafter.name
    nodes: list[multinode.Node] = []
    if req.nodes is None:
        argv = _argv(rec, override, version, model, drafter, req, warnings)
    else:
        mine = req.nodes.node_rank

        def argv_for(rank: int) -> list[str]:
            extra = multinode.parallel_args(cluster) + multinode.node_args(req.nodes, rank)
            return _argv(rec, override, version, model, drafter, req, warnings if rank == mine else [], extra)

        nodes = multinode.render(req.nodes, cluster, profile, argv_for, env["NCCL_SOCKET_IFNAME"])
        for node in nodes:
            node.launcher = launcher_line(req, node.rank)
        argv = nodes[mine].main

    plan = Plan(
        recipe=rec.name,
        profile=profile,
        profile_source=profile_source,
        vllm_version=str(version),
        vllm_version_source=version_source,
        runtime=req.runtime,
        model=model,
        drafter=drafter,
        host=req.host,
        port=req.port,
        env=env,
        env_sources=sources,
        env_unset=env_unset,
        argv=argv,
        api_key=req.api_key,
        image=(req.image or (built.tag if built else default_image(str(version), profile)))
        if req.runtime == "docker" else req.image,
        vllm_python=ctx.vllm.python if req.runtime == "native" and ctx.vllm and ctx.vllm.has_vllm else None,
        warnings=warnings,
        reasons=reasons,
        spec=rec,
        test_gpu=standing_in,
        recipe_arg=req.recipe,
        nodes=nodes,
        node_rank=req.nodes.node_rank if req.nodes else None,
        steps=nodes[req.nodes.node_rank].steps[:-1] if req.nodes else [],
    )
    if req.nodes is not None:
        _cluster_summary(plan, rec, req.nodes, cluster, drafter)
    _safety(plan, rec, ctx, req.extra_args)
    _drafter_kernel_risk(plan, rec)
    _target_attention_checks(plan, rec, req.extra_args)
    _b12x_moe_checks(plan, rec)
    return plan


def _test_gpu(req: Request, rec, profile: str, host: HostInfo, field_sets: dict[str, str],
              warnings: list[str]) -> StandIn | None:
    """--test-gpu on a GPU that may stand in for the profile's card; None (with a warning) otherwise.
    The hardware check (launcher.checks) still refuses a GPU that matches no profile."""
    if not req.test_gpu:
        return None
    gpu = host.gpu
    if gpu is not None and gpu.capability == PROFILES[profile].capability:
        warnings.append(f"--test-gpu: {gpu.name} ({gpu.sm}) is the card profile {profile} is for; nothing to stand in")
        return None
    if not can_stand_in(gpu):
        what = f"{gpu.name} ({gpu.sm}) cannot" if gpu else "no GPU was detected, and none but a Hopper (sm_90) can"
        warnings.append(f"--test-gpu: {what} stand in for {PROFILES[profile].sm}"
                        + ("; only Hopper (sm_90) does" if gpu else ""))
        return None
    return stand_in(rec, profile, gpu, field_sets)


def default_image(version: str, profile: str) -> str:
    sm = PROFILES[profile].sm.replace("_", "")
    arch = PROFILES[profile].platform.split("/")[1]
    return f"vllm-sm12x:{version}-{sm}-{arch}"


def _sets_beat_profile(rec, profile: str, field_sets: dict[str, str]):
    """A ``--set serve.X`` must win over the profile's own ``serve.X``."""
    override = rec.profiles[profile].serve.model_dump()
    for dotted, value in field_sets.items():
        head, _, key = dotted.partition(".")
        if head == "serve" and key in override:
            rec = recipes.set_field(rec, f"profiles.{profile}.serve.{key}", value)
    return rec


def _serve_for_release(rec, profile: str, version: str, field_sets: dict[str, str]):
    """The profile's ``serve_since`` settings for ``version`` in place of its own (a ``--set
    serve.X`` still wins), and a line saying which, for the plan's profile source."""
    entry = rec.serve_since(profile, version)
    if entry is None:
        return rec, ""
    since, values = entry
    applied = {k: v for k, v in values.items()
               if f"serve.{k}" not in field_sets and f"profiles.{profile}.serve.{k}" not in field_sets}
    for key, value in applied.items():
        rec = recipes.set_field(rec, f"profiles.{profile}.serve.{key}", str(value))
    if not applied:
        return rec, ""
    return rec, ", ".join(f"serve.{k}={v}" for k, v in applied.items()) + f" from vLLM {since} on (serve_since)"


def _choose_profile(req: Request, rec, host: HostInfo, reasons: list[Reason]) -> tuple[str, str]:
    nnodes = req.nodes.nnodes if req.nodes else 1
    if req.profile:
        if req.profile not in PROFILES:
            known = [p for p in PROFILES if p in rec.profiles]
            raise LauncherError(f"unknown profile {req.profile!r}", hint=f"recipe {rec.name} has: {', '.join(known)}")
        if req.profile not in rec.profiles:
            raise LauncherError(f"recipe {rec.name} has no profile {req.profile!r}", hint=f"it has: {', '.join(rec.profiles)}")
        nodes = PROFILES[req.profile].nodes
        if nodes > 1 and req.nodes is None:
            raise LauncherError(
                f"profile {req.profile} serves one model on {nodes} machines: say which one this is",
                hint=f"add --nnodes {nodes} --node-rank R --master-addr HEAD_ADDRESS (R: 0 on the head, which "
                     "serves the API; 1 on the other); --dry-run prints both nodes' commands")
        if nodes != nnodes:
            raise LauncherError(f"--nnodes {nnodes} does not fit profile {req.profile}, which is {nodes} machine(s)",
                                hint=_multi_node_profiles(rec) if nnodes > 1 else f"drop --profile {req.profile}")
        return req.profile, "--profile"
    gpu = host.gpu
    if nnodes > 1:
        fits = [p for p in rec.profiles if PROFILES[p].nodes == nnodes]
        if not fits:
            raise LauncherError(f"--nnodes {nnodes}: recipe {rec.name} has no profile for {nnodes} machines",
                                hint=_multi_node_profiles(rec))
        same = [p for p in fits if gpu is not None and PROFILES[p].capability == gpu.capability]
        if same:
            return same[0], f"detected ({gpu.name}, {gpu.sm}) x {nnodes} nodes (--nnodes)"
        return fits[0], f"the recipe's profile for {nnodes} nodes (--nnodes" + ("; no GPU detected)" if gpu is None else ")")
    detected = profile_for_capability(gpu.capability) if gpu else None
    if detected and detected.name in rec.profiles:
        return detected.name, f"detected ({gpu.name}, {gpu.sm})"
    default = rec.default_profile if rec.default_profile in rec.profiles else DEFAULT_PROFILE
    if gpu is None:
        return default, "default (no GPU detected)"
    return default, f"default (detected {gpu.name}, {gpu.sm}, matches no profile of this recipe)"


def _multi_node_profiles(rec) -> str:
    multi = [f"{p} ({PROFILES[p].nodes} nodes)" for p in rec.profiles if PROFILES[p].nodes > 1]
    return f"its multi-node profiles: {', '.join(multi)}" if multi else f"recipe {rec.name} serves on one machine only"


def _cluster_env(nodes: multinode.NodeRequest, cluster, profile: str, host: HostInfo,
                 env: dict[str, str], sources: dict[str, str]) -> None:
    """The socket interface NCCL, Gloo and UCX use (--ifname beats the profile's), and this
    node's address on it as VLLM_HOST_IP (what vLLM's get_ip() answers, Ray's node address)."""
    ifname = nodes.ifname or cluster.socket_ifname
    source = "--ifname" if nodes.ifname else f"profile {profile} cluster.socket_ifname"
    for key, value in multinode.interface_env(ifname).items():
        env[key] = value
        sources[key] = source
    addresses = (host.interfaces or {}).get(ifname) or []
    if addresses:
        env["VLLM_HOST_IP"] = addresses[0]
        sources["VLLM_HOST_IP"] = f"this node's address on {ifname}"


def _cluster_summary(plan: Plan, rec, nodes: multinode.NodeRequest, cluster, drafter: Path | None) -> None:
    """What the plan says about the cluster: layout, who listens where, the drafter's verdict."""
    ifname = plan.env.get("NCCL_SOCKET_IFNAME", cluster.socket_ifname)
    summary = {
        "nnodes": nodes.nnodes,
        "node_rank": nodes.node_rank,
        "role": nodes.role(),
        "backend": nodes.backend,
        "master_addr": nodes.master_addr,
        "master_port": nodes.master_port,
        "tensor_parallel": cluster.tensor_parallel,
        "pipeline_parallel": cluster.pipeline_parallel,
        "data_parallel": cluster.data_parallel,
        "socket_ifname": ifname,
        "listens": _listens(nodes, cluster),
        "drafter": None,
        "note": None,
    }
    if multinode.is_loopback(nodes.master_addr):
        plan.warnings.append(
            f"--master-addr {nodes.master_addr} is loopback: every node must run on this machine (one GPU each, "
            "CUDA_VISIBLE_DEVICES); two machines need the head's address on the link between them")
    if cluster.note:
        summary["note"] = cluster.note
    if nodes.backend == "ray":
        plan.warnings.append(
            "--distributed-executor-backend ray: the `ray` package must be installed beside vLLM on every node "
            "(vLLM does not depend on it); the head starts Ray, then vLLM, which waits up to 1800 s for the "
            "other nodes' GPUs to join")
    if rec.drafter is not None and drafter is not None:
        refusal, layout = multinode.drafter_verdict(cluster, _read_json(drafter / "config.json"))
        if refusal:
            plan.reasons.append(Reason("drafter", refusal,
                                       hint="serve without the drafter (--set drafter=null) or with a profile "
                                            "that has no pipeline parallel"))
        summary["drafter"] = refusal and f"refused: {refusal}" or layout
    plan.cluster = summary


def _listens(nodes: multinode.NodeRequest, cluster) -> str:
    if nodes.backend == "ray":
        return f"head {nodes.master_addr}:{nodes.ray_port} (Ray GCS; the other nodes join it)"
    where = f"head {nodes.master_addr}:{nodes.master_port} (torch.distributed store)"
    if cluster.data_parallel > 1:
        where += f", {nodes.master_addr}:{multinode.DP_RPC_PORT} (data-parallel engines' handshake)"
    return where + "; the other nodes connect there, so the head must be reachable on it"


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def launcher_line(req: Request, rank: int) -> str:
    """The ``launcher serve`` line that plans node ``rank`` of the same cluster (for the other nodes)."""
    n = req.nodes
    parts = ["launcher", "serve", "--recipe", req.recipe]
    if req.profile:
        parts += ["--profile", req.profile]
    parts += ["--nnodes", str(n.nnodes), "--node-rank", str(rank), "--master-addr", n.master_addr]
    if n.master_port != multinode.DEFAULT_MASTER_PORT:
        parts += ["--master-port", str(n.master_port)]
    if n.backend != "mp":
        parts += ["--distributed-executor-backend", n.backend]
    if n.ifname:
        parts += ["--ifname", n.ifname]
    if req.model:
        parts += ["--model", req.model]
    if req.drafter:
        parts += ["--drafter", req.drafter]
    if rank == 0:
        if req.host != "127.0.0.1":
            parts += ["--host", req.host]
        if req.port != 8000:
            parts += ["--port", str(req.port)]
    if req.runtime != "native":
        parts += ["--runtime", req.runtime]
    if req.image:
        parts += ["--image", req.image]
    if req.vllm_version:
        parts += ["--vllm-version", req.vllm_version]
    # A secret is written as that node's own variable, never as this node's value nor as the mask.
    secret = []
    for item in req.sets:
        key, _, value = item.partition("=")
        if "." not in key and redact.is_secret_name(key) and value:  # an env setting, not a recipe field
            secret.append("--set " + paste_value(key, value))
        else:
            parts += ["--set", item]
    if req.test_gpu:
        parts.append("--test-gpu")
    if rank == 0 and req.api_key:  # the head serves the API: with the key the user gave here
        secret.append("--api-key " + _from_env("VLLM_API_KEY"))
    line = " ".join([shlex.join(parts), *secret])
    return line + (" -- " + _paste_args(req.extra_args) if req.extra_args else "")


def _from_env(name: str) -> str:
    """A shell word that is ``$name`` on the node it is pasted on, and refuses where it is unset."""
    return f'"${{{name}:?set {name} on this node first}}"'


def _paste_args(args: list[str]) -> str:
    """The words after ``--``, each secret flag's values as the variable vLLM would read them from."""
    shown, count = redact.argv(args), {}
    words = []
    flag = None
    for given, masked in zip(args, shown):
        if redact.is_secret_flag(given):
            flag = given.partition("=")[0]
        if given == masked:
            words.append(shlex.quote(given))
            continue
        name = redact.env_name(flag)
        count[name] = count.get(name, 0) + 1
        name += "" if count[name] == 1 else f"_{count[name]}"
        words.append(f"{flag}={_from_env(name)}" if masked.endswith("=" + redact.MASK) else _from_env(name))
    return " ".join(words)


def _choose_version(req: Request, rec, ctx: Context, reasons: list[Reason], built: LocalImage | None = None):
    if req.vllm_version:
        return vllm_compat.parse_version(req.vllm_version), "--vllm-version"
    if req.runtime == "native" and ctx.installed_vllm:
        return vllm_compat.parse_version(ctx.installed_vllm), "installed"
    if built is not None and _image_version(built):
        return _image_version(built), f"image {built.tag}"
    # The newest the recipe supports: what `launcher install` installs, so that the plan shown
    # before the install is the one that runs after it.
    return vllm_compat.parse_version(vllm_compat.newest(rec.vllm_versions)), "recipe default: the newest, as launcher install"


def _image_version(image: LocalImage):
    """The image's vLLM (0.29.0+2d3f1c.nv26.09 on an NGC base is 0.29.0); None when its label has none."""
    try:
        return vllm_compat.parse_version(image.vllm_version) if image.vllm_version else None
    except LauncherError:
        return None


def _built_image(req: Request, rec, profile: str, ctx: Context) -> LocalImage | None:
    """The image the docker runtime runs when --image names none: the newest
    vllm-sm12x image built for this profile's card and a vLLM the recipe
    supports (--vllm-version narrows it). With --image: that image, if the
    daemon has it, so that its vLLM decides the plan's version."""
    images = ctx.images or []
    if req.image:
        return next((i for i in images if i.tag == req.image), None)
    sm = PROFILES[profile].sm.replace("_", "")
    arch = PROFILES[profile].platform.split("/")[1]
    wanted = {str(vllm_compat.parse_version(v)) for v in
              ([req.vllm_version] if req.vllm_version else rec.vllm_versions)}
    fits = [i for i in images if i.target == sm and i.arch == arch and str(_image_version(i)) in wanted]
    return max(fits, key=lambda i: (i.created, i.tag), default=None)


def _recipe_env(rec, override, wsl: bool, version, warnings: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    rendered = vllm_compat.render_intent(rec.intent, version)
    warnings.extend(rendered.notes)
    layers = [("recipe", rec.env), ("recipe", rendered.env)]
    if override:
        layers.append(("recipe profile", override.env))
    if wsl:
        layers.append(("recipe wsl", rec.wsl.env))
    env: dict[str, str] = {}
    sources: dict[str, str] = {}
    for source, values in layers:
        for key, value in values.items():
            if not vllm_compat.env_read_by(key, version):
                continue  # e.g. the WSL pin-memory switch before 0.24.0
            env[key] = str(value)
            sources[key] = source
    return env, sources


def _merge_environment(env, sources, environ: Mapping[str, str], version, warnings: list[str]) -> list[str]:
    unset: list[str] = []
    for key in sorted(environ):
        value = environ[key]
        replacement = vllm_compat.stale_replacement(key, version)
        if replacement:
            unset.append(key)
            warnings.append(
                f"dropped {key} from your environment: vLLM {version} no longer reads it; use {replacement}"
            )
            continue
        if key in env or _INHERITED.match(key):
            env[key] = value
            sources[key] = "environment"
    return unset


def _apply_env_sets(env, sources, env_unset: list[str], env_sets: dict[str, str], version) -> None:
    for key, value in env_sets.items():
        replacement = vllm_compat.stale_replacement(key, version)
        if replacement:
            raise LauncherError(f"--set {key}: vLLM {version} no longer reads {key}", hint=f"use {replacement}")
        env[key] = value
        sources[key] = "--set"
        if key in env_unset:
            env_unset.remove(key)


def _argv(rec, override, version, model: Path, drafter: Path | None, req: Request, warnings: list[str],
          cluster_args: list[str] | None = None) -> list[str]:
    serve = rec.serve.model_dump()
    if override:
        serve.update({k: v for k, v in override.serve.model_dump().items() if v is not None})
    argv = ["vllm", "serve", str(model)]
    if rec.target.served_names:
        argv += ["--served-model-name", *rec.target.served_names]
    argv += ["--host", req.host, "--port", str(req.port)]
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                "max_cudagraph_capture_size"):
        if serve[key] is not None:
            argv += [f"--{key.replace('_', '-')}", _num(serve[key])]
    _cuda_graph_cover(serve, rec, version, warnings)
    for key in ("enable_chunked_prefill", "enable_prefix_caching", "trust_remote_code", "enable_auto_tool_choice", "enforce_eager"):
        if serve[key]:
            argv.append(f"--{key.replace('_', '-')}")
    if serve["tool_call_parser"]:
        argv += ["--tool-call-parser", serve["tool_call_parser"]]
    argv += vllm_compat.render_intent(rec.intent, version).args
    if rec.drafter and drafter is not None:
        argv += ["--speculative-config", json.dumps(_spec_config(rec.drafter, drafter), separators=(",", ":"))]
    argv += cluster_args or []
    # One copy of each flag: the user's after `--` is refused or replaces the plan's (launcher.passthrough).
    return passthrough.merge(passthrough.merge_extra(argv, serve["extra_args"]), list(req.extra_args), warnings)


def _cuda_graph_cover(serve: dict, rec, version, warnings: list[str]) -> None:
    """Say so when the widest decode step runs without a CUDA graph (vllm_compat.cudagraph_decode_cover)."""
    if serve["enforce_eager"] or not serve["max_num_seqs"]:
        return
    spec = rec.drafter.num_speculative_tokens if rec.drafter else 0
    covered = vllm_compat.cudagraph_decode_cover(
        version, max_num_seqs=serve["max_num_seqs"], speculative_tokens=spec,
        max_num_batched_tokens=serve["max_num_batched_tokens"], capture_size=serve["max_cudagraph_capture_size"],
    )
    if covered < serve["max_num_seqs"]:
        need = serve["max_num_seqs"] * (1 + spec)
        warnings.append(
            f"decode steps of more than {covered} requests run without CUDA graphs on vLLM {version}: "
            f"{serve['max_num_seqs']} sequences x {1 + spec} tokens = {need} tokens exceed the largest captured "
            f"batch; set serve.max_cudagraph_capture_size={need} or lower max_num_seqs to {covered}"
        )


def _spec_config(d, drafter: Path) -> dict:
    config = {"method": d.method, "model": str(drafter), "num_speculative_tokens": d.num_speculative_tokens}
    if d.attention_backend:
        config["attention_backend"] = d.attention_backend
    return config


def _num(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# First release whose TRITON_ATTN runs non-causal attention
# (TritonAttentionBackend.supports_non_causal); 0.21.0 has only the base's False.
TRITON_NON_CAUSAL_FROM = "0.26.0"


def _drafter_kernel_risk(plan: Plan, rec) -> None:
    """The Spark's FA2 is the kernel of an open device-side assert (vLLM #50707).

    #50707 reports `_vllm_fa2_C.varlen_fwd` asserting at start-up on a GB10
    (sm_121) for the non-causal DFlash draft attention, on a V1-runner setup;
    a comment there suggests the V2 runner. On sm_12x FLASH_ATTN means FA2,
    and FA2 ran this attention lossless in the GPU proof (FA2 forced on
    Hopper, tests/gpu/results/realshape.md), but no sm_121 card was at hand.
    So the Spark profile keeps the recipe's FLASH_ATTN: from 0.26.0 the Gemma
    4 recipes' drafter runs the V2 runner anyway (forced for a mixed
    sliding/full drafter, the default from 0.29.0), and TRITON_ATTN (the
    target's own backend) runs non-causal attention there, so it is the
    fallback the warning names. 0.21.0 has DFlash on V1 only, the reported
    setup, and no fallback: its TRITON_ATTN has no non-causal attention, and
    FLEX_ATTENTION cannot start next to the target (``_flex_drafter_refusal``).
    """
    _flex_drafter_refusal(plan, rec)
    if plan.profile != "dgx-spark" or rec.drafter is None:
        return
    if (rec.drafter.attention_backend or "flash_attn") != "flash_attn":
        return
    version = vllm_compat.parse_version(plan.vllm_version)
    if version >= vllm_compat.parse_version(TRITON_NON_CAUSAL_FROM):
        runner = f"vLLM {plan.vllm_version} runs this drafter on the V2 runner, the workaround suggested there"
        way_out = "run the drafter without FA2: --set drafter.attention_backend=triton_attn"
        if rec.intent.attention_per_kind.get("sliding_window") == "flash_attn":
            # The per-kind map would still put the drafter's sliding layers on FA2.
            way_out += " --set intent.attention_per_kind={}"
    else:
        runner = f"vLLM {plan.vllm_version} runs DFlash on the V1 runner only, the setup of that report"
        way_out = (f"vLLM {plan.vllm_version} has no drafter backend without FA2 for this model; serve with vLLM "
                   f"{TRITON_NON_CAUSAL_FROM} or later and --set drafter.attention_backend=triton_attn")
    plan.warnings.append(
        "DGX Spark: the drafter runs FLASH_ATTN, i.e. FlashAttention 2 on sm_121, where vLLM #50707 reports a "
        f"device-side assert in _vllm_fa2_C.varlen_fwd at start-up ({runner}); if you see it, {way_out} "
        "(or serve without the drafter: --set drafter=null), and report it (tests/gpu/README.md, 'sm_12x kernels')"
    )


def _flex_drafter_refusal(plan: Plan, rec) -> None:
    """A FLEX_ATTENTION drafter cannot start beside a Gemma 4 target on 0.21.0.

    The drafter's KV cache groups share raw tensors with the target's, whose
    layers run TRITON_ATTN with blocks first, ``(num_blocks, 2, ...)``; the
    series' ``reconcile-kv-layout-mixed-attention-backends`` gives every layer
    of such a tensor that layout, FLEX's included. ``FlexAttentionImpl.forward``
    then takes ``kv_cache.unbind(0)`` as (key, value) and
    ``key_cache.view(-1, num_kv_heads, head_size)``, which a blocks-first
    tensor cannot give ("view size is not compatible with input tensor's size
    and stride") on the first forward.
    """
    if rec.drafter is None or rec.drafter.attention_backend != "flex_attention":
        return
    if vllm_compat.parse_version(plan.vllm_version) >= vllm_compat.parse_version(TRITON_NON_CAUSAL_FROM):
        return
    plan.reasons.append(Reason(
        "drafter",
        f"drafter.attention_backend=flex_attention cannot start on vLLM {plan.vllm_version} beside this "
        "target: FLEX_ATTENTION cannot read the KV cache tensors it shares with the TRITON_ATTN target layers",
        hint=f"keep flash_attn, or serve with vLLM {TRITON_NON_CAUSAL_FROM} or later with "
             "--set drafter.attention_backend=triton_attn",
    ))


# Gemma 4's head sizes per KV cache group kind (head_dim / global_head_dim of every
# released Gemma 4 config), and the largest head size each backend takes on sm_12x:
# FA2's 256, B12X's get_supported_head_sizes (64-256), FlashInfer's 256.
GEMMA4_HEAD_DIM = {"sliding_window": 256, "full_attention": 512}
_MAX_HEAD_SIZE = {"flash_attn": 256, "b12x": 256, "flashinfer": 256}
# First release with the B12X attention backend (vllm/v1/attention/backends/b12x.py).
B12X_ATTENTION_FROM = "0.30.0"


def _target_attention_checks(plan: Plan, rec, extra_args: list[str]) -> None:
    """Which Gemma 4 layers may leave TRITON_ATTN (intent.attention_per_kind).

    Without FA4 every Gemma 4 layer is locked to TRITON_ATTN, because the
    512-dim full layers fit no other backend and multimodal serving puts a
    multimodal prefix on every layer, which FLASH_ATTN and B12X refuse
    ("partial multimodal token full attention not supported"). So a kind may
    take another backend only if its head size fits that backend, and only
    when the server is text-only (--language-model-only).
    """
    per_kind = rec.intent.attention_per_kind
    text_only = "--language-model-only" in [*rec.serve.extra_args, *extra_args]
    if per_kind and any(a == "--attention-config" or a.startswith("--attention-config=") for a in extra_args):
        # vLLM merges --attention-config.KEY arguments into one --attention-config it
        # appends last; a whole JSON given after `--` would then be dropped, or drop ours.
        plan.reasons.append(Reason(
            "recipe", "--attention-config after `--` would replace the recipe's "
            "--attention-config.backend_per_kind.* (vLLM keeps one --attention-config)",
            hint="pass each key dotted instead, e.g. -- --attention-config.flash_attn_version 2"))
    for kind, backend in sorted(per_kind.items()):
        if backend == "triton_attn":
            continue
        where = f"intent.attention_per_kind.{kind}={backend}"
        limit = _MAX_HEAD_SIZE.get(backend)
        if limit is not None and GEMMA4_HEAD_DIM[kind] > limit:
            plan.reasons.append(Reason(
                "recipe", f"{where}: Gemma 4's {kind} layers have head size {GEMMA4_HEAD_DIM[kind]}, "
                f"above {backend}'s {limit}; they must stay on TRITON_ATTN",
                hint=f"--set intent.attention_per_kind.{kind}=triton_attn"))
        if not text_only:
            plan.reasons.append(Reason(
                "recipe", f"{where} needs text-only serving: with images allowed every Gemma 4 layer carries "
                "a multimodal prefix, which only TRITON_ATTN serves without FA4",
                hint="add --language-model-only (the gemma4-moe-dflash-text recipe does)"))
        if backend == "b12x":
            _b12x_attention_checks(plan, where)
        if backend == "flash_attn":
            _fa3_stand_in_check(plan, where, extra_args)
    _per_kind_reaches_the_drafter(plan, rec)


def _fa3_stand_in_check(plan: Plan, where: str, extra_args: list[str]) -> None:
    """On a Hopper GPU standing in (--test-gpu) FLASH_ATTN runs FA3, not the FA2 of sm_12x,
    and Gemma 4's sliding layers on FA3 gave NaN logits in decode on an H100 (the reason the
    0.21.0 series' text-only patch keeps the lock wherever FA3 would serve them)."""
    if plan.test_gpu is None or any(a.startswith("--attention-config.flash_attn_version") for a in extra_args):
        return
    plan.reasons.append(Reason(
        "recipe", f"{where}: on {plan.test_gpu.gpu.name} FLASH_ATTN is FlashAttention 3, not the FA2 that "
        "sm_12x runs, and Gemma 4's sliding layers on FA3 gave NaN logits in decode on an H100",
        hint="add -- --attention-config.flash_attn_version 2"))


def _per_kind_reaches_the_drafter(plan: Plan, rec) -> None:
    """vLLM copies the whole attention config, backend_per_kind included, into the
    drafter's (0.33.0 ``load_dflash_model``: only ``backend`` is replaced), and a
    per-kind entry wins over the backend: the drafter's sliding layers take the map's
    backend, not ``drafter.attention_backend``."""
    per_kind = rec.intent.attention_per_kind
    sliding = per_kind.get("sliding_window")
    if sliding is None or rec.drafter is None:
        return
    if vllm_compat.parse_version(plan.vllm_version) < vllm_compat.BACKEND_PER_KIND_SINCE:
        return
    if sliding == "b12x":
        # B12X is causal-only (B12xPagedBackend: "b12x supports causal attention only"),
        # and a DFlash drafter with a non-causal layer is selected under use_non_causal,
        # which refuses a backend without non-causal attention for every draft layer.
        plan.reasons.append(Reason(
            "recipe", "intent.attention_per_kind.sliding_window=b12x would reach the DFlash drafter's "
            "sliding layers, and B12X has no non-causal attention, which vLLM requires of every draft layer",
            hint="serve B12X without the drafter (--set drafter=null), or keep flash_attn"))
        return
    drafter_backend = rec.drafter.attention_backend
    if drafter_backend is None or drafter_backend == sliding:
        return
    plan.reasons.append(Reason(
        "recipe", f"drafter.attention_backend={drafter_backend} would not reach the drafter's sliding layers: "
        f"vLLM {plan.vllm_version} gives them intent.attention_per_kind.sliding_window={sliding} too "
        "(the per-kind map is copied into the drafter's attention config and wins over its backend)",
        hint="--set intent.attention_per_kind={} (the target's sliding layers then stay on TRITON_ATTN), "
             f"or --set drafter.attention_backend={sliding}"))


def _b12x_attention_checks(plan: Plan, where: str) -> None:
    version = vllm_compat.parse_version(plan.vllm_version)
    if version < vllm_compat.parse_version(B12X_ATTENTION_FROM):
        plan.reasons.append(Reason("recipe", f"{where}: vLLM {plan.vllm_version} has no B12X attention backend",
                                   hint=f"use vLLM {B12X_ATTENTION_FROM} or later"))
    if plan.test_gpu is not None:
        plan.reasons.append(Reason("recipe", f"{where}: B12X runs on sm_120 / sm_121 only, not on the "
                                   "GPU standing in", hint=f"--set intent.attention_per_kind.sliding_window=flash_attn"))
    plan.warnings.append(
        f"{where}: B12X needs vLLM's b12x extra (pip install 'vllm[b12x]=={plan.vllm_version}'); "
        "its speed and output on these recipes are not measured yet"
    )


# First release whose --moe-backend takes each (MoEBackend in vllm/config/kernel.py).
B12X_MOE_FROM = {"flashinfer_b12x": "0.26.0", "b12x": "0.29.0"}


def _b12x_moe_checks(plan: Plan, rec) -> None:
    """B12X NVFP4 MoE kernels (``--moe-backend b12x | flashinfer_b12x``) are sm_12x-only and opt-in."""
    backend = rec.intent.moe_fp4_backend
    if backend not in B12X_MOE_FROM:
        return
    where = f"intent.moe_fp4_backend={backend}"
    since = B12X_MOE_FROM[backend]
    if vllm_compat.parse_version(plan.vllm_version) < vllm_compat.parse_version(since):
        plan.reasons.append(Reason("recipe", f"{where}: vLLM {plan.vllm_version}'s --moe-backend has no {backend}",
                                   hint=f"use vLLM {since} or later"))
    if plan.test_gpu is not None:
        plan.reasons.append(Reason("recipe", f"{where}: the B12X MoE kernels run on sm_120 / sm_121 only, "
                                   "not on the GPU standing in", hint="--set intent.moe_fp4_backend=marlin"))
    need = "vLLM's b12x extra (pip install 'vllm[b12x]')" if backend == "b12x" else "FlashInfer's CuteDSL kernels"
    plan.warnings.append(f"{where} needs {need}; its speed and output on these recipes are not measured yet")


def _safety(plan: Plan, rec, ctx: Context, extra_args: list[str]) -> None:
    key_on_argv = any(a.partition("=")[0].replace("_", "-") == "--api-key" for a in extra_args)
    if key_on_argv:
        plan.warnings.append(
            "--api-key after `--` puts the key on vLLM's command line, where `ps` and vLLM's log of its "
            "arguments show it; pass it to the launcher instead (serve --api-key KEY: sent as VLLM_API_KEY)"
        )
    if plan.host not in LOOPBACK and not plan.api_key and not plan.env.get("VLLM_API_KEY") and not key_on_argv:
        plan.reasons.append(
            Reason("environment", f"serving on {plan.host} (beyond loopback) without an API key", blocking=False,
                   hint="pass --api-key or bind --host 127.0.0.1")
        )
    if rec.serve.trust_remote_code:
        code = _remote_code(plan.model)
        if code is None:
            plan.warnings.append(f"--trust-remote-code (the recipe's): {plan.model} is fetched from the Hub, "
                                 "and vLLM will run whatever Python code that repo brings")
        elif code:
            plan.warnings.append(f"--trust-remote-code (the recipe's): vLLM will run the Python code in "
                                 f"{plan.model}: {', '.join(code)}")


def _remote_code(model: Path) -> list[str] | None:
    """The Python files a model folder brings (what --trust-remote-code runs): none for a folder
    not made yet (the checkpoint check blocks); None for a Hub id, whose code the plan cannot see."""
    if model.is_dir():
        return sorted(p.name for p in model.glob("*.py"))
    return [] if model.is_absolute() else None


# --- printing ----------------------------------------------------------------


def to_dict(plan: Plan) -> dict:

    return {
        "recipe": plan.recipe,
        "profile": plan.profile,
        "profile_source": plan.profile_source,
        "vllm_version": plan.vllm_version,
        "vllm_version_source": plan.vllm_version_source,
        "runtime": plan.runtime,
        "image": plan.image,
        "vllm_python": plan.vllm_python,
        "model": str(plan.model),
        "drafter": str(plan.drafter) if plan.drafter else None,
        "env": redact.env(plan.env),
        "env_sources": plan.env_sources,
        "env_unset": plan.env_unset,
        "argv": redact.argv(plan.argv),
        "api_key": "***" if plan.api_key else None,
        "patches": [{"id": p.id, "applied": p.applied, "detail": p.detail} for p in plan.patches],
        "warnings": plan.warnings,
        "reasons": [{"area": r.area, "message": r.message, "blocking": r.blocking, "hint": r.hint} for r in plan.reasons],
        "test_gpu": plan.test_gpu.to_dict() if plan.test_gpu else None,
        "cluster": plan.cluster,
        "nodes": [{"rank": n.rank, "role": n.role, "env": n.env, "steps": [redact.argv(s) for s in n.steps],
                   "launcher": n.launcher} for n in plan.nodes],
        "verdict": "blocked" if plan.blocking else "ready",
    }


def format_plan(plan: Plan) -> str:
    lines = [
        f"recipe        {plan.recipe}",
        f"profile       {plan.profile}  [{plan.profile_source}]",
        f"vLLM          {plan.vllm_version}  [{plan.vllm_version_source}]",
        f"runtime       {plan.runtime}" + (f"  image {plan.image}" if plan.image else ""),
        *([f"python        {plan.vllm_python}  [the vLLM that runs]"] if plan.vllm_python else []),
        f"model         {plan.model}",
    ]
    if plan.drafter:
        lines.append(f"drafter       {plan.drafter}")
    if plan.test_gpu:
        lines.append(f"test GPU      {plan.test_gpu.line()}")
        lines.extend(f"              note: {note}" for note in plan.test_gpu.notes)
    lines.append(f"endpoint      http://{url_host(plan.host)}:{plan.port}/v1" + ("  (API key set)" if plan.api_key else ""))
    lines.append("environment")
    shown = redact.env(plan.env)
    for key in sorted(shown):
        value = shown[key] if shown[key] == redact.MASK else shlex.quote(shown[key])
        lines.append(f"  {key}={value}    # {plan.env_sources.get(key, '')}")
    for key in plan.env_unset:
        lines.append(f"  unset {key}    # stale for vLLM {plan.vllm_version}")
    if plan.cluster:
        lines.extend(_cluster_lines(plan))
    if plan.runtime == "docker":
        # What runs is the container's command (vLLM binds 0.0.0.0:8000 inside): printed once, below.
        lines.append("command       the container's, below")
    else:
        lines.append("command" + (f"       node {plan.node_rank} ({plan.role})" if plan.cluster else ""))
        for step in plan.steps:
            lines.append("  " + shlex.join(step) + "    # first")
        lines.append("  " + " \\\n    ".join(flag_groups(redact.argv(plan.argv))))
    if plan.patches:
        lines.append("patches")
        for p in plan.patches:
            state = {True: "applied", False: "NOT applied", None: "unknown"}[p.applied]
            lines.append(f"  {p.id}: {state}" + (f" ({p.detail})" if p.detail else ""))
    for w in plan.warnings:
        lines.append(f"warning: {w}")
    lines.append("preflight")
    if not plan.reasons:
        lines.append("  ok")
    for r in plan.reasons:
        lines.append("  " + r.line())
    verdict = f"BLOCKED ({len(plan.blocking)} blocking reason(s) above)" if plan.blocking else "ready"
    lines.append(f"verdict       {verdict}")
    return "\n".join(lines)


def _cluster_lines(plan: Plan) -> list[str]:
    c = plan.cluster
    lines = [
        f"cluster       {c['nnodes']} nodes, this is node {c['node_rank']} ({c['role']}); "
        f"TP {c['tensor_parallel']} x PP {c['pipeline_parallel']} x DP {c['data_parallel']}; "
        + ("vLLM native multi-node (mp)" if c["backend"] == "mp" else "Ray (--distributed-executor-backend ray)"),
        f"  listens     {c['listens']}",
        f"  interface   {c['socket_ifname']}  (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES)",
        "  API         " + ("this node, " + f"http://{url_host(plan.host)}:{plan.port}/v1" if plan.role == "head"
                             else "the head's (this node runs headless)"),
    ]
    if c.get("drafter"):
        lines.append(f"  drafter     {c['drafter']}")
    if c.get("note"):
        lines.append(f"  note        {c['note']}")
    return lines


def format_nodes(plan: Plan) -> str:
    """Every node's commands, then a block to paste on each other node (``--dry-run``)."""
    out = ["nodes"]
    for node in plan.nodes:
        here = "  (this node)" if node.rank == plan.node_rank else ""
        out.append(f"  node {node.rank} ({node.role}){here}")
        for step in node.steps:
            out.append("    " + " \\\n      ".join(flag_groups(redact.argv(step)) if step[:2] == ["vllm", "serve"]
                                                    else [shlex.join(step)]))
    for node in plan.nodes:
        if node.rank == plan.node_rank:
            continue
        ifname = node.env.get("NCCL_SOCKET_IFNAME", "")
        out.append(f"on node {node.rank} ({node.role}), paste:")
        out.append(f"  {node.launcher}")
        out.append("or, without the launcher there (the same vLLM, patches and model paths):")
        for key, value in sorted(node.env.items()):
            out.append(f"  export {key}={shlex.quote(value)}")
        if ifname:
            out.append("  " + multinode.host_ip_line(ifname))
        for key in sorted(k for k in plan.env if k not in node.env and k != "VLLM_HOST_IP"):
            out.append(f"  export {paste_value(key, plan.env[key])}")
        for step in node.steps:
            out.append("  " + shlex.join(redact.argv(step)))
    return "\n".join(out)


def paste_value(key: str, value: str) -> str:
    """``KEY=value`` for a shell on another node. A secret is never printed, and a mask pasted as
    a value would set the token to ``***``: the line keeps that node's own value and refuses,
    naming the variable, where it has none."""
    if redact.is_secret_name(key) and value:
        return f"{key}={_from_env(key)}"
    return f"{key}={shlex.quote(value)}"


def flag_groups(argv: list[str]) -> list[str]:
    """One line per flag with its values, for a readable command."""
    groups = [argv[:3]]
    for arg in argv[3:]:
        if arg.startswith("--"):
            groups.append([arg])
        else:
            groups[-1].append(arg)
    return [" ".join(shlex.quote(a) for a in g) for g in groups]
