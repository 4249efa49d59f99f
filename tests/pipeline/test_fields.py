"""Several text fields joined (input.text_fields) and per-document metadata kept (input.metadata_fields),
end to end on real files, a real tokenizer and the job's own runner: the packed tokens against
tokenizers' ids of the texts joined here, the rejects as the rule says, every document's metadata
read back through raypack.reader, verify, a token store, a mixture and a Ray Dataset; and a token
file's key, unchanged for a config that sets none of them."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

import raypack
from raypack.config import load_config
from raypack.corpus.units import WorkUnit
from raypack.errors import ConfigError
from raypack.pipeline.tokenize.token_files import token_key, token_settings
from raypack.reader import DocumentMetadata, document_metadata
from raypack.storage import Shard
from raypack.text.files import read_tokenizer
from tests.conftest import job_config, packed_documents, random_text, write_jsonl

FIELDS = ["source", "url", "language", "quality", "tag"]
SEPARATOR = "\n\n"


def quiet(_: str) -> None:
    pass


def _records(rng: random.Random, first: int, n: int, half: str) -> list[dict[str, Any]]:
    """Documents with a title and a body (a title missing, null or "" in some), and metadata: a
    language in the second half only, quality an int in the first half and a float in the second
    (double), tag an int in the first and a string in the second (string), a url missing in some.
    One body of ~3,000 words: several chunks at seq_len 512."""
    records = []
    for i in range(first, first + n):
        r: dict[str, Any] = {"body": random_text(rng, 3000 if i == first + 2 else rng.randint(1, 200))}
        if i % 4 != 1:
            r["title"] = [None, ""][i % 2] if i % 7 == 3 else random_text(rng, rng.randint(1, 8))
        r["source"] = f"crawl-{i % 3}"
        if i % 5:
            r["url"] = f"https://example.com/{i}"
        if half == "b":
            r["language"] = ["en", "fr"][i % 2]
        r["quality"] = i if half == "a" else i + 0.25
        r["tag"] = i if half == "a" else f"t{i}"
        records.append(r)
    return records


def _corpus(root: Path, fmt: str) -> tuple[Path, dict[str, dict[str, Any]], dict[tuple[str, int], str]]:
    """Two files of each half's records, and the records' rejects by the rule: a body that is not
    a string (jsonl only: a Parquet column holds one type), a record with neither field. Returns the
    corpus, each document's record by id and each reject's reason by (file, row)."""
    rng = random.Random(57)
    corpus = root / "corpus"
    corpus.mkdir()
    by_id: dict[str, dict[str, Any]] = {}
    rejects: dict[tuple[str, int], str] = {}
    for half, first in (("a", 0), ("b", 100)):
        records = _records(rng, first, 24, half)
        records.append({"source": "bad", "quality": 1})  # neither text field
        if fmt == "jsonl":
            records.append({"title": "a title", "body": 7, "quality": 1})
        name = f"{half}.{fmt}"
        if fmt == "jsonl":
            write_jsonl(corpus / name, records)
        else:
            if half == "a":  # a file without the title and language columns: missing in every row
                records = [{k: v for k, v in r.items() if k not in ("title", "language")} for r in records]
            keys = list(dict.fromkeys(k for r in records for k in r))  # (from_pylist: the first's)
            pq.write_table(pa.table({k: [r.get(k) for r in records] for k in keys}), corpus / name)
        for row, r in enumerate(records, start=1 if fmt == "jsonl" else 0):
            present = [r[f] for f in ("title", "body") if r.get(f) is not None]
            if not present:
                rejects[(name, row)] = "no text field present (all missing or null: 'title', 'body')"
            elif not all(isinstance(v, str) for v in present):
                rejects[(name, row)] = "text field 'body' is int, not a string"
            else:
                by_id[f"{name}:{row}"] = r
    return corpus, by_id, rejects


def _joined(record: dict[str, Any]) -> str:
    """The rule, written apart from raypack: the fields present and not empty, in order."""
    return SEPARATOR.join(record[f] for f in ("title", "body") if record.get(f))


def _expected_metadata(record: dict[str, Any]) -> dict[str, Any]:
    """A record's metadata as the dataset types it: quality double, tag string (ints as text)."""
    tag = record.get("tag")
    return {
        "source": record.get("source"),
        "url": record.get("url"),
        "language": record.get("language"),
        "quality": float(record["quality"]),
        "tag": tag if isinstance(tag, str) else json.dumps(tag),
    }


def _tokens(tokenizer: Path, texts: dict[str, str]) -> dict[str, list[int]]:
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    return {k: [*tok.encode(t, add_special_tokens=False).ids, eos] for k, t in texts.items()}


def _rejects(out: Path) -> dict[tuple[str, int], str]:
    found = {}
    for path in sorted((out / "rejects").glob("*.parquet")):
        for r in pq.read_table(path).to_pylist():
            found[(r["source"], r["row"])] = r["reason"]
    return found


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_joined_fields_pack_their_tokens_and_every_documents_metadata_reads_back(
    tmp_path: Path, tokenizer_path: Path, fmt: str
) -> None:
    corpus, by_id, rejects = _corpus(tmp_path, fmt)
    inputs = {"format": fmt, "text_fields": ["title", "body"], "metadata_fields": FIELDS}
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={**inputs, "max_reject_ratio": 0.1})
    cfg = load_config(str(path))
    record = raypack.pack(cfg, log=quiet)
    out = tmp_path / "out"
    assert record.documents == len(by_id) and _rejects(out) == rejects

    # Token conservation against tokenizers' ids of the texts joined here.
    expected = _tokens(tokenizer_path, {doc_id: _joined(r) for doc_id, r in by_id.items()})
    assert packed_documents(out) == expected

    manifest = json.loads((out / "manifest.json").read_text())
    types = {"source": "string", "url": "string", "language": "string", "quality": "double", "tag": "string"}
    assert manifest["metadata"] == {"column": "metadata", "fields": FIELDS, "types": types}
    # Every index file of one type: index/ reads as one table, whichever file a unit's values made.
    kinds = {str(pq.read_schema(p).field("metadata").type) for p in (out / "index").glob("*.parquet")}
    assert kinds == {
        str(pa.struct([(f, pa.string() if t == "string" else pa.float64()) for f, t in types.items()]))
    }

    table = document_metadata(str(out))
    assert table.column_names == ["doc_id", *FIELDS]
    want = {doc_id: _expected_metadata(r) for doc_id, r in by_id.items()}
    assert {r.pop("doc_id"): r for r in table.to_pylist()} == want

    # Beside the packs: each item's document, chunks of a long one included, by its doc_ids.
    meta = DocumentMetadata(str(out))
    chunked = 0
    for p in sorted((out / "data").glob("*.parquet")):
        for pack in pq.read_table(p, columns=["doc_ids", "chunk_index"]).to_pylist():
            assert meta.of(pack["doc_ids"]) == [want[d] for d in pack["doc_ids"]]
            chunked += sum(1 for c in pack["chunk_index"] if c > 0)
    assert chunked >= 2

    report = raypack.verify(str(out), cfg, sample=len(by_id))
    assert report.ok, report.problems
    assert report.sampled == len(by_id)


def test_metadata_is_the_same_whatever_units_the_corpus_is_cut_into(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A unit a file (each file's values typed alone, then unified across files) and one run of both
    files (typed together): the same index metadata."""
    corpus, _, _ = _corpus(tmp_path, "jsonl")
    inputs = {"text_fields": ["title", "body"], "metadata_fields": FIELDS, "max_reject_ratio": 0.1}
    tables = []
    for file_units in (True, False):
        sections: dict[str, Any] = {"input": inputs, "output": {"path": str(tmp_path / f"out-{file_units}")}}
        raypack.pack(
            str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, file_units, **sections)), log=quiet
        )
        manifest = json.loads((tmp_path / f"out-{file_units}" / "manifest.json").read_text())
        assert manifest["counts"]["shards"] == (2 if file_units else 1)
        tables.append(document_metadata(str(tmp_path / f"out-{file_units}")))
    assert tables[0].equals(tables[1])


def test_metadata_comes_back_from_a_token_store_and_verify_sees_it_changed(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(1)
    records = [{"text": random_text(rng, 50), "url": f"u{i}", "score": i / 2} for i in range(30)]
    write_jsonl(corpus / "a.jsonl", records)
    store = tmp_path / "store"
    sections = {"input": {"metadata_fields": ["url", "score"]}, "cache": {"path": str(store)}}
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, **sections)
    raypack.pack(str(path), log=quiet)
    first = document_metadata(str(tmp_path / "out"))
    assert sorted(p.name.split(".", 1)[1] for p in store.rglob("*.*parquet")) == ["metadata.parquet"]
    again = raypack.pack(str(path), overwrite=True, log=quiet)
    assert again.shards_reused == 1
    assert document_metadata(str(tmp_path / "out")).equals(first)
    assert first.column("score").to_pylist() == [i / 2 for i in range(30)]

    # The input's metadata changed since (the same bytes' length): verify's sample says so.
    records[3]["url"] = "v3"
    write_jsonl(corpus / "a.jsonl", records)
    report = raypack.verify(str(tmp_path / "out"), str(path), sample=30)
    assert not report.ok
    assert any("metadata in the index is" in p and "a.jsonl:4" in p for p in report.problems), report.problems


def test_a_mixtures_sources_join_and_keep_their_own_fields(tmp_path: Path, tokenizer_path: Path) -> None:
    """Source a inherits input.text_fields and metadata_fields; source b reads its own text_field
    and keeps its own metadata; the index's metadata is both sources' fields, null where a source
    keeps none. A document repeated twice is one row of document_metadata."""
    rng = random.Random(2)
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = [{"title": f"T{i}", "body": random_text(rng, 40), "url": f"u{i}"} for i in range(12)]
    b = [{"text": random_text(rng, 40), "quality": i % 3 == 0} for i in range(12)]
    write_jsonl(tmp_path / "a" / "a.jsonl", a)
    write_jsonl(tmp_path / "b" / "b.jsonl", b)
    config = {
        "input": {
            "text_fields": ["title", "body"],
            "metadata_fields": ["url"],
            "sources": [
                {"name": "a", "paths": [str(tmp_path / "a" / "*.jsonl")]},
                {
                    "name": "b",
                    "paths": [str(tmp_path / "b" / "*.jsonl")],
                    "text_field": "text",
                    "metadata_fields": ["quality"],
                    "repeat": 2,
                },
            ],
        },
        "tokenizer": {"path": str(tokenizer_path)},
        "pack": {"seq_len": 512},
        "output": {"path": str(tmp_path / "out")},
    }
    raypack.pack(config, log=quiet)
    out = tmp_path / "out"
    texts = {f"a/a.jsonl:{i + 1}": f"T{i}{SEPARATOR}{r['body']}" for i, r in enumerate(a)}
    texts |= {f"b/b.jsonl:{i + 1}": r["text"] for i, r in enumerate(b)}
    expected = _tokens(tokenizer_path, texts)
    # (packed_documents joins a document's items: b's two copies, one after the other.)
    assert packed_documents(out) == {k: v * (2 if k.startswith("b/") else 1) for k, v in expected.items()}
    rows = {r.pop("doc_id"): r for r in document_metadata(str(out)).to_pylist()}
    want = {f"a/a.jsonl:{i + 1}": {"url": f"u{i}", "quality": None} for i in range(12)}
    want |= {f"b/b.jsonl:{i + 1}": {"url": None, "quality": i % 3 == 0} for i in range(12)}
    assert rows == want
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metadata"]["types"] == {"url": "string", "quality": "bool"}
    assert raypack.verify(str(out), config, sample=24).ok


@pytest.mark.parametrize(
    ("inputs", "says"),
    [
        (
            {"text_field": "body", "text_fields": ["title", "body"]},
            "give input.text_field or input.text_fields",
        ),
        ({"text_fields": ["title", "title"]}, "input.text_fields names 'title' twice"),
        ({"text_fields": ["title"], "messages_field": "messages"}, "conversations"),
        ({"format": "text", "metadata_fields": ["url"]}, "format text reads a file a document"),
        ({"metadata_fields": [""]}, "input.metadata_fields must not hold an empty name"),
        (
            {"sources": [{"name": "a", "paths": ["x/*"], "text_field": "t", "text_fields": ["a", "b"]}]},
            "input.sources[a]: give text_field or text_fields, not both",
        ),
    ],
)
def test_a_bad_combination_is_a_one_line_config_error(inputs: dict[str, Any], says: str) -> None:
    config = {"input": {"paths": ["x/*"], **inputs}, "tokenizer": {"path": "t"}, "output": {"path": "o"}}
    if "sources" in inputs:
        del config["input"]["paths"]
    with pytest.raises(ConfigError, match=pytest.importorskip("re").escape(says)) as e:
        load_config(config)
    assert "\n" not in str(e.value)


def test_a_text_source_reads_none_of_the_fields_it_inherits() -> None:
    """A text file is one document with no fields: a text source that inherits text_fields or
    metadata_fields reads its files whole (metadata null); one that names them is refused."""
    sources = [{"name": "j", "paths": ["j/*"]}, {"name": "t", "paths": ["t/*"], "format": "text"}]
    config = {
        "input": {"text_fields": ["title", "body"], "metadata_fields": ["url"], "sources": sources},
        "tokenizer": {"path": "t"},
        "output": {"path": "o"},
    }
    cfg = load_config(config)
    assert cfg.input.reading("j").text_fields == ("title", "body") and cfg.input.reading("j").metadata_fields
    assert cfg.input.reading("t").text_fields == () == cfg.input.reading("t").metadata_fields
    assert cfg.input.metadata_columns == ("url",)
    sources[1]["metadata_fields"] = ["url"]
    with pytest.raises(ConfigError, match=r"input.sources\[t\].metadata_fields: format text reads a file"):
        load_config(config)


def _word_tokenizer(path: Path) -> Path:
    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "a": 1, "b": 2, "[UNK]": 3}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return path


def test_a_token_files_key_is_unchanged_unless_a_new_field_is_set(tmp_path: Path) -> None:
    """Keys computed before text_fields, text_separator and metadata_fields existed (commit 216e8b1,
    the tokenizers library's version and the tokenizer's hash fixed): a config that sets none of
    them keys its units as then, so every existing token store stays valid. Setting one changes the
    key. (A bump of TOKEN_FORMAT or READ_VERSION changes these on purpose.)"""
    tokenizer = _word_tokenizer(tmp_path / "tokenizer.json")

    def key(content: bool = False, **inputs: Any) -> str:
        cfg = load_config(
            {
                "input": {"paths": ["/x/*.jsonl"], **inputs},
                "tokenizer": {"path": str(tokenizer)},
                "output": {"path": str(tmp_path / "out")},
            }
        )
        reading = cfg.input.reading()
        settings = token_settings(cfg, read_tokenizer(cfg.tokenizer, cfg.storage), reading)
        settings |= {"library": "tokenizers 0.0.0", "tokenizer_sha256": "0" * 64}
        unit = WorkUnit(Shard(index=0, path="/x/a.jsonl", relpath="a.jsonl", size=10, mtime_ns=5), reading)
        return token_key(unit, settings, ["d" * 64] if content else None)

    assert key() == "1d05d207dd452c1ecc86b886a54997df"
    assert key(content=True) == "a175fe326b40c6fb9780662a68dd80da"
    assert key(id_field="id") == "2daeb7552fc33ea6c9e47c867a74ec13"
    # A separator alone joins nothing: the key is as before.
    assert key(text_separator="\n") == key()
    changed = [
        key(text_fields=["title", "body"]),
        key(text_fields=["body", "title"]),
        key(text_fields=["title", "body"], text_separator="\n"),
        key(metadata_fields=["url"]),
    ]
    assert len({key(), *changed}) == 5


@pytest.mark.ray
def test_a_ray_datasets_columns_are_joined_and_kept(tmp_path: Path, tokenizer_path: Path) -> None:
    import ray.data

    rng = random.Random(3)
    rows = [
        {
            "title": None if i % 3 == 0 else f"T{i}",
            "body": random_text(rng, 30),
            "lang": ["en", "de"][i % 2],
            "score": None if i < 16 else i + 0.5,  # the first unit's all null, the others' floats
        }
        for i in range(40)
    ]
    config = {
        "input": {
            "text_fields": ["title", "body"],
            "metadata_fields": ["lang", "url", "score"],
            "unit_rows": 16,
        },
        "tokenizer": {"path": str(tokenizer_path)},
        "pack": {"seq_len": 512},
        "output": {"path": str(tmp_path / "out")},
    }
    raypack.pack(config, dataset=ray.data.from_items(rows), log=quiet)
    out = tmp_path / "out"
    texts = {f"dataset:{i}": _joined(r) for i, r in enumerate(rows)}
    assert packed_documents(out) == _tokens(tokenizer_path, texts)
    # `url` is no column of the Dataset: null in every row, as a Parquet file without it.
    found = {r.pop("doc_id"): r for r in document_metadata(str(out)).to_pylist()}
    want = {f"dataset:{i}": {"lang": r["lang"], "url": None, "score": r["score"]} for i, r in enumerate(rows)}
    assert found == want
    # The Ray tasks wrote the first unit's index again, its null scores as doubles.
    assert {str(pq.read_schema(p).field("metadata").type) for p in (out / "index").glob("*.parquet")} == {
        "struct<lang: string, url: null, score: double>"
    }
