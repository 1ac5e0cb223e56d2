"""Which supported vLLM release the plan and ``patch apply`` point a user at."""

from __future__ import annotations

import pytest

from launcher.errors import LauncherError
from launcher.vllm_compat import nearest_release

SUPPORTED = ["0.21.0", "0.26.0", "0.27.1", "0.29.0", "0.33.0"]


@pytest.mark.parametrize(("asked", "nearest"), [
    ("0.19.1", "0.21.0"),   # older than all: the oldest
    ("0.23.0", "0.21.0"),   # two minor releases from 0.21, three from 0.26
    ("0.24.0", "0.26.0"),
    ("0.27.0", "0.27.1"),   # same minor: the patch release
    ("0.28.0", "0.29.0"),   # one minor either way: 0.29.0 has no patch distance
    ("0.31.0", "0.33.0"),   # a tie (two minors each way) goes to the newer
    ("0.27.1+cu130", "0.27.1"),
    ("1.0.0", "0.33.0"),
])
def test_nearest_release(asked, nearest):
    assert nearest_release(asked, SUPPORTED) == nearest


def test_no_supported_release_is_an_error():
    with pytest.raises(LauncherError):
        nearest_release("0.30.0", [])
