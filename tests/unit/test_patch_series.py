"""Reading a series: file names, headers, ids, versions, the series hash, and refusals."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launcher.errors import LauncherError
from launcher.patching.series import available_versions, load_patch, public_version, series_for

DATA = Path(__file__).resolve().parent.parent / "data" / "patches"

DIFF = (
    "diff --git a/vllm/x.py b/vllm/x.py\n--- a/vllm/x.py\n+++ b/vllm/x.py\n"
    "@@ -1,2 +1,2 @@\n a = 1\n-b = 2\n+b = 3\n"
)
HEADER = "Subject: s\nFixes: the error\nUpstream-Status: Pending\n"


@pytest.fixture
def root(tmp_path) -> Path:
    shutil.copytree(DATA, tmp_path / "patches")
    return tmp_path / "patches"


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text)
    return folder / name


def test_series_lists_patches_in_order_with_ids_headers_and_build_part(root):
    s = series_for("0.21.0", root)
    assert s.version == "0.21.0"
    assert [p.id for p in s.patches] == ["backend-two-hunks", "new-module", "backend-on-top"]
    assert [p.name for p in s.patches][0] == "0001-backend-two-hunks.patch"
    assert [p.id for p in s.build_patches] == ["cmake-message"]
    first = s.patches[0]
    assert first.headers["Subject"] == "Mark AttentionBackend as patched (two hunks)"
    assert first.headers["Applies-To"] == "vllm 0.21.0"
    assert first.description == "Two hunks in vllm/v1/attention/backend.py, far apart."
    assert first.diff_text.startswith("diff --git a/vllm/v1/attention/backend.py")
    assert [len(fp.hunks) for fp in first.files] == [2]
    assert [p.id for p in s.for_layout("site-packages")] == [p.id for p in s.patches]
    assert [p.id for p in s.for_layout("source")][-1] == "cmake-message"


def test_comments_and_blank_lines_in_series_are_ignored(root):
    series_file = root / "vllm" / "0.21.0" / "series"
    series_file.write_text("# comment\n\n0001-backend-two-hunks.patch  # trailing comment\n   \n")
    assert [p.id for p in series_for("0.21.0", root).patches] == ["backend-two-hunks"]


def test_local_version_maps_to_the_release_series(root):
    assert public_version("0.21.0+cu132") == "0.21.0"
    assert series_for("0.21.0+cu132", root).version == "0.21.0"


def test_version_without_series_names_the_available_ones(root):
    assert available_versions(root) == ["0.21.0", "0.33.0"]
    with pytest.raises(LauncherError) as err:
        series_for("0.22.0", root)
    assert "0.22.0" in err.value.message and "0.21.0, 0.33.0" in err.value.message


def test_env_var_points_at_another_patches_root(root, monkeypatch):
    monkeypatch.setenv("VLLM_SM12X_PATCHES", str(root))
    shutil.rmtree(root / "vllm" / "0.33.0")
    assert available_versions() == ["0.21.0"]


def test_series_hash_is_stable_across_line_endings_and_changes_with_content(root):
    before = series_for("0.21.0", root).hash
    p = root / "vllm" / "0.21.0" / "0002-new-module.patch"
    p.write_bytes(p.read_bytes().replace(b"\n", b"\r\n"))  # a Windows checkout with autocrlf
    assert series_for("0.21.0", root).hash == before
    p.write_text(p.read_text().replace("PATCHED = True", "PATCHED = False"))
    assert series_for("0.21.0", root).hash != before


def test_missing_required_header_is_named(tmp_path):
    path = _write(tmp_path, "0001-x.patch", "Subject: s\nUpstream-Status: Pending\n\n" + DIFF)
    with pytest.raises(LauncherError, match="lacks header.*Fixes"):
        load_patch(path)


def test_folded_header_lines_and_description(tmp_path):
    path = _write(tmp_path, "0007-folded.patch",
                  HEADER.replace("Fixes: the error\n", "Fixes: first part\n  second part\n")
                  + "\nA description\nover two lines.\n\n" + DIFF)
    patch = load_patch(path)
    assert patch.id == "folded" and patch.headers["Fixes"] == "first part second part"
    assert patch.description == "A description\nover two lines."


@pytest.mark.parametrize("name", ["1-short.patch", "0001_x.patch", "0001-x.diff", "0001-.patch"])
def test_bad_patch_file_names_are_refused(tmp_path, name):
    path = _write(tmp_path, name, HEADER + "\n" + DIFF)
    with pytest.raises(LauncherError, match="NNNN-<id>.patch"):
        load_patch(path)


def test_series_naming_a_missing_file_is_refused(tmp_path):
    folder = tmp_path / "vllm" / "0.21.0"
    _write(folder, "series", "0001-gone.patch\n")
    with pytest.raises(LauncherError, match="0001-gone.patch, which does not exist"):
        series_for("0.21.0", tmp_path)


def test_duplicate_ids_are_refused(tmp_path):
    folder = tmp_path / "vllm" / "0.21.0"
    _write(folder, "0001-same.patch", HEADER + "\n" + DIFF)
    _write(folder, "0002-same.patch", HEADER + "\n" + DIFF)
    _write(folder, "series", "0001-same.patch\n0002-same.patch\n")
    with pytest.raises(LauncherError, match="'same' is used by"):
        series_for("0.21.0", tmp_path)


def test_runtime_patch_outside_vllm_points_at_the_build_series(tmp_path):
    path = _write(tmp_path, "0001-cmake.patch", HEADER + "\n" + DIFF.replace("vllm/x.py", "CMakeLists.txt"))
    with pytest.raises(LauncherError) as err:
        _ = load_patch(path).files
    assert "outside vllm/" in err.value.message and "build/" in err.value.hint


@pytest.mark.parametrize("bad", ["a/../etc/passwd", "a/vllm/../../x.py"])
def test_paths_escaping_the_tree_are_refused(tmp_path, bad):
    text = DIFF.replace("a/vllm/x.py", bad).replace("b/vllm/x.py", bad.replace("a/", "b/", 1))
    path = _write(tmp_path, "0001-evil.patch", HEADER + "\n" + text)
    with pytest.raises(LauncherError, match="unsafe path|outside"):
        _ = load_patch(path, kind="build").files


def test_patch_without_a_diff_is_refused(tmp_path):
    path = _write(tmp_path, "0001-empty.patch", HEADER + "\nonly words\n")
    with pytest.raises(LauncherError, match="contains no diff"):
        load_patch(path)
