"""The work unit: what one tokenize task is given, and what the assign, select and sharded tasks read
back. One typed record, made on the driver (raypack.pipeline.read lists the files and cuts them into
units) and handed to every task as it is: nothing downstream looks a source's settings up again or
rebuilds a unit field by field, so a setting that reaches the driver reaches every task.

    input file ─read.input_files─▶ WorkUnit(file, its source's Reading)
               ─read.work_units─▶ a WorkUnit a unit (a large file: several, each a byte range or
                                  a run of row groups) ─with_token_file─▶ its token file named
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
    """Its token file's cache key (raypack.pipeline.token_files.token_key); "" until the backend is
    chosen."""
    token_dir: str = ""
    """Where its token file is: the staging area, or a rebuild's cache."""

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


def token_file(token_dir: str, key: str) -> str:
    return join(token_dir, f"{key}.arrow")


def unit_entry(shard: Shard, fmt: str, rows: bool = True) -> dict[str, Any]:
    """What names a work unit within its file, for the manifest (with its first row: verify rebuilds
    the units from it) and the token cache key (without: the range fixes it); {} for a whole file."""
    if not shard.split:
        return {}
    kind = "row_groups" if fmt == "parquet" else "bytes"
    entry: dict[str, Any] = {kind: [shard.unit_start, shard.unit_stop]}
    return entry | ({"first_row": shard.first_row} if rows else {})


def unit_from_entry(file: WorkUnit, index: int, entry: dict[str, Any]) -> WorkUnit:
    """The work unit numbered `index` of `file`, from its manifest entry (unit_entry's inverse)."""
    start, stop = entry.get("row_groups") or entry.get("bytes") or (0, -1)
    shard = dataclasses.replace(
        file.shard, index=index, unit_start=start, unit_stop=stop, first_row=entry.get("first_row", 0)
    )
    return dataclasses.replace(file, shard=shard)
