"""tests/gpu/staging/install.py: received bundles installed on the GPU host, from parts stage.py cut.

Real: stage.py's tree, xz packing and parts; parts.py's checks; pip installing a wheel with the
requirements' pins; the files laid out. Stand-ins, because a GPU host's vLLM is a 400 MB wheel:
a small wheel with vLLM's layout (and an FA2 library that is bytes, not a library) and a small
wheel for the bundle's dependencies.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest

from tests.unit.gpu_scripts import load

install = load("install")
stage = load("stage")

FA2_BYTES = b"the FA2 library's stand-in bytes" * 100


def _wheel(path: Path, files: dict[str, str | bytes], name: str = "tinypkg", version: str = "1.0") -> Path:
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(path, "w") as zf:
        for member, data in files.items():
            zf.writestr(member, data)
    return path


def _vllm_wheel(tmp: Path) -> Path:
    return _wheel(tmp / "vllm-0.0-py3-none-any.whl", {
        "vllm/__init__.py": "__version__ = '0.0'\n", "vllm/vllm_flash_attn/__init__.py": "",
        "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": FA2_BYTES, "vllm/vllm_flash_attn/cute/flash.py": "FA4\n"},
        name="vllm", version="0.0")


def _host(tmp: Path) -> "install.Host":
    return install.Host(bundle_dir=tmp / "bundles", work=tmp / "work", site=tmp / "site",
                        site_patched=tmp / "site-patched", models_rs=tmp / "models-rs",
                        models_trained=tmp / "models-trained", site_quant=tmp / "site-quant", py=sys.executable)


@pytest.fixture
def staged(tmp_path):
    """A vLLM bundle in three parts and an FA2-and-checkpoint extras bundle, received."""
    host = _host(tmp_path)
    host.bundle_dir.mkdir()
    vllm = _vllm_wheel(tmp_path)
    tiny = _wheel(tmp_path / "tinypkg-1.0-py3-none-any.whl", {"tinypkg/__init__.py": "X = 1\n"})
    stage.build_tree(vllm, [tiny], tmp_path / "tree")
    tarball = stage.pack(tmp_path / "tree", host.bundle_dir, stem="bundle")
    size = tarball.stat().st_size
    manifest = stage.split(tarball, host.bundle_dir, stem="bundle", part_bytes=size // 3 + 1)
    tarball.unlink()
    assert len(manifest["parts"]) == 3
    reqs = tmp_path / "requirements.txt"
    reqs.write_text("tinypkg==1.0\n")
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    stage.pack_extras(vllm, [model], host.bundle_dir, "extras-fa2")
    return host, reqs


def test_a_bundle_in_parts_installs_once_with_its_pinned_wheels(staged):
    host, reqs = staged
    said = install.bundle(host, "bundle", host.site, reqs)
    assert said == f"bundle installed in {host.site}"
    assert (host.site / "vllm" / "__init__.py").read_text() == "__version__ = '0.0'\n"
    assert (host.site / "tinypkg" / "__init__.py").read_text() == "X = 1\n"  # pip, from the bundle's wheels
    assert not (host.site / "vllm" / "vllm_flash_attn" / "cute").exists()  # FA4 left out by stage.py
    assert not (host.site / install.FA2).exists()  # FA2 travels in the extras
    assert (host.site / ".bundle-installed").is_file() and not (host.work / "bundle").exists()
    assert install.bundle(host, "bundle", host.site, reqs) == f"bundle already installed in {host.site}"


def test_a_missing_or_damaged_part_installs_nothing(staged, tmp_path):
    host, reqs = staged
    part = host.bundle_dir / "bundle.tar.xz.part01"
    data = part.read_bytes()
    part.unlink()
    with pytest.raises(SystemExit, match="missing bundle part bundle.tar.xz.part01"):
        install.bundle(host, "bundle", host.site, reqs)
    part.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(SystemExit, match="do not match the manifest's sha256"):
        install.bundle(host, "bundle", host.site, reqs)
    assert not host.site.exists()


def test_extras_put_fa2_into_vllm_and_its_patched_copy_and_the_checkpoints_beside(staged):
    host, reqs = staged
    # before the bundle made SITE, FA2 waits, unmarked
    first = install.extras(host)
    assert first == [f"extras-fa2: vLLM is not in {host.site} yet (remote.sh install): FA2 waits for the next extras"]
    assert not (host.site / ".extras-fa2-installed").exists()
    install.bundle(host, "bundle", host.site, reqs)
    (host.site_patched / "vllm" / "vllm_flash_attn").mkdir(parents=True)  # a patched copy made before FA2
    said = install.extras(host)
    assert said[-1] == "extras-fa2 installed" and "does not load here" in said[0]  # bytes, not a library
    assert (host.site / install.FA2).read_bytes() == FA2_BYTES
    assert (host.site_patched / install.FA2).read_bytes() == FA2_BYTES
    assert (host.models_rs / "tiny-model" / "config.json").read_text() == "{}"
    sha = install.parts.manifest(host.bundle_dir, "extras-fa2")["sha256"]
    assert (host.site / ".extras-fa2-installed").read_text().strip() == sha
    assert install.extras(host) == ["extras-fa2 already installed"]


def test_ray_goes_into_a_folder_of_its_own_and_modelopt_into_another(tmp_path):
    host = install.Host(**{**_host(tmp_path).__dict__, "site_ray": tmp_path / "site-ray"})
    host.bundle_dir.mkdir()
    for stem, pkg in (("extras-ray", "ray"), ("extras-quant", "modelopt")):
        wheels = tmp_path / f"{stem}-wheels"
        wheels.mkdir()
        _wheel(wheels / f"{pkg}-1.0-py3-none-any.whl", {f"{pkg}/__init__.py": "V = 1\n"}, name=pkg)
        stage.pack_extras(None, [], host.bundle_dir, stem, wheels)
    said = install.extras(host)
    assert said == ["extras-quant installed", "extras-ray installed"]
    assert (host.site_ray / "ray" / "__init__.py").is_file() and not (host.site_ray / "modelopt").exists()
    assert (host.site_quant / "modelopt" / "__init__.py").is_file() and not (host.site_quant / "ray").exists()
    assert install.Host.from_env({}).site_ray == Path("/tmp/site-ray")
    assert install.Host.from_env({"SITE_RAY": str(tmp_path / "r")}).site_ray == tmp_path / "r"


def test_no_extras_received_says_what_runs_instead(tmp_path):
    host = _host(tmp_path)
    host.bundle_dir.mkdir()
    assert install.extras(host) == ["no extras*.json staged (stage.py --extras): FA2 absent, FLASH_ATTN runs FA3"]



def test_remote_sh_installs_through_it(staged, tmp_path):
    # remote.sh's own functions, with its folders pointed here: the wiring of its variables
    import os
    import subprocess

    host, reqs = staged
    root = Path(__file__).resolve().parents[2]
    functions = (root / "tests" / "gpu" / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    script = tmp_path / "f.sh"
    script.write_text(functions + f'\ninstall_bundle bundle "$SITE" {reqs} || echo "import check failed"\n'
                      "install_bundle bundle \"$SITE\" x\nextras\n")
    env = dict(os.environ, BUNDLE_DIR=str(host.bundle_dir), WORK=str(host.work), SITE=str(host.site),
               SITE_PATCHED=str(host.site_patched), MODELS_RS=str(host.models_rs),
               MODELS_TRAINED=str(host.models_trained), SITE_QUANT=str(host.site_quant), PY=sys.executable)
    done = subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "bundle installed in" in done.stdout and "bundle already installed in" in done.stdout
    assert "extras-fa2 installed" in done.stdout
    assert (host.site / install.FA2).read_bytes() == FA2_BYTES
    assert (host.models_rs / "tiny-model" / "config.json").is_file()


def test_engine_check_puts_ray_on_the_path_only_when_extras_ray_is_staged(tmp_path):
    """remote.sh engine_check's wiring: its own function, with the installs and vLLM's interpreter
    replaced (they need the GPU host's bundles); a stand-in PY prints what it was given."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    functions = (root / "tests" / "gpu" / "remote.sh").read_text().split("\ncmd=${1:-}\n")[0]
    py = tmp_path / "py"
    py.write_text('#!/bin/sh\necho "PY PYTHONPATH=$PYTHONPATH ARGS=$*"\n')
    py.chmod(0o755)
    script = tmp_path / "f.sh"
    script.write_text(functions + '\nreceive_parts() { :; }\ninstall_v33() { :; }\nextras() { echo "extras ran"; }\n'
                      "engine_check\n")
    bundles = tmp_path / "bundles"
    bundles.mkdir()
    env = dict(os.environ, BUNDLE_DIR=str(bundles), WORK=str(tmp_path / "w"), OUT=str(tmp_path / "out"),
               SITE_RAY=str(tmp_path / "site-ray"), SITE33=str(tmp_path / "site33"), MULTINODE_DUMP=str(tmp_path / "plans"),
               PY=str(py))

    def run() -> str:
        done = subprocess.run(["bash", str(script)], cwd=root, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        written = (tmp_path / "out" / "multinode-engine-check-0.33.0.txt").read_text()
        assert done.stdout.replace("extras ran\n", "") == written  # the record: every line but the install's
        return done.stdout

    without = run()
    assert "ray: not staged" in without and "extras ran" not in without and "site-ray" not in without
    (bundles / "extras-ray.json").write_text("{}")
    with_ray = run()
    lines = with_ray.splitlines()
    assert lines[0] == "extras ran"
    # Ray imports beside vLLM's site (its jsonschema is there, not in the image)
    assert lines[1].startswith(f"PY PYTHONPATH={tmp_path / 'site33'}:{tmp_path / 'site-ray'} ARGS=-c import ray")
    assert lines[2] == (f"PY PYTHONPATH=.:{tmp_path / 'site33'}:{tmp_path / 'site-ray'} ARGS=tests/integration/"
                        f"multinode_engine_check.py {tmp_path / 'plans'} --require-engine-config")
