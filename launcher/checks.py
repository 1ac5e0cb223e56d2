"""Preflight checks of a resolved Plan: hardware, installed vLLM, patches,
checkpoint and drafter. Each appends ``Reason``s; none raises, so a dry run
always prints the whole plan with every reason at once."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

from launcher import recipe as recipes
from launcher.plan import Context, PatchState, Plan, Request, assemble
from launcher.preflight import Reason
from launcher.profiles import PROFILES
from launcher.testgpu import can_stand_in
from launcher.vllm_compat import nearest_release, parse_version

DRIVER_HINT = "install the NVIDIA driver (570 or newer for Blackwell) so that nvidia-smi works"


def resolve(req: Request, ctx: Context) -> Plan:
    """The plan for ``req`` with every preflight reason: what serve, doctor and --dry-run show."""
    plan = assemble(req, ctx)
    run_all(plan, plan.spec, ctx)
    plan.warnings = list(dict.fromkeys(plan.warnings))  # two checks may find the same thing
    return plan


def run_all(plan: Plan, rec, ctx: Context) -> None:
    hardware(plan, rec, ctx)
    network(plan, rec, ctx)
    vllm(plan, rec, ctx)
    image(plan, rec, ctx)
    patches(plan, rec, ctx)
    checkpoint(plan, rec, ctx)


def network(plan: Plan, rec, ctx: Context) -> None:
    """Multi-node: the socket interface exists on this node, and --master-addr is the head's own address."""
    if not plan.cluster:
        return
    interfaces = ctx.host.interfaces
    if interfaces is None:
        plan.warnings.append("could not list this machine's network interfaces: the socket interface and "
                             "--master-addr are not checked")
        return
    ifname = plan.env.get("NCCL_SOCKET_IFNAME", "")
    plain = ifname and not any(c in ifname for c in "^=,")  # NCCL also takes ^exclusions and lists
    have = ", ".join(sorted(interfaces)) or "none"
    if plain and ifname not in interfaces:
        plan.reasons.append(Reason(
            "network", f"interface {ifname} (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, UCX_NET_DEVICES; "
            f"{plan.env_sources.get('NCCL_SOCKET_IFNAME', '')}) does not exist on this node; it has: {have}",
            hint="--ifname NAME: the interface of the QSFP port the cable is in (ibdev2netdev or ip -br link)"))
    elif plain and not interfaces[ifname]:
        plan.warnings.append(f"interface {ifname} has no IPv4 address on this node: NCCL and Gloo need one "
                             "on the link between the nodes")
    mine = {a for addrs in interfaces.values() for a in addrs}
    addr = plan.cluster["master_addr"]
    if addr in ("localhost",) or addr.startswith("127."):
        return
    if not all(part.isdigit() for part in addr.split(".")):
        return  # a host name: resolved on each node by vLLM
    if plan.role == "head" and addr not in mine:
        plan.reasons.append(Reason(
            "network", f"--master-addr {addr} is not an address of this node, and node 0 is the head that "
            f"listens there for the other nodes (this node has: {', '.join(sorted(mine)) or 'none'})",
            hint="give the head's own address on the link, or run this as the node with --node-rank 1"))
    if plan.role == "worker" and addr in mine:
        plan.reasons.append(Reason(
            "network", f"--master-addr {addr} is this node's own address, but --node-rank "
            f"{plan.node_rank} is not the head",
            hint="on the head (the node with that address) use --node-rank 0; here, --node-rank 1"))


def image(plan: Plan, rec, ctx: Context) -> None:
    """The docker runtime's image must be on this machine: a dry run says so,
    rather than the start failing after the plan read as ready."""
    if plan.runtime != "docker" or not plan.image:
        return
    if ctx.images is None:
        if ctx.docker_error:
            plan.reasons.append(Reason("image", f"cannot look for image {plan.image}: {ctx.docker_error}",
                                       hint="start the Docker daemon (sudo systemctl start docker), "
                                            "or use --runtime native"))
        return
    if any(i.tag == plan.image for i in ctx.images):
        return
    from launcher.runtime.docker import image_hint

    ours = sorted(f"{i.tag} ({i.target} {i.arch}, vLLM {i.vllm_version})" for i in ctx.images if i.vllm_version)
    have = f"; vllm-sm12x images here: {', '.join(ours)}" if ours else "; no vllm-sm12x image is here"
    plan.reasons.append(Reason("image", f"image {plan.image} is not on this machine{have}", hint=image_hint(plan)))


def hardware(plan: Plan, rec, ctx: Context) -> None:
    # The docker runtime needs the host's GPU all the same: no runtime exemption.
    gpu = ctx.host.gpu
    profile = PROFILES[plan.profile]
    if gpu is None:
        why = ctx.host.nvml_error or "NVML found no GPU"
        plan.reasons.append(Reason("hardware", f"no NVIDIA GPU detected: {why}", hint=DRIVER_HINT))
        return
    fitting = [PROFILES[p] for p in rec.profiles]
    if plan.test_gpu is not None:
        # launcher.testgpu swapped the knobs this GPU cannot run; every other check stays.
        plan.reasons.append(
            Reason("hardware", f"test GPU: {plan.test_gpu.line()}", blocking=False,
                   hint="--test-gpu: a stand-in for testing, not a supported card")
        )
    elif gpu.capability not in {p.capability for p in fitting}:
        wanted = ", ".join(f"{p.sm} ({p.name})" for p in fitting)
        plan.reasons.append(
            Reason("hardware", f"{gpu.name} is {gpu.sm}; recipe {rec.name} is built for {wanted}",
                   hint="use a matching GPU, or --force to try anyway"
                        + ("; on a Hopper test GPU, --test-gpu" if can_stand_in(gpu) else ""))
        )
    if gpu.memory_gib < rec.min_gpu_memory_gib:
        plan.reasons.append(
            Reason("hardware", f"{gpu.name} has {gpu.memory_gib:g} GiB; recipe {rec.name} needs {rec.min_gpu_memory_gib:g} GiB")
        )
    if gpu.capability != profile.capability and plan.test_gpu is None:
        plan.reasons.append(
            Reason("hardware", f"profile {profile.name} is for {profile.sm} but the GPU is {gpu.sm}", blocking=False)
        )


def vllm(plan: Plan, rec, ctx: Context) -> None:
    version = parse_version(plan.vllm_version)
    if str(version) not in {str(parse_version(v)) for v in rec.vllm_versions}:
        near = nearest_release(version, rec.vllm_versions)
        plan.reasons.append(
            Reason("vllm", f"recipe {rec.name} supports vLLM {', '.join(rec.vllm_versions)}, not {version}; "
                           f"the nearest supported release is {near}",
                   hint=_unsupported_hint(plan, near, ctx))
        )
    if plan.runtime != "native":
        return  # the image carries its own vLLM and transformers
    if not ctx.installed_vllm:
        where = f"in {ctx.vllm.python} ({ctx.vllm.source})" if ctx.vllm else "in this Python nor behind a `vllm` on PATH"
        if ctx.vllm and ctx.vllm.problem:
            where += f": {ctx.vllm.problem}"
        plan.reasons.append(
            Reason("vllm", f"no vLLM found {where}",
                   hint=f"install one, patched: {launcher_command(ctx.vllm, 'install')}; or point --vllm-python at"
                        " the python that has vLLM; or use --runtime docker")
        )
    elif parse_version(ctx.installed_vllm) != version:
        plan.reasons.append(
            Reason("vllm", f"installed vLLM is {ctx.installed_vllm}, the plan is for {version}",
                   hint="drop --vllm-version or install that version")
        )
    _transformers(plan, version, ctx.installed_transformers)
    _ray(plan, ctx)


def _ray(plan: Plan, ctx: Context) -> None:
    """A node of a Ray cluster runs ``ray start`` from vLLM's environment, and vLLM's
    ``ParallelConfig`` refuses ``--distributed-executor-backend ray`` without the package
    ("Failed to import Ray", seen on 0.33.0): vLLM does not install it."""
    env = ctx.vllm
    if env is None or not env.has_vllm or env.ray_version:
        return  # no environment inspected (nothing to say), or Ray is there
    if not any(step and step[0] == "ray" for node in plan.nodes for step in node.steps):
        return
    plan.reasons.append(
        Reason("vllm", f"--distributed-executor-backend ray: the ray package is not installed in {env.python}, "
                       "and vLLM refuses its Ray executor without it",
               hint=f"{shell_quote(env.python)} -m pip install ray  (on every node), or use vLLM's native "
                    "multi-node: drop --distributed-executor-backend ray"))


# transformers 5.15 keeps Gemma 4's head_dim per layer (per_layer_config) and
# raises AmbiguousGlobalPerLayerAttributeError when it is read on the whole
# config; vLLM reads it per layer from 0.28.0 (PR #49797; issue #53836: a DGX
# Spark on 0.27.1 does not start).
PER_LAYER_HEAD_DIM_TRANSFORMERS = "5.15"
PER_LAYER_HEAD_DIM_VLLM = "0.28.0"


def _transformers(plan: Plan, version, tf: str | None) -> None:
    if not tf or parse_version(tf) < parse_version(PER_LAYER_HEAD_DIM_TRANSFORMERS):
        return
    if version.release[:2] == (0, 21):
        plan.reasons.append(
            Reason("vllm", f"transformers {tf} drops Gemma 4's global_head_dim, which vLLM 0.21.x reads",
                   hint="pip install 'transformers==5.13.1' 'tokenizers==0.22.2'")
        )
    elif version < parse_version(PER_LAYER_HEAD_DIM_VLLM):
        plan.reasons.append(
            Reason("vllm", f"transformers {tf} keeps Gemma 4's head_dim per layer, and vLLM {version} reads it for "
                           "the whole model: it stops at start-up with AmbiguousGlobalPerLayerAttributeError "
                           f"(vLLM #53836; read per layer from {PER_LAYER_HEAD_DIM_VLLM}, PR #49797)",
                   hint="pip install 'transformers==5.14.1', or use vLLM 0.29.0 or later")
        )


def _unsupported_hint(plan: Plan, near: str, ctx: Context) -> str:
    if plan.runtime == "native" and plan.vllm_version_source == "installed":
        return f"install vLLM {near} and its patches: {launcher_command(ctx.vllm, f'install --version {near}')}"
    return f"use --vllm-version {near}"


def patches(plan: Plan, rec, ctx: Context) -> None:
    required = rec.patches_for(plan.vllm_version)
    if not required:
        return
    try:
        from launcher.patching import series as series_mod
        ser = series_mod.series_for(plan.vllm_version)
        known = {p.id for p in ser.patches} | {p.id for p in getattr(ser, "build_patches", [])}
    except Exception as exc:  # a missing series is a finding, not a crash
        plan.reasons.append(Reason("patches", f"no patch series for vLLM {plan.vllm_version}: {exc}"))
        return
    states = _installed_states(plan, ctx)
    missing: list[str] = []
    for pid in required:
        if pid not in known:
            plan.patches.append(PatchState(pid, False, f"missing from the {ser.version} series"))
            plan.reasons.append(Reason(
                "patches", f"patch {pid} is not in the vLLM {ser.version} series{recipes.did_you_mean(pid, known)}",
                hint="fix the recipe's patches list: `launcher recipes validate FILE` names its line"))
            continue
        if plan.runtime == "docker":
            plan.patches.append(PatchState(pid, None, "applied in the image (its build fails otherwise)"))
            continue
        state = states.get(pid)
        applied = None if state is None else state == "applied"
        plan.patches.append(PatchState(pid, applied, "" if state else "vLLM not installed here"))
        if applied is False:
            missing.append(pid if state == "not-applied" else f"{pid} ({state})")
    if missing:
        # One line for all of them: the plan's patch list above has one per patch.
        plan.reasons.append(
            Reason("patches", f"{len(missing)} of {len(required)} required patches are not applied in the "
                              f"installed vLLM: {', '.join(missing)}",
                   hint=launcher_command(ctx.vllm, "patch apply"))
        )


def launcher_command(env, sub: str) -> str:
    """``launcher SUB`` for the vLLM ``env`` (a VllmEnv): with ``--vllm-python`` unless it is the launcher's own."""
    if env is None or env.python == sys.executable:
        return f"launcher {sub}"
    return f"launcher {sub} --vllm-python {shell_quote(env.python)}"


def shell_quote(word: str) -> str:
    """A word as the user's shell reads it back (cmd.exe / PowerShell on Windows)."""
    return subprocess.list2cmdline([word]) if os.name == "nt" else shlex.quote(word)


def _installed_states(plan: Plan, ctx: Context) -> dict[str, str]:
    if plan.runtime != "native" or not ctx.installed_vllm:
        return {}
    if parse_version(ctx.installed_vllm) != parse_version(plan.vllm_version):
        return {}
    try:
        from launcher.patching import engine

        # The vLLM that will run, not necessarily the launcher's own.
        status = engine.status(ctx.vllm.package_dir if ctx.vllm and ctx.vllm.package_dir else None)
    except Exception as exc:
        plan.warnings.append(f"could not read the patch status of the installed vLLM: {exc}")
        return {}
    if status.interrupted:
        plan.reasons.append(Reason("patches", "an interrupted `launcher patch apply` left the installed vLLM half-written",
                                   hint=f"{launcher_command(ctx.vllm, 'patch status')} (rolls it back), "
                                        f"then {launcher_command(ctx.vllm, 'patch apply')}"))
    return {p.id: p.state for p in status.patches}


def _fetch_hint(plan: Plan, rec, ref, path, fallback: str) -> str:
    """The one command that fetches a missing model, when the recipe can."""
    from launcher.paths import models_dir

    if ref.hub is not None and path == models_dir() / ref.name:
        return f"fetch it with: launcher models pull --recipe {shell_quote(plan.recipe_arg or rec.name)}"
    return fallback


def _unfinished_pulls(plan: Plan, rec) -> None:
    """A pull that was interrupted: say so, and how to resume, before the checks
    below report its missing weights one by one."""
    from launcher.models.folders import unfinished_download

    for area, ref, path in (("checkpoint", rec.target, plan.model), ("drafter", rec.drafter, plan.drafter)):
        left = unfinished_download(path) if ref is not None and path is not None and path.is_dir() else None
        if left:
            plan.reasons.append(
                Reason(area, f"{path}: a download into it was interrupted ({left})",
                       hint=_fetch_hint(plan, rec, ref, path, "run the same download again to resume it"))
            )


def _missing_dir(path) -> str:
    """Why a folder the plan needs is not one: absent, or a file where the folder should be."""
    return "is a file, not a folder (a model is the folder that holds config.json)" if path.exists() else "does not exist"


def checkpoint(plan: Plan, rec, ctx: Context) -> None:
    if not plan.model.is_dir():
        plan.reasons.append(
            Reason("checkpoint", f"model directory {plan.model} " + _missing_dir(plan.model),
                   hint=_fetch_hint(plan, rec, rec.target, plan.model,
                                    f"put {rec.target.name} there (from {rec.target.source}), set MODELS_DIR, or pass --model"))
        )
    if plan.drafter is not None and not plan.drafter.is_dir():
        plan.reasons.append(
            Reason("drafter", f"drafter directory {plan.drafter} " + _missing_dir(plan.drafter),
                   hint=_fetch_hint(plan, rec, rec.drafter, plan.drafter, f"download {rec.drafter.source} there, or pass --drafter"))
        )
    try:
        from launcher import checkpoint as ckpt
    except ImportError:
        return
    _unfinished_pulls(plan, rec)
    info = None
    if plan.model.is_dir():
        info, found = ckpt.inspect_target(plan.model, expected_format=rec.target.format, vllm_version=plan.vllm_version)
        plan.reasons.extend(found)
    if plan.drafter is not None and plan.drafter.is_dir():
        plan.reasons.extend(ckpt.inspect_drafter(plan.drafter, target=info))
        per_layer = next((p.applied for p in plan.patches if p.id == ckpt.PER_LAYER_DRAFTER_PATCH), None)
        plan.reasons.extend(ckpt.drafter_version_warning(plan.drafter, plan.vllm_version, per_layer))
    warn = ckpt.quantization_flag_warning(plan.argv, info, rec.target.format)
    if warn:
        plan.reasons.append(warn)
