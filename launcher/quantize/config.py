"""What one ``launcher quantize`` run was asked to do, validated before anything heavy loads.

Every refusal here happens in well under a second and changes nothing on disk:
a bad flag must not cost the user a model load (minutes for a 26B model) or
an hour of calibration.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LauncherError
from launcher.quantize.calibration import has_tokenizer



def install_hint() -> str:
    """How to add the quantize extra. The launcher is not on PyPI: it installs from a
    checkout, and an editable install knows where that checkout is."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return f"pip install -e '{checkout}[quantize]'"
    return "pip install -e '.[quantize]' in a clone of the vllm-sm12x repository (the launcher is not on PyPI)"


# name -> nvidia-modelopt config attribute
ALGORITHMS = {
    "nvfp4": "NVFP4_DEFAULT_CFG",
    "nvfp4-awq-lite": "NVFP4_AWQ_LITE_CFG",
}

# Known not to survive export on some architectures: refused before the
# model loads. nvidia-modelopt 0.47.0's AWQ-lite calibrates Gemma 4 but its
# export fails on the fused experts ("object of type 'QuantGemma4TextExperts'
# has no len()"), after the whole calibration has run.
_REFUSED = {
    ("nvfp4-awq-lite", "gemma4"): (
        "AWQ-lite fails at export on Gemma 4 MoE experts with nvidia-modelopt 0.47.0 "
        "(\"object of type 'QuantGemma4TextExperts' has no len()\"), after calibration has run"
    ),
}

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class QuantizeConfig:
    """One quantization run.

    ``out`` is only ever written by renaming a finished temporary sibling onto
    it, so it is either the old content (or absent) or a validated checkpoint.
    """

    model: Path
    out: Path
    algorithm: str = "nvfp4"
    calib_samples: int = 64
    calib_seq_len: int = 512
    calib_file: Path | None = None
    device: str = "auto"
    force: bool = False
    seed: int = 0

    @property
    def modelopt_config_name(self) -> str:
        return ALGORITHMS[self.algorithm]

    def validate(self) -> None:
        model, out = self.model, self.out
        if not model.is_dir():
            raise LauncherError(f"--model {model} is not a directory")
        if not (model / "config.json").is_file():
            raise LauncherError(f"--model {model} has no config.json", hint="point --model at a Hugging Face checkpoint folder")
        if out.resolve() == model.resolve():
            raise LauncherError("--out must differ from --model", hint="write the NVFP4 checkpoint to a new folder")
        if out.resolve().is_relative_to(model.resolve()):
            raise LauncherError(f"--out {out} lies inside --model {model}", hint="write it next to the model instead")
        if model.resolve().is_relative_to(out.resolve()):
            # Publishing renames --out away and deletes it: the source model
            # (and anything beside it in --out) would go with it.
            raise LauncherError(f"--out {out} contains --model {model}; replacing it would delete the model",
                                hint="write the NVFP4 checkpoint to a folder of its own, next to the model")
        if out.exists() and not out.is_dir():
            raise LauncherError(f"--out {out} exists and is not a directory")
        linked = _links_into(model, out) if out.is_dir() else []
        if linked:
            # Publishing replaces --out: the files these links point at would be
            # deleted, and the links would then name the NVFP4 output.
            raise LauncherError(
                f"--model {model} links into --out {out} ({', '.join(linked[:3])}); replacing --out would "
                "replace the model's own files",
                hint="write the NVFP4 checkpoint to a folder the model does not link into",
            )
        if out.is_dir() and any(out.iterdir()) and not self.force:
            raise LauncherError(
                f"--out {out} is not empty",
                hint="pass --force to replace it (it is only replaced once the new checkpoint is complete)",
            )
        if not out.parent.is_dir():
            raise LauncherError(f"the parent of --out ({out.parent}) does not exist")
        if not os.access(out.parent, os.W_OK):
            raise LauncherError(f"the parent of --out ({out.parent}) is not writable")
        if self.algorithm not in ALGORITHMS:
            raise LauncherError(f"unknown --algorithm {self.algorithm!r}", hint=f"choose one of {', '.join(ALGORITHMS)}")
        if self.device not in DEVICES:
            raise LauncherError(f"unknown --device {self.device!r}", hint=f"choose one of {', '.join(DEVICES)}")
        if self.calib_samples < 1:
            raise LauncherError("--calib-samples must be at least 1")
        if self.calib_seq_len < 8:
            raise LauncherError("--calib-seq-len must be at least 8")
        if self.calib_file is not None and not self.calib_file.is_file():
            raise LauncherError(f"--calib-file {self.calib_file} does not exist")
        if self.calib_file is not None and not has_tokenizer(model):
            raise LauncherError(
                f"--calib-file needs the model's tokenizer, and {model} has no tokenizer files",
                hint="copy tokenizer.json / tokenizer_config.json into the model folder, or drop --calib-file",
            )
        if self.algorithm == "nvfp4-awq-lite" and self.device == "cpu":
            # nvidia-modelopt 0.47.0: "amax must be a CUDA tensor for dynamic
            # block quantization", raised during AWQ-lite calibration.
            raise LauncherError("--algorithm nvfp4-awq-lite needs a CUDA device (modelopt's AWQ search runs on CUDA only)",
                                hint="use --device cuda, or --algorithm nvfp4")
        self._refuse_known_failures()

    def _refuse_known_failures(self) -> None:
        try:
            config = json.loads((self.model / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LauncherError(f"{self.model / 'config.json'} is not readable JSON: {exc}") from None
        model_type = str(config.get("model_type") or "")
        family = "gemma4" if model_type.startswith("gemma4") else model_type
        why = _REFUSED.get((self.algorithm, family))
        if why:
            raise LauncherError(
                f"--algorithm {self.algorithm} is refused for {model_type}: {why}",
                hint="use --algorithm nvfp4 (the default)",
            )


def _links_into(model: Path, out: Path) -> list[str]:
    """Files of ``model`` (a Hub snapshot is made of symlinks) whose real path lies under ``out``."""
    real_out = out.resolve()
    found = []
    for folder, subdirs, files in os.walk(model):
        for name in [*files, *subdirs]:
            path = Path(folder, name)
            if path.is_symlink() and path.resolve().is_relative_to(real_out):
                found.append(path.relative_to(model).as_posix())
    return sorted(found)
