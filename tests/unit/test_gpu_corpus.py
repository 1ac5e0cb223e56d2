"""The trained target's corpus and tokenizer do not depend on the host (issue 51, item 5).

The corpus is the .py sources of pinned PyPI wheels (tests/gpu/corpus.json), downloaded into
~/.cache/vllm-sm12x/corpus once; here they are fetched for real and the corpus digest and the
tokenizer built from it must equal the identities corpus.json records, as on the GPU host.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"
sys.path.insert(0, str(GPU_DIR))

import lm_files  # noqa: E402
import stage  # noqa: E402

MANIFEST = json.loads(lm_files.PINNED_CORPUS.read_text())


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return stage.stage_corpus(tmp_path_factory.mktemp("corpus"))


def test_staging_fetches_every_pinned_wheel_with_its_sha256(staged):
    pinned = MANIFEST["wheels"] + MANIFEST["training_wheels"]
    assert sorted(p.name for p in staged) == sorted(a["file"] for a in pinned)
    for art in pinned:
        path = next(p for p in staged if p.name == art["file"])
        assert hashlib.sha256(path.read_bytes()).hexdigest() == art["sha256"]


def test_the_corpus_and_its_tokenizer_are_the_recorded_identities(staged, tmp_path):
    corpus = lm_files.collect_wheel_corpus(staged[0].parent)
    assert corpus["sha256"] == MANIFEST["corpus_sha256"]
    assert corpus["source"] == "wheels"
    assert {a["file"] for a in corpus["artifacts"]} == {a["file"] for a in MANIFEST["wheels"]}
    # no test, benchmark or migration sources, no metadata
    paths = [p for p, _ in corpus["train"] + corpus["heldout"]]
    assert not [p for p in paths if set(p.split("/")[:-1]) & {"tests", "test", "migrations", "benchmarks"}]
    assert all(p.endswith(".py") for p in paths)
    assert {p.split("/")[0] for p in paths} == {"django", "sympy", "isympy.py"}
    tokenizer = lm_files.train_tokenizer([text for _, text in corpus["train"]], lm_files.VOCAB_SIZE)
    import train_target

    lm_files.write_lm_files(tokenizer, tmp_path, train_target.target_config()["vision_config"])
    assert hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest() == MANIFEST["tokenizer_sha256"]


def _wheel(path: Path, members: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_wheel_that_is_not_the_pinned_bytes_is_refused(tmp_path):
    digest = _wheel(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/a.py": "x = 1\n"})
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"wheels": [{"file": "pkg-1.0-py3-none-any.whl", "sha256": "0" * 64}]}))
    with pytest.raises(ValueError, match="corpus.json pins"):
        lm_files.collect_wheel_corpus(tmp_path, manifest)
    manifest.write_text(json.dumps({"wheels": [{"file": "pkg-1.0-py3-none-any.whl", "sha256": digest}]}))
    assert sum(lm_files.collect_wheel_corpus(tmp_path, manifest)["files"].values()) == 1


def test_a_missing_wheel_names_the_staging_command(tmp_path):
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"wheels": [{"file": "absent-1.0-py3-none-any.whl", "sha256": "0" * 64}]}))
    with pytest.raises(FileNotFoundError, match="stage.py --corpus"):
        lm_files.collect_wheel_corpus(tmp_path, manifest)


def test_tests_metadata_and_non_python_members_are_left_out(tmp_path):
    members = {"pkg/a.py": "a = 1\n", "pkg/tests/t.py": "t = 1\n", "pkg/migrations/m.py": "m = 1\n",
               "pkg/data.txt": "text\n", "pkg-1.0.dist-info/x.py": "d = 1\n", "pkg/bad.py": "\udcff"}
    with zipfile.ZipFile(tmp_path / "pkg-1.0-py3-none-any.whl", "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text.encode("utf-8", "surrogateescape"))
    digest = hashlib.sha256((tmp_path / "pkg-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    manifest = tmp_path / "corpus.json"
    manifest.write_text(json.dumps({"wheels": [{"file": "pkg-1.0-py3-none-any.whl", "sha256": digest}]}))
    corpus = lm_files.collect_wheel_corpus(tmp_path, manifest)
    assert [p for p, _ in corpus["train"] + corpus["heldout"]] == ["pkg/a.py"]
