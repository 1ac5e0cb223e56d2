"""Which records in a work folder were carried from another machine, not made on this one.

``remote.sh seed_raw`` copies an earlier machine's raw records (.stage/NAME) into a work folder
so that this machine's runs can be judged against them, and lists each copy in ``carried.txt``.
Those copies are inputs here: a merge of the folder's records must not let one of them replace
the record of its configuration that the results file already holds, which may be newer (a
rerun on a later machine). A run that writes its own record takes the name off the list.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

LIST = "carried.txt"


def names(folder: Path) -> set[str]:
    """The file names in ``folder`` that were carried in, not written here."""
    listed = folder / LIST
    return set(listed.read_text().split()) if listed.exists() else set()


def uncarry(folder: Path, name: str) -> None:
    """``name`` (a file name in ``folder``) was just written here: it is this machine's now.
    Under a lock on the list: served.py's phases save side by side in one folder."""
    listed = folder / LIST
    if name not in names(folder):
        return
    with listed.open("r+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # released when the file closes
        kept = [n for n in f.read().split() if n != name]
        f.seek(0)
        f.write("".join(f"{n}\n" for n in kept))
        f.truncate()
