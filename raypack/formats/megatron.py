"""megatron: Megatron-LM's IndexedDataset, a `.bin`/`.idx` pair per output file, read by megatron-core's
IndexedDataset and GPTDataset as they are.

A pack is one sequence of exactly seq_len tokens and one document of the `.idx` (GPTDataset shuffles
documents, so it shuffles packs, never cuts one). GPTDataset reads them as packs only with
`add_extra_token_to_sequence=False` (else each sample takes seq_len + 1 tokens and straddles two
packs); docs/output-format.md gives the settings. Documents
inside a pack end in EOS (tokenizer.add_eos is required), padding is written as EOS too, so
`--eod-mask-loss` never trains on it and `--reset-position-ids` / `--reset-attention-mask` restart
at each document. With pack.pad_multiple each document's alignment padding is EOS too, and the
THD path's boundaries (cu_seqlens, cu_seqlens_padded: megatron-core's PackedSeqParams) are in the
pack index beside the data (doc_offsets, padded_offsets), which raypack's reader turns into them;
GPTDataset's own samples know no THD. Tokens are uint16 where the vocabulary has fewer than
65,500 ids (Megatron's own rule, DType.optimal_dtype, on the largest id), else int32 (the `.idx`
has no uint32).

`.idx` layout (megatron/core/datasets/indexed_dataset.py, _IndexWriter): the magic `MMIDIDX\\0\\0`,
`<Q` version 1, `<B` dtype code, `<Q` sequences, `<Q` document indices (documents + 1), then int32
sequence lengths, int64 byte pointers into the `.bin`, int64 document indices.
"""

from __future__ import annotations

import os
import struct
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
from raypack.storage import is_uri, join

__all__ = ["DATA_ARGS", "FORMAT", "parse_index"]

MAGIC = b"MMIDIDX\x00\x00"
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8
DTYPE_CODES = {
    "uint8": 1,
    "int8": 2,
    "int16": 3,
    "int32": 4,
    "int64": 5,
    "float64": 6,
    "float32": 7,
    "uint16": 8,
}
# Megatron's DType.optimal_dtype: uint16 below this vocabulary size, else int32.
UINT16_BELOW = 65500
# `--data-args-path` file: "weight prefix" pairs for every pair of the dataset.
DATA_ARGS = "megatron_data_args.txt"


def parse_index(data: bytes) -> dict[str, Any]:
    """An `.idx` file's fields; ValueError when it is not one."""
    if len(data) < _HEADER or data[: len(MAGIC)] != MAGIC:
        raise ValueError("not a Megatron .idx file (magic)")
    version, code, sequences, documents = struct.unpack_from("<QBQQ", data, len(MAGIC))
    size = _HEADER + sequences * (4 + 8) + documents * 8
    if len(data) != size:
        raise ValueError(f"{len(data)} bytes, the header implies {size}")
    at = _HEADER
    lengths = np.frombuffer(data, np.int32, sequences, at)
    pointers = np.frombuffer(data, np.int64, sequences, at + 4 * sequences)
    document_indices = np.frombuffer(data, np.int64, documents, at + 12 * sequences)
    names = {v: k for k, v in DTYPE_CODES.items()}
    return {
        "version": version,
        "dtype": names.get(code, f"code {code}"),
        "lengths": lengths,
        "pointers": pointers,
        "document_indices": document_indices,
    }


class Megatron:
    name = "megatron"
    suffix = ".bin"
    holds_index = False
    eos_bounded = True
    keeps_mask = False
    aligns = True

    def spec(self, settings: Settings) -> Spec:
        eos = require_one_length_and_eos(
            settings,
            "output.format megatron: Megatron's GPTDataset reads every sequence at one seq_length",
            "Megatron finds documents by their EOD token (--eod-mask-loss, --reset-position-ids, "
            "--reset-attention-mask)",
        )
        if settings.max_id >= 2**31:
            raise ConfigError(
                f"output.format megatron: token id {settings.max_id:,} does not fit Megatron's int32 tokens"
            )
        # Megatron's rule on the vocabulary's size, applied to the ids it must hold: a vocabulary
        # with gaps has ids past its size.
        dtype = "uint16" if settings.max_id + 1 < UINT16_BELOW else "int32"
        return Spec(self.name, eos, dtype, eos)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        n, capacity = packs.rows, packs.capacity
        itemsize = np.dtype(spec.dtype).itemsize
        header = MAGIC + struct.pack("<QBQQ", 1, DTYPE_CODES[spec.dtype], n, n + 1)
        index = b"".join(
            (
                header,
                np.full(n, capacity, dtype=np.int32).tobytes(),
                (np.arange(n, dtype=np.int64) * (capacity * itemsize)).tobytes(),
                np.arange(n + 1, dtype=np.int64).tobytes(),  # a document a pack
            )
        )
        data = tokens_as(packs.input_ids, spec.dtype, f"data/{packs.stem}.bin").tobytes()
        return {f"data/{packs.stem}.bin": data, f"data/{packs.stem}.idx": index}

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        return read_flat(path, spec.dtype, capacity, first, count, storage)

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        return decode_flat(data, spec.dtype, capacity)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> None:
        return None

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        """megatron_data_args.txt for `--data-args-path`: each pair's prefix (where the dataset is now;
        a moved dataset needs the file made again, or prefixes given to --data-path by hand) weighted by
        its tokens, padding included, so a blend reads the pairs as one dataset, each pack once an epoch."""
        lines = []
        for f in sorted(files, key=lambda f: str(f["path"])):
            prefix = join(_absolute(dataset), str(f["path"]).rsplit(".", 1)[0])
            lines.append(f"{int(f['rows']) * int(f['bucket_length'])} {prefix}\n")
        return {DATA_ARGS: "".join(lines).encode()}

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        idx_path = next(p for p in data if p.endswith(".idx"))
        try:
            idx = parse_index(data[idx_path])
        except ValueError as e:
            return [f"{idx_path}: {e}"]
        problems = []
        n, capacity = packs.rows, packs.capacity
        stride = capacity * np.dtype(spec.dtype).itemsize
        if idx["version"] != 1 or idx["dtype"] != spec.dtype:
            found = f"version {idx['version']}, dtype {idx['dtype']}"
            problems.append(f"{idx_path}: {found}; expected version 1, dtype {spec.dtype}")
        elif len(idx["lengths"]) != n or np.any(idx["lengths"] != capacity):
            problems.append(f"{idx_path}: sequences are not {n} of {capacity} tokens each")
        elif not np.array_equal(idx["pointers"], np.arange(n, dtype=np.int64) * stride):
            problems.append(f"{idx_path}: sequence pointers do not follow one another in the .bin")
        elif not np.array_equal(idx["document_indices"], np.arange(n + 1, dtype=np.int64)):
            problems.append(f"{idx_path}: not one document a sequence")
        return problems


def _absolute(dataset: str) -> str:
    return dataset if is_uri(dataset) else os.path.abspath(dataset)


FORMAT = Megatron()
