"""build/proof.yaml against the real released vLLM 0.21.0 sdist (cached download).

The proof's object list and source pins must name real files and real pins;
its SM12x groups must resolve, through the sdist's own cmake/utils.cmake, to
the linux-amd64 plan's kernel archs. (The compile itself is `make build-proof`.)
"""

from __future__ import annotations

import pytest

from launcher import pypi
from launcher.builder import cmake_archs, proof_report
from launcher.builder.targets import load as load_targets

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def tree():
    return pypi.unpacked("vllm", "0.21.0", "source")


def test_objects_and_pins_exist_in_the_sdist(tree):
    spec = proof_report.load().for_vllm("0.21.0")
    for obj in spec.objects:
        # Marlin kernels are generated at configure time from a script in their folder
        assert (tree / obj.source).is_file() or (tree / obj.source).parent.joinpath("generate_kernels.py").is_file()
    for name, pin in spec.sources.items():
        found = proof_report.pinned_revision((tree / pin.pinned_in).read_text(), pin.pinned_regex)
        assert found, f"{name}: no pin matching {pin.pinned_regex} in {pin.pinned_in}"


def test_sm12x_groups_resolve_to_the_plan(tree):
    spec = proof_report.load().for_vllm("0.21.0")
    target = load_targets().target("linux-amd64")
    groups = sorted({o.arch_group for o in spec.objects if o.sm12x})
    resolved = cmake_archs.resolve_groups(tree, target.torch_cuda_arch_list, groups)
    assert set(resolved.values()) == {target.kernel_archs}
