"""The Arrow schema at each stage boundary, defined once."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = [
    "DOCUMENTS",
    "FILES",
    "ITEMS",
    "LOSS_MASK",
    "METADATA",
    "OUTPUT_SCHEMA_VERSION",
    "PACKED",
    "PACK_INDEX",
    "PADDED_OFFSETS",
    "READABLE_SCHEMA_VERSIONS",
    "REJECTS",
    "TOKENIZED",
    "WRITTEN",
    "row_group_rows",
]

# Tokenized documents of one input shard (staging area): written by tokenize, read by histogram/assign.
TOKENIZED = pa.schema(
    [
        ("row", pa.int64()),  # line (jsonl, 1-based) or row (parquet, 0-based) in the input shard
        # Its file's number within its work unit (a run of small files: units.WorkUnit.files), 0 for
        # a unit of one file; `row` counts within that file.
        ("file", pa.int32()),
        ("doc_id", pa.string()),
        ("length", pa.int64()),
        # Chat data: a token that is not trained is stored as -(id + 1) (tokenize.untrained), here and
        # in ITEMS, until the write stage makes it a loss_mask column.
        ("tokens", pa.list_(pa.int32())),
    ]
)

# Input records that did not become documents, with why.
REJECTS = pa.schema(
    [
        ("source", pa.string()),  # input path relative to the input root
        ("row", pa.int64()),  # -1: the whole file
        ("reason", pa.string()),
        ("raw", pa.string()),  # the first 200 characters of the record, as read
        # Input records the row stands for: 1, or a lost file's (or its unread rest's) rows.
        ("records", pa.int64()),
        ("lost_file", pa.bool_()),  # the whole file or its rest was unreadable (input.max_lost_files)
    ]
)

# One row per input document that reached tokenization (per copy of it, in a mixture): what
# `raypack verify` checks the output against.
DOCUMENTS = pa.schema(
    [
        ("doc_id", pa.string()),
        ("shard", pa.int32()),
        ("row", pa.int64()),
        ("length", pa.int64()),  # tokens, including BOS/EOS
        ("chunks", pa.int32()),  # items in the output (0: dropped by overflow=drop)
        ("placed", pa.int64()),  # tokens in the output (< length: truncated or dropped)
        ("source", pa.string()),  # its input source ("" without input.sources)
        # Which copy of the document the row is (0, 1, ...: a mixture repeats documents); -1: the
        # mixture left the document out (its chunks and placed are 0).
        ("copy", pa.int32()),
        # Its file's number within its work unit (the manifest's `inputs` entry lists a run's files);
        # `row` counts within that file. 0 for a unit of one file.
        ("file", pa.int32()),
    ]
)

# The index's last column with input.metadata_fields: a struct of each document's kept fields, a
# child a field, typed as raypack.corpus.metadata says (the manifest's `metadata` lists them).
METADATA = "metadata"

# Items on their way to their output file (assign → shuffle → materialize); file_key = bucket << 32 | part.
ITEMS = pa.schema(
    [
        ("file_key", pa.int64()),
        ("pack", pa.int64()),
        ("slot", pa.int32()),
        ("capacity", pa.int32()),
        ("doc_id", pa.string()),
        ("chunk", pa.int32()),
        ("length", pa.int32()),
        # An item's tokens travel in `tokens` (source -1), or, where every task maps every token file
        # (a local run: raypack.engine), stay in its unit's token file: `source` is that
        # unit's index, `start` its first token's position among the file's token values, batch
        # after batch (token_files.token_values), and `tokens` is empty.
        ("source", pa.int32()),
        ("start", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
    ]
)

# Beside a data file, the other files that make it up (Megatron's .idx, OLMo's documents and label
# mask, the pack index of every format but parquet), each checked by verify as the data file is.
COMPANION = pa.struct([("path", pa.string()), ("bytes", pa.int64()), ("sha256", pa.string())])

# One row per written data file, as the manifest lists it (path relative to the output root).
FILES = pa.schema(
    [
        ("path", pa.string()),  # relative to the output root
        ("bucket_length", pa.int32()),
        ("rows", pa.int64()),
        ("tokens", pa.int64()),
        ("items", pa.int64()),
        ("bytes", pa.int64()),
        ("sha256", pa.string()),
        # Packs in each Parquet row group of its pack index (the data file itself for parquet), in
        # file order: a reader plans its share from the manifest alone, without a footer read per
        # file (10k files × 1k ranks would be 10M GETs at start).
        ("row_groups", pa.list_(pa.int64())),
        ("index", pa.string()),  # the file holding its pack index: itself (parquet) or packs/*.parquet
        ("companions", pa.list_(COMPANION)),
    ]
)

# What a write task returns: the file's FILES row; its packs by fill in whole percent of their
# capacity (metrics.FILL_BINS counts), summed into metrics.json for the report; the EOS tokens inside
# its items (not at an item's end: where a trainer that finds documents by EOS would cut one); and
# the most items one of its packs holds (the job's max_depth metric).
WRITTEN = (
    FILES.append(pa.field("fill_percent", pa.list_(pa.int64())))
    .append(pa.field("stray_eos", pa.int64()))
    .append(pa.field("max_items", pa.int64()))  # the most items in one of its packs
    .append(pa.field("longest_item", pa.int64()))  # tokens of its longest item
    .append(pa.field("fewest_tokens", pa.int64()))  # tokens of its emptiest pack
    # Trained tokens (labels not -100: the loss mask where the dataset keeps one, else every token
    # but each item's first), and its packs by trained tokens in whole percent of their capacity.
    .append(pa.field("trained", pa.int64()))
    .append(pa.field("trained_percent", pa.list_(pa.int64())))
)


def row_group_rows(metadata: pq.FileMetaData) -> list[int]:
    """Rows in each row group of a Parquet file, in file order (the manifest's `row_groups`)."""
    return [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]


# One row per pack: the training-side format (docs/output-format.md). Version 2: the manifest has a
# `format` (output formats other than parquet); 1: parquet only, no `format`. Readers take both.
OUTPUT_SCHEMA_VERSION = 2
READABLE_SCHEMA_VERSIONS = (1, 2)
PACKED = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),  # exactly the pack's capacity long, padded with pad_id
        ("doc_offsets", pa.list_(pa.int32())),  # cu_seqlens: 0, each item end, ..., num_tokens
        ("doc_ids", pa.list_(pa.string())),
        ("chunk_index", pa.list_(pa.int32())),
        ("num_tokens", pa.int32()),
    ]
)

# pack.pad_multiple > 1: every item starts at a multiple of it, its padding (pad_id) after it. Beside
# doc_offsets (the real cu_seqlens: cumulative real tokens), cu_seqlens_padded: 0, then each item's
# padded end, as many entries; item k's tokens are input_ids[p_k : p_k + (o_{k+1} - o_k)]. Absent
# (a dataset without alignment, or one written before it existed): the same as doc_offsets. The last
# column of a pack index, and of parquet's packs (after loss_mask where there is one).
PADDED_OFFSETS = pa.field("padded_offsets", pa.list_(pa.int32()))

# Chat data's packs (Packs.loss_mask): 1 where the token is a trained target, labels[t] = input_ids[t].
LOSS_MASK = pa.field("loss_mask", pa.list_(pa.int8()))

# PACKED without its tokens: every format but parquet writes it beside its data (packs/*.parquet).
PACK_INDEX = pa.schema([f for f in PACKED if f.name != "input_ids"])
