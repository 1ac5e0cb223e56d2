"""What the device bundles (tests/gpu/staging/stage.py) carry, per vLLM release, without downloading."""

from __future__ import annotations

import io
import json
import subprocess

import pytest

from tests.unit.gpu_scripts import load as _load

stage = _load("stage")


def test_fa4_and_the_rust_front_end_never_travel_and_fa2_only_when_asked():
    assert stage.wheel_member_dropped("vllm/vllm_flash_attn/cute/flash_fwd.py")
    assert stage.wheel_member_dropped("vllm/vllm-rs")
    assert stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so")
    assert not stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", keep_fa2=True)
    assert not stage.wheel_member_dropped("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so")
    # CuTe headers that DeepGEMM compiles against are not FA4
    assert not stage.wheel_member_dropped("vllm/third_party/deep_gemm/include/cute/arch/mma_sm90_gmma.hpp")


def test_each_release_has_its_own_stem_and_pins():
    assert stage.bundle_stem("0.21.0") == "bundle"
    assert stage.bundle_stem("0.33.0") == "bundle-0.33.0"
    assert stage.requirements_for("0.21.0").name == "bundle-requirements.txt"
    assert stage.requirements_for("0.33.0").name == "bundle-requirements-0.33.0.txt"
    with pytest.raises(SystemExit, match="bundle-requirements-9.9.9.txt"):
        stage.requirements_for("9.9.9")


def test_the_033_pins_leave_torch_and_the_image_packages_alone():
    names = {line.split("==")[0].lower() for line in stage._requirements(stage.requirements_for("0.33.0"))}
    assert not names & {"torch", "triton", "transformers", "numpy", "nvidia-nccl-cu13", "nvidia-cudnn-cu13"}
    assert "unidiff" in names  # the patch engine applies the series on the device


def test_resplit_cuts_staged_parts_again_and_keeps_the_whole(tmp_path):
    """Parts of an older, larger size re-cut into smaller ones: the same bytes in order, the
    same whole sha256 (what the device checks), no part of the old cut left behind."""
    import hashlib
    import json

    data = bytes(range(256)) * 400  # 102,400 bytes
    tarball = tmp_path / "bundle.tar.xz"
    tarball.write_bytes(data)
    old = stage.split(tarball, tmp_path, "bundle", "0.21.0", part_bytes=60_000)
    tarball.unlink()
    assert len(old["parts"]) == 2
    new = stage.resplit(tmp_path, "bundle", part_bytes=25_000)
    assert [p["bytes"] for p in new["parts"]] == [25_000] * 4 + [2_400]
    assert new["sha256"] == old["sha256"] == hashlib.sha256(data).hexdigest()
    assert b"".join((tmp_path / p["name"]).read_bytes() for p in new["parts"]) == data
    assert sorted(p.name for p in tmp_path.glob("bundle.tar.xz.part*")) == [p["name"] for p in new["parts"]]
    assert json.loads((tmp_path / "bundle.json").read_text()) == new and not tarball.exists()


def test_resplit_keeps_what_else_an_extras_manifest_says(tmp_path):
    """extras-trained's manifest names its target (target_sha256) and no vLLM release: a re-cut
    changes the parts alone (it once dropped the one field and added the other)."""
    import json

    tarball = tmp_path / "extras-trained.tar"
    tarball.write_bytes(b"w" * 9000)
    stage.split(tarball, tmp_path, "extras-trained", part_bytes=4000)
    tarball.unlink()
    manifest_path = tmp_path / "extras-trained.json"
    before = json.loads(manifest_path.read_text())
    del before["vllm"]
    before["target_sha256"] = "ab" * 32
    manifest_path.write_text(json.dumps(before))
    after = stage.resplit(tmp_path, "extras-trained", part_bytes=3000)
    assert json.loads(manifest_path.read_text()) == after
    assert {k: v for k, v in after.items() if k != "parts"} == {k: v for k, v in before.items() if k != "parts"}
    assert [p["bytes"] for p in after["parts"]] == [3000] * 3


def test_resplit_refuses_parts_that_do_not_make_their_whole(tmp_path):
    tarball = tmp_path / "extras.tar"
    tarball.write_bytes(b"x" * 5000)
    manifest = stage.split(tarball, tmp_path, "extras", part_bytes=2000)
    tarball.unlink()
    (tmp_path / manifest["parts"][1]["name"]).write_bytes(b"y" * 2000)
    with pytest.raises(SystemExit, match="do not make the whole"):
        stage.resplit(tmp_path, "extras", part_bytes=1000)
    assert [p.name for p in sorted(tmp_path.glob("extras.tar.part*"))] == [p["name"] for p in manifest["parts"]]


def test_the_tree_is_counted_from_git_with_untracked_files_it_does_not_ignore(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("/.stage/\n")
    (repo / ".stage").mkdir()
    (repo / ".stage" / "part").write_bytes(b"p" * 5000)
    (repo / "tracked").write_bytes(b"t" * 300)
    subprocess.run(["git", "-C", str(repo), "add", "tracked", ".gitignore"], check=True)
    (repo / "new-log-archive").write_bytes(b"n" * 700)  # a device call copies it too
    assert stage.tree_bytes(repo) == 300 + 700 + len("/.stage/\n")


def test_a_part_fits_one_call_beside_this_tree():
    """What every GPU session stages against: the repository as a call copies it, one part of
    PART_BYTES with its manifest, and 3 MiB for the raw reference records carried at the end.
    Fails when the tree has outgrown the parts: shrink the tree (log archives as xz) or cut
    smaller parts (stage.py --resplit)."""
    assert stage.tree_bytes() + stage.PART_BYTES + 3 * 2**20 <= stage.CALL_BYTES


def test_ray_is_its_own_extras_bundle_of_the_pinned_wheel(tmp_path, monkeypatch, capsys):
    """`stage.py --ray`: the pinned Ray wheel packed as extras-ray. The download is replaced by a
    stand-in wheel (Ray's is about 80 MB); what is asked for and what is packed are the real path."""
    import tarfile
    import zipfile

    asked = []

    def download(dest, *what):
        asked.append(what)
        dest.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(dest / "ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl", "w") as zf:
            zf.writestr("ray/__init__.py", "__version__ = '2.60.0'\n")

    monkeypatch.setattr(stage, "_download_binaries", download)
    assert stage.main(["--ray", "--out", str(tmp_path)]) == 0
    assert asked == [(stage.RAY_PIN,)] and stage.RAY_PIN.startswith("ray==")
    manifest = json.loads((tmp_path / "extras-ray.json").read_text())
    whole = b"".join((tmp_path / p["name"]).read_bytes() for p in manifest["parts"])
    with tarfile.open(fileobj=io.BytesIO(whole)) as tar:
        assert tar.getnames() == ["wheels", "wheels/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl"]
    assert "extras-ray:" in capsys.readouterr().out
