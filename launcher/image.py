"""What an image is made of: its pinned inputs, as labels and as a manifest inside it.

Every image of the project (docker/Dockerfile.overlay on a base that already
has vLLM, docker/Dockerfile from source) records what went into it, so a tag
can be rebuilt and a running container can say what it is:

* on the host, before building, :func:`overlay_inputs` reads the base image:
  its digest where a registry gave one (else the local image id), and what
  :func:`probe` reports when run with the base's own Python (vLLM, torch,
  FlashInfer versions, where they live). The series for that vLLM is chosen
  here, so a base without one fails before any build, naming the versions
  that have a series. The inputs become ``--build-arg``s, the image's labels
  and its tag.
* inside the image, at build time, ``launcher image write-manifest`` probes
  again, checks every labelled value against what is really installed (a
  label never says something the image does not have), and writes
  ``/etc/vllm-sm12x/manifest.json`` with the series' patch states.
  ``launcher doctor`` and the entrypoint's preflight print it.

This module's top level imports only the standard library: the host runs it
with the *base's* Python (``python3 - probe < launcher/image.py``), before the
launcher is installed there.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

IMAGE_DIR_ENV = "VLLM_SM12X_IMAGE_DIR"  # tests point this at a temporary folder
DEFAULT_IMAGE_DIR = "/etc/vllm-sm12x"
LABEL_PREFIX = "org.vllm-sm12x."
SCHEMA = 1
# What the manifest pins, by distribution name (FlashInfer ships three wheels of one version).
PINNED_PACKAGES = ("vllm", "torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache",
                   "transformers", "triton")
UPSTREAM_REPO = "vllm/vllm-openai"
NGC_REPO = "nvcr.io/nvidia/vllm"


def image_dir() -> Path:
    return Path(os.environ.get(IMAGE_DIR_ENV) or DEFAULT_IMAGE_DIR)


def manifest_path() -> Path:
    return image_dir() / "manifest.json"


# --- the probe (standard library only) ------------------------------------------


def probe() -> dict:
    """This Python and the pinned packages it has, read from metadata (nothing imported)."""
    from importlib import metadata, util

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    spec = util.find_spec("vllm")
    site = str(Path(list(spec.submodule_search_locations)[0]).parent) if spec and spec.submodule_search_locations else None
    try:
        import pwd

        user = pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        user = str(os.getuid()) if hasattr(os, "getuid") else None
    return {
        "python": {"version": ".".join(map(str, sys.version_info[:3])), "executable": sys.executable,
                   "site_packages": site},
        "user": user,
        "packages": {name: version(name) for name in PINNED_PACKAGES},
    }


# --- host side: the inputs of an overlay build ------------------------------------


def public(version: str | None) -> str | None:
    """``0.29.0+2d3f1c.nv26.09`` -> ``0.29.0``: NGC and local builds carry a local tag."""
    return version.split("+", 1)[0] if version else version


def split_ref(ref: str) -> tuple[str, str]:
    """``nvcr.io/nvidia/vllm:26.09-py3`` -> (repository, tag); a digest-only ref has tag ''."""
    ref = ref.split("@", 1)[0]
    head, sep, tag = ref.rpartition(":")
    if not sep or "/" in tag:
        return ref, "latest"
    return head, tag


def base_marker(base: str) -> str:
    """The part of an overlay's tag that names its base: '' for vLLM's own image
    (the default base), ``ngc26.09`` for NGC's, else the base's name and tag."""
    repo, tag = split_ref(base)
    if repo in (UPSTREAM_REPO, f"docker.io/{UPSTREAM_REPO}"):
        return ""
    if repo == NGC_REPO:
        m = re.match(r"(\d+\.\d+)", tag)
        return f"ngc{m.group(1) if m else tag}"
    name = f"{repo.rsplit('/', 1)[-1]}{tag}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")[:60]


def overlay_tag(repo: str, base: str, vllm_version: str, target: str, arch: str) -> str:
    """``vllm-sm12x:0.29.0-ngc26.09-sm121-arm64-overlay``: vLLM version, base, target, arch."""
    marker = base_marker(base)
    parts = [public(vllm_version), *([marker] if marker else []), target, arch, "overlay"]
    return f"{repo}:{'-'.join(parts)}"


def repo_digest(base: str, repo_digests: list[str]) -> str | None:
    """The base's registry digest (``sha256:...``) if the daemon has one for its repository."""
    repo, _ = split_ref(base)
    names = {repo, f"docker.io/{repo}", f"docker.io/library/{repo}"}
    for item in repo_digests:
        name, _, digest = item.partition("@")
        if name in names and digest:
            return digest
    return None


def overlay_inputs(base: str, probed: dict, *, repo_digests: list[str], image_id: str,
                   target: str, arch: str, repo: str = "vllm-sm12x") -> dict:
    """Build args, labels and tag for an overlay on ``base``; LauncherError when the
    base has no vLLM or no series exists for its version."""
    from launcher.errors import LauncherError
    from launcher.patching.series import available_versions, series_for

    vllm = probed["packages"].get("vllm")
    if not vllm:
        raise LauncherError(
            f"the base image {base} has no vLLM installed (its python3 finds no 'vllm' distribution)",
            hint="use an image with vLLM, or a Python image plus --build-arg VLLM_WHEEL=<wheel in docker/wheels/>",
        )
    try:
        series = series_for(vllm)
    except LauncherError as exc:  # names the versions that have a series
        raise LauncherError(exc.message, hint=f"use a base with one of those vLLM versions, e.g. "
                            f"{UPSTREAM_REPO}:v{available_versions()[-1]}") from None
    digest = repo_digest(base, repo_digests)
    args = {
        "BASE": base,
        "BASE_DIGEST": digest or "",
        "BASE_IMAGE_ID": image_id,
        "VLLM_VERSION": public(vllm),
        "VLLM_BUILD": vllm,
        "TORCH_VERSION": probed["packages"].get("torch") or "",
        "FLASHINFER_VERSION": probed["packages"].get("flashinfer-python") or "",
        "SERIES_HASH": series.hash,
        "TARGET": target,
        "ARCH": arch,
    }
    return {"build_args": args, "tag": overlay_tag(repo, base, vllm, target, arch), "series": series.version}


# --- inside the image: the manifest ------------------------------------------------


def write_manifest(*, flavor: str, base: str, base_digest: str, base_image_id: str, target: str, arch: str,
                   expect: dict[str, str], commands: list[str]) -> dict:
    """Probe this image, check the labelled values, write the manifest and the
    entrypoint's command list (``commands``: the CLI's top-level names, handed
    down by the CLI so this module does not import it). LauncherError (the
    build fails) on a mismatch."""
    from launcher import __version__
    from launcher.errors import LauncherError
    from launcher.patching import engine

    probed = probe()
    status = engine.status(None)
    found = {
        "vllm": probed["packages"]["vllm"],
        "vllm-public": public(probed["packages"]["vllm"]),
        "torch": probed["packages"]["torch"],
        "flashinfer-python": probed["packages"]["flashinfer-python"],
        "series": status.series_hash,
    }
    wrong = [f"{key}: the label says {value!r}, the image has {found.get(key)!r}"
             for key, value in expect.items() if value and found.get(key) != value]
    if not status.fully_applied:
        wrong.append("series: not every patch is applied: "
                     + ", ".join(f"{p.id}={p.state}" for p in status.patches if p.state != "applied"))
    if wrong:
        raise LauncherError("the image's inputs differ from its labels: " + "; ".join(wrong))
    manifest = {
        "schema": SCHEMA,
        "flavor": flavor,
        "base": {"image": base, "digest": base_digest or None, "image_id": base_image_id or None},
        "target": target,
        "arch": arch,
        "python": probed["python"],
        "packages": probed["packages"],
        # Everything else pip sees (the launcher's own dependencies included): the
        # exact set to ask for when rebuilding this image.
        "installed": installed_distributions(),
        "series": {"vllm": status.series_version, "hash": status.series_hash,
                   "patches": [{"id": p.id, "state": p.state} for p in status.patches]},
        "launcher": __version__,
    }
    folder = image_dir()
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path().write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    (folder / "launcher-commands").write_text("\n".join(sorted(commands)) + "\n", encoding="utf-8")
    return manifest


def installed_distributions() -> dict[str, str]:
    from importlib import metadata

    found = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name:
            found[name] = dist.version
    return dict(sorted(found.items()))


def read_manifest() -> dict | None:
    try:
        return json.loads(manifest_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def manifest_lines(manifest: dict) -> list[str]:
    """The manifest as doctor prints it: one input a line."""
    base = manifest["base"]
    pin = base.get("digest") or (f"local image {base['image_id'][:19]}" if base.get("image_id") else "digest unknown")
    series = manifest["series"]
    applied = sum(p["state"] == "applied" for p in series["patches"])
    packages = "  ".join(f"{k} {v}" for k, v in manifest["packages"].items() if v)
    return [
        f"image     {manifest['flavor']} for {manifest['target']} ({manifest['arch']}), manifest {manifest_path()}",
        f"base      {base['image']}  ({pin})",
        f"python    {manifest['python']['version']}  {manifest['python']['site_packages']}",
        f"pinned    {packages}",
        f"series    vLLM {series['vllm']} {series['hash'][:12]}: {applied}/{len(series['patches'])} applied",
    ]


def preflight_lines(vllm_args: list[str]) -> list[str]:
    """What the entrypoint prints before it hands bare vLLM arguments to vllm serve."""
    from launcher import hardware, redact
    from launcher.patching import engine

    lines = []
    manifest = read_manifest()
    if manifest:
        lines += manifest_lines(manifest)
    try:
        status = engine.status(None)
        bad = [f"{p.id}={p.state}" for p in status.patches if p.state != "applied"]
        lines.append(f"vLLM      {status.version} at {status.tree.root}: series {status.series_version} "
                     + ("all applied" if not bad else "NOT fully applied: " + ", ".join(bad)))
    except Exception as exc:  # noqa: BLE001 - the preflight reports; vLLM still starts
        lines.append(f"vLLM      series status unreadable: {exc}")
    host = hardware.probe()
    if host.gpus:
        lines += [f"gpu{g.index}      {g.name} {g.sm}" for g in host.gpus]
    else:
        lines.append(f"gpu       none visible ({host.nvml_error}); docker run needs --gpus all")
    lines.append("starting  vllm serve " + " ".join(redact.argv(vllm_args)))
    return [f"vllm-sm12x: {line}" for line in lines]


if __name__ == "__main__":
    # The host runs this file with a base image's Python: `python3 - probe < launcher/image.py`.
    if sys.argv[1:] != ["probe"]:
        sys.exit("usage: python3 launcher/image.py probe")
    print(json.dumps(probe()))
