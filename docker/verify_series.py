"""Fail an image build unless the patch series is fully applied to its vLLM.

Run inside the image after ``launcher patch apply``: reads ``launcher patch
status --json`` and exits non-zero, naming each patch, when any patch of the
series is not ``applied``, when the series is empty, or when the series hash
differs from the one the build recorded in the image's labels.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-version", default="", help="the vLLM version the image is labelled with (empty: not checked)")
    parser.add_argument("--series-hash", default="", help="the series hash the image is labelled with")
    args = parser.parse_args(argv)

    proc = subprocess.run(["launcher", "patch", "status", "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout + proc.stderr)
        print("verify-series: launcher patch status failed", file=sys.stderr)
        return 1
    status = json.loads(proc.stdout)
    problems = []
    if args.vllm_version and status["version"].split("+")[0] != args.vllm_version:
        problems.append(f"the image has vLLM {status['version']}, the build says {args.vllm_version}")
    if not status["patches"]:
        problems.append(f"the series for vLLM {status['series_version']} is empty")
    for patch in status["patches"]:
        if patch["state"] != "applied":
            problems.append(f"{patch['id']}: {patch['state']} {patch['detail']}".rstrip())
    if args.series_hash and args.series_hash != status["series_hash"]:
        problems.append(f"series hash {status['series_hash']} differs from the label's {args.series_hash}")
    for line in problems:
        print(f"verify-series: {line}", file=sys.stderr)
    if problems:
        return 1
    print(
        f"verify-series: vLLM {status['version']} at {status['tree']}: "
        f"{len(status['patches'])} patch(es) applied, series {status['series_hash'][:12]}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
