"""The write stage: a writer's files from pieces cut anywhere; a file's bytes independent of item order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from raypack import schema
from raypack.formats import Spec
from raypack.packing import pack
from raypack.pipeline.place.assign import file_key, file_of, file_rows, items_table
from raypack.pipeline.write.exchange import write_files
from raypack.pipeline.write.materialize import write_pack_file, write_pack_files

PARQUET = Spec("parquet", pad_id=0, dtype="int32", eos_id=None)


def _items(seed: int, docs: int = 300, seq_len: int = 64, rows: int = 7) -> pa.Table:
    """Real item rows: documents of random lengths (some longer than seq_len) packed by bfd."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 3 * seq_len, size=docs)
    flat = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    doc_table = pa.table(
        {
            "doc_id": [f"d{i}" for i in range(docs)],
            "length": lengths,
            "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
        }
    )
    a = pack(lengths, seq_len, "bfd", seed=seed)
    local = a.pack.astype(np.int64)
    keys = file_key(np.zeros(len(local), dtype=np.int64), local // rows)
    return items_table(doc_table, a.items, keys, local, a.slot, np.full(len(local), seq_len, np.int32))


def test_items_carry_their_documents_tokens_chunk_by_chunk() -> None:
    """items_table's run copy: a document's chunks, in chunk order, are its tokens exactly."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 3 * 64, size=300)
    flat = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
    items = _items(seed=3)
    assert items.num_rows > 300  # some documents were cut into chunks
    chunks: dict[str, list[tuple[int, list[int]]]] = {}
    for row in items.select(["doc_id", "chunk", "tokens"]).to_pylist():
        chunks.setdefault(row["doc_id"], []).append((row["chunk"], row["tokens"]))
    starts = np.r_[0, np.cumsum(lengths)]
    for i in range(300):
        got = [t for _, tokens in sorted(chunks[f"d{i}"]) for t in tokens]
        assert got == flat[starts[i] : starts[i + 1]].tolist()


def test_write_pack_file_bytes_do_not_depend_on_item_order(tmp_path: Path) -> None:
    items = _items(seed=1)
    one_file = items.filter(pa.compute.equal(items.column("file_key"), 0))
    shuffled = one_file.take(pa.array(np.random.default_rng(5).permutation(one_file.num_rows)))
    a = write_pack_file(one_file, str(tmp_path / "a"), PARQUET, bucketed=False).to_pylist()[0]
    b = write_pack_file(shuffled, str(tmp_path / "b"), PARQUET, bucketed=False).to_pylist()[0]
    assert a["sha256"] == b["sha256"] and a["rows"] == 7
    # Each item's tokens sit in its pack at its offset: compare with the items directly.
    packed = pq.read_table(tmp_path / "a" / a["path"]).to_pylist()
    by_pack = sorted(one_file.to_pylist(), key=lambda r: (r["pack"], r["slot"]))
    packs = sorted({r["pack"] for r in by_pack})
    for row, p in zip(packed, packs, strict=True):
        mine = [r for r in by_pack if r["pack"] == p]
        assert row["doc_ids"] == [r["doc_id"] for r in mine]
        tokens = [t for r in mine for t in r["tokens"]]
        assert row["input_ids"][: len(tokens)] == tokens
        assert set(row["input_ids"][len(tokens) :]) <= {0}
        assert row["doc_offsets"] == list(np.r_[0, np.cumsum([len(r["tokens"]) for r in mine])])


def test_write_pack_files_writes_each_file_of_a_block_and_refuses_unsorted(tmp_path: Path) -> None:
    items = _items(seed=2)
    block = items.sort_by("file_key")
    files = write_pack_files(block, str(tmp_path), PARQUET, bucketed=False)
    assert files.num_rows == len(set(items.column("file_key").to_pylist()))
    assert sum(files.column("items").to_pylist()) == items.num_rows
    assert write_pack_files(schema.ITEMS.empty_table(), str(tmp_path), PARQUET, False).num_rows == 0
    with pytest.raises(RuntimeError, match="unsorted"):
        write_pack_files(block.take(pa.array(np.arange(block.num_rows)[::-1])), str(tmp_path), PARQUET, False)


def test_a_writer_writes_each_file_of_its_range_from_pieces_cut_anywhere(tmp_path: Path) -> None:
    """write_files (the exchange's writer) gets its items as pieces, each sorted by file_key and cut
    anywhere: every file of its range comes out as write_pack_file makes it from all of its items; an
    item of a file outside the range, or a file with no items, stops it."""
    items = _items(seed=4).sort_by("file_key")
    keys = np.unique(items.column("file_key").to_numpy())
    rng = np.random.default_rng(2)
    owner = rng.integers(0, 3, size=items.num_rows)  # three pieces, each keeping the key order
    pieces = [items.filter(pa.array(owner == i)) for i in range(3)]
    got = write_files(keys, str(tmp_path / "a"), PARQUET, False, None, (), None, 2, *pieces).to_pylist()
    want = [
        write_pack_file(
            items.filter(pa.compute.equal(items.column("file_key"), int(k))),
            str(tmp_path / "b"),
            PARQUET,
            False,
        ).to_pylist()[0]
        for k in keys
    ]
    assert got == want and len(got) == len(keys) > 3
    with pytest.raises(RuntimeError, match="reached a writer of other files"):
        write_files(keys[1:], str(tmp_path / "c"), PARQUET, False, None, (), None, 1, *pieces)
    with pytest.raises(RuntimeError, match="no items reached file key"):
        write_files(
            np.r_[keys, keys[-1] + 1], str(tmp_path / "d"), PARQUET, False, None, (), None, 1, *pieces
        )


def test_items_that_name_their_token_file_write_the_same_bytes(tmp_path: Path) -> None:
    """A local run's items carry no tokens, only where they lie in their unit's token file (source,
    start), and the writer copies them from the mapped file: the same files as items that carry
    their tokens, with the token file's documents spread over several record batches."""
    from raypack.pipeline.tokenize.token_files import MappedTokens

    rng = np.random.default_rng(8)
    seq_len, docs = 64, 300
    lengths = rng.integers(1, 3 * seq_len, size=docs)
    flat = rng.integers(0, 1000, size=int(lengths.sum())).astype(np.int32)
    offsets = np.r_[0, np.cumsum(lengths)]
    table = pa.table(
        {
            "row": np.arange(docs, dtype=np.int64),
            "file": np.zeros(docs, dtype=np.int32),
            "doc_id": [f"d{i}" for i in range(docs)],
            "length": lengths.astype(np.int64),
            "tokens": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(flat)),
        },
        schema=schema.TOKENIZED,
    )
    path = tmp_path / "unit.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, schema.TOKENIZED) as writer:
        for lo in range(0, docs, 70):  # record batches of 70 documents, the last one empty
            writer.write_table(table.slice(lo, 70))
        writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema.TOKENIZED))
    a = pack(lengths, seq_len, "bfd", seed=8)
    local = a.pack.astype(np.int64)
    keys = file_key(np.zeros(len(local), dtype=np.int64), local // 7)
    capacity = np.full(len(local), seq_len, np.int32)
    carried = items_table(table, a.items, keys, local, a.slot, capacity)
    named = items_table(
        table.drop_columns(["tokens"]), a.items, keys, local, a.slot, capacity, (5, offsets[:-1])
    )
    assert named.column("source").to_pylist() == [5] * named.num_rows
    assert sum(len(t) for t in named.column("tokens").to_pylist()) == 0
    assert named.column("length").to_pylist() == [len(t) for t in carried.column("tokens").to_pylist()]
    file_keys = np.unique(keys)
    want = write_files(file_keys, str(tmp_path / "a"), PARQUET, False, None, (), None, 1, carried)
    got = write_files(file_keys, str(tmp_path / "b"), PARQUET, False, None, (), {5: str(path)}, 2, named)
    assert got.to_pylist() == want.to_pylist() and len(file_keys) > 3
    # The mapped buffers are where the items say: batch by batch, each one's values.
    mapped = MappedTokens({5: str(path)})
    buffer, at = mapped.locate(np.full(3, 5), np.asarray([0, 1, int(offsets[70])]))
    assert buffer.tolist() == [0, 0, 1] and at.tolist() == [0, 1, 0]
    mapped.close()
    with pytest.raises(RuntimeError, match="which were not mapped"):
        write_files(file_keys, str(tmp_path / "c"), PARQUET, False, None, (), None, 1, named)


@given(st.integers(0, 5_000), st.integers(1, 600))
def test_files_are_as_even_as_can_be_and_each_pack_knows_its_file(packs: int, shard_rows: int) -> None:
    """ceil(packs / shard_rows) files of at most shard_rows packs, one pack apart at most and the
    longer ones first; file_of places pack k in the file whose rows hold it."""
    rows = file_rows(packs, shard_rows)
    assert sum(rows) == packs and len(rows) == -(-packs // shard_rows)
    assert all(0 < r <= shard_rows for r in rows)
    assert not rows or max(rows) - min(rows) <= 1
    assert rows == sorted(rows, reverse=True)
    local = np.arange(packs)
    expected = np.repeat(np.arange(len(rows)), rows)
    assert np.array_equal(file_of(local, packs, shard_rows), expected)
    # one count per pack, as assign gives it (packs of several buckets side by side)
    assert np.array_equal(file_of(local, np.full(packs, packs), shard_rows), expected)


def test_a_repack_writes_even_files_not_a_short_last_one() -> None:
    """33,545 packs in files of at most 10,000: four of 8,387 or 8,386 (a short last file of 3,545
    left one of two writers idle ~1 s at the end)."""
    assert file_rows(33_545, 10_000) == [8_387, 8_386, 8_386, 8_386]
    assert file_rows(20_000, 10_000) == [10_000, 10_000]
    assert file_rows(7, 10_000) == [7]
