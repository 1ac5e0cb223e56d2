"""What machine the launcher runs on: GPUs via NVML, OS, WSL.

NVML (nvidia-ml-py) answers without CUDA or torch, in milliseconds, and
fails cleanly where no driver exists (CI, laptops); the failure text is kept
so preflight can say what to install.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float
    unified_memory: bool = False

    @property
    def sm(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass
class HostInfo:
    system: str  # Linux | Windows | Darwin
    machine: str  # x86_64 | aarch64 | AMD64 ...
    wsl: bool
    driver: str | None = None
    gpus: list[GpuInfo] = field(default_factory=list)
    nvml_error: str | None = None
    # Network interfaces -> their IPv4 addresses (multi-node: the NCCL/Gloo/UCX interface
    # must exist here). None: not looked at (a test) or the OS would not say.
    interfaces: dict[str, list[str]] | None = None

    @property
    def gpu(self) -> GpuInfo | None:
        return self.gpus[0] if self.gpus else None


def in_wsl() -> bool:
    if platform.system() != "Linux":
        return False
    if os.environ.get("WSL_DISTRO_NAME") or os.environ.get("WSL_INTEROP"):
        return True
    try:
        with open("/proc/sys/kernel/osrelease", encoding="ascii") as fh:
            return "microsoft" in fh.read().lower()
    except OSError:
        return False


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / (1024 * 1024)
    except OSError:
        pass
    return 0.0


def network_interfaces() -> dict[str, list[str]] | None:
    """Every interface of this machine and its IPv4 address (Linux: SIOCGIFADDR; elsewhere names only)."""
    import socket

    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError):
        return None
    out: dict[str, list[str]] = {}
    for name in names:
        out[name] = _ipv4(name)
    return out


def _ipv4(name: str) -> list[str]:
    import socket
    import struct

    try:
        import fcntl
    except ImportError:  # Windows
        return []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            raw = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError:
            return []
    return [socket.inet_ntoa(raw[20:24])]


def probe() -> HostInfo:
    host = HostInfo(system=platform.system(), machine=platform.machine(), wsl=in_wsl())
    host.interfaces = network_interfaces()
    try:
        import pynvml
    except ImportError:
        host.nvml_error = "nvidia-ml-py is not installed"
        return host
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        host.nvml_error = f"NVML could not start ({exc}): no NVIDIA driver found"
        return host
    try:
        host.driver = _text(pynvml.nvmlSystemGetDriverVersion())
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            host.gpus.append(_gpu(pynvml, i, handle))
    except pynvml.NVMLError as exc:
        host.nvml_error = f"NVML query failed: {exc}"
    finally:
        pynvml.nvmlShutdown()
    return host


def _gpu(pynvml, index: int, handle) -> GpuInfo:
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    try:
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total / 2**30
        unified = False
    except pynvml.NVMLError:
        # GB10 (DGX Spark) has no dedicated framebuffer: NVML reports memory as
        # not supported; the GPU shares the host's unified memory.
        memory, unified = _mem_total_gib(), True
    return GpuInfo(index, _text(pynvml.nvmlDeviceGetName(handle)), (major, minor), round(memory, 1), unified)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
