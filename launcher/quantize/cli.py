"""``launcher quantize``: a bf16 Hugging Face checkpoint in, a ModelOpt NVFP4 one out.

Only option parsing lives here; torch, transformers and nvidia-modelopt are
imported by ``launcher.quantize.pipeline`` when the command runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from launcher.quantize.config import ALGORITHMS, QuantizeConfig


def quantize(
    model: Annotated[Path, typer.Option("--model", help="bf16 Hugging Face checkpoint folder.")],
    out: Annotated[Path, typer.Option("--out", help="Folder for the NVFP4 checkpoint (written only when complete).")],
    calib_samples: Annotated[int, typer.Option("--calib-samples", help="Calibration forward passes.")] = 64,
    calib_seq_len: Annotated[int, typer.Option("--calib-seq-len", help="Tokens per calibration pass.")] = 512,
    calib_file: Annotated[
        Optional[Path],
        typer.Option("--calib-file", help="Calibration text: .jsonl with {\"text\": ...} lines, or plain text split on blank lines."),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="auto | cpu | cuda (auto: cuda when torch sees one).")] = "auto",
    algorithm: Annotated[str, typer.Option("--algorithm", help=f"{' | '.join(ALGORITHMS)}.")] = "nvfp4",
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty --out (only once the new one is complete).")] = False,
    seed: Annotated[int, typer.Option("--seed", help="Seed for random calibration ids.")] = 0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check --model and --out and say what would run; load nothing.")] = False,
) -> None:
    """Quantize a checkpoint to ModelOpt NVFP4 (calibrate, export, copy tokenizer files, validate).

    Vision/audio towers, their embedders, MoE routers and lm_head stay bf16.
    The whole bf16 model is loaded on --device: about 2 bytes per parameter
    (~52 GB for Gemma 4 26B-A4B: a DGX Spark fits it, an RTX 5090 does not;
    use --device cpu with enough RAM there).
    Needs the quantize extra, from the repository's checkout: pip install -e '.[quantize]'.
    """
    from launcher.quantize import pipeline

    cfg = QuantizeConfig(
        model=model, out=out, algorithm=algorithm, calib_samples=calib_samples, calib_seq_len=calib_seq_len,
        calib_file=calib_file, device=device, force=force, seed=seed,
    )
    if dry_run:
        # The checks run() makes before it imports torch: a hint that names this command can be tried.
        cfg.validate()
        info = pipeline._check_source(cfg.model)
        typer.echo(f"would quantize {cfg.model} ({info.summary()}) to {cfg.out} ({cfg.algorithm}, "
                   f"device {cfg.device}, {cfg.calib_samples} x {cfg.calib_seq_len} calibration tokens)")
        return
    pipeline.run(cfg, echo=typer.echo)


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize)
