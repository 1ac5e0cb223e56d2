"""tests/gpu/remote.sh's verbs: each one something runs or documents, so that a verb nothing uses
cannot stay in (or come back to) the script unnoticed (issue 52, item 4).

A verb is in use when one of these names it as a command (``remote.sh VERB``, or evidence.py's
``_remote("VERB")`` step): evidence.py's page steps, the Makefile, a plan under tests/gpu/plans/,
tests/gpu/README.md or README.md; or the code of a verb in use does (a background job such as
lanes-bg starting ``bash tests/gpu/remote.sh realshape-trained``). Comments do not count: a verb
only mentioned in a comment is not run by it.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "tests" / "gpu"
REMOTE = GPU / "remote.sh"

# A verb nothing above names, kept for a reason given here. Empty: every verb is named.
EXEMPT: dict[str, str] = {}

_COMMENT = re.compile(r"(?:^|(?<=\s))#.*$", re.M)


def _split(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """(the case block's verbs: verb -> its action, the functions: name -> body), comments out."""
    functions, case = text.split('\ncase "$cmd" in\n')
    verbs = {m.group(1): m.group(2) for m in re.finditer(r"^    ([a-z0-9-]+)\) (.*?);;$", case, re.M)}
    bodies = {m.group(1): _COMMENT.sub("", m.group(2))
              for m in re.finditer(r"^([a-z_0-9]+)\(\) \{(.*?)^\}$", functions, re.M | re.S)}
    return verbs, bodies


def _names(text: str, verb: str) -> bool:
    return re.search(rf"remote\.sh +{re.escape(verb)}(?![\w-])", text) is not None


def _sources() -> list[str]:
    return [(GPU / "reports" / "evidence.py").read_text(), (ROOT / "Makefile").read_text(), (GPU / "README.md").read_text(),
            (ROOT / "README.md").read_text(), *(p.read_text() for p in sorted((GPU / "plans").glob("*.sh")))]


def unused(text: str, sources: list[str]) -> list[str]:
    """The verbs of remote.sh TEXT that no source names and no verb in use runs."""
    verbs, bodies = _split(text)
    evidence = sources[0]
    used = {v for v in verbs if f'_remote("{v}"' in evidence or any(_names(s, v) for s in sources)}
    while True:
        # Every function a verb in use reaches, through the functions it calls.
        todo, reached = [verbs[v] for v in used], set()
        while todo:
            code = todo.pop()
            for name, body in bodies.items():
                if name not in reached and re.search(rf"(?<![\w-]){name}(?![\w-])", code):
                    reached.add(name)
                    todo.append(body)
        code = [verbs[v] for v in used] + [bodies[f] for f in reached]
        more = {v for v in verbs if v not in used and any(_names(c, v) for c in code)}
        if not more:
            return sorted(set(verbs) - used)
        used |= more


def test_the_case_block_is_read_whole():
    verbs, bodies = _split(REMOTE.read_text())
    assert len(verbs) >= 30 and {"receive", "lanes-bg", "served-all", "target-bg"} <= verbs.keys()
    # Every verb's action is a function of the script or an inline command that runs one.
    for verb, action in verbs.items():
        assert any(re.search(rf"(?<![\w-]){f}(?![\w-])", action) for f in bodies), (verb, action)


def test_every_verb_is_run_or_documented():
    left = [v for v in unused(REMOTE.read_text(), _sources()) if v not in EXEMPT]
    assert not left, f"remote.sh verbs nothing runs or documents (remove them, or name them): {left}"


def test_each_exemption_is_a_verb_with_a_reason():
    verbs, _ = _split(REMOTE.read_text())
    for verb, why in EXEMPT.items():
        assert verb in verbs and len(why.split()) >= 5, verb


def test_a_verb_nothing_names_is_found(tmp_path):
    """The check fails on a dead verb: one added to the case block, one that only a comment names,
    and one that only a dead verb runs; a verb a verb in use runs in the background passes."""
    text = REMOTE.read_text().replace(
        '\ncase "$cmd" in\n',
        "\nold_job() { # the job remote.sh ghost-b ran\n    bash tests/gpu/remote.sh ghost-c\n}\n"
        '\ncase "$cmd" in\n    ghost-a) lanes_wait ;;\n    ghost-b) old_job ;;\n    ghost-c) lanes_wait ;;\n')
    assert unused(text, _sources()) == ["ghost-a", "ghost-b", "ghost-c"]
    sources = _sources()
    sources[1] += "\nghost:\n\tbash tests/gpu/remote.sh ghost-b\n"  # the Makefile runs ghost-b
    assert unused(text, sources) == ["ghost-a"]


def test_the_usage_line_names_every_verb():
    """remote.sh with no verb or an unknown one prints its usage: a newcomer reads the verbs there."""
    text = REMOTE.read_text()
    verbs, _ = _split(text)
    usage = re.search(r'^    \*\) echo "usage: \$0 ([^"]+)"', text, re.M).group(1)
    listed = set(re.findall(r"(?:^|\|)([a-z0-9-]+)", usage))
    assert set(verbs) - listed == set()
    assert listed - set(verbs) == set()
