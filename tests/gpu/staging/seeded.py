"""Which records in a work folder were seeded from another host, not made on this one.

``remote.sh seed_raw`` copies raw records staged from an earlier host (.stage/NAME) into a work
folder so that this host's runs can be judged against them, and lists each copy in
``seeded.txt``. Those copies are inputs here: a merge of the folder's records must not let one of
them replace the record of its configuration that the results file already holds, which may be
newer (a rerun on a later host). A run that writes its own record takes the name off the list.
"""

from __future__ import annotations

import fcntl
from pathlib import Path

LIST = "seeded.txt"


def names(folder: Path) -> set[str]:
    """The file names in ``folder`` that were seeded, not written here."""
    listed = folder / LIST
    return set(listed.read_text().split()) if listed.exists() else set()


def unseed(folder: Path, name: str) -> None:
    """``name`` (a file name in ``folder``) was just written here: it is this host's now.
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
