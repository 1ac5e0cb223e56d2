"""The build plan: everything ``launcher build wheels`` will do, resolved before it starts.

``plan()`` is pure apart from reading the host (cores, memory, which of
nvcc/ccache/sccache/git exist) and the shipped series, so ``build plan`` works
on any machine, offline, and tests can pin the host with ``cores``/``mem_gb``.
The plan is printed by ``build plan``, written next to the wheels as the
build manifest's core, and executed step by step by ``launcher.builder.wheels``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from launcher.builder import toolchain
from launcher.builder.targets import JobPolicy, Target, TargetsFile, VersionPins, load, split_archs
from launcher.errors import LauncherError
from launcher.paths import cache_dir

FLASHINFER_GIT = "https://github.com/flashinfer-ai/flashinfer.git"


@dataclass(frozen=True)
class Step:
    """One command. ``cwd`` and argv may hold ``{src}``, ``{flashinfer}``, ``{dist}``, ``{work}``,
    ``{python}`` and ``{wheel:<dist-name>}`` (a wheel built by an earlier step), resolved at run time."""

    name: str
    argv: tuple[str, ...]
    cwd: str
    env: tuple[str, ...] = ()  # names of plan env vars this step adds on top of the build env
    why: str = ""


@dataclass(frozen=True)
class Jobs:
    cores: int
    mem_gb: int
    max_jobs: int
    nvcc_threads: int
    why: str


@dataclass(frozen=True)
class SeriesInfo:
    version: str | None
    hash: str | None
    patches: tuple[str, ...]
    build_patches: tuple[str, ...]
    note: str = ""


@dataclass
class BuildPlan:
    target: Target
    vllm_version: str
    pins: VersionPins
    source: str  # "pypi-sdist" or a checkout path
    source_detail: str
    series: SeriesInfo
    jobs: Jobs
    caches: dict[str, str]
    env: dict[str, str]
    flashinfer_env: dict[str, str]
    steps: list[Step]
    outputs: list[str]
    work_dir: Path
    output_dir: Path
    nvcc: str
    warnings: list[str] = field(default_factory=list)

    @property
    def local_version(self) -> str:
        return self.target.local_version(self.pins)

    @property
    def builds_flashinfer(self) -> bool:
        return self.target.flashinfer_cuda_arch_list is not None

    def to_dict(self) -> dict:
        return {
            "target": self.target.name,
            "description": self.target.description,
            "vllm_version": self.vllm_version,
            "local_version": self.local_version,
            "pins": self.pins.model_dump(),
            "source": self.source,
            "source_detail": self.source_detail,
            "series": asdict(self.series),
            "arch_lists": {
                "TORCH_CUDA_ARCH_LIST": self.target.torch_cuda_arch_list,
                "vllm_cuda_archs": self.target.vllm_cuda_archs,
                "sm12x_kernel_archs": self.target.kernel_archs,
                "FLASHINFER_CUDA_ARCH_LIST": self.target.flashinfer_cuda_arch_list,
                "probe_gencodes": self.target.probe_gencodes(),
            },
            "jobs": asdict(self.jobs),
            "caches": self.caches,
            "env": self.env,
            "flashinfer_env": self.flashinfer_env,
            "steps": [asdict(s) for s in self.steps],
            "outputs": self.outputs,
            "work_dir": str(self.work_dir),
            "output_dir": str(self.output_dir),
            "nvcc": self.nvcc,
            "runtime_env": self.target.runtime_env,
            "expected": {"hours": self.target.hours, "disk_gb": self.target.disk_gb},
            "notes": self.target.notes,
            "warnings": self.warnings,
        }

    def lines(self) -> list[str]:
        t = self.target
        out = [
            f"build plan: vLLM {self.vllm_version} for {t.name} ({t.description})",
            f"  source:       {self.source_detail}",
            f"  series:       {_series_line(self.series)}",
            f"  torch:        torch=={self.pins.torch} torchvision=={self.pins.torchvision} "
            f"torchaudio=={self.pins.torchaudio} from {self.pins.torch_index}",
            f"  CUDA:         >= {t.cuda_min}, < {t.cuda_max_major + 1} (found: {self.nvcc})",
            f"  host:         {t.os} {t.machine}, {'MSVC' if t.host_compiler == 'msvc' else 'GCC'}",
            "  arch lists:",
            f"    TORCH_CUDA_ARCH_LIST      = {t.torch_cuda_arch_list}",
            f"    vLLM CUDA_ARCHS (CMake)   = {t.vllm_cuda_archs}",
            f"    SM12x NVFP4/MoE kernels   = {t.kernel_archs}",
            f"    FLASHINFER_CUDA_ARCH_LIST = {t.flashinfer_cuda_arch_list or '(no FlashInfer build on this target)'}",
            f"    preflight probes          = {', '.join(t.probe_gencodes())}",
            f"  jobs:         MAX_JOBS={self.jobs.max_jobs} NVCC_THREADS={self.jobs.nvcc_threads} ({self.jobs.why})",
        ]
        out += [f"  cache:        {k}={v}" for k, v in self.caches.items()]
        out.append("  env (vLLM build):")
        out += [f"    {k}={v}" for k, v in self.env.items()]
        if self.flashinfer_env:
            out.append("  env (FlashInfer build, on top):")
            out += [f"    {k}={v}" for k, v in self.flashinfer_env.items()]
        out.append("  steps:")
        for i, s in enumerate(self.steps, 1):
            out.append(f"    {i}. {s.name}: (cd {s.cwd} && {' '.join(s.argv)})")
        out.append(f"  work dir:     {self.work_dir}")
        out.append(f"  output dir:   {self.output_dir}")
        out.append("  outputs:")
        out += [f"    {o}" for o in self.outputs]
        out.append(f"  expected:     {t.hours}; about {t.disk_gb} GB free disk")
        if t.runtime_env:
            out.append("  at run time:  " + " ".join(f"{k}={v}" for k, v in t.runtime_env.items()))
        out += [f"  note: {n}" for n in t.notes]
        out += [f"  warning: {w}" for w in self.warnings]
        return out


def _series_line(s: SeriesInfo) -> str:
    if s.hash is None:
        return s.note
    build = f" + build: {', '.join(s.build_patches)}" if s.build_patches else ""
    return f"vLLM {s.version} series {s.hash[:12]}: {', '.join(s.patches) or '(none)'}{build}"


# ------------------------------------------------------------------ resolution


def plan(
    target_name: str,
    vllm_version: str | None = None,
    *,
    source: str | None = None,
    work_dir: Path | None = None,
    output_dir: Path | None = None,
    cores: int | None = None,
    mem_gb: int | None = None,
    jobs: int | None = None,
    data: TargetsFile | None = None,
) -> BuildPlan:
    """Resolve the build of ``vllm_version`` (default: the pinned one) for ``target_name``."""
    data = data or load()
    target = data.target(target_name)
    version, pins = data.pins(vllm_version)
    warnings: list[str] = []

    src_kind, src_detail = _source(target, version, source)
    series = series_info(version)
    if target.requires_build_patch and target.requires_build_patch not in series.build_patches:
        raise LauncherError(
            f"target {target.name} needs the build patch {target.requires_build_patch!r}, "
            f"which the vLLM {version} series lacks",
            hint=f"add it under patches/vllm/{version}/build/ (see build/README.md)",
        )

    job = job_counts(target, data.jobs, cores=cores, mem_gb=mem_gb, override=jobs)
    work = Path(work_dir) if work_dir else cache_dir() / "build" / f"vllm-{version}-{target.name}"
    dist = Path(output_dir) if output_dir else Path.cwd() / "dist"
    caches = cache_env(target)
    nvcc_path = toolchain.find_nvcc_path()
    nvcc_text = "not found"
    cuda_home = None
    if nvcc_path:
        try:
            info = toolchain.nvcc_info(nvcc_path)
            nvcc_text = f"{nvcc_path} ({info.version_text})"
            cuda_home = info.cuda_home
        except (ValueError, OSError) as exc:
            nvcc_text = f"{nvcc_path} (unreadable: {exc})"
    else:
        warnings.append("nvcc not found on this host: `launcher build preflight` will say what to install")

    env = {
        "VLLM_TARGET_DEVICE": "cuda",
        "TORCH_CUDA_ARCH_LIST": target.torch_cuda_arch_list,
        "MAX_JOBS": str(job.max_jobs),
        "NVCC_THREADS": str(job.nvcc_threads),
        "CMAKE_BUILD_TYPE": "Release",
        # setup.py appends +cuXYZ only for a non-default CUDA; the override names the build exactly.
        "VLLM_VERSION_OVERRIDE": f"{version}+{target.local_version(pins)}",
        **caches,
        **target.env,
    }
    if cuda_home:
        env["CUDA_HOME"] = str(cuda_home)
    fi_env = {}
    if target.flashinfer_cuda_arch_list:
        # FlashInfer's AOT build compiles through torch, so torch's list follows FlashInfer's
        # for those steps (as vLLM's tools/flashinfer-build.sh does).
        fi_env = {
            "FLASHINFER_CUDA_ARCH_LIST": target.flashinfer_cuda_arch_list,
            "TORCH_CUDA_ARCH_LIST": target.flashinfer_cuda_arch_list,
        }
        if not shutil.which("git"):
            warnings.append("git not found: the FlashInfer source checkout needs it")
    if target.os == "linux" and not shutil.which("ccache") and not shutil.which("sccache"):
        warnings.append("neither ccache nor sccache found: rebuilds start from scratch (apt-get install ccache)")

    return BuildPlan(
        target=target,
        vllm_version=version,
        pins=pins,
        source=src_kind,
        source_detail=src_detail,
        series=series,
        jobs=job,
        caches=caches,
        env=env,
        flashinfer_env=fi_env,
        steps=steps(target, version, pins),
        outputs=output_names(target, version, pins),
        work_dir=work,
        output_dir=dist,
        nvcc=nvcc_text,
        warnings=warnings,
    )


def _source(target: Target, version: str, source: str | None) -> tuple[str, str]:
    if source and source != "pypi":
        path = Path(source).expanduser()
        if not (path / "setup.py").is_file() or not (path / "CMakeLists.txt").is_file():
            # refused here, so that `build plan` does not show a plan `build wheels` refuses
            raise LauncherError(f"--source {path} is not a vLLM source tree (no setup.py + CMakeLists.txt)",
                                hint="pass a vLLM checkout, or leave --source out to build from the PyPI sdist")
        return str(path), f"checkout {path} (patched in place)"
    if target.source == "checkout":
        return "checkout", f"a checkout passed with --source: {target.source_hint}"
    return "pypi-sdist", f"PyPI sdist vllm-{version}.tar.gz (unpacked into the work dir; the download cache is not modified)"


def series_info(version: str) -> SeriesInfo:
    try:
        from launcher.patching.series import series_for
    except ImportError:  # the engine ships with the launcher; this guards a broken install
        return SeriesInfo(None, None, (), (), "patch engine not importable")
    try:
        s = series_for(version)
    except LauncherError as exc:  # no series for this version, or a malformed patch file
        return SeriesInfo(None, None, (), (), f"no series for vLLM {version}: {exc}")
    return SeriesInfo(s.version, s.hash, tuple(p.id for p in s.patches), tuple(p.id for p in s.build_patches))


def job_counts(
    target: Target, policy: JobPolicy, *, cores: int | None = None, mem_gb: int | None = None, override: int | None = None
) -> Jobs:
    """MAX_JOBS is a budget of compile threads (setup.py divides it by NVCC_THREADS):
    one per core, and no more than memory allows at ``gb_per_compile_thread`` each."""
    cores = cores or host_cores()
    mem_gb = mem_gb if mem_gb is not None else host_mem_gb()
    per_file = len(split_archs(target.vllm_cuda_archs))
    # --threads only parallelises across the codes of one file; more threads than codes buy nothing.
    threads = max(1, min(policy.max_nvcc_threads, per_file))
    by_mem = max(1, mem_gb // policy.gb_per_compile_thread)
    if override:
        return Jobs(cores, mem_gb, override, threads, "set with --jobs")
    max_jobs = max(threads, min(cores, by_mem))
    limit = "cores" if cores <= by_mem else f"memory ({mem_gb} GB / {policy.gb_per_compile_thread} GB per compile thread)"
    why = f"{cores} cores, {mem_gb} GB RAM: limited by {limit}"
    return Jobs(cores, mem_gb, max_jobs, threads, why)


def cache_env(target: Target) -> dict[str, str]:
    """Compiler and download caches that survive between builds (vLLM's setup.py picks the launcher)."""
    root = cache_dir() / "build-cache"
    env = {"FETCHCONTENT_BASE_DIR": str(root / "fetchcontent")}
    if shutil.which("sccache"):
        env["SCCACHE_DIR"] = str(root / "sccache")
    elif shutil.which("ccache") or target.os == "linux":
        # Set even before ccache is installed so the first build after installing it is cached.
        env["CCACHE_DIR"] = str(root / "ccache")
    # A value already in the environment wins: image builds point these at their cache mounts.
    return {k: os.environ.get(k) or v for k, v in env.items()}


# Steps every part needs: vLLM and FlashInfer both compile against the same torch.
_SHARED_STEPS = ("torch", "build requirements")
PARTS = ("flashinfer", "vllm")


def select_steps(all_steps: list[Step], only: str | None) -> list[Step]:
    """The steps of one part (``flashinfer`` or ``vllm``), so an image can build
    FlashInfer and vLLM in separate, separately cached stages."""
    if only is None:
        return all_steps
    if only not in PARTS:
        raise LauncherError(f"--only {only!r}: expected one of {', '.join(PARTS)}")
    return [s for s in all_steps if s.name in _SHARED_STEPS or s.name.split()[0].split("-")[0] == only]


def steps(target: Target, version: str, pins: VersionPins) -> list[Step]:
    py = "{python}"
    out = [
        Step(
            "torch",
            (py, "-m", "pip", "install", f"torch=={pins.torch}", f"torchvision=={pins.torchvision}",
             f"torchaudio=={pins.torchaudio}", "--index-url", pins.torch_index),
            "{work}",
            why=f"vLLM {version} is built against the existing torch (use_existing_torch.py strips its pins)",
        ),
        Step(
            "build requirements",
            (py, "-m", "pip", "install", "-r", "requirements/build/cuda.txt"),
            "{src}",
            why="cmake, ninja, setuptools-scm... (torch already stripped from the list)",
        ),
    ]
    if target.flashinfer_cuda_arch_list:
        fi = pins.flashinfer
        out += [
            Step(
                "flashinfer source",
                ("git", "clone", "--depth", "1", "--branch", f"v{fi}", "--recurse-submodules",
                 "--shallow-submodules", FLASHINFER_GIT, "{flashinfer}"),
                "{work}",
                why=f"FlashInfer {fi}: the version vLLM {version} pins",
            ),
            Step("flashinfer-python", (py, "-m", "pip", "wheel", "--no-deps", "-w", "{dist}", "."), "{flashinfer}"),
            Step("flashinfer-cubin", (py, "-m", "pip", "wheel", "--no-deps", "-w", "{dist}", "."),
                 "{flashinfer}/flashinfer-cubin"),
            Step("flashinfer-python install", (py, "-m", "pip", "install", "--no-deps", "{wheel:flashinfer_python}"),
                 "{work}", why="the jit-cache build imports flashinfer"),
            Step(
                "flashinfer-jit-cache",
                (py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", "{dist}", "."),
                "{flashinfer}/flashinfer-jit-cache",
                env=("FLASHINFER_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST"),
                why="AOT kernels for FLASHINFER_CUDA_ARCH_LIST (the long FlashInfer step)",
            ),
        ]
    out.append(
        Step(
            "vllm",
            (py, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", "{dist}", "."),
            "{src}",
            why="the hours-long compile; --no-build-isolation uses the torch installed above",
        )
    )
    return out


def output_names(target: Target, version: str, pins: VersionPins) -> list[str]:
    plat = target.platform_tag
    names = [f"vllm-{version}+{target.local_version(pins)}-*-{plat}.whl"]
    if target.flashinfer_cuda_arch_list:
        fi = pins.flashinfer
        # jit-cache tags itself cp39-abi3-manylinux_2_28_<arch> (its build_backend.py).
        names += [
            f"flashinfer_python-{fi}-*.whl",
            f"flashinfer_cubin-{fi}-*.whl",
            f"flashinfer_jit_cache-{fi}-*.whl",
        ]
    names.append(f"build-manifest-vllm-{version}-{target.name}.json")
    return names


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def host_mem_gb() -> int:
    if sys.platform == "win32":

        class _Status(ctypes.Structure):
            _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                        ("ullTotalPhys", ctypes.c_ulonglong), ("ullAvailPhys", ctypes.c_ulonglong),
                        ("ullTotalPageFile", ctypes.c_ulonglong), ("ullAvailPageFile", ctypes.c_ulonglong),
                        ("ullTotalVirtual", ctypes.c_ulonglong), ("ullAvailVirtual", ctypes.c_ulonglong),
                        ("ullAvailExtendedVirtual", ctypes.c_ulonglong)]

        st = _Status()
        st.dwLength = ctypes.sizeof(_Status)
        ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(st))  # type: ignore[attr-defined]
        return int(st.ullTotalPhys // 2**30)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**30)
