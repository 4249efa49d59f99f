"""Encoding documents: plain text framed by BOS/EOS, conversations and pairs rendered (raypack.text.chat)
with their trained tokens, and the in-run check of a fast backend. Pure: no Ray, no files; the
tokenize task (raypack.pipeline.tokenize.task) and verify call it.

Documents are encoded by the backend the driver chose (raypack.text.backends): `tokenizers`'
`encode_batch_fast(..., add_special_tokens=False)`, or fastokens where it proved the same ids. The
tokenizer's own template (which may add BOS, CLS/SEP, ...) is off, so `add_bos` / `add_eos` alone
decide what frames a document.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from raypack.config import JobConfig, TokenizerConfig
from raypack.text.backends import Encoder, Mismatch, TokenizersEncoder, encode_aside
from raypack.text.chat import (
    Chat,
    ChatTemplate,
    RenderError,
    pair_spans,
    token_masks,
)
from raypack.text.cuts import cut_text, segment
from raypack.text.offsets import Coded, Coder, reference_coder
from raypack.text.tokenizer import LoadedTokenizer

__all__ = [
    "CHECK_FLOOR_S",
    "CHECK_SHARE",
    "PIECE_CHARS",
    "SEGMENT_CHARS",
    "CheckBudget",
    "Checker",
    "encode_batch",
    "encode_chat",
    "encode_documents",
    "encode_flat",
    "untrained",
]

# A text longer than this is encoded piece by piece, cut only where its tokens stay the whole text's
# (raypack.text.cuts): an Encoding keeps ~100 bytes per token (ids, offsets, token strings,
# masks) and `.ids` is a Python list (~36 bytes per token), so one 50M-token document encoded whole
# would need ~7 GB in the worker. 1M characters ≈ 250k tokens ≈ 35 MB.
PIECE_CHARS = 1 << 20
# Pieces are encoded in groups of at most this much text, so that few Encodings are alive at once
# (the reader's batches are bounded alike: read.MAX_BATCH_BYTES).
_GROUP_CHARS = 1 << 20


def encode_documents(
    tok: LoadedTokenizer, cfg: TokenizerConfig, texts: list[str], whole: int = 0
) -> list[list[int]]:
    """Token ids of each text, framed by BOS/EOS as configured (the tokenizer's own template off),
    by `tokenizers`: the reference (verify re-tokenizes with it). `whole`: texts up to this many
    characters are encoded whole, never cut (verify's reference does not trust the cuts it checks)."""
    flat, lengths = encode_flat(tok, cfg, texts, whole=whole)
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)]


def encode_flat(
    tok: LoadedTokenizer,
    cfg: TokenizerConfig,
    texts: list[str],
    encoder: Encoder | None = None,
    checker: Checker | None = None,
    cuts: list[int] | None = None,
    whole: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Every text's tokens, framed by BOS/EOS as configured, as one int32 array and per-document
    lengths: no list per document is kept (at 55M tokens per job a per-token Python loop costs
    seconds), and texts over PIECE_CHARS (and over `whole`) are encoded in pieces, cut where the
    tokenizer's proven rule and a check at each cut allow (raypack.text.cuts). `encoder`:
    tokenizers' unless given; `checker`: re-checks a sample of the pieces (Mismatch on a
    difference); `cuts`: [cuts made, cuts refused, texts with a piece over PIECE_CHARS (no cut
    passed near its end), texts over PIECE_CHARS] are added to it."""
    encoder = encoder or TokenizersEncoder(tok.tokenizer)
    ids = _ids_of(encoder)
    pieces: list[str] = []
    piece_doc: list[int] = []
    for i, text in enumerate(texts):
        if len(text) > max(PIECE_CHARS, whole):
            parts, made, refused = cut_text(text, PIECE_CHARS, tok.cut_rule()[0], ids)
            if cuts is not None:
                cuts[0] += made
                cuts[1] += refused
                cuts[2] += max(map(len, parts)) > PIECE_CHARS  # a stretch with no cut passed
                cuts[3] += 1
        else:
            parts = [text]
        pieces += parts
        piece_doc += [i] * len(parts)
    raws: list[np.ndarray] = []
    piece_len: list[np.ndarray] = []
    start = 0
    while start < len(pieces):
        end, chars = start, 0
        while end < len(pieces) and (end == start or chars + len(pieces[end]) <= _GROUP_CHARS):
            chars += len(pieces[end])
            end += 1
        t0 = time.perf_counter()
        flat, n = encoder.encode(pieces[start:end])
        if checker is not None:
            # The texts a fast encoder gave tokenizers are tokenizers' ids already: neither their
            # time (20% of it would go to the check's budget) nor the texts are the check's.
            routed, routed_s = getattr(encoder, "last_routed", ((), 0.0))
            checker.check(pieces[start:end], flat, n, time.perf_counter() - t0 - routed_s, routed, encoder)
        raws.append(flat)
        piece_len.append(n)
        start = end
    raw = np.concatenate(raws) if raws else np.zeros(0, dtype=np.int32)
    lengths_of_pieces = np.concatenate(piece_len) if piece_len else np.zeros(0, dtype=np.int64)
    raw_len = np.bincount(
        np.asarray(piece_doc, dtype=np.int64), weights=lengths_of_pieces, minlength=len(texts)
    ).astype(np.int64)
    bos_id = tok.bos_id if cfg.add_bos else None
    eos_id = tok.eos_id if cfg.add_eos else None
    bos, eos = bos_id is not None, eos_id is not None
    if not (bos or eos):
        return raw, raw_len
    length = raw_len + int(bos) + int(eos)
    start_of = np.cumsum(length) - length
    out = np.empty(int(length.sum()), dtype=np.int32)
    # The body goes where no frame is: a byte a token of mask, not the int64 positions of every
    # token (3 temporaries of 8 bytes a token, 0.03-0.09 s for 10M tokens against 0.009).
    body = np.ones(len(out), dtype=bool)
    if bos_id is not None:
        out[start_of] = bos_id
        body[start_of] = False
    if eos_id is not None:
        last = start_of + length - 1
        out[last] = eos_id
        body[last] = False
    out[body] = raw
    return out, length


def _ids_of(encoder: Encoder) -> Callable[[list[str]], list[list[int]]]:
    """Each text's ids by `encoder`: what a cut's check compares (cut_text). The encoder that
    encodes the pieces checks its own cuts: its ids are checked against `tokenizers` apart (the
    backend's self-check, then Checker), and on fastokens the 2 × 8 KiB a cut costs ~0.05 ms,
    where `tokenizers` took ~3 ms (a fifth of fastokens' whole encoding of 128 MB of C)."""

    def ids(texts: list[str]) -> list[list[int]]:
        flat, lengths = encode_aside(encoder, texts)
        return [part.tolist() for part in np.split(flat, np.cumsum(lengths)[:-1])]

    return ids


def encode_batch(
    tok: LoadedTokenizer,
    cfg: JobConfig,
    template: ChatTemplate | None,
    docs: list[Any],
    chat: bool,
    encoder: Encoder | None = None,
    coder: Coder | None = None,
    checker: Checker | None = None,
    cuts: list[int] | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """A reader's batch of documents encoded as the tokenize stage encodes them, and what it
    rejects: plain texts framed (encode_flat, by `encoder`), or conversations and pairs (`chat`:
    encode_chat, by `coder`). (staged ids, tokens per document, per document None or why it is
    rejected): a chat document that cannot be rendered or trains nothing, or a text that gives no
    token at all (plain text without BOS/EOS that the tokenizer maps to nothing)."""
    why: list[str | None]
    if chat:
        flat, lengths, why = encode_chat(tok, cfg, template, docs, coder, checker)
    else:
        flat, lengths = encode_flat(tok, cfg.tokenizer, docs, encoder, checker, cuts)
        why = [None] * len(lengths)
    for i in np.flatnonzero(lengths == 0).tolist():
        why[i] = why[i] or "tokenizes to zero tokens"
    return flat, lengths, why


def untrained(ids: np.ndarray) -> np.ndarray:
    """Token ids as staged, a token that is not trained stored as -(id + 1): the loss mask rides in
    the sign bit through the token files, items and the exchange (no column of its own to carry,
    sort and copy; a truncated item loses its mask with its tokens). Only the write stage
    (raypack.pipeline.write.materialize) turns it back into ids and a loss_mask column."""
    return -ids.astype(np.int32) - 1


def encode_chat(
    tok: LoadedTokenizer,
    cfg: JobConfig,
    template: ChatTemplate | None,
    docs: list[Chat],
    coder: Coder | None = None,
    checker: Checker | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str | None]]:
    """Conversations or pairs → (staged ids of them all, trained ones as ids and the rest as
    untrained(ids); tokens per document; per document None or why it is rejected). The text is
    rendered (raypack.text.chat) and encoded whole with add_special_tokens off; the mask needs each
    token's character offsets: `coder`'s (tokenizers' own unless given: raypack.text.offsets),
    re-checked by `checker`. Pairs are framed by BOS (not trained) and EOS (trained with the
    completion) as configured; a conversation by its template alone."""
    texts, spans, reasons = _render(template, docs, cfg.loss)
    coder = coder or reference_coder(tok.tokenizer)
    rendered = [i for i, why in enumerate(reasons) if why is None]
    t0 = time.perf_counter()
    coded = coder([texts[i] for i in rendered])
    if checker is not None:  # (the conversations tokenizers encoded: not the check's, as above)
        spent = time.perf_counter() - t0 - coded.routed_s
        checker.check_coded([texts[i] for i in rendered], coded, spent, coded.routed)
    # The batch as whole arrays (Coded): a document's tokens are a run of them.
    mask = token_masks(
        coded.offsets, coded.lengths, [spans[i] for i in rendered], [len(texts[i]) for i in rendered]
    )
    ids, n = coded.ids, coded.lengths.copy()
    pairs = template is None
    bos = tok.bos_id if pairs and cfg.tokenizer.add_bos else None
    eos = tok.eos_id if pairs and cfg.tokenizer.add_eos else None
    if bos is not None or eos is not None:
        ids, mask, n = _frame_pairs(ids, mask, n, bos, eos)
    first = np.cumsum(n) - n
    mask[first[n > 0]] = False  # a document's first token is no target (nothing before it predicts it)
    counted = np.r_[0, np.cumsum(mask)]
    trained = counted[first + n] - counted[first]
    what = "assistant turn" if template is not None else "completion token"
    for k in np.flatnonzero(trained == 0).tolist():
        reasons[rendered[k]] = f"no trained token (pack.loss {cfg.loss}: no {what})"
    kept = np.repeat(trained > 0, n)
    flat = np.where(mask, ids, untrained(ids)).astype(np.int32)[kept]
    lengths = np.zeros(len(docs), dtype=np.int64)
    lengths[rendered] = np.where(trained > 0, n, 0)
    return flat, lengths, reasons


def _render(
    template: ChatTemplate | None, docs: list[Chat], loss: str
) -> tuple[list[str], list[list[tuple[int, int]]], list[str | None]]:
    """Each document's text and its trained character spans (a conversation by `template`, a pair
    without one), and None or why it cannot be rendered (its text then "", no spans)."""
    texts: list[str] = []
    spans: list[list[tuple[int, int]]] = []
    reasons: list[str | None] = []
    for doc in docs:
        try:
            if template is not None:
                text, trained = template.conversation(list(doc.messages), doc.tools, loss)
            else:
                text, trained = pair_spans(doc.prompt, doc.completion, loss)
        except RenderError as e:
            text, trained = "", []
            reasons.append(str(e))
        else:
            reasons.append(None)
        texts.append(text)
        spans.append(trained)
    return texts, spans, reasons


def _frame_pairs(
    ids: np.ndarray, mask: np.ndarray, n: np.ndarray, bos: int | None, eos: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The documents' ids, mask and lengths with BOS (not trained) before each document and EOS
    (trained with the completion) after it, whichever is given."""
    # In one insert, BOS first where a document is empty (np.insert keeps equal places in order).
    first = np.cumsum(n) - n
    framing = [(first, bos, False)] if bos is not None else []
    framing += [(first + n, eos, True)] if eos is not None else []
    at = np.concatenate([place for place, _, _ in framing])
    ids = np.insert(ids, at, np.concatenate([np.full(len(n), t, np.int32) for _, t, _ in framing]))
    mask = np.insert(mask, at, np.concatenate([np.full(len(n), m) for _, _, m in framing]))
    return ids, mask, n + len(framing)


# The in-run check of a fast backend: re-encoding with tokenizers may take this share of the fast
# encoder's own time, and at least CHECK_FLOOR_S a worker's pass (so a small job is checked too: ~5
# KB of text). At ×60, checking 1% of the text would cost 60% more; a fifth of the time checks ~0.3%
# of it. The share is kept over a worker's units (CheckBudget), not each unit's: a floor a unit would
# make the check of a 300 MB/s encoder cost 40-90% of its time on 2 MB units, not 20%.
CHECK_SHARE = 0.2
CHECK_FLOOR_S = 0.005
# A text too long for one draw to check whole is a candidate in segments of this many characters: a
# 1 MiB piece is 256 candidates. Small, so that a drawn one rarely takes the account far into debt
# (segments as large as a draw allows cost a 131k byte-level BPE's check 43% of its encoding on 32 MB
# of C, not 20%); drawn once a draw holds as many (~5 KB at the floor, ~0.2 MB once a worker has
# encoded ~1 s).
SEGMENT_CHARS = 4096


@dataclass
class CheckBudget:
    """The in-run check's account over the units one worker tokenizes in a pass: the fast encoder's
    seconds, the check's, and the reference's measured speed. What one unit's draw leaves unspent
    goes to the next, and a debt one unit's draw makes is repaid by the next (Checker._pick)."""

    fast_s: float = 0.0
    check_s: float = 0.0
    rate: float = 1e6
    """The reference's characters a second, until measured (tokenizers: 1-2.5 MB/s)."""


class Checker:
    """Re-encodes a seeded sample of one unit's pieces with `tokenizers` and compares every id: a
    Mismatch on the first difference. Bounded by time, not by count (module constants): `budget`,
    the worker's pass's account (CheckBudget), else this unit's own."""

    def __init__(self, reference: TokenizersEncoder, seed: str, budget: CheckBudget | None = None) -> None:
        self.reference = reference
        self.coded = reference_coder(reference.tokenizer)
        self.rng = random.Random(seed)
        self.budget = budget if budget is not None else CheckBudget()
        self.check_s = 0.0
        """This unit's seconds of checking."""
        self.texts = self.segments = self.bytes = 0
        """Whole texts and segments of longer ones (Checker.check) checked, and their UTF-8 bytes."""

    def _allowance(self, fast_s: float) -> tuple[float, float] | None:
        """What one draw may cost, with `fast_s` of the fast encoder's time added to the account:
        (the seconds the account holds, the most characters one draw may check: what it holds and
        a debt of the share of all the fast encoder's time so far); None while it holds nothing."""
        account = self.budget
        account.fast_s += max(fast_s, 0.0)
        holds = max(CHECK_SHARE * account.fast_s, CHECK_FLOOR_S) - account.check_s
        if holds <= 0:
            return None
        return holds, (holds + max(CHECK_SHARE * account.fast_s - CHECK_FLOOR_S, 0.0)) * account.rate

    def _draw(self, sizes: list[int], holds: float, most: float) -> list[int]:
        """A seeded sample of candidates of `sizes` characters (0: not a candidate): each drawn with
        the same chance, whatever its size, so that every character is as likely to be checked, and
        the expected cost is what the account `holds`; at most `most` characters in all. A draw may
        cost more than the account holds, by up to the share of all the fast encoder's time so far:
        the account then goes into debt (so the check never costs over twice its share), and nothing
        is checked until the share has paid for it. (Drawing only the texts that fit the account
        checked 2 KB texts of a corpus whose median is 10-17 KB.)"""
        cost = sum(sizes) / self.budget.rate
        chance = holds / cost if cost else 0.0  # chance × cost: what the account holds
        picked, chars = [], 0
        for i, size in enumerate(sizes):
            if size and self.rng.random() < chance and chars + size <= most:
                picked.append(i)
                chars += size
        return picked

    def _pick(self, texts: list[str], fast_s: float, routed: Sequence[int] = ()) -> list[int]:
        """A seeded sample of whole `texts` (_draw; fast_s: the fast backend's time on them;
        `routed`: texts tokenizers encoded, not sampled): one longer than a draw may check is not
        drawn."""
        allowance = self._allowance(fast_s)
        if allowance is None:
            return []
        skip = set(routed)
        most = allowance[1]
        sizes = [len(t) if len(t) <= most and i not in skip else 0 for i, t in enumerate(texts)]
        return self._draw(sizes, *allowance)

    def _spent(self, texts: list[str], seconds: float, segments: int = 0) -> None:
        """The check of `texts` (`segments` of them segments of longer ones) took `seconds`: charged
        to the account, and counted."""
        self.check_s += seconds
        self.budget.check_s += seconds
        self.budget.rate = max(sum(map(len, texts)) / max(seconds, 1e-6), 1e4)
        self.texts += len(texts) - segments
        self.segments += segments
        self.bytes += sum(len(t.encode("utf-8", errors="surrogatepass")) for t in texts)

    def check_coded(self, texts: list[str], coded: Coded, fast_s: float, routed: Sequence[int] = ()) -> None:
        """The sampled texts' ids and character offsets against tokenizers' (a chat mask's input)."""
        picked = self._pick(texts, fast_s, routed)
        if not picked:
            return
        t0 = time.perf_counter()
        want = self.coded([texts[i] for i in picked]).split()
        got = coded.split()
        for (ids, offsets), i in zip(want, picked, strict=True):
            got_ids, got_offsets = got[i]
            if not np.array_equal(ids, got_ids) or not np.array_equal(offsets, got_offsets):
                what = "ids" if not np.array_equal(ids, got_ids) else "character offsets"
                raise Mismatch(
                    f"a {len(texts[i]):,}-character conversation ({texts[i][:40]!r}): other {what}"
                )
        self._spent([texts[i] for i in picked], time.perf_counter() - t0)

    def check(
        self,
        pieces: list[str],
        flat: np.ndarray,
        lengths: np.ndarray,
        fast_s: float,
        routed: Sequence[int] = (),
        encoder: Encoder | None = None,
    ) -> None:
        """A seeded sample of `pieces` (their ids: `lengths` runs of `flat`, by the fast encoder in
        `fast_s`) against tokenizers' ids. A piece longer than one draw may check (a 1 MiB piece of
        a long document, where a draw holds a few KiB on a small job) is a candidate in segments of
        SEGMENT_CHARS (text.cuts.segment), each drawn as a text is: a drawn segment is encoded by
        `encoder` and by tokenizers and the two compared, so that every character of the unit is
        as likely to be checked, long documents' too (once a draw holds a segment). Without
        `encoder`, whole pieces only."""
        allowance = self._allowance(fast_s)
        if allowance is None:
            return
        holds, most = allowance
        spans = _spans(pieces, most, set(routed), encoder is not None and most >= SEGMENT_CHARS)
        picked = [_span(pieces, *spans[k]) for k in self._draw([size for _, _, size in spans], holds, most)]
        if not picked:
            return
        t0 = time.perf_counter()
        texts = [pieces[i][a:b] for i, a, b in picked]
        want = _runs(*self.reference.encode(texts))
        got = _runs(flat, lengths, [i for i, _, _ in picked])
        parts = [k for k, (i, a, b) in enumerate(picked) if b - a < len(pieces[i])]
        if parts and encoder is not None:
            for k, ids in zip(parts, _runs(*encode_aside(encoder, [texts[k] for k in parts])), strict=True):
                got[k] = ids
        spent = time.perf_counter() - t0
        for (i, a, b), ids, ref in zip(picked, got, want, strict=True):
            if not np.array_equal(ids, ref):
                what = f"a {len(pieces[i]):,}-character text ({pieces[i][a : a + 40]!r})"
                if b - a < len(pieces[i]):
                    what = f"characters {a:,}-{b:,} of {what}"
                raise Mismatch(f"{what}: {len(ids)} ids, tokenizers {len(ref)}")
        self._spent(texts, spent, len(parts))


def _spans(pieces: list[str], most: float, skip: set[int], segmented: bool) -> list[tuple[int, int, int]]:
    """The in-run check's candidates among `pieces`, as (piece, segment, characters): each piece of
    at most `most` characters whole (segment -1), and (`segmented`) each longer one's segments of
    SEGMENT_CHARS (text.cuts.segment, found only once drawn); none of the pieces in `skip`
    (tokenizers encoded them) or empty."""
    spans: list[tuple[int, int, int]] = []
    for i, text in enumerate(pieces):
        if not text or i in skip:
            continue
        if len(text) <= most:
            spans.append((i, -1, len(text)))
        elif segmented:
            n = -(-len(text) // SEGMENT_CHARS)
            spans += [(i, k, SEGMENT_CHARS) for k in range(n - 1)]
            spans.append((i, n - 1, len(text) - (n - 1) * SEGMENT_CHARS))
    return spans


def _span(pieces: list[str], i: int, k: int, _: int) -> tuple[int, int, int]:
    """A drawn candidate (_spans) as (piece, start, end)."""
    if k < 0:
        return i, 0, len(pieces[i])
    return (i, *segment(pieces[i], k, SEGMENT_CHARS))


def _runs(flat: np.ndarray, lengths: np.ndarray, which: list[int] | None = None) -> list[np.ndarray]:
    """The ids of each text (`lengths` runs of `flat`), or of the texts `which` names."""
    ends = np.cumsum(lengths)
    return [flat[ends[i] - lengths[i] : ends[i]] for i in (range(len(lengths)) if which is None else which)]
