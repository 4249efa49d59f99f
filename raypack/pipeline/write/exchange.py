"""Stages 5-7 of the global job on the runner's tasks (raypack.engine: Ray's, or a local
pool's): assign every item to its pack, move it to the task that writes its output file, write the
files. The fan-out of every task is bounded, so the number of blobs (Ray objects, or a local run's
files) grows with the bytes moved, never with shards × files.

    runs of shards ──assign_run (M tasks)──▶ a round of K pieces per ~ROUND_BYTES of items
      one hop:  K = R, piece k of a round goes to writer k
      two hops: piece k goes to partition k (a run of writers) ──merge_pieces, J pieces at a time──▶
                one piece per writer of the partition
    ──write_files (R tasks, each a contiguous range of output files, one file at a time)──▶ data/
    ids (input.id_field): with each round, an assign task also yields the ids of the documents it read
    since the last, hashed into P pieces ──count_ids (P tasks)──▶ ids carried by more than one document

With S shards, F files, D bytes of items (~4 bytes a token) and W the cluster's CPUs:
- M = min(S, W) assign tasks, each over a run of consecutive shards of about equal input bytes. The
  driver holds one rank base per run (raypack.pipeline.place.histogram.Totals), M × (seq_len + 1) int64.
- An assign task's memory is bounded by a round (ROUND_BYTES plus one record batch; ~3 rounds at its
  peak, while it sorts), whatever its run's size: a round's pieces, and its documents' ids, are
  yielded (stored in the object store) as soon as it is full. Rounds: D / ROUND_BYTES + M.
- R = min(F, max(W, D / WRITER_BYTES)) writers, each holding its pieces in the object store (about
  D / R bytes, spilled to disk by Ray when the store is full) and one file in its heap.
- Objects: one hop, rounds × R; two hops (when that is over ONE_HOP_OBJECTS and makes fewer),
  rounds × K + (rounds / J) × R with J = c·K, c = MERGE_BYTES / ROUND_BYTES = 16 and K = sqrt(R / c):
  each token then moves twice. Tasks: M + R (+ K × rounds / J). A 2T-token job on 1,024 CPUs: ~1M
  objects (docs/benchmarks.md, "Scale").
The output does not depend on any of these numbers: a file is written from all of its items, placed by
(pack, slot), so M, R, K, J and W change the tasks, never the bytes.

On a runner whose tasks share the driver's disk (the local pool: Runner.shares_disk) and local token
files, an item carries no tokens, only where they lie in its unit's token file (schema.ITEMS' source
and start): a piece is ~60 bytes an item, and a writer maps the token files its items name
(token_files.MappedTokens) and copies each token once, from the page cache into its pack. Each writer
is given every unit's token file path (U strings; local runs only).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig
from raypack.corpus.units import WorkUnit
from raypack.dataset.layout import index_path
from raypack.engine import Runner, transient
from raypack.formats import Spec
from raypack.packing import Plan
from raypack.paths import is_uri
from raypack.pipeline.place.assign import assign_items
from raypack.pipeline.tokenize.summary import Totals, weighted_parts
from raypack.pipeline.tokenize.worker import forget
from raypack.pipeline.write.materialize import write_pack_file
from raypack.progress import Progress
from raypack.storage import resolve

if TYPE_CHECKING:
    from raypack.pipeline.place.select import Selection

__all__ = [
    "Exchanged",
    "Layout",
    "assign_run",
    "check_index_ids",
    "count_ids",
    "index_ids",
    "layout",
    "merge_pieces",
    "return_kinds",
    "run_exchange",
    "shared_ids",
    "write_files",
]

# An assign task yields a round once its items reach this size. 256 MiB: ~67M tokens; a smaller round
# makes more objects (rounds × K), a larger one a larger task (its peak is ~3 rounds: the pieces and,
# while it sorts them, a copy; 916 MiB private measured by the soak test).
ROUND_BYTES = 256 * 2**20
# Items a writer should receive at most, when there are enough files to spread them: with fewer
# writers than W the cluster idles, with more (tiny pieces) the object count grows for nothing. A
# writer's pieces wait in its node's object store (Ray spills them to disk when it is full); its heap
# holds one file.
WRITER_BYTES = 2 << 30
# Bytes of the pieces one merge task takes (second hop): they stay in the object store and the merge
# yields one writer's piece at a time, so this bounds the node's object store share, not the heap.
MERGE_BYTES = 4 << 30
# Above this many objects, the exchange takes two hops (when that makes fewer). The driver owns every
# object of the exchange, ~3 KB each (3,077 B measured by benchmarks/bench_scale.py): 60 MB here.
ONE_HOP_OBJECTS = 20_000
# An item's bytes beside its tokens, for sizing (file_key, pack, slot, capacity, chunk, two list
# offsets and a doc_id of ~30 characters).
ITEM_BYTES = 64
# A document id's bytes in the id check (~30 characters and an offset).
ID_BYTES = 40


def _cut(weights: np.ndarray, parts: int) -> np.ndarray:
    """Start of each non-empty part of weighted_parts(weights, parts), then len(weights)."""
    part = weighted_parts(weights, parts)
    starts = np.flatnonzero(np.r_[True, part[1:] != part[:-1]]) if len(part) else np.zeros(0, np.int64)
    return np.r_[starts, len(part)].astype(np.int64)


@dataclass(frozen=True)
class Layout:
    """The exchange's tasks and objects, from the runs, the files and the bytes (decided by the
    driver before any task starts; nothing in it changes the output)."""

    run_of_shard: np.ndarray
    rounds: np.ndarray
    """Rounds each assign task yields (0: a run without items)."""
    round_ends: tuple[np.ndarray, ...]
    """Per run, the item bytes after which each round but the last ends."""
    writer_first: np.ndarray
    """Index of each writer's first file (in ascending file key order), then the number of files."""
    part_first: np.ndarray
    """Index of each partition's first writer, then the number of writers (one hop: 0..R)."""
    merge_width: int
    """Pieces a merge task takes (J); 0 for one hop."""
    id_parts: int
    """Pieces each assign task hashes its documents' ids into (0: no id check)."""

    @property
    def runs(self) -> int:
        return len(self.rounds)

    @property
    def writers(self) -> int:
        return len(self.writer_first) - 1

    @property
    def partitions(self) -> int:
        return len(self.part_first) - 1

    @property
    def hops(self) -> int:
        return 2 if self.merge_width else 1

    def id_rounds(self, run: int) -> int:
        """Rounds of id pieces run `run` yields: one a round, one for a run with no items."""
        return max(int(self.rounds[run]), 1) if self.id_parts else 0

    def counts(self) -> dict[str, int]:
        """Tasks and objects the exchange makes (exact: every task's num_returns)."""
        rounds = int(self.rounds.sum())
        assigns = int(np.count_nonzero(self.rounds) if not self.id_parts else self.runs)
        id_pieces = sum(self.id_rounds(run) for run in range(self.runs)) * self.id_parts
        merges = 0
        merge_objects = 0
        if self.merge_width:
            per_part = math.ceil(rounds / self.merge_width)
            merges = per_part * self.partitions
            merge_objects = per_part * self.writers
        return {
            "assign_tasks": assigns,
            "merge_tasks": merges,
            "write_tasks": self.writers,
            "id_tasks": self.id_parts,
            "rounds": rounds,
            "objects": rounds * self.partitions
            + merge_objects
            + id_pieces
            + assigns
            + self.writers
            + self.id_parts,
        }


def layout(
    run_of_shard: np.ndarray,
    runs: int,
    shard_bytes: np.ndarray,
    file_bytes: np.ndarray,
    width: int,
    documents: int = 0,
    id_check: bool = False,
) -> Layout:
    """The exchange for these runs and files. `shard_bytes`: each shard's item bytes (tokens × 4 +
    items × ITEM_BYTES); `file_bytes`: each output file's, in file key order; `width`: the cluster's
    CPUs; `documents`, with `id_check`: the id check's parts, ~WRITER_BYTES of ids each. A local
    run's layout is a Ray run's: at up to 1 GiB of input it never comes near ONE_HOP_OBJECTS."""
    run_bytes = np.bincount(run_of_shard, weights=shard_bytes, minlength=runs)
    rounds = np.where(run_bytes > 0, np.ceil(run_bytes / ROUND_BYTES), 0).astype(np.int64)
    round_ends = tuple(run_bytes[g] * np.arange(1, rounds[g]) / rounds[g] for g in range(runs))
    files = len(file_bytes)
    total = float(np.sum(file_bytes))
    writers = min(files, max(width, math.ceil(total / WRITER_BYTES)))
    writer_first = _cut(np.asarray(file_bytes, dtype=np.float64), writers)
    writers = len(writer_first) - 1
    id_parts = min(width, max(1, math.ceil(documents * ID_BYTES / WRITER_BYTES))) if id_check else 0
    one = Layout(run_of_shard, rounds, round_ends, writer_first, np.arange(writers + 1), 0, id_parts)
    if one.counts()["objects"] <= ONE_HOP_OBJECTS:
        return one
    # K partitions, merges of J = c·K pieces (c = MERGE_BYTES / ROUND_BYTES: a merge's inputs are
    # MERGE_BYTES): objects ≈ rounds·K + rounds·R / (c·K), least at K = sqrt(R / c).
    c = max(1, MERGE_BYTES // ROUND_BYTES)
    k = min(writers, max(2, math.ceil(math.sqrt(writers / c))))
    part_first = _cut(np.ones(writers), k)
    two = Layout(run_of_shard, rounds, round_ends, writer_first, part_first, c * k, id_parts)
    return two if two.counts()["objects"] < one.counts()["objects"] else one


def _sorted(tables: list[pa.Table]) -> pa.Table:
    if not tables:
        return schema.ITEMS.empty_table()
    table = pa.concat_tables(tables)
    keys = table.column("file_key").to_numpy()
    if np.all(keys[1:] >= keys[:-1]):  # already in order (a round of one file's items): no copy
        return table
    return table.sort_by("file_key")  # Arrow's sort is stable


def _ids_table(arrays: list[pa.Array]) -> pa.Table:
    return pa.table({"doc_id": pa.concat_arrays(arrays) if arrays else pa.array([], pa.string())})


def _refs(returned: Any, n: int) -> list[Any]:
    """A task's n ObjectRefs as a list (Ray returns the ref itself when num_returns is 1)."""
    return [returned] if n == 1 else list(returned)


def _add_ids(parts: list[list[pa.Array]], ids: pa.Array) -> None:
    """Append each id to the list of its hash part (nothing when there are no parts: no id check)."""
    if parts:
        part = _hash_parts(ids, len(parts))
        for p, found in enumerate(parts):
            found.append(ids.filter(pa.array(part == p)))


def _hash_parts(ids: pa.Array, parts: int) -> np.ndarray:
    """A part for each id by a stable hash of its text (pandas' siphash with its fixed key: the same
    on every worker and every run, unlike Python's hash())."""
    from pandas.util import hash_array

    values = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=object)
    return (hash_array(values, categorize=False) % np.uint64(parts)).astype(np.int64)


def assign_run(
    cfg: JobConfig,
    plan: Plan,
    rank_base: np.ndarray,
    shards: list[WorkUnit],
    rounds: int,
    round_ends: np.ndarray,
    part_first_key: np.ndarray,
    id_parts: int,
    patterns: tuple[str, ...] | None,
    selection: Selection | None = None,
    in_place: bool = False,
) -> Iterator[Any]:
    """Task (a generator: each value is stored as it is yielded): `rounds` rounds, each one piece
    per partition (items sorted by file_key) and `id_parts` pieces of the ids of the documents read
    since the last round (a run with no items: one round of id pieces alone), then its counts. Ids
    ride with the rounds so that the task never holds more than a round's: all of a run's ids (at
    40 bytes each, 200 MB for 5M documents) would be the task's largest object."""
    forget()  # a process that tokenized (Ray reuses them) drops its tokenizers first
    with transient(patterns):
        parts = len(part_first_key)
        pending: list[list[pa.Table]] = [[] for _ in range(parts)]
        ids: list[list[pa.Array]] = [[] for _ in range(id_parts)]
        done, yielded, items, tokens = 0.0, 0, 0, 0

        def on_docs(doc_ids: pa.Array) -> None:
            _add_ids(ids, doc_ids)

        for table in assign_items(shards, cfg, plan, rank_base, on_docs, selection, in_place):
            keys = table.column("file_key").to_numpy()
            part = np.searchsorted(part_first_key, keys, side="right") - 1
            if np.any(part[1:] < part[:-1]):  # else (one partition, say) the take would copy for nothing
                order = np.argsort(part, kind="stable")
                table, part = table.take(pa.array(order)), part[order]
            cuts = np.searchsorted(part, np.arange(parts + 1))
            for p in range(parts):
                if cuts[p + 1] > cuts[p]:
                    pending[p].append(table.slice(int(cuts[p]), int(cuts[p + 1] - cuts[p])))
            n_tokens = int(table.column("length").to_numpy().sum(dtype=np.int64))
            items, tokens = items + table.num_rows, tokens + n_tokens
            done += n_tokens * 4 + table.num_rows * ITEM_BYTES
            while yielded < rounds - 1 and done >= round_ends[yielded]:
                yield from (_sorted(p) for p in pending)
                yield from (_ids_table(i) for i in ids)
                pending, ids = [[] for _ in range(parts)], [[] for _ in range(id_parts)]
                yielded += 1
        while yielded < max(rounds, 1 if id_parts else 0):
            if yielded < rounds:
                yield from (_sorted(p) for p in pending)
            yield from (_ids_table(i) for i in ids)
            pending, ids = [[] for _ in range(parts)], [[] for _ in range(id_parts)]
            yielded += 1
        yield {"items": items, "tokens": tokens}


def merge_pieces(
    writer_first_key: np.ndarray, patterns: tuple[str, ...] | None, *pieces: pa.Table
) -> Iterator[pa.Table]:
    """Task (second hop; a generator): pieces of one partition, each sorted by file_key → one
    piece per writer of the partition, made and yielded one at a time from slices of the inputs
    (which stay in the object store): the heap holds one output piece, so a merge can take many."""
    with transient(patterns):
        pieces = tuple(p for p in pieces if p.num_rows)
        bounds = np.append(np.asarray(writer_first_key[1:], dtype=np.int64), np.iinfo(np.int64).max)
        cuts = [np.asarray(np.searchsorted(p.column("file_key").to_numpy(), bounds)) for p in pieces]
        start = [0] * len(pieces)
        for w in range(len(writer_first_key)):
            parts = [p.slice(a, int(c[w]) - a) for p, a, c in zip(pieces, start, cuts, strict=True)]
            start = [int(c[w]) for c in cuts]
            yield _sorted([p for p in parts if p.num_rows])


def write_files(
    keys: np.ndarray,
    output: str,
    spec: Spec,
    bucketed: bool,
    storage: Any,
    patterns: tuple[str, ...] | None,
    token_files: dict[int, str] | None,
    threads: int,
    *pieces: pa.Table,
) -> pa.Table:
    """Task: the files of `keys` (ascending), one at a time, from pieces sorted by file_key (read
    in place from the object store: the heap holds one file). One WRITTEN row a file.
    `token_files`: each unit's token file, where items name their tokens there (a runner whose
    tasks map local files): those it needs are mapped for the task's duration. `threads`: how many
    a file's blocks are encoded on (encode_threads; at most this machine's cores)."""
    forget()
    with transient(patterns):
        pieces = tuple(p for p in pieces if p.num_rows)
        mapped = None
        if token_files is not None:
            from raypack.pipeline.tokenize.token_files import MappedTokens

            used = np.unique(np.concatenate([p.column("source").to_numpy() for p in pieces] or [[-1]]))
            mapped = MappedTokens({u: token_files[u] for u in used.tolist() if u >= 0})
        try:
            return _write_files(keys, output, spec, bucketed, storage, mapped, pieces, threads)
        finally:
            if mapped is not None:
                mapped.close()


def _write_files(
    keys: np.ndarray,
    output: str,
    spec: Spec,
    bucketed: bool,
    storage: Any,
    mapped: Any,
    pieces: tuple[pa.Table, ...],
    threads: int,
) -> pa.Table:
    starts = [np.searchsorted(p.column("file_key").to_numpy(), keys, side="left") for p in pieces]
    ends = [np.searchsorted(p.column("file_key").to_numpy(), keys, side="right") for p in pieces]
    rows = sum(p.num_rows for p in pieces)
    taken = 0
    written = []
    for i, key in enumerate(keys.tolist()):
        parts = [
            p.slice(int(s[i]), int(e[i] - s[i]))
            for p, s, e in zip(pieces, starts, ends, strict=True)
            if e[i] > s[i]
        ]
        if not parts:
            raise RuntimeError(f"no items reached file key {key}: the exchange is inconsistent")
        items = pa.concat_tables(parts)
        taken += items.num_rows
        written.append(
            write_pack_file(items, output, spec, bucketed, storage=storage, mapped=mapped, threads=threads)
        )
    if taken != rows:
        raise RuntimeError(
            f"{rows - taken} items reached a writer of other files: the exchange is inconsistent"
        )
    return pa.concat_tables(written) if written else schema.WRITTEN.empty_table()


def count_ids(examples: int, *pieces: pa.Table) -> dict[str, Any]:
    """Task: ids of one hash part that more than one document carries, and the first `examples`
    of them in id order."""
    ids = pa.concat_tables([p for p in pieces if p.num_rows] or [_ids_table([])])
    counts = ids.group_by("doc_id").aggregate([("doc_id", "count")])
    shared = counts.filter(pc.greater(counts.column("doc_id_count"), 1))
    first = shared.sort_by("doc_id").slice(0, examples)
    return {
        "ids": shared.num_rows,
        "documents": int(pc.sum(shared.column("doc_id_count")).as_py() or 0),
        "examples": first.column("doc_id").to_pylist(),
    }


@dataclass(frozen=True)
class Exchanged:
    written: list[dict[str, Any]]
    """WRITTEN rows of every file."""
    items: int
    tokens: int
    """Items and tokens the assign tasks placed."""
    duplicate_ids: int = 0
    duplicate_documents: int = 0
    examples: tuple[str, ...] = ()


def shared_ids(found: list[dict[str, Any]], examples: int) -> dict[str, Any]:
    return {
        "duplicate_ids": sum(int(f["ids"]) for f in found),
        "duplicate_documents": sum(int(f["documents"]) for f in found),
        "examples": tuple(sorted(e for f in found for e in f["examples"])[:examples]),
    }


def return_kinds(lay: Layout, run: int) -> list[tuple[str, int]]:
    """What each value assign_run yields for `run` is, in order: ("part", p) a piece of partition p,
    ("ids", q) a piece of id part q, then ("counts", 0)."""
    rounds = int(lay.rounds[run])
    kinds: list[tuple[str, int]] = []
    for r in range(max(rounds, lay.id_rounds(run))):
        if r < rounds:
            kinds += [("part", p) for p in range(lay.partitions)]
        if r < lay.id_rounds(run):
            kinds += [("ids", q) for q in range(lay.id_parts)]
    return [*kinds, ("counts", 0)]


def run_exchange(
    runner: Runner,
    cfg: JobConfig,
    plan: Plan,
    lay: Layout,
    totals: Totals,
    shards: list[WorkUnit],
    file_keys: np.ndarray,
    spec: Spec,
    examples: int,
    selection: Selection | None = None,
    progress: Progress | None = None,
) -> Exchanged:
    """Submit every task of the exchange (the runner runs each once its input blobs exist), then wait
    for the writers (`progress` advanced by each one's files as it finishes). The driver drops its
    handles of the pieces as soon as their consumers are submitted, so Ray frees each piece once its
    consumer is done (a local run deletes its piece files at the end)."""
    # Where every task maps the token files (a local run, local files), items name their tokens
    # there and the writers copy each token once, from the page cache to its pack: elsewhere the
    # assign tasks copy every token into its item (fresh memory), then into a blob file, which the
    # writer reads back (assign+write of a 500 MB job: docs/benchmarks.md).
    in_place = runner.shares_disk and all(not is_uri(u.token_file) for u in shards)
    to_part, to_ids, counts = _assign_tasks(
        runner, cfg, plan, lay, totals, shards, file_keys, selection, in_place
    )
    to_writer = _merge_tasks(runner, lay, file_keys, to_part) if lay.merge_width else to_part
    del to_part
    token_files = {u.index: u.token_file for u in shards} if in_place else None
    writes = _write_tasks(runner, cfg, lay, file_keys, spec, token_files, to_writer)
    del to_writer
    id_tasks = [runner.submit(count_ids, (examples, *blobs)) for blobs in to_ids]
    del to_ids
    written, pending = [], list(writes)
    while pending:
        done, table = runner.first_done(pending)
        pending.remove(done)
        written += table.to_pylist()
        if progress is not None:
            progress.advance(writes[done], int(pc.sum(table.column("tokens")).as_py() or 0) * 4)
    moved = [runner.get(c) for c in counts]
    found = [runner.first_done([t])[1] for t in id_tasks]
    runner.discard_blobs()
    return Exchanged(
        written,
        sum(int(c["items"]) for c in moved),
        sum(int(c["tokens"]) for c in moved),
        **shared_ids(found, examples),
    )


def _assign_tasks(
    runner: Runner,
    cfg: JobConfig,
    plan: Plan,
    lay: Layout,
    totals: Totals,
    shards: list[WorkUnit],
    file_keys: np.ndarray,
    selection: Selection | None,
    in_place: bool,
) -> tuple[list[list[Any]], list[list[Any]], list[Any]]:
    """An assign task a run of shards (assign_run), submitted: the blobs it yields for each
    partition, for each id part, and its counts."""
    plan_blob = runner.put(plan)
    part_first_key = file_keys[lay.writer_first[lay.part_first[:-1]]]
    to_part: list[list[Any]] = [[] for _ in range(lay.partitions)]
    to_ids: list[list[Any]] = [[] for _ in range(lay.id_parts)]
    counts = []
    for run, base in totals.rank_bases():
        rounds = int(lay.rounds[run])
        if rounds == 0 and not lay.id_parts:
            continue
        members = [shards[s] for s in np.flatnonzero(lay.run_of_shard == run).tolist()]
        kinds = return_kinds(lay, run)
        args = (
            cfg,
            plan_blob,
            base,
            members,
            rounds,
            lay.round_ends[run],
            part_first_key,
            lay.id_parts,
            runner.patterns,
            selection,
            in_place,
        )
        for (kind, index), blob in zip(kinds, runner.spread(assign_run, args, len(kinds)), strict=True):
            if kind == "part":
                to_part[index].append(blob)
            elif kind == "ids":
                to_ids[index].append(blob)
            else:
                counts.append(blob)
    return to_part, to_ids, counts


def _merge_tasks(
    runner: Runner, lay: Layout, file_keys: np.ndarray, to_part: list[list[Any]]
) -> list[list[Any]]:
    """The second hop (lay.merge_width): each partition's pieces merged, merge_width at a time, into
    a piece for each of its writers; the blobs each writer reads."""
    writer_first_key = file_keys[lay.writer_first[:-1]]
    to_writer: list[list[Any]] = [[] for _ in range(lay.writers)]
    for p in range(lay.partitions):
        first, last = int(lay.part_first[p]), int(lay.part_first[p + 1])
        for j in range(0, len(to_part[p]), lay.merge_width):
            batch = to_part[p][j : j + lay.merge_width]
            out = runner.spread(
                merge_pieces, (writer_first_key[first:last], runner.patterns, *batch), last - first
            )
            for w, blob in zip(range(first, last), out, strict=True):
                to_writer[w].append(blob)
    return to_writer


def _write_tasks(
    runner: Runner,
    cfg: JobConfig,
    lay: Layout,
    file_keys: np.ndarray,
    spec: Spec,
    token_files: dict[int, str] | None,
    to_writer: list[list[Any]],
) -> dict[Any, int]:
    """A write task a range of output files (write_files), submitted: each task's handle, with the
    number of files it writes."""
    bucketed = cfg.pack.bucketed
    threads = encode_threads(runner.width, lay.writers)
    writes = {}
    for w in range(lay.writers):
        keys = file_keys[lay.writer_first[w] : lay.writer_first[w + 1]]
        task = (keys, cfg.output.path, spec, bucketed, cfg.storage, runner.patterns, token_files, threads)
        writes[runner.submit(write_files, (*task, *to_writer[w]))] = int(
            lay.writer_first[w + 1] - lay.writer_first[w]
        )
    return writes


def encode_threads(width: int, writers: int) -> int:
    """Threads a write task encodes a file's blocks on: its share of the runner's `width` CPUs, so
    that a job of fewer files than CPUs (130 MB at seq_len 8192 is one file) encodes on all of them.
    Not more: with a writer on every core already, a second thread each (so that a larger file's
    writer would take up the core a smaller one's leaves) makes every row group's encoding ~20%
    slower (0.37 against 0.30 CPU-s for 1,024 packs of 8,192 tokens: four encoders' buffers in two
    cores' caches) and the 500 MB job's assign+write no shorter. The memory this costs: a block in
    flight a thread (33 MB at 8,192 tokens), and its encoded bytes."""
    return max(1, -(-width // max(1, writers)))


def index_ids(
    output: str, storage: Any, shards: list[int], parts: int, patterns: tuple[str, ...] | None
) -> Iterator[pa.Table]:
    """Task (sharded mode, whose groups write without an exchange; a generator): the ids of a run of
    shards' index files (one a document, not a copy), hashed into `parts` pieces."""
    with transient(patterns):
        ids: list[list[pa.Array]] = [[] for _ in range(parts)]
        for shard in shards:
            fs, inner = resolve(index_path(output, shard), storage)
            with fs.open_input_file(inner) as f:
                table = pq.read_table(f, columns=["doc_id", "copy"])
            # A mixture's copies of a document carry its id: count each document once.
            table = table.filter(pc.less_equal(table.column("copy"), 0))
            _add_ids(ids, table.column("doc_id").combine_chunks())
        yield from (_ids_table(i) for i in ids)


def check_index_ids(runner: Runner, cfg: JobConfig, run_of_shard: np.ndarray, examples: int) -> Exchanged:
    """Ids carried by more than one document, from the index files: runs × parts pieces, parts <= W."""
    runs = int(run_of_shard.max()) + 1 if len(run_of_shard) else 0
    parts = max(1, min(runner.width, runs))
    to_part: list[list[Any]] = [[] for _ in range(parts)]
    for run in range(runs):
        members = np.flatnonzero(run_of_shard == run).tolist()
        if not members:
            continue
        pieces = runner.spread(
            index_ids, (cfg.output.path, cfg.storage, members, parts, runner.patterns), parts
        )
        for p, blob in enumerate(pieces):
            to_part[p].append(blob)
    found = runner.map(count_ids, [(examples, *blobs) for blobs in to_part])
    runner.discard_blobs()
    return Exchanged([], 0, 0, **shared_ids(found, examples))
