"""Reading a packed dataset for training: `iter_batches` for a data-parallel rank, `read_packed` for Ray.

    for batch in iter_batches("s3://bucket/packed/", batch_size=8, rank=r, world_size=w, seed=epoch,
                              torch=True):
        mask = block_causal_mask(batch["document_ids"], model.dtype)   # Hugging Face, sdpa or eager
        loss = model(batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"],
                     attention_mask=mask).loss
        # a loop of one's own: cross_entropy(logits.flatten(0, 1), batch["shift_labels"].flatten())

(raypack.torch_data.PackedDataset is the same for torch's DataLoader, resumable with torchdata's
StatefulDataLoader.)

Order. Each bucket (one, unless the dataset was packed with `bucket`) is read as one sequence: its
Parquet row groups (1,024 packs) in a seeded order, and the packs of each row group in a seeded order
(PackPermutation: the same on every machine). Rank r of w takes the contiguous r-th w-th of that
sequence, so each reads only its own row groups (±2 shared at the edges) instead of the whole
dataset; the manifest lists every file's row groups, so no rank reads a footer to plan. Batches are
consecutive `batch_size` packs of a rank's range, and every rank takes the same number of steps.
What happens to a bucket's packs that do not fill w × batch_size is `last_batch`:
- "wrap" (default): the sequence goes on from its start until every rank's last batch is full, as
  torch's DistributedSampler pads: fewer than w × batch_size packs of each bucket are seen twice an
  epoch. No batch is ever short or empty (an empty batch gives a NaN loss on its rank under DDP).
- "drop": the last, partial round of batches is left out: every batch full, no pack twice, fewer
  than w × batch_size packs unread this epoch (another seed reads others).
- "short": ranks partition the packs exactly (counts differ by at most one), so a rank's last batch
  of a bucket may be short or empty (yielded empty, to keep the step count equal).

Buckets. Step s uses one bucket on every rank (Liu et al. train one bucket length per step): the
schedule is every bucket repeated as many times as it has steps, in a seeded order that all ranks
compute alike. A batch never mixes bucket lengths.

Balance. `balance="attention"` chooses each step's packs and their split among the ranks together,
so that every rank's cost in a step (Σ l² over its documents + `balance_per_token` · Σ l) is as even
as raypack.balance makes it: each rank's share of a bucket (the range it reads unbalanced) is cut
into windows of steps (1,024 packs a rank, balance.RANK_WINDOW_PACKS), and a window's packs of a
neighbourhood of consecutive ranks (4 of them, enough to pool 4,096 packs: balance.WINDOW_PACKS)
are spread over its steps and ranks by cost, its steps in a seeded order; a pack is read in the steps
of its window, so the epoch stays a shuffle (no curriculum), and last_batch's rules hold as above.
The costs come from the pack indexes' doc_offsets, read when the reader starts (no token is read):
a rank reads those of its neighbourhood's row groups alone and computes its neighbourhood's steps
alone (raypack.balance.neighbourhood_steps), O(4 × packs / world_size) whatever the dataset's size.
Resuming a balanced run that began the epoch, a rank reads those of the earlier run's
neighbourhoods whose leftovers its own neighbourhood takes (O(4 × packs / the smaller world size));
after a chain of runs, one of them balanced, every pack's, once (Run.left; docs/benchmarks.md
measures them). What it costs: a rank reads its
neighbourhood's shares, 4 × the unbalanced reader's reading whatever the world size (where a share
is under 1,024 packs, about 4,096 packs' row groups), and keeps the rows it reads of a window's row
groups (its own ~1,024 packs: 128 MiB at 32k int32 tokens, besides the one group it decodes at a
time). A balanced run's state resumes as any other (below): what it leaves is the packs of the
steps it had not taken.

Variable sequence length (a dataset of pack.algorithm decompose, or any of several buckets):
`tokens_per_batch=T` instead of batch_size makes every batch of a rank T tokens, T / L packs of
the step's length L (T a multiple of every length), and `curriculum` orders the steps
(raypack.packing.curriculum: "natural", the paper's uniform mixing, or Curriculum("grow_p2",
num_cycles), "grow_linear"): every rank computes the same schedule, so all read one length a
step. last_batch "wrap" or "drop" apply to each bucket as above ("short" would break the token
count); resume, elastic too, holds as for batch_size.

Resume: `start_step=k` begins at step k of the same (seed, rank, world_size, batch_size) without
reading what comes before. Elastic resume, on another world size or batch size (a job restarted on
fewer GPUs): `resume=state`, any one rank's saved state of the earlier run (ranks step together),
goes on with what the epoch has left: of each bucket, every earlier rank's unyielded positions one
after another, shared among the new ranks as a whole epoch's are (last_batch's rule applies to
them), on a schedule of their own. Over the old and the new ranks each pack is yielded once (under
"wrap", the packs it repeats aside). A resumed run's state records the runs before it, so it can be
resumed again on yet another world size; the seed must stay the epoch's.

Versions. Given a rebuild's root, a reader resolves LATEST once, when it starts, and reads that
version to the end, whatever a rebuild commits meanwhile. Ranks of one job should all read one
version: resolve it once with `pin_version(root)` (e.g. on rank 0, broadcast) and pass the pinned
path to every rank; ranks that each resolve LATEST may straddle a commit and disagree on the number
of steps (DDP then hangs). PackedDataset pins at construction and records the version in its state.

Fields, per pack of length L with documents at doc_offsets o_0=0 < o_1 < ... < o_k = num_tokens
(each convention checked against the real client in tests/test_clients.py):
- `input_ids` (B, L) int64; padding holds the dataset's pad_id;
- `labels` (B, L) int64, aligned with input_ids as Hugging Face models take them (they shift by one
  themselves): labels[t] = input_ids[t] when t-1 is in the same document, else -100 (every
  document's first token, and all padding): no loss across a boundary;
  Chat data (a dataset with a loss_mask, docs/output-format.md): labels[t] = input_ids[t] only where
  loss_mask[t] = 1 (a trained token: an assistant turn's, a completion's), else -100;
- `shift_labels` (B, L) int64, the same targets already shifted, for loops that compute the loss
  themselves (torchtitan, Megatron style): shift_labels[t] = input_ids[t+1] when t+1 is in the same
  document, else -100. Never pass it as an HF model's `labels`: that trains token t+2;
- `position_ids` (B, L) int64: t - o_i within document i, restarting at 0 on every document; the
  padding tail counts 0, 1, ... as a segment of its own. A dataset packed with pack.pad_multiple
  (each document then starts at its padded offset p_i, docs/output-format.md) counts t - p_i on
  through the document's padding, as Megatron-Bridge and Transformer Engine lay out a padded
  sequence; that padding is never a label and its document_ids are -1;
- `document_ids` (B, L) int64: the document of each token within its row, 0, 1, ...; -1 on padding.
  flex attention's mask_mod: `(doc[b, q] == doc[b, k]) & (k <= q)`; block_causal_mask() builds the
  dense (B, 1, L, L) mask for sdpa and Hugging Face models;
- `cu_seqlens` (segments+1,) int32 over the batch flattened to B*L tokens: every document, then the
  padding tail of its row (if any), as flash-attention's varlen functions take them; `max_seqlen`;
  `cu_seqlens_padded`: the same segments' boundaries with each document's alignment padding
  (pack.pad_multiple; equal to cu_seqlens without it). With alignment, cu_seqlens counts each
  document's real tokens only (a padding tail whole): megatron-core's cu_seqlens_q beside
  cu_seqlens_q_padded for the THD path; flash-attention's varlen then takes cu_seqlens_padded;
- `loss_weights` (B, L) float32, asked for with `loss_weights="document"` or `"sequence"`, aligned
  with `labels`: 0 where labels is -100; else, for "document", 1 / (the document's trained targets
  × the documents with any in the batch), so that `(token_loss * loss_weights).sum()` is the mean of
  the documents' mean losses, as unpacked batches of one document a row would train; "sequence"
  likewise per row. A chunk of a document cut at seq_len counts as a document of its own (it is one
  to the model). With a loop of one's own: `weights = batch["loss_weights"][:, 1:]` goes with
  `shift_labels[:, :-1]` and `logits[:, :-1]`. Each rank's weights sum to 1: DDP's mean of the
  ranks' gradients is the mean of the ranks' means.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import warnings
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack.balance import (
    ATTENTION_PER_TOKEN,
    Balance,
    imbalance,
    pack_terms,
    positions_of,
    spans_of,
    step_costs,
)
from raypack.config import StorageConfig
from raypack.dataset.layout import MANIFEST, index_path, resolve_dataset
from raypack.dataset.manifest import metadata_kinds
from raypack.dataset.previous import aside_note
from raypack.formats import (
    data_file,
    item_spans,
    read_offsets,
    read_packs,
    read_rows,
    real_positions,
    spec_of,
    stem_of_file,
)
from raypack.packing import PackPermutation
from raypack.packing.curriculum import Curriculum, schedule
from raypack.schema import METADATA, PADDED_OFFSETS, READABLE_SCHEMA_VERSIONS, row_group_rows
from raypack.storage import exists, join, read_bytes, resolve

__all__ = [
    "IGNORE_INDEX",
    "LAST_BATCH",
    "DocumentMetadata",
    "Pinned",
    "attention_imbalance",
    "batch_fields",
    "block_causal_mask",
    "document_metadata",
    "iter_batches",
    "pin",
    "pin_version",
    "read_packed",
    "torch_converter",
    "training_batches",
]

IGNORE_INDEX = -100  # the label of a position that carries no loss (PyTorch's cross_entropy default)


@dataclass(frozen=True, slots=True)
class _RowGroup:
    name: str
    """Names the group in the seeded orders: its file's parquet name (data/part-00000.parquet for
    data/part-00000.bin too), so that a dataset is read in the same order whatever its format."""
    index: int
    rows: int
    first: int
    """The group's first pack in its file."""
    entry: int
    """The file's position in the manifest's `files`."""


@dataclass(frozen=True, slots=True)
class _Bucket:
    length: int
    groups: tuple[_RowGroup, ...]
    """Row groups in the seeded reading order."""
    starts: np.ndarray
    """Position of each row group's first pack in the bucket's sequence."""

    @property
    def packs(self) -> int:
        return int(self.starts[-1])


@dataclass(frozen=True, slots=True)
class Pinned:
    """One version of a dataset, resolved once: what every read of one reader uses."""

    path: str
    """The dataset directory read (for a rebuild's root: the version LATEST named when pinned)."""
    manifest: dict[str, Any]
    sha256: str
    """Of manifest.json's bytes: names the version's content (a resumed state is checked against it)."""


def pin(path: str, storage: StorageConfig | None = None) -> Pinned:
    """Resolve `path` (a dataset, or a rebuild's root through LATEST) and read its manifest, once."""
    dataset = resolve_dataset(path, storage)
    if not exists(join(dataset, MANIFEST), storage):
        raise FileNotFoundError(
            f"{path} holds no complete raypack dataset (no manifest.json){aside_note(dataset)}"
        )
    raw = read_bytes(join(dataset, MANIFEST), storage)
    manifest = json.loads(raw)
    if manifest.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        raise ValueError(
            f"{path}: schema_version {manifest.get('schema_version')} is not one this raypack reads "
            f"({', '.join(map(str, READABLE_SCHEMA_VERSIONS))}): a newer raypack wrote it"
        )
    return Pinned(dataset, manifest, hashlib.sha256(raw).hexdigest())


def pin_version(path: str, storage: StorageConfig | None = None) -> str:
    """The directory of the version `path` names now (itself, for a dataset): give it to every rank so
    that all read the same version, whatever a rebuild commits while they start."""
    return pin(path, storage).path


def _key(seed: int, *parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, (seed, *parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def _buckets(
    dataset: str, manifest: dict[str, Any], seed: int, storage: StorageConfig | None
) -> list[_Bucket]:
    by_length: dict[int, list[_RowGroup]] = {}
    files = manifest["files"]
    suffix = spec_of(manifest).format.suffix
    for e in sorted(range(len(files)), key=lambda e: files[e]["path"]):
        f = files[e]
        rows = f.get("row_groups")
        if rows is None:  # a dataset written before manifests listed row groups: read the footer
            fs, inner = resolve(join(dataset, f["path"]), storage)
            with fs.open_input_file(inner) as handle:
                rows = row_group_rows(pq.ParquetFile(handle).metadata)
        firsts = np.r_[0, np.cumsum(rows)].tolist()
        # The row group's name in the seeded orders: the parquet data file's name, whatever the
        # format, so the same packs are read in the same order in every format.
        name = data_file(stem_of_file(str(f["path"]), suffix), ".parquet")
        groups = [_RowGroup(name, i, int(n), int(firsts[i]), e) for i, n in enumerate(rows)]
        by_length.setdefault(int(f["bucket_length"]), []).extend(groups)
    buckets = []
    for length, groups in sorted(by_length.items()):
        order = PackPermutation(len(groups), _key(seed, "row groups", length))(np.arange(len(groups)))
        ordered = tuple(groups[i] for i in np.argsort(order))
        starts = np.r_[0, np.cumsum([g.rows for g in ordered])].astype(np.int64)
        buckets.append(_Bucket(length, ordered, starts))
    return buckets


def _schedule(steps: list[int], seed: int, *salt: object, curriculum: Curriculum | None = None) -> np.ndarray:
    """Bucket index of every step: bucket b appears steps[b] times, in the curriculum's seeded order
    (raypack.packing.curriculum; natural by default); `salt`: a resumed epoch's, Resume.salt, so its
    rest is scheduled afresh."""

    def permute(n: int, parts: tuple[object, ...]) -> np.ndarray:
        return np.argsort(PackPermutation(n, _key(seed, "schedule", *salt, *parts))(np.arange(n)))

    return schedule(steps, permute, curriculum)


@dataclass(frozen=True)
class Batching:
    """How many packs a rank's batch of each bucket holds: `batch_size` of every bucket, or
    `tokens_per_batch` tokens of any (tokens_per_batch / its length: a step's token count fixed,
    its sequence length by the curriculum's schedule)."""

    batch_size: int | None = None
    tokens_per_batch: int | None = None
    curriculum: Curriculum = field(default_factory=Curriculum)

    def rows(self, buckets: list[_Bucket]) -> list[int]:
        if self.tokens_per_batch is None:
            return [int(self.batch_size or 0)] * len(buckets)
        odd = [b.length for b in buckets if self.tokens_per_batch % b.length]
        if odd:
            raise ValueError(
                f"tokens_per_batch {self.tokens_per_batch:,} is not a multiple of the dataset's pack "
                f"length {odd[0]:,}: take a multiple of {int(np.lcm.reduce([b.length for b in buckets])):,}"
            )
        return [self.tokens_per_batch // b.length for b in buckets]

    def state(self) -> dict[str, Any]:
        """What a rank's state records of it (beside batch_size)."""
        if self.tokens_per_batch is None:
            return {}
        c = self.curriculum
        return {"tokens_per_batch": self.tokens_per_batch, "curriculum": c.name, "num_cycles": c.num_cycles}

    @classmethod
    def of_state(cls, state: dict[str, Any]) -> Batching:
        if state.get("tokens_per_batch") is None:
            return cls(state["batch_size"])
        curriculum = Curriculum(str(state["curriculum"]), int(state["num_cycles"]))
        return cls(None, int(state["tokens_per_batch"]), curriculum)


def read_group(pinned: Pinned, group: _RowGroup, seed: int, storage: StorageConfig | None) -> pa.Table:
    """One row group's packs (the reader's columns), in their seeded order within the group; the
    tokens read through the dataset's format (raypack.formats.read_rows)."""
    entry = pinned.manifest["files"][group.entry]
    table = read_rows(pinned.path, entry, spec_of(pinned.manifest), group.index, group.first, storage)
    return table.take(pa.array(_group_order(group, seed)))


def _group_order(group: _RowGroup, seed: int) -> np.ndarray:
    """The group's rows in their seeded order."""
    perm = PackPermutation(group.rows, _key(seed, "rows", group.name, group.index))
    return np.argsort(perm(np.arange(group.rows)))


Terms = list[tuple[np.ndarray, np.ndarray]]
"""Each bucket's packs' (Σ l², Σ l) in its sequence's order (balance.pack_terms)."""


def _terms_at(
    pinned: Pinned, bucket: _Bucket, positions: np.ndarray, seed: int, storage: StorageConfig | None
) -> tuple[np.ndarray, np.ndarray]:
    """(Σ l², Σ l) of the packs at `positions` of the bucket's sequence (a position may repeat), from
    the doc_offsets of the row groups holding them alone: no token and no other row group is read.
    16 bytes a position, besides one file's groups' offsets at a time."""
    positions = np.asarray(positions, dtype=np.int64)
    of = np.searchsorted(bucket.starts, positions, side="right") - 1
    by_group = np.argsort(of, kind="stable")
    needed, firsts = np.unique(of[by_group], return_index=True)
    ends = np.r_[firsts[1:], len(positions)].astype(np.int64)
    by_file: dict[int, list[int]] = {}
    for k, g in enumerate(needed.tolist()):
        by_file.setdefault(bucket.groups[g].entry, []).append(k)
    squares, tokens = np.zeros(len(positions)), np.zeros(len(positions))
    for entry, ks in by_file.items():
        ks.sort(key=lambda k: bucket.groups[int(needed[k])].index)
        groups = [bucket.groups[int(needed[k])] for k in ks]
        offsets = read_offsets(
            pinned.path, pinned.manifest["files"][entry], storage, [g.index for g in groups]
        )
        file_squares, file_tokens = pack_terms(
            offsets.flatten().to_numpy(), np.diff(offsets.offsets.to_numpy())
        )
        at = 0  # the group's first row among the groups read of the file
        for k, group in zip(ks, groups, strict=True):
            here = by_group[firsts[k] : ends[k]]
            rows = at + _group_order(group, seed)[positions[here] - bucket.starts[needed[k]]]
            squares[here], tokens[here] = file_squares[rows], file_tokens[rows]
            at += group.rows
    return squares, tokens


def _terms(pinned: Pinned, buckets: list[_Bucket], seed: int, storage: StorageConfig | None) -> Terms:
    """Every pack's attention terms (_terms_at of every position): 16 bytes a pack, and every pack
    index file's doc_offsets read. O(the dataset): a resume after a chain of runs with a balanced
    one and attention_imbalance need them all; a fresh epoch's plan, or one resuming a single
    balanced run, reads its neighbourhood's (_Costs, _Leftover)."""
    return [_terms_at(pinned, bucket, np.arange(bucket.packs), seed, storage) for bucket in buckets]


@dataclass(frozen=True)
class _Costs:
    """The packs' costs a balanced plan asks for: read from the pack index's row groups that hold
    them (a rank's neighbourhood's, raypack.balance.neighbourhood_steps), or taken from every pack's
    terms (`terms`: a resume after a chain of runs with a balanced one, Run.left)."""

    pinned: Pinned
    seed: int
    storage: StorageConfig | None
    balance: Balance
    terms: Terms | None = None

    def at(self, i: int, bucket: _Bucket, positions: np.ndarray) -> np.ndarray:
        """The costs of bucket `i`'s packs at `positions`."""
        if self.terms is not None:
            return self.balance.cost(self.terms[i][0][positions], self.terms[i][1][positions])
        return self.balance.cost(*_terms_at(self.pinned, bucket, positions, self.seed, self.storage))


GroupLoader = Callable[[int, int], pa.Table]
"""(bucket index, row group index within the bucket) -> read_group's table."""


Spans = list[tuple[int, int]]
"""Positions of a bucket's sequence, as [start, end) ranges in order; a position past the bucket's
end is that position modulo its packs (last_batch="wrap" reads the start again)."""


def _within(spans: Spans, lo: int, hi: int) -> Spans:
    """The positions of virtual positions [lo, hi) of `spans` (their positions one after another,
    from 0; past the last, from the first again), as spans."""
    total = sum(b - a for a, b in spans)
    out: Spans = []
    if total == 0:
        return out
    ends = np.cumsum([b - a for a, b in spans])
    at = lo
    while at < hi:
        v = at % total
        k = int(np.searchsorted(ends, v, side="right"))
        real = spans[k][1] - int(ends[k] - v)
        count = min(hi - at, spans[k][1] - real)
        out.append((real, real + count))
        at += count
    return out


def _balanced(
    spans: Spans, costs: np.ndarray, world: int, batch: int, last_batch: str, key: int, balance: Balance
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(position, step, rank) of every pack an epoch over `spans` reads, balanced (raypack.balance):
    the slots last_batch's rule gives (short: every position; wrap: rounds of world × batch, from
    the start again; drop: whole rounds), in the order of `spans`, each rank's unbalanced share
    (_share) handed to raypack.balance as its own, so a pack moves only within its neighbourhood."""
    total = sum(b - a for a, b in spans)
    bounds = [_share(total, r, world, batch, last_batch)[:2] for r in range(world)]
    real = positions_of(spans, np.arange(bounds[-1][1]))
    step, rank = balance.steps(costs[real], np.array([hi - lo for lo, hi in bounds]), batch, key)
    return real, step, rank


def _balanced_share(
    at: Callable[[np.ndarray], np.ndarray],
    total: int,
    costs: Callable[[np.ndarray], np.ndarray],
    rank: int,
    world: int,
    batch: int,
    last_batch: str,
    key: int,
    balance: Balance,
) -> Spans:
    """Rank `rank`'s positions of _balanced's epoch over a sequence of `total` positions (`at`: the
    positions at given indices of it, past its end from its start again), in the order of its
    steps, from the costs of its neighbourhood's shares alone (`costs`: of the positions given):
    O(its neighbourhood's packs), not O(the bucket's)."""
    bounds = [_share(total, r, world, batch, last_batch)[:2] for r in range(world)]
    shares = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
    groups = balance.neighbourhoods(shares, batch)
    g = next(g for g, ranks in enumerate(groups) if ranks[0] <= rank <= ranks[-1])
    real = at(np.arange(bounds[groups[g][0]][0], bounds[groups[g][-1]][1]))
    step, owner = balance.neighbourhood_steps(costs(real), shares, g, batch, key)
    mine = np.flatnonzero(owner == rank)
    return spans_of(real[mine[np.argsort(step[mine], kind="stable")]])


class _RankStream:
    """One rank's packs of one bucket: the positions of `spans` in order ([lo, hi) of the bucket's
    sequence; after an elastic resume, the rank's share of what the earlier run left), read a row
    group at a time through `load`, the last `keep` of them cached. With keep > 1 (a balanced
    epoch's steps go to and fro between the row groups of a window's slices of its neighbourhood's
    shares) a group is cached as the rows the stream reads of it alone: about a quarter of them."""

    def __init__(self, index: int, bucket: _Bucket, spans: Spans, load: GroupLoader | None, keep: int = 1):
        self.index, self.bucket, self.load, self.keep = index, bucket, load, keep
        self.spans = deque((a, b) for a, b in spans if b > a)
        self._cached: OrderedDict[int, pa.Table] = OrderedDict()
        self._rows: dict[int, np.ndarray] | None = None
        """With keep > 1: the rows of each group the stream reads from its first take on, sorted."""

    def _needed(self) -> dict[int, np.ndarray]:
        if not self.spans:
            return {}
        pos = np.concatenate([np.arange(a, b) for a, b in self.spans]) % self.bucket.packs
        groups = np.searchsorted(self.bucket.starts, pos, side="right") - 1
        key = np.unique((groups.astype(np.int64) << 32) | (pos - self.bucket.starts[groups]))
        cuts = np.flatnonzero(np.diff(key >> 32)) + 1
        return {int(part[0] >> 32): part & 0xFFFFFFFF for part in np.split(key, cuts)}

    def _group(self, g: int) -> pa.Table:
        if g not in self._cached:
            if self.load is None:
                raise RuntimeError("a planning stream does not read")
            table = self.load(self.index, g)
            self._cached[g] = table if self._rows is None else table.take(pa.array(self._rows[g]))
            if len(self._cached) > self.keep:
                self._cached.popitem(last=False)
        self._cached.move_to_end(g)
        return self._cached[g]

    def skip(self, n: int) -> None:
        """Move past the next n packs without reading them."""
        while n and self.spans:
            a, b = self.spans[0]
            moved = min(n, b - a)
            self.spans[0] = (a + moved, b)
            if a + moved == b:
                self.spans.popleft()
            n -= moved

    def parts(self, n: int) -> list[tuple[int, int, int]]:
        """(row group, first row, rows) of the next n packs (fewer at the end of the range); moves on."""
        parts = []
        while n and self.spans:
            a, b = self.spans[0]
            pos = a % self.bucket.packs
            g = int(np.searchsorted(self.bucket.starts, pos, side="right") - 1)
            first = pos - int(self.bucket.starts[g])
            count = min(n, b - a, int(self.bucket.starts[g + 1]) - pos)
            parts.append((g, first, count))
            self.skip(count)
            n -= count
        return parts

    def take(self, n: int) -> list[pa.Table]:
        """The next n packs, as row slices."""
        if self.keep > 1 and self._rows is None:
            self._rows = self._needed()
        slices = []
        for g, first, count in self.parts(n):
            at = first if self._rows is None else int(np.searchsorted(self._rows[g], first))
            slices.append(self._group(g).slice(at, count))
        return slices


LAST_BATCH = ("wrap", "drop", "short")


def _share(packs: int, rank: int, world: int, batch: int, last_batch: str) -> tuple[int, int, int]:
    """Rank `rank`'s positions [lo, hi) in a bucket of `packs`, and the steps every rank takes."""
    if last_batch == "short":
        widest = -(-packs // world)  # the largest rank's share: every rank takes this many steps
        return packs * rank // world, packs * (rank + 1) // world, -(-widest // batch)
    rounds = -(-packs // (world * batch)) if last_batch == "wrap" else packs // (world * batch)
    share = rounds * batch
    return rank * share, (rank + 1) * share, rounds


def iter_batches(
    path: str,
    batch_size: int | None = None,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    *,
    start_step: int = 0,
    last_batch: str = "wrap",
    torch: bool = False,
    storage: StorageConfig | None = None,
    resume: dict[str, Any] | None = None,
    follow_latest: bool = False,
    loss_weights: str | None = None,
    balance: str | None = None,
    balance_per_token: float = ATTENTION_PER_TOKEN,
    tokens_per_batch: int | None = None,
    curriculum: str | Curriculum = "natural",
) -> Iterator[dict[str, Any]]:
    """Batches of packs for data-parallel rank `rank` of `world_size` (see the module's docstring);
    numpy arrays, or torch tensors with `torch=True` (needs PyTorch: pip install raypack[torch]).
    `last_batch`: "wrap" (every batch full, a few packs twice), "drop" or "short". `resume`: a
    rank's saved state of an earlier run of this epoch at any world size and batch size (a
    PackedDataset's or a StatefulDataLoader's state_dict()): the packs no rank had yielded, shared
    among these ranks (module docstring, "Resume"); `follow_latest`: a state of another version of
    the dataset goes on from its place on this one. `loss_weights`: "document" or "sequence" adds
    per-token loss weights (module docstring). `tokens_per_batch` instead of `batch_size`: every
    batch of a rank holds that many tokens, its packs' length the `curriculum`'s for the step
    (module docstring, "Variable sequence length"). `balance="attention"`: each step's ranks get
    packs of even attention cost (module docstring, "Balance"), `balance_per_token` the weight of a
    token against a document's squared length (raypack.balance.ATTENTION_PER_TOKEN)."""
    check_args(batch_size, rank, world_size, last_batch, loss_weights)
    batching = batching_of(batch_size, tokens_per_batch, curriculum, last_batch)
    balanced = balance_of(balance, balance_per_token, tokens_per_batch)
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    convert = torch_converter() if torch else None
    pinned = pin(path, storage)
    where = resume_of(resume, pinned, follow_latest) if resume is not None else None
    plan = Plan.of(pinned, batching, rank, world_size, seed, last_batch, storage, where, balanced)
    for batch in plan.steps(start_step, 1):
        batch = with_loss_weights(batch, loss_weights)
        yield convert(batch) if convert is not None else batch


_RUN_KEYS = ("world_size", "batch_size", "seed", "last_batch", "step")
"""A Run's fields, as a state's `resumed_from` holds each run (and Batching.state's, for a run of
tokens_per_batch)."""


@dataclass(frozen=True)
class Run:
    """A run of an epoch that a state was saved in: its ranks, batch size, seed, last_batch and
    balance, and the steps every rank had yielded."""

    world_size: int
    batch_size: int | None
    seed: int
    last_batch: str
    step: int
    batching: Batching = field(default_factory=Batching)
    """The run's batches (batch_size's, when it gave one)."""
    balance: Balance | None = None

    def to_state(self) -> dict[str, Any]:
        balance = self.balance.to_state() if self.balance else None
        return {**{k: getattr(self, k) for k in _RUN_KEYS}, **self.batching.state(), "balance": balance}

    @property
    def size(self) -> object:
        """Its batches' size in a resumed schedule's salt: batch_size, or its tokens'."""
        return self.batch_size if self.batch_size is not None else f"{self.batching.tokens_per_batch} tokens"

    @classmethod
    def of_state(cls, state: dict[str, Any], step: int) -> Run:
        """The run a state's settings (a `resumed_from` entry, or a rank's own) describe, values as
        they are (Resume.of checks their types)."""
        batching = Batching.of_state(state)
        size = state["batch_size"]
        balance = Balance.of_state(state.get("balance"))
        return cls(state["world_size"], size, state["seed"], state["last_batch"], step, batching, balance)

    def taken(
        self, buckets: list[_Bucket], totals: list[int], salt: tuple[object, ...]
    ) -> tuple[list[int], list[int]]:
        """(packs a batch, batches every rank had taken) of each bucket, for a run over `totals`
        packs of each bucket on its schedule salted by `salt` (Run.left)."""
        rows = self.batching.rows(buckets)
        steps = [
            _share(t, 0, self.world_size, n, self.last_batch)[2] for t, n in zip(totals, rows, strict=True)
        ]
        schedule = _schedule(steps, self.seed, *salt, curriculum=self.batching.curriculum)
        if self.step > len(schedule):
            raise ValueError(
                f"the state's step {self.step:,} is past the {len(schedule):,} steps its run's epoch has "
                "(a state of another dataset, or edited?)"
            )
        return rows, np.bincount(schedule[: self.step], minlength=len(buckets)).tolist()

    def left(
        self, buckets: list[_Bucket], before: list[Spans], salt: tuple[object, ...], terms: Terms | None
    ) -> list[Spans]:
        """What the epoch has left of each bucket after this run's `step` steps, from what it had
        left before the run (`before`: the bucket's whole sequence for a run that began the epoch).
        Every rank of the run took its share of `before` as Plan.of gives it and had taken, by
        `step`, as many batches of each bucket as the run's schedule (salted by `salt`, the runs'
        before it: Resume.salt) gives every rank; a balanced run's steps are its balanced ones
        (`terms`: the packs' costs, _terms), and what they left is in the order of `before`."""
        totals = [sum(b - a for a, b in spans) for spans in before]
        rows, done = self.taken(buckets, totals, salt)
        left: list[Spans] = []
        for i, (spans, total, taken, n) in enumerate(zip(before, totals, done, rows, strict=True)):
            if self.balance is not None:
                if terms is None:
                    raise RuntimeError("a balanced run's rest needs the packs' terms")
                key = _key(self.seed, "balance", buckets[i].length, *salt)
                costs = self.balance.cost(*terms[i])
                world, last = self.world_size, self.last_batch
                real, step, _ = _balanced(spans, costs, world, n, last, key, self.balance)
                left.append(spans_of(real[step >= taken]))
                continue
            rest: Spans = []
            for r in range(self.world_size):
                lo, hi, _ = _share(total, r, self.world_size, n, self.last_batch)
                rest += _within(spans, min(lo + taken * n, hi), hi)
            left.append(rest)
        return left


@dataclass(frozen=True)
class _Leftover:
    """What a balanced run that began the epoch left of one bucket (Run.left's sequence: each of its
    neighbourhoods' unyielded packs, one neighbourhood after another, in the bucket's order), never
    listed whole: `at` gives the positions at some of its indices from the steps of the
    neighbourhoods holding them alone (their costs through `costs`). How many packs a neighbourhood
    left needs no cost: each of its ranks took `taken` batches of its own share's size."""

    run: Run
    balance: Balance
    """The run's."""
    packs: int
    batch: int
    taken: int
    key: int
    costs: Callable[[np.ndarray], np.ndarray]

    def _layout(self) -> tuple[list[tuple[int, int]], np.ndarray, list[np.ndarray], np.ndarray]:
        """The run's shares' bounds and sizes, its neighbourhoods, and where each one's leftovers end."""
        run, batch = self.run, self.batch
        bounds = [
            _share(self.packs, r, run.world_size, batch, run.last_batch)[:2] for r in range(run.world_size)
        ]
        shares = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
        groups = self.balance.neighbourhoods(shares, batch)
        left = shares - np.minimum(self.taken * batch, shares)
        return bounds, shares, groups, np.cumsum([int(left[g].sum()) for g in groups], dtype=np.int64)

    @property
    def total(self) -> int:
        ends = self._layout()[3]
        return int(ends[-1]) if len(ends) else 0

    def at(self, virtual: np.ndarray) -> np.ndarray:
        """The positions at these indices of the sequence (past its end, from its start again)."""
        bounds, shares, groups, ends = self._layout()
        total = int(ends[-1]) if len(ends) else 0
        if not total or not len(virtual):  # as positions_of: nothing left, no position
            return np.zeros(0, dtype=np.int64)
        out = np.empty(len(virtual), dtype=np.int64)
        index = np.asarray(virtual, dtype=np.int64) % total
        of = np.searchsorted(ends, index, side="right")
        for g in np.unique(of).tolist():
            ranks = groups[g]
            real = positions_of([(0, self.packs)], np.arange(bounds[ranks[0]][0], bounds[ranks[-1]][1]))
            step, _ = self.balance.neighbourhood_steps(self.costs(real), shares, g, self.batch, self.key)
            kept = real[step >= self.taken]
            here = of == g
            out[here] = kept[index[here] - (int(ends[g]) - len(kept))]
        return out


Left = Spans | _Leftover
"""What the epoch has left of a bucket: spans of its sequence, or a balanced first run's leftovers."""


def _left(
    pinned: Pinned, buckets: list[_Bucket], resume: Resume | None, seed: int, storage: StorageConfig | None
) -> tuple[list[Left], Terms | None]:
    """What the epoch has left of each bucket after the runs of `resume`, and every pack's terms
    where that needed them. After one balanced run that began the epoch, its leftovers are read a
    neighbourhood at a time (_Leftover: a rank reads the earlier run's neighbourhoods its own holds
    packs of); after a chain of runs with a balanced one, every pack's terms, once (O(packs))."""
    if resume is None:
        return [[(0, b.packs)] for b in buckets], None
    resume.check_seed(seed)
    first = resume.runs[0]
    if len(resume.runs) == 1 and first.balance is not None:
        rows, done = first.taken(buckets, [b.packs for b in buckets], ())
        out: list[Left] = []
        for i, bucket in enumerate(buckets):
            costs = functools.partial(_Costs(pinned, seed, storage, first.balance).at, i, bucket)
            key = _key(first.seed, "balance", bucket.length)
            out.append(_Leftover(first, first.balance, bucket.packs, rows[i], done[i], key, costs))
        return out, None
    terms = _terms(pinned, buckets, seed, storage) if resume.balanced else None
    left: list[Spans] = [[(0, b.packs)] for b in buckets]
    for k, earlier in enumerate(resume.runs):
        left = earlier.left(buckets, left, resume.salt(k), terms)
    return list(left), terms


@dataclass(frozen=True)
class Resume:
    """Where an epoch stands after the runs that read it so far (an elastic resume: a job restarted
    on another number of ranks or another batch size goes on with the packs no rank has yielded).
    Ranks of a data-parallel job step together, so any one rank's state says where all stand."""

    runs: tuple[Run, ...]

    def salt(self, runs: int | None = None) -> tuple[object, ...]:
        """What makes the schedule of the run after the first `runs` runs (None: all) its own, the
        same on every rank of it; () for the epoch's first run."""
        before = self.runs[:runs]
        return ("resume", *((r.world_size, r.size, r.step) for r in before)) if before else ()

    def check_seed(self, seed: int) -> None:
        """ValueError unless `seed` is the epoch's, every run's: positions are of its seeded order."""
        for run in self.runs:
            if run.seed != seed:
                raise ValueError(
                    f"the state is of an epoch read with seed {run.seed}: resume it with that seed, "
                    f"not {seed}"
                )

    def to_state(self) -> list[dict[str, Any]]:
        return [r.to_state() for r in self.runs]

    @property
    def balanced(self) -> bool:
        return any(r.balance is not None for r in self.runs)

    @classmethod
    def of(cls, state: dict[str, Any]) -> tuple[Resume, str | None]:
        """The epoch's position from a rank's saved state, and the manifest sha256 it read: a
        PackedDataset's state_dict(), or a torchdata StatefulDataLoader's state_dict() of one (any
        num_workers). ValueError for anything else."""
        dataset_state, step = _dataset_state(state)
        try:
            earlier = [Run.of_state(r, r["step"]) for r in dataset_state.get("resumed_from") or []]
            this = Run.of_state(
                {
                    **dataset_state,
                    **{k: int(dataset_state[k]) for k in ("world_size", "seed")},
                    "batch_size": None
                    if dataset_state["batch_size"] is None
                    else int(dataset_state["batch_size"]),
                    "last_batch": str(dataset_state["last_batch"]),
                },
                step,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"not a raypack PackedDataset state ({type(e).__name__}: {e})") from None
        for run in [*earlier, this]:
            if not all(isinstance(getattr(run, k), int) for k in ("world_size", "seed", "step")) or not (
                run.batch_size is None or isinstance(run.batch_size, int)
            ):
                raise ValueError(
                    f"not a raypack PackedDataset state: a run of {run} holds a value of another type"
                )
            check_args(run.batch_size, 0, run.world_size, run.last_batch)
            b = run.batching
            batching_of(run.batch_size, b.tokens_per_batch, b.curriculum, run.last_batch)
            if run.step < 0:
                raise ValueError(f"not a raypack PackedDataset state: step {run.step} is negative")
        return cls((*earlier, this)), dataset_state.get("manifest_sha256")


def resume_of(state: dict[str, Any], pinned: Pinned, follow_latest: bool = False) -> Resume:
    """Resume.of(state), refused (ValueError) when the state read another version of the dataset
    than `pinned` (a rebuild committed since), unless `follow_latest`."""
    resume, saved = Resume.of(state)
    if follow_latest:
        return resume
    if saved is None:
        raise ValueError(
            "the state does not say which version of the dataset it read (manifest_sha256): a "
            "PackedDataset's or a StatefulDataLoader's state_dict() does; or pass follow_latest=True"
        )
    if saved != pinned.sha256:
        read = _dataset_state(state)[0].get("dataset") or "another version"
        raise ValueError(
            f"the state was saved reading {read} (manifest {saved[:12]}), not {pinned.path} (manifest "
            f"{pinned.sha256[:12]}): a rebuild committed since, or another packing of the data. Resume "
            "on the version it read, or pass follow_latest=True to go on from its place on this one"
        )
    return resume


def _dataset_state(state: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """A PackedDataset's state and the steps its rank had yielded, from its own state_dict() or a
    StatefulDataLoader's (single process: its `_num_yielded`; with workers: the snapshot's step, the
    batches yielded since, and any worker's dataset state for the settings)."""
    if not isinstance(state, dict):
        raise ValueError(f"a state is a dict (a state_dict()), not {type(state).__name__}")
    try:
        if "_snapshot" in state:  # StatefulDataLoader with workers
            snapshot = state["_snapshot"]
            workers = [w.get("dataset_state") for w in snapshot.get("_worker_snapshots", {}).values()]
            workers = [w for w in workers if w]
            if not workers:
                raise ValueError("the loader's state holds no worker's dataset state: not a PackedDataset's")
            return workers[0], int(snapshot["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
        if "dataset_state" in state and "_num_yielded" in state:  # StatefulDataLoader in one process
            return state["dataset_state"] or {}, int(state["_num_yielded"])
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"not a StatefulDataLoader state of a PackedDataset ({type(e).__name__}: {e})"
        ) from None
    if "next_step" in state:  # the dataset's own
        if not isinstance(state["next_step"], int):
            # None: before its first batch, after its epoch ended, or the main process's copy of a
            # loader with workers (which never iterates): no position to resume from.
            raise ValueError(
                "this PackedDataset state holds no position (next_step None: before its first batch, "
                "after its epoch, or the main process's copy under a loader with workers): give the "
                "StatefulDataLoader's state_dict(), which counts the batches it yielded"
            )
        return state, state["next_step"]
    raise ValueError("not a raypack PackedDataset state or a StatefulDataLoader state of one")


LOSS_WEIGHTS = ("document", "sequence")


def with_loss_weights(batch: dict[str, Any], per: str | None) -> dict[str, Any]:
    """The batch with `loss_weights` (module docstring) per document or per sequence; as it is for
    None."""
    if per is None:
        return batch
    labels, docs = batch["labels"], batch["document_ids"]
    trained = labels != IGNORE_INDEX
    rows, length = labels.shape
    row = np.repeat(np.arange(rows, dtype=np.int64), length).reshape(rows, length)
    # A group a document of a row (its id unique in the batch), or a row.
    group = row * (length + 1) + docs + 1 if per == "document" else row
    counts = np.bincount(group[trained], minlength=int(group.max(initial=0)) + 1)
    present = int((counts > 0).sum())
    weights = np.zeros((rows, length), dtype=np.float64)
    if present:
        weights[trained] = 1.0 / (counts[group[trained]] * present)
    return {**batch, "loss_weights": weights.astype(np.float32)}


def check_args(
    batch_size: int | None, rank: int, world_size: int, last_batch: str, loss_weights: str | None = None
) -> None:
    """ValueError for settings no reader can follow (iter_batches and torch_data.PackedDataset)."""
    if loss_weights is not None and loss_weights not in LOSS_WEIGHTS:
        raise ValueError(
            f"loss_weights must be one of {', '.join(LOSS_WEIGHTS)} or None, got {loss_weights!r}"
        )
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    if last_batch not in LAST_BATCH:
        raise ValueError(f"last_batch must be one of {', '.join(LAST_BATCH)}, got {last_batch!r}")


def batching_of(
    batch_size: int | None, tokens_per_batch: int | None, curriculum: str | Curriculum, last_batch: str
) -> Batching:
    """The Batching of a reader's settings; ValueError unless exactly one of batch_size and
    tokens_per_batch is given, or for a curriculum or last_batch that tokens_per_batch cannot keep."""
    if (batch_size is None) == (tokens_per_batch is None):
        raise ValueError("give one of batch_size (packs a batch) and tokens_per_batch (tokens a batch)")
    cur = Curriculum.of(curriculum)
    if tokens_per_batch is None:
        if cur != Curriculum():
            raise ValueError(f"curriculum {cur.name} orders batches of tokens_per_batch; give that")
        return Batching(batch_size)
    if isinstance(tokens_per_batch, bool) or not isinstance(tokens_per_batch, int) or tokens_per_batch < 1:
        raise ValueError(f"tokens_per_batch must be an int >= 1, got {tokens_per_batch!r}")
    if last_batch == "short":
        raise ValueError(
            'last_batch "short" would give a rank fewer than tokens_per_batch tokens; take "wrap" or "drop"'
        )
    return Batching(None, tokens_per_batch, cur)


def balance_of(balance: str | None, per_token: float, tokens_per_batch: int | None) -> Balance | None:
    """The Balance of a reader's settings (raypack.balance.Balance.of); ValueError with
    tokens_per_batch, whose steps are each one bucket's length: in a dataset of decompose every
    pack of a step costs the same (one document of that length), and a bucket's packs would need
    the costs balanced by tokens, which the balancer does not do."""
    balanced = Balance.of(balance, per_token)
    if balanced is not None and tokens_per_batch is not None:
        raise ValueError('balance="attention" takes batch_size, not tokens_per_batch')
    return balanced


def _warn_short_buckets(buckets: list[_Bucket], rows: list[int], world: int, last_batch: str) -> None:
    """Warn of the buckets a fixed token count reads badly: one with fewer packs than a global step
    holds (`rows` a rank × `world`) fills its one step by reading its packs again ("wrap") or is
    never read ("drop"); one of length 1 has no token a shifted label trains (each chunk's first
    token has none), so its steps' loss is 0/0. Raise pack.min_seq_len, or lower tokens_per_batch."""
    short = [
        (b.length, b.packs, n * world) for b, n in zip(buckets, rows, strict=True) if b.packs < n * world
    ]
    if short:
        what = "read again to fill it" if last_batch == "wrap" else "never read"
        listed = ", ".join(f"length {length} ({packs:,} of {step:,})" for length, packs, step in short)
        warnings.warn(
            f"tokens_per_batch: buckets with fewer sequences than one step of all ranks takes are {what}: "
            f"{listed}; raise pack.min_seq_len or lower tokens_per_batch",
            stacklevel=4,
        )
    if any(b.length == 1 and b.packs for b in buckets):
        warnings.warn(
            "tokens_per_batch: the dataset has a bucket of 1-token sequences, whose steps train no token "
            "(a chunk's first token has no label): pack with pack.min_seq_len >= 2",
            stacklevel=4,
        )


@dataclass(frozen=True)
class Plan:
    """One rank's epoch over a pinned dataset: each bucket's share of positions and the bucket of every
    step. Nothing is read to make it (the manifest lists every row group)."""

    pinned: Pinned
    buckets: list[_Bucket]
    shares: list[Spans]
    """Each bucket's positions for this rank: [lo, hi) of its sequence, or after an elastic resume
    this rank's share of what the earlier runs left."""
    schedule: np.ndarray
    rows: list[int]
    """Packs a batch of each bucket holds."""
    seed: int
    storage: StorageConfig | None
    keep: int = 1
    """Row groups a stream keeps decoded: a balanced window's (its neighbourhood's slices,
    raypack.balance.RANK_WINDOW_PACKS a rank)."""

    @classmethod
    def of(
        cls,
        pinned: Pinned,
        batch_size: int | Batching,
        rank: int,
        world_size: int,
        seed: int,
        last_batch: str,
        storage: StorageConfig | None,
        resume: Resume | None = None,
        balance: Balance | None = None,
    ) -> Plan:
        batching = batch_size if isinstance(batch_size, Batching) else Batching(batch_size)
        buckets = _buckets(pinned.path, pinned.manifest, seed, storage)
        rows = batching.rows(buckets)
        if batching.tokens_per_batch is not None:
            _warn_short_buckets(buckets, rows, world_size, last_batch)
        left, terms = _left(pinned, buckets, resume, seed, storage)
        salt = resume.salt() if resume is not None else ()
        shares, steps, full = [], [], []
        for i, (seq, size) in enumerate(zip(left, rows, strict=True)):
            total = seq.total if isinstance(seq, _Leftover) else sum(b - a for a, b in seq)
            lo, hi, n = _share(total, rank, world_size, size, last_batch)
            steps.append(n)
            full.append(total // world_size // size if last_batch == "short" else n)
            at = seq.at if isinstance(seq, _Leftover) else functools.partial(positions_of, seq)
            if balance is None:
                shares.append(
                    _within(seq, lo, hi) if isinstance(seq, list) else spans_of(at(np.arange(lo, hi)))
                )
                continue
            key = _key(seed, "balance", buckets[i].length, *salt)
            costs = functools.partial(_Costs(pinned, seed, storage, balance, terms).at, i, buckets[i])
            shares.append(_balanced_share(at, total, costs, rank, world_size, size, last_batch, key, balance))
        keep = 1
        if balance is not None:
            # A window's packs are a slice of each of a neighbourhood's shares, each slice over this
            # many row groups of the mean size and 2 at its edges.
            groups = sum(len(bucket.groups) for bucket in buckets)
            per_group = sum(bucket.packs for bucket in buckets) / max(1, groups)
            ranks = max(
                (balance.neighbourhood(world_size, b, n) for b, n in zip(rows, full, strict=True)), default=1
            )
            keep = ranks * (int(np.ceil(balance.rank_window / max(1.0, per_group))) + 2)
        order = _schedule(steps, seed, *salt, curriculum=batching.curriculum)
        return cls(pinned, buckets, shares, order, rows, seed, storage, keep)

    def read(self, bucket: int, group: int) -> pa.Table:
        return read_group(self.pinned, self.buckets[bucket].groups[group], self.seed, self.storage)

    def _streams(self, start: int, load: GroupLoader | None) -> list[_RankStream]:
        """Each bucket's stream, moved past the batches of the steps before `start` (not read)."""
        streams = [
            _RankStream(b, bucket, spans, load, self.keep)
            for b, (bucket, spans) in enumerate(zip(self.buckets, self.shares, strict=True))
        ]
        for b, done in enumerate(np.bincount(self.schedule[:start], minlength=len(self.buckets)).tolist()):
            streams[b].skip(done * self.rows[b])
        return streams

    def steps(self, start: int, stride: int, load: GroupLoader | None = None) -> Iterator[dict[str, Any]]:
        """The batches of steps start, start + stride, ... (a DataLoader worker's share of a rank's
        steps); the steps between are skipped without being read."""
        pad_id = spec_of(self.pinned.manifest).pad_id
        streams = self._streams(start, load or self.read)
        for i, b in enumerate(self.schedule[start:].tolist()):
            if i % stride:
                streams[b].skip(self.rows[b])
                continue
            parts = streams[b].take(self.rows[b])
            table = pa.concat_tables(parts) if parts else None
            yield batch_fields(table, self.buckets[b].length, pad_id)

    def touches(self, start: int) -> list[list[tuple[int, int]]]:
        """The (bucket, row group) pairs each step from `start` on reads, in order, without reading."""
        streams = self._streams(start, None)
        return [
            [(b, g) for g, _, _ in streams[b].parts(self.rows[b])] for b in self.schedule[start:].tolist()
        ]


def batch_fields(table: pa.Table | None, length: int, pad_id: int) -> dict[str, Any]:
    """The training fields of packed rows (module docstring); None or no rows: an empty batch."""
    if table is None or table.num_rows == 0:
        empty = np.zeros((0, length), dtype=np.int64)
        return {
            "input_ids": empty,
            "labels": empty.copy(),
            "shift_labels": empty.copy(),
            "position_ids": empty.copy(),
            "document_ids": empty.copy(),
            "cu_seqlens": np.zeros(1, dtype=np.int32),
            "cu_seqlens_padded": np.zeros(1, dtype=np.int32),
            "max_seqlen": 0,
        }
    rows = table.num_rows
    ids_list = table.column("input_ids").combine_chunks()
    input_ids = ids_list.flatten().to_numpy().astype(np.int64).reshape(rows, length)
    cu_padded, cu_seqlens, seg, real = _segments(table, length)
    flat = np.arange(rows * length)
    position_ids = (flat - cu_padded[seg]).reshape(rows, length).astype(np.int64)
    seg = seg.reshape(rows, length)
    # Document of each token within its row (0, 1, ...), -1 on padding: the row's first segment is
    # its first document, and its end padding is the row's last segment when the row is not full.
    document_ids = np.where(real, seg - seg[:, :1], -1).astype(np.int64)
    # shift_labels[t]: the target of position t, input_ids[t+1] when t+1 is a real token of the same
    # document, else -100. labels: the same targets aligned with input_ids (labels[t+1] =
    # shift_labels[t]), as Hugging Face models take them: they shift by one themselves, so a
    # document's first token and the padding are -100.
    same = np.zeros((rows, length), dtype=bool)
    same[:, :-1] = (seg[:, 1:] == seg[:, :-1]) & real[:, 1:]
    shift_labels = np.full((rows, length), IGNORE_INDEX, dtype=np.int64)
    shift_labels[same] = np.roll(input_ids, -1, axis=1)[same]
    labels = np.full((rows, length), IGNORE_INDEX, dtype=np.int64)
    labels[:, 1:] = shift_labels[:, :-1]
    if "loss_mask" in table.column_names:  # chat data: only the trained targets carry a label
        trained = table.column("loss_mask").combine_chunks().flatten().to_numpy().reshape(rows, length)
        labels[trained == 0] = IGNORE_INDEX
        shift_labels[:, :-1][trained[:, 1:] == 0] = IGNORE_INDEX
    if not np.array_equal(input_ids[~real], np.full(int((~real).sum()), pad_id)):
        raise ValueError("padding positions hold tokens other than pad_id: not a raypack dataset?")
    lengths = np.diff(cu_padded)
    return {
        "input_ids": input_ids,
        "labels": labels,
        "shift_labels": shift_labels,
        "position_ids": position_ids,
        "document_ids": document_ids,
        "cu_seqlens": cu_seqlens,
        "cu_seqlens_padded": cu_padded,
        "max_seqlen": int(lengths.max()) if len(lengths) else 0,
    }


def _segments(table: pa.Table, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batch flattened to rows × length positions, cut into segments: every item with its
    alignment padding (pack.pad_multiple), then each row's end padding where it has some. Returns
    the segments' position boundaries (cu_seqlens_padded), their real tokens' (cu_seqlens: an
    item's real tokens, an end padding's every position, so that without alignment both are one),
    each position's segment, and (rows, length) True on the items' real tokens."""
    rows = table.num_rows
    padded = PADDED_OFFSETS.name in table.column_names
    bounds_list = table.column(PADDED_OFFSETS.name if padded else "doc_offsets").combine_chunks()
    bounds = bounds_list.flatten().to_numpy().astype(np.int64)
    row_of = np.repeat(np.arange(rows), np.diff(bounds_list.offsets.to_numpy()))
    # Each row's boundaries start at 0, so row starts are among them; a full row's end is the next
    # row's start, hence unique.
    cu_padded = np.unique(np.r_[bounds + row_of * length, rows * length]).astype(np.int32)
    seg = np.searchsorted(cu_padded, np.arange(rows * length), side="right") - 1
    if not padded:
        num_tokens = table.column("num_tokens").to_numpy().astype(np.int64)
        return cu_padded, cu_padded, seg, np.arange(length)[None, :] < num_tokens[:, None]
    starts, lengths, per_row = item_spans(table)
    base = np.repeat(np.arange(rows, dtype=np.int64) * length, per_row)
    real = real_positions(rows, length, starts + base, starts + lengths + base)
    spans = np.diff(cu_padded).astype(np.int64)
    in_items = np.bincount(seg[real.reshape(-1)], minlength=len(spans))
    seg_real = np.where(in_items > 0, in_items, spans)  # an end padding counts whole, as unaligned
    return cu_padded, np.r_[0, np.cumsum(seg_real)].astype(np.int32), seg, real


def block_causal_mask(document_ids: Any, dtype: Any = None) -> Any:
    """(B, 1, L, L) mask from `document_ids`: query q may attend to key k when k <= q in the same
    document (padding, document -1, attends to padding only, so no row is fully masked).

    dtype None: boolean, True = attend, for torch's scaled_dot_product_attention(attn_mask=...).
    A float dtype: additive, 0 = attend and the dtype's lowest value elsewhere, for Hugging Face
    models, which take a 4D attention_mask as it is: their "eager" attention adds it to the scores,
    so a boolean mask there is silently wrong (measured: logits off by 0.31 on a tiny Llama), while
    "sdpa" takes either. A numpy array or a torch tensor in, the same kind out (on its device).
    Memory: B × L² elements (64 MiB a row at 8192 in bfloat16)."""
    q = document_ids[:, None, :, None]
    k = document_ids[:, None, None, :]
    length = document_ids.shape[-1]
    if isinstance(document_ids, np.ndarray):
        allowed = (q == k) & np.tril(np.ones((length, length), dtype=bool))
        if dtype is None:
            return allowed
        return np.where(allowed, 0, np.finfo(dtype).min).astype(dtype)
    import torch

    allowed = (q == k) & torch.ones((length, length), dtype=torch.bool, device=document_ids.device).tril()
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def torch_converter() -> Any:
    try:
        import torch
    except ImportError:
        raise ImportError("torch=True needs PyTorch: pip install 'raypack[torch]'") from None

    def convert(batch: dict[str, Any]) -> dict[str, Any]:
        return {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in batch.items()}

    return convert


def read_packed(path: str, storage: StorageConfig | None = None, bucket: int | None = None) -> Any:
    """The dataset's packs as a Ray Dataset (one block per output file; columns of schema.PACKED plus
    `bucket_length` and `pad_id`), for Ray Train: `ray.train` splits it across workers itself, and
    training_batches makes a worker's batches the training fields. Any output format: tokens are
    read through the format's files. `bucket`: only the packs of that bucket length (a dataset packed
    with `bucket` has several; a Ray Data batch may otherwise mix them)."""
    import ray.data

    pinned = pin(path, storage)
    spec = spec_of(pinned.manifest)
    files = sorted(pinned.manifest["files"], key=lambda f: f["path"])
    if bucket is not None:
        if isinstance(bucket, bool) or not isinstance(bucket, int):
            raise ValueError(f"bucket must be a pack length (an int), got {bucket!r}")
        lengths = sorted({int(f["bucket_length"]) for f in files})
        files = [f for f in files if int(f["bucket_length"]) == bucket]
        if not files:
            raise ValueError(
                f"{pinned.path} has no packs of length {bucket}: its bucket lengths are {lengths}"
            )
    entries = [{"entry": json.dumps(f)} for f in files]

    def read(batch: pa.Table) -> pa.Table:
        tables = []
        for text in batch.column("entry").to_pylist():
            entry = json.loads(text)
            table = read_packs(pinned.path, entry, spec, storage).table()
            length = np.full(table.num_rows, int(entry["bucket_length"]), np.int32)
            table = table.append_column("bucket_length", pa.array(length))
            tables.append(
                table.append_column("pad_id", pa.array(np.full(table.num_rows, spec.pad_id, np.int32)))
            )
        return pa.concat_tables(tables)

    source = ray.data.from_items(entries, override_num_blocks=max(1, len(entries)))
    return source.map_batches(read, batch_size=1, batch_format="pyarrow")


def training_batches(shard: Any, batch_size: int, *, torch: bool = False) -> Iterator[dict[str, Any]]:
    """A Ray Train worker's batches of read_packed's packs, as the training fields of iter_batches
    (labels, shift_labels, position_ids, document_ids, cu_seqlens, max_seqlen): `shard` is the
    worker's `ray.train.get_dataset_shard(name)` (or any Ray Dataset / DataIterator of read_packed's
    rows). A batch never mixes pack lengths: where a dataset of several buckets changes length
    inside a Ray Data batch, the batch is cut there (use read_packed's `bucket`, or iter_batches,
    for full batches of one length each step). Ray Train's split is `equal`: each worker gets as many
    packs, so up to world_size - 1 packs of an epoch reach no worker (iter_batches with the rank and
    world size of ray.train.get_context() reads every pack, by `last_batch`'s rule)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    convert = torch_converter() if torch else None
    for table in shard.iter_batches(batch_size=batch_size, batch_format="pyarrow"):
        if not table.num_rows:
            continue
        missing = [
            c
            for c in ("input_ids", "doc_offsets", "num_tokens", "bucket_length", "pad_id")
            if c not in table.column_names
        ]
        if missing:
            raise ValueError(
                "training_batches takes the rows of raypack.reader.read_packed; these lack "
                f"{', '.join(missing)} (columns: {', '.join(table.column_names)})"
            )
        lengths = table.column("bucket_length").to_numpy()
        cuts = np.r_[0, np.flatnonzero(np.diff(lengths)) + 1, len(lengths)]
        pad_id = int(table.column("pad_id")[0].as_py())
        for a, b in itertools.pairwise(cuts.tolist()):
            batch = batch_fields(table.slice(a, b - a), int(lengths[a]), pad_id)
            yield convert(batch) if convert is not None else batch


def document_metadata(path: str, storage: StorageConfig | None = None) -> pa.Table:
    """The metadata the dataset kept of its documents (input.metadata_fields; the manifest's
    `metadata`): a row a document, `doc_id` then a column a field, typed as the manifest says (a
    field a record lacked: null), in the index's order (work unit, then row). A document a mixture
    repeated is one row (its copies share its id and its metadata). ValueError for a dataset that
    kept none. It holds every document's id and fields: ~100 bytes a document with a few short ones.

    A pack's documents are its `doc_ids` (read_packed's rows, a parquet dataset's, a format's pack
    index): DocumentMetadata looks them up."""
    pinned = pin(path, storage)
    kinds = metadata_kinds(pinned.manifest)
    if not kinds:
        raise ValueError(f"{pinned.path} keeps no metadata of its documents (input.metadata_fields)")
    parts = []
    for shard in range(int(pinned.manifest["counts"]["shards"])):
        fs, inner = resolve(index_path(pinned.path, shard), storage)
        with fs.open_input_file(inner) as f:
            table = pq.read_table(f, columns=["doc_id", "copy", METADATA])
        table = table.filter(pc.less_equal(table.column("copy"), 0))  # a document once, not a copy
        meta = table.column(METADATA).combine_chunks()
        parts.append(pa.table([table.column("doc_id"), *meta.flatten()], names=["doc_id", *kinds]))
    return pa.concat_tables(parts)


class DocumentMetadata:
    """A dataset's documents' metadata by id (document_metadata's table), for the documents of its
    packs: a pack's `doc_ids` (each chunk of a long document carries its id, so its chunks share
    its metadata).

        meta = DocumentMetadata("out/")
        for pack in read_packed("out/").iter_rows():
            for doc_id, fields in zip(pack["doc_ids"], meta.of(pack["doc_ids"])):
                ...   # fields: {"url": ..., "language": ...}

    An id that several documents share (an input.id_field whose values repeat) names no one
    document's metadata where theirs differ: `of` raises a ValueError for it (the packs cannot
    tell those documents apart); where theirs are equal, it gives them."""

    def __init__(self, path: str, storage: StorageConfig | None = None) -> None:
        self.table = document_metadata(path, storage)
        self.fields = tuple(self.table.column_names[1:])
        self._rows = self.table.drop_columns(["doc_id"]).to_pylist()
        self._at: dict[str, int] = {}
        self._ambiguous: set[str] = set()
        for i, doc_id in enumerate(self.table.column("doc_id").to_pylist()):
            first = self._at.setdefault(doc_id, i)
            if first != i and self._rows[first] != self._rows[i]:
                self._ambiguous.add(doc_id)

    def __len__(self) -> int:
        return self.table.num_rows

    def of(self, doc_ids: Any) -> list[dict[str, Any]]:
        """The metadata of each id of `doc_ids` (a pack's, in its order), a dict of the fields
        each; KeyError for an id the dataset does not hold."""
        found = []
        for doc_id in doc_ids:
            if doc_id in self._ambiguous:
                raise ValueError(
                    f"documents of id {doc_id!r} hold different metadata, and the packs cannot tell "
                    "them apart (an id field whose values repeat): see document_metadata's rows"
                )
            found.append(self._rows[self._at[doc_id]])
        return found


def attention_imbalance(
    path: str,
    batch_size: int,
    world_size: int,
    seed: int = 0,
    *,
    last_batch: str = "drop",
    balance_per_token: float = ATTENTION_PER_TOKEN,
    storage: StorageConfig | None = None,
) -> dict[str, float]:
    """How uneven iter_batches' steps are on this dataset at `world_size` ranks of `batch_size`
    packs: the mean over steps of max / mean rank cost (Σ l² + balance_per_token · Σ l over a
    rank's documents), as "unbalanced" and "balanced" (balance="attention") read the epoch. From
    every pack index's doc_offsets (O(the dataset), once; no token is read). ValueError where the
    epoch makes no step."""
    check_args(batch_size, 0, world_size, last_batch)
    balance = Balance.attention(balance_per_token)
    pinned = pin(path, storage)
    buckets = _buckets(pinned.path, pinned.manifest, seed, storage)
    plain, balanced = [], []
    for bucket, terms in zip(buckets, _terms(pinned, buckets, seed, storage), strict=True):
        costs = balance.cost(*terms)
        spans = [(0, bucket.packs)]
        ranks = []
        for r in range(world_size):
            lo, hi, steps = _share(bucket.packs, r, world_size, batch_size, last_batch)
            mine = costs[positions_of(_within(spans, lo, hi), np.arange(hi - lo))]
            # a short rank's last batch may be short or empty: count what it holds
            ranks.append(np.bincount(np.arange(len(mine)) // batch_size, weights=mine, minlength=steps))
        plain.append(np.array(ranks).T)
        key = _key(seed, "balance", bucket.length)
        real, step, owner = _balanced(spans, costs, world_size, batch_size, last_batch, key, balance)
        balanced.append(step_costs(costs[real], step, owner, world_size))
    per_step = np.concatenate(plain)
    if not len(per_step):
        raise ValueError(
            f"the dataset's {sum(b.packs for b in buckets):,} packs make no step of {world_size:,} ranks × "
            f"{batch_size:,} packs (last_batch={last_batch!r})"
        )
    return {"unbalanced": imbalance(per_step), "balanced": imbalance(np.concatenate(balanced))}
