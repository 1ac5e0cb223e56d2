"""Installable wheels of a released vLLM's Python files, for `launcher install` tests.

The real wheels are hundreds of megabytes and need torch; these hold the
released files the engine reads and the series touches (byte for byte, from
PyPI through ``patch_trees.mini_tree``), with metadata that names vLLM and
the release and requires nothing. pip installs them for real, from a folder
or from a local index laid out as PyPI's simple API (PEP 503).
"""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

from tests.integration.patch_trees import mini_tree
from tests.integration.test_plan_patch_state import _touched_files


def stand_in_wheel(version: str, folder: Path, local: str = "") -> Path:
    """``folder/vllm-VERSION[+LOCAL]-py3-none-any.whl``; return its path."""
    full = f"{version}+{local}" if local else version
    tree = mini_tree(version, "site-packages", folder / f".tree-{full}", _touched_files(version))
    info = f"vllm-{full}.dist-info"
    files = {p.relative_to(tree).as_posix(): p.read_bytes()
             for p in sorted((tree / "vllm").rglob("*")) if p.is_file()}
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: vllm\nVersion: {full}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = [f"{rel},sha256={_digest(data)},{len(data)}" for rel, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join(record + [f"{info}/RECORD,,"]) + "\n").encode()
    path = folder / f"vllm-{full}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for rel, data in files.items():
            whl.writestr(rel, data)
    return path


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index at ``root`` serving ``wheels`` as the project vllm; its file:// URL."""
    project = root / "vllm"
    project.mkdir(parents=True, exist_ok=True)
    links = []
    for wheel in wheels:
        target = project / wheel.name
        target.write_bytes(wheel.read_bytes())
        links.append(f'<a href="{wheel.name}#sha256={hashlib.sha256(target.read_bytes()).hexdigest()}">{wheel.name}</a>')
    (project / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "index.html").write_text('<!DOCTYPE html><html><body><a href="vllm/">vllm</a></body></html>\n')
    return root.as_uri()
