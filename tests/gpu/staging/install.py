"""The received bundles installed on the GPU host: a vLLM release into its own folder, the extras into theirs.

``remote.sh install``, ``install-v33`` and ``extras`` call this once ``parts.py`` has the parts:

    install.py bundle STEM SITE REQUIREMENTS   the vLLM bundle STEM (``site/`` laid out as
        site-packages, ``wheels/`` pip-installed with the requirements' exact pins, so a stale
        wheel in the bundle is ignored) into SITE, once: ``SITE/.bundle-installed`` marks it
    install.py extras                          every ``extras*`` bundle received, in name order
        (``extras-update-drafter`` lands over ``extras-trained``'s drafter): FA2 into the
        installed 0.21.0 and its patched copy, checkpoints into the model folders, modelopt's
        wheels into a folder of their own (``extras-ray``'s Ray into another); ``SITE/.<stem>-installed``
        holds the sha256 installed

Folders (the environment remote.sh sets, the same defaults): ``BUNDLE_DIR``, ``WORK``, ``SITE``,
``SITE_PATCHED``, ``MODELS_RS``, ``MODELS_TRAINED``, ``SITE_QUANT``, ``SITE_RAY``; ``PY`` runs pip and the
import checks. A part missing or failing its sha256 installs nothing (``parts.assemble``).
"""

from __future__ import annotations

import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parts  # noqa: E402

FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"
RAY_STEM = "extras-ray"  # stage.py --ray


@dataclass(frozen=True)
class Host:
    """Where the host keeps what it received and what it installs (remote.sh's variables)."""

    bundle_dir: Path
    work: Path
    site: Path
    site_patched: Path
    models_rs: Path
    models_trained: Path
    site_quant: Path
    py: str
    # Ray (extras-ray) apart from modelopt's wheels: only the Ray plans' checks put it on PYTHONPATH
    site_ray: Path = Path("/tmp/site-ray")

    @classmethod
    def from_env(cls, env=os.environ) -> "Host":
        get = lambda key, default: Path(env.get(key) or default)  # noqa: E731
        return cls(get("BUNDLE_DIR", "/tmp/vllm-bundle"), get("WORK", "/tmp/gpu-proof"), get("SITE", "/tmp/site"),
                   get("SITE_PATCHED", "/tmp/site-patched"), get("MODELS_RS", "/tmp/models-rs"),
                   get("MODELS_TRAINED", "/tmp/models-trained"), get("SITE_QUANT", "/tmp/site-quant"),
                   env.get("PY") or sys.executable, get("SITE_RAY", "/tmp/site-ray"))


class Joined(io.RawIOBase):
    """The parts read one after another as one stream."""

    def __init__(self, paths: list[Path]):
        self.files = [open(p, "rb") for p in paths]

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self.files:
            n = self.files[0].readinto(buf)
            if n:
                return n
            self.files.pop(0).close()
        return 0

    def close(self) -> None:
        for fh in self.files:
            fh.close()
        super().close()


def unpack(host: Host, stem: str, dest: Path, compressed: bool) -> None:
    """STEM's parts, checked whole (``parts.assemble`` exits naming a missing or bad part),
    unpacked into a fresh ``dest`` (xz for a vLLM bundle)."""
    paths = parts.assemble(host.bundle_dir, stem)
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    with Joined(paths) as raw:
        stream = lzma.open(io.BufferedReader(raw)) if compressed else io.BufferedReader(raw)
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(dest, filter="tar")


def bundle(host: Host, stem: str, site: Path, requirements: Path) -> str:
    if (site / ".bundle-installed").is_file():
        return f"{stem} already installed in {site}"
    tmp = host.work / stem
    unpack(host, stem, tmp, compressed=True)
    site.mkdir(parents=True, exist_ok=True)
    subprocess.run([host.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                    "--upgrade", "--target", str(site), "--find-links", str(tmp / "wheels"), "-r", str(requirements)],
                   check=True)
    shutil.copytree(tmp / "site", site, dirs_exist_ok=True, symlinks=True)
    shutil.rmtree(tmp)
    (site / ".bundle-installed").touch()
    return f"{stem} installed in {site}"


def extras(host: Host) -> list[str]:
    said = []
    manifests = sorted(host.bundle_dir.glob("extras*.json"))
    for manifest in manifests:
        stem = manifest.stem
        sha = parts.manifest(host.bundle_dir, stem)["sha256"]
        marker = host.site / f".{stem}-installed"
        if marker.is_file() and marker.read_text().strip() == sha:
            said.append(f"{stem} already installed")
            continue
        tmp = host.work / "extras"
        unpack(host, stem, tmp, compressed=False)
        fa2 = tmp / "fa2" / "_vllm_fa2_C.abi3.so.xz"
        if fa2.is_file() and not (host.site / "vllm" / "vllm_flash_attn").is_dir():
            # the bundle's install has not made SITE yet: FA2 waits, unmarked, for the next extras
            said.append(f"{stem}: vLLM is not in {host.site} yet (remote.sh install): FA2 waits for the next extras")
            shutil.rmtree(tmp)
            continue
        if fa2.is_file():
            said.append(install_fa2(host, fa2))
        copy_tree(tmp / "models", host.models_rs)
        copy_tree(tmp / "models-trained", host.models_trained)
        wheels = sorted((tmp / "wheels").glob("*")) if (tmp / "wheels").is_dir() else []
        if wheels:  # apart from SITE: only the step that needs them puts them on PYTHONPATH
            target = host.site_ray if stem == RAY_STEM else host.site_quant
            subprocess.run([host.py, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation",
                            "--target", str(target), *map(str, wheels)], check=True)
        shutil.rmtree(tmp)
        # extras-trained holds only models: it may arrive before the bundle made SITE
        host.site.mkdir(parents=True, exist_ok=True)
        marker.write_text(sha + "\n")
        said.append(f"{stem} installed")
    if not manifests:
        said.append("no extras*.json staged (stage.py --extras): FA2 absent, FLASH_ATTN runs FA3")
    return said


def install_fa2(host: Host, xz: Path) -> str:
    """FA2 into SITE (and into a patched copy made before it arrived), then loaded once."""
    dest = host.site / FA2
    with lzma.open(xz) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
    if (host.site_patched / "vllm" / "vllm_flash_attn").is_dir():
        shutil.copyfile(dest, host.site_patched / FA2)
    check = subprocess.run([host.py, "-c", "import vllm.vllm_flash_attn._vllm_fa2_C as m; print('FA2 loads:', m.__file__)"],
                           env={**os.environ, "PYTHONPATH": str(host.site)}, capture_output=True, text=True)
    return check.stdout.strip() or f"FA2 copied into {dest}; it does not load here: {check.stderr.strip()[-300:]}"


def copy_tree(src: Path, dest: Path) -> None:
    if src.is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest, dirs_exist_ok=True, symlinks=True)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    host = Host.from_env()
    if args[:1] == ["bundle"] and len(args) == 4:
        print(bundle(host, args[1], Path(args[2]), Path(args[3])), flush=True)
        return 0
    if args == ["extras"]:
        for line in extras(host):
            print(line, flush=True)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
