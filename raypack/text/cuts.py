"""Where a long text may be cut for encoding without changing its tokens.

A text over PIECE_CHARS (1 MiB) is encoded in pieces: one Encoding keeps ~100 bytes a token, so a
50M-token document encoded whole needs ~7 GB in a worker. A document's tokens must still be exactly
the reference's (`tokenizers`) for the whole text, so a cut goes only where the tokenizer provably
cannot tell it is there:

- `before`: just before a space that stands between two non-space characters, the space opening the
  next piece. Byte-level BPEs (GPT-2, Llama-3, Qwen, DeepSeek: the space opens the next word's
  pre-token), whitespace pre-tokenizers, and Metaspace with `prepend_scheme: always` (it prepends
  `▁` only to a piece that does not start with one).
- `dropped`: at such a space, which neither piece keeps: the next piece's prepended `▁` stands for it.
  SentencePiece BPEs whose normalizer prepends `▁` unconditionally (Mistral-7B-v0.1 and Llama-2's
  `Prepend("▁")` + `Replace(" ", "▁")`): cut before the space, the piece would start `▁▁`, and the
  whole text gives one `▁` (the pieces would give a token more).

A rule is proven for a tokenizer when it is first needed (`choose`): a probe text of ~26 KB (prose,
code, whitespace runs, scripts, emoji, the tokenizer's added tokens) is cut at every candidate space
of 256-character pieces, ~110 cuts, and the pieces' tokens must equal the whole text's; the first
rule proven is taken, none: long texts are encoded whole. Then every cut of a real document is
checked again where it falls (`check_cut`: the 4 KiB either side encoded whole against the two
sides, 2 × 8 KiB of encoding a MiB cut, ~1.6%), by the encoder that encodes the pieces. A cut is
sought back from a piece's end over half a piece; where no candidate passes there (none there, as in
text without spaces, or MAX_TRIES refused) the search moves on past the end, half a piece at a
time, so one bad stretch makes one longer piece, not the rest of the document one piece; at most
MAX_TRIES checks a half piece bound its cost (25% of encoding if every candidate failed). Pure: no
Ray, no files.
"""

from __future__ import annotations

import itertools
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_TRIES", "WINDOW", "CutRule", "check_cut", "choose", "cut_text", "probe_text", "segment"]

# Characters either side of a cut that check_cut encodes: a pre-token or a SentencePiece merge that
# crosses a space is a few characters long; 4 KiB covers runs of whitespace and long words.
WINDOW = 4096
# Candidate spaces checked in each half piece searched for a cut before the search moves on.
MAX_TRIES = 8
# The proof's pieces: small, so that the probe text is cut at ~110 places.
_PROOF_PIECE = 256

Encode = Callable[[list[str]], list[list[int]]]


@dataclass(frozen=True, slots=True)
class CutRule:
    """How a text is cut (see the module's docstring)."""

    name: str
    """`before` or `dropped`."""
    proof: str
    """What proved it, for the manifest."""

    @property
    def drops_space(self) -> bool:
        return self.name == "dropped"

    def pieces(self, text: str, cuts: list[int]) -> list[str]:
        """`text` cut at `cuts` (positions of spaces, increasing)."""
        skip = int(self.drops_space)
        starts = [0, *(c + skip for c in cuts)]
        ends = [*cuts, len(text)]
        return [text[a:b] for a, b in zip(starts, ends, strict=True)]


def _candidate(text: str, i: int) -> bool:
    """A space between two non-space characters, the next not a combining mark (which a normalizer
    could compose with what precedes it)."""
    return (
        text[i] == " "
        and 0 < i < len(text) - 1
        and not text[i - 1].isspace()
        and not text[i + 1].isspace()
        and not unicodedata.combining(text[i + 1])
    )


def _spaces_back(text: str, lo: int, hi: int) -> Iterator[int]:
    """Candidate spaces in text[lo:hi], last first."""
    i = text.rfind(" ", lo, hi)
    while i > lo:
        if _candidate(text, i):
            yield i
        i = text.rfind(" ", lo, i)


def check_cut(encode: Encode, rule: CutRule, text: str, at: int) -> bool:
    """Whether the text around the space at `at` encodes the same whole as in the rule's two pieces
    (WINDOW characters either side)."""
    lo, hi = max(0, at - WINDOW), min(len(text), at + 1 + WINDOW)
    left, right = rule.pieces(text[lo:hi], [at - lo])
    whole, a, b = encode([text[lo:hi], left, right])
    return whole == a + b


def cut_text(text: str, size: int, rule: CutRule | None, encode: Encode) -> tuple[list[str], int, int]:
    """`text` in pieces cut where it can be (each cut checked, check_cut): the pieces, the cuts
    made and the candidate cuts refused. A piece is at most `size` characters where a cut passes in
    its last half; where none does, it runs on to the first half piece after its end that holds
    one, and without a rule, or from where no cut passes up to the text's end, it is the rest."""
    if rule is None or len(text) <= size:
        return [text], 0, 0
    cuts: list[int] = []
    refused = 0
    start = 0
    while len(text) - start > size:
        made = None
        # Candidates lie strictly inside (lo, hi); the next half starts at hi - 1 so none is skipped.
        lo, hi = start + size // 2, start + size
        while made is None and lo < len(text) - 1:
            for at in itertools.islice(_spaces_back(text, lo, min(hi, len(text))), MAX_TRIES):
                if check_cut(encode, rule, text, at):
                    made = at
                    break
                refused += 1
            lo, hi = hi - 1, hi + size // 2
        if made is None:
            break
        cuts.append(made)
        start = made + int(rule.drops_space)
    return rule.pieces(text, cuts), len(cuts), refused


def segment(text: str, k: int, size: int) -> tuple[int, int]:
    """(start, end) of the k-th of `text`'s ceil(len / size) segments: from boundary k·size to
    boundary (k + 1)·size, a boundary moved back to a space between two words in the size/2
    characters before it where there is one, so that a segment starts as a text of words does.
    They follow one another and cover the text, each of size/2 to 1.5·size characters (the last
    of fewer). Each is found alone, for the in-run check (encode.Checker.check), which encodes a
    drawn one as a text in its own right: no cut rule is needed."""
    return _boundary(text, k * size, size), _boundary(text, (k + 1) * size, size)


def _boundary(text: str, at: int, size: int) -> int:
    if at <= 0 or at >= len(text):
        return min(max(at, 0), len(text))
    return next(_spaces_back(text, at - size // 2, at + 1), at)


def probe_text(added: list[str]) -> str:
    """The proof's text: ~26 KB of prose, code, whitespace runs, scripts and emoji, and the
    tokenizer's `added` tokens among words, joined by single spaces and newlines."""
    words = [
        "packing", "sequences,", "for", "training.", "日本語の", "テキスト", "中文", "한국어",
        "Привет,", "мир!", "مرحبا", "नमस्ते", "🙂", "👍🏽", "don't", "I'm", "'quoted'", "\"double\"",
        "e\u0301", "naïve", "ß", "3.14159", "1,000,000", "0x7fff", "x=1;", "f(x):", "{", "}", "->",
        "//", "#include", "<stdio.h>", "__init__", "CamelCase", "snake_case", "https://example.com/a?b=1",
        "\t", "  ", "    return", "\n", "\n\n", "\r\n", "...", "!!", "--", "\u00a0", "\u200b", "a" * 40,
    ]  # fmt: skip
    words += added[:64]
    # A fixed interleaving (no randomness: the proof is the same everywhere the tokenizer loads).
    out = []
    n = len(words)
    for i in range(4000):
        out.append(words[(i * 7 + i // n) % n])
    return " ".join(out)


def choose(encode: Encode, spec: dict[str, Any], added: list[str]) -> tuple[CutRule | None, str]:
    """The first rule proven for the tokenizer (see the module's docstring), or None, and why.
    `spec`: its normalizer and pre_tokenizer as tokenizer.json writes them."""
    order = ["dropped", "before"] if _prepends(spec) else ["before", "dropped"]
    text = probe_text(added)
    whole = encode([text])[0]
    tried = []
    for name in order:
        rule = CutRule(name, "")
        cuts = []
        start = 0
        while len(text) - start > _PROOF_PIECE:
            at = next(_spaces_back(text, start + _PROOF_PIECE // 2, start + _PROOF_PIECE), None)
            if at is None:
                break
            cuts.append(at)
            start = at + int(rule.drops_space)
        pieces = rule.pieces(text, cuts)
        joined = [t for ids in encode(pieces) for t in ids]
        if joined == whole:
            proof = f"{len(cuts)} cuts of a {len(text):,}-character probe text give its tokens"
            return CutRule(name, proof), proof
        tried.append(f"{name}: {len(cuts)} cuts of the probe text change its tokens")
    return None, "no cut keeps this tokenizer's tokens (" + "; ".join(tried) + "): long texts encoded whole"


def _prepends(spec: dict[str, Any]) -> bool:
    """Whether each piece gets a `▁` of its own: a normalizer's Prepend (alone or in a Sequence), or
    a Metaspace that prepends (`always`, `first`). There `dropped` is tried first: for a Metaspace
    both rules hold, and a piece that does not start with a space is one fastokens' rewrite of it
    takes (backends.fast_json; a document cut before spaces goes to tokenizers whole)."""
    normalizer = spec.get("normalizer") or {}
    parts = normalizer.get("normalizers", [normalizer]) if isinstance(normalizer, dict) else []
    if any(isinstance(p, dict) and p.get("type") == "Prepend" for p in parts):
        return True
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if isinstance(pre, dict) else []
    return any(
        isinstance(p, dict)
        and p.get("type") == "Metaspace"
        and p.get("prepend_scheme") in ("always", "first")
        for p in steps
    )
