"""`raypack plan --config`: document lengths from a seeded sample of a job's corpus, tokenized as the
job would tokenize them, for the dry run (raypack.dryrun) to pack.

The documents are read by the job's readers (raypack.corpus.sample picks where), rejected for what the
job rejects, and encoded by the job's own steps (raypack.text.encode.encode_batch): framed by
tokenizer.add_bos/add_eos, conversations through the chat template checked as the job checks it,
by the backend the job would choose (fastokens behind the same self-check and in-run check, else
tokenizers). One process: 10,000 documents of web-like text take seconds.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from raypack.config import JobConfig
from raypack.corpus.readers import Batch
from raypack.corpus.readers.records import reasons_text, reject_advice
from raypack.corpus.sample import Drawn
from raypack.errors import ConfigError
from raypack.text.backends import Choice
from raypack.text.chat import ChatTemplate
from raypack.text.tokenizer import LoadedTokenizer

__all__ = ["DEFAULT_DOCUMENTS", "CorpusSample", "corpus_lengths", "describe"]

DEFAULT_DOCUMENTS = 10_000
# What the backend self-check compares of the sample (as the job's: raypack.pipeline.tokenize.stage):
# up to CHECK_TEXTS documents spread over it, CHECK_CHARS of text in all.
CHECK_TEXTS = 64
CHECK_CHARS = 512 << 10


@dataclass(frozen=True, slots=True)
class CorpusSample:
    """A sample's documents as the job would pack them, and what it read."""

    lengths: np.ndarray
    """Each document's tokens, framing included, as the job's index would hold it."""
    ids: list[str | None]
    """Each document's id as the job names it; None where the sample cannot know it (a JSONL unit
    past a file's first, without input.id_field: raypack.corpus.sample)."""
    drawn: Drawn
    rejected: int
    """Records rejected: by the readers (a lost file counts its rows) or by the tokenizer."""
    reasons: dict[str, int]
    """Rejects by kind (reason_counts)."""
    backend: str
    """The encoder and why (Choice), as the job's summary says it."""
    seconds: float


def corpus_lengths(cfg: JobConfig, documents: int = DEFAULT_DOCUMENTS, seed: int = 0) -> CorpusSample:
    """Lengths of a sample of `documents` documents of cfg's input, drawn with `seed`, tokenized as
    cfg's job would; ConfigError, one line, for what would stop the job before any work (no input
    files, no tokenizer, a template that is not prefix-stable, fastokens asked for and refused)."""
    from raypack.corpus.files import input_files
    from raypack.corpus.readers.records import reason_counts
    from raypack.corpus.sample import Sample
    from raypack.text.files import read_tokenizer

    if documents < 1:
        raise ConfigError(f"--documents must be >= 1, got {documents}")
    started = time.perf_counter()
    cfg = dataclasses.replace(cfg, storage=cfg.storage.from_environment())
    if cfg.input.datasets:
        raise ConfigError(
            "input.datasets: raypack plan samples files, not Ray Datasets; plan on a packed dataset "
            "(--lengths OUTPUT) instead"
        )
    files = input_files(cfg.input, cfg.storage)
    tok = read_tokenizer(cfg.tokenizer, cfg.storage, framed=cfg.framed)
    sample = Sample(files, documents, seed, cfg.input.unit_bytes, cfg.storage)
    batches = list(sample.batches(cfg.tokenizer.batch_size))
    cfg, template = _chat_checked(cfg, tok, batches)
    choice, encoded = _encoded(cfg, tok, template, batches)
    lengths: list[np.ndarray] = []
    ids: list[str | None] = []
    reasons: list[str] = []
    rejected = 0
    for (batch, exact), (n, why) in zip(batches, encoded, strict=True):
        kept = np.flatnonzero(n > 0)
        lengths.append(n[kept])
        ids += [batch.ids[i] if exact else None for i in kept.tolist()]
        reasons += [r.reason for r in batch.rejects] + [str(why[i]) for i in np.flatnonzero(n == 0).tolist()]
        rejected += sum(r.records for r in batch.rejects) + int(np.count_nonzero(n == 0))
    found = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return CorpusSample(
        found.astype(np.int64),
        ids,
        sample.drawn,
        rejected,
        reason_counts(reasons),
        f"{choice.label} ({choice.reason})",
        time.perf_counter() - started,
    )


def _spread(items: list[Any], most: int) -> list[Any]:
    """Up to `most` of `items`, evenly spaced over them."""
    return items[:: max(1, -(-len(items) // most))][:most]


def _chat_checked(
    cfg: JobConfig, tok: LoadedTokenizer, batches: list[tuple[Batch, bool]]
) -> tuple[JobConfig, ChatTemplate | None]:
    """The chat template, checked on the probes and some of the sample's conversations as the job
    checks it on its own sample (check_chat: a ConfigError where it is not prefix-stable), and the
    config it renders by (every turn's prefixes where one render found other turns)."""
    from raypack.text.chat import check_chat
    from raypack.text.files import chat_template

    template = chat_template(cfg, tok)
    if cfg.input.chat is None:
        return cfg, template
    records = _spread([t for batch, _ in batches for t in batch.texts], CHECK_TEXTS)
    found = check_chat(cfg, template, records)
    if found is not None and found.get("spans_differ"):
        cfg = dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, chat_spans="prefixes"))
        template = chat_template(cfg, tok)
    return cfg, template


def _encoded(
    cfg: JobConfig, tok: LoadedTokenizer, template: ChatTemplate | None, batches: list[tuple[Batch, bool]]
) -> tuple[Choice, list[tuple[np.ndarray, list[str | None]]]]:
    """The backend the job would choose (choose_backend, on the probes and documents spread over
    the sample), and each batch's lengths and reject reasons (encode_batch): by fastokens behind the
    in-run check, or again by tokenizers where that check finds a difference, as the job does."""
    from raypack.text.backends import (
        FastokensEncoder,
        Guarded,
        Mismatch,
        TokenizersEncoder,
        choose_backend,
        failed_over,
    )
    from raypack.text.chat import PROBES, Chat, render_texts
    from raypack.text.encode import Checker
    from raypack.text.offsets import reference_coder

    chat = cfg.input.chat is not None
    reference = TokenizersEncoder(tok.tokenizer)
    fast: list[FastokensEncoder] = []

    def fast_encoder() -> FastokensEncoder:
        if not fast:  # built once: for the check, then to encode
            fast.append(FastokensEncoder(tok.json))
            fast[0].reference = reference
        return fast[0]

    texts = _spread([t for batch, _ in batches for t in batch.texts], CHECK_TEXTS)
    if chat:
        texts = render_texts(template, texts)
        probes = render_texts(template, [Chat(messages=p) for p in PROBES]) if template else []
    else:
        probes = []
    check = [t[: CHECK_CHARS // CHECK_TEXTS] for t in texts]
    choice = choose_backend(
        cfg.tokenizer.backend, tok, lambda: check, fast_encoder, chat=chat, probe_texts=probes
    )
    coder = reference_coder(tok.tokenizer)
    if choice.backend != "fastokens":
        return choice, _encode(cfg, tok, template, batches, reference, coder, None)
    encoder = Guarded(fast_encoder())
    offsets = tok.offsets() if chat else None
    fast_coder = offsets.coder(encoder, coder, fast[0].routed) if offsets is not None else coder
    try:
        checker = Checker(reference, "raypack plan")
        return choice, _encode(cfg, tok, template, batches, encoder, fast_coder, checker)
    except Mismatch as e:
        return failed_over(choice, str(e)), _encode(cfg, tok, template, batches, reference, coder, None)


def _encode(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    template: ChatTemplate | None,
    batches: list[tuple[Batch, bool]],
    encoder: Any,
    coder: Any,
    checker: Any,
) -> list[tuple[np.ndarray, list[str | None]]]:
    from raypack.text.encode import encode_batch

    chat = cfg.input.chat is not None
    out: list[tuple[np.ndarray, list[str | None]]] = []
    for batch, _ in batches:
        if not len(batch):
            out.append((np.zeros(0, np.int64), []))
            continue
        _, lengths, why = encode_batch(tok, cfg, template, batch.texts, chat, encoder, coder, checker)
        out.append((lengths, why))
    return out


def _about(n: float) -> str:
    """A count estimated: 9,876; 41.2k; 7.7M; 33.1B."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:,.1f}{unit}"
    return f"{n / 1e3:,.1f}k" if n >= 1e4 else f"{n:,.0f}"


def describe(sample: CorpusSample, source: str, max_reject_ratio: float | None = None) -> list[str]:
    """What the sample read and rejected, how it was tokenized, and what its counts stand for: the
    corpus's (read whole), the corpus's estimated by bytes, or the sample's alone. Rejects over
    `max_reject_ratio` (input.max_reject_ratio) are said to fail the job, as they would."""
    from raypack.dataset.store import size_text

    d = sample.drawn
    starts = f"{d.starts:,} work unit{'s' if d.starts != 1 else ''}"
    documents = f"{len(sample.lengths):,} document{'s' if len(sample.lengths) != 1 else ''}"
    lines = [
        f"sample of {source}'s input: {documents} ({size_text(d.text_bytes)} of text) "
        f"from {len(d.files_read):,} of {d.files:,} files ({size_text(d.corpus_bytes)}), read from the "
        f"starts of {starts} ({d.places:,} places drawn)",
        f"tokenized as the job would, by {sample.backend}, in {sample.seconds:.1f}s",
    ]
    if sample.rejected:
        lines.append(
            f"rejected as the job would: {sample.rejected:,} record{'s' if sample.rejected != 1 else ''}: "
            f"{reasons_text(sample.reasons)}"
        )
    records = sample.rejected + len(sample.lengths)
    if max_reject_ratio is not None and records and sample.rejected / records > max_reject_ratio:
        lines.append(
            f"warning: the job would fail: {sample.rejected / records:.2%} of the records rejected, over "
            f"input.max_reject_ratio ({max_reject_ratio:.2%}); {reject_advice(sample.reasons)}"
        )
    scale = d.scale
    if d.whole:
        lines.append("the whole corpus was read: the counts below are the corpus's")
    elif scale is None:
        unknown = f"{len(d.unknown):,} compressed file{'s' if len(d.unknown) != 1 else ''}"
        lines.append(
            f"not scaled to the corpus: {unknown} read in part could not be "
            "decompressed again to find what share of them that is; the counts below are the sample's "
            "(its ratios are the corpus's estimates)"
        )
    else:
        tokens = float(sample.lengths.sum()) * scale
        lines.append(
            f"a sample: the counts below are the sample's; the corpus, estimated by bytes (x{scale:,.1f}): "
            f"~{_about(len(sample.lengths) * scale)} documents, ~{_about(tokens)} tokens, packs in "
            "corpus_packs"
        )
    return lines
