"""The write stage: one sorted block per output file, and a file's bytes independent of item order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack import schema
from raypack.packing import pack
from raypack.pipeline.assign import file_key, items_table
from raypack.pipeline.job import by_file
from raypack.pipeline.materialize import write_pack_file, write_pack_files


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


def test_write_pack_file_bytes_do_not_depend_on_item_order(tmp_path: Path) -> None:
    items = _items(seed=1)
    one_file = items.filter(pa.compute.equal(items.column("file_key"), 0))
    shuffled = one_file.take(pa.array(np.random.default_rng(5).permutation(one_file.num_rows)))
    a = write_pack_file(one_file, str(tmp_path / "a"), pad_id=0, bucketed=False).to_pylist()[0]
    b = write_pack_file(shuffled, str(tmp_path / "b"), pad_id=0, bucketed=False).to_pylist()[0]
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
    files = write_pack_files(block, str(tmp_path), pad_id=0, bucketed=False)
    assert files.num_rows == len(set(items.column("file_key").to_pylist()))
    assert sum(files.column("items").to_pylist()) == items.num_rows
    assert write_pack_files(schema.ITEMS.empty_table(), str(tmp_path), 0, False).num_rows == 0
    with pytest.raises(RuntimeError, match="unsorted"):
        write_pack_files(block.take(pa.array(np.arange(block.num_rows)[::-1])), str(tmp_path), 0, False)


@pytest.mark.usefixtures("ray_session")
def test_the_write_sort_gives_one_block_per_file_whatever_the_input_blocks() -> None:
    """Sampled range boundaries (groupby's) would put several files in a block once there are more files
    than input blocks (30 against 4 here); the plan's file keys as boundaries never do."""
    import ray
    import ray.data

    rng = np.random.default_rng(0)
    keys = sorted(
        int(k)
        for k in np.r_[
            file_key(np.zeros(20, np.int64), np.arange(20)), file_key(np.ones(10, np.int64), np.arange(10))
        ]
    )
    rows = rng.choice(np.array(keys), size=3000)
    ds = ray.data.from_arrow(
        [pa.table({"file_key": part, "x": part * 2}) for part in np.array_split(rows, 4)]
    )
    blocks = [ray.get(ref) for ref in by_file(ds, keys).to_arrow_refs()]
    distinct = [sorted(set(b.column("file_key").to_pylist())) for b in blocks if b.num_rows]
    assert distinct == [[k] for k in keys]
    assert sum(b.num_rows for b in blocks) == len(rows)
