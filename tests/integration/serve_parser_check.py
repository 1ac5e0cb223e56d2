"""Parse the launcher's argv with a released vLLM's own serve parser.

Usage, with a Python that has vLLM installed (``launcher install --venv DIR``):

    .venv/bin/python tests/integration/serve_parser_check.py --dump argv.json   # the plans
    DIR/bin/python tests/integration/serve_parser_check.py argv.json            # vLLM's parser

The first step resolves every recipe on both profiles for the installed
vLLM's version (``--version``, default 0.33.0), plus the opt-in intents that
are not in any recipe (B12X attention and MoE). The second runs vLLM's
``make_arg_parser``, ``validate_parsed_serve_args`` and
``AsyncEngineArgs.from_cli_args`` on each, and prints what vLLM made of the
flags the launcher renders from intents. vLLM picks its platform from the
GPU; on a machine without one its device type is stood in as CUDA's, which
is all the parser asks of it. Not part of ``make test``: it needs vLLM and
its torch installed (about 9 GB).
"""

from __future__ import annotations

import json
import sys

OPT_IN = {
    "b12x-attention-no-drafter": ("gemma4-moe-dflash-text",
                                  ["intent.attention_per_kind.sliding_window=b12x", "drafter=null"]),
    "b12x-moe": ("gemma4-moe-dflash", ["intent.moe_fp4_backend=b12x"]),
    "flashinfer-b12x-moe": ("gemma4-moe-dflash", ["intent.moe_fp4_backend=flashinfer_b12x"]),
}


def dump(path: str, version: str) -> None:
    from launcher import recipe
    from launcher.checks import resolve
    from launcher.plan import Request
    from tests.unit.conftest import GB10, RTX5090, make_ctx

    cases = {name: (name, []) for name in recipe.available() if version in recipe.load(name).vllm_versions}
    cases.update(OPT_IN)
    argvs = {}
    for case, (name, sets) in cases.items():
        for card, gpu in (("rtx5090", RTX5090), ("dgx-spark", GB10)):
            argvs[f"{case} {card}"] = resolve(Request(name, vllm_version=version, sets=sets), make_ctx(gpu)).argv
    with open(path, "w") as f:
        json.dump(argvs, f, indent=1)


def stand_in_platform() -> None:
    """vLLM picks its platform from the GPU; without one, stand its device type in as CUDA's,
    which is all the parser and the engine config ask of it."""
    import vllm.platforms as platforms
    from vllm.platforms.interface import Platform, PlatformEnum

    class DeviceTypeOnly(Platform):
        _enum = PlatformEnum.CUDA
        device_name = device_type = "cuda"
        dispatch_key = "CUDA"

    if not platforms.current_platform.device_type:
        platforms._current_platform = DeviceTypeOnly()


def serve_parser():
    """(``vllm serve``'s parser, its validate function) in the module each release keeps them:
    ``vllm/entrypoints/common/cli_args.py`` in 0.33.0, ``launchers/`` in 0.29.0 ... 0.32.0, ``openai/`` in 0.21.0."""
    import importlib

    for where in ("common", "launchers", "openai"):  # 0.33.0; 0.29.0 ... 0.32.0; 0.21.0 ...
        try:
            module = importlib.import_module(f"vllm.entrypoints.{where}.cli_args")
            make_arg_parser, validate_parsed_serve_args = module.make_arg_parser, module.validate_parsed_serve_args
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("no vllm.entrypoints.*.cli_args with make_arg_parser")
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return (lambda: make_arg_parser(FlexibleArgumentParser())), validate_parsed_serve_args


def parse(path: str) -> int:
    stand_in_platform()
    from vllm.engine.arg_utils import AsyncEngineArgs

    make_parser, validate_parsed_serve_args = serve_parser()
    for case, argv in json.load(open(path)).items():
        args = make_parser().parse_args(argv[2:])  # less "vllm serve"
        validate_parsed_serve_args(args)
        engine = AsyncEngineArgs.from_cli_args(args)
        per_kind = engine.attention_config.get("backend_per_kind") if isinstance(engine.attention_config, dict) \
            else getattr(engine.attention_config, "backend_per_kind", None)
        names = {kind: getattr(b, "name", b) for kind, b in (per_kind or {}).items()}
        print(f"{case}: ok (backend_per_kind {names}, moe {engine.moe_backend}, linear {engine.linear_backend})")
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "--dump":
        dump(sys.argv[2], sys.argv[4] if len(sys.argv) > 4 and sys.argv[3] == "--version" else "0.33.0")
    else:
        sys.exit(parse(sys.argv[1]))
