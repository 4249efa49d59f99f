"""The token store (config `cache.path`, or a rebuild's `_cache/tokens/`): token files that outlive
the job that wrote them, keyed by what decides their bytes, so that any later job finds them.

A key (raypack.pipeline.tokenize.token_files.token_key) is made of the unit's file content, not of where the
file lies or when it was written: a corpus copied to another directory or bucket hits, a file
rewritten with other bytes misses. The content is:
- a local file's SHA-256 (hashlib, ~1 GB/s a core with the CPU's SHA instructions: 127 MB of gzipped
  shards in 0.12 s on one core here, against ~6 s to tokenize the 500 MB of text they hold);
- an object's ETag with its size (a HEAD request; the bytes are not read). Object stores give a
  single-part upload the MD5 of its bytes, so a copy keeps it; a multipart upload's ETag names its
  parts, so the same bytes uploaded in other parts miss (a new entry, never a wrong one). An object
  without an ETag is hashed as a local file is.

Digests are computed before the units are keyed (raypack.pipeline.tokenize.digests): S files cost
S reads (or HEADs) spread over the cluster, and the driver holds one digest string a file.

Several jobs may fill one store at once: an entry appears whole or not at all (a local token file
is written to a `.tmp-*` sibling and renamed; an object is written in place, and an upload becomes
visible only when it completes), and two jobs that tokenize the same unit write the same bytes.
Jobs never delete entries; `raypack cache prune` does, by age or size (prune below).
"""

from __future__ import annotations

import hashlib
import re
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from raypack.config import StorageConfig
from raypack.errors import ConfigError
from raypack.paths import is_uri
from raypack.storage import TMP_PREFIX, Shard, join, list_dir, remove, remove_temporaries, resolve

__all__ = [
    "Pruned",
    "StoreUsage",
    "check_store",
    "file_digest",
    "prune",
    "remove_run_temporaries",
    "size_text",
    "store_line",
    "store_record",
    "units_text",
    "usage",
]

# A temporary file older than this is a killed writer's: no token file takes a day to write.
STALE_TMP_S = 24 * 3600


def file_digest(shard: Shard, storage: StorageConfig | None) -> str:
    """What a file's content is known by (see the module's docstring)."""
    fs, inner = resolve(shard.path, storage)
    if is_uri(shard.path):
        with fs.open_input_stream(inner, compression=None) as f:
            etag = (f.metadata() or {}).get("ETag")
        if etag:
            tag = etag.decode() if isinstance(etag, bytes) else str(etag)
            return f"etag:{tag.strip(chr(34))}:{shard.size}"
    digest = hashlib.sha256()
    with fs.open_input_stream(inner, compression=None) as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


@dataclass(frozen=True)
class StoreUsage:
    entries: int
    """Token files (a unit each)."""
    bytes: int
    """Every file of the store: token files, their rejects, temporaries."""
    others: int = 0
    """Files and folders in its directory that are none of a store's (a store named by mistake
    holds only these)."""
    temporary_bytes: int = 0
    """Of `bytes`, writers' temporaries: a live job's, or a killed one's (prune removes those a day
    old)."""


def _files(path: str, storage: StorageConfig | None) -> list[pafs.FileInfo]:
    return [i for i in list_dir(path, storage) if i.type == pafs.FileType.File]


def usage(path: str, storage: StorageConfig | None) -> StoreUsage:
    """How big the store is (one listing: ~1,000 entries a request on an object store); its own
    files only."""
    listed = list_dir(path, storage)
    files = [
        i
        for i in listed
        if i.type == pafs.FileType.File and (_key(i.base_name) or _is_temporary(i.base_name))
    ]
    entries = sum(1 for i in files if _is_entry(i.base_name))
    temporary = sum(int(i.size or 0) for i in files if _is_temporary(i.base_name))
    return StoreUsage(entries, sum(int(i.size or 0) for i in files), len(listed) - len(files), temporary)


def store_record(path: str, storage: StorageConfig | None, hits: int) -> dict[str, Any]:
    """The run record's account of a store: `hits` units found there, its size after the run's
    additions."""
    found = usage(path, storage)
    return {"path": path, "hits": hits, "entries": found.entries, "bytes": found.bytes}


# The only names a store holds: a key's token file, rejects file and metadata file (its documents'
# input.metadata_fields), and a writer's temporaries of them (storage.atomic_output). prune and
# usage never look at any other file, so a store named by mistake (a home directory, an input's)
# loses nothing that is not a token file.
_KEY = r"[0-9a-f]{32}"
_ENTRY = re.compile(rf"({_KEY})\.(arrow|rejects\.parquet|metadata\.parquet)")
_TEMPORARY = re.compile(
    rf"{re.escape(TMP_PREFIX)}[0-9a-f]{{32}}-{_KEY}\.(arrow|rejects\.parquet|metadata\.parquet)"
)


def _is_entry(name: str) -> bool:
    found = _ENTRY.fullmatch(name)
    return found is not None and found.group(2) == "arrow"


def _key(name: str) -> str | None:
    """The key a store file belongs to (None: not one of a store's entries)."""
    found = _ENTRY.fullmatch(name)
    return found.group(1) if found else None


def _is_temporary(name: str) -> bool:
    return _TEMPORARY.fullmatch(name) is not None


def remove_run_temporaries(path: str, run: str) -> int:
    """Delete what the job `run` names left half-written in the local token store at `path` (its
    writers' temporaries carry its run id: storage.atomic_output's tag), once none of its workers
    writes: a job stopped by Ctrl-C or an error leaves the units its workers were writing (`.tmp-*`
    files, megabytes each), which a prune would remove only a day later. Other jobs'
    temporaries stay (they may be writing them). On object storage a token file is written in
    place, never under a temporary name: nothing is looked for there. How many were removed."""
    return 0 if is_uri(path) else remove_temporaries(path, tag=run)


def check_store(path: str, storage: StorageConfig | None, must_exist: bool = False) -> None:
    """ConfigError where `path` cannot be a store: a file, or (`must_exist`: the cache command)
    nothing at all."""
    fs, inner = resolve(path, storage)
    kind = fs.get_file_info(inner).type
    if kind == pafs.FileType.File:
        raise ConfigError(f"token store {path} is a file, not a directory")
    if must_exist and kind == pafs.FileType.NotFound:
        raise ConfigError(f"no token store at {path}")


@dataclass(frozen=True)
class Pruned:
    removed_entries: int
    """Units (a token file, with its rejects file)."""
    removed_bytes: int
    removed_leftovers: int
    """A killed writer's files: temporaries, rejects files without their token file."""
    kept: StoreUsage


def prune(
    path: str,
    storage: StorageConfig | None,
    older_than_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
) -> Pruned:
    """Delete entries (a token file and its rejects file together) last used more than
    `older_than_s` ago, then the least recently used until the store holds at most `max_bytes`;
    and the files a killed writer left (older than a day). Only the store's own names are looked
    at (a key's files and their temporaries). An entry's age is its token file's modification
    time: when it was written, or last found by a job on a local disk (which touches it); on
    object storage, when it was written. A job that is reading an entry while it is pruned fails
    (its token file is gone): prune when no job uses the store, or with an age no job runs for."""
    now = time.time() if now is None else now
    files = _files(path, storage)
    temporaries = [i for i in files if _is_temporary(i.base_name) and now - _mtime(i) > STALE_TMP_S]
    entries = _entries(files)
    order, leftovers = _by_age(entries, now)
    doomed = _doomed(entries, order, leftovers, now, older_than_s, max_bytes)
    removed_bytes = _remove(path, storage, [info for key in doomed for info in _token_first(entries[key])])
    removed_bytes += _remove(path, storage, temporaries)
    kept = usage(path, storage)
    return Pruned(len(doomed) - len(leftovers), removed_bytes, len(temporaries) + len(leftovers), kept)


def _entries(files: list[pafs.FileInfo]) -> dict[str, list[pafs.FileInfo]]:
    """The store's files by the key they belong to (its token file, its rejects file, their
    temporaries); files of no key left out."""
    entries: dict[str, list[pafs.FileInfo]] = {}
    for info in files:
        key = _key(info.base_name)
        if key is not None:
            entries.setdefault(key, []).append(info)
    return entries


def _by_age(entries: dict[str, list[pafs.FileInfo]], now: float) -> tuple[list[tuple[float, str]], set[str]]:
    """(last use, key) of every entry with a token file, oldest first; and the keys a killed writer
    left: files without a token file, all older than a day."""
    # A rejects file without its token file is a killed writer's once it is a day old (a live
    # writer writes its rejects just before its token file).
    order: list[tuple[float, str]] = []
    leftovers: set[str] = set()
    for key, infos in entries.items():
        token = [i for i in infos if _is_entry(i.base_name)]
        if token:
            order.append((_mtime(token[0]), key))
        elif all(now - _mtime(i) > STALE_TMP_S for i in infos):
            leftovers.add(key)
    order.sort()
    return order, leftovers


def _doomed(
    entries: dict[str, list[pafs.FileInfo]],
    order: list[tuple[float, str]],
    leftovers: set[str],
    now: float,
    older_than_s: float | None,
    max_bytes: int | None,
) -> list[str]:
    """The keys to delete, in order: the leftovers, then, oldest first, the entries last used more
    than `older_than_s` ago and those the store must lose to hold at most `max_bytes`."""
    total = sum(int(i.size or 0) for infos in entries.values() for i in infos)
    doomed = sorted(leftovers)
    total -= sum(int(i.size or 0) for key in leftovers for i in entries[key])
    for used, key in order:
        old = older_than_s is not None and now - used > older_than_s
        over = max_bytes is not None and total > max_bytes
        if old or over:
            doomed.append(key)
            total -= sum(int(i.size or 0) for i in entries[key])
    return doomed


def _token_first(infos: list[pafs.FileInfo]) -> list[pafs.FileInfo]:
    """An entry's files in the order they are deleted: the token file first, for without it the
    entry is no longer found, whatever else remains."""
    return sorted(infos, key=lambda i: not _is_entry(i.base_name))


def _remove(path: str, storage: StorageConfig | None, infos: list[pafs.FileInfo]) -> int:
    """Deletes these files of the store, in order; returns their bytes."""
    removed = 0
    for info in infos:
        remove(join(path, info.base_name), storage)
        removed += int(info.size or 0)
    return removed


def _mtime(info: pafs.FileInfo) -> float:
    return info.mtime.timestamp() if info.mtime is not None else 0.0


def store_line(store: dict[str, Any], units: int) -> str:
    """What the summary and the report say of the store a run used (store_record's dict; `units`:
    the run's work units)."""
    return (
        f"{store['path']}: {store['hits']:,} of {units:,} units found there, "
        f"{units - store['hits']:,} tokenized; it holds {units_text(store['entries'])}, "
        f"{size_text(store['bytes'])}"
    )


def units_text(n: int) -> str:
    """1 unit, 2 units."""
    return f"{n:,} unit{'' if n == 1 else 's'}"


def size_text(found: Any) -> str:
    """A size for people, in binary units as the rest of the summary: 512 B, 83.2 KiB, 1.5 GiB."""
    size = float(found)
    if size < 1024:
        return f"{size:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            break
    return f"{size:,.1f} {unit}"
