"""Every patch of every series has its regression test, and each fails on the released tree.

``test_<id>.py`` (the id with ``-`` as ``_``) per runtime patch id; the test
files run the real code of the released wheel with that one patch applied.
Here the same files run again on the released tree (``VLLM_SM12X_PATCH_TESTS_ON
=stock``, see conftest.py): every test must fail there, except those that
check that what worked before still does (named ``..._unchanged`` or
``..._as_before``), and every file must have a failing one.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from launcher.patching.series import available_versions, series_for
from tests.patches.conftest import stock_run_report

HERE = Path(__file__).resolve().parent
NOT_PATCH_TESTS = {Path(__file__).name}

pytestmark = pytest.mark.network  # the stock run reads the released wheels


def _test_file(patch_id: str) -> str:
    return f"test_{patch_id.replace('-', '_').replace('.', '_')}.py"


def test_every_runtime_patch_id_has_a_test_file_and_every_file_a_patch():
    ids = {p.id for v in available_versions() for p in series_for(v).patches}
    files = {p.name for p in HERE.glob("test_*.py")} - NOT_PATCH_TESTS
    assert {_test_file(i) for i in ids} - files == set(), "patch ids without tests/patches/test_<id>.py"
    assert files - {_test_file(i) for i in ids} == set(), "test files for no patch id"


def _allowed_to_pass_on_stock(name: str) -> bool:
    """Tests that check what the patch leaves alone, the released tree itself
    (the baseline a stock-vs-patched test compares with) or the patch file."""
    base = name.split("[")[0]
    return any(word in base for word in ("unchanged", "as_before", "as_released", "either_way",
                                         "_released_", "with_its_header", "applies_alone"))


def test_patch_tests_fail_on_the_released_tree(tmp_path, request):
    # This folder's tests, run with STOCK_ENV=stock in a pytest of their own (conftest.py:
    # started at collection when this test is selected, so it overlaps the tests before it).
    assert NOT_PATCH_TESTS == {"test_patch_tests.py"}  # what the stock run leaves out
    report = stock_run_report(request.config, tmp_path)
    cases = ET.parse(report).getroot().iter("testcase")
    failed_by_file: dict[str, int] = {}
    passed_wrongly = []
    for case in cases:
        file = case.get("classname", "").rsplit(".", 1)[-1] + ".py"
        failed = case.find("failure") is not None or case.find("error") is not None
        failed_by_file[file] = failed_by_file.get(file, 0) + failed
        if case.find("skipped") is not None:
            passed_wrongly.append(f"{file}::{case.get('name')} (skipped)")
        elif not failed and not _allowed_to_pass_on_stock(case.get("name")):
            passed_wrongly.append(f"{file}::{case.get('name')}")
    files = {p.name for p in HERE.glob("test_*.py")} - NOT_PATCH_TESTS
    assert set(failed_by_file) == files
    assert passed_wrongly == [], "regression tests that pass on the released tree"
    assert all(count > 0 for count in failed_by_file.values()), failed_by_file
