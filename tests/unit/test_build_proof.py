"""The pure half of `launcher build proof`: codes, ELF host check, extrapolation, shim, result files.

The proof itself (vLLM's configure and CUTLASS compiles, about an hour on 2
cores) never runs in CI; `make build-proof` runs it. What runs here is the
logic it relies on, plus the cmake shim executed for real against a stand-in
"real cmake" script (named FAKE below: it only records its arguments).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from launcher.builder import preflight, proof, proof_report
from launcher.builder.targets import load as load_targets

REPO = Path(__file__).resolve().parents[2]


def test_fatbin_codes_follow_set_gencode_flags_for_srcs():
    assert proof_report.fatbin_codes("12.0f") == ["elf sm_120f"]
    assert proof_report.fatbin_codes("12.1a") == ["elf sm_121a"]
    # +PTX adds a PTX entry for the same arch (vLLM's set_gencode_flags_for_srcs)
    assert proof_report.fatbin_codes("8.0+PTX") == ["elf sm_80", "ptx sm_80"]
    assert proof_report.fatbin_codes("9.0+PTX;12.0f") == ["elf sm_120f", "elf sm_90", "ptx sm_90"]
    with pytest.raises(ValueError):
        proof_report.fatbin_codes("sm_120")


def test_fatbin_codes_speak_the_preflight_parser_language():
    """The expected side and cuobjdump's side must use one vocabulary: feed the parser
    cuobjdump-shaped headers and compare with fatbin_codes."""
    dump = ("\nFatbin elf code:\n================\narch = sm_90\ncode version = [1,8]\n"
            "\nFatbin ptx code:\n================\narch = sm_90\ncode version = [9,0]\n")
    assert sorted(preflight.fatbin_entries(dump)) == proof_report.fatbin_codes("9.0+PTX")


def test_elf_machine_reads_a_real_host_object(tmp_path):
    src = tmp_path / "x.c"
    src.write_text("int f(void) { return 1; }\n")
    obj = tmp_path / "x.o"
    subprocess.run(["gcc", "-c", str(src), "-o", str(obj)], check=True)
    want = {"x86_64": "x86-64", "aarch64": "aarch64"}[os.uname().machine]
    assert proof_report.elf_machine(obj.read_bytes()[:20]) == want
    with pytest.raises(ValueError):
        proof_report.elf_machine(b"#!/bin/sh\n" + b"\0" * 10)


def test_elf_machine_aarch64_header():
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 11 + (183).to_bytes(2, "little")
    assert proof_report.elf_machine(header) == "aarch64"


def _rules():
    return proof_report.load().for_vllm("0.21.0").classes


def test_classify_first_rule_wins():
    objs = [
        "vllm-flash-attn/CMakeFiles/_vllm_fa2_C.dir/csrc/flash_attn/src/flash_fwd_hdim256_bf16_sm80.cu.o",
        "vllm-flash-attn/CMakeFiles/_vllm_fa3_C.dir/hopper/instantiations/flash_fwd_hdim256_bf16_paged_sm90.cu.o",
        "CMakeFiles/_C.dir/csrc/quantization/marlin/marlin.cu.o",
        "CMakeFiles/_moe_C.dir/csrc/moe/torch_bindings.cpp.o",
        "CMakeFiles/_C_stable_libtorch.dir/csrc/libtorch_stable/quantization/fp4/nvfp4_scaled_mm_sm120_kernels.cu.o",
        "CMakeFiles/_C.dir/csrc/layernorm_kernels.cu.o",
        "CMakeFiles/_C.dir/csrc/something.c.o",
    ]
    assert proof_report.classify(objs, _rules()) == {
        "fa3": 1, "fa2": 1, "marlin": 1, "cxx": 1, "cutlass": 1, "cuda": 1, "other": 1}


def test_extrapolate_arithmetic_and_unmeasured_classes():
    counts = {"cutlass": 10, "cuda": 4, "cxx": 3}
    seconds = {"cutlass": [600.0, 300.0], "cuda": [60.0]}
    got = proof_report.extrapolate(counts, seconds, jobs=2)
    # (10 * 450 + 4 * 60) / 2 jobs = 2370 s
    assert got["hours"] == round(2370 / 3600, 2)
    assert got["serial_h"] == round(4740 / 3600, 2)
    assert got["classes"]["cutlass"] == {"objects": 10, "s_per_object": 450.0, "measured": 2, "serial_h": 1.25}
    assert got["unmeasured"] == {"cxx": 3}
    with pytest.raises(ValueError):
        proof_report.extrapolate(counts, seconds, jobs=0)


def test_parse_build_targets_from_setup_py_build_call():
    args = "--build . -j=1 --target=_C --target=_C_stable_libtorch --target=_moe_C --target=_vllm_fa2_C"
    assert proof.parse_build_targets(args) == ["_C", "_C_stable_libtorch", "_moe_C", "_vllm_fa2_C"]


def test_cmake_shim_passes_configure_and_stops_the_build(tmp_path):
    fake = tmp_path / "fake-cmake"  # FAKE real cmake: records its arguments, exits 0
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/real-calls\nexit 0\n")
    fake.chmod(0o755)
    shim = tmp_path / "cmake"
    shim.write_text(proof.shim_script(str(fake), tmp_path))
    shim.chmod(0o755)

    assert subprocess.run([str(shim), "/src", "-G", "Ninja", "-DX=1"]).returncode == 0
    start, end, rc = (tmp_path / "configure-times").read_text().split()
    assert float(end) >= float(start) and rc == "0"
    assert subprocess.run([str(shim), "--version"]).returncode == 0
    build = subprocess.run([str(shim), "--build", ".", "-j=1", "--target=_C"])
    assert build.returncode == proof.SHIM_STOP
    assert proof.parse_build_targets((tmp_path / "build-args").read_text()) == ["_C"]
    # the build call never reached the real cmake
    assert (tmp_path / "real-calls").read_text().splitlines() == ["/src -G Ninja -DX=1", "--version"]


def test_ninja_compile_outputs_of_a_flashinfer_spec():
    ninja = (
        "rule cuda_compile\n  command = nvcc $in\n"
        "build /b/ops/fp4/csrc_fp4.cuda.o: cuda_compile /src/fp4.cu\n"
        "build /b/ops/fp4/gen_fp4___nv_bfloat16_128_128_128.cuda.o: cuda_compile /gen/x.cu\n"
        "build /b/ops/fp4/bind.o: compile /src/bind.cpp\n"
        "build /b/ops/fp4/fp4.so: link /b/ops/fp4/csrc_fp4.cuda.o\n"
    )
    assert proof.ninja_compile_outputs(ninja) == [
        "/b/ops/fp4/csrc_fp4.cuda.o", "/b/ops/fp4/gen_fp4___nv_bfloat16_128_128_128.cuda.o", "/b/ops/fp4/bind.o"]


def test_source_record_deviation():
    pin = proof_report.SourcePin(env="VLLM_CUTLASS_SRC_DIR", pinned_in="CMakeLists.txt",
                                 pinned_regex=r'set\(CUTLASS_REVISION "([^"]+)"\)', repository="NVIDIA/cutlass")
    pinned = proof_report.pinned_revision('  set(CUTLASS_REVISION "v4.4.2")\n', pin.pinned_regex)
    assert pinned == "v4.4.2"
    same = proof_report.source_record("cutlass", pin, pinned, {"revision": "da5e08", "describe": "v4.4.2"}, "/s")
    assert same["deviation"] is None
    other = proof_report.source_record("cutlass", pin, pinned, {"revision": "abc", "describe": "v4.2.0"}, "/s")
    assert other["deviation"] == "pinned v4.4.2, used abc"
    unknown = proof_report.source_record("cutlass", pin, pinned, None, "/s")
    assert "unknown" in unknown["deviation"]


def test_supply_sources_refuses_missing_copies(tmp_path, monkeypatch):
    spec = proof_report.load().for_vllm("0.21.0")
    for pin in spec.sources.values():
        monkeypatch.delenv(pin.env, raising=False)
    from launcher.errors import LauncherError

    with pytest.raises(LauncherError) as err:
        proof.supply_sources(spec.sources, tmp_path, tmp_path / "sources")
    assert "cutlass (NVIDIA/cutlass)" in str(err.value) and "VLLM_FLASH_ATTN_SRC_DIR" in str(err.value)


def test_proof_list_objects_are_sm12x_groups():
    spec = proof_report.load().for_vllm("0.21.0")
    roles = " ".join(o.role for o in spec.objects)
    for needed in ("GEMM", "MoE", "quantization", "Marlin"):
        assert needed in roles
    assert spec.without_build_patch in {o.source for o in spec.objects}
    assert proof_report.load().for_flashinfer(load_targets().vllm_versions["0.21.0"].flashinfer)


RESULTS = sorted((REPO / "build" / "results").glob("build-proof-*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=[p.name for p in RESULTS])
def test_committed_result_shape(path):
    """The committed proofs: the shape the issue names, each object's verdict consistent with its codes,
    and the SM12x objects holding the target's planned kernel code."""
    data = json.loads(path.read_text())
    for key in ("vllm", "target", "configure_s", "objects", "extrapolated_full_build_h"):
        assert key in data
    target = load_targets().target(data["target"])
    planned = proof_report.fatbin_codes(target.kernel_archs)
    spec = proof_report.load().for_vllm(data["vllm"])
    sm12x = {o.source for o in spec.objects if o.sm12x}
    for obj in data["objects"]:
        assert {"source", "codes", "compile_s", "peak_rss_mb"} <= set(obj)
        assert obj["match"] == (obj["codes"] == obj["expected"])
        if obj["source"] in sm12x:
            assert obj["codes"] == planned
        assert obj["host_code"] == "x86-64"
    if "without_build_patch" in data:
        unpatched = data["without_build_patch"]["objects"][0]["codes"]
        assert unpatched != planned


def test_full_build_uses_every_timed_object_of_a_class():
    objs = ["CMakeFiles/_C.dir/csrc/a.cu.o", "CMakeFiles/_C.dir/csrc/b.cu.o", "CMakeFiles/_C.dir/csrc/quantization/marlin/m.cu.o"]
    timed = [{"class": "cuda", "compile_s": 10.0}, {"class": "cuda", "compile_s": 30.0},
             {"class": "marlin", "compile_s": 100.0}]
    got = proof.full_build(objs, _rules(), timed, host_jobs=2)
    # 2 cuda objects x 20 s + 1 marlin object x 100 s = 140 s serial
    assert got["serial_h"] == round(140 / 3600, 2)
    assert got["hours_by_jobs"]["2"] == got["hours"] == round(70 / 3600, 2)
    assert set(got["hours_by_jobs"]) == {"2", "16", "20"}


def test_unproved_version_is_refused_before_anything_runs(tmp_path):
    """0.33.0 has no object list yet: the proof stops at once, touching nothing."""
    from launcher.errors import LauncherError

    opts = proof.ProofRun(target="linux-amd64", vllm_version="0.33.0", root=tmp_path / "root",
                          sources=tmp_path / "sources", results_dir=tmp_path / "results")
    with pytest.raises(LauncherError, match="no object list for vLLM 0.33.0"):
        proof.run(opts, lambda line: None)
    assert not (tmp_path / "root").exists() and not (tmp_path / "results").exists()
