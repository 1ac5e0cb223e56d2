"""Build proof, the pure half: what to compile, what codes to expect, how to sum it up.

``build/proof.yaml`` names the objects the recipe runs on sm_120 / sm_121;
this module validates it, turns an arch list into the fatbin entries
cuobjdump must show, classifies the objects of a generated build, and
extrapolates a full build from the measured ones. Nothing here runs a
process, so all of it is unit-tested in CI.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launcher.errors import LauncherError
from launcher.paths import data_path

_ARCH = re.compile(r"^(\d+)\.(\d+)([af]?)(\+PTX)?$")
_ELF_MACHINES = {3: "x86", 62: "x86-64", 183: "aarch64"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class SourcePin(_Strict):
    """One configure-time download of vLLM's CMake and the variable that replaces it with a local copy."""

    env: str
    pinned_in: str
    pinned_regex: str
    repository: str


class ProofObject(_Strict):
    source: str  # path in the vLLM tree, as CMake compiles it
    role: str
    arch_group: str  # the CMake variable whose declaration sets the object's codes
    klass: str = Field(alias="class")  # for the extrapolation
    # An SM12x kernel: its codes must also equal the target's planned kernel_archs.
    sm12x: bool = False


class ClassRule(_Strict):
    klass: str = Field(alias="class")
    regex: str

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        re.compile(value)
        return value


class ClassSample(_Strict):
    klass: str = Field(alias="class")
    match: str


class VllmProof(_Strict):
    sources: dict[str, SourcePin]
    objects: list[ProofObject]
    class_samples: list[ClassSample] = []
    classes: list[ClassRule]
    without_build_patch: str | None = None


class FlashinferProof(_Strict):
    family: str
    module: str
    object_regex: str
    role: str


class ProofFile(_Strict):
    vllm: dict[str, VllmProof]
    flashinfer: dict[str, FlashinferProof]

    def for_vllm(self, version: str) -> VllmProof:
        return _entry(self.vllm, version, f"object list for vLLM {version}")

    def for_flashinfer(self, version: str) -> FlashinferProof:
        return _entry(self.flashinfer, version, f"FlashInfer kernel family for flashinfer {version}")


def _entry(table: dict, version: str, what: str):
    if version not in table:
        raise LauncherError(f"build/proof.yaml has no {what}", hint=f"proved versions: {', '.join(table)}")
    return table[version]


@functools.lru_cache(maxsize=2)
def _load(path: str, mtime: float) -> ProofFile:
    try:
        return ProofFile.model_validate(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise LauncherError(f"invalid build proof list {path}: {exc}") from exc


def load(path: Path | None = None) -> ProofFile:
    path = path or data_path("build", "proof.yaml")
    try:
        return _load(str(path), path.stat().st_mtime)
    except OSError as exc:
        raise LauncherError(f"build proof list missing: {path}") from exc


# ------------------------------------------------------------------ codes


def fatbin_codes(archs: str) -> list[str]:
    """What vLLM's ``set_gencode_flags_for_srcs`` puts into an object for a resolved arch list,
    in cuobjdump's words: ``12.0f`` -> ``elf sm_120f``; ``8.0+PTX`` -> ``elf sm_80``, ``ptx sm_80``.
    (cuobjdump names a PTX entry by ``sm_``, as the preflight's parser reads it.)"""
    codes: list[str] = []
    for arch in (a for a in re.split(r"[;\s]+", archs.strip()) if a):
        m = _ARCH.match(arch)
        if not m:
            raise ValueError(f"bad arch {arch!r}")
        num = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        codes.append(f"elf sm_{num}")
        if m.group(4):
            codes.append(f"ptx sm_{num}")
    return sorted(set(codes))


def elf_machine(header: bytes) -> str:
    """The host architecture of an ELF object from its header (e_machine at offset 18)."""
    if len(header) < 20 or header[:4] != b"\x7fELF":
        raise ValueError("not an ELF object")
    order = "little" if header[5] == 1 else "big"
    number = int.from_bytes(header[18:20], order)
    return _ELF_MACHINES.get(number, f"e_machine {number}")


# ------------------------------------------------------------------ extrapolation


def classify(objects: list[str], rules: list[ClassRule]) -> dict[str, int]:
    """Count a build's object paths per class (first matching rule wins; unmatched -> "other")."""
    counts: dict[str, int] = {}
    compiled = [(r.klass, re.compile(r.regex)) for r in rules]
    for obj in objects:
        klass = next((k for k, rx in compiled if rx.search(obj)), "other")
        counts[klass] = counts.get(klass, 0) + 1
    return counts


def extrapolate(counts: dict[str, int], seconds: dict[str, list[float]], jobs: int) -> dict:
    """Full-build compile time: objects per class x mean measured seconds of that class / jobs.

    A class nothing was measured for is listed under ``unmeasured`` and left out of the sum,
    so the number is a floor, and says so. Link steps are not included.
    """
    if jobs < 1:
        raise ValueError("jobs must be >= 1")
    per_class = {}
    total = 0.0
    unmeasured = {}
    for klass, n in sorted(counts.items()):
        times = seconds.get(klass) or []
        if not times:
            unmeasured[klass] = n
            continue
        mean = sum(times) / len(times)
        per_class[klass] = {"objects": n, "s_per_object": round(mean, 1), "measured": len(times),
                            "serial_h": round(n * mean / 3600, 2)}
        total += n * mean
    return {
        "jobs": jobs,
        "classes": per_class,
        "unmeasured": unmeasured,
        "serial_h": round(total / 3600, 2),
        "hours": round(total / jobs / 3600, 2),
    }


def pinned_revision(text: str, regex: str) -> str | None:
    m = re.search(regex, text)
    return m.group(1) if m else None


def source_record(name: str, pin: SourcePin, pinned: str | None, stamp: dict | None, path: str) -> dict:
    """How a configure-time download was supplied, and whether it differs from the pin.

    ``stamp`` is the ``.proof-source.json`` left in the folder by whoever made the local
    copy (``revision`` = a commit, ``describe`` = a tag, ``note``, ``missing_files``)."""
    rec = {"name": name, "repository": pin.repository, "pinned": pinned, "path": path, "env": pin.env}
    if not stamp:
        rec["used"] = None
        rec["deviation"] = "revision of the local copy unknown (no .proof-source.json)"
        return rec
    used = stamp.get("revision")
    rec["used"] = used
    rec["describe"] = stamp.get("describe")
    for key in ("how", "note", "missing_files", "submodules"):
        if stamp.get(key):
            rec[key] = stamp[key]
    same = pinned is not None and pinned in {used, stamp.get("describe")}
    rec["deviation"] = None if same else stamp.get("note") or f"pinned {pinned}, used {used}"
    return rec


def result(*, vllm: str, target: str, configure_s: float, objects: list[dict], extrapolation: dict,
           **extra) -> dict:
    """The build-proof JSON (build/results/build-proof-<version>-<target>.json)."""
    return {
        "vllm": vllm,
        "target": target,
        "configure_s": round(configure_s, 1),
        "objects": objects,
        "extrapolated_full_build_h": extrapolation["hours"],
        "extrapolation": extrapolation,
        "all_codes_match": all(o.get("match") for o in objects),
        **extra,
    }


def object_record(*, source: str, role: str, klass: str, codes: list[str], expected: list[str],
                  compile_s: float, peak_rss_mb: float, host_code: str) -> dict:
    return {
        "source": source,
        "role": role,
        "class": klass,
        "codes": sorted(codes),
        "expected": sorted(expected),
        "match": sorted(codes) == sorted(expected),
        "compile_s": round(compile_s, 1),
        "peak_rss_mb": round(peak_rss_mb),
        "host_code": host_code,
    }
