"""Ray Datasets as input: raypack.pack(config, dataset=ds) with real Ray Data sources
(read_parquet, read_json, from_items), a filter, a repartition, two Datasets and a file source in
one mixture, chat rows; the bytes against the same rows as files, tokens against tokenizers, and
the errors a user meets."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

import raypack
from raypack.cli import main
from raypack.errors import ConfigError
from tests.chatdata import chat_model, conversation
from tests.conftest import packed_documents, random_text, write_jsonl

pytestmark = pytest.mark.ray


def quiet(_: str) -> None:
    pass


def _digests(out: Path, part: str = "") -> dict[str, str]:
    """sha256 of every file under out/part but the run's own records (timings, its path)."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((out / part).rglob("*"))
        if p.is_file() and p.name not in ("metrics.json", "report.html", "manifest.json")
    }


def _config(out: Path, tokenizer: Path | str, **inputs: Any) -> dict[str, Any]:
    return {
        "input": inputs,
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": 512},
        "output": {"path": str(out), "shard_rows": 40},
    }


def _tokens(tokenizer: Path, texts: dict[str, str]) -> dict[str, list[int]]:
    """Each text's ids and EOS, from tokenizers directly."""
    tok = Tokenizer.from_file(str(tokenizer))
    eos = tok.token_to_id("<|endoftext|>")
    return {k: [*tok.encode(t, add_special_tokens=False).ids, eos] for k, t in texts.items()}


@pytest.fixture(scope="module")
def parquet_corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """3 Parquet files of 400 documents (1-3,000 words) with an id and a language column."""
    root = tmp_path_factory.mktemp("dscorpus")
    rng = random.Random(41)
    texts: dict[str, str] = {}
    for f in range(3):
        ids = [f"doc-{f}-{i}" for i in range(400)]
        rows = [random_text(rng, int(rng.lognormvariate(4.5, 1.2)) + 1) for _ in ids]
        texts.update(zip(ids, rows, strict=True))
        langs = ["en" if i % 3 else "fr" for i in range(400)]
        pq.write_table(
            pa.table({"text": rows, "id": ids, "lang": langs}), root / f"p{f}.parquet", row_group_size=150
        )
    return root, texts


def test_a_parquet_dataset_packs_as_its_files_whatever_its_blocks(
    tmp_path: Path, tokenizer_path: Path, parquet_corpus: tuple[Path, dict[str, str]]
) -> None:
    """The same rows as files, as read_parquet's Dataset, and as that Dataset cut into other blocks
    (repartition, and a filter that keeps every row): the data files are byte-identical in all
    three, the two Datasets' whole outputs are, every document's tokens are tokenizers' own, and
    verify re-tokenizes a sample read from the Dataset."""
    import ray

    corpus, texts = parquet_corpus
    files = raypack.pack(
        _config(
            tmp_path / "files", tokenizer_path, paths=[f"{corpus}/*.parquet"], format="parquet", id_field="id"
        ),
        log=quiet,
    )
    cfg = _config(tmp_path / "a", tokenizer_path, id_field="id", unit_rows=250)
    one = raypack.pack(cfg, dataset=ray.data.read_parquet(str(corpus)), log=quiet)
    reblocked = ray.data.read_parquet(str(corpus)).repartition(7).filter(lambda r: True)
    other = raypack.pack(
        _config(tmp_path / "b", tokenizer_path, id_field="id", unit_rows=250), dataset=reblocked, log=quiet
    )
    assert one.runner["name"] == "ray"
    assert _digests(tmp_path / "a") == _digests(tmp_path / "b")
    assert _digests(tmp_path / "a", "data") == _digests(tmp_path / "files", "data")
    assert packed_documents(tmp_path / "a") == _tokens(tokenizer_path, texts)
    assert one.documents == files.documents == other.documents == 1200
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert [e["rows"] for e in manifest["inputs"]] == [[a, min(a + 250, 1200)] for a in range(0, 1200, 250)]
    assert "a Ray Dataset of 1,200 rows in 5 work units" in (tmp_path / "a" / "report.html").read_text()
    checked = raypack.verify(str(tmp_path / "a"), cfg, dataset=ray.data.read_parquet(str(corpus)))
    assert checked.ok and checked.sampled == 64, checked.problems
    # Without the Dataset (the config pack was given) the sample cannot be re-read: said, not
    # skipped silently.
    alone = raypack.verify(str(tmp_path / "a"), cfg)
    assert alone.ok and alone.sampled == 0 and "was a Ray Dataset" in alone.warnings[0]
    # Other rows than the job's, fewer or moved: named as the Dataset's change, not the packs'.
    fewer = raypack.verify(str(tmp_path / "a"), cfg, dataset=ray.data.read_parquet(str(corpus)).limit(1000))
    assert not fewer.ok and "does not hold the rows the job read" in fewer.problems[0]
    moved = raypack.verify(
        str(tmp_path / "a"), cfg, dataset=ray.data.read_parquet(str(corpus)).random_shuffle()
    )
    assert not moved.ok and "gives other rows than when it was packed" in moved.problems[0], moved.problems


def test_a_filtered_json_dataset_numbers_its_rows_and_records_its_rejects(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """read_json, then a filter: without an id column a document's id is its row's place in the
    filtered Dataset; empty and null texts are recorded rejects, and every row is either packed,
    token for token, or rejected."""
    import ray

    rng = random.Random(7)
    records: list[dict[str, Any]] = []
    for i in range(900):
        text: str | None = random_text(rng, rng.randint(1, 1500))
        if i % 97 == 5:
            text = "   "
        if i % 113 == 7:
            text = None
        records.append({"text": text, "keep": i % 4 != 0})
    (tmp_path / "in").mkdir()
    write_jsonl(tmp_path / "in" / "a.jsonl", records[:500])
    write_jsonl(tmp_path / "in" / "b.jsonl", records[500:])
    ds = ray.data.read_json(str(tmp_path / "in")).filter(lambda r: r["keep"])
    kept = [r for r in records if r["keep"]]
    cfg = _config(tmp_path / "out", tokenizer_path, unit_rows=200, max_reject_ratio=0.05)
    result = raypack.pack(cfg, dataset=ds, log=quiet)
    bad = {f"dataset:{i}" for i, r in enumerate(kept) if not (r["text"] or "").strip()}
    good = {f"dataset:{i}": r["text"] for i, r in enumerate(kept) if (r["text"] or "").strip()}
    assert len(bad) >= 4 and result.documents == len(good)
    assert packed_documents(tmp_path / "out") == _tokens(tokenizer_path, good)
    rejects = pq.read_table(tmp_path / "out" / "rejects").to_pylist()
    assert sorted(f"dataset:{r['row']}" for r in rejects) == sorted(bad)
    assert {r["source"] for r in rejects} == {"dataset"}
    nulls = {i for i, r in enumerate(kept) if r["text"] is None}
    want = {
        i: "text field 'text' is null" if i in nulls else "whitespace-only document" for i in range(len(kept))
    }
    assert nulls and all(r["reason"] == want[r["row"]] for r in rejects), rejects
    assert raypack.verify(str(tmp_path / "out"), cfg, dataset=ds).ok


def test_two_datasets_and_a_file_source_in_one_mixture(
    tmp_path: Path, tokenizer_path: Path, parquet_corpus: tuple[Path, dict[str, str]]
) -> None:
    """Sources of input.sources without paths take their Datasets by name, beside a source of
    files: ids carry each source's name, the mixture's rule holds for each, verify checks it."""
    import ray

    corpus, texts = parquet_corpus
    rng = random.Random(3)
    (tmp_path / "code").mkdir()
    write_jsonl(
        tmp_path / "code" / "c.jsonl", [{"text": random_text(rng, rng.randint(5, 400))} for _ in range(150)]
    )
    base = ray.data.read_parquet(str(corpus))
    datasets = {
        "en": base.filter(lambda r: r["lang"] == "en"),
        "fr": base.filter(lambda r: r["lang"] == "fr"),
    }
    cfg = _config(tmp_path / "out", tokenizer_path, id_field="id", unit_rows=300)
    cfg["input"]["sources"] = [
        {"name": "en", "weight": 0.5},
        {"name": "fr", "weight": 0.3},
        {"name": "code", "paths": [str(tmp_path / "code" / "*.jsonl")], "weight": 0.2, "id_field": ""},
    ]
    cfg["input"]["tokens"] = 150_000
    result = raypack.pack(cfg, dataset=datasets, log=quiet)
    shares = {s["name"]: s for s in result.mixture["sources"]}
    assert set(shares) == {"en", "fr", "code"}
    packed = packed_documents(tmp_path / "out")
    assert any(k.startswith("code/c.jsonl:") for k in packed)
    expected = _tokens(tokenizer_path, {k: texts[k] for k in packed if k.startswith("doc-")})
    assert {k: v for k, v in packed.items() if k.startswith("doc-")} == expected
    fr = {k for k in packed if k.startswith("doc-")} - {
        f"doc-{f}-{i}" for f in range(3) for i in range(400) if i % 3
    }
    assert fr and all(shares[name]["copies"] > 0 for name in shares)
    checked = raypack.verify(str(tmp_path / "out"), cfg, dataset=datasets)
    assert checked.ok and checked.sampled > 0, checked.problems


def test_chat_rows_pack_as_the_same_conversations_in_a_jsonl_file(tmp_path: Path) -> None:
    """Conversations as a Dataset's list<struct> column mask and pack as the same conversations
    in a JSONL file."""
    import ray

    model = chat_model(tmp_path / "model")
    rows = [
        {"id": f"c{i}", "messages": [{"role": m["role"], "content": m["content"] or ""} for m in conv]}
        for i, conv in enumerate(conversation(random.Random(5), k) for k in range(300))
        if not any("tool_calls" in m for m in conv)
    ]
    (tmp_path / "chat").mkdir()
    write_jsonl(tmp_path / "chat" / "c.jsonl", rows)
    inputs = {"messages_field": "messages", "id_field": "id"}
    setup = {"tokenizer": {"path": str(model)}, "pack": {"seq_len": 256, "overflow": "truncate"}}
    files = {**setup, "input": {**inputs, "paths": [str(tmp_path / "chat" / "*.jsonl")]}}
    raypack.pack({**files, "output": {"path": str(tmp_path / "files")}}, log=quiet)
    cfg = {**setup, "input": {**inputs, "unit_rows": 64}, "output": {"path": str(tmp_path / "ds")}}
    raypack.pack(cfg, dataset=ray.data.from_items(rows, override_num_blocks=5), log=quiet)
    assert _digests(tmp_path / "ds", "data") == _digests(tmp_path / "files", "data")
    assert raypack.verify(str(tmp_path / "ds"), cfg, dataset=ray.data.from_items(rows)).ok


def test_what_a_dataset_user_gets_wrong_is_one_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    ds = ray.data.from_items([{"body": "some text", "n": 1}, {"body": "more", "n": 2}])
    cfg = _config(tmp_path / "out", tokenizer_path)
    with pytest.raises(
        ConfigError, match=r"the Dataset has no column 'text' \(input.text_field\); its columns: body, n"
    ):
        raypack.pack(cfg, dataset=ds, log=quiet)
    with pytest.raises(ConfigError, match=r"column 'n' is int64, not a string"):
        raypack.pack(_config(tmp_path / "out", tokenizer_path, text_field="n"), dataset=ds, log=quiet)
    with pytest.raises(ConfigError, match=r"no column 'doc' \(input.id_field\)"):
        raypack.pack(_config(tmp_path / "out", tokenizer_path, text_field="body", id_field="doc"), dataset=ds)
    good = _config(tmp_path / "out", tokenizer_path, text_field="body")
    with pytest.raises(ConfigError, match=r"run.executor local cannot read it"):
        raypack.pack({**good, "run": {"executor": "local"}}, dataset=ds, log=quiet)
    with pytest.raises(ConfigError, match=r"cache.path: a token store"):
        raypack.pack({**good, "cache": {"path": str(tmp_path / "store")}}, dataset=ds, log=quiet)
    with pytest.raises(ConfigError, match=r"leave input.paths out"):
        raypack.pack(_config(tmp_path / "out", tokenizer_path, paths=["x/*"]), dataset=ds, log=quiet)
    with pytest.raises(ConfigError, match=r"'web', which is no source of input.sources"):
        raypack.pack(good, dataset={"web": ds}, log=quiet)
    with pytest.raises(TypeError, match=r"takes a ray.data.Dataset, not list"):
        raypack.pack(good, dataset=[{"body": "x"}], log=quiet)
    assert not (tmp_path / "out").exists()
    # A config that names Datasets, given to the command: one line, exit 2.
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**good, "input": {**good["input"], "datasets": [""]}}))
    capsys.readouterr()
    assert main(["pack", str(path)]) == 2
    # (Lines of Ray's workers, "(task pid=...)", may reach this process's stderr at any time.)
    err = [line for line in capsys.readouterr().err.splitlines() if "pid=" not in line]
    assert len(err) == 1 and "only raypack.pack(config, dataset=...) can pass" in err[0], err
    # Values that are not text in a column of Python objects (pandas' mixed column), and a text
    # over input.max_document_bytes in UTF-8 bytes though not in characters: rejects with reasons.
    import pandas as pd

    texts: list[Any] = [f"text {i} " * 20 for i in range(60)] + [12345, 3.5, "日本語" * 400]
    mixed = ray.data.from_pandas(pd.DataFrame({"body": texts}))
    limits = {"max_document_bytes": 2000, "max_reject_ratio": 0.1}
    result = raypack.pack(
        _config(tmp_path / "mixed", tokenizer_path, text_field="body", **limits), dataset=mixed, log=quiet
    )
    assert result.documents == 60
    reasons = {r["row"]: r["reason"] for r in pq.read_table(tmp_path / "mixed" / "rejects").to_pylist()}
    assert reasons[60] == "text field 'body' is int, not a string"
    assert reasons[61] == "text field 'body' is float, not a string"
    assert reasons[62] == "text of 3,600 bytes, over input.max_document_bytes (2,000)"


def test_a_dataset_whose_pipeline_fails_leaves_no_staged_rows(tmp_path: Path, tokenizer_path: Path) -> None:
    """The Dataset's rows are staged as files under the output's staging area; when its own
    pipeline fails partway (the user's map_batches raising), the error is the user's and the staged
    copy goes with the staging area, as when raypack's own checks fail."""
    import ray

    rng = random.Random(3)
    rows = [{"text": random_text(rng, 50), "n": i} for i in range(2_000)]

    def boom(batch: dict[str, Any]) -> dict[str, Any]:
        if 1_500 in list(batch["n"]):
            raise RuntimeError("boom in the user's map_batches")
        return batch

    ds = ray.data.from_items(rows, override_num_blocks=8).map_batches(boom, batch_size=100)
    out = tmp_path / "out"
    with pytest.raises(Exception, match="boom in the user's map_batches"):
        raypack.pack(_config(out, tokenizer_path), dataset=ds, log=quiet)
    assert not (out / "_staging").exists() and not (out / "manifest.json").exists()
