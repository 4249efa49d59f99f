"""Token ids with each token's character offsets, what a chat mask needs (raypack.chat.token_mask):
from `tokenizers` (the reference: encode_batch with offsets, ~3 MB/s a core), or from a fast
backend's ids alone where the tokenizer is a byte-level BPE, whose every id stands for a fixed byte
string (ByteOffsets). Pure: no Ray, no files.

A byte-level token's bytes are its vocabulary entry read through the GPT-2 byte alphabet (an added
token: its content's UTF-8), so its byte offsets are running sums of those lengths. `tokenizers`
reports character offsets: a token starts in the character holding its first byte and ends after
the character holding its last, so every token of a character split into several (日 is three bytes,
often three tokens) holds that character; a ByteLevel post-processor with trim_offsets then drops a
token's leading and trailing spaces (the space of "Ġword" belongs to no token). ByteOffsets does the
same arithmetic, and is trusted only where it proved equal to tokenizers' offsets: the backend's
self-check compares every offset of its probes and corpus sample (raypack.pipeline.backends), each
task re-checks a sample (raypack.pipeline.encode.Checker), and a difference fails the job over to
tokenizers, as ids do.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ByteOffsets", "Coder", "normal_forms", "reference_coder", "unchanged"]

Coder = Callable[[list[str]], list[tuple[np.ndarray, np.ndarray]]]
"""texts → each text's (ids int32, character offsets int64 (n, 2)), special tokens not added."""


def reference_coder(tokenizer: Any) -> Coder:
    """tokenizers' own ids and offsets."""

    def encode(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (np.asarray(e.ids, dtype=np.int32), np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2))
            for e in tokenizer.encode_batch(texts, add_special_tokens=False)
        ]

    return encode


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the character that stands for each byte, → the byte."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_ALPHABET = _byte_alphabet()
_SPACE = next(c for c, b in _ALPHABET.items() if b == 0x20)  # "Ġ"
# Normalizers that leave a text in their form as it is (tokenizers' names are unicodedata's).
_FORMS = ("NFC", "NFD", "NFKC", "NFKD")


@dataclass(frozen=True)
class ByteOffsets:
    """Each id's byte length, and the spaces trim_offsets drops from its start and end."""

    length: np.ndarray
    lead: np.ndarray
    trail: np.ndarray
    forms: tuple[str, ...]
    """The Unicode normal forms the tokenizer's normalizer applies (NFC, NFKC, ...; () for none or
    an empty Sequence): a text each leaves as it is is the text it encodes (others are the
    reference's to encode)."""
    keep_first: bool = False
    """A token starting the text keeps a leading space of one (trim_offsets with add_prefix_space)."""

    @classmethod
    def of(cls, tokenizer_json: str) -> ByteOffsets | None:
        """The table of a byte-level BPE: its pre-tokenizer a ByteLevel without a prefix space,
        maybe after Split, Digits or Punctuation (which only split); no normalizer but Unicode
        normal forms, alone or in a Sequence (an empty one included); a post-processor that adds
        no offsets of its own. None for any other tokenizer: its offsets do not follow from ids."""
        spec = json.loads(tokenizer_json)
        model = spec.get("model") or {}
        if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
            return None
        forms = normal_forms(spec.get("normalizer"))
        if forms is None:
            return None
        levels = _steps(spec.get("pre_tokenizer"), "pretokenizers")
        byte_level = [p for p in levels if p.get("type") == "ByteLevel"]
        if len(byte_level) != 1 or byte_level[0].get("add_prefix_space"):
            return None
        if any(p.get("type") not in ("ByteLevel", "Split", "Digits", "Punctuation") for p in levels):
            return None
        trim = keep_first = False
        for p in _steps(spec.get("post_processor"), "processors"):
            if p.get("type") == "ByteLevel":
                # trim_offsets drops a token's spaces from its offsets; with add_prefix_space it keeps
                # the one space of a token that starts the text (tokenizers' process_offsets).
                trim = bool(p.get("trim_offsets"))
                keep_first = trim and bool(p.get("add_prefix_space"))
            elif p.get("type") != "TemplateProcessing":  # its special tokens are off (add_special_tokens)
                return None
        added = {int(t["id"]): str(t["content"]) for t in spec.get("added_tokens") or []}
        size = max([*model["vocab"].values(), *added, -1]) + 1
        length = np.zeros(size, dtype=np.int64)
        lead = np.zeros(size, dtype=np.int64)
        trail = np.zeros(size, dtype=np.int64)
        for token, i in model["vocab"].items():
            if i in added:
                continue
            if any(c not in _ALPHABET for c in token):
                return None  # a token that stands for no fixed bytes
            length[i] = len(token)
            if trim:
                lead[i] = len(token) - len(token.lstrip(_SPACE))
                trail[i] = len(token) - len(token.rstrip(_SPACE))
        for i, content in added.items():
            length[i] = len(content.encode("utf-8"))
            if trim:
                lead[i] = len(content.encode("utf-8")) - len(content.lstrip().encode("utf-8"))
                trail[i] = len(content.encode("utf-8")) - len(content.rstrip().encode("utf-8"))
        return cls(length, lead, trail, forms, keep_first)

    def identity(self, text: str) -> bool:
        """Whether the tokenizer encodes `text` as it stands (unchanged)."""
        return unchanged(self.forms, text)

    def offsets(self, text: str, ids: np.ndarray) -> np.ndarray:
        """Each token's (start, end) character offsets in `text`, as tokenizers reports them."""
        n = self.length[ids]
        end = np.cumsum(n)
        start = end - n
        lead = self.lead[ids]
        if self.keep_first:
            lead = np.where((start == 0) & (lead == 1), 0, lead)
        start, end = np.minimum(start + lead, end), end - self.trail[ids]
        end = np.maximum(end, start)
        if text.isascii():
            return np.stack([start, end], axis=1)
        # The byte each character starts at: its UTF-8 length from its code point.
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        width = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
        first = np.cumsum(width) - width
        char_start = np.searchsorted(first, start, side="right") - 1
        # An empty token (trim_offsets took all of it: a run of spaces) sits at a character
        # boundary: the characters that start before it, however wide the one before ('é ': the
        # space token is [2, 2], not [1, 1], where 'é' is 2 bytes).
        empty_at = np.searchsorted(first, start, side="left")
        char_end = np.where(end > start, np.searchsorted(first, end - 1, side="right"), empty_at)
        char_start = np.where(end > start, char_start, empty_at)
        return np.stack([char_start, char_end], axis=1).astype(np.int64)

    def coder(self, fast: Any, reference: Coder) -> Coder:
        """A fast encoder's ids (one flat buffer a batch) with these offsets; texts the tokenizer
        would normalize go to `reference`."""

        def encode(texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
            plain = [i for i, t in enumerate(texts) if self.identity(t)]
            out: list[Any] = [None] * len(texts)
            if plain:
                flat, lengths = fast.encode([texts[i] for i in plain])
                ends = np.cumsum(lengths)
                for k, i in enumerate(plain):
                    ids = flat[ends[k] - lengths[k] : ends[k]]
                    out[i] = (ids, self.offsets(texts[i], ids))
            rest = [i for i in range(len(texts)) if out[i] is None]
            for i, coded in zip(rest, reference([texts[i] for i in rest]) if rest else [], strict=True):
                out[i] = coded
            return out

        return encode


def unchanged(forms: tuple[str, ...], text: str) -> bool:
    """Whether every normal form of `forms` leaves `text` as it is (NFKC changes 'ﬁ', '²' and
    full-width letters; a text without such characters is its own NFKC). Python 3.11's unicodedata
    is Unicode 14, newer than the tables of tokenizers' normalizer crate, and normalization is
    stable across versions: a text Python finds normalized, tokenizers leaves as it is."""
    return text.isascii() or all(unicodedata.is_normalized(form, text) for form in forms)  # type: ignore[arg-type]


def normal_forms(spec: dict[str, Any] | None) -> tuple[str, ...] | None:
    """A normalizer's Unicode normal forms in order (() for none or an empty Sequence), or None when
    it does more than normal forms (Lowercase, Replace, Prepend...)."""
    forms = tuple(n.get("type", "") for n in _steps(spec, "normalizers"))
    return forms if all(form in _FORMS for form in forms) else None


def _steps(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A normalizer's, pre-tokenizer's or post-processor's steps, a Sequence unfolded ([] for none)."""
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [s for inner in spec.get(key) or [] for s in _steps(inner, key)]
    return [spec]
