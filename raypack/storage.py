"""Paths that may be local or in object storage (s3://, gs://, ...), through pyarrow filesystems.

Every stage opens files through `resolve()`, so nothing assumes a local disk. Credentials and the
endpoint come from the environment pyarrow reads (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL, AWS_REGION); they are never part of a path we log or write.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from raypack.errors import ConfigError

__all__ = ["Shard", "exists", "expand_inputs", "join", "open_output", "read_bytes", "resolve", "write_bytes"]

_WILDCARDS = "*?["


def is_uri(path: str) -> bool:
    return "://" in path


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI."""
    if is_uri(path):
        try:
            fs, inner = pafs.FileSystem.from_uri(path)
        except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise ConfigError(f"cannot open {path}: {_first_line(e)}") from None
        return fs, inner
    return pafs.LocalFileSystem(), os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    if is_uri(base):
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{posixpath.join(rest, *parts)}"
    return os.path.join(base, *parts)


def exists(path: str) -> bool:
    fs, inner = resolve(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def read_bytes(path: str) -> bytes:
    fs, inner = resolve(path)
    with fs.open_input_stream(inner) as f:
        return f.read()


def open_output(path: str) -> pa.NativeFile:
    """A stream writing `path` (a context manager), its parent directories created first."""
    fs, inner = resolve(path)
    parent = posixpath.dirname(inner)
    if parent:
        fs.create_dir(parent, recursive=True)
    return fs.open_output_stream(inner)


def write_bytes(path: str, data: bytes | pa.Buffer) -> None:
    with open_output(path) as f:
        f.write(data)


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    path: str
    """Full path or URI, as given to resolve()."""
    relpath: str
    """Path relative to the input root: the prefix of generated document ids."""
    size: int
    mtime_ns: int


def expand_inputs(patterns: tuple[str, ...], root: str | None = None) -> list[Shard]:
    """Sorted, de-duplicated files matching the patterns; ConfigError when storage is unreachable or
    nothing matches (a typo in a glob must not produce an empty dataset)."""
    found: dict[str, tuple[int, int]] = {}
    for pattern in patterns:
        fs, inner = resolve(pattern)
        try:
            # Local and remote paths are listed the same way, through pyarrow's selector.
            if any(c in inner for c in _WILDCARDS):
                base = inner[: min(inner.find(c) for c in _WILDCARDS if c in inner)].rsplit("/", 1)[0] or "/"
                infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
                infos = [i for i in infos if i.type == pafs.FileType.File and _match(i.path, inner)]
            else:
                info = fs.get_file_info(inner)
                if info.type == pafs.FileType.Directory:
                    infos = [
                        i
                        for i in fs.get_file_info(pafs.FileSelector(inner, recursive=True))
                        if i.type == pafs.FileType.File
                    ]
                else:
                    infos = [info] if info.type == pafs.FileType.File else []
        except OSError as e:
            raise ConfigError(f"cannot list input {pattern}: {_first_line(e)}") from None
        for info in infos:
            full = _rebuild(pattern, info.path)
            found[full] = (int(info.size or 0), int(info.mtime_ns or 0))
    if not found:
        raise ConfigError(f"input.paths matched no files: {', '.join(patterns)}")
    base_dir = root if root is not None else _root_of(patterns[0])
    _, base_inner = resolve(base_dir) if base_dir else (None, "")
    shards = []
    for i, path in enumerate(sorted(found)):
        _, inner = resolve(path)
        rel = posixpath.relpath(inner, base_inner) if base_inner else posixpath.basename(inner)
        size, mtime = found[path]
        shards.append(Shard(index=i, path=path, relpath=rel, size=size, mtime_ns=mtime))
    return shards


def _match(path: str, pattern: str) -> bool:
    # `**` matches across directories; fnmatch's `*` already does, so only the `**/` form needs help.
    return fnmatch.fnmatchcase(path, pattern) or fnmatch.fnmatchcase(path, pattern.replace("**/", ""))


def _root_of(pattern: str) -> str:
    fs, inner = resolve(pattern)
    if any(c in inner for c in _WILDCARDS):
        cut = min(pattern.find(c) for c in _WILDCARDS if c in pattern)
        return pattern[:cut].rsplit("/", 1)[0] or "/"
    if fs.get_file_info(inner).type == pafs.FileType.Directory:
        return pattern
    return pattern.rsplit("/", 1)[0] if "/" in pattern else "."


def _rebuild(pattern: str, inner_path: str) -> str:
    """A listed path back in the user's form (URI or absolute local path)."""
    if is_uri(pattern):
        return f"{pattern.split('://', 1)[0]}://{inner_path.lstrip('/')}"
    return inner_path


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
