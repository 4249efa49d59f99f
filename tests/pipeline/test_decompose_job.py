"""`raypack pack` with pack.algorithm decompose, end to end: a bucket a chunk length, every
document's tokens in its chunks (or its tail below min_seq_len counted as dropped), verify
passing and knowing the rule, and a rerun byte-identical."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.config import load_config
from raypack.errors import ConfigError
from raypack.packing.decompose import chunk_lengths
from raypack.verifier import verify
from tests.conftest import cli, independent_tokens, job_config, make_corpus, packed_documents, write_jsonl


def _digests(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / "data").rglob("*.parquet"))
    }


def test_pack_decompose_keeps_every_token_in_power_of_two_chunks_and_reruns_alike(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=50, seed=5)
    write_jsonl(corpus / "short.jsonl", [{"text": "hi"}, {"text": "a few words"}])  # under 8 tokens
    pack = {"algorithm": "decompose", "seq_len": 256, "min_seq_len": 8}
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack)
    said = cli("pack", str(cfg), "--quiet").stdout
    out = tmp_path / "out"
    # Chunks of many lengths: no lower bound in packs of seq_len, in the summary or the report.
    assert "of several lengths up to 256 (one chunk each)" in said and "lower bound" not in said
    page = (out / "report.html").read_text()
    assert '<td class="num">—</td>' in page
    # Its tails' rejects are documents packed in part, told apart from rejected records.
    assert "documents were packed in part or not at all" in page
    # The figures' captions say how decompose cuts, not how bfd does.
    assert "decompose cuts every document whose length is not a power of two" in page
    assert "cuts only documents longer than seq_len" not in page
    assert "rejects              documents packed in part or not at all: decompose: " in said
    lengths = sorted(int(d.name.split("=")[1]) for d in (out / "data").iterdir())
    assert lengths and set(lengths) <= {8, 16, 32, 64, 128, 256}
    for d in (out / "data").iterdir():
        table = pq.read_table(d)
        length = int(d.name.split("=")[1])
        # A pack is one chunk of one document, no padding.
        assert set(table.column("num_tokens").to_pylist()) == {length}
        assert {len(x) for x in table.column("doc_ids").to_pylist()} == {1}

    # Token conservation, against tokenizers run here: each document's chunks, in order, are its
    # tokens but the last (length mod 8), which metrics count as dropped.
    expected = independent_tokens(corpus, tokenizer_path)
    got = packed_documents(out)
    dropped = 0
    for doc_id, tokens in expected.items():
        kept = len(tokens) - len(tokens) % 8
        assert got.get(doc_id, []) == tokens[:kept]
        dropped += len(tokens) - kept
    metrics = json.loads((out / "metrics.json").read_text())["metrics"]
    assert metrics["tokens_dropped"] == dropped > 0
    assert metrics["tokens"] + dropped == sum(len(t) for t in expected.values())

    # Each document with a tail has a reject that says why; it stands for no record (the document
    # is packed), so no reject gate counts it.
    rejects = pq.read_table(out / "rejects")
    assert rejects.num_rows == sum(len(t) % 8 > 0 for t in expected.values())
    whole = "decompose: shorter than pack.min_seq_len (8), the whole document is in no chunk"
    tail = "decompose: its last tokens past a multiple of pack.min_seq_len (8) are in no chunk"
    reasons = rejects.column("reason").to_pylist()
    assert reasons.count(whole) == sum(len(t) < 8 for t in expected.values())
    assert reasons.count(tail) == sum(len(t) > 8 and len(t) % 8 > 0 for t in expected.values()) > 0
    assert set(rejects.column("records").to_pylist()) == {0}

    report = verify(str(out), load_config(str(cfg)))
    assert report.ok, report.problems
    assert report.sampled > 0
    # The documents shorter than min_seq_len are in the index, and verify says none of their tokens
    # is packed rather than count them with the packed ones.
    short = sum(len(t) < 8 for t in expected.values())
    assert report.documents == len(expected) and report.unpacked == short > 0
    said = cli("verify", str(out)).stdout
    assert f"{len(expected):,} documents ({short:,} with no token packed)," in said

    first = _digests(out)
    cli("pack", str(cfg), "--quiet", "--overwrite")
    assert _digests(out) == first


def test_verify_finds_a_chunk_that_breaks_the_rule(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=30, seed=2)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"algorithm": "decompose", "seq_len": 256})
    cli("pack", str(cfg), "--quiet")
    out = tmp_path / "out"
    manifest = json.loads((out / "manifest.json").read_text())
    # Swap a document's first two chunks' indexes: its tokens and chunk indexes 0..k-1 stay, so the
    # checks of every packer pass; its largest chunk is no longer first, which decompose's sees.
    where: dict[tuple[str, int], tuple[dict[str, object], int]] = {}
    for entry in manifest["files"]:
        table = pq.read_table(out / entry["path"])
        for row, (ids, chunks) in enumerate(
            zip(*table.select(["doc_ids", "chunk_index"]).to_pydict().values(), strict=True)
        ):
            where[ids[0], chunks[0]] = (entry, row)
    doc = next(d for d, c in where if c == 1)
    for entry, row in (where[doc, 0], where[doc, 1]):
        path = out / str(entry["path"])
        table = pq.read_table(path)
        chunk = table.column("chunk_index").to_pylist()
        chunk[row] = [1 - chunk[row][0]]
        column = pa.array(chunk, table.schema.field("chunk_index").type)
        pq.write_table(
            table.set_column(table.schema.get_field_index("chunk_index"), "chunk_index", column), path
        )
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        entry["bytes"] = path.stat().st_size
    (out / "manifest.json").write_text(json.dumps(manifest))
    problems = verify(str(out)).problems
    assert any("decompose's rule" in p for p in problems), problems
    assert not any("chunk indexes" in p for p in problems)


@pytest.mark.parametrize(
    ("pack", "match"),
    [
        ({"seq_len": 300}, "power of two"),
        ({"seq_len": 256, "min_seq_len": 24}, "power of two"),
        ({"seq_len": 256, "min_seq_len": 512}, "at most seq_len"),
        ({"seq_len": 256, "compare": ["bfd"]}, "its own chunks"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path: Path, pack: dict[str, object], match: str) -> None:
    cfg = job_config(tmp_path, "corpus/*", tmp_path / "tok.json", pack={"algorithm": "decompose", **pack})
    with pytest.raises(ConfigError, match=match):
        load_config(str(cfg))


def test_min_seq_len_is_decompose_s_alone(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, "corpus/*", tmp_path / "tok.json", pack={"min_seq_len": 8})
    with pytest.raises(ConfigError, match="decompose's"):
        load_config(str(cfg))


def test_chunk_rule_example() -> None:
    assert chunk_lengths(300, 256, 8) == [256, 32, 8]
    assert np.sum(chunk_lengths(300, 256, 1)) == 300
