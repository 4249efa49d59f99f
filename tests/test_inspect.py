"""`raypack inspect` against real job outputs: a pack's items are the reader's (ids, boundaries,
padding), their text is what tokenizers decodes and, for a document whole in one pack, the source
document's text; chat packs mark their untrained tokens; megatron shows the same packs; bad inputs
are one line and exit 2."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from tokenizers import Tokenizer

from raypack.cli import main
from raypack.config import InputConfig, load_config
from raypack.corpus.readers import read_unit
from raypack.corpus.units import WorkUnit
from raypack.formats import Packs, read_packs, spec_of
from raypack.inspector import ELIDE_CHARS, inspect_pack, render
from raypack.pipeline.job import run_job
from raypack.storage import Shard
from tests.chatdata import chat_model, conversation
from tests.conftest import make_corpus, train_tokenizer, write_jsonl

SEQ = 512
PAD = 2  # <|pad|> of the session tokenizer
EOS = "<|endoftext|>"
quiet = {"log": lambda _: None}


def _pack(tmp: Path, name: str, inputs: dict[str, Any], tokenizer: Path, **sections: dict[str, Any]) -> Path:
    data: dict[str, Any] = {
        "input": inputs,
        "tokenizer": {"path": str(tokenizer), "concurrency": 1},
        "pack": {"seq_len": SEQ},
        "output": {"path": str(tmp / name), "shard_rows": 20, "pad_id": PAD},
    }
    for key, values in sections.items():
        data[key] = {**data.get(key, {}), **values}
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(data))
    run_job(load_config(str(config)), **quiet)
    return tmp / name


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Any]:
    """A corpus (documents up to ~3,000 words: some cut into chunks) packed as parquet and megatron."""
    tmp = tmp_path_factory.mktemp("inspect")
    corpus = make_corpus(tmp, shards=2, docs_per_shard=20, seed=3)
    inputs = {"paths": [f"{corpus}/*"], "group_bytes": 0}
    out = {
        fmt: _pack(tmp, fmt, inputs, tokenizer_path, output={"format": fmt})
        for fmt in ("parquet", "megatron")
    }
    return {"tmp": tmp, "corpus": corpus, "out": out, "texts": _texts(corpus), "tokenizer": tokenizer_path}


@pytest.fixture(scope="module")
def chat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Conversations (system prompts, tool calls, multi-byte text) packed with their loss mask."""
    tmp = tmp_path_factory.mktemp("inspect-chat")
    model = chat_model(tmp / "model")
    rng = random.Random(1)
    write_jsonl(tmp / "chat.jsonl", [{"messages": conversation(rng, i)} for i in range(30)])
    inputs = {"paths": [str(tmp / "chat.jsonl")], "messages_field": "messages"}
    return _pack(
        tmp, "chat", inputs, model, pack={"seq_len": 256, "overflow": "truncate"}, output={"pad_id": 0}
    )


def _texts(corpus: Path) -> dict[str, str]:
    """Every source document's text, by id, as raypack's input reader reads it."""
    reading = InputConfig(paths=("unused",)).reading()
    texts = {}
    for path in sorted(corpus.iterdir()):
        shard = Shard(index=0, path=str(path), relpath=path.name, size=0, mtime_ns=0)
        for batch in read_unit(WorkUnit(shard, reading), 1000):
            texts.update(zip(batch.ids, batch.texts, strict=True))
    return texts


def _reader_packs(out: Path) -> list[tuple[np.ndarray, np.ndarray | None, dict[str, Any]]]:
    """Every pack as raypack's format reader gives it (files in path order): tokens, mask, index row."""
    manifest = json.loads((out / "manifest.json").read_text())
    packs: list[tuple[np.ndarray, np.ndarray | None, dict[str, Any]]] = []
    for f in sorted(manifest["files"], key=lambda f: f["path"]):
        file: Packs = read_packs(str(out), f, spec_of(manifest), None)
        rows = file.index.to_pylist()
        for p in range(file.rows):
            mask = file.loss_mask[p] if file.loss_mask is not None else None
            packs.append((file.input_ids[p], mask, rows[p]))
    return packs


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["inspect", *args, "--json"]) == 0
    record: dict[str, Any] = json.loads(capsys.readouterr().out)
    return record


def _index(out: Path) -> dict[str, tuple[int, int]]:
    table = pq.read_table(out / "index", columns=["doc_id", "chunks", "length"])
    return {
        d: (c, n) for d, c, n in zip(*(table.column(k).to_pylist() for k in table.column_names), strict=True)
    }


def test_every_pack_s_items_are_the_reader_s_and_decode_to_their_documents(
    plain: dict[str, Any], tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Items, boundaries, ids, padding and chunk counts as the reader and the index give them; each
    item's text is tokenizers' decode of its ids, and a whole document's is its source text + EOS."""
    out = plain["out"]["parquet"]
    tok = Tokenizer.from_file(str(tokenizer_path))
    index = _index(out)
    packs = _reader_packs(out)
    whole, chunks = 0, set()
    for number, (ids, _, row) in enumerate(packs):
        record = _json(capsys, str(out), str(number))
        assert (record["pack"], record["packs"], record["capacity"]) == (number, len(packs), SEQ)
        assert record["padding"] == SEQ - row["num_tokens"] and record["pad_id"] == PAD
        assert [i["doc_id"] for i in record["items"]] == row["doc_ids"]
        assert [i["chunk_index"] for i in record["items"]] == row["chunk_index"]
        assert [i["start"] for i in record["items"]] + [record["items"][-1]["end"]] == row["doc_offsets"]
        for item in record["items"]:
            assert item["ids"] == ids[item["start"] : item["end"]].tolist()
            assert item["text"] == tok.decode(item["ids"], skip_special_tokens=False)
            assert (item["chunks"], item["document_tokens"]) == index[item["doc_id"]]
            chunks.add(item["chunks"])
            if item["chunks"] == 1:
                assert item["text"] == plain["texts"][item["doc_id"]] + EOS
                whole += 1
    assert whole >= 30 and chunks > {1}  # and some documents cut into chunks


def test_the_text_view_shows_documents_markers_chunks_and_padding(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = plain["out"]["parquet"]
    packs = _reader_packs(out)
    for number, (_, _, row) in enumerate(packs):
        assert main(["inspect", str(out), str(number), "--full"]) == 0
        shown = capsys.readouterr().out
        assert f"pack {number} (of 0..{len(packs) - 1}): data/part-00000.parquet row {number};" in shown
        for doc_id, chunk in zip(row["doc_ids"], row["chunk_index"], strict=True):
            header = re.search(rf"^── item \d+ · {re.escape(doc_id)} · (.*)$", shown, re.MULTILINE)
            assert header is not None
            if "whole document" in header.group(1):
                assert f"\n{plain['texts'][doc_id]}⟨eos⟩\n" in shown
            else:
                assert f"chunk_index {chunk} of " in header.group(1)
        pad = SEQ - row["num_tokens"]
        positions = f"{pad} position{'s' if pad != 1 else ''}"
        want = f"── padding: {positions} at the end, of id {PAD} (⟨pad⟩ <|pad|>)" if pad else "── no padding"
        assert shown.rstrip().endswith(want)
    assert "tokenizer  " in shown and "⟨eos⟩ 0 <|endoftext|>" in shown


def test_alignment_padding_is_shown_after_each_item_and_apart_from_the_end(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    """pack.pad_multiple: each item's padding up to the next multiple is shown after it, the
    pack's end padding apart, and the positions add up to the pack's capacity."""
    out = _pack(
        plain["tmp"],
        "aligned",
        {"paths": [f"{plain['corpus']}/*"], "group_bytes": 0},
        plain["tokenizer"],
        pack={"pad_multiple": 16},
    )
    seen = 0
    for number in range(len(_reader_packs(out))):
        record = _json(capsys, str(out), str(number))
        items = record["items"]
        assert [i["padded_end"] % 16 for i in items] == [0] * len(items)
        assert [i["start"] for i in items[1:]] == [i["padded_end"] for i in items[:-1]]
        aligned = sum(i["padded_end"] - i["end"] for i in items)
        assert record["end_padding"] == SEQ - items[-1]["padded_end"]
        assert record["num_tokens"] + aligned + record["end_padding"] == SEQ
        assert main(["inspect", str(out), str(number)]) == 0
        shown = capsys.readouterr().out
        if aligned:
            seen += 1
            assert f"; {aligned:,} of alignment padding after the items" in shown
            gap = items[0]["padded_end"] - items[0]["end"]
            assert (f" + {gap:,} of alignment padding\n" in shown) == (gap > 0)
    assert seen > 0


def test_long_texts_are_elided_unless_full_and_ids_are_shown_with_ids(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = plain["out"]["parquet"]
    record = _json(capsys, str(out), "0")
    long = next(i for i in record["items"] if len(i["text"]) > 3 * ELIDE_CHARS)
    assert main(["inspect", str(out), "0", "--ids"]) == 0
    shown = capsys.readouterr().out
    shown_chars = len(long["text"].removesuffix(EOS) + "⟨eos⟩")
    assert f"\n{long['text'][:ELIDE_CHARS]}…[{shown_chars - 2 * ELIDE_CHARS:,} characters]…" in shown
    assert long["text"] not in shown
    assert f"ids: {' '.join(map(str, long['ids'][:16]))} …[" in shown
    assert main(["inspect", str(out), "0", "--full", "--ids"]) == 0
    shown = capsys.readouterr().out
    assert long["text"].removesuffix(EOS) + "⟨eos⟩" in shown
    assert f"ids: {' '.join(map(str, long['ids']))}\n" in shown


def test_chat_packs_mark_untrained_spans(chat: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Untrained runs of the loss mask are the JSON's spans and stand between ⟦ ⟧ in the text view
    (a lone first token of an item, untrained by rule, is not marked); removing the brackets and
    markers gives the decoded text back."""
    packs = _reader_packs(chat)
    for number, (_, mask, row) in enumerate(packs[:8]):
        assert mask is not None
        record = _json(capsys, str(chat), str(number))
        assert record["loss_mask"] is True
        for item in record["items"]:
            m = mask[item["start"] : item["end"]]
            assert item["trained"] == int(m.sum())
            zero = [k for s, e in item["untrained"] for k in range(s, e)]
            assert zero == (np.flatnonzero(m == 0) + item["start"]).tolist()
        assert main(["inspect", str(chat), str(number), "--full"]) == 0
        shown = capsys.readouterr().out
        assert "untrained tokens between ⟦ ⟧" in shown
        bodies = re.split(r"^── .*$", shown, flags=re.MULTILINE)[1:-1]
        assert len(bodies) == len(record["items"]) == len(row["doc_ids"])
        for body, item in zip(bodies, record["items"], strict=True):
            text = body[1:-1]  # between its header's newline and the next header
            assert text.startswith("⟦<|im_start|>")
            spans = [s for s in item["untrained"] if s[1] - s[0] > 1 or s[0] != item["start"]]
            assert text.count("⟦") == text.count("⟧") == len(spans)
            plain_text = text.replace("⟦", "").replace("⟧", "").replace("⟨eos⟩", "<|im_end|>")
            assert plain_text == item["text"].replace("<|endoftext|>", "⟨pad⟩")
            assert "<|im_start|>assistant\n⟧" in text  # the assistant's reply is trained


def test_on_a_terminal_untrained_text_is_dimmed(chat: Path) -> None:
    view = inspect_pack(str(chat), 0)
    shown = render(view, color=True)
    assert "\x1b[2m<|im_start|>" in shown and "⟦" not in shown
    assert "untrained tokens dimmed" in shown


def test_megatron_shows_the_same_packs(plain: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    """The packs do not depend on the format: read through megatron's .bin and its pack index, every
    item is parquet's; the padding holds EOS there."""
    for number in range(len(_reader_packs(plain["out"]["parquet"]))):
        parquet = _json(capsys, str(plain["out"]["parquet"]), str(number))
        megatron = _json(capsys, str(plain["out"]["megatron"]), str(number))
        assert megatron["format"] == "megatron" and megatron["file"] == "data/part-00000.bin"
        assert megatron["items"] == parquet["items"]
        assert megatron["padding"] == parquet["padding"] and megatron["pad_id"] == 0
    assert main(["inspect", str(plain["out"]["megatron"])]) == 0
    shown = capsys.readouterr().out
    assert "dataset    " in shown and "(megatron)" in shown and "\npack 0 (of 0.." in shown


def test_a_rebuild_root_is_read_through_latest(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    root = plain["tmp"] / "root"
    shutil.copytree(plain["out"]["parquet"], root / "v=000001")
    (root / "LATEST").write_text("v=000001\n")
    record = _json(capsys, str(root), "3")
    assert record["dataset"] == str(root / "v=000001")
    assert record["items"] == _json(capsys, str(plain["out"]["parquet"]), "3")["items"]


def test_an_unreadable_tokenizer_leaves_ids_and_says_why(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    out = plain["out"]["parquet"]
    missing = plain["tmp"] / "moved" / "tokenizer.json"
    assert main(["inspect", str(out), "1", "--tokenizer", str(missing)]) == 0
    shown = capsys.readouterr().out
    assert f"cannot read it (tokenizer file not found: {missing}): ids only" in shown
    items = _json(capsys, str(out), "1")["items"]
    for item in items:
        assert f"ids: {' '.join(map(str, item['ids'][:16]))}" in shown
    assert all(i["text"] is None for i in _json(capsys, str(out), "1", "--tokenizer", str(missing))["items"])


def test_another_tokenizer_is_said_to_differ(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    other = train_tokenizer(plain["tmp"] / "other" / "tokenizer.json", 300, seed=5)
    record = _json(capsys, str(plain["out"]["parquet"]), "0", "--tokenizer", str(other))
    assert "differ from those the dataset was packed with" in record["tokenizer_note"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["0", "999"], r"pack 999 is out of range: .* has packs 0\.\.\d+\n"),
        (["0", "-1"], r"pack -1 is out of range"),
        (["corpus"], r"holds no complete raypack dataset \(no manifest\.json\)"),
        (["nowhere"], r"holds no complete raypack dataset"),
        (["0", "--set", "pack.seq_len=8"], r"--set overrides the job config"),
    ],
)
def test_bad_inputs_are_one_line_and_exit_2(
    plain: dict[str, Any], capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    paths = {"0": plain["out"]["parquet"], "corpus": plain["corpus"], "nowhere": plain["tmp"] / "nowhere"}
    assert main(["inspect", str(paths[args[0]]), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(says, err), err


def test_parts_are_pieces_of_the_whole_decode_where_a_part_alone_decodes_otherwise(
    tokenizer_path: Path,
) -> None:
    """A SentencePiece-style decoder drops the space of a text's first word: decoded alone, a part
    that starts with a word would lose its space. Byte-level BPE: a cut inside a character's bytes
    is decoded alone (each side's bytes as they are), never dropping the rest."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from raypack.inspector import _decode_parts

    metaspace = Tokenizer(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.decoder = decoders.Metaspace()
    texts = ["the packing of a sequence of documents", "packing documents into sequences"] * 50
    metaspace.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=120, show_progress=False))
    ids = metaspace.encode("the packing of documents").ids
    for cut in range(1, len(ids)):
        pieces, whole = _decode_parts(metaspace, ids, [0, cut, len(ids)])
        assert "".join(pieces) == whole == "the packing of documents"
    alone = [metaspace.decode(ids[:2]), metaspace.decode(ids[2:])]
    assert "".join(alone) != "the packing of documents"  # why parts are not decoded alone

    byte_level = Tokenizer.from_file(str(tokenizer_path))
    ids = byte_level.encode("fit 日本語 ü").ids
    for cut in range(1, len(ids)):
        pieces, whole = _decode_parts(byte_level, ids, [0, cut, len(ids)])
        assert whole == "fit 日本語 ü" and len(pieces) == 2
