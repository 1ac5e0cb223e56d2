"""``launcher image inputs|write-manifest|manifest|preflight``: the image's pinned inputs.

``inputs`` runs on the host before a build (docker/build-image.sh); the others
run inside an image (see :mod:`launcher.image`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from launcher import image
from launcher.errors import LauncherError

app = typer.Typer(no_args_is_help=True)


def inspect_base(client, base: str, *, arch: str | None = None, pull: bool = True) -> tuple[dict, list[str], str]:
    """(probe result, repo digests, image id) of ``base``, run with its own python3.

    ``arch`` (amd64, arm64): the platform to pull and run; another architecture
    than the host's runs through QEMU (binfmt), as its build would.
    """
    import docker

    try:
        found = client.images.get(base)
    except docker.errors.ImageNotFound:
        if not pull:
            raise LauncherError(f"base image {base} is not on this machine", hint=f"docker pull {base}") from None
        try:
            found = client.images.pull(base, platform=f"linux/{arch}" if arch else None)
        except docker.errors.APIError as exc:
            raise LauncherError(f"cannot pull the base image {base}: {exc.explanation or exc}") from None
    source = Path(image.__file__).read_text(encoding="utf-8")
    try:
        out = client.containers.run(base, ["probe"], entrypoint=["python3", "-c", source], remove=True,
                                     user="0", stdout=True, stderr=False,
                                     platform=f"linux/{arch}" if arch else None)
    except docker.errors.ContainerError as exc:
        raise LauncherError(f"python3 in the base image {base} failed to report its packages: "
                            f"{(exc.stderr or b'').decode(errors='replace').strip()[-500:]}") from None
    probed = json.loads(out.decode().strip().splitlines()[-1])
    return probed, list(found.attrs.get("RepoDigests") or []), found.id


@app.command("inputs")
def inputs_cmd(
    base: Annotated[str, typer.Option(help="The image with vLLM to overlay.")],
    target: Annotated[str, typer.Option(help="sm120 (RTX 5090, amd64) or sm121 (DGX Spark, arm64).")] = "sm120",
    repo: Annotated[str, typer.Option(help="Image name of the result, without tag.")] = "vllm-sm12x",
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of KEY=VALUE lines.")] = False,
) -> None:
    """Read a base image (digest, vLLM, torch, FlashInfer) and print the overlay's build args and tag."""
    from launcher.runtime.docker import connect

    arch = {"sm120": "amd64", "sm121": "arm64"}.get(target)
    if arch is None:
        raise LauncherError(f"unknown target {target!r}", hint="sm120 (RTX 5090, amd64) or sm121 (DGX Spark, arm64)")
    probed, digests, image_id = inspect_base(connect(), base, arch=arch)
    result = image.overlay_inputs(base, probed, repo_digests=digests, image_id=image_id, target=target,
                                  arch=arch, repo=repo)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    for key, value in result["build_args"].items():
        typer.echo(f"{key}={value}")
    typer.echo(f"TAG={result['tag']}")


@app.command("write-manifest")
def write_manifest_cmd(
    ctx: typer.Context,
    flavor: Annotated[str, typer.Option(help="overlay or source.")],
    base: Annotated[str, typer.Option(help="The base image reference.")],
    base_digest: Annotated[str, typer.Option(help="Its registry digest, if known.")] = "",
    base_image_id: Annotated[str, typer.Option(help="Its local image id, if known.")] = "",
    target: Annotated[str, typer.Option()] = "sm120",
    arch: Annotated[str, typer.Option()] = "amd64",
    expect: Annotated[Optional[list[str]], typer.Option(help="KEY=VALUE the labels state; empty values are not checked.")] = None,
) -> None:
    """Build time, inside the image: check the labelled inputs and write the manifest."""
    wanted = {}
    for item in expect or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise LauncherError(f"--expect {item!r}: use KEY=VALUE")
        wanted[key] = value
    manifest = image.write_manifest(flavor=flavor, base=base, base_digest=base_digest, base_image_id=base_image_id,
                                    target=target, arch=arch, expect=wanted, commands=launcher_commands(ctx))
    for line in image.manifest_lines(manifest):
        typer.echo(line)


def launcher_commands(ctx: typer.Context) -> list[str]:
    """The launcher's top-level command names (the image's entrypoint sends the rest to vLLM),
    read from the running command tree: importing ``launcher.cli`` here would be a cycle."""
    root = ctx.find_root()
    return sorted(root.command.list_commands(root))


@app.command("manifest")
def manifest_cmd(as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print this image's manifest (its pinned inputs)."""
    manifest = image.read_manifest()
    if manifest is None:
        raise LauncherError(f"no image manifest at {image.manifest_path()}: not inside a vllm-sm12x image")
    typer.echo(json.dumps(manifest, indent=2) if as_json else "\n".join(image.manifest_lines(manifest)))


@app.command("preflight", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def preflight_cmd(ctx: typer.Context) -> None:
    """What the entrypoint prints before vllm serve: image, series, GPU, the command (inside an image)."""
    if image.read_manifest() is None:
        raise LauncherError(f"no image manifest at {image.manifest_path()}: not inside a vllm-sm12x image",
                            hint="on this machine: launcher serve --dry-run (the plan) or launcher doctor")
    for line in image.preflight_lines(list(ctx.args)):
        typer.echo(line, err=True)
