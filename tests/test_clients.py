"""The packed output read by the real clients users plug it into: a Hugging Face Llama (random, tiny:
nothing downloaded), torch's flex attention, Hugging Face `datasets`, torch's DataLoader and
torchdata's StatefulDataLoader. Each convention (label shifting, masks, resume) is checked against
the client, not assumed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from raypack.config import load_config  # noqa: E402
from raypack.pipeline.job import run_job  # noqa: E402
from raypack.reader import block_causal_mask, iter_batches  # noqa: E402
from raypack.shared_groups import cache_base  # noqa: E402
from raypack.torch_data import PackedDataset  # noqa: E402
from tests.conftest import job_config, make_corpus  # noqa: E402

SEQ_LEN = 128
VOCAB = 512  # the session tokenizer's


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> Path:
    tmp = tmp_path_factory.mktemp("clients")
    corpus = make_corpus(tmp, shards=3, docs_per_shard=30, seed=41)
    cfg = job_config(tmp, f"{corpus}/*", tokenizer_path, pack={"seq_len": SEQ_LEN}, output={"shard_rows": 7})
    run_job(load_config(str(cfg)), log=lambda _: None)
    return tmp / "out"


def llama(attn: str, vocab: int = VOCAB, positions: int = SEQ_LEN) -> Any:
    """A tiny random Llama (nothing downloaded), seeded, in eval mode (tests/chat/ uses it too)."""
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=positions,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM._from_config(config, attn_implementation=attn).eval()


def tensors(batch: dict[str, Any]) -> dict[str, Any]:
    return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}


def mixed_batch(packed: Path, batch_size: int, seed: int) -> dict[str, Any]:
    """The first batch in which some row holds several documents (where attention could leak)."""
    for batch in iter_batches(str(packed), batch_size, seed=seed):
        if batch["document_ids"].max() >= 2:
            return tensors(batch)
    raise AssertionError("no row of the test corpus holds three documents")


def documents(batch: dict[str, Any]) -> list[tuple[int, int, int]]:
    """(row, start, end) of every document in the batch, from cu_seqlens and num_tokens by hand."""
    out = []
    for r in range(batch["input_ids"].shape[0]):
        ids = batch["document_ids"][r].tolist()
        for d in sorted(set(ids) - {-1}):
            where = [t for t, x in enumerate(ids) if x == d]
            out.append((r, where[0], where[-1] + 1))
    return out


def within_document_loss(logits: Any, batch: dict[str, Any]) -> Any:
    """Mean cross entropy of every position whose next token is in the same document, computed from
    the document spans alone: the loss a trainer means."""
    terms = []
    for r, start, end in documents(batch):
        for t in range(start, end - 1):
            terms.append(
                torch.nn.functional.cross_entropy(
                    logits[r, t][None].float(), batch["input_ids"][r, t + 1][None]
                )
            )
    return torch.stack(terms).mean()


def test_hugging_face_loss_with_labels_is_the_within_document_next_token_loss(packed: Path) -> None:
    model = llama("sdpa")
    for batch in list(iter_batches(str(packed), 4, seed=2))[:3]:
        b = tensors(batch)
        mask = block_causal_mask(b["document_ids"], torch.float32)
        with torch.no_grad():
            out = model(
                b["input_ids"], labels=b["labels"], position_ids=b["position_ids"], attention_mask=mask
            )
        want = within_document_loss(out.logits, b)
        assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
        # A loop of one's own takes shift_labels, already shifted: the same loss.
        own = torch.nn.functional.cross_entropy(
            out.logits.reshape(-1, VOCAB).float(), b["shift_labels"].reshape(-1)
        )
        assert own.item() == pytest.approx(want.item(), rel=1e-5)
        # Giving the model the pre-shifted targets trains token t+2: the mistake the names prevent.
        with torch.no_grad():
            wrong = model(
                b["input_ids"], labels=b["shift_labels"], position_ids=b["position_ids"], attention_mask=mask
            )
        assert abs(wrong.loss.item() - want.item()) > 1e-4


@pytest.mark.parametrize(("attn", "dtype"), [("sdpa", None), ("sdpa", "float32"), ("eager", "float32")])
def test_every_documents_logits_in_a_packed_batch_equal_its_logits_alone(
    packed: Path, attn: str, dtype: str | None
) -> None:
    model = llama(attn)
    batch = mixed_batch(packed, 4, seed=3)
    mask = block_causal_mask(batch["document_ids"], getattr(torch, dtype) if dtype else None)
    with torch.no_grad():
        logits = model(batch["input_ids"], position_ids=batch["position_ids"], attention_mask=mask).logits
        alone = [
            (r, s, e, model(batch["input_ids"][r : r + 1, s:e]).logits[0]) for r, s, e in documents(batch)
        ]
    assert sum(e - s for _, s, e, _ in alone) == int((batch["document_ids"] >= 0).sum())
    worst = max(float((x - logits[r, s:e]).abs().max()) for r, s, e, x in alone)
    assert worst < 1e-4
    if attn == "sdpa" and dtype is None:
        # position_ids alone do not keep sdpa's documents apart: the mask is needed.
        with torch.no_grad():
            unmasked = model(batch["input_ids"], position_ids=batch["position_ids"]).logits
        leaked = max(float((x - unmasked[r, s:e]).abs().max()) for r, s, e, x in alone)
        assert leaked > 1e-2


@pytest.mark.parametrize("per", ["document", "sequence"])
def test_loss_weights_give_the_mean_of_per_document_or_per_sequence_losses(packed: Path, per: str) -> None:
    """loss_weights="document": the weighted sum of a packed batch's token losses (from a Hugging
    Face model's logits, labels shifted as the model shifts them) equals the mean over its documents
    of each one's mean loss, computed by the model on the document alone (as an unpacked batch of
    one document a row trains); "sequence": the mean over rows of each row's mean loss. The plain
    mean of the batch (what the model's own loss gives) weighs long documents more."""
    model = llama("sdpa")
    with torch.no_grad():
        model.lm_head.weight *= 30  # sharp logits: documents' mean losses far apart (6.24 each, else)
    batches = iter_batches(str(packed), 4, seed=5, torch=True, loss_weights=per)
    batch = next(b for b in batches if b["document_ids"].max() >= 2)
    weights = batch["loss_weights"]
    assert weights.dtype == torch.float32 and float(weights.sum()) == pytest.approx(1.0, rel=1e-6)
    assert bool(((weights > 0) == (batch["labels"] != -100)).all())
    mask = block_causal_mask(batch["document_ids"], torch.float32)
    with torch.no_grad():
        out = model(
            batch["input_ids"],
            labels=batch["labels"],
            position_ids=batch["position_ids"],
            attention_mask=mask,
        )
        token = torch.nn.functional.cross_entropy(
            out.logits[:, :-1].reshape(-1, VOCAB).float(),
            batch["labels"][:, 1:].reshape(-1),
            reduction="none",
            ignore_index=-100,
        ).reshape(batch["labels"].shape[0], -1)
        weighted = float((token * weights[:, 1:]).sum())
        means: dict[int, list[float]] = {}
        for r, s, e in documents(batch):
            if e - s < 2:
                continue  # one token: nothing to predict within it (no weight either)
            alone = model(batch["input_ids"][r : r + 1, s:e], labels=batch["input_ids"][r : r + 1, s:e]).loss
            means.setdefault(r, []).append(float(alone))
    if per == "document":
        want = float(np.mean([m for row in means.values() for m in row]))
    else:
        rows = [(r, [(s, e) for rr, s, e in documents(batch) if rr == r and e - s >= 2]) for r in means]
        want = float(
            np.mean(
                [
                    sum(m * (e - s - 1) for m, (s, e) in zip(means[r], spans, strict=True))
                    / sum(e - s - 1 for s, e in spans)
                    for r, spans in rows
                ]
            )
        )
    assert weighted == pytest.approx(want, rel=1e-5)
    # The plain mean of the batch's targets (the model's own loss) is another number, and off by far
    # more than the weighted sum's rounding (~4e-7).
    assert abs(float(out.loss) - want) > 1e-3


def test_packed_dataset_gives_the_readers_loss_weights(packed: Path) -> None:
    want = [b["loss_weights"] for b in iter_batches(str(packed), 3, 0, 2, seed=4, loss_weights="sequence")]
    got = [
        b["loss_weights"].numpy()
        for b in PackedDataset(str(packed), 3, 0, 2, seed=4, loss_weights="sequence")
    ]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    with pytest.raises(ValueError, match="loss_weights must be one of document, sequence or None"):
        PackedDataset(str(packed), 3, loss_weights="token")


def test_flex_attention_mask_mod_from_document_ids(packed: Path) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    batch = mixed_batch(packed, 3, seed=4)
    doc = batch["document_ids"]
    rows, length = doc.shape

    def mask_mod(b: Any, h: Any, q: Any, k: Any) -> Any:
        return (doc[b, q] == doc[b, k]) & (k <= q)

    block = create_block_mask(mask_mod, B=rows, H=None, Q_LEN=length, KV_LEN=length, device="cpu")
    torch.manual_seed(1)
    q, k, v = (torch.randn(rows, 2, length, 16) for _ in range(3))
    flex = flex_attention(q, k, v, block_mask=block)
    dense = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=block_causal_mask(doc))
    assert float((flex - dense).abs().max()) < 1e-5


def test_hugging_face_datasets_reads_the_output(packed: Path, tmp_path: Path) -> None:
    import datasets

    ds = datasets.load_dataset(
        "parquet",
        data_files=sorted(str(p) for p in (packed / "data").glob("*.parquet")),
        split="train",
        cache_dir=str(tmp_path / "hf"),
    )
    manifest = json.loads((packed / "manifest.json").read_text())
    assert ds.num_rows == manifest["counts"]["packs"]
    assert set(ds.column_names) == {"input_ids", "doc_offsets", "doc_ids", "chunk_index", "num_tokens"}
    direct = pq.read_table(packed / "data").to_pylist()
    assert ds[0] == direct[0] and ds[ds.num_rows - 1] == direct[-1]
    assert sum(ds["num_tokens"]) == manifest["counts"]["tokens"]


def digests(batches: Any) -> list[str]:
    return [hashlib.sha1(b["input_ids"].numpy().tobytes()).hexdigest() for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_with_exactly_the_remaining_packs(packed: Path, workers: int) -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    def make(cls: Any) -> Any:
        ds = PackedDataset(str(packed), 2, rank=1, world_size=2, seed=5)
        return cls(
            ds, batch_size=None, num_workers=workers, multiprocessing_context="fork" if workers else None
        )

    expected = [
        hashlib.sha1(b["input_ids"].tobytes()).hexdigest() for b in iter_batches(str(packed), 2, 1, 2, seed=5)
    ]
    assert len(expected) >= 6
    assert digests(make(DataLoader)) == expected  # every step once, in order, whatever the workers
    loader = make(StatefulDataLoader)
    first, it = [], iter(loader)
    for _ in range(3):
        first.append(next(it))
    state = loader.state_dict()
    del it
    resumed = make(StatefulDataLoader)
    resumed.load_state_dict(state)
    assert digests(first) + digests(resumed) == expected
    assert digests(resumed) == expected  # the next epoch starts again from the first step


def test_packed_dataset_refuses_bad_settings_and_a_foreign_state(packed: Path) -> None:
    with pytest.raises(ValueError, match="last_batch must be one of"):
        PackedDataset(str(packed), 2, last_batch="pad")
    with pytest.raises(ValueError, match="rank < world_size"):
        PackedDataset(str(packed), 2, rank=3, world_size=2)
    state = PackedDataset(str(packed), 2, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"saved with other settings .*'seed': \(1, 2\)"):
        PackedDataset(str(packed), 2, seed=2).load_state_dict(state)


def test_dataloader_workers_read_each_row_group_once(
    packed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 workers, batches of 2 from row groups of 7 packs: consecutive steps (on different workers)
    share row groups. Each group is read once per epoch, not once per worker, and the batches are
    iter_batches' in its order."""
    from torch.utils.data import DataLoader

    import raypack.reader as reader_module

    log = tmp_path / "reads.log"
    real = reader_module.read_group

    def counted(pinned: Any, group: Any, seed: int, storage: Any) -> Any:
        with open(log, "a") as f:  # one short O_APPEND write a read: whole lines from every worker
            f.write(f"{group.name}:{group.index}\n")
        return real(pinned, group, seed, storage)

    monkeypatch.setattr(reader_module, "read_group", counted)
    expected = [
        hashlib.sha1(b["input_ids"].tobytes()).hexdigest() for b in iter_batches(str(packed), 2, 0, 1, seed=3)
    ]
    direct = log.read_text().splitlines()  # (the wrap at the end reads the first group again)
    assert len(set(direct)) > 8
    log.unlink()
    loader = DataLoader(
        PackedDataset(str(packed), 2, seed=3), batch_size=None, num_workers=4, multiprocessing_context="fork"
    )
    for epoch in range(2):
        assert digests(loader) == expected
        reads = log.read_text().splitlines()
        assert len(reads) == len(set(reads)) and set(reads) == set(direct), f"epoch {epoch}: {sorted(reads)}"
        log.unlink()
    leftovers = [p for p in (cache_base()).glob(f"raypack-loader-{os.getpid()}-*")]
    assert leftovers == []  # the last worker out of each epoch removed the shared directory


def test_a_packed_dataset_stays_on_its_version_and_refuses_a_state_from_another(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A rebuild commits between a checkpoint and its resume: the resumed loader must not silently
    read other packs at step k."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from raypack.pipeline.rebuild import run_rebuild
    from raypack.reader import pin_version

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=42)
    cfg_path = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": SEQ_LEN}, output={"shard_rows": 7}
    )
    cfg = load_config(str(cfg_path))
    root = cfg.output.path
    run_rebuild(cfg, log=lambda _: None)
    old_version = pin_version(root)
    old = [hashlib.sha1(b["input_ids"].tobytes()).hexdigest() for b in iter_batches(old_version, 2, seed=1)]

    ds = PackedDataset(root, 2, seed=1)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    del it
    (corpus / "part-000.jsonl").write_text(json.dumps({"text": "a new document " * 30}) + "\n")
    run_rebuild(cfg, log=lambda _: None)
    assert pin_version(root) != old_version

    # The dataset made before the rebuild still reads the version it pinned, every epoch.
    assert digests(StatefulDataLoader(ds, batch_size=None)) == old

    # A resume on the root (now the new version) is refused, clearly.
    def resumed(ds: PackedDataset, saved: dict[str, Any]) -> Any:
        loader = StatefulDataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        loader.load_state_dict(saved)
        return loader

    with pytest.raises(ValueError, match="a rebuild committed since") as refused:
        next(iter(resumed(PackedDataset(root, 2, seed=1), state)))
    assert f"make the PackedDataset on {old_version}" in str(refused.value)
    # On the version it began (the state as saved, as the error says), the epoch finishes exactly;
    # or it goes on on the new one, knowingly.
    on_old = resumed(PackedDataset(old_version, 2, seed=1), state)
    assert digests(first) + digests(on_old) == old
    knowingly = resumed(PackedDataset(root, 2, seed=1, follow_latest=True), state)
    new = [hashlib.sha1(b["input_ids"].tobytes()).hexdigest() for b in iter_batches(root, 2, seed=1)]
    assert digests(knowingly) == new[3:]
