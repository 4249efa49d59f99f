"""The exchange between assign and write (raypack.pipeline.write.exchange): its layout, and real jobs whose
bytes must not depend on its shape (one hop or two, rounds, runs, writers, tokenizer actors), with
many tiny shards and files; nor on the tokenize stage's work units (a Parquet file split by row
groups)."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from raypack.config import load_config
from raypack.engine import ray as ray_engine
from raypack.engine import tasks
from raypack.pipeline.job import run_job
from raypack.pipeline.tokenize.summary import shard_runs
from raypack.pipeline.write import exchange
from raypack.pipeline.write.exchange import layout
from raypack.verifier import verify
from tests.conftest import job_config, random_text, write_jsonl


def quiet(_: str) -> None:
    pass


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 10**6), min_size=1, max_size=60),
    files=st.lists(st.integers(1, 10**7), min_size=1, max_size=80),
    width=st.integers(1, 40),
    scale=st.sampled_from([1, 2**20, 2**28]),
    one_hop=st.integers(0, 400),
    documents=st.integers(0, 10**9),
)
def test_layout_covers_every_shard_and_file_in_contiguous_runs(
    sizes: list[int], files: list[int], width: int, scale: int, one_hop: int, documents: int
) -> None:
    """Runs and writer ranges are contiguous, cover everything once, and are never more than asked;
    two hops only above the object bound, with partitions of consecutive writers."""
    runs = min(len(sizes), width)
    run_of_shard = shard_runs(sizes, runs)
    assert np.all(np.diff(run_of_shard) >= 0) and run_of_shard.min() >= 0 and run_of_shard.max() < runs
    shard_bytes = np.asarray(sizes, dtype=np.float64) * scale
    file_bytes = np.asarray(files, dtype=np.float64) * scale
    exchange_bound = exchange.ONE_HOP_OBJECTS
    try:
        exchange.ONE_HOP_OBJECTS = one_hop
        lay = layout(run_of_shard, runs, shard_bytes, file_bytes, width, documents, id_check=True)
    finally:
        exchange.ONE_HOP_OBJECTS = exchange_bound
    run_bytes = np.bincount(run_of_shard, weights=shard_bytes, minlength=runs)
    assert list(lay.rounds > 0) == list(run_bytes > 0)
    assert np.all(lay.rounds <= np.ceil(run_bytes / exchange.ROUND_BYTES))
    for g in range(runs):
        assert len(lay.round_ends[g]) == max(int(lay.rounds[g]) - 1, 0)
        assert np.all(np.diff(lay.round_ends[g]) > 0)
    w = lay.writer_first
    assert w[0] == 0 and w[-1] == len(files) and np.all(np.diff(w) > 0)
    assert lay.writers <= max(width, int(np.ceil(file_bytes.sum() / exchange.WRITER_BYTES)))
    p = lay.part_first
    assert p[0] == 0 and p[-1] == lay.writers and np.all(np.diff(p) > 0)
    exchange.ONE_HOP_OBJECTS = 2**62
    try:
        one = layout(run_of_shard, runs, shard_bytes, file_bytes, width, documents, id_check=True)
    finally:
        exchange.ONE_HOP_OBJECTS = exchange_bound
    assert one.hops == 1 and one.partitions == one.writers and one.writers == lay.writers
    if lay.hops == 2:  # only above the bound, and only for fewer objects
        assert one.counts()["objects"] > one_hop
        assert lay.counts()["objects"] < one.counts()["objects"]
        c = exchange.MERGE_BYTES // exchange.ROUND_BYTES
        assert lay.partitions <= max(2, int(np.ceil(np.sqrt(lay.writers / c))))
        assert lay.merge_width == c * max(2, int(np.ceil(np.sqrt(lay.writers / c))))
    else:
        assert lay.partitions == lay.writers
    want_ids = max(1, int(np.ceil(documents * exchange.ID_BYTES / exchange.WRITER_BYTES)))
    assert lay.id_parts == min(width, want_ids)


def test_shard_runs_balance_bytes_and_keep_order() -> None:
    run = shard_runs([10] * 100, 4)
    assert np.bincount(run).tolist() == [25, 25, 25, 25]
    # A shard bigger than a run's share takes a run to itself; the rest share the others.
    run = shard_runs([1] * 10 + [1000] + [1] * 10, 3)
    assert run[10] == 1 and set(run[:10]) == {0} and set(run[11:]) == {2}
    assert shard_runs([0, 0, 0], 2).tolist() == [0, 0, 1]


def _digest(out: Path) -> dict[str, str]:
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("metrics.json", "report.html", "manifest.json")
    }


def _tiny_corpus(root: Path, shards: int, seed: int) -> tuple[Path, list[tuple[str, str]]]:
    """`shards` jsonl shards of 3-5 documents each, with ids: every 97th document's is "shared" (a
    short one: one item each, across and within shards). Returns the corpus and its (id, text)s."""
    rng = random.Random(seed)
    corpus = root / "corpus"
    corpus.mkdir()
    docs = []
    for s in range(shards):
        records = []
        for _ in range(rng.randint(3, 5)):
            n = len(docs)
            shared = n % 97 == 0
            text = random_text(rng, 5 if shared else int(rng.lognormvariate(4.0, 1.0)) + 1)
            records.append({"id": "shared" if shared else f"doc-{n}", "text": text})
            docs.append((records[-1]["id"], text))
        write_jsonl(corpus / f"part-{s:04d}.jsonl", records)
    return corpus, docs


def _documents(out: Path) -> list[tuple[str, tuple[int, ...]]]:
    """Every document rebuilt from the packs, as (id, tokens), sorted; a shared id's items each count as
    one document (the corpus makes them short: one item each)."""
    table = pq.read_table(out / "data")
    chunks: dict[str, list[tuple[int, list[int]]]] = {}
    for row in table.to_pylist():
        ends = row["doc_offsets"]
        for k, doc_id in enumerate(row["doc_ids"]):
            chunks.setdefault(doc_id, []).append(
                (row["chunk_index"][k], row["input_ids"][ends[k] : ends[k + 1]])
            )
    docs = [("shared", tuple(t)) for _, t in chunks.pop("shared", [])]
    docs += [(i, tuple(t for _, part in sorted(parts) for t in part)) for i, parts in chunks.items()]
    return sorted(docs)


# A scale test (48 s): the light tier keeps test_two_hops_on_local_processes_write_the_bytes_of_one.
@pytest.mark.slow
@pytest.mark.ray  # `watched` reaches the tasks by value (Ray's cloudpickle), and the width is Ray's
def test_many_tiny_shards_and_files_through_either_hop_and_any_width(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """240 shards, 200+ files (shard_rows 2, seq_len 128): packed, verified, token for token
    against an independent tokenization; then the same bytes with two hops, small rounds (many
    pieces, merge tasks) and width 7, and with width 1 and one tokenizer actor: the exchange's shape
    never reaches the output. The duplicate-id check, folded into the exchange, counts the same in
    every shape."""
    corpus, docs = _tiny_corpus(tmp_path, shards=240, seed=3)  # ~960 documents
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id("<|endoftext|>")
    expected = sorted((i, (*tok.encode(t, add_special_tokens=False).ids, eos)) for i, t in docs)

    def pack(name: str, hops: int = 1, **tokenizer: int) -> dict[str, str]:
        cfg = load_config(
            str(
                job_config(
                    tmp_path,
                    f"{corpus}/*",
                    tokenizer_path,
                    input={"id_field": "id"},
                    pack={"seq_len": 128},
                    output={"shard_rows": 2, "path": str(tmp_path / name)},
                    tokenizer=dict(tokenizer),
                )
            )
        )
        logs: list[str] = []
        result = run_job(cfg, log=logs.append, cache=str(tmp_path / "tokens"))  # tokenized once
        assert result.duplicates is not None
        shared = sum(i == "shared" for i, _ in docs)
        assert (result.duplicates.ids, result.duplicates.documents) == (1, shared), name
        assert result.duplicates.examples == ("shared",)
        assert any("exchange:" in line and f"; {hops} hop(s)" in line for line in logs), logs
        return _digest(tmp_path / name)

    want = pack("out")
    out = tmp_path / "out"
    assert len([p for p in want if p.startswith("data/")]) >= 200
    report = verify(str(out), load_config(str(tmp_path / "job.yaml")), sample=50)
    assert report.ok, report.problems
    assert _documents(out) == expected  # every token of every document, once

    monkeypatch.setattr(exchange, "ONE_HOP_OBJECTS", 0)
    monkeypatch.setattr(exchange, "ROUND_BYTES", 4096)  # a round every few record batches
    monkeypatch.setattr(ray_engine, "cluster_cpus", lambda: 7)
    yields = tmp_path / "yields"
    yields.mkdir()
    real_assign = exchange.assign_run

    def watched(*args: Any) -> Any:  # pickled by value into the task: logs what the task yields
        log = yields / f"{random.getrandbits(64):016x}"
        for value in real_assign(*args):
            if isinstance(value, pa.Table):
                kind = "ids" if value.column_names == ["doc_id"] else "items"
                with open(log, "a") as f:
                    f.write(f"{kind} {value.num_rows}\n")
            yield value

    monkeypatch.setattr(exchange, "assign_run", watched)
    assert pack("two_hops_width7", hops=2, concurrency=2) == want
    # Ids ride with the rounds: a task yields ids before its last round's items, not all at its end.
    logs = [[line.split() for line in f.read_text().splitlines()] for f in sorted(yields.iterdir())]
    assert len(logs) == 7
    for log in logs:
        last_items = max(i for i, (kind, _) in enumerate(log) if kind == "items")
        assert sum(kind == "items" for kind, _ in log) > 2 * 2  # several rounds of 2+ partitions
        assert sum(int(n) for kind, n in log[:last_items] if kind == "ids") > 0
    monkeypatch.undo()
    monkeypatch.setattr(ray_engine, "cluster_cpus", lambda: 1)
    assert pack("width1", concurrency=1) == want


def test_two_hops_on_local_processes_write_the_bytes_of_one(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exchange on the default executor's processes, in one hop and in two (merge tasks whose
    inputs are pieces of several assign tasks, rounds of a few record batches): the same bytes. The
    layout is the driver's; the local pool runs each task once its pieces exist."""
    corpus, _ = _tiny_corpus(tmp_path, shards=60, seed=4)

    def pack(name: str) -> tuple[dict[str, str], list[str]]:
        cfg = job_config(
            tmp_path,
            f"{corpus}/*",
            tokenizer_path,
            input={"id_field": "id"},
            pack={"seq_len": 128},
            output={"shard_rows": 2, "path": str(tmp_path / name)},
        )
        logs: list[str] = []
        result = run_job(load_config(str(cfg)), log=logs.append)
        assert result.runner["name"] == "local"
        assert result.duplicates is not None and result.duplicates.ids == 1
        assert verify(str(tmp_path / name)).ok
        return _digest(tmp_path / name), [line for line in logs if "exchange:" in line]

    one, said = pack("one")
    assert "1 hop(s)" in said[0]
    monkeypatch.setattr(exchange, "ONE_HOP_OBJECTS", 0)
    monkeypatch.setattr(exchange, "ROUND_BYTES", 4096)  # many rounds
    monkeypatch.setattr(exchange, "WRITER_BYTES", 4096)  # a writer a few files
    monkeypatch.setattr(exchange, "MERGE_BYTES", 4 * 4096)  # merges of a few pieces
    two, said = pack("two")
    assert "2 hop(s)" in said[0] and " 0 merge" not in said[0], said
    assert two == one


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_a_large_file_split_into_units_packs_the_same_bytes(
    tmp_path: Path, tokenizer_path: Path, fmt: str
) -> None:
    """One file, tokenized whole and as ~8 units (input.unit_bytes): Parquet as runs of its 24 row
    groups, JSONL as byte ranges. The data files are byte-identical, the documents' index says the
    same (rows, ids, lengths), so do the rejects, and both verify (from the manifest's units)."""
    rng = random.Random(5)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [random_text(rng, int(rng.lognormvariate(4.0, 1.0)) + 1) for _ in range(480)]
    texts[7::50] = [""] * len(texts[7::50])  # empty documents: rejects in every unit
    big = corpus / f"big.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"text": texts}), big, row_group_size=20)
    else:
        lines = [json.dumps({"text": t}) for t in texts]
        lines[100:100] = ["{broken", ""]  # a malformed line and a blank one
        big.write_text("\n".join(lines) + "\n")

    def pack(name: str, unit_bytes: int) -> Path:
        cfg = job_config(
            tmp_path,
            f"{corpus}/*",
            tokenizer_path,
            input={"format": fmt, "unit_bytes": unit_bytes, "max_reject_ratio": 0.1},
            output={"path": str(tmp_path / name)},
        )
        run_job(load_config(str(cfg)), log=quiet)
        assert verify(str(tmp_path / name), load_config(str(cfg)), sample=40).ok
        return tmp_path / name

    whole, split = pack("whole", 1 << 30), pack("split", big.stat().st_size // 8)
    assert json.loads((whole / "metrics.json").read_text())["split_files"] == {}
    units = json.loads((split / "metrics.json").read_text())["split_files"][big.name]["units"]
    assert 6 <= units <= 10
    data = {p: h for p, h in _digest(whole).items() if p.startswith("data/")}
    assert data and {p: h for p, h in _digest(split).items() if p.startswith("data/")} == data

    def rows(out: Path, folder: str, columns: list[str]) -> list[tuple[Any, ...]]:
        table = pq.read_table(out / folder, columns=columns)
        return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))

    index = ["doc_id", "row", "length"]
    assert rows(split, "index", index) == rows(whole, "index", index)
    assert len(rows(whole, "index", index)) == 480 - len(texts[7::50])
    rejected = rows(whole, "rejects", ["source", "row", "reason"])
    assert rows(split, "rejects", ["source", "row", "reason"]) == rejected
    assert len(rejected) == len(texts[7::50]) + (fmt == "jsonl")


def test_transient_storage_errors_are_told_apart_without_the_drivers_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Patterns None (the driver never imported Ray Data): Ray Data's own list is read when an
    OSError is met, so a throttled request is retried and a missing file is not."""
    monkeypatch.setattr(tasks, "_PAUSE_S", (0.0, 0.0))
    with pytest.raises(tasks.TransientStorageError, match="SLOW_DOWN"), tasks.transient(None):
        raise OSError("When reading information for key 'a': AWS Error SLOW_DOWN during HeadObject")
    with pytest.raises(FileNotFoundError) as caught, tasks.transient(None):
        raise FileNotFoundError("s3://bucket/part-0.jsonl")
    assert not isinstance(caught.value, tasks.TransientStorageError)
    # A list of the driver's own wins.
    with pytest.raises(OSError, match="SLOW_DOWN") as other, tasks.transient(("PERMISSION",)):
        raise OSError("AWS Error SLOW_DOWN")
    assert not isinstance(other.value, tasks.TransientStorageError)
