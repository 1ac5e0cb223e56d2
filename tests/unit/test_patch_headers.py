"""Every patch header follows patches/vllm/README.md's header rules.

The forms are the README's list; a header that cites a document outside the
repository (the project's notes kept beside it) cannot be checked by a reader
of the patch, so none may.
"""

from __future__ import annotations

import re

import pytest

from launcher.patching.series import available_versions, series_for

UPSTREAM_STATUS = re.compile(
    r"^(Backport of PR #\d+|Adapted backport of PR #\d+|Backport of the released \d+\.\d+\.\d+ |"
    r"Backport of vllm/\S+ \S+ from \d+\.\d+\.\d+|Submitted|Pending|Inappropriate)"
)
ALL = [(v, p) for v in available_versions() for p in (*series_for(v).patches, *series_for(v).build_patches)]


@pytest.mark.parametrize(("version", "patch"), ALL, ids=[f"{v}/{p.name}" for v, p in ALL])
def test_header_follows_the_readme(version, patch):
    for key in ("Subject", "Fixes", "Upstream-Status", "Bug"):
        assert patch.headers.get(key), f"{patch.name} lacks {key}"
    assert UPSTREAM_STATUS.match(patch.headers["Upstream-Status"]), patch.headers["Upstream-Status"][:80]
    for key, value in patch.headers.items():
        assert "FACTS.md" not in value, f"{patch.name}: {key} cites a document outside the repository"
