"""Output formats: how one output file's packs are stored. One module a format behind one small
interface (`Format`), picked from `FORMATS`; the write task (raypack.pipeline.write.materialize) builds a
file's `Packs` and hands them over without knowing which format it writes.

    parquet   data/part-NNNNN.parquet: a row a pack (schema.PACKED), raypack's own
    megatron  data/part-NNNNN.bin + .idx: Megatron-LM's IndexedDataset, a sequence (and document) a pack
    olmo      data/part-NNNNN.npy + .csv.gz, label_mask/part-NNNNN.npy: OLMo-core's token files
    mds       data/part-NNNNN.mds + data/index.json: MosaicML streaming's MDS

Every format but parquet also writes `packs/part-NNNNN.parquet`, the file's pack index
(schema.PACK_INDEX: doc_offsets, doc_ids, chunk_index, num_tokens, 1,024 packs a row group), from
which raypack's reader, `verify` and `convert` know each pack's documents; the tokens themselves are
read back through the format's own files. It costs ~0.1% of the data's bytes (0.09 MB beside
84 MB of uint16 tokens, docs/benchmarks.md): it grows with documents a pack, not with tokens.

A dataset's `Spec` (format, what padding holds, the token dtype) is decided before any work, from
the config and the tokenizer: a config that the format's trainer cannot read right is a ConfigError
then, not a surprise at training time. The manifest records it under `format`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.errors import ConfigError
from raypack.storage import join, read_bytes, resolve

__all__ = [
    "DATA_DIR",
    "FORMATS",
    "INDEX_DIR",
    "PARQUET_SETTINGS",
    "ROW_GROUP_ROWS",
    "BlockFormat",
    "Format",
    "Packs",
    "Settings",
    "Spec",
    "data_file",
    "decode_flat",
    "encode_index",
    "group_of",
    "index_path",
    "item_spans",
    "make_spec",
    "packs_of",
    "part_file",
    "read_flat",
    "read_offsets",
    "read_packs",
    "read_range",
    "read_rows",
    "real_positions",
    "require_one_length_and_eos",
    "settings_of",
    "spec_of",
    "stem_of",
    "stem_of_file",
    "tokens_as",
    "total_bytes",
]

# Fixed Parquet writer settings (data files and pack indexes): the same rows give the same bytes.
# No dictionary: a 128k vocabulary's ids fit one (17-bit indexes), but building it costs more than
# zstd gains from it. 10,000 packs of 8,192 tokens (128k BPE): 2.14 s and 73.5 MB with a dictionary,
# 1.55 s and 74.9 MB without (+2% bytes, -28% time; the list encoding alone takes 1.28 s).
# Statistics (min/max a row group) only for the pack index's columns: a token column's min and max
# select nothing, and computing them takes 0.2 s of the 1.55 (pyarrow ignores names a table lacks).
ROW_GROUP_ROWS = 1024
PARQUET_SETTINGS = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": False,
    "row_group_size": ROW_GROUP_ROWS,
    "write_statistics": [
        "doc_offsets.list.element",
        "padded_offsets.list.element",
        "doc_ids.list.element",
        "chunk_index.list.element",
        "num_tokens",
    ],
}
INDEX_DIR = "packs"


@dataclass(frozen=True, slots=True)
class Settings:
    """What a format's Spec is decided from: made by settings_of alone, from a job's config and
    tokenizer or a finished dataset's manifest (raypack convert)."""

    seq_len: int
    bucketed: bool
    """Packs of several lengths (pack.algorithm bucket)."""
    add_eos: bool
    eos_id: int | None
    max_id: int
    """The tokenizer's largest id: what the token dtype must hold (not its vocabulary's size: ids
    may have gaps)."""
    pad_id: int
    shard_rows: int
    masked: bool = False
    """Chat data: packs carry a loss mask (input.messages_field / prompt_field)."""
    pad_multiple: int = 1
    """Every item aligned to a multiple of this many positions (pack.pad_multiple)."""


def settings_of(
    cfg: JobConfig, eos_id: int | None, max_id: int, pad_id: int, lengths: Sequence[int] = ()
) -> Settings:
    """The format Settings of a dataset packed with `cfg` by a tokenizer whose EOS, largest id and
    (resolved) pad id these are; `lengths`: its packs' lengths when they are known (convert), which
    make it bucketed when there are several. The job and convert both build them here, so a dataset
    converts to exactly what packing it in that format writes (masked: its input is chat data, not
    whether its current format happens to keep a mask)."""
    return Settings(
        seq_len=cfg.pack.seq_len,
        bucketed=cfg.pack.bucketed or len(set(lengths)) > 1,
        add_eos=cfg.tokenizer.add_eos,
        eos_id=eos_id,
        max_id=max_id,
        pad_id=pad_id,
        shard_rows=cfg.output.shard_rows,
        masked=cfg.input.chat is not None,
        pad_multiple=cfg.pack.pad_multiple,
    )


def tokens_as(input_ids: np.ndarray, dtype: str, name: str) -> np.ndarray:
    """`input_ids` in the format's token dtype; ValueError for an id the dtype cannot hold (a wrap
    would write another token, silently)."""
    info = np.iinfo(dtype)
    if input_ids.size and (int(input_ids.max()) > info.max or int(input_ids.min()) < info.min):
        raise ValueError(
            f"{name}: token ids {int(input_ids.min())}..{int(input_ids.max())} do not fit its {dtype} tokens"
        )
    return input_ids.astype(dtype)


@dataclass(frozen=True, slots=True)
class Spec:
    """How one dataset's packs are stored (the manifest's `format`)."""

    name: str
    pad_id: int
    """What padding positions hold: output.pad_id, or EOS where the format's trainer masks by EOS."""
    dtype: str
    """Token dtype on disk (numpy name)."""
    eos_id: int | None
    loss_mask: bool = False
    """Packs carry a per-token loss mask (chat data; trl and bridge always write one)."""
    pad_multiple: int = 1
    """Every item starts at a multiple of it, its padding after it (pack.pad_multiple); the pack
    index then has `padded_offsets` (schema.PADDED_OFFSETS)."""

    def to_dict(self) -> dict[str, Any]:
        """The manifest's `format`; pad_multiple only where items are aligned, so the manifest of
        a dataset without alignment is what it was before alignment existed."""
        out = dataclasses.asdict(self)
        if self.pad_multiple == 1:
            del out["pad_multiple"]
        return out

    @property
    def format(self) -> Format:
        return FORMATS[self.name]


def make_spec(name: str, settings: Settings) -> Spec:
    if name not in FORMATS:
        raise ConfigError(f"output.format must be one of {', '.join(FORMATS)}, got {name!r}")
    if settings.masked and not FORMATS[name].keeps_mask:
        keeping = ", ".join(n for n, f in FORMATS.items() if f.keeps_mask)
        raise ConfigError(
            f"output.format {name} keeps no loss mask, so its trainer would train every token of these "
            f"conversations; use one of {keeping}"
        )
    if settings.pad_multiple > 1:
        if not FORMATS[name].aligns:
            aligning = ", ".join(n for n, f in FORMATS.items() if f.aligns)
            raise ConfigError(
                f"output.format {name} cannot keep items aligned to pack.pad_multiple (its trainer reads "
                f"no padded boundaries); use one of {aligning}"
            )
        return dataclasses.replace(FORMATS[name].spec(settings), pad_multiple=settings.pad_multiple)
    return FORMATS[name].spec(settings)


def require_one_length_and_eos(settings: Settings, one_length: str, eos: str) -> int:
    """The EOS id, or the ConfigErrors of a format whose trainer reads one sequence length and finds
    documents by EOS: `one_length` and `eos` say why, in the trainer's own terms."""
    if settings.bucketed:
        raise ConfigError(
            f"{one_length}, and pack.algorithm bucket or decompose makes packs of several lengths; use "
            "output.format parquet or mds"
        )
    if not settings.add_eos or settings.eos_id is None:
        raise ConfigError(
            f"{one_length.split(':')[0]}: {eos}, so each document must end in one: set tokenizer.add_eos: "
            "true (and tokenizer.eos_id if the tokenizer names no EOS)"
        )
    return int(settings.eos_id)


def spec_of(manifest: dict[str, Any]) -> Spec:
    """The Spec a manifest records; a dataset written before formats existed is parquet."""
    fmt = manifest.get("format")
    if fmt is None:
        eos = manifest.get("tokenizer", {}).get("eos_id")
        return Spec("parquet", int(manifest["config"]["output"]["pad_id"]), "int32", eos)
    return Spec(
        str(fmt["name"]),
        int(fmt["pad_id"]),
        str(fmt["dtype"]),
        fmt.get("eos_id"),
        bool(fmt.get("loss_mask")),
        int(fmt.get("pad_multiple", 1)),
    )


@dataclass(frozen=True)
class Packs:
    """One output file's packs, in pack order: what every format writes."""

    stem: str
    """The file's name without directory or suffix, relative to data/: part-00000,
    bucket=2048/part-00000 (algorithm bucket), part-GGGGG-PPPPP (sharded mode)."""
    input_ids: np.ndarray
    """(packs, capacity) int32, padding already the Spec's pad_id."""
    index: pa.Table
    """schema.PACK_INDEX, a row a pack."""
    loss_mask: np.ndarray | None = None
    """(packs, capacity) int8 where the dataset keeps a loss mask: 1 where the token is a trained
    target (labels[t] = input_ids[t]), 0 elsewhere: untrained tokens, every item's first token,
    padding."""

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def capacity(self) -> int:
        return int(self.input_ids.shape[1])

    def item_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Start and end of every item's real tokens as positions in the file's token stream (pack
        p's slot t is position p × capacity + t), in pack order; an aligned item's padding lies
        between its end and the next start."""
        starts, lengths, per_pack = item_spans(self.index)
        base = np.repeat(np.arange(self.rows, dtype=np.int64) * self.capacity, per_pack)
        return starts + base, starts + lengths + base

    def real(self) -> np.ndarray:
        """(packs, capacity) bool: True on every item's tokens, False on padding (each aligned
        item's and each pack's end)."""
        starts, ends = self.item_bounds()
        return real_positions(self.rows, self.capacity, starts, ends)

    def slice(self, lo: int, hi: int) -> Packs:
        """Packs lo .. hi - 1 (views, not copies)."""
        mask = self.loss_mask[lo:hi] if self.loss_mask is not None else None
        return Packs(self.stem, self.input_ids[lo:hi], self.index.slice(lo, hi - lo), mask)

    def table(self) -> pa.Table:
        """schema.PACKED: the index with input_ids in front."""
        ids = pa.FixedSizeListArray.from_arrays(pa.array(self.input_ids.reshape(-1)), self.capacity)
        index = [self.index.column(f.name) for f in schema.PACK_INDEX]
        table = pa.table([ids.cast(pa.list_(pa.int32())), *index], schema=schema.PACKED)
        if self.loss_mask is not None:
            mask = pa.FixedSizeListArray.from_arrays(pa.array(self.loss_mask.reshape(-1)), self.capacity)
            table = table.append_column(schema.LOSS_MASK, mask.cast(schema.LOSS_MASK.type))
        if schema.PADDED_OFFSETS.name in self.index.column_names:
            table = table.append_column(schema.PADDED_OFFSETS, self.index.column(schema.PADDED_OFFSETS.name))
        return table


def item_spans(index: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every item of a pack index's rows (schema.PACK_INDEX), in row order: its first position in
    its pack, its real tokens, and the items of each row. Items lie back to back from doc_offsets,
    or where the index has padded_offsets (pack.pad_multiple), each at its padded start."""
    real = index.column("doc_offsets").combine_chunks()
    per_pack = np.diff(real.offsets.to_numpy()).astype(np.int64) - 1
    values = real.flatten().to_numpy().astype(np.int64)
    opens = np.ones(len(values), dtype=bool)  # every entry but each row's closing one opens an item
    opens[np.cumsum(per_pack + 1) - 1] = False
    at = np.flatnonzero(opens)
    lengths = values[at + 1] - values[at]
    if schema.PADDED_OFFSETS.name not in index.column_names:
        return values[at], lengths, per_pack
    padded = index.column(schema.PADDED_OFFSETS.name).combine_chunks().flatten().to_numpy().astype(np.int64)
    return padded[at], lengths, per_pack


def real_positions(rows: int, capacity: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """(rows, capacity) bool: True inside [starts[i], ends[i]) for every item i (flat positions
    row × capacity + t, items disjoint), False elsewhere."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order].astype(np.int64), ends[order].astype(np.int64)
    row = s // capacity
    last = np.r_[row[1:] != row[:-1], True] if len(row) else np.zeros(0, dtype=bool)
    first = np.r_[True, row[:-1] != row[1:]] if len(row) else last
    row_end = np.zeros(rows, dtype=np.int64)
    row_end[row[last]] = e[last] - row[last] * capacity
    # Each row's positions up to its last item's end, less the gaps between its items (an aligned
    # item's padding, a few positions an item: cheaper than marking every item's tokens).
    real = np.arange(capacity)[None, :] < row_end[:, None]
    inner = np.flatnonzero(~last)
    gap_from = np.r_[row[first] * capacity, e[inner]]
    gap_len = np.r_[s[first] - row[first] * capacity, s[inner + 1] - e[inner]]
    at = np.repeat(gap_from - np.cumsum(gap_len) + gap_len, gap_len) + np.arange(int(gap_len.sum()))
    real.reshape(-1)[at] = False
    return real


def total_bytes(files: Sequence[dict[str, Any]], dataset_files: Sequence[dict[str, Any]] = ()) -> int:
    """Bytes of a dataset's data: every data file with its companions, and the format's own files."""
    size = sum(int(f["bytes"]) + sum(int(c["bytes"]) for c in f.get("companions", [])) for f in files)
    return size + sum(int(f["bytes"]) for f in dataset_files)


# File names: the one place they are made and taken apart. An output file's stem names it whatever
# the format (part-00000, bucket=2048/part-00000, part-GGGGG-PPPPP in sharded mode); its data file is
# data/<stem><the format's suffix>, its pack index packs/<stem>.parquet.
DATA_DIR = "data"


def stem_of(bucket_length: int | None, part: int, group: int | None = None) -> str:
    name = f"part-{part:05d}" if group is None else f"part-{group:05d}-{part:05d}"
    return name if bucket_length is None else f"bucket={bucket_length}/{name}"


def data_file(stem: str, suffix: str) -> str:
    return f"{DATA_DIR}/{stem}{suffix}"


def part_file(spec: Spec, bucket_length: int | None, part: int, group: int | None = None) -> str:
    """The data file (the first of its files) that output file `part` has in the dataset's format."""
    return data_file(stem_of(bucket_length, part, group), spec.format.suffix)


def stem_of_file(path: str, suffix: str) -> str:
    """The stem of data file `path` (relative to the dataset) of a format whose suffix is `suffix`."""
    head = f"{DATA_DIR}/"
    if not path.startswith(head) or not path.endswith(suffix):
        raise ValueError(f"{path} is not a data file {head}<stem>{suffix}")
    return path[len(head) : len(path) - len(suffix)]


def group_of(stem: str) -> int | None:
    """The shard group of a sharded mode's stem (part-GGGGG-PPPPP); None for a global job's."""
    parts = stem.rsplit("/", 1)[-1].split("-")
    return int(parts[1]) if len(parts) == 3 else None


def index_path(stem: str) -> str:
    return f"{INDEX_DIR}/{stem}.parquet"


def encode_index(index: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(index, sink, **PARQUET_SETTINGS)
    return sink.getvalue().to_pybytes()


class Format(Protocol):
    name: str
    suffix: str
    """Of its data file, data/<stem><suffix>: the first of the files `encode` returns."""
    holds_index: bool
    """Its data file is itself the pack index (parquet): no packs/ file."""
    eos_bounded: bool
    """Its trainer finds document ends at EOS tokens (an EOS inside a document splits it there)."""
    keeps_mask: bool
    """It stores a per-token loss mask (chat data)."""
    aligns: bool
    """Its trainer can read items aligned to pack.pad_multiple: its packs keep every item's padding
    in place, and the padded boundaries reach it (the pack index's padded_offsets)."""

    def spec(self, settings: Settings) -> Spec:
        """The dataset's Spec; a ConfigError for settings its trainer cannot read right."""
        ...

    def encode(self, packs: Packs, spec: Spec) -> dict[str, bytes]:
        """The files of one output file, by path relative to the dataset, the data file first."""
        ...

    def read_tokens(
        self, path: str, spec: Spec, capacity: int, first: int, count: int, storage: Any
    ) -> np.ndarray:
        """Packs first .. first + count - 1 of the data file at `path` (absolute): (count, capacity)
        int32, read through the format's own layout (ranged reads: the reader's row groups)."""
        ...

    def decode(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray:
        """Every pack of a whole data file's bytes: (packs, capacity) int32 (verify)."""
        ...

    def decode_mask(self, data: bytes, spec: Spec, capacity: int) -> np.ndarray | None:
        """The loss mask (Packs.loss_mask) of a whole data file's bytes; None: it keeps none."""
        ...

    def dataset_files(self, files: list[dict[str, Any]], spec: Spec, dataset: str) -> dict[str, bytes]:
        """Files of the whole dataset, from every file's manifest entry (Megatron's data-args list,
        MDS's index.json), written by the driver before the manifest."""
        ...

    def check_file(self, data: dict[str, bytes], packs: Packs, spec: Spec) -> list[str]:
        """Problems of one written file's own structure, beyond its tokens (verify): `data` holds its
        files' bytes by relative path, `packs` what the pack index and the tokens read say."""
        ...


@runtime_checkable
class BlockFormat(Format, Protocol):
    """A format that writes a file from its packs a block at a time (parquet: a row group), the
    bytes of its encode of the packs whole: the write task then holds one block of packs, not the
    file's (raypack.pipeline.write.materialize)."""

    block_rows: int
    """Packs a block (the last may hold fewer)."""

    def encode_blocks(
        self, stem: str, blocks: Iterable[Packs], spec: Spec, threads: int = 1
    ) -> dict[str, bytes]:
        """encode's files from the file's packs in consecutive blocks of block_rows, encoded on up to
        `threads` threads: when block j is drawn, blocks j - threads and before are written, so the
        caller may fill its blocks into a ring of `threads` buffers (one buffer on one thread)."""
        ...


def read_range(path: str, start: int, length: int, storage: Any) -> bytes:
    """`length` bytes of a file from `start` (a ranged GET on object storage)."""
    fs, inner = resolve(path, storage)
    with fs.open_input_file(inner) as f:
        return f.read_at(length, start)


def read_flat(path: str, dtype: str, capacity: int, first: int, count: int, storage: Any) -> np.ndarray:
    """Packs first .. first + count - 1 of a headerless file of packs back to back (Megatron's .bin,
    OLMo-core's token files), as (count, capacity) int32."""
    itemsize = np.dtype(dtype).itemsize
    raw = read_range(path, first * capacity * itemsize, count * capacity * itemsize, storage)
    if len(raw) != count * capacity * itemsize:
        raise ValueError(f"{path}: shorter than its {first + count} packs")
    return np.frombuffer(raw, dtype).astype(np.int32).reshape(count, capacity)


def decode_flat(data: bytes, dtype: str, capacity: int) -> np.ndarray:
    """Every pack of such a file's bytes."""
    stride = capacity * np.dtype(dtype).itemsize
    if len(data) % stride:
        raise ValueError(f"{len(data)} bytes: not whole packs of {capacity} {dtype} tokens")
    return np.frombuffer(data, dtype).astype(np.int32).reshape(-1, capacity)


def _index_file(entry: dict[str, Any]) -> str:
    return str(entry.get("index") or entry["path"])


def read_offsets(
    dataset: str, entry: dict[str, Any], storage: Any, groups: Sequence[int] | None = None
) -> pa.ListArray:
    """doc_offsets of every pack of one file, in the file's order, from its pack index alone (no
    token is read): what a reader balancing attention costs needs. `groups`: of those row groups
    alone (the manifest's `row_groups`), one after another in the order given."""
    fs, inner = resolve(join(dataset, _index_file(entry)), storage)
    with fs.open_input_file(inner) as handle:
        parquet = pq.ParquetFile(handle)
        if groups is None:
            column = parquet.read(columns=["doc_offsets"]).column("doc_offsets")
        else:
            column = parquet.read_row_groups(list(groups), columns=["doc_offsets"]).column("doc_offsets")
    return column.combine_chunks()


def read_rows(
    dataset: str,
    entry: dict[str, Any],
    spec: Spec,
    group: int,
    first: int,
    storage: Any,
    more: Sequence[str] = (),
) -> pa.Table:
    """input_ids, doc_offsets and num_tokens of row group `group` of one file, whose first pack is
    pack `first` of the file: what raypack's reader needs; `more`: other pack index columns after
    them (doc_ids, chunk_index: what `raypack inspect` shows); padded_offsets last where items are
    aligned (Spec.pad_multiple)."""
    fs, inner = resolve(join(dataset, _index_file(entry)), storage)
    padded = [schema.PADDED_OFFSETS.name] if spec.pad_multiple > 1 else []
    with fs.open_input_file(inner) as handle:
        parquet = pq.ParquetFile(handle)
        if spec.format.holds_index:
            mask = ["loss_mask"] if spec.loss_mask else []
            columns = ["input_ids", "doc_offsets", "num_tokens", *more, *mask, *padded]
            return parquet.read_row_group(group, columns=columns)
        index = parquet.read_row_group(group, columns=["doc_offsets", "num_tokens", *more, *padded])
    capacity = int(entry["bucket_length"])
    path = join(dataset, entry["path"])
    tokens = spec.format.read_tokens(path, spec, capacity, first, index.num_rows, storage)
    ids = pa.FixedSizeListArray.from_arrays(pa.array(tokens.reshape(-1)), capacity)
    table = index.add_column(0, "input_ids", ids.cast(pa.list_(pa.int32())))
    if spec.loss_mask:  # trl, bridge: from the same row groups as the tokens
        mask = spec.format.read_mask(path, spec, capacity, first, index.num_rows, storage)  # type: ignore[attr-defined]
        flat = pa.array(mask.reshape(-1))
        table = table.append_column(
            schema.LOSS_MASK, pa.FixedSizeListArray.from_arrays(flat, capacity).cast(schema.LOSS_MASK.type)
        )
    return table


def read_packs(dataset: str, entry: dict[str, Any], spec: Spec, storage: Any, checked: bool = False) -> Packs:
    """Every pack of one file, its tokens read through the format (convert, read_packed). `checked`:
    each file read must have the size and sha256 its manifest entry gives (ValueError naming it
    otherwise): unchecked, a conversion of an olmo file damaged in place, its size unchanged, would
    write its damage out as ids of -1, and the new manifest's checksums would make `verify` pass
    them."""
    files = {entry["path"]: read_bytes(join(dataset, entry["path"]), storage)}
    if not spec.format.holds_index:
        files[entry["index"]] = read_bytes(join(dataset, entry["index"]), storage)
    if checked:
        expected = {entry["path"]: (entry.get("bytes"), entry.get("sha256"))}
        expected |= {c["path"]: (c.get("bytes"), c.get("sha256")) for c in entry.get("companions") or []}
        for path, data in files.items():
            size, digest = expected.get(path, (None, None))
            if (size is not None and len(data) != size) or (
                digest is not None and hashlib.sha256(data).hexdigest() != digest
            ):
                raise ValueError(f"{path}: size or sha256 differs from the manifest")
    return packs_of(files, entry, spec)


def packs_of(files: dict[str, bytes], entry: dict[str, Any], spec: Spec) -> Packs:
    """One file's Packs from its files' bytes (the data file and, but for parquet, its pack index);
    ValueError when they do not make packs of the entry's length."""
    capacity = int(entry["bucket_length"])
    table = pq.read_table(pa.BufferReader(files[_index_file(entry)]))
    tokens = spec.format.decode(files[entry["path"]], spec, capacity)
    mask = spec.format.decode_mask(files[entry["path"]], spec, capacity) if spec.loss_mask else None
    index = schema.PACK_INDEX.append(schema.PADDED_OFFSETS) if spec.pad_multiple > 1 else schema.PACK_INDEX
    table = table.select([f.name for f in index])
    if len(tokens) != table.num_rows:
        raise ValueError(f"{entry['path']}: {len(tokens)} packs of tokens, {table.num_rows} indexed")
    stem = stem_of_file(entry["path"], spec.format.suffix)
    return Packs(stem, np.ascontiguousarray(tokens, dtype=np.int32), table.cast(index), mask)


def _formats() -> dict[str, Format]:
    from raypack.formats import bridge, mds, megatron, olmo, parquet, trl

    return {
        "parquet": parquet.FORMAT,
        "megatron": megatron.FORMAT,
        "olmo": olmo.FORMAT,
        "mds": mds.FORMAT,
        "trl": trl.FORMAT,
        "bridge": bridge.FORMAT,
    }


FORMATS: dict[str, Format] = _formats()
