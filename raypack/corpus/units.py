"""The work unit: what one tokenize task is given, and what the assign, select and sharded tasks read
back. One typed record, made on the driver (raypack.pipeline.read lists the files and cuts them into
units) and handed to every task as it is: nothing downstream looks a source's settings up again or
rebuilds a unit field by field, so a setting that reaches the driver reaches every task.

    input file ─files.input_files─▶ WorkUnit(file, its source's Reading)
               ─cut.work_units─▶ a WorkUnit a unit (a large file: several, each a byte range or
                                  a run of row groups; small files: a run of them, one unit)
                                  ─with_token_file─▶ its token file named

A unit's documents keep their own file's path and row (ids, rejects, mixture keys): a run of small
files numbers its files 0, 1, ... (`files`), and every document carries its file's number beside its
row (schema.TOKENIZED and DOCUMENTS `file`), 0 in a unit of one file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from raypack.config import Reading
from raypack.storage import Shard, join

__all__ = ["WorkUnit", "token_file", "unit_entry", "unit_from_entry"]


@dataclass(frozen=True, slots=True)
class WorkUnit:
    shard: Shard
    """The file, or the unit of one (Shard.unit_start/unit_stop), numbered in the job's order."""
    reading: Reading
    """How it is read: its source's format and fields (config.InputConfig.reading)."""
    key: str = ""
    """Its token file's cache key (raypack.pipeline.tokenize.token_files.token_key); "" until the backend is
    chosen."""
    token_dir: str = ""
    """Where its token file is: the staging area, or a rebuild's cache."""
    more: tuple[Shard, ...] = ()
    """A run of small whole files (cut.work_units, input.group_bytes): the files after `shard`, in
    order, all of the same source."""
    blocks: tuple[tuple[Any, int, int], ...] = ()
    """A Ray Dataset's unit (raypack.corpus.datasets): (block reference, first row, end row) of
    each block slice holding its rows [shard.unit_start, shard.unit_stop), in order; dropped once
    the tokenize stage is over."""

    @property
    def files(self) -> tuple[Shard, ...]:
        """The unit's files, numbered as its documents' `file` column numbers them."""
        return (self.shard, *self.more)

    @property
    def relpaths(self) -> list[str]:
        return [s.relpath for s in self.files]

    @property
    def size(self) -> int:
        """Bytes of input it reads: its range of a split file, or its files'."""
        if self.reading.format == "dataset":  # its rows' bytes, estimated from its blocks'
            return self.shard.size
        if self.shard.split and self.reading.format == "jsonl":
            return self.shard.unit_stop - self.shard.unit_start
        return sum(s.size for s in self.files)

    @property
    def label(self) -> str:
        """The unit in a message: its file, with how many more a run holds."""
        more = f" and {len(self.more):,} more file{'s' if len(self.more) > 1 else ''}" if self.more else ""
        return f"{self.relpath}{more}"

    @property
    def index(self) -> int:
        return self.shard.index

    @property
    def relpath(self) -> str:
        return self.shard.relpath

    @property
    def source(self) -> str:
        return self.shard.source

    @property
    def token_file(self) -> str:
        if not self.key or not self.token_dir:
            raise ValueError(f"work unit {self.index} ({self.relpath}) has no token file yet")
        return token_file(self.token_dir, self.key)

    def with_token_file(self, token_dir: str, key: str) -> WorkUnit:
        return dataclasses.replace(self, token_dir=token_dir, key=key)

    def entry(self, rows: bool = True) -> dict[str, Any]:
        """unit_entry of this unit (its range within its file, {} for a whole file)."""
        return unit_entry(self.shard, self.reading.format, rows)

    def manifest_entry(self) -> dict[str, Any]:
        """The unit in the manifest's `inputs`: its file (path, size, mtime_ns) with its range, a
        run's files under `files`, or a Ray Dataset's name with its rows; its source."""
        if self.reading.format == "dataset":
            files: dict[str, Any] = {"dataset": self.relpath} | self.entry()
        elif self.more:
            files = {"files": [_file_entry(s) for s in self.files]}
        else:
            files = _file_entry(self.shard) | self.entry()
        return files | ({"source": self.source} if self.source else {})


def token_file(token_dir: str, key: str) -> str:
    return join(token_dir, f"{key}.arrow")


def unit_entry(shard: Shard, fmt: str, rows: bool = True) -> dict[str, Any]:
    """What names a work unit within its file, for the manifest (with its first row: verify rebuilds
    the units from it) and the token cache key (without: the range fixes it); {} for a whole file."""
    if not shard.split:
        return {}
    kind = {"parquet": "row_groups", "dataset": "rows"}.get(fmt, "bytes")
    entry: dict[str, Any] = {kind: [shard.unit_start, shard.unit_stop]}
    return entry | ({"first_row": shard.first_row} if rows else {})


def _file_entry(shard: Shard) -> dict[str, Any]:
    return {"path": shard.relpath, "size": shard.size, "mtime_ns": shard.mtime_ns}


def unit_from_entry(files: list[WorkUnit], index: int, entry: dict[str, Any]) -> WorkUnit:
    """The work unit numbered `index`, from its manifest entry (manifest_entry's inverse) and the
    entry's files as they are listed now (whole-file units, in the entry's order)."""
    first = files[0]
    start, stop = entry.get("row_groups") or entry.get("bytes") or (0, -1)
    shard = dataclasses.replace(
        first.shard, index=index, unit_start=start, unit_stop=stop, first_row=entry.get("first_row", 0)
    )
    more = tuple(dataclasses.replace(f.shard, index=index) for f in files[1:])
    return dataclasses.replace(first, shard=shard, more=more)
