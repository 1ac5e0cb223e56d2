"""The project's real series (patches/vllm/<version>/) on the released trees, both layouts.

Parametrized over whatever series exist, so a new version or patch is
covered as soon as it lands.
"""

from __future__ import annotations

import py_compile

import pytest

from launcher.errors import LauncherError
from launcher.patching import engine
from launcher.patching.series import available_versions, series_for
from launcher.patching.stamp import STAMP_REL
from tests.integration.patch_trees import LAYOUTS, dirs, mini_tree, snapshot

REAL_VERSIONS = available_versions()
CASES = [(v, lay) for v in REAL_VERSIONS for lay in LAYOUTS]


def test_a_series_exists_for_both_supported_releases():
    assert {"0.21.0", "0.33.0"} <= set(REAL_VERSIONS)


def test_every_real_patch_has_the_required_header_and_a_unique_id():
    for version in REAL_VERSIONS:
        series = series_for(version)
        assert series.patches, f"series {version} is empty"
        for patch in [*series.patches, *series.build_patches]:
            for key in ("Subject", "Fixes", "Upstream-Status"):
                assert patch.headers.get(key), f"{patch.path} lacks {key}"
            assert patch.files, f"{patch.path} changes no file"
            if patch.kind == "runtime":
                assert all(fp.path.startswith("vllm/") for fp in patch.files)


def _touched(version: str, layout: str) -> list[str]:
    series = series_for(version)
    return sorted({fp.path for p in series.for_layout(layout) for fp in p.files})


@pytest.mark.parametrize(("version", "layout"), CASES, ids=[f"{v}-{lay}" for v, lay in CASES])
def test_real_series_apply_compile_reapply_revert(version, layout, tmp_path):
    touched = _touched(version, layout)
    root = mini_tree(version, layout, tmp_path / "tree", touched)
    before, before_dirs = snapshot(root), dirs(root)
    series = series_for(version)

    report = engine.apply(root)
    expected = [p.id for p in series.for_layout(layout)]
    assert [r.id for r in report.results] == expected
    assert {r.outcome for r in report.results} == {"applied"}, report.results
    for rel in touched:
        if rel.endswith(".py"):
            py_compile.compile(str(root / rel), cfile=str(tmp_path / "compiled.pyc"), doraise=True)
    changed = {rel for rel in touched if snapshot(root).get(rel) != before.get(rel)}
    assert changed == set(touched)  # every file a patch names really changed

    stamped = snapshot(root)
    again = engine.apply(root)
    assert {r.outcome for r in again.results} == {"already applied"} and not again.changed
    assert snapshot(root) == stamped

    st = engine.status(root)
    assert st.fully_applied and st.applied_ids == set(expected)
    assert st.stamp["series_hash"] == series.hash

    engine.revert(root)
    assert snapshot(root) == before and dirs(root) == before_dirs
    assert not (root / STAMP_REL).exists()


@pytest.mark.parametrize("version", REAL_VERSIONS)
def test_real_series_check_against_release_has_no_conflicts(version):
    rows = engine.check_against(f"vllm=={version}")
    series = series_for(version)
    assert [(r.patch_id, r.layout) for r in rows] == (
        [(p.id, "site-packages") for p in series.for_layout("site-packages")]
        + [(p.id, "source") for p in series.for_layout("source")]
    )
    bad = [(r.patch_id, r.layout, r.result, r.detail) for r in rows if r.result != "applies"]
    assert not bad


@pytest.mark.parametrize(("version", "layout"), CASES, ids=[f"{v}-{lay}" for v, lay in CASES])
def test_real_series_refuses_a_locally_edited_file(version, layout, tmp_path):
    root = mini_tree(version, layout, tmp_path / "tree", _touched(version, layout))
    # Edit a line the first patch's first hunk expects (a removed or context line).
    patch = series_for(version).patches[0]
    fp = next(f for f in patch.files if f.kind == "modify")
    hunk = fp.hunks[0]
    path = root / fp.path
    lines = path.read_bytes().split(b"\n")
    at = hunk.old_start - 1 + next(i for i, line in enumerate(hunk.old) if line.strip())
    lines[at] += b"  # local edit"
    path.write_bytes(b"\n".join(lines))
    before = snapshot(root)
    with pytest.raises(LauncherError) as err:
        engine.apply(root)
    assert patch.name in err.value.message and f"{fp.path} hunk 1/" in err.value.message
    assert snapshot(root) == before


@pytest.mark.parametrize(("version", "layout"), CASES, ids=[f"{v}-{lay}" for v, lay in CASES])
def test_real_series_on_crlf_files(version, layout, tmp_path):
    touched = _touched(version, layout)
    root = mini_tree(version, layout, tmp_path / "tree", touched)
    present = [rel for rel in touched if (root / rel).is_file()]
    for rel in present:
        (root / rel).write_bytes((root / rel).read_bytes().replace(b"\n", b"\r\n"))
    before = snapshot(root)
    engine.apply(root)
    for rel in present:
        data = (root / rel).read_bytes()
        assert data.count(b"\n") == data.count(b"\r\n"), f"{rel} got bare LF lines"
        if rel.endswith(".py"):
            py_compile.compile(str(root / rel), cfile=str(tmp_path / "compiled.pyc"), doraise=True)
    engine.revert(root)
    assert snapshot(root) == before
