"""Keep secrets out of everything the launcher prints or logs."""

from __future__ import annotations

import re

MASK = "***"
_SECRET_NAME = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY)", re.I)
_SECRET_FLAGS = {"--api-key", "--hf-token", "--ssl-keyfile-password"}


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def env(values: dict[str, str]) -> dict[str, str]:
    return {k: (MASK if is_secret_name(k) and v else v) for k, v in values.items()}


def argv(args: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = arg.partition("=")
        if flag in _SECRET_FLAGS:
            if eq:
                out.append(f"{flag}={MASK}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(arg)
    return out


def text(line: str, secrets: list[str]) -> str:
    """Mask known secret values inside free text (log lines)."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            line = line.replace(secret, MASK)
    return line
