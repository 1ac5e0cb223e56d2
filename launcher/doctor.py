"""``launcher doctor``: what this machine has, and which recipes fit it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from launcher import hardware, versions


def collect(recipe: str | None = None, model: Path | None = None) -> dict:
    host = hardware.probe()
    report: dict = {
        "os": {"system": host.system, "machine": host.machine, "wsl": host.wsl, "windows": host.system == "Windows",
               "python": platform.python_version()},
        "gpu": {
            "driver": host.driver,
            "devices": [
                {"index": g.index, "name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}",
                 "sm": g.sm, "memory_gib": g.memory_gib, "unified_memory": g.unified_memory}
                for g in host.gpus
            ],
            "error": host.nvml_error,
        },
        "packages": versions.all_installed(),
        "torch_cuda": versions.torch_cuda(),
        "patches": _patch_status(),
        "docker": _docker_status(),
        "image": _image_manifest(),
        "recipes": _recipe_verdicts(host, recipe),
    }
    if model is not None:
        report["checkpoint"] = _checkpoint(model)
    return report


def _patch_status() -> dict:
    if not versions.installed("vllm"):
        return {"state": "vLLM not installed"}
    try:
        from launcher.patching import engine

        status = engine.status(None)
    except Exception as exc:  # doctor reports; it never stops at one failing probe
        return {"state": f"unreadable: {exc}"}
    return {
        "state": "ok",
        "vllm": status.version,
        "patches": {p.id: p.state for p in status.patches},
    }


def _image_manifest() -> dict | None:
    """Inside a vllm-sm12x image: its pinned inputs (base digest, vLLM, torch, FlashInfer, series)."""
    from launcher import image

    return image.read_manifest()


def _docker_status() -> dict:
    try:
        import docker
    except ImportError:
        return {"daemon": "docker SDK not installed"}
    try:
        client = docker.from_env(timeout=3)
        info = client.info()
    except Exception as exc:
        return {"daemon": f"not reachable ({type(exc).__name__})",
                "hint": "install Docker and start the daemon (docker.io / Docker Desktop)"}
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    return {
        "daemon": f"reachable ({info.get('ServerVersion')})",
        "runtimes": runtimes,
        "nvidia_runtime": "nvidia" in runtimes,
        **({} if "nvidia" in runtimes else {"hint": "install the NVIDIA Container Toolkit (nvidia-container-toolkit)"}),
    }


def _recipe_verdicts(host, only: str | None) -> dict:
    from launcher import recipe as recipes
    from launcher.plan import Context, Request, resolve

    ctx = Context(host=host, environ=dict(os.environ), installed_vllm=versions.installed("vllm"),
                  installed_transformers=versions.installed("transformers"))
    names = [only] if only else list(recipes.available())
    out = {}
    for name in names:
        plan = resolve(Request(recipe=name), ctx)
        out[name] = {
            "fits": not plan.blocking,
            "profile": plan.profile,
            "reasons": [r.line() for r in plan.reasons],
        }
    return out


def _checkpoint(model: Path) -> dict:
    try:
        from launcher import checkpoint
    except ImportError:
        return {"error": "checkpoint inspection not available"}
    info, reasons = checkpoint.inspect_target(model, expected_format=None, vllm_version=versions.installed("vllm") or "0.21.0")
    data = {k: getattr(info, k, None) for k in ("format", "architecture", "is_gemma4", "mm_prefix", "num_layers")}
    data["reasons"] = [r.line() for r in reasons]
    return data


def format_report(report: dict) -> str:
    lines = []
    osr = report["os"]
    lines.append(f"os        {osr['system']} {osr['machine']}" + ("  (WSL2)" if osr["wsl"] else "") + f"  python {osr['python']}")
    gpu = report["gpu"]
    if gpu["devices"]:
        lines.append(f"driver    {gpu['driver']}")
        for d in gpu["devices"]:
            mem = f"{d['memory_gib']:g} GiB" + (" unified" if d["unified_memory"] else "")
            lines.append(f"gpu{d['index']}      {d['name']}  {d['sm']} (compute {d['capability']})  {mem}")
    else:
        lines.append(f"gpu       none: {gpu['error']}")
    pk = report["packages"]
    lines.append("packages  " + "  ".join(f"{k} {v or '-'}" for k, v in pk.items()))
    lines.append(f"torch CUDA {report['torch_cuda'] or '-'}")
    pt = report["patches"]
    if pt.get("patches") is not None:
        lines.append(f"patches   vLLM {pt['vllm']}: " + ", ".join(f"{k}={v}" for k, v in pt["patches"].items()))
    else:
        lines.append(f"patches   {pt['state']}")
    if report.get("image"):
        from launcher import image

        lines += image.manifest_lines(report["image"])
    dk = report["docker"]
    lines.append(f"docker    {dk['daemon']}" + (f"  runtimes {', '.join(dk['runtimes'])}" if dk.get("runtimes") else "")
                 + (f"  ({dk['hint']})" if dk.get("hint") else ""))
    if "checkpoint" in report:
        ck = report["checkpoint"]
        lines.append(f"checkpoint {ck}")
    lines.append("recipes")
    for name, verdict in report["recipes"].items():
        lines.append(f"  {name}: {'fits' if verdict['fits'] else 'does not fit'} (profile {verdict['profile']})")
        for reason in verdict["reasons"]:
            lines.append(f"    {reason}")
    return "\n".join(lines)
