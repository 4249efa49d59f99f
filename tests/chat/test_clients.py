"""The real clients of chat packs: a tiny random Llama (nothing downloaded) trained by TRL on the trl
rows, the same conversations packed by TRL itself, raypack's reader, and Megatron-Bridge's collate."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.chat.conftest import SEQ

transformers = pytest.importorskip("transformers")

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
    """With docs/trainers.md's mask (block_causal_mask of the reader's document_ids) every conversation's
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

    if "megatron.bridge" not in sys.modules:  # a second call finds the stand-in, which has no spec
        spec = importlib.util.find_spec("megatron.bridge")
        if spec is None:
            need("megatron.bridge")
            raise AssertionError("unreachable")
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


@pytest.fixture(scope="module")
def aligned_bridge(tmp_path_factory: pytest.TempPathFactory, corpus: Path, model: Path) -> Path:
    """The chat corpus packed with pack.pad_multiple 8 as Megatron-Bridge's files."""
    from raypack.pipeline.job import run_job
    from tests.chat.conftest import job

    tmp = tmp_path_factory.mktemp("aligned-chat")
    run_job(
        job(tmp, corpus, model, "bridge", pack={"pad_multiple": 8}, output={"format": "bridge"}),
        log=lambda _: None,
    )
    return tmp / "bridge"


def test_megatron_bridge_collates_aligned_packs_into_cp_ready_sequences(
    aligned_bridge: Path, hf: Any, tmp_path: Path
) -> None:
    """Bridge's own collate (pad_seq_to_mult 8, as its recipes set 2 × CP) over raypack's aligned
    bridge files: every sequence of its cu_seqlens a multiple of 8 (what CP 4 needs), at the pack
    index's padded boundaries, the real tokens where the pack index puts them (verify checks those
    against the conversations re-tokenized), cu_seqlens_unpadded the real lengths less their
    trailing EOS (Bridge's rule), and no loss on the padding."""
    import json
    import types

    from raypack.formats import read_packs, spec_of
    from raypack.verifier import verify

    report = verify(str(aligned_bridge), sample=30)
    assert report.ok, report.problems
    manifest = json.loads((aligned_bridge / "manifest.json").read_text())
    eos, entry = manifest["format"]["eos_id"], manifest["files"][0]
    assert manifest["format"]["pad_id"] == eos and manifest["format"]["pad_multiple"] == 8
    packs = read_packs(str(aligned_bridge), entry, spec_of(manifest), None)
    assert packs.loss_mask is not None
    rows = pq.read_table(aligned_bridge / entry["path"]).to_pylist()
    npy = tmp_path / "packed.npy"
    np.save(npy, np.array(rows, dtype=object), allow_pickle=True)
    ds = bridge_dataset_class()(
        str(npy),
        types.SimpleNamespace(eos_id=eos),
        max_seq_length=SEQ,
        answer_only_loss=True,
        prompt_template="{input} {output}",
        label_key="output",
        truncation_field="input",
        pad_seq_to_mult=8,
    )
    batch = ds.collate_fn([ds[i] for i in range(len(rows))])
    padded_items = items = 0
    for r, row in enumerate(packs.index.to_pylist()):
        real, padded = row["doc_offsets"], row["padded_offsets"]
        ids, mask = packs.input_ids[r].tolist(), packs.loss_mask[r].tolist()
        cu = [c for c in batch["cu_seqlens"][r].tolist() if c >= 0]
        assert cu[: len(padded)] == padded and all(c % 8 == 0 for c in cu)
        unpadded = [c for c in batch["cu_seqlens_unpadded"][r].tolist() if c >= 0]
        for k in range(len(real) - 1):
            s, n, end = padded[k], real[k + 1] - real[k], padded[k + 1]
            item = ids[s : s + n]
            assert batch["tokens"][r, s : s + n].tolist() == item  # the real tokens, in place
            assert batch["tokens"][r, s + n : end].tolist() == [eos] * (end - s - n)
            padded_items, items = padded_items + (end > s + n), items + 1
            stripped = len(item) - next(i for i, t in enumerate(reversed(item)) if t != eos)
            assert unpadded[k + 1] - unpadded[k] == stripped
            # Bridge trains target t + 1 where our mask does and the input is not EOS; never the padding.
            want = [int(bool(mask[t + 1]) and ids[t] != eos) for t in range(s, s + n - 1)]
            assert batch["loss_mask"][r, s : s + n - 1].tolist() == want
            assert not batch["loss_mask"][r, s + n - 1 : end].any()
    assert 2 * padded_items >= items > 0  # most items have padding (7 in 8 of random lengths)
