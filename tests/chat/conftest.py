"""Chat data's shared fixtures: a ChatML model directory (transformers loads it), its tokenizer in
transformers, a corpus of conversations (JSONL and Parquet, some records bad), and the corpus packed
once in each chat format."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from raypack.config import JobConfig, from_dict, load_config
from raypack.pipeline.job import run_job
from raypack.text.chat import Chat, ChatTemplate, token_mask
from raypack.text.encode import encode_chat
from raypack.text.files import read_tokenizer
from tests.chatdata import chat_model, conversation
from tests.conftest import write_jsonl, write_parquet

transformers = pytest.importorskip("transformers")

SEQ = 256
quiet = {"log": lambda _: None}
N = 90  # conversations a jsonl shard


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_model(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
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
