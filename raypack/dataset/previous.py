"""The dataset a `pack --overwrite` replaces, kept until the new one is committed.

Deleted as the job starts, it would be lost to a job stopped in its assign+write (Ctrl-C, an error,
a kill): neither dataset left, and the old one tokenized and packed again from nothing. So, on a
local output, the old dataset's parts are moved (renamed: no bytes copied) into `.raypack-previous/`
under the output as the job clears it; the job's commit deletes them, and a job that fails puts them
back, its own files gone. A job killed outright cannot put them back: the next job on that output
does, before it looks at it (recover). So at every moment one complete dataset is there or set aside,
and what sets it aside is never a loss. The price: room on the disk for both while the job runs.

On object storage a move is a copy of every object: the old dataset is deleted as the job clears
the output (`raypack rebuild` is the atomic path there)."""

from __future__ import annotations

import os
import shutil
from contextlib import suppress

from raypack.dataset.layout import MANIFEST
from raypack.paths import is_uri
from raypack.storage import join, remove

__all__ = ["FAILED_REJECTS", "PREVIOUS", "aside_note", "discard", "held", "recover", "restore", "set_aside"]

PREVIOUS = ".raypack-previous"
_WHOLE = ".whole"  # in PREVIOUS: every part of the dataset is there
FAILED_REJECTS = "rejects.failed"
"""Where a failed job's rejects go when the dataset it was to replace comes back (their own place is
that dataset's rejects/): the error that stopped the job names it."""


def set_aside(out: str, parts: tuple[str, ...]) -> bool:
    """Move the dataset's `parts` under out/PREVIOUS, its manifest first (out no longer reads as
    complete before any part has gone); whether there was one to keep. Local outputs only."""
    if is_uri(out) or not os.path.isfile(join(out, MANIFEST)):
        return False
    keep = join(out, PREVIOUS)
    shutil.rmtree(keep, ignore_errors=True)  # (recover found none, or a part-written one of no dataset)
    os.mkdir(keep)
    # An earlier failed job's rejects are no part of the dataset: cleared with the output, not kept
    # (kept, they would stand in the way of a second failure's own as it puts the dataset back).
    for part in (MANIFEST, *(p for p in parts if p not in (MANIFEST, FAILED_REJECTS))):
        with suppress(FileNotFoundError):
            os.rename(join(out, part), join(keep, part))
    # Every part moved: what the output holds from here on is the new job's. A job killed before
    # this left some of the old dataset's parts in place, which recover must not delete.
    open(join(keep, _WHOLE), "wb").close()
    return True


def held(out: str) -> bool:
    """A dataset is set aside under `out`."""
    return not is_uri(out) and os.path.isfile(join(out, PREVIOUS, MANIFEST))


def aside_note(out: str) -> str:
    """What a command that finds no dataset at `out` says where one is set aside (a stopped
    `--overwrite` that could not put it back: one killed, or stopped twice in a row as it ended),
    else "": without it, verify and convert say only "no manifest.json", and the dataset looks lost."""
    if not held(out) or os.path.isfile(join(out, MANIFEST)):
        return ""
    return (
        f"; the dataset it held is set aside in {join(out, PREVIOUS)} by a stopped `--overwrite`, and the "
        "next `raypack pack` with this output puts it back"
    )


def restore(out: str, parts: tuple[str, ...]) -> bool:
    """Put the dataset set aside under `out` back, the failed job's parts gone first (its rejects
    kept, as FAILED_REJECTS), the manifest last; whether there was one."""
    keep = join(out, PREVIOUS)
    if not held(out):
        return False
    if os.path.isfile(join(out, MANIFEST)):  # stopped after its commit: the new dataset stands
        discard(out)
        return False
    if os.path.exists(join(keep, _WHOLE)):  # the output's parts are the failed job's
        rejects, failed = join(out, "rejects"), join(out, FAILED_REJECTS)
        if os.path.isdir(rejects) and os.listdir(rejects):
            shutil.rmtree(failed, ignore_errors=True)
            os.rename(rejects, failed)
        for part in parts:
            if part != FAILED_REJECTS:
                remove(join(out, part))
        os.remove(join(keep, _WHOLE))
    for part in sorted(os.listdir(keep), key=lambda p: p == MANIFEST):
        kept, there = join(keep, part), join(out, part)
        if os.path.lexists(there):  # (a set-aside of an older raypack's held FAILED_REJECTS too)
            if part == FAILED_REJECTS:
                remove(kept)  # the later failure's rejects stay
                continue
            remove(there)
        os.rename(kept, there)
    os.rmdir(keep)
    return True


def discard(out: str) -> None:
    """The dataset set aside deleted: the new one is committed."""
    if not is_uri(out):
        shutil.rmtree(join(out, PREVIOUS), ignore_errors=True)


def recover(out: str, parts: tuple[str, ...]) -> str | None:
    """What a job killed mid-way left, settled before another looks at `out`: the dataset it set aside
    put back where it committed none, deleted where it did; a note for the user where one came back."""
    if is_uri(out) or not os.path.isdir(join(out, PREVIOUS)):
        return None
    if not restore(out, parts):
        discard(out)  # the killed job committed its own, or was killed before anything was set aside
        return None
    return f"put back the dataset at {out} that a stopped `--overwrite` had set aside ({PREVIOUS})"
