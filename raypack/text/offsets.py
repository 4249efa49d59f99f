"""Token ids with each token's character offsets, what a chat mask needs (raypack.text.chat.token_mask):
from `tokenizers` (the reference: encode_batch with offsets, ~3 MB/s a core), or from a fast
backend's ids alone where every id stands for a fixed string: a byte-level BPE's bytes (ByteOffsets)
or a SentencePiece BPE's characters (PieceOffsets). `offsets_of` picks the table a tokenizer has.
Pure: no Ray, no files.

A byte-level token's bytes are its vocabulary entry read through the GPT-2 byte alphabet (an added
token: its content's UTF-8), so its byte offsets are running sums of those lengths. `tokenizers`
reports character offsets: a token starts in the character holding its first byte and ends after
the character holding its last, so every token of a character split into several (日 is three bytes,
often three tokens) holds that character; a ByteLevel post-processor with trim_offsets then drops a
token's leading and trailing spaces (the space of "Ġword" belongs to no token). ByteOffsets does the
same arithmetic, and is trusted only where it proved equal to tokenizers' offsets: the backend's
self-check compares every offset of its probes and corpus sample (raypack.text.backends), each
task re-checks a sample (raypack.text.encode.Checker), and a difference fails the job over to
tokenizers, as ids do.
"""

from __future__ import annotations

import json
import re
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "PLAIN",
    "PREPEND",
    "ByteOffsets",
    "Coded",
    "Coder",
    "PieceOffsets",
    "added_pattern",
    "forms_beside",
    "metaspace_copy",
    "normal_forms",
    "offsets_of",
    "reference_coder",
    "unchanged",
]


class Coded(NamedTuple):
    """A batch of texts encoded: every text's ids back to back, each token's (start, end) character
    offsets in its own text, and each text's token count. Whole arrays, not a pair a text: numpy's
    calls a text cost ~40 µs a conversation (~0.5 s of a 40 MB chat job's 2.6 s tokenize stage)."""

    ids: np.ndarray
    """int32 (tokens,)"""
    offsets: np.ndarray
    """int64 (tokens, 2)"""
    lengths: np.ndarray
    """int64 (texts,)"""
    routed: tuple[int, ...] = ()
    """The texts a fast coder gave the reference (their ids and offsets are its own)."""
    routed_s: float = 0.0
    """The reference's seconds on them."""

    def split(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each text's ids and offsets (views)."""
        ends = np.cumsum(self.lengths).tolist()
        starts = [0, *ends[:-1]]
        return [(self.ids[a:b], self.offsets[a:b]) for a, b in zip(starts, ends, strict=True)]

    @classmethod
    def of(cls, pieces: list[tuple[np.ndarray, np.ndarray]]) -> Coded:
        """The batch of these (ids, offsets), one a text."""
        if not pieces:
            return cls(np.zeros(0, np.int32), np.zeros((0, 2), np.int64), np.zeros(0, np.int64))
        return cls(
            np.concatenate([ids for ids, _ in pieces]).astype(np.int32, copy=False),
            np.concatenate([o.reshape(-1, 2) for _, o in pieces]).astype(np.int64, copy=False),
            np.fromiter((len(ids) for ids, _ in pieces), dtype=np.int64, count=len(pieces)),
        )


Coder = Callable[[list[str]], Coded]
"""texts → their Coded batch, special tokens not added."""


def reference_coder(tokenizer: Any) -> Coder:
    """tokenizers' own ids and offsets."""

    def encode(texts: list[str]) -> Coded:
        return Coded.of(
            [
                (np.asarray(e.ids, dtype=np.int32), np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2))
                for e in tokenizer.encode_batch(texts, add_special_tokens=False)
            ]
        )

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
    def of(cls, tokenizer: Any) -> ByteOffsets | None:
        """The table of a byte-level BPE (a `tokenizers.Tokenizer`): its pre-tokenizer a ByteLevel
        without a prefix space, maybe after Split, Digits or Punctuation (which only split); no
        normalizer but Unicode normal forms, alone or in a Sequence (an empty one included); a
        post-processor that adds no offsets of its own. None for any other tokenizer: its offsets
        do not follow from ids."""
        shape = _byte_level_shape(tokenizer)
        if shape is None:
            return None
        forms, trim, keep_first = shape
        added = {int(i): str(t.content) for i, t in tokenizer.get_added_tokens_decoder().items()}
        # The model's own vocabulary: 0.09 s for 131k ids, where parsing tokenizer.json takes 0.3 s
        # (in the driver twice and in every worker of a chat job).
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        size = max([*vocab.values(), *added, -1]) + 1
        length = np.zeros(size, dtype=np.int64)
        lead = np.zeros(size, dtype=np.int64)
        trail = np.zeros(size, dtype=np.int64)
        tokens = [token for token, i in vocab.items() if i not in added]
        if not set("".join(tokens)) <= _ALPHABET.keys():
            return None  # a token that stands for no fixed bytes
        # Whole arrays, not a loop a token: 0.1 s less for 131k ids.
        ids = np.fromiter((vocab[token] for token in tokens), dtype=np.int64, count=len(tokens))
        length[ids] = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
        if trim:
            lead[ids] = length[ids] - np.fromiter(
                (len(t.lstrip(_SPACE)) for t in tokens), np.int64, len(tokens)
            )
            trail[ids] = length[ids] - np.fromiter(
                (len(t.rstrip(_SPACE)) for t in tokens), np.int64, len(tokens)
            )
        for i, content in added.items():
            length[i] = len(content.encode("utf-8"))
            if trim:
                lead[i] = len(content.encode("utf-8")) - len(content.lstrip().encode("utf-8"))
                trail[i] = len(content.encode("utf-8")) - len(content.rstrip().encode("utf-8"))
        return cls(length, lead, trail, forms, keep_first)

    def takes(self, text: str) -> bool:
        """Whether the tokenizer encodes `text` as it stands (unchanged): its offsets follow."""
        return unchanged(self.forms, text)

    def offsets(self, text: str, ids: np.ndarray) -> np.ndarray:
        """Each token's (start, end) character offsets in `text`, as tokenizers reports them."""
        return self.batch([text], ids, np.asarray([len(ids)]))[0]

    def batch(self, texts: list[str], ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The offsets of a batch (`ids` every text's back to back, `lengths` their counts), each in
        its own text, and for each text whether its ids span its bytes exactly (else they are not
        its encoding, and its offsets are not to be used)."""
        doc, first = _docs(lengths)
        n = self.length[ids]
        before = np.r_[0, np.cumsum(n)]  # bytes before each token, from the batch's start
        end = before[1:] - before[first][doc]
        start = end - n
        ascii_only = all(t.isascii() for t in texts)
        size = np.fromiter(
            (len(t) if ascii_only or t.isascii() else len(t.encode("utf-8", "surrogatepass")) for t in texts),
            dtype=np.int64,
            count=len(texts),
        )
        ok = before[first + lengths] - before[first] == size
        lead = self.lead[ids]
        if self.keep_first:
            lead = np.where((start == 0) & (lead == 1), 0, lead)
        start, end = np.minimum(start + lead, end), end - self.trail[ids]
        end = np.maximum(end, start)
        if ascii_only:
            return np.stack([start, end], axis=1), ok
        # Bytes to characters, for the tokens of the texts that are not ASCII alone (mapping a
        # whole batch's ~1M characters takes 13 ms, the rest of it 5): their texts as one string,
        # the byte each character starts at (its UTF-8 length from its code point), each text
        # after the bytes and characters of the ones before it.
        wide = np.fromiter((not t.isascii() for t in texts), dtype=bool, count=len(texts))
        picked = [t for t in texts if not t.isascii()]
        points = np.frombuffer("".join(picked).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        width = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
        # The character each byte belongs to, and whether it is that character's first; one more
        # place for the end. A lookup a token: a binary search over the characters costs 3x.
        owner = np.r_[np.repeat(np.arange(len(points)), width), len(points)]
        leads = np.zeros(len(owner), dtype=bool)
        leads[np.cumsum(width) - width] = True
        leads[-1] = True
        chars = np.fromiter(map(len, picked), dtype=np.int64, count=len(picked))
        nth = (np.cumsum(wide) - 1)[doc]  # a token's text among the picked ones
        tokens = wide[doc]
        nth = nth[tokens]
        byte_base = (np.cumsum(size[wide]) - size[wide])[nth]
        char_base = (np.cumsum(chars) - chars)[nth]
        at = np.minimum(start[tokens] + byte_base, len(owner) - 1)  # (ids that overrun: not ok)
        to = np.minimum(end[tokens] + byte_base, len(owner) - 1)
        # An empty token (trim_offsets took all of it: a run of spaces) sits at a character
        # boundary: the characters that start before it, however wide the one before ('é ': the
        # space token is [2, 2], not [1, 1], where 'é' is 2 bytes).
        empty_at = owner[at] + ~leads[at]
        full = to > at
        start[tokens] = np.where(full, owner[at], empty_at) - char_base
        end[tokens] = np.where(full, owner[np.maximum(to - 1, 0)] + 1, empty_at) - char_base
        return np.stack([start, end], axis=1).astype(np.int64), ok

    def coder(self, fast: Any, reference: Coder, routed: list[int] | None = None) -> Coder:
        """A fast encoder's ids (one flat buffer a batch) with these offsets; texts the tokenizer
        would normalize go to `reference` (counted in `routed`: texts, UTF-8 bytes)."""
        return _coder(self, fast, reference, routed)


PREPEND, PLAIN = "prepend", "plain"


def metaspace_copy(scheme: str, added: re.Pattern[str] | None, text: str) -> str | None:
    """How a Metaspace pre-tokenizer (`split: false`, `prepend_scheme` `scheme`) writes `text`, in
    terms of normalizers that do the same to a whole text: PREPEND (`Prepend("▁")` + `Replace(" ",
    "▁")`: each section between added tokens gets a `▁`), PLAIN (the Replace alone: none does), or
    None (some sections get one and others not). Metaspace prepends to a section that does not
    start with `▁` after the Replace; with `first`, only to the section that starts the text
    (tokenizers' metaspace.rs: `offsets_original().0 == 0`). `added`: a pattern finding any added
    token, longest first."""
    holds = added.search(text) if added is not None else None
    if text[:1] in (" ", "▁"):
        return PLAIN if scheme == "first" or holds is None else None
    if holds is None:
        return PREPEND
    return PLAIN if scheme == "first" and holds.start() == 0 else None


# A SentencePiece BPE's byte-fallback tokens, <0x00> ... <0xFF>: one byte of a character no piece holds.
_BYTES = {f"<0x{b:02X}>": b for b in range(256)}
_PIECE, _ADDED, _LEAD, _CONTINUATION = 0, 1, 2, 3


@dataclass(frozen=True)
class PieceOffsets:
    """A SentencePiece BPE's offsets from its ids (Llama 2, Mistral 7B, Gemma: byte fallback, a
    space written `▁`), for the shapes tokenizers gives such a model:
    - a normalizer `Replace(" ", "▁")`, with or without `Prepend("▁")` (the published
      tokenizer.json of Llama 2 and Mistral 7B have both, Gemma's the Replace alone), maybe with
      Unicode normal forms (a text they change is the reference's), no pre-tokenizer;
    - or no normalizer and a Metaspace pre-tokenizer, `split: false`, `prepend_scheme` first or
      always (transformers 5's conversion): one of those two strings for the texts metaspace_copy
      places (with `first`, every text but one that holds an added token and does not start with
      one or a space); other texts are the reference's.
    The normalized text is the text with `▁` for each space and, with Prepend, a `▁` before each
    section between added tokens; tokenizers aligns that `▁` with the section's first character. A
    piece then spans its length in normalized characters, an added token its content in the text,
    and the 1-4 byte tokens of a character (byte fallback) each span that character, as tokenizers
    reports them: `▁Hello` of "Hello" is (0, 5), `<0xF0><0x9F><0xA4><0x96>` of 🤖 are four (k, k+1)."""

    length: np.ndarray
    """Each id's length: a piece's characters, an added token's content's, 1 for a byte."""
    kind: np.ndarray
    """_PIECE, _ADDED, _LEAD (a byte that starts a character: ASCII or a UTF-8 lead) or _CONTINUATION."""
    follow: np.ndarray
    """The continuation bytes a lead byte's character has after it (0-3; 0 for any other id)."""
    prepend: bool
    forms: tuple[str, ...]
    metaspace: str | None = None
    """With the Metaspace shape, its prepend_scheme (metaspace_copy decides per text); else None."""
    added: re.Pattern[str] | None = None
    """A pattern finding any added token, longest first (with the Metaspace shape)."""

    @classmethod
    def of(cls, tokenizer: Any) -> PieceOffsets | None:
        """The table of a SentencePiece BPE of a shape above (a `tokenizers.Tokenizer`); None for
        any other tokenizer."""
        vocab = tokenizer.get_vocab(with_added_tokens=False)
        shape = _sentencepiece_shape(_state(tokenizer.normalizer), _state(tokenizer.pre_tokenizer))
        if not _byte_fallback_bpe(tokenizer, vocab) or shape is None:
            return None
        prepend, forms, scheme = shape
        added = tokenizer.get_added_tokens_decoder()
        if not _pieces_stand_alone(tokenizer, vocab, added):
            return None
        contents = {int(i): str(t.content) for i, t in added.items()}
        size = max([*vocab.values(), *contents, -1]) + 1
        length = np.zeros(size, dtype=np.int64)
        kind = np.full(size, _PIECE, dtype=np.int8)
        follow = np.zeros(size, dtype=np.int64)
        for piece, i in vocab.items():
            length[i] = len(piece)
            byte = _BYTES.get(piece)
            if byte is not None:
                length[i] = 1
                kind[i] = _CONTINUATION if 0x80 <= byte < 0xC0 else _LEAD
                follow[i] = (byte >= 0xC0) + (byte >= 0xE0) + (byte >= 0xF0)
        for i, content in contents.items():
            length[i], kind[i] = len(content), _ADDED
        return cls(length, kind, follow, prepend, forms, scheme, added_pattern(contents.values()))

    def takes(self, text: str) -> bool:
        """Whether `text`'s offsets follow from its ids (else the reference encodes it)."""
        if self.metaspace is not None and metaspace_copy(self.metaspace, self.added, text) is None:
            return False
        return unchanged(self.forms, text)

    def offsets(self, text: str, ids: np.ndarray) -> np.ndarray | None:
        """Each token's (start, end) character offsets in `text`, as tokenizers reports them; None
        where the ids do not span the text exactly (they are not its encoding: the reference's)."""
        offsets, ok = self.batch([text], ids, np.asarray([len(ids)]))
        return offsets if ok[0] else None

    def batch(self, texts: list[str], ids: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The offsets of a batch (`ids` every text's back to back, `lengths` their counts), each in
        its own text, and for each text whether its ids span it exactly (else they are not its
        encoding, and its offsets are not to be used)."""
        doc, first = _docs(lengths)
        kind = self.kind[ids]
        advance = np.where(kind == _CONTINUATION, 0, self.length[ids])
        if self.metaspace is not None:
            copies = (metaspace_copy(self.metaspace, self.added, t) == PREPEND for t in texts)
            prepend = np.fromiter(copies, dtype=bool, count=len(texts))
        else:
            prepend = np.full(len(texts), self.prepend)
        if prepend.any() and len(ids):
            # A section's first piece holds the `▁` Prepend added, which spans no character of its
            # own. A text's first token starts its first section.
            after_added = np.r_[True, kind[:-1] == _ADDED]
            after_added[first[lengths > 0]] = True
            advance -= after_added & (kind == _PIECE) & prepend[doc]
        before = np.r_[0, np.cumsum(advance)]
        end = before[1:] - before[first][doc]
        chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
        ok = before[first + lengths] - before[first] == chars
        # And as many continuation bytes as their lead bytes call for: one missing spans no
        # character, so the count of characters alone does not see it.
        owed = np.r_[0, np.cumsum(self.follow[ids] - (kind == _CONTINUATION))]
        ok &= owed[first + lengths] == owed[first]
        start = end - advance
        # A lone `▁` a section begins with spans the character it is aligned with.
        end = start + np.maximum(advance, 1)
        # A continuation byte spans its character: the offsets of the lead byte before it.
        owner = np.maximum.accumulate(np.where(kind == _CONTINUATION, -1, np.arange(len(ids))))
        owner = np.maximum(owner, first[doc])
        return np.stack([start[owner], end[owner]], axis=1).astype(np.int64), ok

    def coder(self, fast: Any, reference: Coder, routed: list[int] | None = None) -> Coder:
        """A fast encoder's ids with these offsets; the texts `takes` refuses go to `reference`
        (counted in `routed`: texts, UTF-8 bytes)."""
        return _coder(self, fast, reference, routed)


def _byte_level_shape(tokenizer: Any) -> tuple[tuple[str, ...], bool, bool] | None:
    """(the normal forms, trim_offsets, keeps a first token's space) of a byte-level BPE of the shape
    ByteOffsets takes, or None for another tokenizer."""
    if type(tokenizer.model).__name__ != "BPE":
        return None
    forms = normal_forms(_state(tokenizer.normalizer))
    if forms is None:
        return None
    levels = _steps(_state(tokenizer.pre_tokenizer), "pretokenizers")
    byte_level = [p for p in levels if p.get("type") == "ByteLevel"]
    if len(byte_level) != 1 or byte_level[0].get("add_prefix_space"):
        return None
    if any(p.get("type") not in ("ByteLevel", "Split", "Digits", "Punctuation") for p in levels):
        return None
    trim = keep_first = False
    for p in _steps(_state(tokenizer.post_processor), "processors"):
        if p.get("type") == "ByteLevel":
            # trim_offsets drops a token's spaces from its offsets; with add_prefix_space it keeps
            # the one space of a token that starts the text (tokenizers' process_offsets).
            trim = bool(p.get("trim_offsets"))
            keep_first = trim and bool(p.get("add_prefix_space"))
        elif p.get("type") != "TemplateProcessing":  # its special tokens are off (add_special_tokens)
            return None
    return forms, trim, keep_first


def _byte_fallback_bpe(tokenizer: Any, vocab: dict[str, int]) -> bool:
    """Whether the model is a plain BPE with byte fallback, every byte token in its vocabulary, and
    a post-processor that adds no offsets of its own."""
    model = tokenizer.model
    if (
        type(model).__name__ != "BPE"
        or not model.byte_fallback
        or model.dropout
        or model.continuing_subword_prefix
        or model.end_of_word_suffix
    ):
        return False
    if not all(name in vocab for name in _BYTES):
        return False
    processors = _steps(_state(tokenizer.post_processor), "processors")
    return all(p.get("type") == "TemplateProcessing" for p in processors)


def _pieces_stand_alone(tokenizer: Any, vocab: dict[str, int], added: dict[int, Any]) -> bool:
    """Whether every id spans the characters its table says: no added token that strips the spaces
    beside it, matches the normalized text or must stand as a word (it spans other characters than
    its content), none named as a byte token ("<0x0A>", a BpeTrainer's special token: one id for a
    byte and for six characters of text), and no byte token's name that becomes that token as text
    (a merge "<0x" + "0A>", or ignore_merges taking a word of the vocabulary whole)."""
    if any(
        t.lstrip or t.rstrip or t.single_word or t.normalized or t.content in _BYTES for t in added.values()
    ):
        return False
    return all([t.id for t in tokenizer.model.tokenize(name)] != [vocab[name]] for name in _BYTES)


def _sentencepiece_shape(
    normalizer: dict[str, Any] | None, pre_tokenizer: dict[str, Any] | None
) -> tuple[bool, tuple[str, ...], str | None] | None:
    """(prepends `▁`, the normal forms, the Metaspace's prepend_scheme or None) of a SentencePiece
    BPE's normalizer and pre-tokenizer (PieceOffsets), or None for another shape."""
    if normalizer is None:
        return _metaspace_shape(pre_tokenizer)
    if pre_tokenizer is not None:
        return None
    steps = _steps(normalizer, "normalizers")
    replace = [s for s in steps if s.get("type") == "Replace"]
    prepend = [s for s in steps if s.get("type") == "Prepend"]
    forms = tuple(str(s.get("type")) for s in steps if s.get("type") in _FORMS)
    if (
        len(replace) != 1
        or replace[0].get("pattern") != {"String": " "}
        or replace[0].get("content") != "▁"
        or len(prepend) > 1
        or any(s.get("prepend") != "▁" for s in prepend)
        or len(replace) + len(prepend) + len(forms) != len(steps)
    ):
        return None
    return bool(prepend), forms, None


def _metaspace_shape(pre_tokenizer: dict[str, Any] | None) -> tuple[bool, tuple[str, ...], str | None] | None:
    """_sentencepiece_shape of a tokenizer with no normalizer: a Metaspace pre-tokenizer that
    prepends `▁` (first or always) and does not split, or None."""
    if (
        pre_tokenizer is not None
        and pre_tokenizer.get("type") == "Metaspace"
        and pre_tokenizer.get("replacement") == "▁"
        and pre_tokenizer.get("split") is False
        and pre_tokenizer.get("prepend_scheme") in ("first", "always")
    ):
        return True, (), str(pre_tokenizer["prepend_scheme"])
    return None


def offsets_of(tokenizer: Any) -> ByteOffsets | PieceOffsets | None:
    """The table that gives a `tokenizers.Tokenizer`'s character offsets from its ids, or None
    where they do not follow from its ids (WordPiece, Unigram, a normalizer that rewrites text...).
    A job asks LoadedTokenizer.offsets, which keeps it."""
    return ByteOffsets.of(tokenizer) or PieceOffsets.of(tokenizer)


def _state(component: Any) -> dict[str, Any] | None:
    """A normalizer's, pre-tokenizer's or post-processor's JSON, from the component itself (a few
    hundred bytes; not a parse of a 128k vocabulary's 10 MB file)."""
    return None if component is None else json.loads(component.__getstate__())


def _coder(table: ByteOffsets | PieceOffsets, fast: Any, reference: Coder, routed: list[int] | None) -> Coder:
    """A fast encoder's ids (one flat buffer a batch) with `table`'s offsets; the texts it does not
    take, or whose ids do not span them, go to `reference` (ids and offsets both), counted in
    `routed` ([texts, UTF-8 bytes]) where given."""

    def encode(texts: list[str]) -> Coded:
        plain = [i for i, t in enumerate(texts) if table.takes(t)]
        out: list[Any] = [None] * len(texts)
        if plain:
            taken = [texts[i] for i in plain]
            flat, lengths = fast.encode(taken)
            lengths = np.asarray(lengths, dtype=np.int64)
            offsets, ok = table.batch(taken, flat, lengths)
            if len(plain) == len(texts) and ok.all():  # the usual case: the batch as it came
                return Coded(flat.astype(np.int32, copy=False), offsets, lengths)
            ends = np.cumsum(lengths)
            for k, i in enumerate(plain):
                if ok[k]:
                    out[i] = (flat[ends[k] - lengths[k] : ends[k]], offsets[ends[k] - lengths[k] : ends[k]])
        rest = [i for i in range(len(texts)) if out[i] is None]
        if routed is not None and rest:
            routed[0] += len(rest)
            routed[1] += sum(len(texts[i].encode("utf-8", "surrogatepass")) for i in rest)
        t0 = time.perf_counter()
        if rest:
            for i, coded in zip(rest, reference([texts[i] for i in rest]).split(), strict=True):
                out[i] = coded
        return Coded.of(out)._replace(routed=tuple(rest), routed_s=time.perf_counter() - t0)

    return encode


def added_pattern(contents: Iterable[str]) -> re.Pattern[str] | None:
    """A pattern that finds any of these added tokens in a text, the longest first where several
    match at one place (as tokenizers matches them); None for none."""
    found = sorted({c for c in contents if c}, key=len, reverse=True)
    return re.compile("|".join(map(re.escape, found))) if found else None


def _docs(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For a batch's token counts: each token's text, and each text's first token."""
    lengths = np.asarray(lengths, dtype=np.int64)
    return np.repeat(np.arange(len(lengths)), lengths), np.cumsum(lengths) - lengths


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


def forms_beside(spec: dict[str, Any] | None) -> tuple[list[str], list[str]]:
    """A normalizer's normal forms and its other steps (Strip, Lowercase...), by type, in order."""
    steps = [str(n.get("type", "")) for n in _steps(spec, "normalizers")]
    return [s for s in steps if s in _FORMS], [s for s in steps if s not in _FORMS]


def _steps(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A normalizer's, pre-tokenizer's or post-processor's steps, a Sequence unfolded ([] for none)."""
    if spec is None:
        return []
    if spec.get("type") == "Sequence":
        return [s for inner in spec.get(key) or [] for s in _steps(inner, key)]
    return [spec]
