"""Keep secrets out of everything the launcher prints or logs."""

from __future__ import annotations

import re

MASK = "***"
# A word of the name, between underscores: HF_TOKEN and AWS_SECRET_ACCESS_KEY are secrets, while
# TOKENIZERS_PARALLELISM and serve.max_num_batched_tokens are not.
_SECRET_NAME = re.compile(r"(?:^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|CREDENTIALS?|PRIVATE_KEY)(?:$|_)", re.I)
_SECRET_FLAGS = {"--api-key", "--hf-token", "--ssl-keyfile-password"}


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def env(values: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in values.items()}


def is_secret_flag(arg: str) -> bool:
    """``--api-key``, ``--api_key=K`` and the like: vLLM's parser takes either spelling."""
    return arg.partition("=")[0].replace("_", "-") in _SECRET_FLAGS


def argv(args: list[str]) -> list[str]:
    """``args`` with every value of a secret flag masked. vLLM's ``--api-key`` takes several keys
    (``--api-key K1 K2``): every word up to the next option is one."""
    out: list[str] = []
    hiding, first = False, False
    for arg in args:
        # the word right after the flag is its value whatever it starts with (a key may start with -)
        if hiding and (first or not arg.startswith("-")):
            out.append(MASK)
            first = False
            continue
        hiding = False
        if is_secret_flag(arg):
            flag, eq, _ = arg.partition("=")
            out.append(f"{flag}={MASK}" if eq else arg)
            hiding = first = not eq
            continue
        out.append(arg)
    return out


def argv_secrets(args: list[str]) -> list[str]:
    """The values :func:`argv` masks, for masking them in a log that repeats them (vLLM logs its
    non-default arguments)."""
    shown = argv(args)
    out = []
    for given, masked in zip(args, shown):
        if given != masked:
            out.append(given.partition("=")[2] if masked.endswith("=" + MASK) else given)
    return out


def text(line: str, secrets: list[str]) -> str:
    """Mask known secret values inside free text (log lines)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            line = line.replace(secret, MASK)
    return line


_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def env_name(flag: str) -> str:
    """The environment variable a secret flag's value is read from on another node: vLLM reads
    ``--api-key`` from VLLM_API_KEY; the others by their own name (``--hf-token``: HF_TOKEN)."""
    name = flag.lstrip("-").replace("-", "_").upper()
    return "VLLM_API_KEY" if name == "API_KEY" else name


def url_credentials(line: str) -> str:
    """``https://user:token@host/...`` shown as ``https://***@host/...`` (pip's own output hides
    them too; an index URL given with --pip-arg carries them)."""
    return _URL_CREDENTIALS.sub(MASK + "@", line)


def tree(value):
    """A document (a recipe as YAML shows it) with its secrets masked: the value of a secret
    name, every value of a secret flag in a list of words, and credentials inside URLs."""
    if isinstance(value, dict):
        return {k: MASK if is_secret_name(str(k)) and v else tree(v) for k, v in value.items()}
    if isinstance(value, list):
        words = argv(value) if all(isinstance(v, str) for v in value) else value
        return [tree(v) for v in words]
    return url_credentials(value) if isinstance(value, str) else value
