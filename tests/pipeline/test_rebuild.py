"""`raypack rebuild`: versions, LATEST, the token cache, and crashes at the worst moments."""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

import raypack.pipeline.rebuild as rebuild_module
from raypack.cli import main
from raypack.config import JobConfig, load_config
from raypack.dataset.layout import latest_version, list_versions
from raypack.pipeline.job import run_job
from raypack.pipeline.rebuild import run_rebuild
from raypack.pipeline.tokenize.summary import Totals
from raypack.verifier import verify
from tests.conftest import make_corpus, random_text, write_jsonl

quiet = {"log": lambda _: None}


def config(tmp: Path, tokenizer: Path, corpus: Path, **output: object) -> JobConfig:
    data = {
        "input": {"paths": [f"{corpus}/*"], "group_bytes": 0},  # a file a unit (conftest.job_config)
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": 512},
        "output": {"path": str(tmp / "root"), "shard_rows": 40, **output},
    }
    path = tmp / "rebuild.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))


def files_under(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def scratch(tmp: Path, cfg: JobConfig, name: str) -> Path:
    """The same config packed from scratch by `raypack pack` into its own directory."""
    out = tmp / name
    run_job(dataclasses.replace(cfg, output=dataclasses.replace(cfg.output, path=str(out))), **quiet)
    return out


def test_incremental_rebuild_equals_a_fresh_run(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=5)
    cfg = config(tmp_path, tokenizer_path, corpus)
    root = tmp_path / "root"

    first = run_rebuild(cfg, **quiet)
    assert (first.version, first.job.shards_tokenized, first.job.shards_reused) == ("v=000001", 4, 0)
    assert (root / "LATEST").read_text() == "v=000001\n"
    report = verify(str(root), cfg, sample=10)
    assert report.ok and report.dataset.endswith("v=000001") and report.documents == 120

    # The corpus changes: one shard rewritten, one removed, one added.
    rng = random.Random(9)
    write_jsonl(corpus / "part-001.jsonl.gz", [{"text": random_text(rng, 300)} for _ in range(25)], "gzip")
    os.utime(corpus / "part-001.jsonl.gz", ns=(1, 1))  # a different mtime whatever the clock's resolution
    (corpus / "part-002.jsonl.zst").unlink()
    write_jsonl(corpus / "part-009.jsonl", [{"text": random_text(rng, 40)} for _ in range(12)])

    second = run_rebuild(cfg, **quiet)
    assert second.version == "v=000002" and (root / "LATEST").read_text() == "v=000002\n"
    assert (second.job.shards_reused, second.job.shards_tokenized) == (2, 2)  # part-000, part-003 reused
    assert second.job.documents == 30 + 25 + 30 + 12
    # Exactly the current corpus's token files stay in the cache (and no temporary ones).
    cached = sorted(p.name for p in (root / "_cache" / "tokens").iterdir())
    assert cached == sorted(f"{k}.arrow" for k in second.job.token_keys)
    assert second.cache_entries_removed == 2

    fresh = scratch(tmp_path, cfg, "fresh")
    rebuilt = root / "v=000002"
    for part in ("data", "index"):
        assert files_under(rebuilt / part) == files_under(fresh / part), part
    assert (
        json.loads((rebuilt / "manifest.json").read_text())["files"]
        == json.loads((fresh / "manifest.json").read_text())["files"]
    )
    assert verify(str(root), cfg, sample=10).ok
    # The previous version is still there and still whole.
    assert verify(str(root / "v=000001"), sample=0).ok


def test_versions_are_pruned_and_a_tokenizer_change_retokenizes(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=7)
    cfg = config(tmp_path, tokenizer_path, corpus, keep_versions=2)
    root = tmp_path / "root"
    first = run_rebuild(cfg, **quiet)
    assert main(["rebuild", str(tmp_path / "rebuild.yaml")]) == 0
    out = capsys.readouterr().out
    assert "v=000002 is now LATEST" in out and "2 reused from the cache, 0 tokenized" in out
    assert files_under(root / "v=000001" / "data") == files_under(root / "v=000002" / "data")

    # Framing documents with BOS changes every token file: nothing may come from the cache.
    assert main(["rebuild", str(tmp_path / "rebuild.yaml"), "--set", "tokenizer.add_bos=true"]) == 0
    out = capsys.readouterr().out
    assert "0 reused from the cache, 2 tokenized" in out and "old versions removed: v=000001" in out
    assert list_versions(str(root)) == [2, 3] and latest_version(str(root)) == 3
    manifest = json.loads((root / "v=000003" / "manifest.json").read_text())
    assert manifest["counts"]["tokens"] == first.job.metrics.tokens + 20  # one BOS per document
    assert len(list((root / "_cache" / "tokens").iterdir())) == 2


def test_crashes_leave_the_previous_version_readable(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=15, seed=8)
    cfg = config(tmp_path, tokenizer_path, corpus)
    root = tmp_path / "root"
    run_rebuild(cfg, **quiet)
    (corpus / "part-000.jsonl").write_text(json.dumps({"text": "changed " * 50}) + "\n")

    def crash(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt  # the driver dies: here, right after the tokenize stage

    with monkeypatch.context() as m:
        m.setattr(Totals, "check_complete", crash)
        with pytest.raises(KeyboardInterrupt):
            run_rebuild(cfg, **quiet)
    assert (root / "v=000002").is_dir() and not (root / "v=000002" / "manifest.json").exists()
    assert latest_version(str(root)) == 1
    report = verify(str(root), sample=0)
    assert report.ok and report.dataset.endswith("v=000001")

    # Now the driver dies after the new version is complete, before LATEST moves.
    with monkeypatch.context() as m:
        m.setattr(rebuild_module, "set_latest", crash)
        with pytest.raises(KeyboardInterrupt):
            run_rebuild(cfg, **quiet)
    assert (root / "v=000003" / "manifest.json").exists() and latest_version(str(root)) == 1
    assert verify(str(root), sample=0).dataset.endswith("v=000001")
    assert not (root / "v=000002").exists()  # swept by the second run, its number not reused

    # The next run tokenizes nothing: the crashed runs' token files were complete.
    after = run_rebuild(cfg, **quiet)
    assert after.version == "v=000004"
    assert (after.job.shards_reused, after.job.shards_tokenized) == (3, 0)
    assert list_versions(str(root)) == [1, 3, 4] and latest_version(str(root)) == 4
    assert verify(str(root), cfg, sample=10).ok
    assert files_under(root / "v=000003" / "data") == files_under(root / "v=000004" / "data")


def test_pack_and_rebuild_refuse_each_others_outputs(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=5, seed=12)
    config(tmp_path, tokenizer_path, corpus)
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "LATEST").write_text("v=000001\n")
    assert main(["pack", str(tmp_path / "rebuild.yaml")]) == 2
    assert "holds versioned datasets" in capsys.readouterr().err
    (tmp_path / "root" / "LATEST").unlink()
    (tmp_path / "root" / "manifest.json").write_text("{}")
    assert main(["rebuild", str(tmp_path / "rebuild.yaml")]) == 2
    assert "a rebuild needs its own output root" in capsys.readouterr().err
    (tmp_path / "root" / "manifest.json").unlink()
    (tmp_path / "root" / "LATEST").write_text("garbage")
    assert main(["rebuild", str(tmp_path / "rebuild.yaml")]) == 2
    assert "not a version name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("setting", "documents"),
    [
        pytest.param("input.empty=keep", 6 + 2, marks=pytest.mark.slow),
        ("input.max_document_bytes=100", 6 - 1),
    ],
)
def test_settings_that_decide_document_or_reject_retokenize(
    tmp_path: Path, tokenizer_path: Path, setting: str, documents: int
) -> None:
    """input.empty and input.max_document_bytes decide what a token file holds: a rebuild after a
    change must tokenize again and equal a fresh `raypack pack` with the new setting."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(4)
    texts = [random_text(rng, 5) for _ in range(5)] + [random_text(rng, 40), "", "   "]
    write_jsonl(corpus / "a.jsonl", [{"text": t} for t in texts])
    path = tmp_path / "rebuild.yaml"
    config(tmp_path, tokenizer_path, corpus)
    first = run_rebuild(load_config(str(path), ["input.max_reject_ratio=0.5"]), **quiet)
    assert (first.job.documents, first.job.rejects) == (6, 2)
    cfg = load_config(str(path), ["input.max_reject_ratio=0.5", setting])
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_reused, second.job.shards_tokenized) == (0, 1)
    assert second.job.documents == documents and second.job.documents + second.job.rejects == 8
    fresh = scratch(tmp_path, cfg, "fresh")
    for part in ("data", "index", "rejects"):
        assert files_under(tmp_path / "root" / "v=000002" / part) == files_under(fresh / part), part


def test_an_unfinished_token_file_is_tokenized_again(tmp_path: Path, tokenizer_path: Path) -> None:
    """Token files are written in place (S3 cannot move one over 5 GB): one that an error cut short
    (closed with a valid footer but without the completion key) or a killed writer truncated is never
    taken for a finished one."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=21)
    cfg = config(tmp_path, tokenizer_path, corpus)
    first = run_rebuild(cfg, **quiet)
    cache = tmp_path / "root" / "_cache" / "tokens"
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]
    cut, truncated = (cache / f"{k}.arrow" for k in first.job.token_keys[:2])
    reader = pa.ipc.open_file(pa.OSFile(str(cut)))
    last = reader.get_batch_with_custom_metadata(reader.num_record_batches - 1)
    assert last.batch.num_rows == 0 and b"raypack.rejects" in (last.custom_metadata or {})
    head = reader.read_all().slice(0, 5)
    with pa.ipc.new_file(str(cut), reader.schema) as writer:  # what an error mid-way leaves: no such key
        writer.write_table(head)
    truncated.write_bytes(truncated.read_bytes()[:-100])  # what a killed local writer leaves
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_reused, second.job.shards_tokenized) == (1, 2)
    assert files_under(tmp_path / "root" / "v=000002" / "data") == files_under(
        tmp_path / "root" / "v=000001" / "data"
    )
    assert verify(str(tmp_path / "root"), cfg, sample=10).ok


@pytest.mark.slow  # 8 s
def test_a_tokenizer_library_upgrade_retokenizes_and_leftovers_are_swept(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache key names the library that encoded (`pip install -U tokenizers` may change ids: a
    rebuild must not mix old tokens with new); `.tmp-*` files a killed run left beside LATEST or in a
    version are swept by the next rebuild, which holds the lease."""
    import raypack.pipeline.tokenize.token_files as tokenize_module
    from raypack.pipeline.tokenize.token_files import token_settings, tokenizer_library
    from raypack.text.files import read_tokenizer

    assert tokenizer_library().startswith("tokenizers ")
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=10, seed=23)
    cfg = config(tmp_path, tokenizer_path, corpus)
    first = run_rebuild(cfg, **quiet)
    root = tmp_path / "root"
    stale = [root / ".tmp-0123abcd-LATEST", root / "v=000001" / ".tmp-4567cdef-manifest.json"]
    for path in stale:
        path.write_text("left by a killed run")
    monkeypatch.setattr(tokenize_module, "tokenizer_library", lambda: "tokenizers 99.0.0")
    assert (
        token_settings(cfg, read_tokenizer(cfg.tokenizer), cfg.input.reading())["library"]
        == "tokenizers 99.0.0"
    )
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_reused, second.job.shards_tokenized) == (0, 3)
    assert set(second.job.token_keys).isdisjoint(first.job.token_keys)
    assert not any(p.exists() for p in stale)
    assert files_under(root / "v=000001" / "data") == files_under(root / "v=000002" / "data")


def test_verify_warns_when_inputs_changed_since_the_dataset(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=24)
    cfg = config(tmp_path, tokenizer_path, corpus)
    run_rebuild(cfg, **quiet)
    assert verify(str(tmp_path / "root"), cfg, sample=5).warnings == []
    touched = corpus / "part-000.jsonl"
    os.utime(touched, ns=(touched.stat().st_atime_ns, touched.stat().st_mtime_ns + 10**9))
    write_jsonl(corpus / "part-009.jsonl", [{"text": "a file added later"}])
    report = verify(str(tmp_path / "root"), cfg, sample=5)
    assert report.ok, report.problems  # the same bytes: the sample still matches
    assert any(
        "1 inputs changed since the dataset was made" in w and "part-000.jsonl" in w for w in report.warnings
    )
    assert any("files match input.paths now that the dataset does not hold" in w for w in report.warnings)


def test_token_files_are_compressed_on_object_storage_and_mapped_as_they_lie_on_local_disk(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """lz4 on object storage (the bytes travel); none on a local disk, a staging area or a token
    store, whose files every task of a local run maps and reads in place. A fresh run and a rebuild
    (staging against store: test_incremental_rebuild_equals_a_fresh_run) write the same bytes."""
    from raypack.pipeline.rebuild import cache_dir
    from raypack.pipeline.tokenize.token_files import staged_options

    out = tmp_path / "out"
    for path in (
        out / "_staging" / "tokens" / "k.arrow",
        os.path.relpath(out / "_staging" / "tokens" / "k.arrow"),
        tmp_path / "root" / "_cache" / "tokens" / "k.arrow",
    ):
        assert staged_options(str(path)).compression is None
    assert staged_options("s3://bucket/out/_staging/tokens/k.arrow").compression == "lz4"

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=20, seed=4)
    run_rebuild(config(tmp_path, tokenizer_path, corpus), **quiet)
    cached = sorted(Path(cache_dir(str(tmp_path / "root"))).glob("*.arrow"))
    assert len(cached) == 2
    for path in cached:  # uncompressed: at least the tokens' 4 bytes each
        tokens = pa.ipc.open_file(str(path)).read_all().column("tokens").combine_chunks().values
        assert path.stat().st_size >= 4 * len(tokens)


def test_a_rebuild_killed_with_sigkill_does_not_hold_the_next_one(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """`kill -9` of a real `raypack rebuild` while it holds the root's lease: the next rebuild, on the
    same machine, starts at once (the lease said "expires in 29x s" and held it for 5 minutes), and
    its output verifies."""
    import signal
    import subprocess
    import sys
    import time

    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=40, seed=71)
    cfg = config(tmp_path, tokenizer_path, corpus)
    command = [str(Path(sys.executable).parent / "raypack"), "rebuild", str(tmp_path / "rebuild.yaml")]
    first = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    lease = tmp_path / "root" / "_lease.json"
    deadline = time.monotonic() + 120
    while not lease.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lease.exists(), first.stderr.read() if first.stderr else ""
    os.killpg(first.pid, signal.SIGKILL)  # the rebuild and its workers, as kill -9 of a process group
    assert json.loads(lease.read_text())["pid"] == first.pid  # left behind, unexpired
    t0 = time.monotonic()
    again = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
    took = time.monotonic() - t0
    first.wait()
    assert again.returncode == 0, again.stderr[-3000:]
    assert took < 60, took
    assert "is being rebuilt by" not in again.stderr
    assert latest_version(str(tmp_path / "root")) is not None
    assert verify(str(tmp_path / "root"), cfg, sample=10).ok
