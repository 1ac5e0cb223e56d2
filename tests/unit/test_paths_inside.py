"""``launcher.paths.inside``: names read from files others can write stay in their folder (issue 55.1, 55.8)."""

from __future__ import annotations

import os

import pytest

from launcher.errors import LauncherError
from launcher.paths import inside


@pytest.mark.parametrize("rel", ["a.py", "vllm/x/y.py", "./vllm/x.py", "odd name: with colon.json"])
def test_relative_names_inside_are_joined(rel, tmp_path):
    if ":" in rel and os.name == "nt":
        pytest.skip("a colon names a drive on Windows")
    path = inside(tmp_path, rel, "the listing")
    assert path.is_relative_to(tmp_path) and path.name == rel.rsplit("/", 1)[-1]


@pytest.mark.parametrize("rel", ["../x", "a/../../x", "/etc/passwd", "", ".", "a\0b", None, 5, ["a"]])
def test_names_that_leave_or_are_not_names_are_refused(rel, tmp_path):
    with pytest.raises(LauncherError, match="is not a path inside"):
        inside(tmp_path, rel, "the listing")


def test_a_symlinked_folder_out_of_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(LauncherError, match="'link/x.json', which is not a path inside"):
        inside(root, "link/x.json", "the listing")
