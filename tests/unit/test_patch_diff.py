"""The exact-context applier: offsets, reversal, line endings, end-of-file newlines, failures.

Small hand-written diffs over small byte strings: these test the applier's
rules, not vLLM (the integration tests run real patches on real vLLM files).
"""

from __future__ import annotations

import pytest

from launcher.errors import LauncherError
from launcher.patching.diff import HunkMismatch, apply_file, parse

MODIFY = """diff --git a/vllm/m.py b/vllm/m.py
index 1111111..2222222 100644
--- a/vllm/m.py
+++ b/vllm/m.py
@@ -2,3 +2,4 @@ def f():
 two
-three
+THREE
+three and a half
 four
"""

BODY = b"one\ntwo\nthree\nfour\nfive\n"


def _one(text: str):
    (fp,) = parse(text, "test.patch")
    return fp


def test_forward_then_reverse_round_trips():
    fp = _one(MODIFY)
    out = apply_file(BODY, fp)
    assert out.content == b"one\ntwo\nTHREE\nthree and a half\nfour\nfive\n" and out.offsets == [0]
    assert apply_file(out.content, fp.reversed()).content == BODY
    with pytest.raises(HunkMismatch):
        apply_file(out.content, fp)  # applied once, it no longer fits forwards


def test_hunk_found_at_an_offset():
    fp = _one(MODIFY)
    out = apply_file(b"zero\nzero\n" + BODY, fp)
    assert out.offsets == [2]
    assert b"THREE\nthree and a half\n" in out.content


def test_mismatch_names_the_hunk_and_the_first_differing_line():
    fp = _one(MODIFY)
    with pytest.raises(HunkMismatch) as err:
        apply_file(b"one\ntwo\n3\nfour\n", fp)
    text = str(err.value)
    assert text.startswith("vllm/m.py hunk 1/1 (@@ -2,3 +2,4 @@ def f():)")
    assert "at line 3 it expects 'three' but the file has '3'" in text


def test_crlf_file_gets_crlf_lines_and_keeps_its_own_bytes():
    crlf = BODY.replace(b"\n", b"\r\n")
    out = apply_file(crlf, _one(MODIFY)).content
    assert out == b"one\r\ntwo\r\nTHREE\r\nthree and a half\r\nfour\r\nfive\r\n"


def test_no_newline_at_end_of_file_on_both_sides():
    diff = (
        "diff --git a/vllm/e.py b/vllm/e.py\n--- a/vllm/e.py\n+++ b/vllm/e.py\n"
        "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n\\ No newline at end of file\n"
    )
    fp = _one(diff)
    assert apply_file(b"a\nb", fp).content == b"a\nc"
    assert apply_file(b"a\nc", fp.reversed()).content == b"a\nb"


def test_adding_the_missing_final_newline():
    diff = (
        "diff --git a/vllm/e.py b/vllm/e.py\n--- a/vllm/e.py\n+++ b/vllm/e.py\n"
        "@@ -1,2 +1,3 @@\n a\n-b\n\\ No newline at end of file\n+b\n+c\n"
    )
    assert apply_file(b"a\nb", _one(diff)).content == b"a\nb\nc\n"


def test_new_and_deleted_files():
    add = (
        "diff --git a/vllm/n.py b/vllm/n.py\nnew file mode 100755\nindex 0000000..1111111\n"
        "--- /dev/null\n+++ b/vllm/n.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    )
    fp = _one(add)
    assert fp.kind == "add" and fp.new_mode == 0o755
    assert apply_file(None, fp).content == b"x = 1\ny = 2\n"
    with pytest.raises(HunkMismatch, match="already exists"):
        apply_file(b"x = 1\n", fp)
    back = fp.reversed()
    assert back.kind == "delete" and apply_file(b"x = 1\ny = 2\n", back).content is None
    with pytest.raises(HunkMismatch, match="content differs"):
        apply_file(b"x = 1\ny = 3\n", back)


def test_zero_context_insertion():
    diff = "diff --git a/vllm/z.py b/vllm/z.py\n--- a/vllm/z.py\n+++ b/vllm/z.py\n@@ -2,0 +3 @@\n+inserted\n"
    assert apply_file(b"a\nb\nc\n", _one(diff)).content == b"a\nb\ninserted\nc\n"


def test_trimmed_blank_context_line_still_matches():
    # Editors strip the single space of a blank context line; unidiff reads it as empty.
    diff = (
        "diff --git a/vllm/b.py b/vllm/b.py\n--- a/vllm/b.py\n+++ b/vllm/b.py\n"
        "@@ -1,3 +1,3 @@\n a\n\n-c\n+C\n"
    )
    assert apply_file(b"a\n\nc\n", _one(diff)).content == b"a\n\nC\n"


def test_two_hunks_apply_in_order_and_fail_on_the_second():
    diff = (
        "diff --git a/vllm/t.py b/vllm/t.py\n--- a/vllm/t.py\n+++ b/vllm/t.py\n"
        "@@ -1,2 +1,2 @@\n-a\n+A\n b\n@@ -5,2 +5,2 @@\n e\n-f\n+F\n"
    )
    fp = _one(diff)
    assert apply_file(b"a\nb\nc\nd\ne\nf\n", fp).content == b"A\nb\nc\nd\ne\nF\n"
    with pytest.raises(HunkMismatch) as err:
        apply_file(b"a\nb\nc\nd\ne\nX\n", fp)
    assert err.value.hunk.index == 2 and "hunk 2/2" in str(err.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not a diff at all\n", "contains no diff"),
        ("diff --git a/vllm/x b/vllm/x\nGIT binary patch\nliteral 0\n", "binary|no diff"),
        (
            "diff --git a/vllm/a.py b/vllm/b.py\nsimilarity index 100%\nrename from vllm/a.py\nrename to vllm/b.py\n",
            "renames|no diff",
        ),
    ],
)
def test_unsupported_diffs_are_refused(text, message):
    with pytest.raises(LauncherError, match=message):
        parse(text, "x.patch")
