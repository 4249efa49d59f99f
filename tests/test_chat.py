"""Chat and instruction data end to end, checked against the real clients: transformers'
apply_chat_template (ids and assistant masks), TRL 1.16's collator and trainer (a tiny random Llama
trained on raypack's packed rows), Megatron-Bridge's packed-sequence collate, and raypack's own
reader. Conversations carry system prompts, tool calls, empty assistant turns and multi-byte text;
some records are bad (rejects with reasons); a template that is not prefix-stable is refused."""

from __future__ import annotations

import itertools
import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raypack.cli import main
from raypack.config import JobConfig, from_dict, load_config
from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.reader import batch_fields
from raypack.text.chat import Chat, ChatTemplate, token_mask
from raypack.text.encode import encode_chat
from raypack.text.files import read_tokenizer
from raypack.verifier import verify
from tests.chatdata import CHATML, CHATML_MARKED, DROPS_REASONING, chat_model, conversation, words
from tests.conftest import write_jsonl, write_parquet

transformers = pytest.importorskip("transformers")

SEQ = 256
quiet = {"log": lambda _: None}
N = 90  # conversations a jsonl shard


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_model(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def hf(model: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(model))


def conversations(seed: int, n: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [conversation(rng, i) for i in range(n)]


BAD = [
    {"messages": "not a list"},
    {"text": "no messages field"},
    {"messages": []},
    {"messages": [{"content": "no role"}]},
    {"messages": [{"role": "user", "content": "a question nobody answers"}]},  # no trained token
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chatcorpus")
    write_jsonl(root / "a.jsonl", [{"messages": m} for m in conversations(1, N)] + BAD)
    write_jsonl(root / "b.jsonl", [{"messages": m} for m in conversations(2, N)])
    # A parquet shard: messages as list<struct> (the tool-call turns stay in the jsonl shards)
    plain = [m for m in conversations(3, 60) if not any("tool_calls" in x for x in m)]
    rows = [[{"role": x["role"], "content": x["content"]} for x in m] for m in plain]
    write_parquet(root / "c.parquet", {"messages": rows})
    return root


def job(tmp: Path, corpus: Path, model: Path, name: str, **sections: Any) -> JobConfig:
    data: dict[str, Any] = {
        "input": {"paths": [f"{corpus}/*.jsonl"], "messages_field": "messages", "max_reject_ratio": 0.1},
        "tokenizer": {"path": str(model), "concurrency": 1},
        "pack": {"seq_len": SEQ, "overflow": "truncate"},
        "output": {"path": str(tmp / name), "shard_rows": 16},
    }
    for key, values in sections.items():
        data[key] = {**data.get(key, {}), **values}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(str(path))


def cfg_of(model: Path, **inputs: Any) -> JobConfig:
    return from_dict(
        JobConfig,
        {
            "input": {"paths": ["/nonexistent/*"], "messages_field": "messages", **inputs},
            "tokenizer": {"path": str(model)},
            "pack": {"seq_len": SEQ, "overflow": "truncate"},
            "output": {"path": "/tmp/unused"},
        },
    )


def ours(
    model: Path, template: ChatTemplate | None, docs: list[Chat], **inputs: Any
) -> list[tuple[list[int], list[bool]]]:
    """Each conversation's ids and trained-token mask as the tokenize stage stages them."""
    cfg = cfg_of(model, **inputs)
    flat, lengths, reasons = encode_chat(read_tokenizer(cfg.tokenizer), cfg, template, docs)
    assert reasons == [None] * len(docs)
    ends = np.cumsum(lengths)
    staged = [flat[e - n : e] for e, n in zip(ends, lengths, strict=True)]
    return [(np.where(s < 0, -s - 1, s).tolist(), (s >= 0).tolist()) for s in staged]


def test_ids_and_masks_equal_transformers_with_generation_markers(model: Path, hf: Any) -> None:
    template = ChatTemplate(
        CHATML_MARKED, "marked", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    )
    convs = conversations(7, 60)
    got = ours(model, template, [Chat(messages=tuple(m)) for m in convs])
    for messages, (ids, mask) in zip(convs, got, strict=True):
        want = hf.apply_chat_template(
            messages,
            chat_template=CHATML_MARKED,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids == list(want["input_ids"])
        assert [int(m) for m in mask] == list(want["assistant_masks"])
        assert any(mask)


def test_a_derived_mask_is_exactly_each_assistant_turn(model: Path, hf: Any) -> None:
    """No markers (the model directory's ChatML): the ids are apply_chat_template's, and the trained
    tokens decode to exactly the text each assistant turn adds to the rendering."""
    template = ChatTemplate(CHATML, "chatml", {})
    convs = conversations(8, 60)
    got = ours(model, template, [Chat(messages=tuple(m)) for m in convs])
    for messages, (ids, mask) in zip(convs, got, strict=True):
        assert ids == list(hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        turns = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
                through = hf.apply_chat_template(messages[: i + 1], tokenize=False)
                turns.append(through[len(before) :])
        runs, run = [], []
        for t, m in zip(ids, mask, strict=True):
            if m:
                run.append(t)
            elif run:
                runs.append(run)
                run = []
        runs += [run] if run else []
        assert [hf.decode(r) for r in runs] == turns


def test_token_mask_follows_char_to_token(hf: Any) -> None:
    """token_mask against the Encoding's own char_to_token on multi-byte text, where byte-level BPE
    gives several tokens one character: from the first token of a span's first character through the
    last token of its last (transformers' own mask stops at the first token of the last character,
    two bytes short of a closing 語)."""
    text = "ab 日本語 🙂 cd <|im_end|> ü"
    enc = hf(text, add_special_tokens=False)
    offsets = np.asarray(
        enc["offset_mapping"]
        if "offset_mapping" in enc
        else hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    )
    assert not token_mask(offsets, [(9, 9)], len(text)).any()  # an empty span trains nothing
    for s, e in [(0, 2), (3, 6), (7, 8), (3, len(text)), (0, len(text))]:
        mask = token_mask(offsets, [(s, e)], len(text))
        first = enc.char_to_token(s)
        last = max(
            t
            for t in range(len(offsets))
            if enc.token_to_chars(t) and enc.token_to_chars(t)[0] <= e - 1 < enc.token_to_chars(t)[1]
        )
        want = np.zeros(len(offsets), dtype=bool)
        want[first : last + 1] = True
        assert mask.tolist() == want.tolist(), (s, e)


def test_pairs_train_the_completion_and_eos(model: Path, hf: Any) -> None:
    docs = [
        Chat(prompt="Q: " + words(random.Random(i), 5) + "\nA:", completion=" " + words(random.Random(-i), 9))
        for i in range(20)
    ]
    got = ours(model, None, docs, messages_field=None, prompt_field="prompt", completion_field="completion")
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    for doc, (ids, mask) in zip(docs, got, strict=True):
        assert ids[:-1] == hf(doc.prompt + doc.completion, add_special_tokens=False)["input_ids"]
        assert ids[-1] == eos and mask[-1]
        trained = [t for t, m in zip(ids[:-1], mask[:-1], strict=True) if m]
        assert hf.decode(trained) == doc.completion


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, corpus: Path, model: Path) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("chatjobs")
    out = {}
    for fmt in ("parquet", "trl", "bridge"):
        cfg = job(tmp, corpus, model, fmt, output={"format": fmt})
        result = run_job(cfg, **quiet)
        assert result.chat is not None
        out[fmt] = tmp / fmt
        CONFIGS[fmt] = cfg
    return out


CONFIGS: dict[str, JobConfig] = {}


def expected(model: Path, corpus: Path) -> dict[str, tuple[list[int], list[bool]]]:
    """Each jsonl conversation's ids and mask by transformers (rendering the prefixes for the mask),
    keyed by document id (path:line)."""
    hf = transformers.AutoTokenizer.from_pretrained(str(model))
    want = {}
    for name in ("a.jsonl", "b.jsonl"):
        for line, raw in enumerate((corpus / name).read_text().splitlines(), start=1):
            messages = json.loads(raw).get("messages")
            if not isinstance(messages, list) or not messages or not all("role" in m for m in messages):
                continue
            text = hf.apply_chat_template(messages, tokenize=False)
            enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
            spans = []
            for i, m in enumerate(messages):
                if m["role"] == "assistant":
                    before = hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
                    through = hf.apply_chat_template(messages[: i + 1], tokenize=False)
                    spans.append((len(before), len(through)))
            mask = token_mask(np.asarray(enc["offset_mapping"]), spans, len(text))
            mask[0] = False
            want[f"{name}:{line}"] = (list(enc["input_ids"]), mask.tolist())
    return want


def packed_conversations(out: Path) -> dict[str, tuple[list[int], list[bool]]]:
    got = {}
    for f in sorted((out / "data").glob("*.parquet")):
        table = pq.read_table(f)
        for row in table.to_pylist():
            for k, doc in enumerate(row["doc_ids"]):
                s, e = row["doc_offsets"][k], row["doc_offsets"][k + 1]
                assert doc not in got, f"{doc} packed twice"
                got[doc] = (row["input_ids"][s:e], [bool(m) for m in row["loss_mask"][s:e]])
    return got


def test_every_conversation_is_packed_whole_or_truncated_or_rejected(
    packed: dict[str, Path], corpus: Path, model: Path
) -> None:
    out = packed["parquet"]
    want = expected(model, corpus)
    got = packed_conversations(out)
    rejects = pq.read_table(out / "rejects").to_pylist()
    reasons = {f"{r['source']}:{r['row']}": r["reason"] for r in rejects}
    assert set(got) | set(reasons) >= {f"a.jsonl:{i}" for i in range(1, N + len(BAD) + 1)}
    assert not set(got) & set(reasons)
    assert "no trained token" in reasons[f"a.jsonl:{N + 5}"]
    # A conversation rejected once rendered keeps its record as JSON, as one rejected when read does
    # (it was Python's repr of the reader's Chat).
    raw = {f"{r['source']}:{r['row']}": r["raw"] for r in rejects}[f"a.jsonl:{N + 5}"]
    assert json.loads(raw) == BAD[4]
    assert "not a list" in reasons[f"a.jsonl:{N + 1}"] and "missing messages" in reasons[f"a.jsonl:{N + 2}"]
    truncated = 0
    for doc, (ids, mask) in want.items():
        if doc in reasons:
            continue
        got_ids, got_mask = got[doc]
        keep = min(len(ids), SEQ)
        truncated += keep < len(ids)
        assert got_ids == ids[:keep], doc
        assert got_mask == mask[:keep], doc
    chat = json.loads((out / "metrics.json").read_text())["chat"]
    assert truncated > 0 and chat["truncated"] == truncated
    trained_out = sum(sum(m) for _, m in got.values())
    assert chat["trained_tokens_packed"] == trained_out
    assert chat["trained_tokens"] - chat["trained_tokens_lost"] == trained_out
    trained_in = sum(sum(m) for d, (_, m) in want.items() if d not in reasons)
    assert chat["trained_tokens"] == trained_in  # the jsonl shards only: the job reads *.jsonl
    assert 0 < chat["trained_share_lost"] < 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"]["loss_mask"] and manifest["chat"]["trained_tokens_packed"] == trained_out
    report = verify(str(out), CONFIGS["parquet"], sample=60)
    assert report.ok, report.problems
    assert report.sampled > 0


def test_verify_finds_a_flipped_mask_bit(packed: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "copy"
    shutil.copytree(packed["parquet"], out)
    f = sorted((out / "data").glob("*.parquet"))[0]
    table = pq.read_table(f)
    rows = table.to_pylist()
    trained = rows[0]["loss_mask"].index(1)
    rows[0]["loss_mask"][trained] = 0
    pq.write_table(type(table).from_pylist(rows, schema=table.schema), f)
    manifest = json.loads((out / "manifest.json").read_text())
    import hashlib

    for entry in manifest["files"]:
        if entry["path"] == f"data/{f.name}":
            data = f.read_bytes()
            entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify(str(out), CONFIGS["parquet"], sample=10_000)
    assert not report.ok
    assert any("loss mask differs" in p for p in report.problems)


def test_reader_labels_train_exactly_the_masked_tokens(packed: dict[str, Path]) -> None:
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        table = pq.read_table(f, columns=["input_ids", "doc_offsets", "num_tokens", "loss_mask"])
        b = batch_fields(table, SEQ, 0)
        mask = np.asarray(table.column("loss_mask").to_pylist())
        assert np.array_equal(b["labels"] != -100, mask == 1)
        assert np.array_equal(b["labels"][mask == 1], b["input_ids"][mask == 1])
        assert np.array_equal(b["shift_labels"][:, :-1], b["labels"][:, 1:])


def test_trl_and_bridge_hold_the_same_packs_and_masks(packed: dict[str, Path]) -> None:
    base = {}
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            n = row["num_tokens"]
            base.setdefault(f.stem, []).append(
                (row["input_ids"][:n], row["loss_mask"][:n], row["doc_offsets"])
            )
    for stem, rows in base.items():
        trl = pq.read_table(packed["trl"] / "data" / f"{stem}.parquet").to_pylist()
        bridge = pq.read_table(packed["bridge"] / "data" / f"{stem}.idx.parquet").to_pylist()
        for (ids, mask, offsets), t, b in zip(rows, trl, bridge, strict=True):
            assert t["input_ids"] == ids and b["input_ids"] == ids
            assert t["labels"] == [i if m else -100 for i, m in zip(ids, mask, strict=True)]
            assert t["seq_lengths"] == np.diff(offsets).tolist()
            assert b["seq_start_id"] == offsets[:-1]
            assert b["loss_mask"] == [*mask[1:], 0]  # Bridge's belongs to the label (the next token)
    for fmt in ("trl", "bridge"):
        report = verify(str(packed[fmt]), CONFIGS[fmt], sample=30)
        assert report.ok, report.problems
        assert report.sampled == 30
    meta = json.loads((packed["bridge"] / "pack_metadata.json").read_text())
    assert meta[0]["pack_size"] == SEQ and 1 <= meta[0]["max_samples_per_bin"] <= SEQ


def test_two_actors_and_a_rerun_write_the_same_bytes(
    packed: dict[str, Path], corpus: Path, model: Path, tmp_path: Path
) -> None:
    run_job(job(tmp_path, corpus, model, "two", tokenizer={"concurrency": 2}), **quiet)
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert (tmp_path / "two" / "data" / f.name).read_bytes() == f.read_bytes()


def test_a_chat_repack_from_a_token_store_parses_no_tokenizer(
    packed: dict[str, Path], corpus: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chat job that reads a token store fills it; a repack that finds every unit there renders
    its template's BOS and EOS from the JSON's ids and never parses the tokenizer (0.8 s for a
    131k BPE). Its packs are the job's without a store."""
    from raypack.text import tokenizer as tokenizer_module

    parsed: list[str] = []
    parse = tokenizer_module._parse
    monkeypatch.setattr(
        tokenizer_module, "_parse", lambda raw, where: parsed.append(where) or parse(raw, where)
    )
    store = {"path": str(tmp_path / "store")}
    run_job(job(tmp_path, corpus, model, "first", cache=store), **quiet)
    assert parsed
    parsed.clear()
    run_job(job(tmp_path, corpus, model, "again", cache=store), **quiet)
    assert parsed == []
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert (tmp_path / "again" / "data" / f.name).read_bytes() == f.read_bytes()


def test_a_parquet_messages_column_and_pairs(corpus: Path, model: Path, tmp_path: Path) -> None:
    result = run_job(
        job(tmp_path, corpus, model, "pq", input={"paths": [f"{corpus}/*.parquet"], "format": "parquet"}),
        **quiet,
    )
    assert result.documents > 0 and result.chat["trained_tokens_packed"] > 0
    pairs = tmp_path / "pairs-in"
    pairs.mkdir()
    rng = random.Random(5)
    write_jsonl(
        pairs / "p.jsonl", [{"prompt": words(rng, 20), "completion": " " + words(rng, 30)} for _ in range(50)]
    )
    cfg = job(
        tmp_path,
        pairs,
        model,
        "pairs",
        input={"messages_field": None, "prompt_field": "prompt", "completion_field": "completion"},
    )
    result = run_job(cfg, **quiet)
    assert result.chat["kind"] == "pairs" and result.chat["trained_tokens_lost"] == 0
    report = verify(str(tmp_path / "pairs"), cfg, sample=50)
    assert report.ok and report.sampled == 50, report.problems


def test_a_template_that_is_not_prefix_stable_is_refused(model: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "reasoning"
    corpus.mkdir()
    convs = [
        [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "thought one"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2", "reasoning_content": "thought two"},
        ]
    ] * 4
    write_jsonl(corpus / "r.jsonl", [{"messages": m} for m in convs])
    template = tmp_path / "qwen-like.jinja"
    template.write_text(DROPS_REASONING)
    cfg = job(tmp_path, corpus, model, "refused", tokenizer={"chat_template": str(template)})
    with pytest.raises(ConfigError, match=r"qwen-like\.jinja is not prefix-stable"):
        run_job(cfg, **quiet)
    assert main(["pack", str(tmp_path / "refused.yaml")]) == 2
    # pack.loss all needs no turn boundaries: the same template packs
    cfg = job(
        tmp_path, corpus, model, "all", tokenizer={"chat_template": str(template)}, pack={"loss": "all"}
    )
    assert run_job(cfg, **quiet).chat["trained_tokens_packed"] > 0


def test_chat_config_mistakes_are_clear(model: Path) -> None:
    base = {"paths": ["/x/*"], "messages_field": "messages"}
    for inputs, pack, output, match in [
        (base, {"overflow": "split"}, {}, "overflow split would cut a conversation"),
        (base, {"overflow": "truncate"}, {"format": "megatron"}, "keeps no loss mask"),
        (base, {"overflow": "truncate", "loss": "completion"}, {}, "completion is for prompt/completion"),
        ({"paths": ["/x/*"], "prompt_field": "p"}, {"overflow": "truncate"}, {}, "go together"),
        ({"paths": ["/x/*"]}, {"loss": "assistant"}, {}, "needs conversations or pairs"),
    ]:
        with pytest.raises(ConfigError, match=match):
            from_dict(
                JobConfig,
                {
                    "input": inputs,
                    "tokenizer": {"path": str(model)},
                    "pack": pack,
                    "output": {"path": "/tmp/o", **output},
                },
            )


# The real clients: a tiny random Llama (nothing downloaded) trained by TRL on the trl rows, the
# same conversations packed by TRL itself, raypack's reader, and Megatron-Bridge's collate.
ROWS = 6  # packs a step: one flattened padding-free sequence of ~1.5k tokens (eager attention is L²)


def need(module: str) -> Any:
    """The client library, or a skip where it is not installed (a failure in CI, which installs it)."""
    import importlib
    import os

    try:
        return importlib.import_module(module)
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have {module} (make test installs it)")
        pytest.skip(f"{module} is not installed")


def llama() -> Any:
    """test_clients' tiny random Llama, for the chat model's 600 ids and packs of SEQ."""
    need("torch")
    from tests.test_clients import llama as tiny_llama

    return tiny_llama("sdpa", vocab=600, positions=SEQ)


def items_of(trl_rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
    """Every conversation (ids, labels) of trl rows, cut by seq_lengths."""
    out = []
    for row in trl_rows:
        at = 0
        for n in row["seq_lengths"]:
            out.append((row["input_ids"][at : at + n], row["labels"][at : at + n]))
            at += n
    return out


def loss_by_hand(model: Any, conversations: list[tuple[list[int], list[int]]]) -> float:
    """Mean cross entropy over every trained target, each conversation run alone."""
    import torch

    total, count = 0.0, 0
    with torch.no_grad():
        for ids, labels in conversations:
            logits = model(torch.tensor(ids)[None]).logits[0].float()
            target = torch.tensor(labels[1:])
            keep = target != -100
            total += float(
                torch.nn.functional.cross_entropy(logits[:-1][keep], target[keep], reduction="sum")
            )
            count += int(keep.sum())
    return total / count


def trl_step_loss(rows: Any, hf: Any) -> float:
    """The loss TRL's SFTTrainer logs for one step over `rows` (one batch, learning rate 0)."""
    trl = need("trl")
    args = trl.SFTConfig(
        output_dir=str(Path(hf.name_or_path).parent / "trl-run"),
        padding_free=True,
        packing=False,
        max_length=None,
        per_device_train_batch_size=len(rows),
        max_steps=1,
        learning_rate=0.0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
    )
    trainer = trl.SFTTrainer(model=llama(), args=args, train_dataset=rows, processing_class=hf)
    trainer.train()
    return float(next(h["loss"] for h in trainer.state.log_history if "loss" in h))


def test_trl_trains_on_the_rows_with_the_within_conversation_assistant_loss(
    packed: dict[str, Path], hf: Any
) -> None:
    datasets = need("datasets")
    files = [str(f) for f in sorted((packed["trl"] / "data").glob("*.parquet"))]
    rows = datasets.load_dataset("parquet", data_files=files, split="train")
    shared = [i for i, n in enumerate(rows["seq_lengths"]) if len(n) > 1]  # where attention could leak
    rows = rows.select(shared[:ROWS])
    conversations = items_of(list(rows))
    assert len(rows) == ROWS and len(conversations) >= 2 * ROWS
    want = loss_by_hand(llama(), conversations)
    assert trl_step_loss(rows, hf) == pytest.approx(want, rel=1e-4)
    # TRL's own packing of the same conversations (its bfd) trains the same targets: the same loss.
    theirs = datasets.Dataset.from_dict(
        {"input_ids": [c[0] for c in conversations], "labels": [[-100, *c[1][1:]] for c in conversations]}
    )
    theirs = need("trl.data_utils").pack_dataset(theirs, SEQ, strategy="bfd")
    assert trl_step_loss(theirs, hf) == pytest.approx(want, rel=1e-4)


def test_reader_labels_give_a_hugging_face_model_the_assistant_only_loss(packed: dict[str, Path]) -> None:
    """With the README's mask (block_causal_mask of the reader's document_ids) every conversation's
    logits in a pack are its logits alone, and the model's loss with the reader's labels is the
    assistant-only loss computed from each conversation alone."""
    torch = need("torch")
    from raypack.reader import block_causal_mask, iter_batches

    model = llama()
    batch = next(
        b for b in iter_batches(str(packed["parquet"]), batch_size=2, seed=1) if b["document_ids"].max() >= 1
    )
    t = {k: torch.from_numpy(v) for k, v in batch.items() if isinstance(v, np.ndarray)}
    with torch.no_grad():
        out = model(
            t["input_ids"],
            labels=t["labels"],
            position_ids=t["position_ids"],
            attention_mask=block_causal_mask(t["document_ids"], torch.float32),
        )
        conversations, worst = [], 0.0
        for r in range(2):
            doc = batch["document_ids"][r]
            for d in sorted(set(doc.tolist()) - {-1}):
                where = np.flatnonzero(doc == d)
                s, e = int(where[0]), int(where[-1]) + 1
                conversations.append((batch["input_ids"][r, s:e].tolist(), batch["labels"][r, s:e].tolist()))
                alone = model(t["input_ids"][r : r + 1, s:e]).logits[0]
                worst = max(worst, float((alone - out.logits[r, s:e]).abs().max()))
    assert len(conversations) >= 3 and worst < 1e-4
    assert float(out.loss) == pytest.approx(loss_by_hand(model, conversations), rel=1e-4)


def bridge_dataset_class() -> Any:
    """Megatron-Bridge's GPTSFTPackedDataset (megatron-bridge 0.3.1, the newest for Python 3.11,
    installed without its GPU dependencies: its package __init__ imports Transformer Engine, so the
    data module is imported past it)."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("megatron.bridge")
    if spec is None:
        need("megatron.bridge")
        raise AssertionError("unreachable")
    if "megatron.bridge" not in sys.modules:
        package = types.ModuleType("megatron.bridge")
        package.__path__ = list(spec.submodule_search_locations or [])
        sys.modules["megatron.bridge"] = package
    from megatron.bridge.data.datasets.sft import GPTSFTPackedDataset

    return GPTSFTPackedDataset


def test_megatron_bridge_collates_the_packs_with_our_masks(
    packed: dict[str, Path], hf: Any, tmp_path: Path
) -> None:
    import types

    dataset_class = bridge_dataset_class()
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    stem = sorted((packed["parquet"] / "data").glob("*.parquet"))[0].stem
    ours = pq.read_table(packed["parquet"] / "data" / f"{stem}.parquet").to_pylist()
    rows = pq.read_table(packed["bridge"] / "data" / f"{stem}.idx.parquet").to_pylist()
    npy = tmp_path / "packed.npy"
    np.save(npy, np.array(rows, dtype=object), allow_pickle=True)
    ds = dataset_class(  # a prompt template is asked for but unused by packed data
        str(npy),
        types.SimpleNamespace(eos_id=eos),
        max_seq_length=SEQ,
        answer_only_loss=True,
        prompt_template="{input} {output}",
        label_key="output",
        truncation_field="input",
    )
    batch = ds.collate_fn([ds[i] for i in range(len(rows))])
    for r, row in enumerate(ours):
        offsets, ids, mask = row["doc_offsets"], row["input_ids"], row["loss_mask"]
        inputs = [t for s, e in itertools.pairwise(offsets) for t in ids[s : e - 1]]
        labels = [t for s, e in itertools.pairwise(offsets) for t in ids[s + 1 : e]]
        trained = [m for s, e in itertools.pairwise(offsets) for m in mask[s + 1 : e]]
        n = len(inputs)
        assert batch["tokens"][r, :n].tolist() == inputs
        assert batch["labels"][r, :n].tolist() == labels
        # Bridge trains a label when its loss_mask says so and its input is not EOS (its collate
        # zeroes those): our mask, less the targets that follow an <|im_end|>.
        want = [int(m and x != eos) for m, x in zip(trained, inputs, strict=True)]
        assert batch["loss_mask"][r, :n].tolist() == want
        key = "cu_seqlens_q" if "cu_seqlens_q" in batch else "cu_seqlens"  # its name before 0.4
        assert batch[key][r, : len(offsets)].tolist() == [o - i for i, o in enumerate(offsets)]


NO_SYSTEM = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_conversation_the_template_refuses_is_a_reject_and_the_report_counts_trained_tokens(
    model: Path, tmp_path: Path
) -> None:
    corpus = tmp_path / "refuses"
    corpus.mkdir()
    rng = random.Random(11)  # kinds without a system prompt or a tool call: plain, empty turn, multi-byte
    convs = [conversation(rng, i) for i in (0, 3, 4, 5, 8, 9, 10, 13, 14, 15, 18, 19)]
    convs[3] = [{"role": "system", "content": "be brief"}, *convs[3]]
    write_jsonl(corpus / "r.jsonl", [{"messages": m} for m in convs])
    template = tmp_path / "no-system.jinja"
    template.write_text(NO_SYSTEM)
    cfg = job(
        tmp_path,
        corpus,
        model,
        "refuses-out",
        input={"max_reject_ratio": 0.2},
        tokenizer={"chat_template": str(template)},
    )
    result = run_job(cfg, **quiet)
    rejects = pq.read_table(tmp_path / "refuses-out" / "rejects").to_pylist()
    assert [(r["row"], r["reason"]) for r in rejects] == [
        (4, "chat template " + str(template) + ": System role not supported")
    ]
    assert result.documents == 11
    page = (tmp_path / "refuses-out" / "report.html").read_text()
    assert "Chat data" in page and f"{result.chat['trained_tokens_packed']:,} of" in page
    missing = job(
        tmp_path, corpus, model, "missing", tokenizer={"chat_template": str(tmp_path / "nope.jinja")}
    )
    with pytest.raises(ConfigError, match="chat_template: file not found"):
        run_job(missing, **quiet)


def test_sharded_mode_keeps_the_masks(corpus: Path, model: Path, tmp_path: Path) -> None:
    cfg = job(tmp_path, corpus, model, "sharded", pack={"mode": "sharded", "algorithm": "ffd"})
    result = run_job(cfg, **quiet)
    report = verify(str(tmp_path / "sharded"), cfg, sample=40)
    assert report.ok and report.sampled == 40, report.problems
    assert (
        result.chat["trained_tokens"] - result.chat["trained_tokens_lost"]
        == result.chat["trained_tokens_packed"]
    )


@pytest.mark.slow  # 10 s
def test_convert_moves_the_masks_between_forms_and_refuses_maskless_formats(
    packed: dict[str, Path], tmp_path: Path
) -> None:
    from raypack.convert import convert

    for fmt in ("trl", "bridge"):
        convert(str(packed["parquet"]), fmt, str(tmp_path / fmt), log=lambda _: None)
        for f in sorted((packed[fmt] / "data").glob("*")):
            assert (tmp_path / fmt / "data" / f.name).read_bytes() == f.read_bytes(), (fmt, f.name)
    convert(str(packed["bridge"]), "parquet", str(tmp_path / "back"), log=lambda _: None)
    for f in sorted((packed["parquet"] / "data").glob("*.parquet")):
        assert pq.read_table(tmp_path / "back" / "data" / f.name).equals(pq.read_table(f))
    with pytest.raises(ConfigError, match="keeps no loss mask"):
        convert(str(packed["parquet"]), "megatron", str(tmp_path / "megatron"), log=lambda _: None)


def test_reading_chat_records_rejects_what_is_not_a_conversation(corpus: Path) -> None:
    """read_unit alone: every record of a shard becomes a Chat or a reject with its reason, a parquet
    cell over input.max_document_bytes included."""
    from raypack.config import InputConfig
    from raypack.corpus.files import input_files
    from raypack.corpus.readers import read_unit

    by_file: dict[str, tuple[int, list[str]]] = {}
    for pattern, fmt in (("*.jsonl", "jsonl"), ("*.parquet", "parquet")):
        cfg = InputConfig(
            paths=(f"{corpus}/{pattern}",), format=fmt, messages_field="messages", max_document_bytes=600
        )
        for shard in input_files(cfg):
            docs, reasons = 0, []
            for batch in read_unit(shard, 64):
                assert all(isinstance(d, Chat) and d.messages for d in batch.texts)
                docs += len(batch)
                reasons += [r.reason for r in batch.rejects]
            by_file[shard.relpath] = (docs, reasons)
    jsonl_docs, jsonl_reasons = by_file["a.jsonl"]
    assert jsonl_docs + len(jsonl_reasons) == N + len(BAD)  # jsonl lines over the limit are rejected unread
    parquet_docs, parquet_reasons = by_file["c.parquet"]
    assert parquet_reasons and all("over input.max_document_bytes (600)" in r for r in parquet_reasons)
    assert parquet_docs + len(parquet_reasons) == pq.read_metadata(corpus / "c.parquet").num_rows


# A Llama-3-style template: BOS from the `bos_token` variable and the date it prints (strftime_now).
LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- endif %}"
    "{{- '<|im_start|>system\\nToday Date: ' + date_string + '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare tokenizer.json (no tokenizer_config.json) whose vocabulary names a BOS but no EOS, and
    a Llama-3-style template file beside it."""
    from raypack.demo import train_byte_level_bpe

    root = tmp_path_factory.mktemp("bare")
    rng = random.Random(5)
    texts = [words(rng, 200) for _ in range(200)]
    tok = train_byte_level_bpe(texts, 600, ["<|begin_of_text|>", "<|im_start|>", "<|im_end|>"])
    tok.save(str(root / "tokenizer.json"))
    (root / "llama3.jinja").write_text(LLAMA3_STYLE)
    return root


def _plain_conversations(seed: int, n: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        [
            {"role": r, "content": words(rng, 1 + rng.randrange(30))}
            for r in ("user", "assistant") * (1 + i % 2)
        ]
        for i in range(n)
    ]


def test_a_bare_tokenizer_json_gives_the_template_its_bos_and_needs_no_eos(
    bare: Path, tmp_path: Path
) -> None:
    """`{{ bos_token }}` renders the BOS the tokenizer resolves (here by its name) as transformers
    renders it given that bos_token, every conversation; a bare tokenizer.json with no EOS packs
    conversations (add_eos frames pairs only). A template that writes a BOS the tokenizer does not
    name is refused before any work, never rendered without it."""
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bare / "tokenizer.json"), bos_token="<|begin_of_text|>"
    )
    convs = _plain_conversations(11, 30)
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "c.jsonl", [{"messages": m} for m in convs])
    cfg = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "out",
        tokenizer={"chat_template": str(bare / "llama3.jinja")},
        input={"max_reject_ratio": 0.0},
    )
    result = run_job(cfg, **quiet)
    assert result.documents == 30
    got = packed_conversations(tmp_path / "out")
    for line, messages in enumerate(convs, start=1):
        want = hf.apply_chat_template(messages, chat_template=LLAMA3_STYLE, tokenize=True, return_dict=True)
        ids = list(want["input_ids"])
        assert ids[0] == hf.bos_token_id
        assert got[f"c.jsonl:{line}"][0] == ids[:SEQ]
    assert verify(str(tmp_path / "out"), cfg, sample=30).ok
    # A template writing {{ eos_token }} with a tokenizer that names none: refused, with the key to set.
    (tmp_path / "eos.jinja").write_text(CHATML + "{{ eos_token }}")
    refused = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "refused",
        tokenizer={"chat_template": str(tmp_path / "eos.jinja")},
    )
    with pytest.raises(ConfigError, match=r"writes \{\{ eos_token \}\}.*set tokenizer\.eos_id"):
        run_job(refused, **quiet)


def test_a_completion_or_turn_starting_with_a_space_keeps_its_mask_with_trimmed_offsets(
    model: Path, tmp_path: Path
) -> None:
    """With a byte-level BPE whose post-processor trims offsets, the space before a word belongs to no
    token. A completion " Yes ..." trains every completion token and the EOS, as TRL does (its
    completion mask: the ids after the prompt's own), and an assistant turn " ..." under generation
    markers trains its tokens, not nothing."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trimmed = tmp_path / "trimmed"
    trimmed.mkdir()
    tok.save(str(trimmed / "tokenizer.json"))
    shutil.copy(model / "tokenizer_config.json", trimmed / "tokenizer_config.json")
    hf = transformers.AutoTokenizer.from_pretrained(str(trimmed))
    rng = random.Random(3)
    docs = [Chat(prompt="Q: " + words(rng, 6) + "?", completion=" " + words(rng, 12)) for _ in range(50)]
    got = ours(trimmed, None, docs, messages_field=None, prompt_field="prompt", completion_field="completion")
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    for doc, (ids, mask) in zip(docs, got, strict=True):
        prompt_ids = hf(doc.prompt, add_special_tokens=False)["input_ids"]
        full = hf(doc.prompt + doc.completion, add_special_tokens=False)["input_ids"]
        assert full[: len(prompt_ids)] == prompt_ids  # TRL's rule applies: the prompt's ids come first
        assert ids == [*full, eos]
        assert mask == [False] * len(prompt_ids) + [True] * (len(full) - len(prompt_ids) + 1)
    template = ChatTemplate(CHATML_MARKED, "marked", {"eos_token": "<|im_end|>"})
    turns = [
        Chat(
            messages=(
                {"role": "user", "content": words(rng, 5)},
                {"role": "assistant", "content": " " + words(rng, 9)},
            )
        )
        for _ in range(20)
    ]
    for chat, (ids, mask) in zip(turns, ours(trimmed, template, turns), strict=True):
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        assert hf.decode(trained) == chat.messages[1]["content"] + "<|im_end|>"


@pytest.mark.slow  # 12 s
def test_a_template_that_prints_the_date_renders_one_date_per_dataset(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """strftime_now prints tokenizer.chat_date; unset, the day of the first build, recorded in the
    manifest: a rebuild on a later day renders with it and reuses every token file, and verify on
    any day re-renders with the manifest's date."""
    import datetime as dt

    from raypack.pipeline import prepare as job_module
    from raypack.pipeline.rebuild import run_rebuild

    convs = _plain_conversations(12, 12)
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "c.jsonl", [{"messages": m} for m in convs])

    def on(day: dt.date) -> None:
        class Today(dt.date):
            @classmethod
            def today(cls) -> dt.date:
                return day

        monkeypatch.setattr(job_module, "date", Today)

    cfg = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "root",
        tokenizer={"chat_template": str(bare / "llama3.jinja"), "bos_id": 0},
    )
    on(dt.date(2025, 3, 4))
    first = run_rebuild(cfg, **quiet)
    on(dt.date(2026, 7, 8))
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_reused, second.job.shards_tokenized) == (1, 0)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bare / "tokenizer.json"), bos_token="<|begin_of_text|>"
    )
    for version in (first.version, second.version):
        out = tmp_path / "root" / version
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["chat"]["date"] == "2025-03-04"
        packed = packed_conversations(out)
        for line, messages in enumerate(convs, start=1):
            text = hf.apply_chat_template(messages, chat_template=LLAMA3_STYLE, tokenize=False)
            decoded = hf.decode(packed[f"c.jsonl:{line}"][0])  # transformers printed today's date
            assert text.replace(dt.date.today().strftime("%d %b %Y"), "04 Mar 2025").startswith(decoded)
            assert "Today Date: 04 Mar 2025" in decoded
        assert verify(str(out), cfg, sample=12).ok  # renders with the manifest's date, not today's
    pinned = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "pinned",
        tokenizer={"chat_template": str(bare / "llama3.jinja"), "bos_id": 0, "chat_date": "2024-07-26"},
    )
    run_job(pinned, **quiet)
    assert json.loads((tmp_path / "pinned" / "manifest.json").read_text())["chat"]["date"] == "2024-07-26"
    assert all(
        "Today Date: 26 Jul 2024" in hf.decode(ids)
        for ids, _ in packed_conversations(tmp_path / "pinned").values()
    )


def _data_files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "data").rglob("*")) if p.is_file()}


def _fast_writes_the_bytes_of_tokenizers(tmp_path: Path, corpus: Path, model: Path) -> dict[str, Any]:
    """The chat job on tokenizers and on auto: auto chooses fastokens for ids and offsets, finishes
    on it with texts re-checked in the run and no failover, and writes tokenizers' data files.
    Returns auto's backend record."""
    reference = run_job(
        job(tmp_path, corpus, model, "reference", tokenizer={"backend": "tokenizers"}), **quiet
    )
    fast = run_job(job(tmp_path, corpus, model, "fast"), **quiet)
    assert reference.backend["chosen"].startswith("tokenizers ")
    assert fast.backend["chosen"].startswith("fastokens ") and fast.backend["finished_on"] == "fastokens"
    assert "ids and character offsets equal to tokenizers" in fast.backend["reason"]
    assert fast.backend["checked_in_run"]["texts"] > 0 and not fast.backend["failovers"]
    assert _data_files(tmp_path / "fast") == _data_files(tmp_path / "reference")
    return fast.backend


def test_chat_on_fastokens_writes_the_bytes_of_tokenizers(corpus: Path, model: Path, tmp_path: Path) -> None:
    """A byte-level BPE's character offsets follow from its ids: chat data encodes with fastokens
    (ids and every offset proved equal to tokenizers' on the probes and a sample, re-checked in
    every task) and writes tokenizers' bytes, masks included; with a tokenizer whose offsets do not
    follow from its ids (a SentencePiece-style BPE whose byte tokens are added tokens too: one id
    for a byte and for the six characters "<0x0A>"), auto keeps tokenizers and says why."""
    pytest.importorskip("fastokens")
    _fast_writes_the_bytes_of_tokenizers(tmp_path, corpus, model)
    from tests.pipeline.test_backends import _sentencepiece_style

    sp = tmp_path / "sp"
    sp.mkdir()
    _sentencepiece_style().save(str(sp / "tokenizer.json"))
    (sp / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>", "chat_template": CHATML}))
    other = run_job(job(tmp_path, corpus, sp, "sp"), **quiet)
    assert other.backend["chosen"].startswith("tokenizers ")
    assert "this tokenizer's do not follow from its ids" in other.backend["reason"]


# Mistral-7B-Instruct's way of rendering a conversation (BOS, [INST] around a user turn, EOS after
# an assistant's), with a tool call's absent content taken as empty.
MISTRAL_V1 = (
    "{{ bos_token }}{% for message in messages %}{% set content = message.get('content') or '' %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + content + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ content + eos_token }}{% else %}{{ content }}{% endif %}"
    "{% endfor %}"
)


@pytest.mark.parametrize(
    "shape", ["mistral_v1", pytest.param("mistral_v1_metaspace", marks=pytest.mark.slow)]
)
def test_chat_with_a_real_sentencepiece_bpe_on_fastokens_writes_the_bytes_of_tokenizers(
    shape: str, corpus: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Mistral-7B's SentencePiece BPE (byte fallback, `▁` for a space) with a Mistral-style template:
    offsets follow from fastokens' ids (PieceOffsets) and the job writes tokenizers' bytes, masks
    included, every conversation on fastokens: in the published shape (Prepend + Replace) and in
    transformers 5's Metaspace shape, whose renders start with `<s>` (no `▁` prepended anywhere:
    fastokens' copy without the Prepend)."""
    pytest.importorskip("fastokens")
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(request.getfixturevalue(shape), model / "tokenizer.json")
    config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": MISTRAL_V1}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    fast = _fast_writes_the_bytes_of_tokenizers(tmp_path, corpus, model)
    assert fast["routed_to_tokenizers"]["texts"] == 0


def test_a_fast_backend_whose_offsets_differ_in_the_run_fails_over(
    corpus: Path, model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offsets made to differ in the tasks (the self-check passes): the tasks' sampled check finds it,
    every unit is tokenized again with tokenizers, and the bytes are tokenizers'."""
    pytest.importorskip("fastokens")
    from raypack.pipeline.tokenize import stage as tokenize_stage
    from tests.fakes import Shifted

    run_job(job(tmp_path, corpus, model, "reference", tokenizer={"backend": "tokenizers"}), **quiet)
    monkeypatch.setattr(tokenize_stage, "TokenizeShards", Shifted)
    failed = run_job(job(tmp_path, corpus, model, "failed"), **quiet)
    assert failed.backend["chosen"].startswith("fastokens ") and failed.backend["finished_on"] == "tokenizers"
    assert any("other character offsets" in f for f in failed.backend["failovers"])
    assert _data_files(tmp_path / "failed") == _data_files(tmp_path / "reference")


def test_a_tokenizer_json_given_alone_says_where_its_directorys_template_is(
    corpus: Path, model: Path, tmp_path: Path
) -> None:
    """tokenizer.path naming the tokenizer.json of a model directory reads that file alone (as
    transformers' tokenizer_file= does); a chat job then finds no template, and the error says the
    directory beside it has one and which key to change, before any work."""
    cfg = job(tmp_path, corpus, model / "tokenizer.json", "out")
    with pytest.raises(
        ConfigError, match=r"beside it has .*tokenizer_config\.json: set tokenizer\.path to that directory"
    ):
        run_job(cfg, **quiet)
    assert not (tmp_path / "out").exists()
