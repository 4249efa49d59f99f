"""olmo: OLMo-core's token files, read by its NumpyFSLDataset as they are.

    data/part-NNNNN.npy          the packs' tokens back to back, headerless (numpy's tofile: np.load
                                 refuses them, np.memmap reads them), dtype the smallest unsigned int
                                 that holds the largest id (OLMo-core's own rule,
                                 on vocab_size - 1; ids may have gaps)
    data/part-NNNNN.csv.gz       "start,end" of every document (item) in that file's token stream: the
                                 metadata OLMo-core reads for document boundaries (iter_document_indices)
    label_mask/part-NNNNN.npy    np.bool_, one a token: True where the token is a training target (a
                                 real token that is not its document's first), for label_mask_paths

NumpyFSLDataset cuts each file into non-overlapping seq_len windows, so with packs of exactly seq_len
tokens instance i of a file is pack i. Documents end in EOS (tokenizer.add_eos is required), so
`generate_doc_lengths` gives each pack's document lengths, and a last "document" of padding when
the pack is not full. Without the label masks OLMo-core trains every position, padding and the
first token of each document (predicted across the boundary) included; with them its loss is
raypack's within-document loss. The masks are in a directory of their own so that a glob of
data/*.npy takes token files only. Bytes: 1 a token for the mask beside 2 (uint16) or 4 (uint32).
"""

from __future__ import annotations

import gzip
from typing import Any

import numpy as np

from raypack.errors import ConfigError
from raypack.formats import (
    Packs,
    Settings,
    Spec,
    decode_flat,
    read_flat,
    require_one_length_and_eos,
    tokens_as,
)

__all__ = ["FORMAT", "MASK_DIR", "label_mask"]

MASK_DIR = "label_mask"
_DTYPES = ("uint8", "uint16", "uint32", "uint64")


def label_mask(packs: Packs) -> np.ndarray:
    """(packs, capacity) bool: True on every real token but each item's first."""
    mask = np.arange(packs.capacity)[None, :] < packs.index.column("num_tokens").to_numpy()[:, None]
    starts, _ = packs.item_bounds()
    flat = mask.reshape(-1)
    flat[starts] = False
    return mask


def _documents(packs: Packs) -> bytes:
    starts, ends = packs.item_bounds()
    text = "".join(f"{s},{e}\n" for s, e in zip(starts.tolist(), ends.tolist(), strict=True))
    return gzip.compress(text.encode(), compresslevel=6, mtime=0)  # mtime 0: the same bytes every run


class Olmo:
    name = "olmo"
    suffix = ".npy"
    holds_index = False
    eos_bounded = True
    keeps_mask = False
    aligns = False

    def spec(self, settings: Settings) -> Spec:
        eos = require_one_length_and_eos(
            settings,
            "output.format olmo: OLMo-core's NumpyFSLDataset reads one sequence_length",
            "OLMo-core finds documents by EOS (generate_doc_lengths)",
        )
        if settings.pad_id == eos:  # the pad fell back to EOS: the tokenizer names no pad token
            raise ConfigError(
                f"output.format olmo: OLMo-core finds documents by EOS, so padding of EOS (id {eos}) "
                "would read as one-token documents; set output.pad_id (raypack convert: --pad-id) to "
                "another id (padding is never trained: e.g. the tokenizer's <unk> or another special token)"
            )
        dtype = next(d for d in _DTYPES if settings.max_id <= np.iinfo(d).max)
        return Spec(self.name, settings.pad_id, dtype, eos)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        return {
            f"data/{packs.stem}.npy": tokens_as(
                packs.input_ids, spec.dtype, f"data/{packs.stem}.npy"
            ).tobytes(),
            f"data/{packs.stem}.csv.gz": _documents(packs),
            f"{MASK_DIR}/{packs.stem}.npy": label_mask(packs).tobytes(),
        }

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        return read_flat(path, spec.dtype, capacity, first, count, storage)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        return decode_flat(data, spec.dtype, capacity)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> None:
        return None

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        return {}

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        problems = []
        docs = next(p for p in data if p.endswith(".csv.gz"))
        if gzip.decompress(data[docs]) != gzip.decompress(_documents(packs)):
            problems.append(f"{docs}: the document bounds are not the pack index's")
        mask = next(p for p in data if p.startswith(f"{MASK_DIR}/"))
        if data[mask] != label_mask(packs).tobytes():
            problems.append(f"{mask}: not the packs' label mask (every real token but each document's first)")
        return problems


FORMAT = Olmo()
