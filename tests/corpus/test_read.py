"""Reading shards: documents with ids, and every bad record recorded with a reason (no Ray)."""

from __future__ import annotations

import fnmatch
import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raypack.config import InputConfig
from raypack.corpus import cut
from raypack.corpus.cut import COMPRESSED_SUFFIXES
from raypack.corpus.readers import jsonl as read_module
from raypack.corpus.readers import read_unit, records
from raypack.corpus.units import WorkUnit
from raypack.errors import ConfigError
from raypack.storage import Shard, expand_inputs, glob_match
from tests.conftest import write_jsonl, write_parquet


def read_shard(shard: Shard, cfg: InputConfig, batch: int) -> Any:
    """The reader of cfg's format over one file or unit, as a tokenize task reads it."""
    return read_unit(WorkUnit(shard, cfg.reading()), batch)


def work_units(shards: list[Shard], cfg: InputConfig) -> list[Shard]:
    """cut.work_units over whole files read as cfg says; the units' Shards."""
    units = cut.work_units([WorkUnit(s, cfg.reading()) for s in shards], cfg.unit_bytes)
    return [u.shard for u in units]


def shard_of(path: Path, rel: str | None = None) -> Shard:
    return Shard(index=0, path=str(path), relpath=rel or path.name, size=path.stat().st_size, mtime_ns=0)


def input_config(fmt: str = "jsonl", **options: Any) -> InputConfig:
    return InputConfig(paths=("unused",), format=fmt, **options)


def read_all(
    path: Path, fmt: str = "jsonl", id_field: str | None = None, batch: int = 3, **options: Any
) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    docs, rejects = [], []
    for b in read_shard(shard_of(path), input_config(fmt, id_field=id_field, **options), batch):
        assert len(b) <= batch
        docs += list(zip(b.rows, b.ids, b.texts, strict=True))
        rejects += [(r.row, r.reason) for r in b.rejects]
    return docs, rejects


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_jsonl_ids_are_path_and_line(tmp_path: Path, compression: str | None) -> None:
    suffix = {None: "", "gzip": ".gz", "zstd": ".zst"}[compression]
    path = tmp_path / f"a.jsonl{suffix}"
    write_jsonl(path, [{"text": f"doc {i}"} for i in range(7)], compression)
    docs, rejects = read_all(path)
    assert rejects == []
    assert [(row, doc_id) for row, doc_id, _ in docs] == [(i + 1, f"{path.name}:{i + 1}") for i in range(7)]
    assert docs[3][2] == "doc 3"


def test_every_bad_line_is_a_recorded_reject(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    write_jsonl(
        path,
        [
            {"text": "good one"},
            b'{"text": "unterminated',
            b'{"text": "caf\xe9"}',
            {"body": "no text field"},
            {"text": 42},
            {"text": "   \n\t"},
            b"[1, 2]",
            b"",
            b" \t \r",
            {"text": "good two"},
        ],
    )
    docs, rejects = read_all(path)
    assert [d[0] for d in docs] == [1, 10]
    reasons = dict(rejects)
    assert set(reasons) == {2, 3, 4, 5, 6, 7}  # lines 8 and 9 are blank: no record, not counted
    assert reasons[2].startswith("malformed JSON")
    assert reasons[3] == "invalid UTF-8 at byte 13"
    assert reasons[4] == "missing text field 'text'"
    assert reasons[5] == "text field 'text' is int, not a string"
    assert reasons[6] == "whitespace-only document"
    assert reasons[7] == "not a JSON object but list"


@pytest.mark.parametrize(
    "data", [b'\xef\xbb\xbf\n{"text": "x"}\n', b'\xef\xbb\xbf  \r\n{"text": "x"}\n', b"\xef\xbb\xbf"]
)
def test_a_bom_before_a_blank_first_line_is_no_record(tmp_path: Path, data: bytes) -> None:
    """A file that starts with a BOM (as Windows editors save it) and a blank line, or holds the BOM
    alone: the BOM is no part of the line, which is then blank, so no record and no reject."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(data)
    docs, rejects = read_all(path)
    assert rejects == []
    assert [(row, text) for row, _, text in docs] == ([(2, "x")] if len(data) > 3 else [])


# Lines where orjson and json disagree or refuse (raypack.corpus.readers.jsonl._parse_line): big
# integers (orjson: a float), NaN/Infinity, lone surrogate escapes, deep nesting, a BOM, control
# characters, non-objects, duplicate keys, ids of every scalar type.
ODD_LINES = [
    b'{"text": "plain", "id": "a"}',
    b'{"text": "big id", "id": 123456789012345678901234567890}',
    b'{"text": "u64 id", "id": 18446744073709551615}',
    b'{"text": "float id", "id": 1.5}',
    b'{"text": "exp id", "id": 1e400}',
    b'{"text": "nan id", "id": NaN}',
    b'{"text": 123456789012345678901234567890, "id": "t"}',
    b'{"text": 2.5, "id": "t"}',
    b'{"text": "lone \\ud800 surrogate", "id": "s"}',
    b'{"text": "pair \\ud83d\\ude00", "id": "p"}',
    b'{"text": "nul \\u0000 and tab\\t", "id": true}',
    b'{"text": "x", "id": null}',
    b'{"text": "x", "id": [1]}',
    b'{"text": "dup", "text": "last", "id": -0}',
    b'\xef\xbb\xbf{"text": "bom", "id": 1}',
    b'{"text": "ctrl \x01 raw", "id": 1}',
    b'{"text": "caf\xe9", "id": 1}',
    b"[" * 1500 + b"]" * 1500,
    b'{"text": ' + b"[" * 1500 + b"]" * 1500 + b', "id": 1}',
    b"123456789012345678901234567890",
    b'"a string"',
    b'{"text": "trailing"} x',
    b'  {"text": "spaced", "id": 0}  \r',
]


@pytest.mark.parametrize("id_field", [None, "id"])
def test_orjson_reads_every_line_as_json_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, id_field: str | None
) -> None:
    """The same documents, ids and rejects (with their reasons) whether orjson read the lines or
    json alone did (orjson made to refuse every line)."""
    path = tmp_path / "odd.jsonl"
    path.write_bytes(b"\n".join(ODD_LINES) + b"\n")
    fast = read_all(path, id_field=id_field)

    def refuse(line: bytes) -> None:
        raise read_module.orjson.JSONDecodeError("refused", "", 0)

    monkeypatch.setattr(read_module.orjson, "loads", refuse)
    assert fast == read_all(path, id_field=id_field)
    docs, rejects = fast
    assert len(docs) + len(rejects) == len(ODD_LINES)
    ids = {text: doc_id for _, doc_id, text in docs}
    if id_field:
        assert ids["big id"] == "123456789012345678901234567890" and ids["u64 id"] == "18446744073709551615"
        assert ids["float id"] == "1.5" and ids["exp id"] == "inf" and ids["nan id"] == "nan"
    assert "last" in ids and "dup" not in ids and ids["pair 😀"]
    # Half a surrogate pair is no text (tokenizers refused it with a TypeError that ended the job).
    assert "lone \ud800 surrogate" not in ids
    reasons = [reason for _, reason in rejects]
    assert "unpaired surrogate escape in the JSON (half a surrogate pair: not text)" in reasons
    assert "malformed JSON: nested too deeply" in reasons  # json's RecursionError, not a crash
    assert "text field 'text' is int, not a string" in reasons  # not float, as orjson would read it


def test_id_field(tmp_path: Path) -> None:
    path = tmp_path / "ids.jsonl"
    write_jsonl(path, [{"text": "a", "id": "x-1"}, {"text": "b", "id": 7}, {"text": "c"}])
    docs, rejects = read_all(path, id_field="id")
    assert [d[1] for d in docs] == ["x-1", "7"]
    assert rejects == [(3, "missing or non-scalar id field 'id'")]


def test_truncated_gzip_keeps_what_was_read_and_says_where(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl.gz"
    data = gzip.compress(
        b"".join(json.dumps({"text": f"doc {i} " * 50}).encode() + b"\n" for i in range(10000))
    )
    path.write_bytes(data[: len(data) // 2])
    docs, rejects = read_all(path, batch=100)
    assert 1000 < len(docs) < 10000
    ((row, reason),) = rejects
    assert row == docs[-1][0] + 1 or row == docs[-1][0] + 2
    assert reason.startswith(f"unreadable shard after line {row - 1}")


def test_parquet_rows_and_wrong_schema(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    write_parquet(good, {"text": ["a", "", "c", None]})
    docs, rejects = read_all(good, fmt="parquet")
    assert [(d[0], d[1]) for d in docs] == [(0, "good.parquet:0"), (2, "good.parquet:2")]
    assert rejects == [(1, "empty document"), (3, "text field 'text' is null")]
    bad = tmp_path / "bad.parquet"
    write_parquet(bad, {"content": ["a"]})
    docs, rejects = read_all(bad, fmt="parquet")
    assert docs == [] and rejects == [(-1, "Parquet file has no column 'text' (columns: content)")]


def _read_meta(
    path: Path, fmt: str, **options: Any
) -> tuple[list[tuple[int, str, tuple[Any, ...]]], list[tuple[int, str]]]:
    docs, rejects = [], []
    for b in read_shard(shard_of(path), input_config(fmt, **options), 3):
        docs += list(zip(b.rows, b.texts, b.meta, strict=True))
        rejects += [(r.row, r.reason) for r in b.rejects]
    return docs, rejects


def test_text_fields_and_metadata_by_the_rule(tmp_path: Path) -> None:
    """text_fields: the fields present and not empty joined in order; none present (missing or
    null) or one not a string is a reject. metadata_fields: a missing field is null, a list or an
    object a reject; orjson and json read a line alike (a float score, an integer past 64 bits)."""
    options = {"text_fields": ("title", "body"), "text_separator": " | ", "metadata_fields": ("url", "q")}
    write_jsonl(
        tmp_path / "a.jsonl",
        [
            {"title": "T", "body": "B", "url": "u", "q": 0.5},
            {"body": "B2"},
            {"title": None, "body": "B3", "q": 2**70},
            {"title": "", "body": "B4", "q": True},
            {"url": "u5"},
            {"title": None, "body": None},
            {"title": "T7", "body": ["x"]},
            {"title": "T8", "body": "B8", "url": {"a": 1}},
            b'{"title": "T9", "url": "\\ud800"}',
        ],
    )
    docs, rejects = _read_meta(tmp_path / "a.jsonl", "jsonl", **options)
    assert docs == [
        (1, "T | B", ("u", 0.5)),
        (2, "B2", (None, None)),
        (3, "B3", (None, 2**70)),
        (4, "B4", (None, True)),
    ]
    none = "no text field present (all missing or null: 'title', 'body')"
    assert rejects == [
        (5, none),
        (6, none),
        (7, "text field 'body' is list, not a string"),
        (8, "metadata field 'url' is dict, not a string, number or bool"),
        (9, "unpaired surrogate escape in the JSON (half a surrogate pair: not text)"),
    ]

    # Parquet: a column the file lacks is missing in every row (without any text column, the file
    # is lost); a metadata column that holds no scalars loses the file.
    write_parquet(tmp_path / "b.parquet", {"body": ["x", None], "q": [1, None]})
    docs, rejects = _read_meta(tmp_path / "b.parquet", "parquet", **options)
    assert docs == [(0, "x", (None, 1))] and rejects == [(1, none)]
    write_parquet(tmp_path / "c.parquet", {"text": ["x"]})
    docs, rejects = _read_meta(tmp_path / "c.parquet", "parquet", **options)
    assert rejects == [(-1, "Parquet file has none of the columns title, body (columns: text)")]
    write_parquet(tmp_path / "d.parquet", {"body": ["x"], "url": [["a"]]})
    docs, rejects = _read_meta(tmp_path / "d.parquet", "parquet", **options)
    assert rejects == [
        (-1, "column 'url' is list<element: string>, not a string, number or bool (input.metadata_fields)")
    ]


def test_text_files_are_one_document_each(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("hello\nworld\n")
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe")
    docs, rejects = read_all(tmp_path / "t.txt", fmt="text")
    assert docs == [(0, "t.txt", "hello\nworld\n")] and rejects == []
    docs, rejects = read_all(tmp_path / "bin.txt", fmt="text")
    assert docs == [] and rejects == [(0, "invalid UTF-8 at byte 0")]


def test_expand_inputs_globs_sorts_and_relativizes(tmp_path: Path) -> None:
    for rel in ("b/2.jsonl", "a/1.jsonl", "a/skip.txt", "a/deep/3.jsonl"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}\n")
    shards = expand_inputs((f"{tmp_path}/**/*.jsonl",))
    assert [s.relpath for s in shards] == ["a/1.jsonl", "a/deep/3.jsonl", "b/2.jsonl"]
    assert [s.index for s in shards] == [0, 1, 2]
    assert [s.relpath for s in expand_inputs((str(tmp_path / "a"),))] == [
        "1.jsonl",
        "deep/3.jsonl",
        "skip.txt",
    ]
    with pytest.raises(ConfigError, match="matched no files"):
        expand_inputs((f"{tmp_path}/*.parquet",))


def test_a_broken_symbolic_link_among_the_inputs_is_a_clear_error(tmp_path: Path) -> None:
    """pyarrow's listing leaves out a link to nothing: its file would be missing from the output
    with no word. Every way of naming it (a glob, `**`, its directory, itself) names the link and
    its target; a link out of the glob's reach and a working link are left alone."""
    (tmp_path / "corpus" / "deep").mkdir(parents=True)
    (tmp_path / "corpus" / "a.jsonl").write_text("{}\n")
    (tmp_path / "corpus" / "ok.jsonl").symlink_to(tmp_path / "corpus" / "a.jsonl")
    (tmp_path / "corpus" / "deep" / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/corpus/*.jsonl",))] == ["a.jsonl", "ok.jsonl"]
    for pattern in (
        f"{tmp_path}/corpus/**/*.jsonl",
        f"{tmp_path}/corpus",
        f"{tmp_path}/corpus/deep/gone.jsonl",
    ):
        with pytest.raises(
            ConfigError,
            match=r"deep/gone\.jsonl is a symbolic link to .*nowhere\.jsonl, which does not exist",
        ):
            expand_inputs((pattern,))


def test_a_star_stays_inside_one_directory(tmp_path: Path) -> None:
    """`corpus/*.jsonl.gz` takes corpus/'s files, never corpus/holdout/'s (fnmatch's `*` crossed `/`:
    evaluation data went into training); `**` crosses directories on purpose."""
    for rel in ("a.jsonl.gz", "b.jsonl.gz", "holdout/eval.jsonl.gz", "holdout/deep/x.jsonl.gz"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"")
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/*.jsonl.gz",))] == ["a.jsonl.gz", "b.jsonl.gz"]
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/?.jsonl.gz",))] == ["a.jsonl.gz", "b.jsonl.gz"]
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/*/*.jsonl.gz",))] == ["holdout/eval.jsonl.gz"]
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/**/*.jsonl.gz",))] == [
        "a.jsonl.gz",
        "b.jsonl.gz",
        "holdout/deep/x.jsonl.gz",
        "holdout/eval.jsonl.gz",
    ]
    assert [s.relpath for s in expand_inputs((f"{tmp_path}/holdout/**",))] == [
        "deep/x.jsonl.gz",
        "eval.jsonl.gz",
    ]


@settings(max_examples=300, deadline=None)
@given(
    pattern=st.text(alphabet="ab*?[]!-.", max_size=8),
    name=st.text(alphabet="ab]![-.", max_size=8),
)
def test_a_glob_segment_matches_as_fnmatch_matches_a_name(pattern: str, name: str) -> None:
    assert glob_match(pattern, name) == fnmatch.fnmatchcase(name, pattern)
    assert not glob_match(pattern, f"{name}/{name}") or "**" in pattern or "/" in pattern


def test_an_output_inside_an_input_glob_is_refused(tmp_path: Path) -> None:
    from raypack.config import JobConfig, from_dict

    def config(paths: list[str], output: str) -> JobConfig:
        data = {"input": {"paths": paths}, "tokenizer": {"path": "t.json"}, "output": {"path": output}}
        return from_dict(JobConfig, data)

    with pytest.raises(ConfigError, match=r"lies inside s3://b/web, where input s3://b/web/\*.parquet"):
        config(["s3://b/web/*.parquet"], "s3://b/web/packed")
    with pytest.raises(ConfigError, match="lies inside"):
        config([f"{tmp_path}/corpus/**/*.jsonl"], str(tmp_path / "corpus" / "out"))
    with pytest.raises(ConfigError, match="lies inside"):
        config([str(tmp_path / "corpus")], str(tmp_path / "corpus" / "packed"))  # a directory input
    config(["s3://b/web/*.parquet"], "s3://b/web-packed")  # a sibling is fine
    config([f"{tmp_path}/corpus/*.jsonl"], str(tmp_path / "out"))


@pytest.mark.parametrize(("bos", "eos"), [(False, False), (True, False), (False, True), (True, True)])
def test_flat_encoding_equals_per_document_encoding(tokenizer_path: Path, bos: bool, eos: bool) -> None:
    from raypack.config import TokenizerConfig
    from raypack.text.encode import encode_documents, encode_flat
    from raypack.text.files import read_tokenizer

    cfg = TokenizerConfig(path=str(tokenizer_path), add_bos=bos, add_eos=eos, bos_id=1 if bos else None)
    tok = read_tokenizer(cfg)
    texts = ["best fit packing", "a", "ray data shard " * 50, "plan"]
    flat, lengths = encode_flat(tok, cfg, texts)
    docs = encode_documents(tok, cfg, texts)
    assert lengths.tolist() == [len(d) for d in docs]
    assert flat.tolist() == [t for d in docs for t in d]


def test_batches_are_bounded_by_text_bytes_too(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    write_jsonl(path, [{"text": "x" * (records.MAX_BATCH_BYTES // 3 + 1)} for _ in range(10)])
    sizes = [len(b) for b in read_shard(shard_of(path), input_config(), 1000)]
    assert sizes == [3, 3, 3, 1]  # never 1000 documents of megabytes in one encode_batch call


def test_empty_documents_are_rejected_or_kept_as_configured(tmp_path: Path) -> None:
    path = tmp_path / "e.jsonl"
    write_jsonl(path, [{"text": ""}, {"text": " \n\t "}, {"text": "x"}])
    docs, rejects = read_all(path)
    assert [d[2] for d in docs] == ["x"]
    assert rejects == [(1, "empty document"), (2, "whitespace-only document")]
    docs, rejects = read_all(path, empty="keep")
    assert [d[2] for d in docs] == ["", " \n\t ", "x"] and rejects == []


@pytest.mark.parametrize("kind", ["members", "bomb", "cut", "garbage after", "zeros after", "empty"])
def test_gzip_is_inflated_as_arrow_inflates_it(tmp_path: Path, kind: str) -> None:
    """gzip shards go through ISA-L (readers.jsonl._gunzip), not Arrow's zlib stream: the same bytes for
    every member of a multi-member file, at most _CHUNK held for a highly compressed one, and a
    damaged file an error where Arrow's would be one (a reject, with what came before kept). Zero
    bytes after a member are padding, as gzip -t and Python's gzip read them (Arrow refuses them):
    every line, no reject."""
    import pyarrow.fs as pafs

    lines = b"".join(json.dumps({"text": f"doc {i} " * 20}).encode() + b"\n" for i in range(3000))
    data = {
        "members": gzip.compress(lines[:5000]) + gzip.compress(lines[5000:]) + gzip.compress(b""),
        "bomb": gzip.compress(b'{"text": "' + b"a" * (20 << 20) + b'"}\n' + lines),
        "cut": gzip.compress(lines)[:-5000],
        "garbage after": gzip.compress(lines) + b"\x00" * 40 + b"not gzip",
        "zeros after": gzip.compress(lines[:5000])
        + b"\x00" * 40
        + gzip.compress(lines[5000:])
        + b"\x00" * 600_000,
        "empty": b"",
    }[kind]
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(data)
    fs = pafs.LocalFileSystem()

    def inflate(reader: Any) -> tuple[bytes, str | None]:
        out = []
        try:
            for piece in reader():
                assert len(piece) <= read_module.CHUNK
                out.append(piece)
        except OSError as e:
            return b"".join(out), str(e)
        return b"".join(out), None

    def arrow() -> Any:
        with fs.open_input_stream(str(path), compression="detect") as stream:
            while piece := stream.read(read_module.CHUNK):
                yield piece

    def isal() -> Any:
        with fs.open_input_stream(str(path), compression=None) as stream:
            yield from read_module._gunzip(stream)

    if kind == "zeros after":
        assert inflate(isal) == (gzip.decompress(data), None)
        docs, rejects = read_all(path, batch=100)
        assert rejects == [] and len(docs) == 3000
        return
    (ours, our_error), (theirs, their_error) = inflate(isal), inflate(arrow)
    assert (our_error is None) == (their_error is None), (our_error, their_error)
    if our_error is None:
        assert ours == theirs
    else:
        assert theirs.startswith(ours) or ours.startswith(theirs)  # each stops where its reads did
        assert records.is_bad_data(OSError(our_error))
        docs, rejects = read_all(path, batch=100)
        ((row, reason),) = rejects
        assert reason.startswith(f"unreadable shard after line {row - 1}: ")
        assert [d[0] for d in docs] == list(range(1, row))  # what came before the damage is kept


@pytest.mark.parametrize("damage", ["truncated zstd", "corrupt gzip"])
def test_a_damaged_compressed_shard_is_a_reject_not_a_crash(tmp_path: Path, damage: str) -> None:
    import pyarrow as pa

    data = b"".join(json.dumps({"text": f"doc {i} " * 50}).encode() + b"\n" for i in range(5000))
    if damage == "truncated zstd":
        path = tmp_path / "cut.jsonl.zst"
        packed = pa.Codec("zstd").compress(data, asbytes=True)
        path.write_bytes(packed[: len(packed) // 2])
    else:
        path = tmp_path / "bad.jsonl.gz"
        packed = bytearray(gzip.compress(data))
        packed[len(packed) // 2 : len(packed) // 2 + 64] = b"\x00" * 64
        path.write_bytes(bytes(packed))
    docs, rejects = read_all(path, batch=100)
    assert len(docs) < 5000
    ((row, reason),) = rejects
    assert reason.startswith(f"unreadable shard after line {row - 1}: ")
    assert [d[0] for d in docs] == list(range(1, len(docs) + 1))  # what came before the damage is kept


def test_records_over_the_size_limit_are_rejected_without_being_held(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    near = "y" * (3 * read_module.CHUNK)  # spans several read chunks, under the limit: kept whole
    over = "z" * (8 * read_module.CHUNK)
    write_jsonl(path, [{"text": "a"}, {"text": over}, {"text": near}, {"text": over}])
    limit = 4 * read_module.CHUNK
    docs, rejects = read_all(path, max_document_bytes=limit)
    assert [(d[0], d[2]) for d in docs] == [(1, "a"), (3, near)]
    size = len(json.dumps({"text": over}))
    reason = f"record of {size:,} bytes, over input.max_document_bytes ({limit:,})"
    assert rejects == [(2, reason), (4, reason)]
    text = tmp_path / "big.txt"
    text.write_text(over)
    docs, rejects = read_all(text, fmt="text", max_document_bytes=limit)
    assert docs == [] and rejects == [
        (0, f"file of {len(over):,} bytes, over input.max_document_bytes ({limit:,})")
    ]


def test_parquet_that_is_not_parquet_or_has_a_wrong_type_is_a_reject(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"this is not a parquet file at all")
    docs, rejects = read_all(garbage, fmt="parquet")
    assert docs == [] and len(rejects) == 1 and rejects[0][1].startswith("unreadable Parquet file: ")
    typed = tmp_path / "typed.parquet"
    write_parquet(typed, {"text": [1, 2, 3]})
    docs, rejects = read_all(typed, fmt="parquet")
    assert docs == [] and rejects == [(-1, "column 'text' is int64, not a string")]


def test_a_storage_failure_is_raised_not_recorded_as_a_reject(tmp_path: Path) -> None:
    """A missing shard (here: deleted after the listing) says nothing about the data: the task must
    fail (and be retried by Ray), not turn the shard into one reject."""
    path = tmp_path / "gone.jsonl"
    write_jsonl(path, [{"text": "a"}])
    shard = shard_of(path)
    path.unlink()
    for fmt in ("jsonl", "parquet", "text"):
        with pytest.raises(OSError):
            list(read_shard(shard, input_config(fmt), 10))


def test_long_texts_are_cut_before_a_space_and_tokenize_the_same(tokenizer_path: Path) -> None:
    """A byte-level BPE: cuts before a space between two words (the space opens the next piece, as
    it opens the next pre-token), every piece within the size, and the tokens the whole text's."""
    from raypack.config import TokenizerConfig
    from raypack.text import encode as tokenize
    from raypack.text.cuts import cut_text
    from raypack.text.files import read_tokenizer

    words = ["alpha", "beta,", "gamma.", "delta\n", "  eps", "(zeta)", "eta"]
    text = " ".join(words[i % len(words)] + str(i % 13) for i in range(20000))
    cfg = TokenizerConfig(path=str(tokenizer_path))
    tok = read_tokenizer(cfg)
    rule, _ = tok.cut_rule()
    assert rule is not None and rule.name == "before"
    pieces, made, refused = cut_text(text, 1000, rule, tok.encode_ids)
    assert "".join(pieces) == text and len(pieces) > 100 and made == len(pieces) - 1 and refused == 0
    assert all(len(p) <= 1000 for p in pieces)
    assert all(p.startswith(" ") and not p[1].isspace() for p in pieces[1:])
    unbroken = "x" * 2500  # nowhere to cut: one piece
    assert cut_text(unbroken, 1000, rule, tok.encode_ids) == ([unbroken], 0, 0)
    whole = [*tok.tokenizer.encode(text, add_special_tokens=False).ids, tok.eos_id]
    (long_doc,) = tokenize.encode_documents(tok, cfg, [text])  # PIECE_CHARS: one piece
    original = tokenize.PIECE_CHARS
    try:
        tokenize.PIECE_CHARS = 1000
        flat, lengths = tokenize.encode_flat(tok, cfg, ["short one", text, "two"])
    finally:
        tokenize.PIECE_CHARS = original
    assert long_doc == whole
    assert lengths.tolist()[1] == len(whole)
    assert flat[lengths[0] : lengths[0] + lengths[1]].tolist() == whole


def test_the_fast_encoding_gives_encode_batch_ids(tokenizer_path: Path, tmp_path: Path) -> None:
    """raypack encodes with encode_batch_fast (no offsets): the ids must be encode_batch's, with a
    byte-level BPE and with a normalizing WordPiece, on text with accents, CJK, emoji, tabs, newlines."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    from raypack.config import TokenizerConfig
    from raypack.text.encode import encode_flat
    from raypack.text.files import read_tokenizer

    texts = [
        "Déjà vu: naïve café, Œuvre; straße",
        "中文分词 テスト 한국어",
        "emoji 🚀🔥 and\ttabs\n\nnew lines   and  spaces ",
        "def pack(x):\n    return [y for y in x if y]  # code",
        "best fit packing " * 40,
    ]
    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.BertNormalizer(lowercase=True)
    wordpiece.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]", "</s>"], show_progress=False)
    wordpiece.train_from_iterator(texts * 3, trainer)
    wordpiece.save(str(tmp_path / "wordpiece.json"))
    for path in (tokenizer_path, tmp_path / "wordpiece.json"):
        cfg = TokenizerConfig(path=str(path), add_eos=False)
        tok = read_tokenizer(cfg)
        flat, lengths = encode_flat(tok, cfg, texts)
        slow = [e.ids for e in tok.tokenizer.encode_batch(texts, add_special_tokens=False)]
        assert lengths.tolist() == [len(ids) for ids in slow]
        assert flat.tolist() == [t for ids in slow for t in ids]


def _units_read(
    units: list[Shard], cfg: InputConfig
) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    docs, rejects = [], []
    for unit in units:
        for b in read_shard(unit, cfg, 7):
            docs += list(zip(b.rows, b.ids, b.texts, strict=True))
            rejects += [(r.row, r.reason) for r in b.rejects]
    return docs, rejects


def test_a_large_parquet_file_is_read_as_runs_of_row_groups_with_the_whole_files_rows(tmp_path: Path) -> None:
    """work_units cuts a Parquet file over input.unit_bytes into runs of row groups (numbered after the
    files before it); reading every unit gives exactly the whole file's documents, rows, ids and
    rejects, and a whole-file reject is recorded once, not once a unit."""
    texts = [f"document {i} " * (i % 9) for i in range(500)]  # every 9th is empty: a reject
    big = tmp_path / "b-big.parquet"
    pq.write_table(pa.table({"text": texts}), big, row_group_size=40)  # 13 row groups
    small = tmp_path / "a-small.jsonl"
    write_jsonl(small, [{"text": "x"}])
    shards = expand_inputs((str(tmp_path / "*"),))
    cfg = input_config("parquet", unit_bytes=big.stat().st_size // 5)
    units = work_units(shards, cfg)
    assert [u.index for u in units] == list(range(len(units))) and units[0].relpath == "a-small.jsonl"
    parts = [u for u in units if u.relpath == "b-big.parquet"]
    assert 4 <= len(parts) <= 7 and parts[0].unit_start == 0 and parts[-1].unit_stop == 13
    assert all(a.unit_stop == b.unit_start for a, b in itertools.pairwise(parts))
    assert [u.first_row for u in parts] == [40 * u.unit_start for u in parts]
    whole = _units_read([shard_of(big, "b-big.parquet")], cfg)
    assert _units_read(parts, cfg) == whole and len(whole[1]) == 56
    assert work_units(shards, input_config("parquet")) == [  # under unit_bytes: whole files
        Shard(index=i, path=s.path, relpath=s.relpath, size=s.size, mtime_ns=s.mtime_ns)
        for i, s in enumerate(shards)
    ]
    # A file without the text column: one reject for the file, from its first unit only.
    wrong = tmp_path / "wrong" / "w.parquet"
    wrong.parent.mkdir()
    pq.write_table(pa.table({"content": texts}), wrong, row_group_size=40)
    units = work_units(expand_inputs((str(wrong),)), cfg)
    assert len(units) > 1
    assert _units_read(units, cfg) == ([], [(-1, "Parquet file has no column 'text' (columns: content)")])


_LINES = st.one_of(
    st.builds(lambda t: json.dumps({"text": t}), st.text(max_size=30)),  # documents, some empty
    st.sampled_from(["", "   ", "{bad json", "[1, 2]", '{"other": 1}', '{"text": 5}']),  # blanks, rejects
    st.builds(lambda n: json.dumps({"text": "long " * n}), st.integers(20, 60)),  # over max_document_bytes
)


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(_LINES, max_size=40),
    ending=st.sampled_from(["", "\n", "\n\n"]),
    unit_bytes=st.integers(1, 200),
)
def test_a_large_jsonl_file_is_read_as_byte_ranges_with_the_whole_files_lines(
    tmp_path_factory: pytest.TempPathFactory, lines: list[str], ending: str, unit_bytes: int
) -> None:
    """work_units cuts an uncompressed JSONL file over input.unit_bytes into byte ranges that begin at
    line starts and tile the file; reading every unit gives exactly the whole file's documents, line
    numbers, ids and rejects, whatever the lines (blank, malformed, longer than a unit, over
    max_document_bytes) and however the file ends."""
    path = tmp_path_factory.mktemp("ranges") / "big.jsonl"
    data = ("\n".join(lines) + ending).encode()
    path.write_bytes(data)
    cfg = input_config(unit_bytes=unit_bytes, max_document_bytes=150)
    units = work_units([shard_of(path, "big.jsonl")], cfg)
    assert [u.index for u in units] == list(range(len(units)))
    if len(units) > 1:
        assert units[0].unit_start == 0 and units[-1].unit_stop == len(data)
        assert all(a.unit_stop == b.unit_start for a, b in itertools.pairwise(units))
        assert all(data[u.unit_start - 1 : u.unit_start] == b"\n" for u in units[1:])
        assert [u.first_row for u in units] == [data[: u.unit_start].count(b"\n") for u in units]
    else:
        assert units == [shard_of(path, "big.jsonl")]
    whole = _units_read([shard_of(path, "big.jsonl")], input_config(max_document_bytes=150))
    assert _units_read(units, cfg) == whole


def test_compressed_and_text_files_stay_whole_units(tmp_path: Path) -> None:
    """A compressed stream can only be read from its start, and a text file is one document: neither is
    cut, whatever its size; an uncompressed JSONL file of the same size is."""
    rows = [{"text": f"document {i}"} for i in range(200)]
    write_jsonl(tmp_path / "a.jsonl", rows)
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    shards = expand_inputs((str(tmp_path / "*"),))
    units = work_units(shards, input_config(unit_bytes=100))
    assert [u.relpath for u in units].count("a.jsonl") > 10
    assert [(u.relpath, u.split) for u in units if u.relpath != "a.jsonl"] == [("b.jsonl.gz", False)]
    assert not any(u.split for u in work_units(shards, input_config("text", unit_bytes=100)))
    # The suffixes left whole are the ones pyarrow decompresses, and no others.
    for name in ("x.jsonl.gz", "x.jsonl.bz2", "x.jsonl.lz4", "x.jsonl.zst"):
        assert pa.Codec.detect(name) is not None and name.endswith(COMPRESSED_SUFFIXES)
    for name in ("x.jsonl", "x.json", "x.ndjson", "x.jsonl.br", "x.jsonl.xz"):
        with pytest.raises((TypeError, ValueError)):
            pa.Codec.detect(name)


def test_a_unit_size_that_makes_millions_of_tasks_is_refused(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "big.jsonl", [{"text": "x" * 1000} for _ in range(150)])  # ~151 KB
    shards = expand_inputs((str(tmp_path / "*"),))
    with pytest.raises(ConfigError, match=r"input.unit_bytes=1 would cut 1 files into 15\d,\d{3} work units"):
        work_units(shards, input_config(unit_bytes=1))
    assert len(work_units(shards, input_config(unit_bytes=10_000))) == 16
