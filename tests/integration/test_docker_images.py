"""The images: the overlay built for real, the source Dockerfile linted and parsed.

* docker/Dockerfile.overlay is built with the classic builder on the real
  daemon, on a local stand-in for the upstream image (no registry here): the
  debootstrap'd Debian python base with the released vLLM wheel (0.21.0 and 0.33.0)
  installed by pip (compiled extensions left out: see docker_env.py). Inside
  the built image `launcher patch status` must show the whole series applied.
* docker/Dockerfile (hours of CUDA compiling, for amd64 sm120 and arm64 sm121)
  cannot be built here: hadolint, a parse of its stages, args, labels and the
  build/patch step, and the classic builder reading the file up to the pull of
  its pinned CUDA base.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from launcher.patching.series import series_for
from tests.integration import docker_env

REPO = docker_env.REPO
DOCKERFILES = [REPO / "docker" / "Dockerfile", REPO / "docker" / "Dockerfile.overlay"]
SHELL_SCRIPTS = [REPO / "docker" / "build-part.sh", REPO / "docker" / "entrypoint.sh", REPO / "docker" / "build-image.sh", REPO / "tests" / "engines.sh"]
BIN = Path(sys.executable).parent


# --- a small Dockerfile reader (instructions, continuations, comments) --------


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order; continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not current) or (current and line.startswith("#")):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        word, _, rest = current.partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    return out


def stages(text: str) -> tuple[dict[str, str], list[dict]]:
    """Global ARG defaults and the stages: name, base (ARGs expanded), instructions."""
    global_args: dict[str, str] = {}
    result: list[dict] = []
    for word, rest in instructions(text):
        if word == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            result.append({"name": name, "base": base, "body": []})
        elif not result and word == "ARG":
            key, _, value = rest.partition("=")
            global_args[key] = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], value)
        else:
            result[-1]["body"].append((word, rest))
    return global_args, result


def labels(stage: dict) -> dict[str, str]:
    found: dict[str, str] = {}
    for word, rest in stage["body"]:
        if word == "LABEL":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                found[key] = value
    return found


# --- lint ---------------------------------------------------------------------


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile):
    proc = subprocess.run([str(BIN / "hadolint"), str(dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_shellcheck_clean():
    proc = subprocess.run([str(BIN / "shellcheck"), *map(str, SHELL_SCRIPTS)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_bases_are_pinned(dockerfile):
    _, parsed = stages(dockerfile.read_text())
    names = {s["name"] for s in parsed if s["name"]}
    for stage in parsed:
        if stage["base"] in names:
            continue
        repo, _, tag = stage["base"].rpartition(":")
        assert repo and tag and tag != "latest" and "/" not in tag, f"unpinned base {stage['base']}"
        assert re.search(r"\d", tag), f"base tag without a version: {stage['base']}"


# --- the source Dockerfile ----------------------------------------------------


def test_source_dockerfile_stages_and_args():
    args, parsed = stages((REPO / "docker" / "Dockerfile").read_text())
    assert {"CUDA_VERSION", "VLLM_VERSION", "TARGET"} <= set(args)
    assert args["TARGET"] == "sm120" and args["VLLM_VERSION"] in series_versions()
    assert [s["name"] for s in parsed] == ["base", "launcher", "flashinfer", "vllm", "runtime"]
    base, runtime = parsed[0], parsed[-1]
    assert base["base"] == f"nvidia/cuda:{args['CUDA_VERSION']}-devel-ubuntu{args['UBUNTU_VERSION']}"
    assert runtime["base"] == f"nvidia/cuda:{args['CUDA_VERSION']}-runtime-ubuntu{args['UBUNTU_VERSION']}"
    assert args["CUDA_VERSION"].startswith("13."), "sm_121 needs CUDA 13"


@pytest.mark.parametrize("part", ["flashinfer", "vllm"])
def test_source_dockerfile_builds_each_part_through_the_launcher(part):
    _, parsed = stages((REPO / "docker" / "Dockerfile").read_text())
    stage = next(s for s in parsed if s["name"] == part)
    [run] = [rest for word, rest in stage["body"] if word == "RUN"]
    # BuildKit caches for pip and for the launcher's cache (sdist, ccache, FetchContent).
    assert "--mount=type=cache,target=/root/.cache/pip" in run
    assert "--mount=type=cache,target=/root/.cache/vllm-sm12x" in run
    assert run.strip().endswith(f"build-part.sh {part}")
    assert any("docker/build-part.sh" in r for w, r in stage["body"] if w == "COPY")


def test_build_part_script_runs_the_launcher_per_target():
    """One code path with native builds: `launcher build wheels --only PART`
    fetches the sdist, applies the series (patch engine), then compiles."""
    script = (REPO / "docker" / "build-part.sh").read_text()
    assert re.search(r'launcher build wheels --target "\$\{build_target\}" --vllm-version "\$\{VLLM_VERSION\}"', script)
    assert '--only "${part}"' in script
    targets = yaml.safe_load((REPO / "build" / "targets.yaml").read_text())["targets"]
    arms = {sm: (t, m) for sm, t, m in re.findall(r"(sm12\d)\) build_target=([\w-]+); machine=(\w+)", script)}
    assert set(arms) == {"sm120", "sm121"}  # the amd64 image and the arm64 (DGX Spark) variant
    for sm, (build_target, machine) in arms.items():
        assert build_target in targets, f"{sm} builds {build_target}, which build/targets.yaml lacks"
        assert targets[build_target]["machine"] == machine
        assert targets[build_target]["compute_capability"] == f"{sm[2:4]}.{sm[4:]}"


def test_source_runtime_stage():
    _, parsed = stages((REPO / "docker" / "Dockerfile").read_text())
    runtime = parsed[-1]
    words = [w for w, _ in runtime["body"]]
    body = dict(reversed(runtime["body"]))  # first occurrence of each instruction
    copies = [r for w, r in runtime["body"] if w == "COPY"]
    assert "COPY" in words
    assert any("--from=flashinfer /wheels/flashinfer/" in r for r in copies)
    assert any("--from=vllm /wheels/vllm/" in r for r in copies)
    user = [r for w, r in runtime["body"] if w == "USER"][-1]
    assert user.split(":")[0] not in ("0", "root"), "the server must not run as root"
    assert "/health" in body["HEALTHCHECK"]
    assert json.loads(body["ENTRYPOINT"]) == ["/usr/local/bin/vllm-sm12x-entrypoint"]
    install = next(r for w, r in runtime["body"] if w == "RUN" and "verify_series.py" in r)
    assert "launcher patch status" in install
    # The same manifest as the overlay's (launcher doctor prints it), written after the check.
    assert install.index("verify_series.py") < install.index("launcher image write-manifest --flavor source")
    found = labels(runtime)
    for key in ("org.vllm-sm12x.vllm-version", "org.vllm-sm12x.series-hash", "org.vllm-sm12x.arch",
                "org.vllm-sm12x.target", "org.opencontainers.image.version"):
        assert key in found, f"label {key} missing"


@pytest.mark.docker
def test_classic_builder_reads_the_stripped_source_dockerfile():
    """Without BuildKit the cache mounts are stripped (docker/build-image.sh); the
    classic builder must then accept every instruction and stop only where this
    machine must: pulling the pinned CUDA base from a registry it cannot reach."""
    import docker

    client = docker_env.client()
    stripped = subprocess.run(
        ["bash", str(REPO / "docker" / "build-image.sh"), "classic-dockerfile"], capture_output=True, text=True, check=True
    ).stdout
    assert not any("--mount" in rest for _, rest in instructions(stripped))
    original = instructions((REPO / "docker" / "Dockerfile").read_text())
    assert [w for w, _ in instructions(stripped)] == [w for w, _ in original]
    context = docker_env.repo_context({"docker/Dockerfile.classic": stripped.encode()})
    started = time.monotonic()
    with pytest.raises((docker.errors.BuildError, docker.errors.APIError)) as err:
        client.images.build(fileobj=context, custom_context=True, dockerfile="docker/Dockerfile.classic",
                            buildargs={"TARGET": "sm121", "ARCH": "arm64"}, rm=True, forcerm=True)
    log = "".join(c.get("stream", "") + c.get("error", "") for c in getattr(err.value, "build_log", []))
    text = log + str(err.value)
    # "Step 1/N": the classic builder parsed all N instructions before running any.
    assert f"Step 1/{len(original)} : ARG CUDA_VERSION=" in text, text
    steps = re.findall(r"Step (\d+)/\d+ : (.*)", text)
    # It ran the global ARGs and stopped at the first FROM: the pull, nothing else.
    assert steps[-1][1].startswith("FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION}"), text
    assert "requires BuildKit" not in text and "unknown instruction" not in text.lower()
    print(f"classic builder stopped at the CUDA base pull after {time.monotonic() - started:.1f} s")


def series_versions() -> list[str]:
    return sorted(p.name for p in (REPO / "patches" / "vllm").iterdir() if (p / "series").is_file())


# --- the overlay, built for real on stand-ins of its real bases ----------------
#
# docker_env.py says what each stand-in reproduces of vllm/vllm-openai and of
# NGC's nvcr.io/nvidia/vllm, and where it differs. PyPI's vLLM stands in for
# NGC's own build of the same version. NGC 26.09 carries vLLM 0.29.0: while
# this branch has no series for 0.29.0 the NGC stand-in carries 0.33.0 (same
# NGC layout, a version with a series); with patches/vllm/0.29.0/series
# present it carries 0.29.0 and these tests exercise that series.

VERSION = "0.21.0"  # the broken-tree build
SITE = docker_env.SITE
NGC_VERSION = "0.29.0" if (REPO / "patches" / "vllm" / "0.29.0" / "series").is_file() else "0.33.0"
CASES = [("upstream", "0.21.0"), ("upstream", "0.33.0"), ("ngc", NGC_VERSION)]


@pytest.fixture(scope="module")
def client():
    return docker_env.client()


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def case(request):
    kind, version = request.param
    return {"kind": kind, "version": version, **docker_env.standin(kind, version)}


@pytest.fixture(scope="module")
def version(case):
    return case["version"]


@pytest.fixture(scope="module")
def vllm_base(client, case):
    started = time.monotonic()
    tag = docker_env.vllm_base_image(client, case["version"], kind=case["kind"])
    print(f"{case['stands_for']} stand-in {tag}: {time.monotonic() - started:.1f} s")
    return tag


@pytest.fixture(scope="module")
def overlay(client, vllm_base, case):
    inputs = docker_env.overlay_inputs(client, vllm_base)
    # Unique per run: another checkout may run these tests on the same daemon.
    tag = docker_env.run_tag("vllm-sm12x-test/overlay", f"{case['kind']}-{case['version']}")
    started = time.monotonic()
    image_id, log = docker_env.build_overlay(client, vllm_base, tag, inputs["build_args"])
    print(f"overlay on the {case['stands_for']} stand-in: {time.monotonic() - started:.1f} s")
    assert image_id, f"overlay build failed:\n{log[-5000:]}"
    yield tag, log, inputs
    remove_image(client, tag)


def remove_image(client, tag: str) -> None:
    import docker

    try:
        client.images.remove(tag, force=True)
    except docker.errors.ImageNotFound:
        pass


def run_in(client, image: str, command: list[str], *, expect_code: int = 0, entrypoint=None,
           environment=None) -> str:
    container = client.containers.create(image, command, entrypoint=entrypoint, environment=environment)
    try:
        container.start()
        code = container.wait(timeout=120)["StatusCode"]
        out = container.logs(stdout=True, stderr=True).decode()
    finally:
        container.remove(force=True)
    assert code == expect_code, f"{command} exited {code}:\n{out}"
    return out


def json_out(out: str):
    """The JSON a command printed; NGC's entrypoint prints its banner first (as the real one does)."""
    return json.loads(out[out.index("\n{") + 1:] if not out.startswith("{") else out)


@pytest.mark.docker
def test_overlay_applies_the_whole_series(client, overlay, case):
    tag, log, _ = overlay
    version = case["version"]
    series = series_for(version)
    status = json_out(run_in(client, tag, ["patch", "status", "--json"]))
    assert status["version"] == case["vllm"]  # NGC's local tag kept, the series chosen by its public part
    assert status["tree"] == SITE
    assert status["series_hash"] == series.hash
    assert [p["id"] for p in status["patches"]] == [p.id for p in series.patches]
    assert {p["state"] for p in status["patches"]} == {"applied"}
    assert status["stamp"] is not None
    # The build log has verify_series' verdict unless docker reused the layer
    # (same inputs) from an earlier run.
    assert f"verify-series: vLLM {case['vllm']} at {SITE}: {len(series.patches)} patch(es) applied" in log \
        or "Using cache" in log


@pytest.mark.docker
def test_overlay_inputs_are_read_off_the_base(client, overlay, case, vllm_base):
    """What build-image.sh passes as build args comes from the base itself."""
    _, _, inputs = overlay
    args = inputs["build_args"]
    assert (args["VLLM_VERSION"], args["VLLM_BUILD"]) == (case["version"], case["vllm"])
    assert (args["TORCH_VERSION"], args["FLASHINFER_VERSION"]) == (case["torch"], case["flashinfer-python"])
    assert args["SERIES_HASH"] == series_for(case["version"]).hash
    # A locally built base has no registry digest: the local image id pins it instead.
    assert args["BASE_DIGEST"] == "" and args["BASE_IMAGE_ID"] == client.images.get(vllm_base).id
    assert inputs["tag"].startswith(f"vllm-sm12x:{case['version']}-") and inputs["tag"].endswith("-sm120-amd64-overlay")


@pytest.mark.docker
def test_overlay_labels_and_manifest_agree(client, overlay, case, vllm_base):
    tag, _, inputs = overlay
    image = client.images.get(tag)
    found = image.labels
    args = inputs["build_args"]
    assert found["org.vllm-sm12x.vllm-version"] == case["version"]
    assert found["org.vllm-sm12x.vllm-build"] == case["vllm"]
    assert found["org.vllm-sm12x.torch-version"] == case["torch"]
    assert found["org.vllm-sm12x.flashinfer-version"] == case["flashinfer-python"]
    assert found["org.vllm-sm12x.series-hash"] == series_for(case["version"]).hash
    assert found["org.opencontainers.image.base.name"] == vllm_base
    assert found["org.vllm-sm12x.base-image-id"] == args["BASE_IMAGE_ID"]
    assert (found["org.vllm-sm12x.target"], found["org.vllm-sm12x.arch"]) == ("sm120", "amd64")
    manifest = json_out(run_in(client, tag, ["image", "manifest", "--json"]))
    assert found["org.vllm-sm12x.manifest"] == "/etc/vllm-sm12x/manifest.json"
    assert manifest["base"] == {"image": vllm_base, "digest": None, "image_id": args["BASE_IMAGE_ID"]}
    assert manifest["packages"]["vllm"] == case["vllm"]
    assert manifest["packages"]["torch"] == case["torch"]
    assert manifest["packages"]["flashinfer-python"] == case["flashinfer-python"]
    assert manifest["series"]["hash"] == found["org.vllm-sm12x.series-hash"]
    assert {p["state"] for p in manifest["series"]["patches"]} == {"applied"}
    assert manifest["python"]["site_packages"] == SITE
    # The launcher's own dependencies are recorded too (what a rebuild must ask pip for).
    assert manifest["installed"]["vllm-sm12x-launcher"] and manifest["installed"]["typer"]
    assert manifest["installed"]["vllm"] == case["vllm"]
    # `launcher doctor` inside the container prints the same inputs.
    # No GPU in the container: doctor reports the image and exits 1 (nothing fits).
    doctor = run_in(client, tag, ["doctor"], expect_code=1)
    assert f"base      {vllm_base}  (local image {args['BASE_IMAGE_ID'][:19]})" in doctor
    assert f"vllm {case['vllm']}" in doctor and f"torch {case['torch']}" in doctor
    assert f"flashinfer-python {case['flashinfer-python']}" in doctor
    assert f"series    vLLM {case['version']} {found['org.vllm-sm12x.series-hash'][:12]}" in doctor


@pytest.mark.docker
def test_overlay_entrypoint_runs_launcher_commands(client, overlay, case):
    tag, _, _ = overlay
    image = client.images.get(tag)
    assert image.attrs["Config"]["Entrypoint"] == ["/usr/local/bin/vllm-sm12x-entrypoint"]
    assert image.attrs["Config"]["WorkingDir"] == case["workdir"]  # the base's, kept
    assert "/health" in " ".join(image.attrs["Config"]["Healthcheck"]["Test"])
    # `docker run IMAGE` and `docker run IMAGE serve --help` reach the launcher.
    assert "Usage: launcher" in run_in(client, tag, [])
    assert "--recipe" in run_in(client, tag, ["serve", "--help"])
    # The launcher's data (recipes, patches) travelled with the non-editable install.
    assert "gemma4-moe-dflash" in run_in(client, tag, ["recipes", "list"])


@pytest.mark.docker
def test_bare_vllm_arguments_reach_vllm_serve(client, overlay, case):
    """`docker run IMAGE --model X --max-model-len N` as on vllm/vllm-openai: the
    series preflight is printed, then `vllm serve` gets the arguments as typed
    (the stub vllm prints them: no GPU here)."""
    tag, _, _ = overlay
    out = run_in(client, tag, ["--model", "/models/x", "--max-model-len", "8192", "--api-key", "sk-never-shown"])
    assert "stub-vllm argv: serve --model /models/x --max-model-len 8192 --api-key sk-never-shown" in out
    assert f"stub-vllm cwd: {case['workdir']}" in out
    preflight = [line for line in out.splitlines() if line.startswith("vllm-sm12x: ")]
    assert any(f"series {case['version']} all applied" in line for line in preflight), out
    assert any(line.startswith("vllm-sm12x: base ") for line in preflight), out
    assert "vllm-sm12x: starting  vllm serve --model /models/x --max-model-len 8192 --api-key ***" in preflight
    assert not any("sk-never-shown" in line for line in preflight)
    # A model as the first word, as `docker run vllm/vllm-openai google/gemma-4-...` takes it.
    out = run_in(client, tag, ["google/gemma-4-26B-A4B-it", "--port", "8001"])
    assert "stub-vllm argv: serve google/gemma-4-26B-A4B-it --port 8001" in out
    if case["kind"] == "ngc":
        # NGC's own entrypoint still runs first (its banner, its environment).
        assert "NVIDIA Release 26.09 (stand-in)" in out


@pytest.mark.docker
def test_serve_dry_run_inside_the_image(client, overlay, case):
    """`docker run IMAGE serve --recipe ...` as the README shows it: the launcher
    inside finds the models at /models, listens on every interface of the
    container, and sees the series applied to the image's vLLM. No GPU here,
    so the preflight blocks; a dry run that printed its plan exits 0 all the same."""
    tag, _, _ = overlay
    out = run_in(client, tag, ["serve", "--recipe", "gemma4-moe-dflash", "--dry-run"], expect_code=0)
    assert f"vLLM          {case['version']}  [installed]" in out  # the public version plans the recipe
    assert "vllm serve /models/gemma-4-26B-A4B-it-NVFP4" in out
    assert "--host 0.0.0.0" in out
    needed = [line for line in out.splitlines() if line.startswith("  ") and ": applied" in line]
    assert needed and "NOT applied" not in out, out


@pytest.mark.docker
def test_patched_files_differ_from_the_release(client, overlay, version, vllm_base):
    tag, _, _ = overlay
    rel = series_for(version).patches[0].files[0].path
    before = run_in(client, vllm_base, [f"{SITE}/{rel}"], entrypoint=["cat"])
    after = run_in(client, tag, ["python3", "-c", f"print(open('{SITE}/{rel}').read(), end='')"])
    assert before != after
    pristine = (pristine_tree(version) / rel).read_text()
    assert before == pristine


def pristine_tree(version: str) -> Path:
    from launcher.pypi import unpacked

    return unpacked("vllm", version, "site-packages")


@pytest.mark.docker
def test_overlay_build_fails_when_the_series_does_not_apply(client):
    """A base whose vLLM has a file the series touches emptied: apply must refuse
    and the build must fail, naming the file."""
    rel = series_for(VERSION).patches[0].files[0].path
    broken = docker_env.vllm_base_image(client, VERSION, extra_run=f": > {SITE}/{rel}")
    tag = docker_env.run_tag("vllm-sm12x-test/overlay", "broken")
    image_id, log = docker_env.build_overlay(client, broken, tag, docker_env.overlay_inputs(client, broken)["build_args"])
    remove_image(client, tag)
    assert image_id is None, "the overlay built on a vLLM the series cannot patch"
    assert rel in log
    assert "verify-series" not in log  # it stopped at `launcher patch apply`


@pytest.mark.docker
def test_overlay_refuses_a_vllm_without_a_series(client):
    """A base whose vLLM has no series (0.33.0's files, labelled 0.28.0 as NGC
    would label its own build; 0.28.0 is a release with no series): `launcher image inputs` refuses before any
    build, and a plain `docker build` (no inputs) fails at `patch apply`; both
    name the versions that have a series."""
    from launcher.errors import LauncherError
    from launcher.patching.series import available_versions

    base = docker_env.vllm_base_image(client, "0.33.0", kind="ngc", vllm_build="0.28.0+g0c0ffee.nv26.11")
    supported = ", ".join(available_versions())
    assert "0.28.0" not in available_versions()
    with pytest.raises(LauncherError) as err:
        docker_env.overlay_inputs(client, base)
    assert err.value.message.startswith("no patch series for vLLM 0.28.0+g0c0ffee.nv26.11")
    assert f"series exist for: {supported}" in err.value.message
    tag = docker_env.run_tag("vllm-sm12x-test/overlay", "noseries")
    image_id, log = docker_env.build_overlay(client, base, tag, {})
    remove_image(client, tag)
    assert image_id is None
    assert f"series exist for: {supported}" in log


@pytest.mark.docker
def test_overlay_on_a_python_image_with_a_vllm_wheel(client):
    """The overlay's other input: a plain Python image plus a vLLM wheel
    (VLLM_WHEEL in docker/wheels/), installed before the series is applied."""
    wheel = docker_env.vllm_wheel_without_extensions(VERSION)
    tag = docker_env.run_tag("vllm-sm12x-test/overlay", "wheel")
    series = series_for(VERSION)
    image_id, log = docker_env.build_overlay(client, docker_env.PYTHON_IMAGE, tag,
                                             {"VLLM_VERSION": VERSION, "SERIES_HASH": series.hash}, vllm_wheel=wheel)
    try:
        assert image_id, f"overlay build failed:\n{log[-5000:]}"
        status = json_out(run_in(client, tag, ["patch", "status", "--json"]))
        manifest = json_out(run_in(client, tag, ["image", "manifest", "--json"]))
    finally:
        remove_image(client, tag)
    assert (status["version"], status["series_hash"]) == (VERSION, series.hash)
    assert {p["state"] for p in status["patches"]} == {"applied"}
    assert manifest["packages"]["vllm"] == VERSION and manifest["series"]["hash"] == series.hash
