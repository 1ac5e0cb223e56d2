"""vLLM arguments given after ``--``, reconciled with the ones the plan sets itself.

vLLM's parser keeps the last copy of a repeated flag, so appending the user's
words to the plan's command line would run one value while the launcher
plans, waits on and publishes another. Each flag the plan also sets therefore
takes one of three ways, and none of them leaves two copies:

- ``--host`` / ``--port`` become the launcher's own ``--host`` / ``--port``
  (:func:`lift_address`): the endpoint, ``--wait``, the docker port mapping
  and the command then all use the one value;
- a flag the plan renders from a recipe field (``--max-model-len``,
  ``--served-model-name``, ...) is refused, naming the ``--set`` that changes
  the field, so that the checks that read the field see the value that runs;
- any other flag the plan sets (a recipe's ``serve.extra_args``) is replaced
  by the user's copy, and the plan says so in a warning.
"""

from __future__ import annotations

import dataclasses
import shlex

from launcher.errors import LauncherError

#: flags that are the launcher's own options
ADDRESS = ("--host", "--port")

#: flags the plan renders from a recipe field -> that field (a ``--set`` key)
RECIPE_FIELDS = {
    "--served-model-name": "target.served_names",
    "--max-model-len": "serve.max_model_len",
    "--max-num-seqs": "serve.max_num_seqs",
    "--max-num-batched-tokens": "serve.max_num_batched_tokens",
    "--gpu-memory-utilization": "serve.gpu_memory_utilization",
    "--max-cudagraph-capture-size": "serve.max_cudagraph_capture_size",
    "--enable-chunked-prefill": "serve.enable_chunked_prefill",
    "--enable-prefix-caching": "serve.enable_prefix_caching",
    "--trust-remote-code": "serve.trust_remote_code",
    "--enable-auto-tool-choice": "serve.enable_auto_tool_choice",
    "--enforce-eager": "serve.enforce_eager",
    "--tool-call-parser": "serve.tool_call_parser",
    "--moe-backend": "intent.moe_fp4_backend",
    "--linear-backend": "intent.nvfp4_gemm_backend",
}
#: flags the multi-node plan renders (launcher.multinode) -> what changes them
_NODE_HINT = "use the launcher's own --nnodes, --node-rank, --master-addr, --master-port"
_LAYOUT_HINT = "the profile's cluster section sets it: --set profiles.PROFILE.cluster.tensor_parallel=N (pipeline_parallel, data_parallel)"
CLUSTER_FLAGS = {
    "--nnodes": _NODE_HINT, "--node-rank": _NODE_HINT, "--master-addr": _NODE_HINT, "--master-port": _NODE_HINT,
    "--headless": "the plan runs every node but the head (--node-rank 0) headless",
    "--distributed-executor-backend": "use the launcher's own --distributed-executor-backend",
    "--tensor-parallel-size": _LAYOUT_HINT, "--pipeline-parallel-size": _LAYOUT_HINT,
    "--data-parallel-size": _LAYOUT_HINT,
}
_LIST_FIELDS = {"target.served_names"}
_SPECULATIVE = "--speculative-config"
_MODEL = "--model"
_SPECULATIVE_HINT = ("the drafter is the recipe's: --drafter DIR, --set drafter.num_speculative_tokens=N, "
                     "--set drafter.attention_backend=NAME, or --set drafter=null to serve without it")


def groups(args: list[str]) -> list[list[str]]:
    """``args`` cut before each ``--flag``: one flag and its values a group (leading words form their own)."""
    out: list[list[str]] = []
    for arg in args:
        if _is_flag(arg) or not out:
            out.append([arg])
        else:
            out[-1].append(arg)
    return out


def _is_flag(arg: str) -> bool:
    return arg.startswith("--") and len(arg) > 2


def name(group: list[str]) -> str | None:
    """The flag of a group as vLLM's parser reads it (``--max_model_len=1`` is ``--max-model-len``)."""
    head = group[0]
    if not _is_flag(head):
        return None
    return "--" + head[2:].split("=", 1)[0].replace("_", "-")


def base(flag: str) -> str:
    """``--no-enable-prefix-caching`` sets the same thing as ``--enable-prefix-caching``."""
    return "--" + flag[5:] if flag.startswith("--no-") else flag


def values(group: list[str]) -> list[str]:
    head = group[0]
    return ([head.split("=", 1)[1]] if "=" in head else []) + group[1:]


def lift_address(req, given: set[str]):
    """``-- --host H`` / ``-- --port P`` taken out of ``req.extra_args`` into ``req.host`` / ``req.port``.

    ``given`` names the launcher options set on the command line (``host``,
    ``port``): one that disagrees with the copy after ``--`` is refused.
    """
    kept: list[str] = []
    found: dict[str, str] = {}
    for group in groups(list(req.extra_args)):
        flag = name(group)
        if flag not in ADDRESS:
            kept += group
            continue
        vals = values(group)
        if len(vals) != 1:
            raise LauncherError(f"`-- {shlex.join(group)}`: {flag} takes one value")
        if flag in found:
            raise LauncherError(f"{flag} is given twice after `--` ({found[flag]} and {vals[0]})",
                                hint=f"give it once, before `--`: launcher serve ... {flag} VALUE")
        found[flag] = vals[0]
    changes: dict[str, object] = {}
    for flag, value in found.items():
        option = flag[2:]
        new = _port(value) if option == "port" else value
        old = getattr(req, option)
        if option in given and new != old:
            raise LauncherError(f"{flag} {old} and `-- {flag} {value}` disagree",
                                hint=f"give {flag} once, before `--`")
        changes[option] = new
    return dataclasses.replace(req, extra_args=kept, **changes) if found else req


def _port(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise LauncherError(f"`-- --port {value}`: a port is a number from 1 to 65535") from None


def owned_by_plan(flag: str) -> str | None:
    """Why a recipe's ``serve.extra_args`` may not carry ``flag`` (None: it may). The plan
    renders these itself; a second copy in the extra words would win in vLLM's parser while
    the launcher plans, checks and waits on its own (an extra ``--host 0.0.0.0`` would bind
    every interface behind a plan that shows 127.0.0.1)."""
    key = base(flag)
    if key in ADDRESS:
        return f"it is the launcher's own option: launcher serve {key} VALUE"
    if key in CLUSTER_FLAGS:
        return CLUSTER_FLAGS[key]
    if key == _SPECULATIVE:
        return _SPECULATIVE_HINT
    if key == _MODEL:
        return "the model is the target section's"
    if key in RECIPE_FIELDS:
        return f"the recipe field {RECIPE_FIELDS[key]} sets it"
    return None


def merge_extra(own: list[str], extra: list[str]) -> list[str]:
    """The plan's rendered command ``own`` with a recipe's ``serve.extra_args``, refusing any
    flag both set (the recipe check refuses the ones it knows; this catches the rest, such as
    the intent's rendered flags)."""
    planned = {base(n) for n in map(name, groups(own[3:])) if n}
    for group in groups(extra):
        flag = name(group)
        if flag is not None and base(flag) in planned:
            raise LauncherError(f"serve.extra_args {shlex.join(group)}: the plan already renders {flag}",
                                hint=owned_by_plan(flag) or "drop it from serve.extra_args; the recipe's "
                                "intent section or its profile sets it")
    return own + list(extra)


def merge(own: list[str], user: list[str], warnings: list[str]) -> list[str]:
    """The plan's command ``own`` (``vllm serve MODEL ...``) with the user's ``user`` appended.

    A user flag that one of ``own``'s flags already sets is refused (recipe
    fields, see :data:`RECIPE_FIELDS`) or replaces that flag, with a warning.
    """
    head, planned = own[:3], groups(own[3:])
    planned_names = {base(n) for n in map(name, planned) if n}
    for group in groups(user):
        flag = name(group)
        if flag is not None and base(flag) == _MODEL:
            # `vllm serve MODEL` takes the positional MODEL over --model: this copy would be
            # ignored while the user believes it is served.
            raise LauncherError(f"`-- {shlex.join(group)}`: the model is the launcher's own option "
                                f"(vLLM serves {head[2]} and ignores --model)",
                                hint="pass it before `--`: launcher serve ... --model DIR")
        if flag is None or base(flag) not in planned_names:
            continue
        _refuse_recipe_flag(flag, group)
        replaced = [g for g in planned if name(g) and base(name(g)) == base(flag)]
        planned = [g for g in planned if g not in replaced]
        was = " ".join(shlex.join(g) for g in replaced)
        warnings.append(f"`-- {shlex.join(group)}` replaces the recipe's {was}")
    return head + [arg for g in planned for arg in g] + list(user)


def _refuse_recipe_flag(flag: str, group: list[str]) -> None:
    key = base(flag)
    if key in CLUSTER_FLAGS:
        raise LauncherError(f"`-- {shlex.join(group)}`: {key} is set by the multi-node plan",
                            hint=CLUSTER_FLAGS[key])
    if key in ADDRESS:
        raise LauncherError(f"`-- {shlex.join(group)}`: {key} is the launcher's own option",
                            hint=f"pass it before `--`: launcher serve ... {key} VALUE")
    if key == _SPECULATIVE:
        raise LauncherError(f"`-- {shlex.join(group)}`: the plan sets {key} from the recipe's drafter",
                            hint=_SPECULATIVE_HINT)
    field = RECIPE_FIELDS.get(key)
    if field is None:
        return
    raise LauncherError(f"`-- {shlex.join(group)}`: the recipe sets {key} (field {field})",
                        hint=f"use {set_for(flag, group)} (the plan and its checks then use it)")


def set_for(flag: str, group: list[str]) -> str:
    """The ``--set`` that says what ``group`` (a flag after ``--``) says."""
    field = RECIPE_FIELDS[base(flag)]
    vals = values(group)
    if not vals:  # a switch: --enable-x is true, --no-enable-x false
        value = "false" if flag.startswith("--no-") else "true"
    elif field in _LIST_FIELDS:
        value = "[" + ", ".join(vals) + "]"
    else:
        value = " ".join(vals)
    return "--set " + shlex.quote(f"{field}={value}")
