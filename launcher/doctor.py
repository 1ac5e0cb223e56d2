"""``launcher doctor``: what this machine has, and which recipes fit it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from launcher import hardware, versions


def collect(recipe: str | None = None, model: Path | None = None, vllm_python: str | None = None,
            drafter: Path | None = None) -> dict:
    """The whole report. ``model`` is the target for ``recipe``'s verdict too (not just inspected beside it)."""
    from launcher import vllm_env

    from launcher.errors import LauncherError

    host = hardware.probe()
    try:
        env, env_error = vllm_env.resolve(vllm_python), None
    except LauncherError as exc:  # a broken --vllm-python is reported with everything else
        env, env_error = None, exc.message + (f" ({exc.hint})" if exc.hint else "")
    report: dict = {
        "asked": {"recipe": recipe, "model": None if model is None else str(model), "vllm_python": vllm_python,
                  "drafter": None if drafter is None else str(drafter)},
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
        "vllm_env": {"error": env_error} if env_error else None if env is None else {
            "python": env.python, "source": env.source, "vllm": env.vllm_version,
            "transformers": env.transformers_version, "problem": env.problem},
        "patches": _patch_status(env),
        "docker": _docker_status(),
        "image": _image_manifest(),
        "recipes": _recipe_verdicts(host, recipe, model, env, env_error),
    }
    if model is not None:
        report["checkpoint"] = _checkpoint(model, recipe, env)
    if drafter is not None:
        report["drafter"] = _drafter(drafter)
    return report


def exit_code(report: dict) -> int:
    """1 when the report finds a problem with what was asked about, else 0.

    Asked about a checkpoint: it must load; a recipe: it must fit; neither:
    some recipe must fit. A half-written patch run counts everywhere.
    """
    asked = report.get("asked", {})
    if report.get("checkpoint", {}).get("blocking") or report.get("drafter", {}).get("blocking"):
        return 1
    if report["patches"].get("interrupted") or (report.get("vllm_env") or {}).get("error"):
        return 1
    if (asked.get("model") or asked.get("drafter")) and not asked.get("recipe"):
        return 0  # --model / --drafter alone: the checkpoints decide (they load), whatever the recipes say
    return 0 if any(v["fits"] for v in report["recipes"].values()) else 1


def _patch_status(env) -> dict:
    if env is None or not env.has_vllm:
        return {"state": "vLLM not installed"}
    try:
        from launcher.patching import engine

        status = engine.status(env.package_dir)
    except Exception as exc:  # doctor reports; it never stops at one failing probe
        return {"state": f"unreadable: {exc}"}
    from launcher.checks import launcher_command

    return {
        "state": "interrupted" if status.interrupted else "ok",
        "vllm": status.version,
        "patches": {p.id: p.state for p in status.patches},
        "interrupted": status.interrupted,
        "notes": status.notes,
        "apply": launcher_command(env, "patch apply"),
        "status": launcher_command(env, "patch status"),
    }


def _patch_line(pt: dict) -> str:
    """The patch states in one short line: counts, the ids only where something is wrong."""
    states = pt["patches"]
    applied = sum(1 for s in states.values() if s == "applied")
    text = f"patches   vLLM {pt['vllm']}: {applied} of {len(states)} applied"
    missing = sum(1 for s in states.values() if s == "not-applied")
    if missing:
        text += f", {missing} not applied ({pt['apply']})"
    broken = {k: s for k, s in states.items() if s not in ("applied", "not-applied")}
    if broken:
        text += "; " + ", ".join(f"{k} {s}" for k, s in broken.items()) + f" ({pt['status']} says more)"
    return text


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


def _recipe_verdicts(host, only: str | None, model: Path | None, env, env_error: str | None = None) -> dict:
    from launcher import recipe as recipes
    from launcher.checks import resolve
    from launcher.plan import Context, Request

    if env_error:
        # judged against another Python, each verdict would contradict the error above
        names = [only] if only else list(recipes.available())
        why = "[BLOCK] not judged: the --vllm-python given is unusable (vllm env, above)"
        return {name: {"fits": False, "profile": None, "reasons": [why]} for name in names}

    has = env is not None and env.has_vllm
    ctx = Context(host=host, environ=dict(os.environ), installed_vllm=env.vllm_version if has else None,
                  installed_transformers=env.transformers_version if env else None, vllm=env)
    names = [only] if only else list(recipes.available())
    out = {}
    for name in names:
        plan = resolve(Request(recipe=name, model=str(model) if model is not None else None), ctx)
        out[name] = {
            "fits": not plan.blocking,
            "profile": plan.profile,
            "reasons": [r.line() for r in plan.reasons],
        }
    return out


def _checkpoint(model: Path, recipe: str | None, env) -> dict:
    from launcher import checkpoint
    from launcher import recipe as recipes

    expected = recipes.load(recipe).target.format if recipe else None
    version = env.vllm_version if env is not None and env.has_vllm else "0.21.0"
    info, reasons = checkpoint.inspect_target(model, expected_format=expected, vllm_version=version)
    data = {k: getattr(info, k, None) for k in ("format", "architecture", "is_gemma4", "mm_prefix", "num_layers")}
    data["path"] = str(model)
    data["reasons"] = [r.line() for r in reasons]
    data["blocking"] = any(r.blocking for r in reasons)
    return data


def _drafter(path: Path) -> dict:
    """What vLLM's DFlash drafter and z-lab's reference (dflash 0.1.0) need from the drafter folder."""
    from launcher import checkpoint

    reasons = checkpoint.inspect_drafter(path, target=None)
    reasons += [r for r in checkpoint.reference_drafter_reasons(path) if r not in reasons]
    return {"path": str(path), "reasons": [r.line() for r in reasons], "blocking": any(r.blocking for r in reasons)}


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
    ve = report.get("vllm_env")
    if ve and ve.get("error"):
        lines.append(f"vLLM env  unusable: {ve['error']}")
    elif ve:
        lines.append(f"vLLM env  {ve['python']}  [{ve['source']}]  vllm {ve['vllm'] or '-'}  transformers {ve['transformers'] or '-'}")
        if ve.get("problem"):
            lines.append(f"          {ve['problem']}")
    pk = report["packages"]
    lines.append("packages  " + "  ".join(f"{k} {v or '-'}" for k, v in pk.items()))
    lines.append(f"torch CUDA {report['torch_cuda'] or '-'}")
    pt = report["patches"]
    if pt.get("patches") is not None:
        lines.append(_patch_line(pt))
        lines += [f"          note: {n}" for n in pt.get("notes", [])]
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
        what = ", ".join(f"{k} {ck[k]}" for k in ("format", "architecture", "num_layers") if ck.get(k) is not None)
        lines.append(f"checkpoint {ck['path']}: " + (what or "unreadable")
                     + (" (multimodal prefix LM)" if ck.get("mm_prefix") else ""))
        lines += [f"  {r}" for r in ck["reasons"]] or ["  ok"]
    if "drafter" in report:
        lines.append(f"drafter   {report['drafter']['path']}")
        lines += [f"  {r}" for r in report["drafter"]["reasons"]] or ["  ok"]
    lines.append("recipes")
    for name, verdict in report["recipes"].items():
        profile = f" (profile {verdict['profile']})" if verdict["profile"] else ""
        lines.append(f"  {name}: {'fits' if verdict['fits'] else 'does not fit'}{profile}")
        for reason in verdict["reasons"]:
            lines.append(f"    {reason}")
    return "\n".join(lines)
