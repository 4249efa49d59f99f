"""docs/trainers.md's snippets, run as they stand against datasets packed in each format (only
`OUT`'s value is replaced), and what each read checked against the packs: every trainer reads
raypack's output right with exactly what the page shows."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from raypack.config import load_config
from raypack.pipeline.job import run_job
from raypack.verifier import verify
from tests import oracle
from tests.conftest import job_config, make_corpus

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "trainers.md"
SEQ = 256


def snippet(title: str, out: Path) -> str:
    """The python block under the heading that starts with `title`, reading `out`."""
    sections = re.split(r"^## ", PAGE.read_text(), flags=re.M)
    (section,) = [s for s in sections if s.startswith(title)]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert re.search(r'^OUT = "packed/"', code, flags=re.M), "a snippet reads OUT"
    return re.sub(r'^OUT = "packed/"', f"OUT = {str(out)!r}", code, count=1, flags=re.M)


def run(title: str, out: Path, **given: Any) -> dict[str, Any]:
    space: dict[str, Any] = dict(given)
    exec(compile(snippet(title, out), f"{PAGE}:{title}", "exec"), space)
    return space


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("trainer-docs")
    corpus = make_corpus(tmp, shards=2, docs_per_shard=30, seed=8)
    outs = {}
    for fmt in ("trl", "megatron", "olmo", "mds"):
        cfg = job_config(
            tmp,
            f"{corpus}/*",
            tokenizer_path,
            pack={"seq_len": SEQ},
            output={"path": str(tmp / fmt), "format": fmt},
        )
        run_job(load_config(str(cfg)), log=lambda _: None)
        outs[fmt] = tmp / fmt
    return outs


def pack_index(out: Path) -> list[dict[str, Any]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [
        row
        for f in sorted(manifest["files"], key=lambda f: f["path"])
        for row in pq.read_table(out / f["index"]).to_pylist()
    ]


def test_trl_takes_the_rows_as_packs(
    packed: dict[str, Path], tokenizer_path: Path, tmp_path: Path, monkeypatch: Any
) -> None:
    """SFTTrainer built as the snippet builds it keeps every row a pack: its padding-free collator
    gives each pack's tokens in order, positions restarting at every document."""
    import functools

    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    from tests.test_clients import llama

    monkeypatch.chdir(tmp_path)  # the snippet's output_dir
    # These machines have no GPU: SFTConfig's bf16 default then needs use_cpu (the snippet is for GPUs).
    monkeypatch.setattr(trl, "SFTConfig", functools.partial(trl.SFTConfig, use_cpu=True))
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_path), pad_token="<|pad|>", eos_token="<|endoftext|>"
    )
    space = run("TRL", packed["trl"], model=llama("sdpa", vocab=512, positions=SEQ), tokenizer=tokenizer)
    batch = next(iter(space["trainer"].get_train_dataloader()))
    rows = [
        r for f in sorted((packed["trl"] / "data").glob("*.parquet")) for r in pq.read_table(f).to_pylist()
    ]
    ids = batch["input_ids"].reshape(-1).tolist()
    positions = batch["position_ids"].reshape(-1).tolist()
    at = 0
    while at < len(ids):  # the batch's rows, flattened: each a pack whole, in the sampler's order
        row = next(r for r in rows if ids[at : at + len(r["input_ids"])] == r["input_ids"])
        assert positions[at : at + len(row["input_ids"])] == [p for n in row["seq_lengths"] for p in range(n)]
        at += len(row["input_ids"])


def test_the_loss_weights_snippet_gives_the_mean_of_per_document_losses(packed: dict[str, Path]) -> None:
    """The page's loop, as written, with a tiny Hugging Face model: its loss is the mean over the
    batch's documents of each one's mean loss, the model run on the document alone."""
    pytest.importorskip("transformers")
    import torch

    from tests.test_clients import documents, llama

    model = llama("sdpa", positions=SEQ)
    space = run("Loss per document", packed["trl"], model=model)
    batch = space["batch"]
    with torch.no_grad():
        means = [
            float(model(batch["input_ids"][r : r + 1, s:e], labels=batch["input_ids"][r : r + 1, s:e]).loss)
            for r, s, e in documents(batch)
            if e - s >= 2
        ]
    assert float(space["loss"]) == pytest.approx(float(np.mean(means)), rel=1e-5)
    assert next(model.parameters()).grad is not None  # loss.backward() ran


def test_the_balance_snippet_reads_the_epoch_in_steps_of_even_attention_cost(packed: dict[str, Path]) -> None:
    """The page's loop, as written, on each of 4 ranks (a megatron dataset: costs from its pack
    index, tokens from its .bin): the packs the unbalanced reader gives, no more or fewer, the
    same number of steps on every rank, and each step's ranks' Σ l² closer together than
    unbalanced."""
    pytest.importorskip("torch")
    from raypack.balance import imbalance
    from raypack.reader import iter_batches

    out, world = packed["megatron"], 4

    def cost(batch: dict[str, Any]) -> float:
        total = 0.0
        for row in np.asarray(batch["document_ids"]):
            total += float((np.unique(row[row >= 0], return_counts=True)[1].astype(float) ** 2).sum())
        return total

    def digests(batches: list[dict[str, Any]]) -> list[bytes]:
        return [np.asarray(row).tobytes() for b in batches for row in b["input_ids"]]

    balanced, plain = [], []
    for rank in range(world):
        seen: list[dict[str, Any]] = []
        run("Attention-balanced steps", out, rank=rank, world=world, epoch=0, train_step=seen.append)
        balanced.append(seen)
        plain.append(list(iter_batches(str(out), 2, rank, world, seed=0)))
    assert sorted(d for b in balanced for d in digests(b)) == sorted(d for b in plain for d in digests(b))
    assert len({len(b) for b in balanced}) == 1
    before = imbalance(np.array([[cost(b) for b in rank] for rank in plain]).T)
    after = imbalance(np.array([[cost(b) for b in rank] for rank in balanced]).T)
    assert after < before


def test_megatron_reads_a_pack_a_sample(packed: dict[str, Path]) -> None:
    pytest.importorskip("megatron.core")
    import torch.distributed as dist

    try:
        space = run("Megatron-LM", packed["megatron"])
        train, sample = space["train"], space["sample"]
        index = pack_index(packed["megatron"])
        packs = {
            tuple(p.tokens + p.padding)
            for p in oracle.read_output(packed["megatron"], space["manifest"], packed["megatron"].parent)
        }
        assert len(train) == len(index)
        seen = set()
        for i in range(len(train)):
            s = train[i]
            key = tuple(s["tokens"].tolist())
            assert key in packs  # a sample is a pack, never a straddle of two
            seen.add(key)
            # Positions restart at every document: 0 right after every EOD.
            eod = space["Tokenizer"].eod
            pos = s["position_ids"].tolist()
            for t in range(1, len(pos)):
                assert pos[t] == (0 if key[t - 1] == eod else pos[t - 1] + 1)
        assert len(seen) == len(index)  # every pack once, none straddled
        assert sample["loss_mask"].dtype.is_floating_point
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_context_parallel_snippet_gives_megatron_core_the_real_and_padded_boundaries(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    pytest.importorskip("megatron.core")
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=30, seed=9)
    sections = {"pack": {"seq_len": SEQ, "pad_multiple": 8}, "output": {"format": "megatron"}}
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, **sections)))
    run_job(cfg, log=lambda _: None)
    report = verify(str(tmp_path / "out"), cfg, sample=10)
    assert report.ok, report.problems
    space = run("Context parallelism", tmp_path / "out")
    thd, local, params, batch = space["thd"], space["local"], space["packed_seq_params"], space["batch"]
    assert params.qkv_format == "thd" and params.cu_seqlens_q.equal(batch["cu_seqlens"])
    assert params.cu_seqlens_q_padded.equal(batch["cu_seqlens_padded"])
    assert local["tokens"].equal(thd["tokens"])  # CP 1: the whole sequence
    tokens, labels = thd["tokens"].reshape(-1).tolist(), thd["labels"].reshape(-1).tolist()
    mask = thd["loss_mask"].reshape(-1).tolist()
    cu, padded = batch["cu_seqlens"].tolist(), batch["cu_seqlens_padded"].tolist()
    eos = space["manifest"]["format"]["eos_id"]
    for i in range(len(cu) - 1):
        start, real, span = padded[i], cu[i + 1] - cu[i], padded[i + 1] - padded[i]
        assert start % 8 == 0 and span % 8 == 0
        assert tokens[start + real : start + span] == [eos] * (span - real)  # megatron pads with EOS
        assert not any(mask[start + real - 1 : start + span])  # no loss into nor on the padding
        if real < span:  # a document: each of its tokens but its last predicts the next
            assert labels[start : start + real - 1] == tokens[start + 1 : start + real]


def test_olmo_core_reads_each_pack_with_its_documents(packed: dict[str, Path]) -> None:
    pytest.importorskip("olmo_core")
    out = packed["olmo"]
    space = run("OLMo-core", out)
    dataset, index = space["dataset"], pack_index(out)
    assert len(dataset) == len(index)
    for i, row in enumerate(index):
        item = dataset[i]
        n, offsets = row["num_tokens"], row["doc_offsets"]
        assert item["doc_lens"].tolist() == np.diff(offsets).tolist() + ([SEQ - n] if n < SEQ else [])
        mask = item["label_mask"].tolist()
        assert mask == [t < n and t not in offsets[:-1] for t in range(SEQ)]
    assert space["instance"]["input_ids"].shape[0] == SEQ
    # What the page warns of: bos_token_id set, and the documents of a pack read as one.
    from olmo_core.data import NumpyFSLDataset

    wrong = NumpyFSLDataset(
        *space["paths"],
        sequence_length=SEQ,
        pad_token_id=space["fmt"]["pad_id"],
        eos_token_id=space["fmt"]["eos_id"],
        bos_token_id=1,  # the tokenizer's <s>
        vocab_size=space["manifest"]["tokenizer"]["max_id"] + 1,
        dtype=np.dtype(space["fmt"]["dtype"]).type,
        generate_doc_lengths=True,
    )
    wrong.work_dir = str(out.parent / "olmo-wrong")
    several = [i for i, row in enumerate(index) if len(row["doc_offsets"]) > 2]
    assert several and all(len(wrong[i]["doc_lens"]) < len(index[i]["doc_offsets"]) - 1 for i in several)


def test_mosaicml_streaming_reads_the_snippet_s_sample(packed: dict[str, Path]) -> None:
    python = oracle.mds_python()
    if python is None:
        import os

        if os.environ.get("CI"):
            pytest.fail("CI must have .venv-mds (make test builds it)")
        pytest.skip("no .venv-mds")
    code = snippet("MosaicML", packed["mds"]) + (
        "\nimport json as _j\nprint(_j.dumps({'tokens': sample['tokens'].tolist(), "
        "'doc_offsets': sample['doc_offsets'].tolist(), 'num_tokens': int(sample['num_tokens']), "
        "'pad': pad_token_id, 'n': len(dataset)}))"
    )
    done = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, check=True, cwd=packed["mds"].parent
    )
    got = json.loads(done.stdout.strip().splitlines()[-1])
    index = pack_index(packed["mds"])
    first = index[0]
    assert got["n"] == len(index) and got["doc_offsets"] == first["doc_offsets"]
    assert got["num_tokens"] == first["num_tokens"] and len(got["tokens"]) == SEQ
    assert set(got["tokens"][first["num_tokens"] :]) <= {got["pad"]}


def test_the_variable_sequence_length_snippet_follows_its_curriculum(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """The page's loop on a decompose dataset, with a tiny Hugging Face model: every batch 1,024
    tokens, its lengths Grow-P2's schedule (the longest first), every chunk at most once."""
    pytest.importorskip("transformers")
    from raypack.packing.curriculum import Curriculum
    from raypack.reader import Plan, batching_of, pin
    from tests.test_clients import llama

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=8)
    pack = {"algorithm": "decompose", "seq_len": 1024, "min_seq_len": 16}
    run_job(
        load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack))), log=lambda _: None
    )
    out = tmp_path / "out"
    model = llama("sdpa", vocab=512, positions=1024)
    space = run("Variable sequence length", out, model=model)
    plan = Plan.of(
        pin(str(out)), batching_of(None, 1024, Curriculum("grow_p2", 2), "drop"), 0, 1, 0, "drop", None
    )
    assert space["lengths"] == [plan.buckets[b].length for b in plan.schedule.tolist()]
    assert space["lengths"][0] == max(space["lengths"]) and len(set(space["lengths"])) > 2
    assert next(model.parameters()).grad is not None  # loss.backward() ran
