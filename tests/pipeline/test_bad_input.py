"""Bad input through the whole job: every bad record a recorded reject, every good one packed, the
reject ratio enforced, duplicate ids reported, long documents split. Tokens are counted, not rows."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from raypack.cli import main
from raypack.config import load_config
from raypack.errors import JobError
from raypack.pipeline.job import run_job
from raypack.verifier import verify
from tests.conftest import job_config, packed_documents, random_text, write_jsonl, write_parquet


def quiet(_: str) -> None:
    pass


def _rejects(out: Path) -> list[dict[str, object]]:
    return pq.read_table(out / "rejects").to_pylist() if (out / "rejects").exists() else []


def _good_records(rng: random.Random, n: int) -> list[dict[str, str]]:
    return [{"text": random_text(rng, rng.randint(1, 400))} for _ in range(n)]


def test_every_kind_of_bad_jsonl_record_is_a_reject_and_every_good_token_is_packed(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    rng = random.Random(3)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    good = _good_records(rng, 120)
    bad: list[object] = [
        b'{"text": "unterminated',
        {"body": "no text field"},
        {"text": 42},
        {"text": None},
        b'{"text": "caf\xe9 latin-1"}',
        {"text": ""},
        {"text": "  \n\t "},
        b"[1, 2, 3]",
        {"text": "x" * 20_000},  # over max_document_bytes below
        # Valid JSON that is not text: half a UTF-16 pair escaped alone (tokenizers raised a
        # TypeError that ended the job); in the text, and in the id of a job that reads one below.
        b'{"text": "lone \\ud800 surrogate"}',
        b'{"text": "a \\udc80 too", "other": "\\ud83d\\ude00 a pair is text"}',
    ]
    write_jsonl(corpus / "a.jsonl", good[:60] + bad)
    full = b"".join(json.dumps(r).encode() + b"\n" for r in good[60:])
    packed = gzip.compress(full)
    (corpus / "b.jsonl.gz").write_bytes(packed[: len(packed) * 2 // 3])  # a truncated shard
    zstd = pa.Codec("zstd").compress(full, asbytes=True)
    (corpus / "c.jsonl.zst").write_bytes(zstd[: len(zstd) // 2])
    cfg = load_config(
        str(
            job_config(
                tmp_path,
                f"{corpus}/*",
                tokenizer_path,
                # The two truncated streams are lost files (their rests unread): allowed here.
                input={"max_reject_ratio": 0.2, "max_document_bytes": 10_000, "max_lost_files": 2},
            )
        )
    )
    result = run_job(cfg, log=quiet)
    out = tmp_path / "out"
    rejects = _rejects(out)
    reasons = {(r["source"], r["row"]): r["reason"] for r in rejects}
    assert [reasons[("a.jsonl", 61 + i)].split(":")[0] for i in range(len(bad))] == [
        "malformed JSON",
        "missing text field 'text'",
        "text field 'text' is int, not a string",
        "text field 'text' is null",
        "invalid UTF-8 at byte 13",
        "empty document",
        "whitespace-only document",
        "not a JSON object but list",
        "record of 20,012 bytes, over input.max_document_bytes (10,000)",
        "unpaired surrogate escape in the JSON (half a surrogate pair",
        "unpaired surrogate escape in the JSON (half a surrogate pair",
    ]
    broken = sorted(r["reason"].split(":")[0] for r in rejects if r["source"] != "a.jsonl")
    assert len(broken) == 2 and all(r.startswith("unreadable shard after line") for r in broken)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["rejects"] == len(rejects) == result.rejects == len(bad) + 2
    assert manifest["counts"]["lost_files"] == result.lost_files == 2
    assert sorted(r["source"] for r in rejects if r["lost_file"]) == ["b.jsonl.gz", "c.jsonl.zst"]
    # A truncated stream's rest counts as at least one record.
    assert manifest["counts"]["rejected_records"] == result.rejected_records == len(bad) + 2
    assert sum(manifest["counts"]["rejects_by_reason"].values()) == len(rejects)
    # Token conservation against an independent count: every good document that could be read
    # (all of a.jsonl's, and the readable head of each damaged shard) is packed with all its tokens.
    tok = Tokenizer.from_file(str(tokenizer_path))
    eos = tok.token_to_id("<|endoftext|>")
    readable = good[:60]
    for name in ("b.jsonl.gz", "c.jsonl.zst"):
        last_line = next(int(r["row"]) for r in rejects if r["source"] == name) - 1
        readable += good[60 : 60 + last_line]
    want = sum(len(tok.encode(r["text"], add_special_tokens=False).ids) + 1 for r in readable)
    assert eos is not None and result.documents == len(readable)
    assert result.metrics.tokens == want
    report = verify(str(out), cfg, sample=1000)
    assert report.ok, report.problems
    assert report.sampled == len(readable)


def test_too_many_rejects_fail_the_job_with_one_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(4)
    write_jsonl(corpus / "a.jsonl", [*_good_records(rng, 95), *[b"{broken"] * 5])
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (
        "raypack: job failed: 5 of 100 records rejected (5.00%), over input.max_reject_ratio (1.00%): "
        f"malformed JSON (5). See {tmp_path / 'out' / 'rejects'}: most such corpora have a wrong "
        "input.format or text field; or raise input.max_reject_ratio"
    )
    out = tmp_path / "out"
    assert not (out / "manifest.json").exists() and not (out / "_staging").exists()
    assert len(_rejects(out)) == 5  # what was bad stays there to look at
    assert main(["pack", str(cfg), "--set", "input.max_reject_ratio=0.05"]) == 0
    assert verify(str(out)).ok


def test_a_parquet_corpus_with_a_wrong_schema_file_and_a_non_parquet_file(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(5)
    write_parquet(corpus / "a.parquet", {"text": [random_text(rng, 50) for _ in range(80)]})
    write_parquet(corpus / "b.parquet", {"content": ["a wrong column"] * 3})
    write_parquet(corpus / "c.parquet", {"text": [1, 2]})
    (corpus / "d.parquet").write_bytes(b"PAR1 not really")
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, input={"format": "parquet", "max_reject_ratio": 0.1}
    )
    # Three files lost whole: the job fails unless they are allowed, whatever the ratio.
    with pytest.raises(
        JobError, match=r"^3 input files could not be read whole .* input.max_lost_files \(0\)"
    ):
        run_job(load_config(str(cfg)), log=quiet)
    result = run_job(load_config(str(cfg), ["input.max_lost_files=3"]), overwrite=True, log=quiet)
    # Each lost file counts as its rows (3 and 2 from their footers; 1 for one without a footer).
    assert (result.documents, result.rejects, result.rejected_records, result.lost_files) == (80, 3, 6, 3)
    rejects = _rejects(tmp_path / "out")
    assert sorted((str(r["reason"]).split(":")[0], r["records"], r["lost_file"]) for r in rejects) == [
        ("Parquet file has no column 'text' (columns", 3, True),
        ("column 'text' is int64, not a string", 2, True),
        ("unreadable Parquet file", 1, True),
    ]
    report = verify(str(tmp_path / "out"))
    assert report.ok and len(report.lost_files) == 3 and report.rejected_records == 6
    page = (tmp_path / "out" / "report.html").read_text()
    assert "6 of 86 input records" in page and "3 input files were lost</strong>" in page
    assert "whole file (lost: 3 records)" in page


@pytest.mark.parametrize("mode", ["global", "sharded"])  # counted in the exchange / from the index
def test_duplicate_ids_are_reported_and_every_occurrence_packed(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(6)
    ids = [f"doc-{i}" for i in range(40)] + ["doc-3", "doc-7", "doc-7"]
    records = [{"id": i, "text": random_text(rng, rng.randint(1, 900))} for i in ids]
    write_jsonl(corpus / "a.jsonl", records[:25])
    write_jsonl(corpus / "b.jsonl", records[25:])  # duplicates across shards, and within one
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"id_field": "id"}, pack={"mode": mode})
    assert main(["pack", str(cfg)]) == 0
    summary = capsys.readouterr().out
    assert "2 ids on 5 documents (all packed), e.g. doc-3, doc-7" in summary
    out = tmp_path / "out"
    counts = json.loads((out / "manifest.json").read_text())["counts"]
    assert (counts["documents"], counts["duplicate_ids"], counts["documents_with_duplicate_ids"]) == (
        43,
        2,
        5,
    )
    report = verify(str(out), load_config(str(cfg)), sample=100)
    assert report.ok, report.problems
    assert report.duplicate_ids == 2 and report.sampled == 38  # occurrences of a shared id: not sampled


def test_empty_documents_can_be_kept(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": "fit best"}, {"text": ""}, {"text": "   "}])
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"empty": "keep"})
    result = run_job(load_config(str(cfg)), log=quiet)
    assert (result.documents, result.rejects) == (3, 0)
    tok = Tokenizer.from_file(str(tokenizer_path))
    want = sum(len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in ("fit best", "", "   "))
    assert result.metrics.tokens == want  # the empty one is its EOS alone
    assert verify(str(tmp_path / "out")).ok


def test_a_document_of_a_million_tokens_is_split_into_every_pack_it_needs(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Encoded in ~1 MiB pieces (tokenize.PIECE_CHARS) and cut into seq_len chunks; verify re-tokenizes
    it and compares chunk after chunk. The slow tier does the same with tens of millions of tokens."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(7)
    huge = random_text(rng, 1_100_000)
    write_jsonl(corpus / "a.jsonl", [{"text": "before"}, {"text": huge}, {"text": "after"}])
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": 2048})))
    result = run_job(cfg, log=quiet)
    tok = Tokenizer.from_file(str(tokenizer_path))
    n = len(tok.encode(huge, add_special_tokens=False).ids) + 1
    assert n > 1_000_000 and len(huge) > 4 << 20
    index = pq.read_table(tmp_path / "out" / "index").to_pylist()
    (row,) = [r for r in index if r["doc_id"] == "a.jsonl:2"]
    assert row["length"] == n and row["chunks"] == -(-n // 2048)
    report = verify(str(tmp_path / "out"), cfg, sample=3)
    assert report.ok and report.sampled == 3, report.problems
    small = sum(len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in ("before", "after"))
    assert result.documents == 3 and result.metrics.tokens == n + small


def test_a_job_where_every_record_is_bad_says_so(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"txt": "wrong field"}] * 3)
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path)))
    said = r"no documents to pack: 3 records rejected: missing text field 'text' \(3\)\. See .*: most such"
    with pytest.raises(JobError, match=said):
        run_job(cfg, log=quiet)
    # Its rejects stay, for the user to look at; no unit index, which no dataset holds.
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rejects"]


def test_a_corpus_of_empty_files_says_so_without_pointing_at_rejects_that_do_not_exist(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (corpus / name).write_bytes(b"")
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err == "raypack: job failed: no documents to pack: the input holds no records\n"
    assert not (tmp_path / "out").exists()  # nothing in it: no empty index/ either


def test_the_summary_names_rejects_only_where_there_are_some(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": "the ray data"}, {"text": "a plan"}])
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("documents "))
    assert line.split() == ["documents", "2", "(no", "record", "rejected)"]
    assert not (tmp_path / "out" / "rejects").exists()
    write_jsonl(corpus / "b.jsonl", [b"{not json"] + [{"text": f"the plan {i}"} for i in range(200)])
    assert main(["pack", str(cfg), "--quiet", "--overwrite"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("documents "))
    assert "(1 record rejected, see rejects/)" in line and (tmp_path / "out" / "rejects").is_dir()


def test_files_with_a_renamed_text_column_count_as_all_their_rows_and_fail_the_job(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 of 10 Parquet files with the text column renamed: 40% of the corpus. Counted as one reject a
    file, that was 4 of 1,204 records (0.33%, under the default 1%): exit 0, 800 records missing."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(6)
    for k in range(10):
        column = "content" if k % 3 == 0 else "text"  # files 0, 3, 6, 9
        write_parquet(corpus / f"part-{k:02d}.parquet", {column: [random_text(rng, 5) for _ in range(200)]})
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"format": "parquet"})
    assert main(["pack", str(cfg)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("raypack: job failed: 4 input files could not be read whole")
    assert "input.max_lost_files (0)" in err
    # Allowing the files does not hide them from the ratio: 800 of 2,000 records.
    assert main(["pack", str(cfg), "--set", "input.max_lost_files=4"]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("raypack: job failed: 800 of 2,000 records rejected (40.00%)")


def test_dictionary_and_string_view_text_columns_are_read(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(7)
    texts = [random_text(rng, 30) for _ in range(60)]
    pq.write_table(pa.table({"text": pa.array(texts[:20]).dictionary_encode()}), corpus / "a.parquet")
    pq.write_table(pa.table({"text": pa.array(texts[20:40]).cast(pa.string_view())}), corpus / "b.parquet")
    pq.write_table(pa.table({"text": pa.array(texts[40:], pa.large_string())}), corpus / "c.parquet")
    assert pq.read_schema(corpus / "a.parquet").field("text").type.value_type == pa.string()
    assert pq.read_schema(corpus / "b.parquet").field("text").type == pa.string_view()
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"format": "parquet"})))
    result = run_job(cfg, log=quiet)
    tok = Tokenizer.from_file(str(tokenizer_path))
    assert (result.documents, result.rejects) == (60, 0)
    assert result.metrics.tokens == sum(len(tok.encode(t, add_special_tokens=False).ids) + 1 for t in texts)
    assert verify(str(tmp_path / "out"), cfg, sample=60).ok


def test_a_truncated_text_file_is_a_lost_file(tmp_path: Path, tokenizer_path: Path) -> None:
    """input.format text: a half-written .txt.gz is a lost file, as a half-written .jsonl.gz is, and
    fails the job under input.max_lost_files: 0 (it passed as one bad record among many)."""
    rng = random.Random(7)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):
        (corpus / f"doc-{i:03d}.txt").write_text(random_text(rng, 50))
    whole = gzip.compress(random_text(rng, 5000).encode())
    (corpus / "cut.txt.gz").write_bytes(whole[: len(whole) // 2])
    cfg = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, input={"format": "text", "max_reject_ratio": 0.5}
    )
    with pytest.raises(
        JobError, match=r"^1 input file could not be read whole .*input\.max_lost_files \(0\)"
    ):
        run_job(load_config(str(cfg)), log=quiet)
    result = run_job(load_config(str(cfg), ["input.max_lost_files=1"]), overwrite=True, log=quiet)
    assert (result.documents, result.lost_files) == (60, 1)
    (lost,) = _rejects(tmp_path / "out")
    assert (
        lost["source"] == "cut.txt.gz" and lost["lost_file"] and lost["reason"].startswith("unreadable file")
    )


def test_a_lone_surrogate_in_a_read_field_is_a_reject_and_a_bom_opens_a_file_quietly(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """An id of half a UTF-16 pair is a reject (it crashed the job where it was written); the same
    escape in a field the job does not read keeps the document; a UTF-8 BOM before a file's first
    record is no part of its JSON (it made that record a reject)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.jsonl").write_bytes(
        b'\xef\xbb\xbf{"id": "first", "text": "the first record"}\n'
        b'{"id": "\\udc80", "text": "a bad id"}\n'
        b'{"id": "kept", "text": "kept", "note": "\\ud800 unread"}\n'
    )
    cfg = load_config(
        str(
            job_config(
                tmp_path, f"{corpus}/*", tokenizer_path, input={"id_field": "id", "max_reject_ratio": 0.5}
            )
        )
    )
    result = run_job(cfg, log=quiet)
    assert [r["reason"] for r in _rejects(tmp_path / "out")] == [
        "unpaired surrogate escape in the JSON (half a surrogate pair: not text)"
    ]
    assert result.documents == 2
    assert sorted(packed_documents(tmp_path / "out")) == ["first", "kept"]


def test_rejects_grouped_by_kind_keep_the_numbers_of_names_and_paths() -> None:
    """The summary's rejects by kind put N for a count or a size, not for a digit inside a word or a
    path (a template's path is not shown as /tmp/pytest-N/modelN/), and a kind ends at a colon
    outside parentheses (not at "no trained token (pack.loss assistant")."""
    from raypack.corpus.readers.records import reason_counts

    reasons = [
        "invalid UTF-8 at byte 13",
        "invalid UTF-8 at byte 4107",
        "record of 20,012 bytes, over input.max_document_bytes (10,000)",
        "chat template /tmp/run-154/model0/tokenizer_config.json: 'dict object' has no attribute 'content'",
        "message 0 of 'messages' is not an object with a string role",
        "message 12 of 'messages' is not an object with a string role",
        "a UTF-16 thing at 2.5%",
        "text of 600 bytes, over input.max_document_bytes (500)",
        "text of 1,234,567 bytes, over input.max_document_bytes (1,000)",
        "values 1,2 and 3",
        "no trained token (pack.loss assistant: no assistant turn)",
        "column 'url' is list<element: string>, not a string (input.metadata_fields)",
    ]
    assert reason_counts(reasons) == {
        "column 'url' is list<element: string>, not a string (input.metadata_fields)": 1,  # nor in a type
        "a UTF-16 thing at N%": 1,
        "no trained token (pack.loss assistant: no assistant turn)": 1,  # not cut inside its parenthesis
        "chat template /tmp/run-154/model0/tokenizer_config.json": 1,
        "invalid UTF-8 at byte N": 2,
        "message N of 'messages' is not an object with a string role": 2,
        "record of N bytes, over input.max_document_bytes (N)": 1,
        "text of N bytes, over input.max_document_bytes (N)": 2,  # a size with separators or without
        "values N,N and N": 1,  # a list, not thousands
    }


def test_a_reject_limit_names_how_many_kinds_it_does_not_show(tmp_path: Path) -> None:
    """The job's failure shows the three commonest kinds of reject and says how many more there are
    (not left out without a word)."""
    from types import SimpleNamespace

    from raypack.config import JobConfig as Job
    from raypack.config import from_dict
    from raypack.pipeline.tokenize.stage import check_rejects

    cfg = from_dict(
        Job,
        {
            "input": {"paths": ["x"]},
            "tokenizer": {"path": "t"},
            "pack": {"seq_len": 8},
            "output": {"path": str(tmp_path)},
        },
    )
    reasons = {"a": 5, "b": 4, "c": 3, "d": 2, "e": 1}
    totals = SimpleNamespace(documents=1, rejected_records=15, reasons=reasons, lost_files=0)
    with pytest.raises(JobError) as caught:
        check_rejects(cfg, totals)  # type: ignore[arg-type]
    assert "a (5); b (4); c (3) and 2 more kinds. See" in str(caught.value)
    # Where records over the size limit lead, the advice is that limit, not the reading.
    size = "record of N bytes, over input.max_document_bytes (N)"
    totals.reasons = {size: 9, "malformed JSON": 2}
    with pytest.raises(JobError) as caught:
        check_rejects(cfg, totals)  # type: ignore[arg-type]
    assert (
        f"{size} (9); malformed JSON (2). See {tmp_path / 'rejects'}: most are over "
        "input.max_document_bytes (268,435,456): raise it where such records are wanted; or raise "
        "input.max_reject_ratio"
    ) in str(caught.value), caught.value
    # The commonest kind, but not most of them: the reading is the likelier cause, the limit named.
    totals.reasons = {size: 9, "malformed JSON": 6, "missing text field 'text'": 6}
    with pytest.raises(JobError) as caught:
        check_rejects(cfg, totals)  # type: ignore[arg-type]
    assert (
        "most such corpora have a wrong input.format or text field; 9 of the records are over "
        "input.max_document_bytes (268,435,456); or raise input.max_reject_ratio"
    ) in str(caught.value), caught.value


def test_the_report_shows_rejected_records_before_documents_overflow_dropped(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A unit's overflow rejects (documents packed in part or not at all) come after its rejected
    records in the report's examples: 12 documents dropped by pack.overflow do not hide the one
    record a user can mend."""
    rng = random.Random(4)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    records = [{"text": random_text(rng, 60)} for _ in range(12)] + [{"text": ""}, {"text": "a few words"}]
    write_jsonl(corpus / "a.jsonl", records)
    pack = {"seq_len": 16, "overflow": "drop"}
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack, input={"max_reject_ratio": 0.5})
    run_job(load_config(str(cfg)), log=lambda _: None)
    page = (tmp_path / "out" / "report.html").read_text()
    assert "This packer cuts only documents longer than seq_len" in page  # bfd's rule, in its caption
    examples = page[page.index("The first 10:") :]
    assert examples.index("empty document") < examples.index("overflow drop: longer than seq_len (16)")
    # The reject gate counts records, and names their reasons only.
    gate = r"1 of 14 records rejected \(7\.14%\), .*: empty document \(1\)\. See"
    with pytest.raises(JobError, match=gate):
        run_job(
            load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack))),
            overwrite=True,
            log=lambda _: None,
        )
