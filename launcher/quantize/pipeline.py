"""One NVFP4 quantization run: load in bf16, calibrate, export, complete, validate, publish.

The heavy stack (torch, transformers, nvidia-modelopt) is imported here and
only here, when the command runs, so the launcher starts without it.

Everything is written into a hidden temporary sibling of ``--out`` and renamed
onto ``--out`` only after the result passed ``launcher.checkpoint``'s checks:
an interrupted or failed run leaves ``--out`` as it was (absent, or the old
checkpoint under ``--force``).
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from launcher import checkpoint
from launcher.errors import LauncherError
from launcher.interrupts import Signalled, unwinding
from launcher.quantize import calibration
from launcher.quantize.config import QuantizeConfig, install_hint
from launcher.quantize.exclusions import KEEP_UNQUANTIZED, build_quant_config

# Files a serving stack reads besides the weights; export_hf_checkpoint
# writes config.json, generation_config.json and the weights only.
SIDECAR_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
    "generation_config.json",
)

# The vLLM base whose reading of the config the output must satisfy: the
# user's base and the stricter one (needs text_config.global_head_dim).
TARGET_VLLM = "0.21.0"

Echo = Callable[[str], None]


def import_stack() -> SimpleNamespace:
    """torch, transformers and nvidia-modelopt, or one clear error naming the extra."""
    try:
        # nvidia-modelopt imports requests without declaring it; import it
        # first so its absence is reported as what it is.
        import requests  # noqa: F401
        import torch
        import transformers
        import modelopt.torch.quantization as mtq
        import modelopt.torch.export as mte
    except ImportError as exc:
        raise LauncherError(
            f"launcher quantize needs torch, transformers and nvidia-modelopt ({exc.name or exc} is missing)",
            hint=install_hint(),
        ) from None
    return SimpleNamespace(torch=torch, transformers=transformers, mtq=mtq, mte=mte)


class _Steps:
    """Progress lines with elapsed time, and the step an interrupt hit."""

    def __init__(self, echo: Echo):
        self.echo = echo
        self.start = time.monotonic()
        self.current = "setup"

    def begin(self, name: str, message: str) -> None:
        self.current = name
        self.say(message)

    def say(self, message: str) -> None:
        self.echo(f"[{time.monotonic() - self.start:6.1f}s] {self.current}: {message}")


def run(cfg: QuantizeConfig, echo: Echo) -> checkpoint.CheckpointInfo:
    cfg.validate()
    for line in remove_leftovers(cfg.out):
        echo(line)
    source_info = _check_source(cfg.model)
    steps = _Steps(echo)
    steps.begin("setup", "importing torch, transformers and nvidia-modelopt")
    stack = import_stack()
    tmp = cfg.out.with_name(f".{cfg.out.name}.partial-{os.getpid()}")
    # SIGTERM, SIGHUP and SIGQUIT unwind like Ctrl-C, so the temporary folder is removed.
    with unwinding():
        info = _run_in(cfg, source_info, stack, tmp, steps)
    info.path = cfg.out
    steps.begin("done", f"{cfg.out}: {info.summary()}")
    return info


def _run_in(
    cfg: QuantizeConfig, source_info: checkpoint.CheckpointInfo, stack: SimpleNamespace, tmp: Path, steps: _Steps
) -> checkpoint.CheckpointInfo:
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _quantize_into(cfg, source_info, stack, tmp, steps)
        _complete(cfg.model, tmp, steps)
        info = _validate(tmp, steps)
        _publish(tmp, cfg.out)
    except KeyboardInterrupt:
        raise LauncherError(
            f"interrupted during {steps.current}; {cfg.out} was left untouched", exit_code=130
        ) from None
    except Signalled as sig:
        raise LauncherError(
            f"interrupted during {steps.current} ({sig.name}); {cfg.out} was left untouched",
            exit_code=sig.exit_status,
        ) from None
    except LauncherError:
        raise
    except Exception as exc:  # the heavy stack fails in many shapes; report, don't trace
        raise LauncherError(
            f"{steps.current} failed: {type(exc).__name__}: {exc}; {cfg.out} was left untouched"
        ) from exc
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return info


def _check_source(model: Path) -> checkpoint.CheckpointInfo:
    info, reasons = checkpoint.inspect_target(model, expected_format=None, vllm_version=TARGET_VLLM)
    if info.quant_algo is not None or info.format in ("modelopt-nvfp4", "compressed-tensors"):
        raise LauncherError(
            f"--model {model} is already quantized ({info.format}, {info.quant_algo})",
            hint="quantize the bf16 release of the model",
        )
    blocking = [r for r in reasons if r.blocking]
    if blocking:
        raise LauncherError(
            f"--model {model} would not load: " + "; ".join(r.message for r in blocking),
            hint=blocking[0].hint,
        )
    return info


def _device(requested: str, torch: Any) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise LauncherError("--device cuda but torch sees no CUDA device", hint="use --device cpu, or install a CUDA build of torch")
    return requested


def _model_class(transformers: Any, config: dict[str, Any]) -> Any:
    for name in config.get("architectures") or []:
        cls = getattr(transformers, name, None)
        if cls is not None:
            return cls
    return transformers.AutoModelForCausalLM


def _calibration_batches(cfg: QuantizeConfig, config: dict[str, Any], transformers: Any, steps: _Steps) -> list[list[int]]:
    tc = checkpoint.text_config(config)
    if cfg.calib_file is None and not calibration.has_tokenizer(cfg.model):
        vocab = tc.get("vocab_size")
        if not isinstance(vocab, int) or vocab < 2:
            raise LauncherError(f"{cfg.model / 'config.json'}: no vocab_size to draw random calibration ids from")
        steps.say(
            f"WARNING: {cfg.model} has no tokenizer files; calibrating on random token ids "
            "(fine for a test model, poor input scales for a real one)"
        )
        return calibration.random_token_batches(
            vocab, calibration.reserved_token_ids(config), cfg.calib_samples, cfg.calib_seq_len, cfg.seed
        )
    try:
        texts = calibration.read_calib_file(cfg.calib_file) if cfg.calib_file else list(calibration.BUILTIN_TEXTS)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LauncherError(f"--calib-file: {exc}") from None
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(cfg.model))

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    source = cfg.calib_file or "the built-in text set"
    steps.say(f"calibration text from {source} ({len(texts)} samples), tokenized with the model's tokenizer")
    return calibration.text_token_batches(encode, texts, cfg.calib_samples, cfg.calib_seq_len)


def _quantize_into(
    cfg: QuantizeConfig, source: checkpoint.CheckpointInfo, stack: SimpleNamespace, tmp: Path, steps: _Steps
) -> None:
    torch, transformers, mtq = stack.torch, stack.transformers, stack.mtq
    config = json.loads((cfg.model / "config.json").read_text(encoding="utf-8"))
    device = _device(cfg.device, torch)
    torch.manual_seed(cfg.seed)

    steps.begin("load", f"loading {cfg.model} ({source.architecture}) in bf16 on {device}")
    cls = _model_class(transformers, config)
    # bf16 on load: otherwise the tensors left unquantized are exported as fp32.
    kwargs: dict[str, Any] = {"dtype": torch.bfloat16}
    if device == "cuda":
        kwargs["device_map"] = {"": "cuda"}
    model = cls.from_pretrained(str(cfg.model), **kwargs)
    model.eval()
    steps.say(f"loaded {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")

    batches = _calibration_batches(cfg, config, transformers, steps)
    quant_cfg, added = build_quant_config(getattr(mtq, cfg.modelopt_config_name))
    if added:
        steps.say(f"also keeping unquantized: {', '.join(added)} (not in modelopt's {cfg.modelopt_config_name})")

    every = max(1, len(batches) // 10)

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for i, ids in enumerate(batches, 1):
                m(input_ids=torch.tensor([ids], device=device), use_cache=False)
                if i % every == 0 or i == len(batches):
                    steps.say(f"{i}/{len(batches)} batches")

    steps.begin("calibrate", f"{cfg.modelopt_config_name}: {len(batches)} batches of up to {cfg.calib_seq_len} tokens")
    model = mtq.quantize(model, quant_cfg, forward_loop)

    steps.begin("export", f"writing the NVFP4 checkpoint to {tmp}")
    # Looked up at call time (not imported by name above) so a test can make
    # the export fail and observe that --out is left untouched.
    stack.mte.export_hf_checkpoint(model, export_dir=str(tmp))


def _complete(model_dir: Path, tmp: Path, steps: _Steps) -> None:
    """Copy tokenizer/processor/chat-template files and restore Gemma 4's global_head_dim."""
    steps.begin("complete", "copying tokenizer, processor and chat-template files")
    copied = []
    for path in sorted(model_dir.iterdir()):
        wanted = path.name in SIDECAR_FILES or path.name.startswith("chat_template")
        if wanted and path.is_file() and not (tmp / path.name).exists():
            shutil.copy2(path, tmp / path.name)
            copied.append(path.name)
    steps.say(f"copied {', '.join(copied) if copied else 'nothing (none present)'}")
    restored = restore_global_head_dim(model_dir, tmp)
    if restored is not None:
        steps.say(f"wrote text_config.global_head_dim = {restored} back (this transformers dropped it on save)")


def restore_global_head_dim(model_dir: Path, out_dir: Path) -> int | None:
    """Put text_config.global_head_dim back into out_dir/config.json if the save lost it.

    transformers >= 5.15 stores it as per_layer_config and drops the field;
    vLLM 0.21.x reads only the field. The value comes from the source config,
    else from the source weights' full-attention q_proj.
    """
    out_cfg_path = out_dir / "config.json"
    out_cfg = json.loads(out_cfg_path.read_text(encoding="utf-8"))
    out_tc = checkpoint.text_config(out_cfg)
    model_type = str(out_cfg.get("model_type") or "")
    if not model_type.startswith("gemma4") or isinstance(out_tc.get("global_head_dim"), int):
        return None
    src_tc = checkpoint.text_config(json.loads((model_dir / "config.json").read_text(encoding="utf-8")))
    value = src_tc.get("global_head_dim")
    if not isinstance(value, int):
        layer_types = src_tc.get("layer_types") or []
        full = next((i for i, t in enumerate(layer_types) if t == "full_attention"), None)
        found = None
        if full is not None:
            found = checkpoint.weights_head_dim(
                checkpoint.read_tensor_index(model_dir), full, src_tc.get("num_attention_heads")
            )
        if found is None:
            return None
        value = found[0]
    out_tc["global_head_dim"] = value
    out_cfg_path.write_text(json.dumps(out_cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return value


def _validate(tmp: Path, steps: _Steps) -> checkpoint.CheckpointInfo:
    steps.begin("validate", f"checking the result as vLLM {TARGET_VLLM} will read it")
    info, reasons = checkpoint.inspect_target(tmp, expected_format="modelopt-nvfp4", vllm_version=TARGET_VLLM)
    problems = [r.message for r in reasons if r.blocking]
    if info.is_gemma4 and "full_attention" in info.layer_types and info.global_head_dim is None:
        problems.append("config.json: text_config.global_head_dim is missing")
    problems += uncovered_exclusions(checkpoint.read_tensor_index(tmp), info.exclude_modules)
    for r in reasons:
        if not r.blocking:
            steps.say(f"note: {r.message}")
    if problems:
        raise LauncherError("the exported checkpoint failed validation: " + "; ".join(problems))
    return info


def uncovered_exclusions(tensors: dict[str, checkpoint.TensorMeta], exclude_modules: list[str]) -> list[str]:
    """Modules that must stay unquantized but that hf_quant_config.json does not exclude.

    vLLM decides per module from exclude_modules whether to build a quantized
    layer, so each such module present in the weights must match an entry.
    """
    problems = []
    for pattern in KEEP_UNQUANTIZED:
        modules = sorted({name.rsplit(".", 1)[0] for name in tensors if fnmatch.fnmatch(name, pattern)})
        for module in modules:
            if not any(fnmatch.fnmatch(module, ex) or module == ex for ex in exclude_modules):
                problems.append(f"hf_quant_config.json: exclude_modules does not cover {module}")
                break
    return problems


def remove_leftovers(out: Path) -> list[str]:
    """Remove what killed runs (SIGKILL, power loss) left beside ``out``; say what went.

    A ``.<out>.partial-<pid>`` is as large as the checkpoint and no later run
    would reuse it. An ``.<out>.old-<pid>`` is an old checkpoint caught between
    publishing's two renames: removed only once ``out`` exists again (else it
    is the only copy, and is put back as ``out``). Folders of a live process
    are another run's, and are left alone.
    """
    said = []
    prefix = f".{out.name}."
    for stray in sorted(p for p in out.parent.iterdir() if p.name.startswith(prefix)):
        kind, _, pid = stray.name[len(prefix):].rpartition("-")
        if (kind not in ("partial", "old") or not pid.isdigit() or stray.is_symlink() or not stray.is_dir()
                or _alive(int(pid))):
            continue
        if kind == "old" and not out.exists():
            stray.rename(out)
            said.append(f"put back {out} from {stray.name}, left by a run killed while publishing (pid {pid})")
            continue
        shutil.rmtree(stray, ignore_errors=True)
        said.append(f"removed {stray.name}, left by a killed quantize run (pid {pid})")
    return said


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (or a pid too large to ask about): not ours to judge
    return True


def _publish(tmp: Path, out: Path) -> None:
    """Rename the finished checkpoint onto --out; an old --out is removed only after."""
    if not out.exists():
        tmp.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)  # put the old one back rather than leave no --out at all
        raise
    shutil.rmtree(old, ignore_errors=True)
