"""The token store (cache.path): tokenize once, pack many. Keys by content (a copied corpus hits, a
change misses), several jobs filling one store at once, `raypack cache prune`, on local disk and
on the real S3 server."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from raypack.cli import main
from raypack.config import ConfigError, load_config
from raypack.dataset.store import file_digest
from raypack.engine.local import LocalRunner
from raypack.pipeline.job import run_job
from raypack.pipeline.tokenize.token_files import DONE, Checksum
from raypack.storage import Shard
from raypack.verifier import verify
from tests import s3server
from tests.conftest import (
    independent_tokens,
    job_config,
    make_corpus,
    packed_documents,
    random_text,
    s3_job_config,
    write_jsonl,
)

ROOT = Path(__file__).resolve().parents[2]


def manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def units(out: Path) -> dict[str, int]:
    """metrics.json's count of units found in the store and tokenized."""
    return json.loads((out / "metrics.json").read_text())["shards"]


def data_files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "data").iterdir())}


def token_files(store: Path) -> list[Path]:
    """The store's entries (pathlib's glob takes the .tmp-* files too)."""
    return sorted(p for p in store.glob("*.arrow") if not p.name.startswith(".tmp-"))


def store_files(store: Path) -> list[str]:
    return sorted(p.name for p in store.iterdir())


def test_a_copied_corpus_hits_and_a_repack_pays_no_tokenization(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path / "a", shards=4, docs_per_shard=30, seed=3)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    assert main(["pack", str(cfg), "--quiet"]) == 0
    first = manifest(tmp_path / "out")
    assert units(tmp_path / "out") == {"reused": 0, "tokenized": 4}
    assert {k: v for k, v in first["token_store"].items() if k != "bytes"} == {
        "path": str(store),
        "hits": 0,
        "entries": 4,
    }
    assert first["token_store"]["bytes"] == sum(p.stat().st_size for p in store.iterdir())
    assert len([n for n in store_files(store) if n.endswith(".arrow")]) == 4
    assert not [n for n in store_files(store) if n.startswith(".tmp-")]
    assert "token store" in capsys.readouterr().out

    # The same bytes elsewhere, written now (other paths, other mtimes): every unit is found.
    copy = tmp_path / "b" / "corpus"
    shutil.copytree(corpus, copy)
    for p in copy.iterdir():
        os.utime(p, ns=(7, 7))
    out2 = tmp_path / "out2"
    args = ["--set", f"input.paths=['{copy}/*']", "--set", f"output.path={out2}", "--quiet"]
    assert main(["pack", str(cfg), *args]) == 0
    second = manifest(out2)
    assert units(out2) == {"reused": 4, "tokenized": 0}
    assert second["token_store"]["hits"] == 4 and second["token_store"]["entries"] == 4
    assert "every unit found in the token store" in second["tokenizer"]["backend"]["reason"]
    assert data_files(out2) == data_files(tmp_path / "out")
    assert "4 of 4 units found there" in (out2 / "report.html").read_text()

    # A repack at another seq_len and algorithm: from the store, every token where it belongs.
    out3 = tmp_path / "out3"
    more = ["--set", "pack.seq_len=256", "--set", "pack.algorithm=spfhp", "--set", f"output.path={out3}"]
    assert main(["pack", str(cfg), *more, "--quiet"]) == 0
    assert units(out3) == {"reused": 4, "tokenized": 0}
    assert packed_documents(out3) == independent_tokens(corpus, tokenizer_path)
    report = verify(
        str(out3),
        load_config(str(cfg), [f"output.path={out3}", "pack.seq_len=256", "pack.algorithm=spfhp"]),
        sample=8,
    )
    assert report.ok, report.problems


def test_a_repack_whose_every_unit_is_stored_loads_no_tokenizer_in_its_workers(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch, driver_parses: list[str]
) -> None:
    """A stored unit's task reads its token file only: a repack that finds every unit never asks
    the runner's workers to load the tokenizer (2-3 s for a 128k BPE and fastokens' copy on 2
    cores), whichever backend's keys the store holds; one unit to tokenize and they load it. What
    every unit's summary needs is loaded (warm_worker) as any job that names a store starts."""
    asked: list[str] = []
    preload = LocalRunner.preload

    def spied(self: LocalRunner, fn: Any, args: tuple[Any, ...]) -> Any:
        asked.append(fn.__name__)
        return preload(self, fn, args)

    monkeypatch.setattr(LocalRunner, "preload", spied)
    parsed = driver_parses  # tokenizers' parses of the tokenizer on the driver
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=4)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    expected = independent_tokens(corpus, tokenizer_path)

    def pack(out: str, *settings: str) -> dict:
        asked.clear()
        parsed.clear()
        sets = [x for s in (f"output.path={tmp_path / out}", *settings) for x in ("--set", s)]
        assert main(["pack", str(cfg), "--quiet", *sets]) == 0
        assert packed_documents(tmp_path / out) == expected
        return manifest(tmp_path / out)["tokenizer"]["backend"]

    assert pack("first")["chosen"].startswith("fastokens") and asked == ["warm_worker", "preload_job"]
    # Tokenized, yet not parsed on the driver: the workers' load parsed it (and checked it first).
    assert units(tmp_path / "first") == {"reused": 0, "tokenized": 3} and parsed == []
    backend = pack("repack", "pack.seq_len=256", "pack.algorithm=spfhp")
    assert units(tmp_path / "repack") == {"reused": 3, "tokenized": 0}
    assert asked == ["warm_worker"] and backend["chosen"].startswith("fastokens")
    assert parsed == []  # nor on the driver: its ids came from the JSON (read_tokenizer(lazy=True))

    # A store of tokenizers' keys serves an auto job as tokenizers (the reference: the same ids).
    pack("reference", "tokenizer.backend=tokenizers", f"cache.path={tmp_path / 'store2'}")
    backend = pack("auto", "tokenizer.backend=auto", f"cache.path={tmp_path / 'store2'}")
    assert units(tmp_path / "auto") == {"reused": 3, "tokenized": 0} and asked == ["warm_worker"]
    assert backend["chosen"].startswith("tokenizers") and "every unit found" in backend["reason"]

    # An entry gone: its unit is tokenized, by workers that load the tokenizer for it.
    token_files(store)[0].unlink()
    pack("partial")
    assert units(tmp_path / "partial") == {"reused": 2, "tokenized": 1}
    assert asked == ["warm_worker", "preload_job"] and parsed == []  # the workers' load parsed it


def test_a_store_job_whose_tokenizer_tokenizers_refuses_leaves_the_dataset_it_would_replace(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A job that names a token store parses its tokenizer only when a unit must be tokenized: a
    file tokenizers refuses (valid JSON, a component it does not know) still fails with its one
    line before the output is cleared, so `--overwrite` leaves the dataset there in place."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=6)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(tmp_path / "store")})
    assert main(["pack", str(cfg), "--quiet"]) == 0
    before = data_files(tmp_path / "out")
    spec = json.loads(tokenizer_path.read_text())
    spec["pre_tokenizer"] = {"type": "NoSuchPreTokenizer"}
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(spec))
    code = main(["pack", str(cfg), "--overwrite", "--quiet", "--set", f"tokenizer.path={broken}"])
    assert code == 2
    assert (tmp_path / "out" / "manifest.json").exists() and data_files(tmp_path / "out") == before


def test_a_repack_reports_the_cuts_its_stored_tokens_went_through(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A long document's tokens were made by cutting it where the tokenizer cannot merge across: a
    repack whose units all come from the store says so (the token files keep how their long texts
    were encoded), as the first pack did, instead of "no cut" (it said 0 cuts and no rule)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    long_text = random_text(random.Random(3), 600_000)  # ~3.5 MB: pieces of 1 MiB characters
    assert len(long_text) > 3 << 20
    write_jsonl(corpus / "a.jsonl", [{"text": long_text}, *({"text": f"short {i}"} for i in range(10))])
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(tmp_path / "store")})
    expected = independent_tokens(corpus, tokenizer_path)
    long_texts = {}
    for out, settings in (("first", []), ("repack", ["--set", "pack.seq_len=256"])):
        sets = ["--set", f"output.path={tmp_path / out}", *settings]
        assert main(["pack", str(cfg), "--quiet", *sets]) == 0
        assert packed_documents(tmp_path / out) == expected
        long_texts[out] = manifest(tmp_path / out)["tokenizer"]["backend"]["long_texts"]
    assert units(tmp_path / "repack") == {"reused": 1, "tokenized": 0}
    assert long_texts["first"]["cuts"] >= 3 and long_texts["first"]["rule"]
    assert long_texts["first"]["texts"] == 1
    assert long_texts["first"]["units_unrecorded"] == 0
    assert long_texts["repack"] == long_texts["first"]

    # An entry written before the record was kept (its completion key without it): its unit's cuts
    # are not known, and the manifest says so rather than "no cut".
    (entry,) = token_files(tmp_path / "store")
    with pa.ipc.open_file(pa.BufferReader(entry.read_bytes())) as reader:  # a copy: rewritten below
        batches = [reader.get_batch_with_custom_metadata(i) for i in range(reader.num_record_batches)]
    done = json.loads(batches[-1].custom_metadata[DONE])
    recent = ("long_texts", "cuts", "cuts_refused", "long_whole", "cut_rule")
    recent += ("crc32", "rejects_crc32", "name", "key_crc32")
    older = {k: v for k, v in done.items() if k not in recent}  # and unchecked: no checksum either
    with pa.OSFile(str(entry), "wb") as sink, pa.ipc.new_file(sink, batches[0].batch.schema) as writer:
        for batch, meta in batches[:-1]:
            writer.write_batch(batch, custom_metadata=meta)
        writer.write_batch(batches[-1].batch, custom_metadata={DONE: json.dumps(older).encode()})
    assert main(["pack", str(cfg), "--quiet", "--set", f"output.path={tmp_path / 'old'}"]) == 0
    assert packed_documents(tmp_path / "old") == expected
    assert units(tmp_path / "old") == {"reused": 1, "tokenized": 0}
    said = manifest(tmp_path / "old")["tokenizer"]["backend"]["long_texts"]
    assert said == {
        "rule": "",
        "texts": None,
        "cuts": 0,
        "cuts_refused": 0,
        "long_pieces": 0,
        "units_unrecorded": 1,
    }


def test_any_change_of_content_or_settings_misses(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=8)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    assert main(["pack", str(cfg), "--quiet"]) == 0

    # One shard rewritten with other bytes of the same size and the same mtime: its content misses.
    path = next(p for p in sorted(corpus.iterdir()) if p.suffix == ".jsonl")
    stat = path.stat()
    data = bytearray(path.read_bytes())
    at = data.index(b'"text": "') + len(b'"text": "')
    data[at] = ord("Q") if data[at] != ord("Q") else ord("R")
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    assert main(["pack", str(cfg), "--overwrite", "--quiet"]) == 0
    assert units(tmp_path / "out") == {"reused": 2, "tokenized": 1}
    assert packed_documents(tmp_path / "out") == independent_tokens(corpus, tokenizer_path)

    # A tokenization setting: every unit misses; a packing setting: none does.
    assert main(["pack", str(cfg), "--overwrite", "--quiet", "--set", "tokenizer.add_eos=false"]) == 0
    assert units(tmp_path / "out") == {"reused": 0, "tokenized": 3}
    assert main(["pack", str(cfg), "--overwrite", "--quiet", "--set", "pack.seed=5"]) == 0
    assert units(tmp_path / "out") == {"reused": 3, "tokenized": 0}
    assert len([n for n in store_files(store) if n.endswith(".arrow")]) == 3 + 1 + 3


def test_a_job_that_fails_while_it_writes_leaves_no_half_entry_in_the_store(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker is killed as it writes a token file (its temporary open), each unit's task
    retried until the job fails: the store is left as it was. Its writers' temporaries carry the
    job's run id, a retry reuses its own, and the job removes them once its workers are gone; a
    trial's Ctrl-C left two (9.3 MB) that only a prune a day later removed. Another job's
    temporaries stay: it may be writing them."""
    from raypack.errors import JobError
    from raypack.pipeline.tokenize import stage as tokenize_stage
    from tests.fakes import DiesWriting

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=20, seed=4)
    store = tmp_path / "store"
    store.mkdir()
    others = store / (".tmp-" + "e" * 32 + "-" + "f" * 32 + ".arrow")  # another job's, being written
    others.write_bytes(b"partial")
    cfg = job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        cache={"path": str(store)},
        tokenizer={"backend": "tokenizers"},
    )
    monkeypatch.setattr(tokenize_stage, "TokenizeShards", DiesWriting)
    with pytest.raises(JobError):
        run_job(load_config(cfg), log=lambda _: None)
    assert store_files(store) == [others.name]


def test_two_jobs_fill_one_store_at_once(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=6, docs_per_shard=40, seed=11)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    jobs = [
        subprocess.Popen(
            [sys.executable, "-m", "raypack.cli", "pack", str(cfg), "--quiet", "--set", f"output.path={out}"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for out in (tmp_path / "one", tmp_path / "two")
    ]
    for job in jobs:
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, output.decode()
    assert data_files(tmp_path / "one") == data_files(tmp_path / "two")
    names = store_files(store)
    assert len([n for n in names if n.endswith(".arrow")]) == 6 and not [
        n for n in names if n.startswith(".tmp-")
    ]
    assert main(["pack", str(cfg), "--quiet", "--set", f"output.path={tmp_path / 'three'}"]) == 0
    assert units(tmp_path / "three") == {"reused": 6, "tokenized": 0}
    assert data_files(tmp_path / "three") == data_files(tmp_path / "one")


def test_prune_by_age_and_by_size(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=20, seed=2)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    assert main(["pack", str(cfg), "--quiet"]) == 0
    entries = token_files(store)
    now = time.time()
    for days, entry in enumerate(entries):  # entry k written k days ago
        os.utime(entry, (now - days * 86400 - 60, now - days * 86400 - 60))
    key = "f" * 32
    stale = store / f".tmp-{'0' * 32}-{key}.arrow"  # a killed writer's, 3 days old
    fresh = store / f".tmp-{'1' * 32}-{key}.arrow"  # a live writer's
    orphan = store / f"{'e' * 32}.rejects.parquet"  # a killed writer's rejects, without its token file
    foreign = [store / "notes.txt", store / f"{key}.arrow.bak", store / ".tmp-x.arrow"]  # not the store's
    for path in (stale, fresh, orphan, *foreign):
        path.write_bytes(b"x")
        if path != fresh:
            os.utime(path, (now - 3 * 86400, now - 3 * 86400))

    (store / "mine").mkdir()  # a folder of the user's: counted too (a store of only folders said nothing)
    assert main(["cache", "info", str(store)]) == 0
    said = capsys.readouterr().out
    assert f"{store}: 4 units" in said and "besides, 4 files or folders that are none of a store's" in said, (
        said
    )
    assert main(["cache", "prune", str(store), "--older-than", "1.5d"]) == 0
    said = capsys.readouterr().out
    assert "removed 2 units" in said and "2 files a killed job left" in said, said
    assert token_files(store) == entries[:2] and fresh.exists() and not stale.exists() and not orphan.exists()
    assert all(p.exists() for p in foreign)  # a store named by mistake loses nothing else

    # By size: the oldest go first until the rest fits.
    keep = entries[0].stat().st_size + sum(
        p.stat().st_size for p in store.glob(f"{entries[0].stem}.*rejects*")
    )
    assert main(["cache", "prune", "--config", str(cfg), "--max-size", f"{keep + len(b'x')}B"]) == 0
    assert token_files(store) == entries[:1] and all(p.exists() for p in foreign)
    # What is left is still a store: the next pack finds that unit and tokenizes the others.
    assert main(["pack", str(cfg), "--overwrite", "--quiet"]) == 0
    assert units(tmp_path / "out") == {"reused": 1, "tokenized": 3}
    # --max-size 0 (no unit: nothing is nothing in any) empties it of entries, and of nothing else.
    capsys.readouterr()
    assert main(["cache", "prune", str(store), "--max-size", "0"]) == 0
    said = capsys.readouterr().out  # the live writer's temporary stays, and is said to
    assert "it holds 0 units, 1 B, 1 B of it writers' temporaries (a running job's, or a killed" in said, said
    assert token_files(store) == [] and fresh.exists() and all(p.exists() for p in foreign)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cache", "prune", "STORE"], "say what to prune"),
        (["cache", "prune", "STORE", "--older-than", "soon"], "--older-than takes a number and one"),
        (["cache", "prune", "STORE", "--older-than", "6m"], "--older-than takes a number and one"),
        (["cache", "prune", "STORE", "--older-than", "30"], "--older-than takes a number and one"),
        (["cache", "prune", "STORE", "--max-size", "12 apples"], "--max-size takes a number and one"),
        (["cache", "prune", "STORE", "--max-size", "10"], "--max-size takes a number and one"),
        (["cache", "info"], "name the store"),
        (["cache", "info", "STORE", "--max-size", "1GB"], "are for prune"),
        (["cache", "info", "MISSING"], "no token store at"),
        (["cache", "prune", "FILE", "--older-than", "1d"], "is a file, not a directory"),
    ],
)
def test_cache_command_mistakes_are_one_line_errors(
    tmp_path: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("x")
    places = {"STORE": tmp_path, "MISSING": tmp_path / "nothing", "FILE": tmp_path / "file"}
    args = [str(places.get(a, a)) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_a_store_inside_the_output_or_an_input_is_refused(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=2)
    base = {"input": {"paths": [f"{corpus}/*"]}, "tokenizer": {"path": str(tokenizer_path)}}
    link = tmp_path / "link"
    link.symlink_to(corpus)
    for store, said in [
        (str(tmp_path / "out" / "tokens"), "which a pack with --overwrite clears"),
        (str(corpus / "tokens"), "looks for files"),
        (str(corpus), "lies inside cache.path"),
        (str(tmp_path), "lies inside cache.path"),
        (str(link), "lies inside cache.path"),  # a link to the corpus's directory is that directory
        ("  ", "cache.path is empty"),
    ]:
        data = base | {"output": {"path": str(tmp_path / "out")}, "cache": {"path": store}}
        with pytest.raises(ConfigError, match=said):
            load_config(data)


def test_content_digests_sha256_locally_and_etag_on_s3(tmp_path: Path, s3) -> None:
    path = tmp_path / "a.jsonl"
    write_jsonl(path, [{"text": "hello"}])
    local = file_digest(Shard(0, str(path), "a.jsonl", path.stat().st_size, 0), None)
    assert local == "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
    fs = s3.filesystem()
    cfg = load_config(
        {
            "input": {"paths": ["unused"]},
            "tokenizer": {"path": "unused"},
            "output": {"path": str(tmp_path / "o")},
            "storage": {"endpoint": s3.endpoint},
        }
    )

    def digest_of(name: str, data: bytes) -> str:
        with fs.open_output_stream(f"{s3server.BUCKET}/digest/{name}") as f:
            f.write(data)
        return file_digest(Shard(0, f"s3://{s3server.BUCKET}/digest/{name}", name, len(data), 0), cfg.storage)

    data = path.read_bytes()
    remote = digest_of("a.jsonl", data)
    # The server's ETag (not a hash of the bytes read here: an upload in parts has MD5s of parts).
    assert remote.startswith("etag:") and remote.endswith(f":{len(data)}") and len(remote) > 30
    assert digest_of("copy.jsonl", data) == remote
    assert digest_of("other.jsonl", data.replace(b"hello", b"hullo")) != remote


def test_a_store_on_s3_serves_a_corpus_copied_to_another_prefix(
    tmp_path: Path, tokenizer_path: Path, s3
) -> None:
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=6)
    store = f"s3://{s3server.BUCKET}/store-test/tokens"
    cfg_path = s3_job_config(tmp_path, s3, corpus, tokenizer_path, "store-a", cache={"path": store})
    assert main(["pack", str(cfg_path), "--quiet"]) == 0
    fs = s3.filesystem()
    pafs.copy_files(
        f"{s3server.BUCKET}/store-a/corpus",
        f"{s3server.BUCKET}/store-b/corpus",
        source_filesystem=fs,
        destination_filesystem=fs,
    )
    out_b = f"s3://{s3server.BUCKET}/store-b/out"
    sets = [
        "--set",
        f"input.paths=['s3://{s3server.BUCKET}/store-b/corpus/*']",
        "--set",
        f"output.path={out_b}",
    ]
    assert main(["pack", str(cfg_path), "--quiet", *sets]) == 0
    with fs.open_input_stream(f"{s3server.BUCKET}/store-b/out/manifest.json") as f:
        second = json.loads(f.read())
    assert second["token_store"]["path"] == store
    assert (second["token_store"]["hits"], second["token_store"]["entries"]) == (3, 3)
    cfg = load_config(
        str(cfg_path), [f"output.path={out_b}", f"input.paths=['s3://{s3server.BUCKET}/store-b/corpus/*']"]
    )
    report = verify(out_b, cfg, sample=8)
    assert report.ok, report.problems
    assert report.documents == 60


def test_a_rebuild_with_a_named_store_leaves_its_entries_to_prune(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=1)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    assert main(["pack", str(cfg), "--quiet", "--set", "pack.seq_len=256"]) == 0
    write_jsonl(corpus / "part-000.jsonl", [{"text": random_text(random.Random(1), 50)}])
    assert main(["rebuild", str(cfg), "--quiet", "--set", f"output.path={tmp_path / 'root'}"]) == 0
    # The rebuild found the unchanged shard in the store and kept the pack's entry it no longer uses.
    latest = tmp_path / "root" / (tmp_path / "root" / "LATEST").read_text().strip()
    assert units(latest) == {"reused": 1, "tokenized": 1}
    assert len(token_files(store)) == 3
    assert not (tmp_path / "root" / "_cache").exists()


@pytest.mark.slow  # 8 s
def test_an_entry_whose_rejects_file_is_gone_is_tokenized_again(tmp_path: Path, tokenizer_path: Path) -> None:
    """A store copied in part (a token file without the rejects file its key says it has) is a
    miss for that unit, not a failed job."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=3)
    write_jsonl(corpus / "part-009.jsonl", [{"text": "fine"}, {"text": ""}, b"{not json"])
    store = tmp_path / "store"
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)}, input={"max_reject_ratio": 0.5}
    )
    assert main(["pack", str(cfg), "--quiet"]) == 0
    first = manifest(tmp_path / "out")["counts"]
    (rejects,) = store.glob("*.rejects.parquet")
    rejects.unlink()
    assert main(["pack", str(cfg), "--quiet", "--overwrite"]) == 0
    assert units(tmp_path / "out") == {"reused": 2, "tokenized": 1}
    assert manifest(tmp_path / "out")["counts"] == first and rejects.exists()


def test_a_checksum_is_the_documents_whatever_their_record_batches(tmp_path: Path) -> None:
    """A token file's checksum (token_files.Checksum) is its documents': written in any record
    batches, from sliced arrays, with nulls and empty token lists, it matches as read back; one token
    changed, it does not."""
    rng = random.Random(5)
    lengths = [rng.choice([0, 1, 3, 40]) for _ in range(200)]
    table = pa.table(
        {
            "row": pa.array(range(200), pa.int64()),
            "file": pa.array([0] * 200, pa.int32()),
            "doc_id": pa.array([None if i % 7 == 0 else f"doc-{i}" for i in range(200)]),
            "length": pa.array(lengths, pa.int64()),
            "tokens": pa.array(
                [[rng.randrange(50_000) for _ in range(n)] for n in lengths], pa.list_(pa.int32())
            ),
        }
    ).slice(3, 190)
    written = Checksum()
    written.add(table)
    for chunk in (7, 64, 1000):
        path = tmp_path / f"tokens-{chunk}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=chunk)
        assert written.matches(str(path)), chunk
    changed = table.to_pylist()
    at = next(i for i, doc in enumerate(changed) if len(doc["tokens"]) > 1)
    changed[at]["tokens"][1] += 1
    again = Checksum()
    again.add(pa.Table.from_pylist(changed, schema=table.schema))
    assert again.crcs[:4] == written.crcs[:4] and again.crcs[4] != written.crcs[4]
    assert set(written.crcs[2]) == {"nulls", "lengths", "values"}  # doc ids: some are null


def test_an_entry_damaged_in_place_is_tokenized_again(tmp_path: Path, tokenizer_path: Path) -> None:
    """A local store's entry whose tokens changed on disk after it was finished (4 KiB zeroed: the
    trial packed 1,024 wrong ids from one, and `verify` passed) fails its checksum: its unit is
    tokenized again, the entry rewritten, and the packs are the corpus's tokens."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=40, seed=9)
    store = tmp_path / "store"
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)})
    expected = independent_tokens(corpus, tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    entry = token_files(store)[1]
    data = bytearray(entry.read_bytes())
    with pa.ipc.open_file(pa.BufferReader(bytes(data))) as reader:
        tokens = reader.get_batch(0).column(4).values.to_numpy()
    assert len(tokens) > 1024
    at = data.find(tokens[:16].tobytes())  # the first record batch's token values, in the file
    assert at > 0
    data[at : at + 4096] = bytes(4096)
    entry.write_bytes(bytes(data))
    assert main(["pack", str(cfg), "--quiet", "--overwrite", "--set", "pack.seq_len=256"]) == 0
    assert units(tmp_path / "out") == {"reused": 2, "tokenized": 1}
    assert packed_documents(tmp_path / "out") == expected
    assert entry.read_bytes() != bytes(data)  # rewritten whole
    assert main(["pack", str(cfg), "--quiet", "--overwrite"]) == 0
    assert units(tmp_path / "out") == {"reused": 3, "tokenized": 0}

    # A completion key damaged (no JSON, or JSON without its counts): not finished, tokenized again.
    for key in (b"{not json", b'{"crc32": []}'):
        other = token_files(store)[0]
        with pa.ipc.open_file(pa.BufferReader(other.read_bytes())) as reader:
            batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
        with pa.OSFile(str(other), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as writer:
            for batch in batches[:-1]:
                writer.write_batch(batch)
            writer.write_batch(batches[-1], custom_metadata={DONE: key})
        assert main(["pack", str(cfg), "--quiet", "--overwrite"]) == 0
        assert units(tmp_path / "out") == {"reused": 2, "tokenized": 1}, key
        assert packed_documents(tmp_path / "out") == expected


def test_an_entry_swapped_edited_or_damaged_in_its_metadata_is_a_miss(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Damage to a store's entries, each on a fresh copy of it: two entries' files swapped (else
    one shard's documents packed twice, another's not at all, exit 0), zeros over an entry's Arrow
    metadata (else every job fails with "Invalid flatbuffers message"), a byte of a rejects file
    flipped (else a traceback), the rejects count edited to 0 (else the rejects go). Each is a
    miss: its units tokenized again, the packs and rejects a fresh pack's."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=30, seed=11)
    write_jsonl(corpus / "part-009.jsonl", [{"text": "fine"}, {"text": ""}, b"{not json"])
    pristine, store = tmp_path / "pristine", tmp_path / "store"
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, cache={"path": str(store)}, input={"max_reject_ratio": 0.5}
    )
    expected = independent_tokens(corpus, tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    counts = manifest(tmp_path / "out")["counts"]
    shutil.copytree(store, pristine)
    (with_rejects,) = (p for p in token_files(pristine) if (p.parent / f"{p.stem}.rejects.parquet").exists())
    plain = [p for p in token_files(pristine) if p != with_rejects]

    def swap(s: Path) -> None:
        a, b = s / plain[0].name, s / plain[1].name
        a.rename(s / "t")
        b.rename(a)
        (s / "t").rename(b)

    def zero_metadata(s: Path) -> None:
        entry = s / plain[0].name
        data = bytearray(entry.read_bytes())
        data[448:512] = bytes(64)
        entry.write_bytes(bytes(data))

    def flip_rejects(s: Path) -> None:
        rejects = s / f"{with_rejects.stem}.rejects.parquet"
        data = bytearray(rejects.read_bytes())
        data[len(data) // 2] ^= 0xFF
        rejects.write_bytes(bytes(data))

    def no_rejects(s: Path) -> None:
        entry = s / with_rejects.name
        with pa.ipc.open_file(pa.BufferReader(entry.read_bytes())) as reader:
            batches = [reader.get_batch_with_custom_metadata(i) for i in range(reader.num_record_batches)]
        done = json.loads(batches[-1].custom_metadata[DONE]) | {"rejects": 0, "records": 0}
        with pa.OSFile(str(entry), "wb") as sink, pa.ipc.new_file(sink, batches[0].batch.schema) as writer:
            for batch, meta in batches[:-1]:
                writer.write_batch(batch, custom_metadata=meta)
            writer.write_batch(batches[-1].batch, custom_metadata={DONE: json.dumps(done).encode()})

    for damage, missed in ((swap, 2), (zero_metadata, 1), (flip_rejects, 1), (no_rejects, 1)):
        shutil.rmtree(store)
        shutil.copytree(pristine, store)
        damage(store)
        assert main(["pack", str(cfg), "--quiet", "--overwrite", "--set", "pack.seq_len=256"]) == 0, damage
        assert units(tmp_path / "out") == {"reused": 4 - missed, "tokenized": missed}, damage
        assert packed_documents(tmp_path / "out") == expected, damage
        assert manifest(tmp_path / "out")["counts"]["rejects"] == counts["rejects"], damage


@pytest.mark.parametrize("overflow", ["truncate", "drop"])
def test_what_overflow_leaves_out_is_in_rejects_for_every_job_of_a_store(
    tmp_path: Path, tokenizer_path: Path, overflow: str
) -> None:
    """Each document pack.overflow cuts (truncate) or leaves out (drop) has a reject saying so,
    standing for no record (the document stays in the index, its placed tokens what the packs hold).
    They depend on seq_len, so a token store's entries hold none: a repack from the store at
    another seq_len writes its own, and verify counts them against the manifest."""
    import pyarrow.parquet as pq

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=3)
    cfg = job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        cache={"path": str(tmp_path / "store")},
        pack={"overflow": overflow},
    )
    said = {
        "truncate": "overflow truncate: its tokens past seq_len ({}) are in no pack",
        "drop": "overflow drop: longer than seq_len ({}), the whole document is in no pack",
    }[overflow]
    for out, seq_len in (("first", 512), ("repack", 128)):
        sets = ["--set", f"output.path={tmp_path / out}", "--set", f"pack.seq_len={seq_len}"]
        assert main(["pack", str(cfg), "--quiet", *sets]) == 0
        index = pq.read_table(tmp_path / out / "index").to_pylist()
        over = {d["doc_id"] for d in index if d["length"] > seq_len}
        assert over and all(
            d["placed"] == (seq_len if overflow == "truncate" else 0) for d in index if d["doc_id"] in over
        )
        rejects = pq.read_table(tmp_path / out / "rejects").to_pylist()
        assert {f"{r['source']}:{r['row']}" for r in rejects} == over
        assert {(r["reason"], r["records"]) for r in rejects} == {(said.format(seq_len), 0)}
        counts = manifest(tmp_path / out)["counts"]
        assert counts["rejects"] == len(over) and counts["rejected_records"] == 0
        report = verify(str(tmp_path / out))
        assert report.ok, report.problems
        assert report.documents == len(index) and report.unpacked == (len(over) if overflow == "drop" else 0)
    assert units(tmp_path / "repack") == {"reused": 2, "tokenized": 0}

    # A reject moved to a document that is not longer than seq_len: the counts still add up, the
    # names do not.
    out = tmp_path / "repack"
    index = pq.read_table(out / "index").to_pylist()
    path = sorted((out / "rejects").glob("*.overflow.parquet"))[0]
    shard = int(path.name.split("-")[1].split(".")[0])
    short = next(d for d in index if d["length"] <= 128 and d["shard"] == shard)
    table = pq.read_table(path)
    rows = table.column("row").to_pylist()
    rows[0] = short["row"]
    pq.write_table(
        table.set_column(table.schema.get_field_index("row"), "row", pa.array(rows, pa.int64())), path
    )
    problems = verify(str(out)).problems
    assert problems == [
        f"pack.overflow {overflow}: 1 documents longer than seq_len (128) have no reject, "
        "1 overflow rejects name a document that is not longer"
    ], problems
