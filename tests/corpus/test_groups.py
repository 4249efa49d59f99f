"""Runs of small files (input.group_bytes): many small files are read as a few work units, each a
run of consecutive files of one source, and everything after reading is as if each file were a
unit of its own: ids, rows, rejects, the packs' bytes, a mixture's selection, verify. Real files,
the user's executor, real tokenizers."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.cli import main
from raypack.config import ConfigError, InputConfig, load_config
from raypack.corpus import cut
from raypack.corpus.readers import read_unit
from raypack.corpus.units import WorkUnit
from raypack.dataset.manifest import entry_files
from raypack.pipeline.job import run_job
from raypack.storage import Shard, expand_inputs
from raypack.verifier import verify
from tests.conftest import (
    independent_tokens,
    job_config,
    packed_documents,
    random_text,
    s3_job_config,
    write_jsonl,
)


def quiet(_: str) -> None:
    pass


def _shard(i: int, name: str, size: int, source: str = "") -> Shard:
    return Shard(index=i, path=f"/nowhere/{name}", relpath=name, size=size, mtime_ns=0, source=source)


def test_small_files_join_runs_that_end_at_a_source_a_large_file_the_size_or_the_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cut, "MAX_RUN_FILES", 3)
    monkeypatch.setattr(cut, "run_end", lambda shard, group_bytes: False)  # the bounds alone
    reading = InputConfig(paths=("unused",)).reading()
    sizes = [("a/1", 40, "a"), ("a/2", 40, "a"), ("a/3", 40, "a"), ("a/big", 100, "a"), ("a/4", 10, "a")]
    sizes += [("b/1", 10, "b"), ("b/2", 10, "b"), ("b/3", 10, "b"), ("b/4", 10, "b"), ("b/5", 99, "b")]
    files = [WorkUnit(_shard(i, n, s, src), reading) for i, (n, s, src) in enumerate(sizes)]
    units = cut.group_runs(files, group_bytes=100)
    assert [u.relpaths for u in units] == [
        ["a/1", "a/2"],  # a/3 would take the run past 100 bytes
        ["a/3"],  # alone, as a one-file unit (no `more`)
        ["a/big"],  # not smaller than group_bytes: a unit of its own
        ["a/4"],  # the source changes after it
        ["b/1", "b/2", "b/3"],  # MAX_RUN_FILES
        ["b/4"],
        ["b/5"],  # 10 + 99 > 100
    ]
    assert [u.index for u in units] == list(range(len(units)))
    assert all(s.index == u.index for u in units for s in u.files)
    assert units[1].more == () and units[0].label == "a/1 and 1 more file"
    assert units[4].size == 30 and units[4].label == "b/1 and 2 more files"
    assert cut.group_runs(files, group_bytes=100) == units  # the same listing, the same runs
    assert [u.relpaths for u in cut.group_runs(files, group_bytes=0)] == [[n] for n, _, _ in sizes]


@settings(max_examples=100, deadline=None)
@given(
    # Random sizes, or files all of one size (a generated corpus): runs cut by a count of bytes
    # never fell back into step after a change in such a corpus.
    sizes=st.one_of(
        st.lists(st.integers(0, 3_000), min_size=2, max_size=600),
        st.builds(lambda n, size: [size] * n, st.integers(2, 600), st.integers(1, 3_000)),
    ),
    at=st.integers(0, 10_000),
    change=st.sampled_from(["remove", "add", "resize"]),
    new_size=st.integers(0, 3_000),
)
def test_one_file_added_removed_or_resized_moves_only_the_runs_around_it(
    sizes: list[int], at: int, change: str, new_size: int
) -> None:
    """Runs end where their files say (cut.run_end), not at a count of bytes from the corpus's
    start: after one file is added, removed or resized, the runs before the one that holds the file
    before it are the same, and so is every run after the first file at or after it whose hash ends
    a run; a token store or a rebuild re-tokenizes the few between."""
    reading = InputConfig(paths=("unused",)).reading()
    group = 16 << 10
    before = [(f"d/{i:05d}.jsonl", size) for i, size in enumerate(sizes)]
    i = at % len(before)
    after = list(before)
    if change == "remove":
        del after[i]
    elif change == "add":
        after.insert(i, (before[i][0] + ".new", new_size))
    else:
        after[i] = (before[i][0], new_size)

    def runs(files: list[tuple[str, int]]) -> list[tuple[tuple[str, int], ...]]:
        units = [WorkUnit(_shard(k, n, size), reading) for k, (n, size) in enumerate(files)]
        return [tuple((s.relpath, s.size) for s in u.files) for u in cut.group_runs(units, group)]

    old, new = runs(before), runs(after)
    assert [f for r in new for f in r] == after  # every file once, in order
    assert all(sum(size for _, size in r) <= group for r in new)
    # Unchanged: the runs before the one holding the file before the change, and the runs after
    # the first later file whose hash ends a run (the same file, the same size, in both listings).
    lo = before[max(0, i - 1)]
    first = next(k for k, r in enumerate(old) if lo in r)
    assert old[:first] == new[:first]
    ends = [f for f in after[i + 1 :] if cut.run_end(_shard(0, *f), group)]
    if ends:
        tail_old = old[next(k for k, r in enumerate(old) if ends[0] in r) + 1 :]
        tail_new = new[next(k for k, r in enumerate(new) if ends[0] in r) + 1 :]
        assert tail_old == tail_new


def test_a_negative_group_size_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"input\.group_bytes must be >= 0"):
        InputConfig(paths=("x",), group_bytes=-1)


def _files_with_rejects(root: Path, count: int, seed: int) -> list[Path]:
    """`count` small JSONL files, some gzipped, with malformed lines, empty documents and an empty
    file among them."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(count):
        lines = [json.dumps({"text": random_text(rng, rng.randint(1, 60))}) for _ in range(rng.randint(1, 6))]
        if i % 7 == 3:
            lines.insert(1, "{broken")
        if i % 11 == 5:
            lines.append(json.dumps({"text": ""}))
        if i == 9:
            lines = []
        path = root / (f"f{i:03d}.jsonl" + (".gz" if i % 5 == 2 else ""))
        data = ("\n".join(lines) + "\n" if lines else "").encode()
        path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
        paths.append(path)
    return paths


def test_a_run_reads_as_its_files_one_after_another(tmp_path: Path) -> None:
    """read_unit of a run gives each file's documents and rejects, in file order, each marked with
    its file's number, in batches that never pass batch_size; as reading each file alone does."""
    _files_with_rejects(tmp_path / "c", 30, seed=1)
    reading = InputConfig(paths=("unused",)).reading()
    files = [WorkUnit(s, reading) for s in expand_inputs((str(tmp_path / "c" / "*"),))]
    (run,) = cut.group_runs(files, group_bytes=1 << 20)
    assert len(run.files) == 30

    alone_docs, alone_rejects = [], []
    for number, f in enumerate(files):
        for batch in read_unit(f, 4):
            assert batch.files is None
            alone_docs += [
                (number, r, i, t) for r, i, t in zip(batch.rows, batch.ids, batch.texts, strict=True)
            ]
            alone_rejects += [(number, r.row, r.reason) for r in batch.rejects]
    docs, rejects = [], []
    for batch in read_unit(run, 4):
        assert batch.files is not None and len(batch) <= 4
        docs += list(zip(batch.files, batch.rows, batch.ids, batch.texts, strict=True))
        rejects += [(r.file, r.row, r.reason) for r in batch.rejects]
    assert docs == alone_docs and rejects == alone_rejects
    assert len(rejects) >= 6 and {f for f, _, _ in rejects} != {0}
    assert rejects[0][2].startswith("malformed JSON") and " at at " not in rejects[0][2]


def _digest(out: Path, folder: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((out / folder).iterdir())}


def _rows(out: Path, folder: str, columns: list[str]) -> list[tuple[Any, ...]]:
    table = pq.read_table(out / folder, columns=columns)
    return sorted(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


@pytest.mark.parametrize("fmt", ["jsonl", pytest.param("text", marks=pytest.mark.slow)])
def test_many_small_files_pack_the_same_bytes_in_runs_as_a_file_a_unit(
    tmp_path: Path, tokenizer_path: Path, fmt: str
) -> None:
    """120 small files (text: a file a document, as a code corpus), packed with the default runs and
    with a file a unit: byte-identical data files, the same documents (ids, rows, lengths) and
    rejects; the runs' documents name their files; both verify every document; tokens are the
    tokenizer's own."""
    corpus = tmp_path / "corpus"
    if fmt == "jsonl":
        _files_with_rejects(corpus, 120, seed=2)
    else:
        rng = random.Random(2)
        corpus.mkdir()
        for i in range(120):
            (corpus / f"src{i:03d}.txt").write_text(
                "" if i % 17 == 4 else random_text(rng, rng.randint(5, 300))
            )

    def pack(name: str, **extra: int) -> Path:
        cfg = job_config(
            tmp_path,
            f"{corpus}/*",
            tokenizer_path,
            file_units=False,
            input={"format": fmt, "max_reject_ratio": 0.2, **extra},
            output={"path": str(tmp_path / name)},
        )
        assert main(["pack", str(cfg), "--quiet"]) == 0
        report = verify(str(tmp_path / name), load_config(str(cfg)), sample=1000)
        assert report.ok, report.problems
        return tmp_path / name

    runs, alone = pack("runs"), pack("alone", group_bytes=0)
    metrics = json.loads((runs / "metrics.json").read_text())
    inputs = json.loads((runs / "manifest.json").read_text())["inputs"]
    units = len(inputs)
    assert 1 <= units <= 6 and metrics["grouped_files"] == {"units": units, "files": 120}
    assert json.loads((alone / "metrics.json").read_text())["grouped_files"] == {"units": 0, "files": 0}
    plural = "s" if units > 1 else ""
    assert f"{fmt}, 120 files in {units} work unit{plural})" in (runs / "report.html").read_text()
    assert f"{fmt}, 120 files)" in (alone / "report.html").read_text()
    assert _digest(runs, "data") == _digest(alone, "data")
    index = ["doc_id", "row", "length", "chunks", "placed"]
    assert _rows(runs, "index", index) == _rows(alone, "index", index)
    rejected = ["source", "row", "reason"]
    assert _rows(runs, "rejects", rejected) == _rows(alone, "rejects", rejected)
    assert len(_rows(runs, "rejects", rejected)) >= 7

    paths = [[f["path"] for f in entry_files(entry)] for entry in inputs]
    assert [p for run in paths for p in run] == sorted(p.name for p in corpus.iterdir())
    docs = pq.read_table(runs / "index", columns=["doc_id", "shard", "file"]).to_pylist()
    for d in docs:  # a document's file is the one its id names
        name = d["doc_id"] if fmt == "text" else d["doc_id"].rsplit(":", 1)[0]
        assert paths[d["shard"]][d["file"]] == name
    if fmt == "jsonl":
        expected = independent_tokens(corpus, tokenizer_path)
        assert packed_documents(runs) == {k: v for k, v in expected.items() if len(v) > 1}


def test_a_mixture_of_small_files_selects_the_same_documents_in_runs(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Two sources of small files, one downsampled, one upsampled: a document's copies follow from
    its own file's path and row whatever the run it is read in, so the packs are the same bytes as
    with a file a unit, and verify recomputes every document's copies from the manifest."""
    rng = random.Random(4)
    roots = {}
    for name, files in (("code", 40), ("web", 25)):
        roots[name] = tmp_path / name
        roots[name].mkdir()
        for i in range(files):
            docs = [{"text": random_text(rng, rng.randint(3, 80))} for _ in range(rng.randint(1, 5))]
            write_jsonl(roots[name] / f"{i:03d}.jsonl", docs)

    def pack(out: str, group_bytes: int | None) -> Path:
        extra = {} if group_bytes is None else {"group_bytes": group_bytes}
        sources = [
            {"name": "code", "paths": [f"{roots['code']}/*"], "weight": 0.3},
            {"name": "web", "paths": [f"{roots['web']}/*"], "weight": 0.7, "max_repeat": 3},
        ]
        data = {
            "input": {"sources": sources, "tokens": 6_000, **extra},
            "tokenizer": {"path": str(tokenizer_path)},
            "pack": {"seq_len": 512},
            "output": {"path": str(tmp_path / out), "shard_rows": 50},
        }
        path = tmp_path / f"{out}.yaml"
        path.write_text(yaml.safe_dump(data))
        config = load_config(str(path))
        result = run_job(config, log=quiet)
        report = verify(str(tmp_path / out), config, sample=500)
        assert report.ok, report.problems
        assert {r["name"] for r in result.sources} == {"code", "web"}
        return tmp_path / out

    runs, alone = pack("runs", None), pack("alone", 0)
    grouped = json.loads((runs / "metrics.json").read_text())["grouped_files"]
    assert grouped["files"] == 65 and 2 <= grouped["units"] <= 8
    assert _digest(runs, "data") == _digest(alone, "data")
    columns = ["doc_id", "copy", "placed"]
    assert _rows(runs, "index", columns) == _rows(alone, "index", columns)
    copies = [c for _, c, _ in _rows(runs, "index", columns)]
    assert -1 in copies and max(copies) >= 1  # some left out, some repeated: the rules were used


@pytest.mark.slow  # 15 s; the runs' locality is the property test's
def test_a_changed_file_retokenizes_only_its_run_from_the_store(tmp_path: Path, tokenizer_path: Path) -> None:
    """A token store keys a run by every file's content: rewriting one small file (same size) misses
    its run alone, and the repack is what a fresh pack gives."""
    rng = random.Random(6)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):
        write_jsonl(corpus / f"{i:03d}.jsonl", [{"text": random_text(rng, 400)} for _ in range(3)])
    store = tmp_path / "store"
    cfg = job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        file_units=False,
        input={"group_bytes": 12_000},
        cache={"path": str(store)},
    )
    assert main(["pack", str(cfg), "--quiet"]) == 0
    shards = json.loads((tmp_path / "out" / "metrics.json").read_text())["shards"]
    assert shards["reused"] == 0 and shards["tokenized"] >= 5

    victim = corpus / "031.jsonl"
    text = victim.read_text()
    victim.write_text(text.replace("a", "b", 1) if "a" in text else text.replace("e", "f", 1))
    assert main(["pack", str(cfg), "--quiet", "--overwrite"]) == 0
    again = json.loads((tmp_path / "out" / "metrics.json").read_text())["shards"]
    assert again == {"reused": shards["tokenized"] - 1, "tokenized": 1}
    # A file a unit: the same bytes whatever the runs.
    fresh = job_config(tmp_path, f"{corpus}/*", tokenizer_path, output={"path": str(tmp_path / "fresh")})
    assert main(["pack", str(fresh), "--quiet"]) == 0
    assert _digest(tmp_path / "out", "data") == _digest(tmp_path / "fresh", "data")


def test_verify_finds_a_file_of_a_run_that_is_gone(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    _files_with_rejects(corpus, 12, seed=8)
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, file_units=False, input={"max_reject_ratio": 0.3}
    )
    assert main(["pack", str(cfg), "--quiet"]) == 0
    (corpus / "f004.jsonl").unlink()
    report = verify(str(tmp_path / "out"), load_config(str(cfg)), sample=100)
    assert not report.ok and any(
        p.startswith("input f004.jsonl (shard ") and "is gone" in p for p in report.problems
    )


def test_a_unit_label_names_its_first_file_and_how_many_more() -> None:
    reading = InputConfig(paths=("unused",)).reading()
    one = WorkUnit(_shard(0, "x.jsonl", 5), reading)
    run = dataclasses.replace(one, more=(_shard(0, "y.jsonl", 5),))
    assert one.label == "x.jsonl" and run.label == "x.jsonl and 1 more file" and run.size == 10


def test_runs_of_small_files_on_s3_pack_what_a_file_a_unit_packs_locally(
    tmp_path: Path, tokenizer_path: Path, s3: Any
) -> None:
    """The same small files (plain and gzipped, with rejects) on the real S3 server, read in runs,
    and on local disk a file a unit: the same data files; the S3 dataset verifies."""
    import pyarrow.fs as pafs

    from tests import s3server

    corpus = tmp_path / "corpus"
    _files_with_rejects(corpus, 40, seed=9)
    remote = s3_job_config(
        tmp_path, s3, corpus, tokenizer_path, "runs", file_units=False, input={"max_reject_ratio": 0.3}
    )
    config = load_config(str(remote))
    run_job(config, log=quiet)
    report = verify(config.output.path, config, sample=500)
    assert report.ok, report.problems
    local = job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        input={"max_reject_ratio": 0.3},
        output={"path": str(tmp_path / "o")},
    )
    run_job(load_config(str(local)), log=quiet)
    fs = s3.filesystem()
    root = f"{s3server.BUCKET}/runs/out"
    manifest = json.loads(fs.open_input_stream(f"{root}/manifest.json").read())
    assert sum(len(entry_files(entry)) for entry in manifest["inputs"]) == 40 and len(manifest["inputs"]) < 10
    for f in sorted((tmp_path / "o" / "data").iterdir()):
        assert fs.open_input_stream(f"{root}/data/{f.name}").read() == f.read_bytes()
    remote_files = [
        i for i in fs.get_file_info(pafs.FileSelector(f"{root}/data")) if i.type == pafs.FileType.File
    ]
    assert len(remote_files) == len(list((tmp_path / "o" / "data").iterdir())) > 0
