"""Chat jobs end to end: every conversation packed whole, truncated or rejected, with its mask; verify,
the reader's labels, the formats, reruns, the token store, Parquet input, sharded mode, convert, and
fastokens writing tokenizers' bytes."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.reader import batch_fields
from raypack.text.chat import Chat
from raypack.verifier import verify
from tests.chat.conftest import BAD, CONFIGS, SEQ, N, expected, job, packed_conversations, quiet
from tests.chatdata import CHATML, conversation, words
from tests.conftest import write_jsonl

transformers = pytest.importorskip("transformers")


def test_every_conversation_is_packed_whole_or_truncated_or_rejected(
    packed: dict[str, Path], corpus: Path, model: Path
) -> None:
    out = packed["parquet"]
    want = expected(model, corpus)
    got = packed_conversations(out)
    everything = pq.read_table(out / "rejects").to_pylist()
    # Rejected records (records 1) are not packed; a truncated conversation is packed and has a
    # reject that stands for no record (pack.overflow's, checked below).
    rejects = [r for r in everything if r["records"]]
    cut = {f"{r['source']}:{r['row']}": r["reason"] for r in everything if not r["records"]}
    reasons = {f"{r['source']}:{r['row']}": r["reason"] for r in rejects}
    assert set(got) | set(reasons) >= {f"a.jsonl:{i}" for i in range(1, N + len(BAD) + 1)}
    assert not set(got) & set(reasons)
    assert "no trained token" in reasons[f"a.jsonl:{N + 5}"]
    # A conversation rejected once rendered keeps its record as JSON, as one rejected when read does
    # (it was Python's repr of the reader's Chat).
    raw = {f"{r['source']}:{r['row']}": r["raw"] for r in rejects}[f"a.jsonl:{N + 5}"]
    assert json.loads(raw) == BAD[4]
    assert "not a list" in reasons[f"a.jsonl:{N + 1}"] and "missing messages" in reasons[f"a.jsonl:{N + 2}"]
    truncated = 0
    for doc, (ids, mask) in want.items():
        if doc in reasons:
            continue
        got_ids, got_mask = got[doc]
        keep = min(len(ids), SEQ)
        truncated += keep < len(ids)
        assert (doc in cut) == (keep < len(ids)), doc
        assert (
            keep == len(ids)
            or cut[doc] == f"overflow truncate: its tokens past seq_len ({SEQ}) are in no pack"
        )
        assert got_ids == ids[:keep], doc
        assert got_mask == mask[:keep], doc
    chat = json.loads((out / "metrics.json").read_text())["chat"]
    assert truncated > 0 and chat["truncated"] == truncated
    trained_out = sum(sum(m) for _, m in got.values())
    assert chat["trained_tokens_packed"] == trained_out
    assert chat["trained_tokens"] - chat["trained_tokens_lost"] == trained_out
    trained_in = sum(sum(m) for d, (_, m) in want.items() if d not in reasons)
    assert chat["trained_tokens"] == trained_in  # the jsonl shards only: the job reads *.jsonl
    assert 0 < chat["trained_share_lost"] < 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"]["loss_mask"] and manifest["chat"]["trained_tokens_packed"] == trained_out
    report = verify(str(out), CONFIGS["parquet"], sample=60)
    assert report.ok, report.problems
    assert report.sampled > 0


def test_verify_finds_a_flipped_mask_bit(packed: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(packed["parquet"], out)
    f = sorted((out / "data").glob("*.parquet"))[0]
    table = pq.read_table(f)
    rows = table.to_pylist()
    trained = rows[0]["loss_mask"].index(1)
    rows[0]["loss_mask"][trained] = 0
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), f)
    manifest = json.loads((out / "manifest.json").read_text())
    import hashlib

    for entry in manifest["files"]:
        if entry["path"] == f"data/{f.name}":
            data = f.read_bytes()
            entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify(str(out), CONFIGS["parquet"], sample=10_000)
    assert not report.ok
    assert any("loss mask differs" in p for p in report.problems)


def test_reader_labels_train_exactly_the_masked_tokens(packed: dict[str, Path]) -> None:
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        table = pq.read_table(f, columns=["input_ids", "doc_offsets", "num_tokens", "loss_mask"])
        b = batch_fields(table, SEQ, 0)
        mask = np.asarray(table.column("loss_mask").to_pylist())
        assert np.array_equal(b["labels"] != -100, mask == 1)
        assert np.array_equal(b["labels"][mask == 1], b["input_ids"][mask == 1])
        assert np.array_equal(b["shift_labels"][:, :-1], b["labels"][:, 1:])


def test_trl_and_bridge_hold_the_same_packs_and_masks(packed: dict[str, Path]) -> None:
    base = {}
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            n = row["num_tokens"]
            base.setdefault(f.stem, []).append(
                (row["input_ids"][:n], row["loss_mask"][:n], row["doc_offsets"])
            )
    for stem, rows in base.items():
        trl = pq.read_table(packed["trl"] / "data" / f"{stem}.parquet").to_pylist()
        bridge = pq.read_table(packed["bridge"] / "data" / f"{stem}.idx.parquet").to_pylist()
        for (ids, mask, offsets), t, b in zip(rows, trl, bridge, strict=True):
            assert t["input_ids"] == ids and b["input_ids"] == ids
            assert t["labels"] == [i if m else -100 for i, m in zip(ids, mask, strict=True)]
            assert t["seq_lengths"] == np.diff(offsets).tolist()
            assert b["seq_start_id"] == offsets[:-1]
            assert b["loss_mask"] == [*mask[1:], 0]  # Bridge's belongs to the label (the next token)
    for fmt in ("trl", "bridge"):
        report = verify(str(packed[fmt]), CONFIGS[fmt], sample=30)
        assert report.ok, report.problems
        assert report.sampled == 30
    meta = json.loads((packed["bridge"] / "pack_metadata.json").read_text())
    assert meta[0]["pack_size"] == SEQ and 1 <= meta[0]["max_samples_per_bin"] <= SEQ


def test_two_actors_and_a_rerun_write_the_same_bytes(
    packed: dict[str, Path], corpus: Path, model: Path, tmp_path: Path
) -> None:
    run_job(job(tmp_path, corpus, model, "two", tokenizer={"concurrency": 2}), **quiet)
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert (tmp_path / "two" / "data" / f.name).read_bytes() == f.read_bytes()


def test_a_chat_repack_from_a_token_store_parses_no_tokenizer(
    packed: dict[str, Path], corpus: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat job that reads a token store fills it; a repack that finds every unit there renders
    its template's BOS and EOS from the JSON's ids and never parses the tokenizer (0.8 s for a
    131k BPE). Its packs are the job's without a store."""
    from raypack.text import tokenizer as tokenizer_module

    parsed: list[str] = []
    parse = tokenizer_module._parse
    monkeypatch.setattr(
        tokenizer_module, "_parse", lambda raw, where: parsed.append(where) or parse(raw, where)
    )
    store = {"path": str(tmp_path / "store")}
    run_job(job(tmp_path, corpus, model, "first", cache=store), **quiet)
    assert parsed
    parsed.clear()
    run_job(job(tmp_path, corpus, model, "again", cache=store), **quiet)
    assert parsed == []
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert (tmp_path / "again" / "data" / f.name).read_bytes() == f.read_bytes()


def test_a_parquet_messages_column_and_pairs(corpus: Path, model: Path, tmp_path: Path) -> None:
    result = run_job(
        job(tmp_path, corpus, model, "pq", input={"paths": [f"{corpus}/*.parquet"], "format": "parquet"}),
        **quiet,
    )
    assert result.documents > 0 and result.chat["trained_tokens_packed"] > 0
    pairs = tmp_path / "pairs-in"
    pairs.mkdir()
    rng = random.Random(5)
    write_jsonl(
        pairs / "p.jsonl", [{"prompt": words(rng, 20), "completion": " " + words(rng, 30)} for _ in range(50)]
    )
    cfg = job(
        tmp_path,
        pairs,
        model,
        "pairs",
        input={"messages_field": None, "prompt_field": "prompt", "completion_field": "completion"},
    )
    result = run_job(cfg, **quiet)
    assert result.chat["kind"] == "pairs" and result.chat["trained_tokens_lost"] == 0
    report = verify(str(tmp_path / "pairs"), cfg, sample=50)
    assert report.ok and report.sampled == 50, report.problems


NO_SYSTEM = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_conversation_the_template_refuses_is_a_reject_and_the_report_counts_trained_tokens(
    model: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "refuses"
    corpus.mkdir()
    rng = random.Random(11)  # kinds without a system prompt or a tool call: plain, empty turn, multi-byte
    convs = [conversation(rng, i) for i in (0, 3, 4, 5, 8, 9, 10, 13, 14, 15, 18, 19)]
    convs[3] = [{"role": "system", "content": "be brief"}, *convs[3]]
    write_jsonl(corpus / "r.jsonl", [{"messages": m} for m in convs])
    template = tmp_path / "no-system.jinja"
    template.write_text(NO_SYSTEM)
    cfg = job(
        tmp_path,
        corpus,
        model,
        "refuses-out",
        input={"max_reject_ratio": 0.2},
        tokenizer={"chat_template": str(template)},
    )
    result = run_job(cfg, **quiet)
    rejects = pq.read_table(tmp_path / "refuses-out" / "rejects").to_pylist()
    assert [(r["row"], r["reason"]) for r in rejects if r["records"]] == [
        (4, "chat template " + str(template) + ": System role not supported")
    ]  # (with the truncated conversations' rejects, which stand for no record)
    assert result.documents == 11
    page = (tmp_path / "refuses-out" / "report.html").read_text()
    assert "Chat data" in page and f"{result.chat['trained_tokens_packed']:,} of" in page
    missing = job(
        tmp_path, corpus, model, "missing", tokenizer={"chat_template": str(tmp_path / "nope.jinja")}
    )
    with pytest.raises(ConfigError, match="chat_template: file not found"):
        run_job(missing, **quiet)


def test_sharded_mode_keeps_the_masks(corpus: Path, model: Path, tmp_path: Path) -> None:
    cfg = job(tmp_path, corpus, model, "sharded", pack={"mode": "sharded", "algorithm": "ffd"})
    result = run_job(cfg, **quiet)
    report = verify(str(tmp_path / "sharded"), cfg, sample=40)
    assert report.ok and report.sampled == 40, report.problems
    assert (
        result.chat["trained_tokens"] - result.chat["trained_tokens_lost"]
        == result.chat["trained_tokens_packed"]
    )


@pytest.mark.slow  # 10 s
def test_convert_moves_the_masks_between_forms_and_refuses_maskless_formats(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    from raypack.convert import convert

    for fmt in ("trl", "bridge"):
        convert(str(packed["parquet"]), fmt, str(tmp_path / fmt), log=lambda _: None)
        for f in sorted((packed[fmt] / "data").glob("*")):
            assert (tmp_path / fmt / "data" / f.name).read_bytes() == f.read_bytes(), (fmt, f.name)
    convert(str(packed["bridge"]), "parquet", str(tmp_path / "back"), log=lambda _: None)
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert pq.read_table(tmp_path / "back" / "data" / f.name).equals(pq.read_table(f))
    with pytest.raises(ConfigError, match="keeps no loss mask"):
        convert(str(packed["parquet"]), "megatron", str(tmp_path / "megatron"), log=lambda _: None)


def test_reading_chat_records_rejects_what_is_not_a_conversation(corpus: Path) -> None:
    """read_unit alone: every record of a shard becomes a Chat or a reject with its reason, a parquet
    row over input.max_document_bytes included: measured as a JSONL line of it is, the record as
    JSON in UTF-8 bytes (not the characters of its contents alone)."""
    from raypack.config import InputConfig
    from raypack.corpus.files import input_files
    from raypack.corpus.readers import read_unit

    by_file: dict[str, tuple[int, list[str]]] = {}
    for pattern, fmt in (("*.jsonl", "jsonl"), ("*.parquet", "parquet")):
        cfg = InputConfig(
            paths=(f"{corpus}/{pattern}",), format=fmt, messages_field="messages", max_document_bytes=600
        )
        for shard in input_files(cfg):
            docs, reasons = 0, []
            for batch in read_unit(shard, 64):
                assert all(isinstance(d, Chat) and d.messages for d in batch.texts)
                docs += len(batch)
                reasons += [r.reason for r in batch.rejects]
            by_file[shard.relpath] = (docs, reasons)
    jsonl_docs, jsonl_reasons = by_file["a.jsonl"]
    assert jsonl_docs + len(jsonl_reasons) == N + len(BAD)  # jsonl lines over the limit are rejected unread
    parquet_docs, parquet_reasons = by_file["c.parquet"]
    rows = pq.read_table(corpus / "c.parquet").to_pylist()
    sizes = [len(json.dumps(r, ensure_ascii=False).encode()) for r in rows]
    over = sorted(f"record of {n:,} bytes, over input.max_document_bytes (600)" for n in sizes if n > 600)
    assert parquet_reasons and sorted(parquet_reasons) == over
    assert parquet_docs + len(parquet_reasons) == len(rows)


def _data_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "data").rglob("*")) if p.is_file()}


def _fast_writes_the_bytes_of_tokenizers(tmp_path: Path, corpus: Path, model: Path) -> dict[str, Any]:
    """The chat job on tokenizers and on auto: auto chooses fastokens for ids and offsets, finishes
    on it with texts re-checked in the run and no failover, and writes tokenizers' data files.
    Returns auto's backend record."""
    reference = run_job(
        job(tmp_path, corpus, model, "reference", tokenizer={"backend": "tokenizers"}), **quiet
    )
    fast = run_job(job(tmp_path, corpus, model, "fast"), **quiet)
    assert reference.backend["chosen"].startswith("tokenizers ")
    assert fast.backend["chosen"].startswith("fastokens ") and fast.backend["finished_on"] == "fastokens"
    assert "ids and character offsets equal to tokenizers" in fast.backend["reason"]
    assert fast.backend["checked_in_run"]["texts"] > 0 and not fast.backend["failovers"]
    assert _data_files(tmp_path / "fast") == _data_files(tmp_path / "reference")
    return fast.backend


def test_chat_on_fastokens_writes_the_bytes_of_tokenizers(corpus: Path, model: Path, tmp_path: Path) -> None:
    """A byte-level BPE's character offsets follow from its ids: chat data encodes with fastokens
    (ids and every offset proved equal to tokenizers' on the probes and a sample, re-checked in
    every task) and writes tokenizers' bytes, masks included; with a tokenizer whose offsets do not
    follow from its ids (a SentencePiece-style BPE whose byte tokens are added tokens too: one id
    for a byte and for the six characters "<0x0A>"), auto keeps tokenizers and says why."""
    pytest.importorskip("fastokens")
    _fast_writes_the_bytes_of_tokenizers(tmp_path, corpus, model)
    from tests.text.test_backends import _sentencepiece_style

    sp = tmp_path / "sp"
    sp.mkdir()
    _sentencepiece_style().save(str(sp / "tokenizer.json"))
    (sp / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": CHATML}))
    other = run_job(job(tmp_path, corpus, sp, "sp"), **quiet)
    assert other.backend["chosen"].startswith("tokenizers ")
    assert "this tokenizer's do not follow from its ids" in other.backend["reason"]


# Mistral-7B-Instruct's way of rendering a conversation (BOS, [INST] around a user turn, EOS after
# an assistant's), with a tool call's absent content taken as empty.
MISTRAL_V1 = (
    "{{ bos_token }}{% for message in messages %}{% set content = message.get('content') or '' %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + content + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ content + eos_token }}{% else %}{{ content }}{% endif %}"
    "{% endfor %}"
)


@pytest.mark.parametrize(
    "shape", ["mistral_v1", pytest.param("mistral_v1_metaspace", marks=pytest.mark.slow)]
)
def test_chat_with_a_real_sentencepiece_bpe_on_fastokens_writes_the_bytes_of_tokenizers(
    shape: str, corpus: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Mistral-7B's SentencePiece BPE (byte fallback, `▁` for a space) with a Mistral-style template:
    offsets follow from fastokens' ids (PieceOffsets) and the job writes tokenizers' bytes, masks
    included, every conversation on fastokens: in the published shape (Prepend + Replace) and in
    transformers 5's Metaspace shape, whose renders start with `<s>` (no `▁` prepended anywhere:
    fastokens' copy without the Prepend)."""
    pytest.importorskip("fastokens")
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(request.getfixturevalue(shape), model / "tokenizer.json")
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": MISTRAL_V1}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    fast = _fast_writes_the_bytes_of_tokenizers(tmp_path, corpus, model)
    assert fast["routed_to_tokenizers"]["texts"] == 0


def test_a_fast_backend_whose_offsets_differ_in_the_run_fails_over(
    corpus: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offsets made to differ in the tasks (the self-check passes): the tasks' sampled check finds it,
    every unit is tokenized again with tokenizers, and the bytes are tokenizers'."""
    pytest.importorskip("fastokens")
    from raypack.pipeline.tokenize import stage as tokenize_stage
    from tests.fakes import Shifted

    run_job(job(tmp_path, corpus, model, "reference", tokenizer={"backend": "tokenizers"}), **quiet)
    monkeypatch.setattr(tokenize_stage, "TokenizeShards", Shifted)
    failed = run_job(job(tmp_path, corpus, model, "failed"), **quiet)
    assert failed.backend["chosen"].startswith("fastokens ") and failed.backend["finished_on"] == "tokenizers"
    assert any("other character offsets" in f for f in failed.backend["failovers"])
    assert _data_files(tmp_path / "failed") == _data_files(tmp_path / "reference")
