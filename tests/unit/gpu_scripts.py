"""Load the GPU harness scripts (tests/gpu/<group>/*.py, not a package) as modules for CPU tests."""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

GPU_DIR = Path(__file__).resolve().parents[1] / "gpu"


def script(name: str) -> Path:
    """The harness script ``name`` (e.g. "served"), in whichever group folder holds it."""
    found = sorted(GPU_DIR.glob(f"*/{name}.py"))
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} harness scripts named {name}.py under {GPU_DIR}")
    return found[0]


def copy_harness(dest: Path) -> Path:
    """The harness's Python and bars.yaml into ``dest`` (a tests/gpu of a stand-in tree), each
    module in its group folder, as remote.sh finds them; returns ``dest``."""
    for f in [*GPU_DIR.glob("*.py"), *GPU_DIR.glob("*/*.py"), GPU_DIR / "bars.yaml"]:
        target = dest / f.relative_to(GPU_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(f.read_bytes())
    return dest


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"gpu_{name}", script(name))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def tiny_gemma4_target(layers: int = 6):
    """A small random Gemma 4 target of the trained target's make (make_checkpoints' shape, the
    corpus tokenizer's special ids), float32 on the CPU, in eval: (model, its config dict)."""
    import torch
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration

    mc, tt = load("make_checkpoints"), load("train_target")
    shape = mc.TargetShape("t", layers, hidden_size=64, num_attention_heads=2, num_key_value_heads=1,
                           num_global_key_value_heads=1, num_experts=4, moe_intermediate_size=16,
                           intermediate_size=32, sliding_window=8)
    ids = {k: v for k, v in tt.lm_files.CONFIG_IDS.items() if k != "mask_token_id"}
    cfg = mc.gemma4_config_dict(shape, vocab=256, ids=ids, max_positions=512)
    config = Gemma4Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    config.architectures = ["Gemma4ForConditionalGeneration"]
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration._from_config(config, attn_implementation="eager", dtype=torch.float32)
    return model.eval(), cfg


def pip_target(name: str, requirements: list[str]) -> Path:
    """``pip install --no-deps --target`` once into the cache; safe against concurrent runs
    (a file lock, and the finished tree renamed into place)."""
    key = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:12]
    from launcher.paths import cache_dir

    base = cache_dir() / "pip-targets"
    base.mkdir(parents=True, exist_ok=True)
    final = base / f"{name}-{key}"
    if (final / ".complete").exists():
        return final
    with open(base / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits while another run installs
        if (final / ".complete").exists():
            return final
        work = Path(tempfile.mkdtemp(dir=base, prefix=f".{final.name}-"))
        os.chmod(work, 0o755)
        try:
            proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                                   "--disable-pip-version-check", "--target", str(work), *requirements],
                                  capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"pip install {requirements} failed:\n{proc.stdout}\n{proc.stderr}")
            (work / ".complete").write_text("\n".join(requirements) + "\n")
            if final.exists():
                shutil.rmtree(final)  # an interrupted older attempt
            os.rename(work, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return final


def transformers_517() -> Path:
    # 5.17.0's Requires-Dist against the venv: tokenizers>=0.23.1,<0.24 is newer
    # than the venv's 0.22; huggingface-hub>=1.5, safetensors>=0.8, regex, numpy,
    # packaging, pyyaml, typer and tqdm are already satisfied by it.
    return pip_target("transformers-5.17.0", ["transformers==5.17.0", "tokenizers>=0.23.1,<0.24"])


class StandInServer:
    """A curve server's place in CPU tests (vLLM cannot run here): a base URL, a model name and
    an id; entering and leaving it starts and stops nothing."""

    server_id = "stand-in"

    def __init__(self, *args, **kwargs):
        self.base, self.model, self.id = "http://127.0.0.1:1", "m", self.server_id

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def json_tar(path: Path, members: dict[str, object]) -> Path:
    """An xz tarball at ``path`` of JSON members (name -> object), as the GPU host's raw archives
    hold them; returns ``path``."""
    import io
    import json
    import tarfile

    with tarfile.open(path, "w:xz") as tar:
        for name, obj in members.items():
            data = json.dumps(obj).encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
