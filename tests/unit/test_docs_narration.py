"""No work-process narration in the repository's Markdown (issue 52, item 2).

The documents describe the project and its evidence as a user meets them: a machine with a GPU,
with or without network. They do not log how this repository's results happened to be produced:
no dated entries, no ordinal runs ("the fifth ..."), no "what the next run needs", no account of
machines lost or parts moved between them. History lives in git.

NARRATION covers the phrases the GPU documents held before they became a method document.
Inline code and link targets are left out of the check (file names such as a record's dated
path, or a module's name, are identifiers, not narration); so are results/ (generated pages and
raw logs are data). The checked documents are the evidence's: README.md and tests/gpu/'s Markdown;
the GPU harness's comments and docstrings are checked for the narrating senses of its words below.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ORDINAL = r"(?:second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth)"
NARRATION = {
    "a dated entry": r"\b20\d\d-\d\d-\d\d\b",
    "a clock time of a run": r"\b\d\d:\d\d(?:-\d\d:\d\d)? UTC\b",
    "an ordinal run, machine or session": rf"\b(?:first|{ORDINAL}) (?:session|machine|call|GPU run)s?\b",
    "an ordinal as a name": rf"\bthe {ORDINAL} (?:one|target|run)\b",
    "a session": r"\bsessions?\b(?<!HTTP session)",
    "the next run's needs": r"\bwhat the next (?:run|session|machine)\b|\bneeds first\b|\bnext session\b",
    "a device call": r"\bdevice (?:call|tool|time|seconds|machine)s?\b|\b(?:a|one|per|each|every|this|that|the|next|last|two|three|four|five|six) calls?\b",
    "parts moved between machines": r"\bcarr(?:y|ies|ied|ying)\b",
    "a machine's lease": r"\bwent back\b|\bgiven back\b|\bwarm machine\b|\bheld time\b|\bwas lent\b|\bmachine was lost\b",
}
PATTERNS = {why: re.compile(rx, re.I) for why, rx in NARRATION.items()}

_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_MARK = re.compile(r"<!--.*?-->", re.S)


def documents() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "README.md", "tests/gpu/*.md"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in tracked if not p.startswith("tests/gpu/results/")]


def prose(text: str) -> str:
    """The text a reader reads as prose: code, link targets and comments blanked (lines kept)."""
    blank = lambda m: re.sub(r"[^\n]", " ", m.group(0))  # noqa: E731
    for rx in (_MARK, _CODE, _LINK_TARGET):
        text = rx.sub(blank, text)
    return text


def narration(text: str) -> list[tuple[int, str, str]]:
    text = prose(text)
    found = []
    for why, rx in PATTERNS.items():
        for m in rx.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, why, m.group(0)))
    return sorted(found)


@pytest.mark.parametrize("doc", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_document_holds_no_narration(doc):
    found = narration(doc.read_text(encoding="utf-8"))
    assert not found, "\n".join(f"{doc.relative_to(ROOT)}:{line}: {why}: {hit!r}" for line, why, hit in found)


@pytest.mark.parametrize("phrase", [
    "### Served speed (2026-11-27, sixth session, H100)",
    "What the next session needs first: the NVFP4 rows.",
    "The machine went back while the script was being written.",
    "one device call per bundle part, the last one running the rounds",
    "Checkpoints are carried to the next machine in parts.",
    "The fifth target passes the gate.",
    "from five calls on one H200 machine (14:13-14:31 UTC)",
])
def test_the_check_finds_narration_added_to_a_document(phrase):
    text = (ROOT / "tests" / "gpu" / "README.md").read_text(encoding="utf-8")
    assert narration(text) == []
    assert narration(text + "\n" + phrase + "\n"), phrase


def test_identifiers_and_library_terms_are_not_narration():
    assert narration("`results/trained/target-2026-11-29/x.log` and `seeded.py`; an HTTP session; "
                     "call it as `.venv/bin/launcher`; [log](results/served-2026-11-27.log)") == []


# The GPU harness's comments and docstrings (issue 52, item 2: "Markdown and comments"). Code says
# "call" and "session" in their library senses (a function call, a process session of its own),
# and "carry" in its plain one (a record carries a hash), so these patterns name the narrating
# senses only: a dated event, the remote runner's calls and machines, parts carried between them.
CODE_NARRATION = {
    "a dated entry": NARRATION["a dated entry"],
    "a clock time of a run": NARRATION["a clock time of a run"],
    "an ordinal session or machine": rf"\b(?:first|{ORDINAL}) (?:session|machine|GPU run)s?\b",
    "a work session": r"\b(?:this|next|last|a later|an earlier|each|every|per|one) sessions?\b(?! of its own)"
                      r"|\bsessions\b|\bbetween sessions\b",
    "a device call": NARRATION["a device call"].split("|\\b(?:a|one")[0],
    "a call as a unit of work": r"\bcalls? cut short\b|\b(?:earlier|later|next|this) calls? (?:on|ran)\b"
                                r"|\bcall's \d+ s\b|\bper call\b|\bbetween calls\b|\ba call of its own\b",
    "a machine's lease": NARRATION["a machine's lease"].replace(r"\bwent back\b|", r"\bmachine went back\b|"),
    "parts carried between machines": r"\bcarr(?:y|ied|ying) (?:back|there|here|the result)\b|\bwas carried\b"
                                      r"|\bwhen carried\b|\bthe carried\b|\bcarried (?:as|back)\b",
}
CODE_PATTERNS = {why: re.compile(rx, re.I) for why, rx in CODE_NARRATION.items()}
# A date that is a source's, not an event's: the published config a shape was transcribed from.
CODE_PROVENANCE = {("tests/gpu/models/fullsize_shapes.py", "2026-04-03")}
_PATHLIKE = re.compile(r"\S*/\S*")  # a results/... path names a record, dated or not


def code_text(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment, and of every docstring for Python, in ``path``."""
    import ast
    import io
    import tokenize

    src = path.read_text(encoding="utf-8")
    if path.suffix != ".py":
        return [(i, m.group(1)) for i, line in enumerate(src.splitlines(), 1)
                if (m := re.search(r"(?:^|\s)#(?!!)(.*)$", line))]
    out = [(t.start[0], t.string) for t in tokenize.generate_tokens(io.StringIO(src).readline)
           if t.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    return out


def code_narration(text: str) -> list[tuple[str, str]]:
    text = _PATHLIKE.sub(" ", text)
    return [(why, m.group(0)) for why, rx in CODE_PATTERNS.items() for m in rx.finditer(text)]


def harness_files() -> list[Path]:
    tracked = subprocess.run(["git", "ls-files", "tests/gpu", "Makefile", ".ci"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / p for p in tracked if not p.startswith("tests/gpu/results/")
            and (p.endswith((".py", ".sh")) or p in ("Makefile",) or p.startswith(".ci/"))]


def test_the_harness_comments_hold_no_narration():
    found = []
    for path in harness_files():
        rel = str(path.relative_to(ROOT))
        for line, text in code_text(path):
            found += [f"{rel}:{line}: {why}: {hit!r}" for why, hit in code_narration(text)
                      if (rel, hit) not in CODE_PROVENANCE]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("comment", [
    "# Files in /tmp survive between calls on a warm device machine",
    "# A result left by an earlier call on the warm machine must not stand in",
    "# Measured (2026-11-27): that holds only without inductor",
    "# The device call has a hard limit",
    "# Carry the trained checkpoints between sessions instead of training them again",
    "# quantize here, carry the result there",
    "# so they outlive a call's 600 s",
])
def test_the_harness_check_finds_narration_in_a_comment(comment):
    assert code_narration(comment), comment


def test_library_senses_in_code_are_not_narration():
    assert code_narration("# in a session of its own (setsid); a function call; each call of propose; "
                          "records carry the series hash; tests/gpu/results/trained/sweep-2026-11-28") == []
