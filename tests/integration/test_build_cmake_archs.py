"""vLLM's own CMake arch filter, run with `cmake -P` on the pristine released sdists.

This reproduces the sm_121 collapse the build patch answers (vLLM issue
#36835): under CUDA 13 a requested 12.1a comes out as 12.0 / 12.0f. The
patched side is checked on the trees `build wheels` prepares
(test_build_wheels.py).
"""

from __future__ import annotations

import pytest

from launcher import pypi
from launcher.builder import cmake_archs

pytestmark = pytest.mark.network


NEWER = ["0.26.0", "0.27.1", "0.29.0"]


@pytest.mark.parametrize("version,group", [("0.21.0", "FP4_ARCHS"), ("0.33.0", "FP4_SM120_ARCHS")]
                         + [(v, "FP4_SM120_ARCHS") for v in NEWER])
def test_released_cmake_collapses_sm121_into_sm120(version, group):
    tree = pypi.unpacked("vllm", version, "source")
    got = cmake_archs.resolve(tree, "12.1a")
    assert (got.cuda_archs, got.kernel_archs, got.kernel_group) == ("12.0", "12.0f", group)


@pytest.mark.parametrize("version", ["0.21.0", *NEWER, "0.33.0"])
@pytest.mark.parametrize(
    "requested,expected",
    [
        ("12.0", ("12.0", "12.0f")),  # RTX 5090 default: generic sm_120, family kernels
        ("12.0a+PTX", ("12.0a", "12.0a")),  # the Windows list: +PTX is dropped, 'a' wins
    ],
)
def test_released_cmake_sm120_lists(version, requested, expected):
    got = cmake_archs.resolve(pypi.unpacked("vllm", version, "source"), requested)
    assert (got.cuda_archs, got.kernel_archs) == expected


def test_cuda_12_8_keeps_sm121_without_a_patch():
    """The CUDA 12.8 branch of CUDA_SUPPORTED_ARCHS lists 12.1: the global collapse is CUDA 13 only."""
    got = cmake_archs.resolve(pypi.unpacked("vllm", "0.21.0", "source"), "12.1a", cuda_version="12.8")
    assert got.cuda_archs == "12.1a"


@pytest.mark.parametrize("version", NEWER)
def test_build_series_keeps_sm121_and_sm120_unchanged(version, tmp_path):
    """The release's whole series applied through the engine to a copy of its
    sdist's build files: 12.1a now survives, 12.0 resolves as before."""
    import shutil

    from launcher.patching import engine
    from launcher.patching.series import series_for
    from tests.integration.patch_trees import mini_tree

    series = series_for(version)
    touched = sorted({fp.path for p in series.for_layout("source") for fp in p.files})
    tree = mini_tree(version, "source", tmp_path / "tree", touched)
    shutil.copytree(pypi.unpacked("vllm", version, "source") / "cmake", tree / "cmake")
    assert {r.outcome for r in engine.apply(tree).results} == {"applied"}
    assert cmake_archs.resolve(tree, "12.1a").cuda_archs == "12.1a"
    assert (cmake_archs.resolve(tree, "12.0").cuda_archs, cmake_archs.resolve(tree, "12.0").kernel_archs) == ("12.0", "12.0f")
