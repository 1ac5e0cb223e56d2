"""Build targets: what each platform builds, validated once at load time.

The data lives in ``build/targets.yaml`` (shipped in the wheel as
``launcher/_data/build/targets.yaml``) so the arch facts sit in one reviewable
file; this module turns it into typed objects and derives the gencodes the
toolchain preflight must prove it can emit.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Literal

import yaml
from packaging.version import Version
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from launcher.errors import LauncherError
from launcher.paths import data_path

_ARCH = re.compile(r"^(\d+)\.(\d)([af]?)(\+PTX)?$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VersionPins(_Strict):
    """What one vLLM release expects around it (from its requirements/cuda.txt)."""

    torch: str
    torchvision: str
    torchaudio: str
    cuda: str
    torch_index: str
    flashinfer: str
    use_existing_torch: str

    @property
    def cuda_tag(self) -> str:
        return "cu" + self.cuda.replace(".", "")


class CompilerRange(_Strict):
    min: int
    max: int
    products: str | None = None


class JobPolicy(_Strict):
    gb_per_compile_thread: int = Field(gt=0)
    max_nvcc_threads: int = Field(ge=1)


class Target(_Strict):
    """One build platform. Arch strings use vLLM/torch's ``12.0``, ``12.0a``, ``12.0f``, ``+PTX`` spelling."""

    name: str = ""
    description: str
    os: Literal["linux", "windows"]
    machine: str
    gpu: str
    compute_capability: str
    cuda_min: str
    cuda_max_major: int
    torch_cuda_arch_list: str
    vllm_cuda_archs: str
    kernel_archs: str
    flashinfer_cuda_arch_list: str | None
    host_compiler: Literal["gcc", "msvc"]
    source: Literal["pypi-sdist", "checkout"]
    source_hint: str | None = None
    requires_build_patch: str | None = None
    sm_tag: str
    platform_tag: str
    hours: str
    disk_gb: int
    env: dict[str, str] = {}
    runtime_env: dict[str, str] = {}
    notes: list[str] = []

    @field_validator("torch_cuda_arch_list", "vllm_cuda_archs", "kernel_archs", "flashinfer_cuda_arch_list")
    @classmethod
    def _archs_parse(cls, value: str | None) -> str | None:
        if value is not None:
            for arch in split_archs(value):
                if not _ARCH.match(arch):
                    raise ValueError(f"arch {arch!r} is not in the form 12.0, 12.0a, 12.0f or 12.0+PTX")
        return value

    def local_version(self, pins: VersionPins) -> str:
        """The wheel's local version label, e.g. ``cu130sm121``."""
        return f"{pins.cuda_tag}{self.sm_tag}"

    def probe_gencodes(self) -> list[str]:
        """Every code the build asks nvcc for: torch's list, vLLM's kernels, FlashInfer's list."""
        codes: list[str] = []
        for field in (self.torch_cuda_arch_list, self.kernel_archs, self.flashinfer_cuda_arch_list):
            for arch in split_archs(field or ""):
                for code in gencodes(arch):
                    if code not in codes:
                        codes.append(code)
        return codes


class TargetsFile(_Strict):
    default_vllm_version: str
    vllm_versions: dict[str, VersionPins]
    arch_min_cuda: dict[str, str]
    host_compilers: dict[str, CompilerRange]
    jobs: JobPolicy
    targets: dict[str, Target]

    def target(self, name: str) -> Target:
        try:
            return self.targets[name]
        except KeyError:
            raise LauncherError(
                f"unknown build target {name!r}", hint=f"choose one of: {', '.join(self.targets)}"
            ) from None

    def pins(self, version: str | None) -> tuple[str, VersionPins]:
        version = version or self.default_vllm_version
        try:
            return version, self.vllm_versions[version]
        except KeyError:
            raise LauncherError(
                f"no build pins for vLLM {version}",
                hint=f"supported versions: {', '.join(self.vllm_versions)} (build/targets.yaml)",
            ) from None

    def min_cuda_for(self, code: str) -> Version | None:
        found = self.arch_min_cuda.get(code)
        return Version(found) if found else None


def split_archs(value: str) -> list[str]:
    """``"12.0a 12.1a"`` or ``"12.0;12.1"`` -> list (both separators are accepted by torch and vLLM)."""
    return [a for a in re.split(r"[;\s]+", value.strip()) if a]


def gencodes(arch: str) -> list[str]:
    """nvcc codes for one arch entry: ``12.0a+PTX`` -> ``sm_120a``, ``compute_120a``."""
    m = _ARCH.match(arch)
    if not m:
        raise ValueError(f"bad arch {arch!r}")
    major, minor, suffix, ptx = m.groups()
    num = f"{major}{minor}{suffix}"
    codes = [f"sm_{num}"]
    if ptx:
        codes.append(f"compute_{num}")
    return codes


@functools.lru_cache(maxsize=4)
def _load_cached(path: str, mtime: float) -> TargetsFile:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LauncherError(f"cannot read build targets {path}: {exc}") from exc
    try:
        parsed = TargetsFile.model_validate(raw)
    except ValidationError as exc:
        raise LauncherError(f"invalid build targets {path}: {exc}") from exc
    named = {name: t.model_copy(update={"name": name}) for name, t in parsed.targets.items()}
    return parsed.model_copy(update={"targets": named})


def load(path: Path | None = None) -> TargetsFile:
    """The validated targets file (``build/targets.yaml`` unless ``path`` is given)."""
    path = path or data_path("build", "targets.yaml")
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise LauncherError(f"build targets file missing: {path}") from exc
    return _load_cached(str(path), mtime)
