"""tests/gpu/staging/parts.py, and remote.sh's receive through it: staged parts copied to the GPU host's
bundle folder, held parts counted, a part cut short dropped, the whole put back together only when
its bytes make the manifest's sha256. Real parts, cut by stage.py's own split()."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import gpu_paths  # noqa: E402,F401  (the harness's group folders)

import parts  # noqa: E402
import stage  # noqa: E402

DATA = bytes(range(256)) * 100  # 25,600 bytes: three parts of 10,000


@pytest.fixture
def staged(tmp_path):
    out = tmp_path / "stage"
    out.mkdir()
    tarball = out / "extras-trained.tar"
    tarball.write_bytes(DATA)
    stage.split(tarball, out, "extras-trained", part_bytes=10_000)
    tarball.unlink()
    return out


def test_receive_copies_manifests_and_parts_and_leaves_a_same_part_alone(staged, tmp_path):
    folder = tmp_path / "bundles"
    assert parts.receive(staged, folder) == [f"extras-trained.tar.part0{i}" for i in range(3)]
    kept = folder / "extras-trained.tar.part00"
    inode = kept.stat().st_ino
    (staged / "extras-trained.tar.part01").write_bytes(b"z" * 10_000)  # staged again, other bytes
    assert parts.receive(staged, folder) == ["extras-trained.tar.part01"]
    assert kept.stat().st_ino == inode and (folder / "extras-trained.json").exists()


def test_held_counts_parts_and_drops_one_that_fails_its_sha256(staged, tmp_path):
    folder = tmp_path / "bundles"
    parts.receive(staged, folder)
    (folder / "extras-trained.tar.part02").unlink()
    (folder / "extras-trained.tar.part01").write_bytes(b"cut short")
    lines = parts.held(folder)
    assert lines == ["bad checksum, dropped: extras-trained.tar.part01",
                     "extras-trained parts held: 1/3 ['extras-trained.tar.part00']"]
    assert not (folder / "extras-trained.tar.part01").exists()
    assert parts.missing(folder, "extras-trained") == ["extras-trained.tar.part01", "extras-trained.tar.part02"]


def test_assemble_gives_the_parts_in_order_only_when_they_make_the_whole(staged, tmp_path):
    folder = tmp_path / "bundles"
    parts.receive(staged, folder)
    got = parts.assemble(folder, "extras-trained")
    assert b"".join(p.read_bytes() for p in got) == DATA
    assert parts.main(["sha", str(folder), "extras-trained"]) == 0
    (folder / "extras-trained.tar.part02").write_bytes(b"y" * 5_600)  # present, but not the bytes staged
    with pytest.raises(SystemExit, match="do not match the manifest's sha256"):
        parts.assemble(folder, "extras-trained")
    (folder / "extras-trained.tar.part02").unlink()
    with pytest.raises(SystemExit, match="missing extras-trained part extras-trained.tar.part02"):
        parts.assemble(folder, "extras-trained")
    with pytest.raises(SystemExit, match="no bundle-0.33.0.json"):
        parts.assemble(folder, "bundle-0.33.0")


def test_remote_sh_receive_trained_reports_through_parts_py(staged, tmp_path):
    """remote.sh's own receive-trained with two of three parts staged: it says what it holds and
    how many are still to copy, and installs nothing yet."""
    (staged / "extras-trained.tar.part02").unlink()
    env = dict(os.environ, STAGE=str(staged), BUNDLE_DIR=str(tmp_path / "bundles"), PY=sys.executable,
               WORK=str(tmp_path / "work"), MODELS_TRAINED=str(tmp_path / "models"))
    done = subprocess.run(["bash", str(ROOT / "tests" / "gpu" / "remote.sh"), "receive-trained"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "extras-trained parts held: 2/3" in done.stdout
    assert done.stdout.rstrip().endswith("extras-trained: 1 parts still to copy")
    assert not (tmp_path / "models").exists()
    want = hashlib.sha256(DATA).hexdigest()
    assert parts.manifest(tmp_path / "bundles", "extras-trained")["sha256"] == want


def test_corpus_wants_every_pinned_wheel_with_its_pinned_bytes(tmp_path):
    import json

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pins = tmp_path / "corpus.json"
    arts = {"a-1.0-py3-none-any.whl": b"alpha", "b-2.0-py3-none-any.whl": b"beta"}
    for name, data in arts.items():
        (wheels / name).write_bytes(data)
    entry = lambda n: {"file": n, "sha256": hashlib.sha256(arts[n]).hexdigest()}  # noqa: E731
    pins.write_text(json.dumps({"wheels": [entry("a-1.0-py3-none-any.whl")],
                                "training_wheels": [entry("b-2.0-py3-none-any.whl")]}))
    parts.corpus(wheels, pins)
    (wheels / "b-2.0-py3-none-any.whl").write_bytes(b"other")
    with pytest.raises(SystemExit, match="corpus wheel b-2.0-py3-none-any.whl missing or not the pinned bytes"):
        parts.corpus(wheels, pins)
    (wheels / "a-1.0-py3-none-any.whl").unlink()
    with pytest.raises(SystemExit, match="corpus wheel a-1.0"):
        parts.corpus(wheels, pins)
