"""An oracle for raypack's output, written apart from the pipeline (it imports nothing of raypack):
it knows every document because it wrote the corpus, tokenizes with `tokenizers`, renders chat with
transformers' apply_chat_template, and reads the output through each format's own client (pyarrow
for Parquet, `datasets` for TRL's rows, megatron-core's IndexedDataset, OLMo-core's NumpyFSLDataset,
MosaicML streaming in its own environment). tests/test_combinations.py draws the jobs it checks.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
IGNORE = -100


@dataclass
class Doc:
    """One input record as the oracle wrote it, and what raypack must make of it."""

    id: str
    """The id raypack must give it (generated ids: <relpath>:<line> or :<row>, or a text file's path)."""
    source: str
    text: str | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    completion: str | None = None
    reject: bool = False
    """Not a document (empty, whitespace only): rejects/ must hold it, the packs must not."""
    meta: dict[str, Any] | None = None
    """Its metadata as raypack.reader.document_metadata must give it (input.metadata_fields)."""


@dataclass
class Corpus:
    docs: list[Doc] = field(default_factory=list)
    sources: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A mixture's rules by source (repeat: r, or none)."""


# -- writing ---------------------------------------------------------------------------------------


def write_records(path: Path, fmt: str, records: list[dict[str, Any]]) -> None:
    """Records as a file of `fmt`: jsonl, jsonl.gz or parquet (one row a record)."""
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(records), path, row_group_size=max(1, len(records) // 3))
        return
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if fmt == "jsonl.gz" else data)


def suffix(fmt: str) -> str:
    return {"jsonl": ".jsonl", "jsonl.gz": ".jsonl.gz", "parquet": ".parquet", "text": ".txt"}[fmt]


def generated_id(relpath: str, fmt: str, index: int) -> str:
    """raypack's id for record `index` (from 0) of a file: JSONL lines count from 1, rows from 0."""
    if fmt == "text":
        return relpath
    return f"{relpath}:{index + 1 if fmt.startswith('jsonl') else index}"


# -- what the packs must hold ----------------------------------------------------------------------


def plain_tokens(tok: Any, text: str, bos: int | None, eos: int | None) -> tuple[list[int], list[bool]]:
    ids = tok.encode(text, add_special_tokens=False).ids
    ids = ([bos] if bos is not None else []) + ids + ([eos] if eos is not None else [])
    return ids, [True] * len(ids)


def pair_tokens(
    tok: Any, prompt: str, completion: str, bos: int | None, eos: int | None, loss: str
) -> tuple[list[int], list[bool]]:
    """TRL's rule: the ids of prompt + completion, the completion's being those after the prompt's
    own ids; EOS trained with the completion, BOS not."""
    prompt_ids = tok.encode(prompt, add_special_tokens=False).ids
    full = tok.encode(prompt + completion, add_special_tokens=False).ids
    if full[: len(prompt_ids)] != prompt_ids:
        raise AssertionError(f"the oracle's pair {prompt!r} + {completion!r} does not keep the prompt's ids")
    mask = [loss == "all"] * len(prompt_ids) + [True] * (len(full) - len(prompt_ids))
    if bos is not None:
        full, mask = [bos, *full], [loss == "all", *mask]
    if eos is not None:
        full, mask = [*full, eos], [*mask, True]
    return full, mask


def chat_tokens(
    hf: Any, messages: list[dict[str, Any]], template: str | None, loss: str
) -> tuple[list[int], list[bool]]:
    """transformers' ids of the conversation and its trained tokens: the {% generation %} blocks'
    (return_assistant_tokens_mask), or, without markers, each assistant turn as what rendering
    messages[:i+1] adds to messages[:i] with the generation prompt, from the first token holding a
    character of it through the last."""
    args = {"chat_template": template} if template else {}
    if loss == "all":
        ids = list(hf.apply_chat_template(messages, tokenize=True, return_dict=True, **args)["input_ids"])
        return ids, [True] * len(ids)
    if template is not None and "generation" in template:
        out = hf.apply_chat_template(
            messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **args
        )
        return list(out["input_ids"]), [bool(m) for m in out["assistant_masks"]]
    text = hf.apply_chat_template(messages, tokenize=False, **args)
    enc = hf(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    mask = [False] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start = len(hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True, **args))
        end = len(hf.apply_chat_template(messages[: i + 1], tokenize=False, **args))
        # The tokens holding a character of the turn, first to last: through the *last* token that
        # holds its last character (raypack.text.chat.token_mask's rule, where transformers' char_to_token
        # gives the first). A SentencePiece BPE writes the "\n" after <|im_end|> as "▁" and <0x0A>,
        # both holding it: the turn's "\n" is both.
        held = [t for t, (a, b) in enumerate(offsets) if b > a and b > start and a < end]
        if held:
            for t in range(held[0], held[-1] + 1):
                mask[t] = True
    return ids, mask


# -- reading the output through each format's client ----------------------------------------------


@dataclass
class Pack:
    capacity: int
    tokens: list[int]
    """Its real tokens (num_tokens of them)."""
    padding: list[int]
    """What its padding positions hold ([] for the unpadded formats)."""
    items: list[tuple[str, int, int, int]]
    """(doc_id, chunk, start, end) of every item."""
    trained: list[bool] | None
    """Per real token: trained (a label), as the format says; None where it keeps no mask."""


def read_output(out: Path, manifest: dict[str, Any], work: Path) -> list[Pack]:
    fmt = manifest["format"]["name"]
    packs: list[Pack] = []
    mds = _mds(out, work) if fmt == "mds" else None
    for f in sorted(manifest["files"], key=lambda f: f["path"]):
        capacity = int(f["bucket_length"])
        index = pq.read_table(out / (f.get("index") or f["path"])).to_pylist()
        if fmt == "parquet":
            rows = index
            tokens = [r["input_ids"] for r in rows]
            masks = [r.get("loss_mask") for r in rows]
        elif fmt == "trl":
            import datasets

            rows = datasets.load_dataset(
                "parquet", data_files=[str(out / f["path"])], split="train", cache_dir=str(work / "hf")
            )
            tokens = list(rows["input_ids"])
            masks = [[label != IGNORE for label in labels] for labels in rows["labels"]]
            if [list(np.diff(r["doc_offsets"])) for r in index] != [list(s) for s in rows["seq_lengths"]]:
                raise AssertionError(f"{f['path']}: seq_lengths are not the pack index's items")
        elif fmt == "bridge":
            rows = pq.read_table(out / f["path"]).to_pylist()
            tokens = [r["input_ids"] for r in rows]
            masks = []
            for r in rows:  # Bridge's loss_mask[j] trains token j + 1 (within its item)
                starts = set(r["seq_start_id"])
                masks.append(
                    [t not in starts and bool(r["loss_mask"][t - 1]) for t in range(len(r["input_ids"]))]
                )
        elif fmt == "megatron":
            from megatron.core.datasets.indexed_dataset import IndexedDataset

            ds = IndexedDataset(str(out / f["path"][: -len(".bin")]))
            tokens = [np.array(ds[i]).tolist() for i in range(len(ds))]
            del ds
            masks = [None] * len(tokens)
        elif fmt == "olmo":
            tokens, masks = _olmo(out, f, manifest, capacity, index, work)
        elif fmt == "mds":
            assert mds is not None
            tokens, masks = mds.pop(f["path"]), [None] * len(index)
        else:
            raise AssertionError(f"no client for {fmt}")
        if len(tokens) != len(index):
            raise AssertionError(f"{f['path']}: {len(tokens)} packs read, {len(index)} indexed")
        eos = manifest["format"].get("eos_id") if fmt in ("megatron", "olmo") else None
        for row, ids, mask in zip(index, tokens, masks, strict=True):
            n, offsets = row["num_tokens"], row["doc_offsets"]
            items = [
                (doc, chunk, offsets[k], offsets[k + 1])
                for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["chunk_index"], strict=True))
            ]
            # Megatron (--reset-position-ids, --eod-mask-loss) and OLMo-core find documents by EOS:
            # an item followed by another in its pack must end in EOS, or the two read as one.
            for doc, chunk, _, end in items[:-1]:
                if eos is not None and ids[end - 1] != eos:
                    raise AssertionError(
                        f"{f['path']}: {doc} chunk {chunk} lacks EOS and another item follows it"
                    )
            packs.append(
                Pack(capacity, list(ids[:n]), list(ids[n:]), items, None if mask is None else list(mask[:n]))
            )
    return packs


def _olmo(
    out: Path,
    f: dict[str, Any],
    manifest: dict[str, Any],
    capacity: int,
    index: list[dict[str, Any]],
    work: Path,
) -> tuple[list[Any], list[Any]]:
    """The tokens and label masks OLMo-core reads, its documents (found by EOS, bos_token_id unset:
    with it set, OLMo-core cuts documents at BOS too) checked against the pack index's."""
    from olmo_core.data import NumpyFSLDataset

    fmt = manifest["format"]
    ds = NumpyFSLDataset(
        str(out / f["path"]),
        sequence_length=capacity,
        pad_token_id=int(fmt["pad_id"]),
        eos_token_id=int(fmt["eos_id"]),
        vocab_size=int(manifest["tokenizer"]["max_id"]) + 1,
        dtype=np.dtype(
            fmt["dtype"]
        ).type,  # the manifest's dtype: OLMo-core's default uint16 misreads larger ids
        generate_doc_lengths=True,
        label_mask_paths=[str(out / "label_mask" / Path(f["path"]).name)],
    )
    ds.work_dir = str(work / "olmo")
    tokens, masks = [], []
    for i in range(len(ds)):
        item = ds[i]
        offsets, n = index[i]["doc_offsets"], index[i]["num_tokens"]
        if item["doc_lens"].tolist() != np.diff(offsets).tolist() + ([capacity - n] if n < capacity else []):
            raise AssertionError(
                f"{f['path']} instance {i}: OLMo-core finds documents {item['doc_lens'].tolist()}"
            )
        tokens.append(item["input_ids"].tolist())
        masks.append(item["label_mask"].tolist())
    return tokens, masks


def mds_python() -> Path | None:
    python = ROOT / ".venv-mds" / "bin" / "python"
    return python if python.exists() else None


def _mds(out: Path, work: Path) -> dict[str, list[list[int]]]:
    """Every MDS file's samples' tokens, read by MosaicML streaming (its LocalDataset, in .venv-mds),
    by data file path."""
    python = mds_python()
    if python is None:
        raise AssertionError("no .venv-mds for MosaicML streaming")
    saved = work / "mds.npz"
    subprocess.run([str(python), str(ROOT / "tests/clients/mds_client.py"), str(out), str(saved)], check=True)
    got = np.load(saved)
    manifest = json.loads((out / "manifest.json").read_text())
    by_dir: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for f in sorted(manifest["files"], key=lambda f: f["path"]):
        by_dir[str(Path(f["path"]).parent)].append(f)  # data, or data/bucket=N: an MDS dataset each
    found = {}
    for name, files in by_dir.items():
        tokens = got[f"{name}/tokens"].tolist()
        first = 0
        for f in files:
            found[f["path"]] = tokens[first : first + int(f["rows"])]
            first += int(f["rows"])
    return found


# -- the checks ------------------------------------------------------------------------------------


@dataclass
class Expected:
    tokens: list[int]
    trained: list[bool]


def decomposed(length: int, seq_len: int, low: int) -> list[int]:
    """A document's chunks under dataset decomposition, from its start: seq_len while more than
    seq_len is left, then the powers of two of the rest, largest first, none under `low`."""
    sizes = []
    while length >= seq_len:
        sizes.append(seq_len)
        length -= seq_len
    power = seq_len // 2
    while power >= low:
        if length >= power:
            sizes.append(power)
            length -= power
        power //= 2
    return sizes


def check(
    packs: list[Pack],
    expected: dict[str, Expected],
    copies: dict[str, int],
    *,
    partial: dict[str, int] | None = None,
    seq_len: int,
    overflow: str,
    pad: int | None,
    masked: bool,
    max_depth: int | None,
    min_seq_len: int | None = None,
) -> None:
    """Every expected document in the packs `copies` times (chunks of a split one in order, adding up
    to its tokens; a truncated one its first seq_len; a dropped one nowhere; a mixture's `partial`
    copy only its first chunks, as many tokens as `partial` gives), token for token and,
    where the format keeps one, mask bit for mask bit (an item's first token never trained); nothing
    else in the packs; no pack over its capacity or max_depth; padding all `pad`. `min_seq_len`
    (pack.algorithm decompose): each kept document in its power-of-two chunks instead, largest
    first, none over seq_len or under min_seq_len (decomposed), a chunk a pack."""
    found: dict[str, dict[int, list[tuple[list[int], list[bool] | None]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for p in packs:
        if len(p.tokens) > p.capacity:
            raise AssertionError(f"a pack of {p.capacity} holds {len(p.tokens)} tokens")
        if min_seq_len is not None and (len(p.items) != 1 or len(p.tokens) != p.capacity):
            raise AssertionError(
                f"a pack of {p.capacity} holds {len(p.items)} chunks, {len(p.tokens)} tokens"
            )
        if max_depth is not None and len(p.items) > max_depth:
            raise AssertionError(f"a pack holds {len(p.items)} items, over pack.max_depth {max_depth}")
        if pad is not None and any(t != pad for t in p.padding):
            raise AssertionError(f"padding holds {sorted(set(p.padding) - {pad})}, not {pad}")
        for doc, chunk, lo, hi in p.items:
            mask = None if p.trained is None else p.trained[lo:hi]
            found[doc][chunk].append((p.tokens[lo:hi], mask))
    extra = set(found) - {d for d, n in copies.items() if n}
    if extra:
        raise AssertionError(f"the packs hold documents the oracle does not expect: {sorted(extra)[:3]}")
    for doc, want in expected.items():
        n = copies.get(doc, 1)
        keep = len(want.tokens)
        if overflow == "truncate":
            keep = min(keep, seq_len)
        elif overflow == "drop" and keep > seq_len:
            keep = 0
        chunks = found.get(doc, {})
        sizes = None
        if min_seq_len is not None:
            sizes = decomposed(keep, seq_len, min_seq_len)
            keep = sum(sizes)
        if not keep or not n:
            if chunks:
                raise AssertionError(f"{doc}: in the packs, expected out ({keep} tokens kept, {n} copies)")
            continue
        # Each chunk once a copy; a partial copy holds only the chunks of its first tokens.
        cut = (partial or {}).get(doc)
        if cut is not None and (overflow != "split" or cut % seq_len or not 0 < cut < keep):
            raise AssertionError(
                f"{doc}: a partial copy of {cut} tokens of {keep}, not whole chunks of {seq_len}"
            )
        wanted_copies = {
            c: n - (cut is not None and c * seq_len >= cut) for c in range(-(-keep // seq_len) if keep else 0)
        }
        if sizes is not None:
            wanted_copies = dict.fromkeys(range(len(sizes)), n)
            if [len(chunks[c][0][0]) if c in chunks else 0 for c in range(len(sizes))] != sizes:
                raise AssertionError(f"{doc}: chunks are not its power-of-two decomposition {sizes}")
        wanted_copies = {c: k for c, k in wanted_copies.items() if k}
        if {c: len(parts) for c, parts in chunks.items()} != wanted_copies:
            raise AssertionError(
                f"{doc}: chunks {sorted(chunks)} with copies {[len(v) for v in chunks.values()]}, "
                f"expected {wanted_copies}"
            )
        if n == 1 and cut is not None:
            keep = cut
        for parts in chunks.values():
            if any(p != parts[0] for p in parts):
                raise AssertionError(f"{doc}: its copies differ")
        tokens = [t for k in sorted(chunks) for t in chunks[k][0][0]]
        if tokens != want.tokens[:keep]:
            raise AssertionError(f"{doc}: {len(tokens)} tokens in the packs differ from the {keep} expected")
        if masked:
            at = 0
            for k in sorted(chunks):
                ids, mask = chunks[k][0]
                if mask is None:
                    raise AssertionError(f"{doc}: no mask where the format keeps one")
                wanted = [False, *want.trained[at + 1 : at + len(ids)]]
                if mask != wanted:
                    raise AssertionError(f"{doc} chunk {k}: mask {mask} differs from {wanted}")
                at += len(ids)


def work_dir() -> Path:
    """A directory of its own for one drawn job (hypothesis runs many in one test)."""
    return Path(tempfile.mkdtemp(prefix="raypack-oracle-"))
