"""Metrics on cases small enough to count by hand."""

from __future__ import annotations

from typing import Any

import pytest

from raypack.config import JobConfig, from_dict
from raypack.metrics import compute_metrics
from raypack.packing import pack
from raypack.pipeline.job import JobResult
from raypack.pipeline.write.stage import Duplicates
from raypack.summary import format_summary


def test_bfd_hand_case() -> None:
    # seq_len 8; documents 20, 5, 3, 6: 20 → 8 + 8 + 4. Items 8, 8, 6, 5, 4, 3 in best fit:
    # [8] [8] [6] [5, 3] [4]  → 5 packs, 34 tokens, 40 slots.
    m = compute_metrics(pack([20, 5, 3, 6], 8, "bfd"))
    assert (m.documents, m.items, m.packs) == (4, 6, 5)
    assert m.tokens == 34 and m.slots == 40
    assert m.lower_bound == 5  # ceil(34 / 8)
    assert m.efficiency == pytest.approx(34 / 40)
    assert m.padding_ratio == pytest.approx(6 / 40)
    assert m.truncation_ratio == pytest.approx(1 / 4)  # only the 20-token document is cut
    assert m.concatenation_ratio == pytest.approx(4 / 5)
    assert m.packing_factor == pytest.approx(6 / 5)
    assert m.tokens_dropped == 0 and m.documents_dropped == 0
    bands = {(b.lo, b.hi): (b.documents, b.truncations_per_doc) for b in m.truncation_bands}
    # 3 in [2,4); 5, 6 in [4,8); 20 in [16,32) with 2 cuts.
    assert bands == {(2, 4): (1, 0.0), (4, 8): (2, 0.0), (16, 32): (1, 2.0)}


def test_truncate_and_drop_count_lost_tokens() -> None:
    t = compute_metrics(pack([20, 5, 3], 8, "bfd", overflow="truncate"))
    assert t.tokens_dropped == 12 and t.documents_dropped == 0
    assert t.truncation_ratio == pytest.approx(1 / 3)
    assert t.packs == 2  # [8] [5, 3]
    d = compute_metrics(pack([20, 5, 3], 8, "bfd", overflow="drop"))
    assert d.tokens_dropped == 20 and d.documents_dropped == 1
    assert d.truncation_ratio == pytest.approx(1 / 3)
    # Liu's M counts every document, the dropped one too; two documents share the one pack.
    assert d.concatenation_ratio == pytest.approx(3 / 1)
    assert d.documents_per_pack == pytest.approx(2 / 1)
    assert d.packs == 1


def test_concat_cuts_documents_at_pack_boundaries() -> None:
    # 5, 5, 5 with seq_len 8: stream [0,15) → packs [0,8) [8,15); the second document straddles 8.
    m = compute_metrics(pack([5, 5, 5], 8, "concat"))
    assert m.packs == 2 and m.items == 4
    assert m.truncation_ratio == pytest.approx(1 / 3)
    assert m.efficiency == pytest.approx(15 / 16)


def test_bucket_slots_are_the_bucket_lengths() -> None:
    # Buckets 2/4/8 (seq_len 8): a 3-token document alone fits bucket 4 with 1 pad.
    m = compute_metrics(pack([3], 8, "bucket", bucket_lengths=(2, 4, 8), padding_threshold=0.5))
    assert m.packs == 1 and m.slots == 4
    assert m.efficiency == pytest.approx(3 / 4)


def test_packs_of_several_lengths_are_not_held_to_the_lower_bound_of_packs_of_seq_len() -> None:
    """decompose's chunks and buckets are packs of several lengths: ceil(tokens / seq_len) packs of
    seq_len bound nothing there (decompose: 7 chunks for 2 packs' worth), so the summary gives their
    positions, not a ratio; packs of seq_len keep theirs."""
    chunks = compute_metrics(pack([7, 12, 1], 8, "decompose"))
    assert chunks.packs == 6 and chunks.lower_bound == 3 and chunks.lengths_vary
    line = next(row for row in format_summary(_record(chunks)).splitlines() if row.startswith("packs"))
    assert line.endswith("6 of several lengths up to 8 (one chunk each), 20 positions in all"), line
    buckets = compute_metrics(pack([3, 8], 8, "bucket", bucket_lengths=(2, 4, 8), padding_threshold=0.5))
    assert buckets.lengths_vary and "of several lengths up to 8, 12 positions" in format_summary(
        _record(buckets)
    )
    whole = compute_metrics(pack([7, 12, 1], 8, "bfd"))
    assert not whole.lengths_vary
    assert "packs                3 of 8 (lower bound 3: 1.00000x)" in format_summary(_record(whole))


def test_the_summary_tells_rejected_records_from_documents_the_packing_cut() -> None:
    """Rejects of records (not in the index) apart from those of documents packed in part or not at
    all (pack.overflow, decompose's tails: in the index, standing for no record)."""
    import dataclasses

    result = dataclasses.replace(
        _record(compute_metrics(pack([7, 12, 1], 8, "bfd"))),
        rejected_records=1,
        reject_reasons={"empty document": 1, "overflow drop": 3, "decompose": 2},
    )
    text = format_summary(result)
    assert "documents            1 (1 record rejected, see rejects/)" in text
    cut = "documents packed in part or not at all: overflow drop: 3, decompose: 2"
    want = f"rejects              empty document: 1; {cut}"
    assert want in text, text
    # Kinds apart by "; " (a kind may hold commas), the most frequent first.
    size = "record of N bytes, over input.max_document_bytes (N)"
    reasons = {"empty document": 1, "malformed JSON": 4, size: 4, "overflow drop": 3}
    text = format_summary(dataclasses.replace(result, rejected_records=9, reject_reasons=reasons))
    want = f"rejects              malformed JSON: 4; {size}: 4; empty document: 1; documents packed in"
    assert want in text, text


def test_the_backend_line_counts_in_words_and_sizes_under_a_mib_in_kib() -> None:
    """The tokenizer line in words: 1 text, KiB under a MiB, segments of long texts apart; of long
    texts, how many there were, where they were cut and checked (only where a cut was made), how
    many have a piece over 1 MiB (no cut passed near its end), and why; a manifest written before
    long_pieces gives its encoded_whole."""
    import dataclasses

    backend = {
        "chosen": "fastokens 0.3.5",
        "reason": "ids equal to tokenizers",
        "checked_in_run": {"texts": 1, "segments": 0, "bytes": 3_000},
        "failovers": [],
        "long_texts": {"texts": 2, "cuts": 1, "cuts_refused": 2, "long_pieces": 1, "rule": "before: p"},
    }
    record = _record(compute_metrics(pack([7], 8, "bfd")))
    text = format_summary(dataclasses.replace(record, backend=backend))
    assert "; 1 text (2.9 KiB) re-checked with tokenizers in the run;" in text, text
    assert (
        "; 2 texts over 1,048,576 characters encoded in pieces, cut at 1 place before spaces, each cut "
        "checked where it fell by the encoder of its pieces (the rule proven by tokenizers: p); 1 of "
        "them with a piece over 1,048,576 characters, as no cut passed in the 524,288 characters "
        "before its end (no space between two words or 8 candidates refused by their checks; 2 "
        "refusals in all): such a piece runs on to the next cut that passed, or to the text's end (a "
        "text where none did is one piece)\n"
    ) in text, text
    backend["checked_in_run"] = {"texts": 0, "segments": 3, "bytes": 12_288}
    long = {"texts": 3, "cuts": 0, "cuts_refused": 1, "encoded_whole": 3, "rule": "before: p"}
    backend["long_texts"] = long
    text = format_summary(dataclasses.replace(record, backend=backend))
    assert "; 3 segments of long texts (12.0 KiB) re-checked with tokenizers" in text
    assert (
        "3 texts over 1,048,576 characters encoded whole, as no cut before spaces passed (no space "
        "between two words or 8 candidates refused by their checks; 1 refusal in all; the rule "
        "proven by tokenizers: p)\n"
    ) in text, text


def test_empty_corpus() -> None:
    m = compute_metrics(pack([], 8, "bfd"))
    assert (m.packs, m.tokens, m.lower_bound) == (0, 0, 0)
    assert m.efficiency == 1.0 and m.truncation_bands == ()


def test_concatenation_ratio_is_liu_r_cat_not_documents_per_pack() -> None:
    """One 80-token document cut into 10 packs of 8: r_cat = 1 / 10, and every pack holds one document."""
    m = compute_metrics(pack([80], 8, "bfd"))
    assert m.packs == 10
    assert m.concatenation_ratio == pytest.approx(0.1)
    assert m.documents_per_pack == pytest.approx(1.0)
    result = _record(m)
    text = format_summary(result)
    assert "concatenation ratio  0.10 (Liu et al.'s r_cat: 1 documents / 10 packs)" in text
    assert "documents per pack   1.00 on average" in text


def _record(m: Any) -> JobResult:
    """A run's record around metrics `m`: one document, no files."""
    cfg = from_dict(
        JobConfig, {"input": {"paths": ["x"]}, "tokenizer": {"path": "t"}, "output": {"path": "out/"}}
    )
    return JobResult(
        output="out/",
        config=cfg,
        inputs=({"path": "x", "size": 1, "mtime_ns": 0},),
        tokenizer={},
        backend={},
        documents=1,
        rejects=0,
        rejected_records=0,
        lost_files=0,
        reject_reasons={},
        shards_reused=0,
        grouped_files={"units": 0, "files": 0},
        token_keys=(),
        split_files={},
        sources=[],
        mixture=None,
        chat=None,
        metadata=None,
        metrics=m,
        global_efficiency=1.0,
        comparison_rows=(),
        document_lengths={},
        pack_fill_percent=(),
        files=[],
        packs=m.packs,
        duplicates=Duplicates(),
        output_format={"name": "parquet"},
        format_files={},
        runner={"name": "local", "cpus": 2},
    )
