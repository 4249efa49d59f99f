"""mds: MosaicML streaming's MDS, read by its StreamingDataset / LocalDataset and llm-foundry as is.

    data/index.json           the shards of the dataset (bucket: data/bucket=N/index.json, one MDS
                              dataset a bucket length, each a Stream of its own)
    data/part-NNNNN.mds       one uncompressed MDS shard an output file, a sample a pack

Columns (MDSWriter orders them by name): `doc_offsets` ndarray:int32 (cu_seqlens, as in parquet),
`num_tokens` int32, `tokens` ndarray:int32 (exactly the pack's length, padded with output.pad_id;
llm-foundry's convention for pre-tokenized text). A shard is what streaming.MDSWriter(columns,
size_limit=None) writes for the same samples, byte for byte (tests/test_formats.py compares them):
a sample count (uint32), sample offsets (uint32), the writer's config as JSON, the samples. Its
offsets are uint32, so a shard must stay under 4 GiB: shard_rows × seq_len is checked up front.
"""

from __future__ import annotations

import json
import posixpath
import struct
from typing import Any

import numpy as np

from raypack.errors import ConfigError
from raypack.formats import Packs, Settings, Spec, read_range

__all__ = ["COLUMNS", "FORMAT", "INDEX", "decode_shard"]

COLUMNS = {"doc_offsets": "ndarray:int32", "num_tokens": "int32", "tokens": "ndarray:int32"}
INDEX = "index.json"
_NAMES = sorted(COLUMNS)
_CONFIG = {
    "column_encodings": [COLUMNS[n] for n in _NAMES],
    "column_names": _NAMES,
    "column_sizes": [None if COLUMNS[n].startswith("ndarray") else 4 for n in _NAMES],
    "compression": None,
    "format": "mds",
    "hashes": [],
    "size_limit": None,
    "version": 2,
}
_CONFIG_BYTES = json.dumps(_CONFIG, sort_keys=True).encode()
# A sample's bytes at most, beside 4 a token: its offset, two sizes, two array headers (a byte and
# a uint32 shape each), num_tokens, and doc_offsets of up to seq_len + 1 entries (4 bytes each).
_SAMPLE_OVERHEAD = 4 + 8 + 2 * 5 + 4 + 4


def _shape_code(n: int) -> tuple[int, str]:
    """NDArray's shape dtype for a 1-d array of n values: the smallest uint that holds n."""
    for code, dtype in enumerate(("uint8", "uint16", "uint32", "uint64")):
        if n < 1 << (8 << code):
            return code, dtype
    raise ValueError(f"an array of {n} values")


def _ndarray(values: np.ndarray) -> bytes:
    """NDArray encoding with a fixed dtype and a dynamic shape: ndim << 2 | shape code, the shape, values."""
    code, dtype = _shape_code(len(values))
    return bytes([(1 << 2) | code]) + np.asarray([len(values)], dtype=dtype).tobytes() + values.tobytes()


def _parse_ndarray(data: bytes, dtype: str) -> np.ndarray:
    ndim, code = data[0] >> 2, data[0] & 3
    width = 1 << code
    shape = np.frombuffer(data, f"<u{width}", ndim, 1)
    return np.frombuffer(data, dtype, offset=1 + ndim * width).reshape(tuple(int(s) for s in shape))


def encode_shard(packs: Packs) -> bytes:
    offsets = packs.index.column("doc_offsets").combine_chunks()
    bounds = offsets.flatten().to_numpy().astype(np.int32)
    starts = offsets.offsets.to_numpy()
    num_tokens = packs.index.column("num_tokens").to_numpy().astype(np.int32)
    samples = []
    for p in range(packs.rows):  # ~10 µs a pack
        doc = _ndarray(bounds[starts[p] : starts[p + 1]])
        tokens = _ndarray(packs.input_ids[p])
        head = np.asarray([len(doc), len(tokens)], dtype=np.uint32).tobytes()
        samples.append(b"".join((head, doc, struct.pack("<i", int(num_tokens[p])), tokens)))
    sizes = np.fromiter((len(s) for s in samples), dtype=np.int64, count=len(samples))
    offsets_at = np.r_[0, np.cumsum(sizes)] + 4 + 4 * (len(samples) + 1) + len(_CONFIG_BYTES)
    if offsets_at[-1] >= 2**32:
        raise ValueError(f"an MDS shard of {offsets_at[-1]:,} bytes: over the 4 GiB its offsets address")
    head = struct.pack("<I", len(samples)) + offsets_at.astype(np.uint32).tobytes()
    return b"".join((head, _CONFIG_BYTES, *samples))


def decode_shard(data: bytes) -> list[dict[str, Any]]:
    """Every sample of a shard as raypack writes them: {doc_offsets, num_tokens, tokens}."""
    (n,) = struct.unpack_from("<I", data, 0)
    offsets = np.frombuffer(data, np.uint32, n + 1, 4).astype(np.int64)
    config = json.loads(data[4 + 4 * (n + 1) : int(offsets[0])])
    if config != _CONFIG:
        raise ValueError(f"an MDS shard of other columns or settings: {config}")
    return [_decode_sample(data[offsets[i] : offsets[i + 1]]) for i in range(n)]


def _decode_sample(sample: bytes) -> dict[str, Any]:
    doc_size, tokens_size = struct.unpack_from("<II", sample, 0)
    at = 8
    doc = _parse_ndarray(sample[at : at + doc_size], "<i4")
    at += doc_size
    (num_tokens,) = struct.unpack_from("<i", sample, at)
    at += 4
    tokens = _parse_ndarray(sample[at : at + tokens_size], "<i4")
    return {"doc_offsets": doc, "num_tokens": num_tokens, "tokens": tokens}


class Mds:
    name = "mds"
    suffix = ".mds"
    holds_index = False
    eos_bounded = False
    keeps_mask = False
    aligns = False

    def spec(self, settings: Settings) -> Spec:
        worst = settings.shard_rows * (8 * settings.seq_len + _SAMPLE_OVERHEAD) + 4096
        if worst >= 2**32:
            most = (2**32 - 4096) // (8 * settings.seq_len + _SAMPLE_OVERHEAD)
            raise ConfigError(
                f"output.format mds: a shard of {settings.shard_rows:,} packs of {settings.seq_len:,} tokens "
                f"may reach {worst / 2**30:.1f} GiB, over the 4 GiB an MDS shard's uint32 offsets address: "
                f"set output.shard_rows <= {most:,} (MosaicML suggests shards of ~64 MB)"
            )
        return Spec(self.name, settings.pad_id, "int32", settings.eos_id)

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        return {f"data/{packs.stem}.mds": encode_shard(packs)}

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        head = read_range(path, 0, 4, storage)
        (n,) = struct.unpack("<I", head)
        if first + count > n:
            raise ValueError(f"{path}: {n} samples, asked for {first + count}")
        offsets = np.frombuffer(read_range(path, 4 + 4 * first, 4 * (count + 1), storage), np.uint32)
        raw = read_range(path, int(offsets[0]), int(offsets[-1]) - int(offsets[0]), storage)
        local = offsets.astype(np.int64) - int(offsets[0])
        out = np.empty((count, capacity), dtype=np.int32)
        for i in range(count):
            tokens = _decode_sample(raw[local[i] : local[i + 1]])["tokens"]
            if len(tokens) != capacity:
                raise ValueError(f"{path}: sample {first + i} holds {len(tokens)} tokens, not {capacity}")
            out[i] = tokens
        return out

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        samples = decode_shard(data)
        if any(len(s["tokens"]) != capacity for s in samples):
            raise ValueError(f"a sample's tokens are not {capacity} long")
        return np.array([s["tokens"] for s in samples], dtype=np.int32).reshape(-1, capacity)

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> None:
        return None

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        """index.json of every directory of shards (one, or one a bucket length), as MDSWriter writes
        it (no hashes: the manifest holds each shard's sha256)."""
        by_dir: dict[str, list[dict[str, Any]]] = {}
        for f in sorted(files, key=lambda f: str(f["path"])):
            directory, base = posixpath.split(str(f["path"]))
            raw = {"basename": base, "bytes": int(f["bytes"]), "hashes": {}}
            by_dir.setdefault(directory, []).append(
                {**_CONFIG, "samples": int(f["rows"]), "raw_data": raw, "zip_data": None}
            )
        return {
            posixpath.join(d, INDEX): json.dumps({"shards": shards, "version": 2}, sort_keys=True).encode()
            for d, shards in by_dir.items()
        }

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        path = next(iter(data))
        try:
            samples = decode_shard(data[path])
        except (ValueError, struct.error) as e:
            return [f"{path}: not a readable MDS shard ({e})"]
        offsets = packs.index.column("doc_offsets").to_pylist()
        num_tokens = packs.index.column("num_tokens").to_pylist()
        for p, sample in enumerate(samples):
            if sample["doc_offsets"].tolist() != offsets[p] or sample["num_tokens"] != num_tokens[p]:
                return [f"{path}: sample {p}'s doc_offsets or num_tokens differ from the pack index"]
        return []


FORMAT = Mds()
