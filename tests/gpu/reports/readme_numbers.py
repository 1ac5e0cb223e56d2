"""The numbers the READMEs quote from GPU records, checked against those records (issue 51, item 6).

A quoted number is marked where it stands, invisibly in rendered Markdown:

    <!-- rec:results/acceptance.json#/[run=trained-dflash-trained-fa2-cg-bf16,vllm=0.21.0]/mean_acceptance_length_vllm|2 -->3.65<!-- /rec -->

``results/...`` is relative to tests/gpu/. The part after ``#`` walks the parsed JSON, one step per
``/``:

* a key of an object, or an index of a list;
* ``[k=v,k2^=w]``: the one element of a list whose fields match (``=`` equal as text, ``^=``
  starts with, ``!=`` differs); more or fewer than one match is an error;
* ``[*k=v,...]``: every element that matches; the steps after it apply to each of them, and
  elements where a later key is missing or null are dropped.

The part after ``|`` formats the value, left to right: ``min``, ``max``, ``count`` (of a list),
``abs``, ``dev`` (distance from 1), ``comp`` (1 minus), ``ratio:a:b`` (field a over field b, of an
object or of each in a list), ``pctN`` (times 100), ``N`` (N decimals), ``int``, ``comma`` (thousands separator),
``hN`` (first N characters). The text between the two comments must equal the result.

``python tests/gpu/reports/readme_numbers.py`` prints every mark and whether it holds; exit 1 if one does not.
``--fill`` first rewrites every mark's text from its record (after a report is regenerated).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]  # tests/gpu
REPO = HERE.parents[1]
# The documents whose quoted GPU numbers are checked.
DOCUMENTS = (REPO / "README.md", HERE / "README.md")

MARK = re.compile(r"<!-- rec:(?P<spec>[^>]*?) -->(?P<text>.*?)<!-- /rec -->", re.S)
_FILTER = re.compile(r"(?P<key>[\w.]+)(?P<op>\^=|!=|=)(?P<value>.*)")


class RecordError(ValueError):
    pass


def _matches(item, filters: list[tuple[str, str, str]]) -> bool:
    if not isinstance(item, dict):
        return False
    for key, op, value in filters:
        have = item.get(key)
        text = "" if have is None else str(have)
        if op == "=" and text != value or op == "^=" and not text.startswith(value) \
                or op == "!=" and text == value:
            return False
    return True


def _parse_filters(body: str) -> list[tuple[str, str, str]]:
    out = []
    for part in body.split(","):
        m = _FILTER.fullmatch(part.strip())
        if not m:
            raise RecordError(f"bad filter {part!r}")
        out.append((m["key"], m["op"], m["value"]))
    return out


def _step(value, segment: str):
    if segment.startswith("[") and segment.endswith("]"):
        if not isinstance(value, list):
            raise RecordError(f"{segment} on a {type(value).__name__}, not a list")
        many = segment.startswith("[*")
        filters = _parse_filters(segment[2 if many else 1:-1])
        hits = [item for item in value if _matches(item, filters)]
        if many:
            return hits
        if len(hits) != 1:
            raise RecordError(f"{segment} matches {len(hits)} elements, not one")
        return hits[0]
    if isinstance(value, list):
        try:
            return value[int(segment)]
        except (ValueError, IndexError) as e:
            raise RecordError(f"no element {segment!r}") from e
    if isinstance(value, dict):
        if segment not in value:
            raise RecordError(f"no key {segment!r}")
        return value[segment]
    raise RecordError(f"{segment!r} on a {type(value).__name__}")


def resolve(data, pointer: str):
    """The value at ``pointer`` in ``data`` (the module docstring's syntax)."""
    value, fanned = data, False
    for segment in [s for s in pointer.split("/") if s]:
        if fanned:
            kept = []
            for item in value:
                try:
                    got = _step(item, segment)
                except RecordError:
                    continue
                if got is not None:
                    kept.append(got)
            value = kept
        else:
            value = _step(value, segment)
            fanned = segment.startswith("[*")
    return value


def fmt(value, formats: list[str]) -> str:
    for f in formats:
        if f in ("min", "max"):
            if not value:
                raise RecordError(f"{f} of nothing")
            value = (min if f == "min" else max)(value)
        elif f == "count":
            value = len(value)
        elif f.startswith("ratio:"):
            num, den = f.split(":")[1:]
            value = [x[num] / x[den] for x in value] if isinstance(value, list) else value[num] / value[den]
        elif f == "abs":
            value = abs(value)
        elif f == "dev":
            value = abs(value - 1)
        elif f == "comp":
            value = 1 - value
        elif f.startswith("pct"):
            value = 100 * value
            if f[3:]:
                value = f"{value:.{int(f[3:])}f}"
        elif f.isdigit():
            value = f"{float(value):.{int(f)}f}"
        elif f == "int":
            value = str(int(value)) if float(value) == int(value) else str(value)
        elif f == "comma":
            value = f"{int(value):,}"
        elif f.startswith("h") and f[1:].isdigit():
            value = str(value)[:int(f[1:])]
        else:
            raise RecordError(f"unknown format {f!r}")
    return value if isinstance(value, str) else json.dumps(value)


def expected(spec: str, base: Path = HERE, cache: dict | None = None) -> str:
    """The text a mark ``spec`` (``path#pointer|format|...``) stands for."""
    cache = {} if cache is None else cache
    target, _, formats = spec.partition("|")
    path, _, pointer = target.partition("#")
    file = (base / path).resolve()
    if file not in cache:
        if not file.is_file():
            raise RecordError(f"no record {path}")
        cache[file] = json.loads(file.read_text())
    return fmt(resolve(cache[file], pointer), [f for f in formats.split("|") if f])


def marks(text: str) -> list[dict]:
    """Every mark in ``text``: its spec, the text it wraps and its line."""
    return [{"spec": m["spec"].strip(), "text": m["text"], "line": text.count("\n", 0, m.start()) + 1}
            for m in MARK.finditer(text)]


def check(text: str, base: Path = HERE, cache: dict | None = None) -> list[dict]:
    """The marks of ``text`` whose wrapped text differs from the record, or whose record or
    value is missing: each with ``line``, ``spec``, ``text`` and ``expected`` or ``error``."""
    cache = {} if cache is None else cache
    bad = []
    for m in marks(text):
        try:
            want = expected(m["spec"], base, cache)
        except (RecordError, TypeError, ValueError, KeyError) as e:
            bad.append({**m, "error": str(e)})
            continue
        if m["text"] != want:
            bad.append({**m, "expected": want})
    # A mark opened and never closed would hide its number from the check.
    opened, closed = text.count("<!-- rec:"), text.count("<!-- /rec -->")
    if opened != closed or opened != len(marks(text)):
        bad.append({"line": 0, "spec": "", "text": "",
                    "error": f"{opened} marks opened, {closed} closed, {len(marks(text))} well formed"})
    return bad


def fill(text: str, base: Path = HERE, cache: dict | None = None) -> str:
    """``text`` with every mark's wrapped text replaced by what its record says (``--fill``):
    the numbers are generated from the records, then read back by ``check``."""
    cache = {} if cache is None else cache

    def one(m: re.Match) -> str:
        return f"<!-- rec:{m['spec']} -->{expected(m['spec'].strip(), base, cache)}<!-- /rec -->"

    return MARK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    failed = 0
    for doc in DOCUMENTS:
        text = doc.read_text()
        if "--fill" in argv:
            text = fill(text)
            doc.write_text(text)
        bad = check(text)
        failed += len(bad)
        print(f"{doc.relative_to(REPO)}: {len(marks(text))} quoted numbers, {len(bad)} wrong")
        for b in bad:
            print(f"  line {b['line']}: {b['text']!r} vs {b.get('expected', b.get('error'))!r}  ({b['spec']})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
