"""The input files cut into the work units the tokenize stage reads (one task a unit): a large file
in units of about input.unit_bytes (Parquet by row groups, uncompressed JSONL by byte ranges that
begin at line starts), and runs of small whole files joined into one unit. Deterministic: the same
listing gives the same units on every machine, so a unit's number names its token, index and
rejects files.

We read shards ourselves (through pyarrow filesystems, compression detected from the suffix) rather
than with Ray Data's read_json: a bad line must become a recorded reject, not fail the whole file;
generated ids need the line number; and reading inside the tokenize task streams a shard in batches,
so no shard is ever held whole in memory.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
from collections.abc import Callable

from raypack.config import StorageConfig
from raypack.corpus.readers.parquet import row_group_runs
from raypack.corpus.units import WorkUnit
from raypack.errors import ConfigError
from raypack.storage import Shard, resolve

__all__ = [
    "COMPRESSED_SUFFIXES",
    "MAX_RUN_FILES",
    "MAX_SPLIT_UNITS",
    "group_runs",
    "run_end",
    "sample_units",
    "scan_range",
    "unit_starts",
    "work_units",
]


def work_units(
    files: list[WorkUnit],
    unit_bytes: int,
    storage: StorageConfig | None = None,
    scan: Callable[[list[tuple[Shard, int, int]]], list[tuple[int, int]]] | None = None,
    group_bytes: int = 0,
) -> list[WorkUnit]:
    """The tokenize stage's work units, numbered in order: every file whole, but a file larger than
    input.unit_bytes in units of about that many bytes: a Parquet file as runs of consecutive row
    groups, from its footer (one ranged read a file); an uncompressed JSONL file as byte ranges that
    begin at line starts. Ids are `path:line`, so a JSONL unit must know how many lines come before
    it: `scan` maps scan_range over (file, start, stop) ranges that tile each such file (default:
    one after another, here; the job runs them as Ray tasks), reading those files once more, at the
    speed of storage (GB/s locally; tokenizing runs at ~1 MB/s a core). The same inputs give the same
    units on every machine, so the units' indices name the index and rejects files. A footer that
    cannot be read leaves the file whole: its reader records the reject. Whole files smaller than
    `group_bytes` (input.group_bytes) are then joined into runs (group_runs)."""
    _check_unit_count(files, unit_bytes)
    nominal = {f.index: _nominal(f.shard.size, unit_bytes) for f in files if _splits_by_bytes(f, unit_bytes)}
    ranges = [(f.shard, a, b) for f in files for a, b in nominal.get(f.index, [])]
    if scan is None:
        scanned = [scan_range(s, a, b, storage) for s, a, b in ranges]
    else:
        scanned = scan(ranges) if ranges else []
    found: dict[int, list[tuple[int, int]]] = {}
    for (s, _, _), result in zip(ranges, scanned, strict=True):
        found.setdefault(s.index, []).append(result)
    units: list[WorkUnit] = []
    for f in files:
        pieces = [(0, -1, 0)]
        if f.reading.format == "parquet" and f.shard.size > unit_bytes:
            pieces = row_group_runs(f.shard, unit_bytes, storage) or pieces
        elif f.index in nominal:
            pieces = _line_ranges(f.shard.size, nominal[f.index], found[f.index]) or pieces
        for start, stop, first_row in pieces:
            shard = dataclasses.replace(
                f.shard, index=len(units), unit_start=start, unit_stop=stop, first_row=first_row
            )
            units.append(dataclasses.replace(f, shard=shard))
    return group_runs(units, group_bytes)


# Files a run of small files holds at most: each is an open (a GET on S3) of its own, and a run of
# a million empty files would be one task of a million requests.
MAX_RUN_FILES = 1024


def group_runs(units: list[WorkUnit], group_bytes: int) -> list[WorkUnit]:
    """The units renumbered, consecutive whole files smaller than `group_bytes` of one source joined
    into runs of up to `group_bytes` bytes (on storage) and MAX_RUN_FILES files, a run one unit:
    a unit's fixed costs (a task, a token file, an index file; ~7 ms on the local runner, more on
    Ray) are then paid per run. Files keep their order, so documents do.

    Where a run ends is decided by its files, not by the bytes before them: a run also ends after
    a file whose path hashes below 2 × its size / group_bytes (run_end), so runs average about half
    of group_bytes, and adding, removing or resizing one file changes only the runs from the one
    that holds the file before it to the next later file that ends a run by its hash; the runs
    before and after are the same. (Runs cut by bytes from the corpus's start would all move, and
    be tokenized again, when one early file is removed.) Deterministic: the same listing gives the
    same runs on every machine (the units' numbers name their files)."""
    out: list[WorkUnit] = []
    run: list[WorkUnit] = []
    run_bytes = 0

    def close() -> None:
        nonlocal run_bytes
        if run:
            first = dataclasses.replace(run[0].shard, index=len(out))
            more = tuple(dataclasses.replace(u.shard, index=len(out)) for u in run[1:])
            out.append(dataclasses.replace(run[0], shard=first, more=more))
            run.clear()
        run_bytes = 0

    for u in units:
        small = not u.shard.split and u.shard.size < group_bytes
        if not small or (run and (run[0].source != u.source or run_bytes + u.shard.size > group_bytes)):
            close()
        if not small:
            out.append(dataclasses.replace(u, shard=dataclasses.replace(u.shard, index=len(out))))
            continue
        if len(run) == MAX_RUN_FILES:
            close()
        run.append(u)
        run_bytes += u.shard.size
        if run_end(u.shard, group_bytes):
            close()
    close()
    return out


def run_end(shard: Shard, group_bytes: int) -> bool:
    """Whether a run of small files ends after this one: its path's hash (source and relpath) below
    2 × size / group_bytes of the hash range, a property of the file alone (group_runs)."""
    digest = hashlib.blake2b(f"{shard.source}\0{shard.relpath}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") < (2 * shard.size << 64) // group_bytes


# Work units that splitting files may make in all (files kept whole are not counted: a corpus of many
# files is fine). Each is a task, a token file, an index file: input.unit_bytes=256 cut a 1 GB file
# into ~4M of them.
MAX_SPLIT_UNITS = 100_000


def _check_unit_count(files: list[WorkUnit], unit_bytes: int) -> None:
    """ConfigError, before any work, when input.unit_bytes would cut the uncompressed JSONL files into
    more than MAX_SPLIT_UNITS byte ranges. (A Parquet file makes at most one unit a row group, which
    its writer bounded.)"""
    splits = [f.shard.size for f in files if _splits_by_bytes(f, unit_bytes)]
    units = sum(-(-size // unit_bytes) for size in splits)
    if units > MAX_SPLIT_UNITS:
        least = -(-sum(splits) // MAX_SPLIT_UNITS)
        raise ConfigError(
            f"input.unit_bytes={unit_bytes:,} would cut {len(splits):,} files into {units:,} work "
            f"units (a task and files each), over {MAX_SPLIT_UNITS:,}: set input.unit_bytes >= {least:,} "
            f"(the default is {256 << 20:,})"
        )


# What pyarrow's compression="detect" decompresses (by suffix): a compressed stream can only be read
# from its start, so it stays one unit whatever its size.
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".lz4", ".zst")
_SCAN_CHUNK = 8 << 20  # one ranged read (a GET on S3) in scan_range; 8 MiB keeps a GET's latency small


def _splits_by_bytes(f: WorkUnit, unit_bytes: int) -> bool:
    compressed = f.shard.path.endswith(COMPRESSED_SUFFIXES)
    return f.reading.format == "jsonl" and f.shard.size > unit_bytes and not compressed


def _nominal(size: int, unit_bytes: int) -> list[tuple[int, int]]:
    """Equal byte ranges that tile [0, size), none over unit_bytes."""
    count = -(-size // unit_bytes)
    cuts = [k * size // count for k in range(count + 1)]
    return list(itertools.pairwise(cuts))


def scan_range(
    shard: Shard, start: int, stop: int, storage: StorageConfig | None = None, chunk: int = _SCAN_CHUNK
) -> tuple[int, int]:
    """(newlines in bytes [start, stop), the first line start at or after `start`) of a file: a line
    starts at 0 and after every newline; the file's size if none does. Reads [start - 1, stop), and
    past stop only while no line has started (a line longer than the range), `chunk` bytes a read."""
    fs, inner = resolve(shard.path, storage)
    with fs.open_input_file(inner) as f:
        line_start = 0 if start == 0 else None
        if start > 0:
            f.seek(start - 1)
            if f.read(1) == b"\n":
                line_start = start
        newlines, pos = 0, start
        while data := f.read(chunk if pos >= stop else min(chunk, stop - pos)):
            inside = data if pos + len(data) <= stop else data[: max(0, stop - pos)]
            newlines += inside.count(b"\n")
            if line_start is None and (q := data.find(b"\n")) >= 0:
                line_start = pos + q + 1
            pos += len(data)
            if pos >= stop and line_start is not None:
                break
    return newlines, pos if line_start is None else line_start


# What unit_starts reads at a time to find where a line starts: a unit begins at the first line
# start after its nominal byte, which a line of a few KB puts within one read.
_LINE_CHUNK = 64 << 10


def unit_starts(
    f: WorkUnit, offsets: list[int], unit_bytes: int, storage: StorageConfig | None = None
) -> list[tuple[int, int | None]]:
    """Where the work unit holding each byte offset of file `f` begins, as work_units cuts the
    file, without reading it up to there: (its first byte (JSONL) or row group (Parquet), the file's
    rows before it). A JSONL unit's lines before it are None (work_units counts them by reading
    every byte before it), but for the first; (0, 0) in a file kept whole. A Parquet file's unit is
    found by its share of the file's bytes (its runs of row groups hold about unit_bytes each)."""
    if f.reading.format == "parquet" and f.shard.size > unit_bytes:
        runs = row_group_runs(f.shard, unit_bytes, storage)
        if not runs:
            return [(0, 0)] * len(offsets)
        picked = [runs[min(len(runs) - 1, o * len(runs) // f.shard.size)] for o in offsets]
        return [(start, first_row) for start, _, first_row in picked]
    if not _splits_by_bytes(f, unit_bytes):
        return [(0, 0)] * len(offsets)
    nominal = [a for a, _ in _nominal(f.shard.size, unit_bytes)]
    found: dict[int, tuple[int, int | None]] = {0: (0, 0)}
    starts = []
    for o in offsets:
        a = nominal[bisect.bisect_right(nominal, o) - 1]
        if a not in found:
            found[a] = (scan_range(f.shard, a, a + 1, storage, _LINE_CHUNK)[1], None)
        starts.append(found[a])
    return starts


def _line_ranges(
    size: int, nominal: list[tuple[int, int]], scanned: list[tuple[int, int]]
) -> list[tuple[int, int, int]]:
    """(first byte, end byte, lines before) of each unit of a JSONL file from its scanned nominal
    ranges: unit k runs from the first line start at or after nominal start a_k to the next unit's
    start. The lines before it are the newlines before a_k, plus one when the unit starts later (the
    newline that ends the line running through a_k). [] when that leaves a single unit."""
    units, before = [], 0
    starts = [line_start for _, line_start in scanned] + [size]
    for k, ((a, _), (newlines, _)) in enumerate(zip(nominal, scanned, strict=True)):
        if starts[k] < starts[k + 1]:
            units.append((starts[k], starts[k + 1], before + (starts[k] > a)))
        before += newlines
    return units if len(units) > 1 else []


def sample_units(units: list[WorkUnit], limit_bytes: int, seed: int) -> list[WorkUnit]:
    """A trial's units (input.limit_bytes): of each source, its share of `limit_bytes` (by its
    bytes; at least one unit, so a mixture keeps every source), whole units taken in an order seeded
    by `seed` (a hash of each unit's place, so the same listing gives the same sample anywhere)
    until their bytes reach that share; kept in the job's order and numbered again from 0."""

    def rank(u: WorkUnit) -> bytes:
        place = f"{seed}\0{u.relpath}\0{u.shard.unit_start}\0{len(u.more)}"
        return hashlib.sha256(place.encode()).digest()

    by_source: dict[str, list[WorkUnit]] = {}
    for u in units:
        by_source.setdefault(u.source, []).append(u)
    whole = sum(u.size for u in units) or 1
    taken: set[int] = set()
    for of_source in by_source.values():
        share = limit_bytes * sum(u.size for u in of_source) / whole
        total = 0
        for u in sorted(of_source, key=rank):
            if total >= share and total:
                break
            taken.add(u.index)
            total += u.size
    kept = [u for u in units if u.index in taken]
    return [
        dataclasses.replace(
            u,
            shard=dataclasses.replace(u.shard, index=i),
            more=tuple(dataclasses.replace(m, index=i) for m in u.more),
        )
        for i, u in enumerate(kept)
    ]
