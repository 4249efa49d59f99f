"""Paths that may be local or in object storage (s3://, gs://, ...), through pyarrow filesystems.

Every stage opens files through `resolve()`, so nothing assumes a local disk. S3 credentials come from
the environment pyarrow reads (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, ~/.aws, instance roles); the
endpoint and region from `storage.*` config keys or AWS_ENDPOINT_URL / AWS_REGION. No credential is ever
part of a path we accept, log or write.
"""

from __future__ import annotations

import functools
import hashlib
import os
import posixpath
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from raypack.config import StorageConfig
from raypack.errors import ConfigError
from raypack.paths import ONE_SLASH, WILDCARDS, contains, glob_match, input_base, is_uri, join, split_glob

__all__ = [
    "TMP_PREFIX",
    "Shard",
    "atomic_output",
    "contains",
    "exists",
    "expand_inputs",
    "glob_match",
    "input_base",
    "join",
    "list_dir",
    "open_output",
    "read_bytes",
    "remove",
    "remove_temporaries",
    "resolve",
    "whole_output",
    "write_bytes",
    "write_bytes_atomic",
]

_DEFAULT = StorageConfig()


def resolve(path: str, storage: StorageConfig | None = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path inside it) for a local path or a URI. An S3 filesystem is remembered
    (_s3: resolving an s3:// URI without a region costs a request to find the bucket's region),
    under everything it is made from, so it is never used where it was not made for."""
    if not is_uri(path):
        if ONE_SLASH.match(path):  # `s3:/bucket/x` would be a local directory named `s3:`
            scheme, rest = path.split(":/", 1)
            raise ConfigError(
                f"{path} is a local path that looks like a URI: did you mean {scheme}://{rest}?"
            )
        return pafs.LocalFileSystem(), os.path.abspath(path)
    # Split by hand: urlsplit would read a `?` glob as the start of a query string.
    scheme, _, rest = path.partition("://")
    bucket = rest.split("/", 1)[0]
    # s3://KEY:SECRET@bucket (and gs://...) carry credentials; Azure's abfs://container@account does
    # not (the account is a host name), unless a secret stands before the `@`.
    if "@" in bucket and (scheme in ("s3", "s3a", "gs", "gcs") or ":" in bucket.split("@", 1)[0]):
        # Never echo the path: it holds a secret.
        raise ConfigError(
            f"a {scheme}:// path holds credentials; set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY "
            "(or your cloud's standard variables) instead"
        )
    if scheme in ("s3", "s3a"):
        made_for = (os.getpid(), _credentials())
        return _s3(bucket, storage or _DEFAULT, made_for), rest.rstrip("/") or bucket
    try:
        fs, inner = pafs.FileSystem.from_uri(path)
    except (ValueError, OSError) as e:  # pyarrow's ArrowInvalid is a ValueError
        raise ConfigError(f"cannot open {path}: {_first_line(e)}") from None
    return fs, inner


# The variables the AWS SDK reads credentials and their source from.
_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
)


def _credentials() -> str:
    """A digest of the credential variables as they are now (never the secrets themselves)."""
    digest = hashlib.sha256()
    for name in _CREDENTIAL_VARIABLES:
        digest.update(f"{name}={os.environ.get(name, '')}\0".encode())
    return digest.hexdigest()


@functools.lru_cache(maxsize=64)
def _s3(bucket: str, storage: StorageConfig, made_for: tuple[int, str]) -> pafs.FileSystem:
    """An S3 filesystem for `bucket`, remembered for `made_for`: this process (a filesystem holds
    open connections: a forked child that uses its parent's reads the parent's replies, and
    `exists()` says yes for a file never written) and the credentials in the environment (a second
    job in the same process, after they changed, gets a filesystem that uses the new ones)."""
    storage = storage.from_environment()
    endpoint, region = storage.endpoint, storage.region
    if region is None and endpoint is None:
        try:  # a bucket on AWS itself: ask it where it lives, as FileSystem.from_uri does
            region = pafs.resolve_s3_region(bucket)
        except (ValueError, OSError) as e:
            raise ConfigError(f"cannot reach bucket {bucket}: {_first_line(e)}") from None
    options: dict[str, object] = {
        "region": region or "us-east-1",
        "connect_timeout": storage.connect_timeout,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=storage.max_attempts),
    }
    if endpoint is not None:
        scheme, _, host = endpoint.partition("://")
        options["endpoint_override"] = host.rstrip("/")
        options["scheme"] = scheme
    return pafs.S3FileSystem(**options)


def exists(path: str, storage: StorageConfig | None = None) -> bool:
    fs, inner = resolve(path, storage)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def read_bytes(path: str, storage: StorageConfig | None = None) -> bytes:
    """The file's bytes as stored: compression=None, else pyarrow would decompress a `.gz` name."""
    fs, inner = resolve(path, storage)
    with fs.open_input_stream(inner, compression=None) as f:
        return f.read()


def open_output(path: str, storage: StorageConfig | None = None) -> pa.NativeFile:
    """A stream writing `path` (a context manager), its parent directories created first; the bytes
    go as given (compression=None: pyarrow would gzip them again for a `.gz` name)."""
    fs, inner = resolve(path, storage)
    parent = posixpath.dirname(inner)
    if parent:
        fs.create_dir(parent, recursive=True)
    return fs.open_output_stream(inner, compression=None)


def write_bytes(path: str, data: bytes | pa.Buffer, storage: StorageConfig | None = None) -> None:
    with open_output(path, storage) as f:
        f.write(data)


TMP_PREFIX = ".tmp-"


@contextmanager
def atomic_output(
    path: str, storage: StorageConfig | None = None, tag: str | None = None
) -> Iterator[pa.NativeFile]:
    """Like open_output, but `path` appears only once the block ends without an error: the bytes go to
    a `.tmp-*` sibling that is then moved over `path` (a rename locally; a server-side copy on S3, whose
    streams cannot be aborted: closing one commits whatever was written). On an error the sibling is
    deleted; one left by a killed process is swept by the next run (TMP_PREFIX). For small files
    only: S3's CopyObject refuses sources over 5 GB (token files are written in place instead).
    `tag` (32 hex digits; default a fresh uuid): the sibling is `.tmp-<tag>-<name>`, so that the
    job a tag names can find what its killed writers left (a token store's, shared with others)."""
    fs, inner = resolve(path, storage)
    parent, name = posixpath.split(inner)
    tmp = posixpath.join(parent, f"{TMP_PREFIX}{tag or uuid.uuid4().hex}-{name}")
    if parent:
        fs.create_dir(parent, recursive=True)
    try:
        with fs.open_output_stream(tmp, compression=None) as stream:
            yield stream
        fs.move(tmp, inner)
    except BaseException:
        with suppress(OSError):
            fs.delete_file(tmp)
        raise


@contextmanager
def whole_output(
    path: str, storage: StorageConfig | None = None, tag: str | None = None
) -> Iterator[pa.NativeFile]:
    """A large file that readers see whole or not at all, of any size: a local one through
    atomic_output (a rename), an object written in place (an upload becomes visible only when it
    completes, and atomic_output's CopyObject refuses sources over 5 GB). An object cut short by an
    error is visible, as open_output leaves it: its readers must tell (a token file's completion
    key)."""
    if is_uri(path):
        with open_output(path, storage) as f:
            yield f
    else:
        with atomic_output(path, storage, tag) as f:
            yield f


def write_bytes_atomic(path: str, data: bytes | pa.Buffer, storage: StorageConfig | None = None) -> None:
    """Readers see the old content or the new, never a part."""
    with atomic_output(path, storage) as f:
        f.write(data)


def remove_temporaries(directory: str, storage: StorageConfig | None = None, tag: str | None = None) -> int:
    """Delete the `.tmp-*` files atomic_output left in `directory` (its direct children) when its
    process was killed, or only those it wrote under `tag`; returns how many. Only for files no
    live writer is using."""
    prefix = TMP_PREFIX if tag is None else f"{TMP_PREFIX}{tag}-"
    removed = 0
    for info in list_dir(directory, storage):
        if info.type == pafs.FileType.File and info.base_name.startswith(prefix):
            remove(join(directory, info.base_name), storage)
            removed += 1
    return removed


def remove(path: str, storage: StorageConfig | None = None) -> None:
    """Delete a file or a directory tree; nothing when it is not there."""
    fs, inner = resolve(path, storage)
    info = fs.get_file_info(inner)
    with suppress(FileNotFoundError):
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(inner)
        elif info.type == pafs.FileType.File:
            fs.delete_file(inner)


def list_dir(path: str, storage: StorageConfig | None = None) -> list[pafs.FileInfo]:
    """Direct children of a directory (empty when it does not exist)."""
    fs, inner = resolve(path, storage)
    return fs.get_file_info(pafs.FileSelector(inner, recursive=False, allow_not_found=True))


@dataclass(frozen=True, slots=True)
class Shard:
    index: int
    path: str
    """Full path or URI, as given to resolve()."""
    relpath: str
    """Path relative to the input root: the prefix of generated document ids."""
    size: int
    mtime_ns: int
    unit_start: int = 0
    unit_stop: int = -1
    """A file split into work units (raypack.corpus.cut.work_units): this unit's row groups
    [unit_start, unit_stop) of a Parquet file, or bytes [unit_start, unit_stop) of a JSONL file.
    unit_stop -1: the whole file."""
    first_row: int = 0
    """Rows of the file before the unit (row groups before it, or lines before its first byte): its
    first document's row is first_row (Parquet) or first_row + 1 (JSONL lines count from 1)."""
    source: str = ""
    """The input source (input.sources) it belongs to; "" without sources."""

    @property
    def split(self) -> bool:
        return self.unit_stop >= 0


def expand_inputs(
    patterns: tuple[str, ...], root: str | None = None, storage: StorageConfig | None = None
) -> list[Shard]:
    """Sorted, de-duplicated files matching the patterns; ConfigError when storage is unreachable or
    nothing matches (a typo in a glob must not produce an empty dataset).

    Globs have the shell's meaning, on local paths and object stores alike: `*`, `?` and `[...]`
    match within one path segment, `**` as a whole segment matches any number of directories.
    (fnmatch's `*` would cross `/`: `corpus/*.jsonl.gz` would take `corpus/holdout/*.jsonl.gz` too.)
    A pattern whose wildcards all sit in its last segment lists one directory, not the tree under
    it."""
    found: dict[str, tuple[int, int]] = {}
    for pattern in patterns:
        fs, inner = resolve(pattern, storage)
        try:
            infos = _matching_files(fs, inner)
        except OSError as e:
            raise ConfigError(f"cannot list input {pattern}: {_first_line(e)}") from None
        if isinstance(fs, pafs.LocalFileSystem):
            _refuse_broken_links(inner)
        for info in infos:
            full = _rebuild(pattern, info.path)
            found[full] = (int(info.size or 0), int(info.mtime_ns or 0))
    if not found:
        raise ConfigError(f"input.paths matched no files: {', '.join(patterns)}")
    return _numbered(found, patterns, root, storage)


def _matching_files(fs: pafs.FileSystem, inner: str) -> list[pafs.FileInfo]:
    """The files a pattern (its path within `fs`) matches: a glob's, every file under a directory,
    or the file named; OSError when `fs` cannot list them."""
    # Local and remote paths are listed the same way, through pyarrow's selector.
    if any(c in inner for c in WILDCARDS):
        base, rest = split_glob(inner)
        recursive = "/" in rest or "**" in rest
        selector = pafs.FileSelector(base, recursive=recursive, allow_not_found=True)
        prefix = base.rstrip("/") + "/"
        return [
            i
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File
            and i.path.startswith(prefix)
            and glob_match(rest, i.path[len(prefix) :])
        ]
    info = fs.get_file_info(inner)
    if info.type == pafs.FileType.Directory:
        return [
            i
            for i in fs.get_file_info(pafs.FileSelector(inner, recursive=True))
            if i.type == pafs.FileType.File
        ]
    return [info] if info.type == pafs.FileType.File else []


def _numbered(
    found: dict[str, tuple[int, int]],
    patterns: tuple[str, ...],
    root: str | None,
    storage: StorageConfig | None,
) -> list[Shard]:
    """The files found (path: size and mtime), sorted and numbered as Shards, each with its path
    relative to `root` (None: the fixed part of the first pattern), or its name alone where that
    is empty."""
    base_dir = root if root is not None else _root_of(patterns[0], storage)
    _, base_inner = resolve(base_dir, storage) if base_dir else (None, "")
    shards = []
    for i, path in enumerate(sorted(found)):
        _, inner = resolve(path, storage)
        rel = posixpath.relpath(inner, base_inner) if base_inner else posixpath.basename(inner)
        size, mtime = found[path]
        shards.append(Shard(index=i, path=path, relpath=rel, size=size, mtime_ns=mtime))
    return shards


def _refuse_broken_links(inner: str) -> None:
    """ConfigError naming a local input that is a symbolic link to nothing. pyarrow's listing leaves
    such a link out, so its file would be missing from the output with no word of it."""
    import os

    def broken(path: str) -> bool:
        return os.path.islink(path) and not os.path.exists(path)

    if any(c in inner for c in WILDCARDS):
        base, rest = split_glob(inner)
        prefix = base.rstrip("/") + "/"
        deep = "/" in rest or "**" in rest

        def wanted(path: str) -> bool:
            return glob_match(rest, path[len(prefix) :])
    elif os.path.isdir(inner):
        base, deep = inner, True

        def wanted(path: str) -> bool:
            return True
    else:
        if broken(inner):
            _broken(inner)
        return
    if deep:
        walk = os.walk(base)
    else:
        try:
            walk = iter([(base, [], os.listdir(base))])
        except OSError:
            return
    for folder, dirs, names in walk:
        for name in [*names, *dirs]:
            path = os.path.join(folder, name)
            if broken(path) and wanted(path):
                _broken(path)


def _broken(path: str) -> None:
    import os

    raise ConfigError(
        f"input {path} is a symbolic link to {os.readlink(path)}, which does not exist: its records cannot "
        "be read; restore its target or remove the link"
    )


def _root_of(pattern: str, storage: StorageConfig | None) -> str:
    fs, inner = resolve(pattern, storage)
    if any(c in inner for c in WILDCARDS):
        return input_base(pattern)
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
