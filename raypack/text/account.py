"""The account of what encoded a job's documents, in words: the manifest's tokenizer.backend record
(which backend and why, what the in-run check compared, what went to tokenizers, how long texts
were cut) as the summary and the report show it."""

from __future__ import annotations

from typing import Any

from raypack.text.cuts import MAX_TRIES
from raypack.text.encode import PIECE_CHARS

__all__ = ["backend_line", "counted"]


def backend_line(b: dict[str, Any]) -> str:
    """What encoded a job and what checked it, in one line: the manifest's tokenizer.backend record
    (raypack.pipeline.tokenize.stage.Tokenized.backend_record), for the summary and the report."""
    line = f"{b['chosen']}: {b['reason']}"
    checked = b["checked_in_run"]
    if checked["texts"] or checked.get("segments"):
        segments = checked.get("segments", 0)
        if not segments:
            what = counted(checked["texts"], "text")
        elif checked["texts"]:
            what = f"{counted(checked['texts'], 'text')} and {counted(segments, 'segment')} of longer ones"
        else:
            what = f"{counted(segments, 'segment')} of long texts"
        line += f"; {what} ({_size(checked['bytes'])}) re-checked with tokenizers in the run"
    routed = b.get("routed_to_tokenizers") or {}
    if routed.get("texts"):
        line += (
            f"; {counted(routed['texts'], 'text')} ({_size(routed['bytes'])}) encoded by tokenizers: "
            "fastokens' copy of this tokenizer does not encode them as it does"
        )
    if b["failovers"]:
        line += f"; FAILED OVER to tokenizers: {b['failovers'][0]}"
    long = b.get("long_texts") or {}
    if long.get("cuts") or _long_pieces(long):
        line += "; " + _long_texts_line(long)
    if long.get("units_unrecorded"):
        line += (
            f"; {long['units_unrecorded']:,} units from token store entries that predate the record of "
            "long texts' cuts: theirs are not counted"
        )
    return line


def _long_pieces(long: dict[str, Any]) -> int:
    """Texts with a piece over PIECE_CHARS (`encoded_whole` in manifests written before 2026-12-02,
    when a text's rest was one piece from where no cut was found)."""
    return int(long.get("long_pieces", long.get("encoded_whole", 0)))


def _long_texts_line(long: dict[str, Any]) -> str:
    """How the texts over PIECE_CHARS were encoded (the manifest's tokenizer.backend.long_texts):
    how many, where they were cut and by what rule, and how many have a piece over PIECE_CHARS (no
    cut passed near its end: it runs on to the next that did), and why."""
    known = long.get("texts")
    texts = f"{counted(known, 'text')} over" if known else "texts over"
    texts += f" {PIECE_CHARS:,} characters"
    name, _, proof = str(long["rule"]).partition(": ")
    where = {"dropped": "at spaces the next piece's ▁ stands for", "before": "before spaces"}
    if name not in where:  # no rule proven: every long text whole
        return f"{texts} encoded whole: {long['rule']}"
    refused = long["cuts_refused"]
    why = "no space between two words"
    if refused:
        why += f" or {MAX_TRIES} candidates refused by their checks; {counted(refused, 'refusal')} in all"
    half = f"{PIECE_CHARS // 2:,} characters"
    rule = f"the rule proven by tokenizers: {proof}"
    if not long["cuts"]:
        return f"{texts} encoded whole, as no cut {where[name]} passed ({why}; {rule})"
    line = (
        f"{texts} encoded in pieces, cut at {counted(long['cuts'], 'place')} {where[name]}, each cut checked "
        f"where it fell by the encoder of its pieces ({rule})"
    )
    if longer := _long_pieces(long):
        line += (
            f"; {longer:,} of them with a piece over {PIECE_CHARS:,} characters, as no cut passed in the "
            f"{half} before its end ({why}): such a piece runs on to the next cut that passed, or to "
            "the text's end (a text where none did is one piece)"
        )
    return line


def counted(n: int, noun: str) -> str:
    """ "1 text", "2,048 texts": the summary's and the report's counts in words."""
    return f"{n:,} {noun}{'s' if n != 1 else ''}"


def _size(n: int) -> str:
    """Bytes in MiB, or KiB under one MiB (a run's re-checked texts are often a few hundred KiB)."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
