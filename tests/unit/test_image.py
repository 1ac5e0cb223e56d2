"""launcher.image: overlay tags, base digests, the inputs read off a base, the manifest lines.

The image builds themselves run in tests/integration/test_docker_images.py;
these are the pure parts, with a probe result shaped as the base's python3
prints it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launcher import image
from launcher.errors import LauncherError
from launcher.patching.series import available_versions, series_for


@pytest.mark.parametrize("base,version,target,arch,tag", [
    ("nvcr.io/nvidia/vllm:26.09-py3", "0.29.0+3f2a1b.nv26.09", "sm121", "arm64",
     "vllm-sm12x:0.29.0-ngc26.09-sm121-arm64-overlay"),
    ("nvcr.io/nvidia/vllm:26.09-py3", "0.29.0", "sm120", "amd64", "vllm-sm12x:0.29.0-ngc26.09-sm120-amd64-overlay"),
    ("vllm/vllm-openai:v0.33.0", "0.33.0", "sm120", "amd64", "vllm-sm12x:0.33.0-sm120-amd64-overlay"),
    ("vllm/vllm-openai:v0.33.0@sha256:" + "a" * 64, "0.33.0", "sm121", "arm64", "vllm-sm12x:0.33.0-sm121-arm64-overlay"),
    ("registry.example/team/my-vllm:0.21.0", "0.21.0", "sm120", "amd64",
     "vllm-sm12x:0.21.0-my-vllm0.21.0-sm120-amd64-overlay"),
])
def test_overlay_tags_say_version_base_and_target(base, version, target, arch, tag):
    assert image.overlay_tag("vllm-sm12x", base, version, target, arch) == tag


def test_the_overlay_tag_matches_the_docker_runtime_hint():
    # launcher serve --runtime docker suggests this tag for the upstream base.
    assert image.overlay_tag("vllm-sm12x", "vllm/vllm-openai:v0.33.0", "0.33.0", "sm121", "arm64") \
        == "vllm-sm12x:0.33.0-sm121-arm64-overlay"


def test_repo_digest_picks_the_base_repository():
    digests = ["other/thing@sha256:" + "1" * 64, "nvcr.io/nvidia/vllm@sha256:" + "2" * 64]
    assert image.repo_digest("nvcr.io/nvidia/vllm:26.09-py3", digests) == "sha256:" + "2" * 64
    assert image.repo_digest("vllm/vllm-openai:v0.33.0", ["docker.io/vllm/vllm-openai@sha256:" + "3" * 64]) \
        == "sha256:" + "3" * 64
    assert image.repo_digest("vllm-sm12x-test/standin:1", []) is None


def probed(vllm: str | None) -> dict:
    return {"python": {"version": "3.12.3", "executable": "/usr/bin/python3",
                       "site_packages": "/usr/local/lib/python3.12/dist-packages"},
            "user": "root",
            "packages": {"vllm": vllm, "torch": "2.14.0+cu130", "flashinfer-python": "0.7.2.post1"}}


def test_inputs_of_a_base_with_a_series():
    version = available_versions()[-1]
    got = image.overlay_inputs("nvcr.io/nvidia/vllm:26.09-py3", probed(f"{version}+abc.nv26.09"),
                               repo_digests=["nvcr.io/nvidia/vllm@sha256:" + "4" * 64], image_id="sha256:" + "5" * 64,
                               target="sm121", arch="arm64")
    args = got["build_args"]
    assert args["VLLM_VERSION"] == version and args["VLLM_BUILD"] == f"{version}+abc.nv26.09"
    assert args["SERIES_HASH"] == series_for(version).hash
    assert (args["BASE_DIGEST"], args["TORCH_VERSION"], args["FLASHINFER_VERSION"]) == (
        "sha256:" + "4" * 64, "2.14.0+cu130", "0.7.2.post1")
    assert got["tag"] == f"vllm-sm12x:{version}-ngc26.09-sm121-arm64-overlay"


def test_a_base_without_a_series_or_without_vllm_is_refused():
    with pytest.raises(LauncherError) as err:
        image.overlay_inputs("nvcr.io/nvidia/vllm:26.11-py3", probed("0.28.0+abc.nv26.11"), repo_digests=[],
                             image_id="x", target="sm121", arch="arm64")
    message = err.value.message
    assert message.startswith("no patch series for vLLM 0.28.0+abc.nv26.11")
    assert "nearest supported release is 0.29.0" in message  # 0.27.1 and 0.29.0 tie: the newer
    assert "series exist for: " + ", ".join(available_versions()) in message
    assert err.value.hint == f"use a base with one of those vLLM versions, e.g. vllm/vllm-openai:v{available_versions()[-1]}"
    with pytest.raises(LauncherError) as err:
        image.overlay_inputs("python:3.12", probed(None), repo_digests=[], image_id="x", target="sm120", arch="amd64")
    assert "has no vLLM installed" in err.value.message and "VLLM_WHEEL" in err.value.hint


def test_the_module_runs_as_a_probe_with_only_the_standard_library(tmp_path):
    """The host runs launcher/image.py with the base's python3 before the
    launcher is installed there: `python3 -c <source> probe`."""
    source = open(image.__file__, encoding="utf-8").read()
    proc = subprocess.run([sys.executable, "-I", "-c", source, "probe"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert set(result["packages"]) == set(image.PINNED_PACKAGES)
    assert result["python"]["executable"] == sys.executable


def test_manifest_lines_name_every_pinned_input(tmp_path, monkeypatch):
    monkeypatch.setenv(image.IMAGE_DIR_ENV, str(tmp_path))
    manifest = {
        "flavor": "overlay", "target": "sm121", "arch": "arm64",
        "base": {"image": "nvcr.io/nvidia/vllm:26.09-py3", "digest": "sha256:" + "6" * 64, "image_id": None},
        "python": {"version": "3.12.3", "site_packages": "/usr/local/lib/python3.12/dist-packages"},
        "packages": {"vllm": "0.29.0+abc.nv26.09", "torch": "2.13.0a0+nv26.09", "flashinfer-python": "0.6.18",
                     "triton": None},
        "series": {"vllm": "0.29.0", "hash": "f" * 64, "patches": [{"id": "a", "state": "applied"}]},
    }
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    lines = image.manifest_lines(image.read_manifest())
    assert lines[1] == f"base      nvcr.io/nvidia/vllm:26.09-py3  (sha256:{'6' * 64})"
    assert "vllm 0.29.0+abc.nv26.09  torch 2.13.0a0+nv26.09  flashinfer-python 0.6.18" in lines[3]
    assert "triton" not in lines[3]
    assert lines[4] == f"series    vLLM 0.29.0 {'f' * 12}: 1/1 applied"
