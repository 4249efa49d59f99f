"""Paths as strings, local or URIs (s3://, gs://, ...): what they name and how globs match them. Pure:
no filesystem, no config (raypack.config checks an output against its inputs' paths with these;
raypack.storage resolves and lists them)."""

from __future__ import annotations

import fnmatch
import functools
import os
import posixpath
import re

__all__ = [
    "ONE_SLASH",
    "WILDCARDS",
    "anchored",
    "contains",
    "glob_match",
    "input_base",
    "is_uri",
    "join",
    "split_glob",
]

WILDCARDS = "*?["


def is_uri(path: str) -> bool:
    return "://" in path


# A scheme with one slash after it: a URI mistyped (s3:/bucket, gs:/bucket), not a path one means.
ONE_SLASH = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:/(?!/)")


def anchored(path: str) -> str:
    """A local path made absolute against this process's working directory: what another process (a
    worker, a Ray node's, whose working directory is its own) reads and writes. A URI as it is, and
    a mistyped one (ONE_SLASH), which storage refuses by name."""
    if is_uri(path) or not path or ONE_SLASH.match(path):
        return path
    return os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    if is_uri(base):
        scheme, rest = base.split("://", 1)
        return f"{scheme}://{posixpath.join(rest, *parts)}"
    return os.path.join(base, *parts)


def split_glob(inner: str) -> tuple[str, str]:
    """(the directory before the first segment holding a wildcard, the rest): "a/b/*/c*.gz" ->
    ("a/b", "*/c*.gz")."""
    cut = min(inner.find(c) for c in WILDCARDS if c in inner)
    slash = inner.rfind("/", 0, cut)
    if slash < 0:
        return ".", inner
    return inner[:slash] or "/", inner[slash + 1 :]


def glob_match(pattern: str, path: str) -> bool:
    """Whether relative `path` matches relative glob `pattern`, segment by segment: each segment as
    fnmatch matches a name (`*`, `?`, `[...]`, never across `/`), and a `**` segment matching zero
    or more whole segments."""
    return _match_segments(tuple(pattern.split("/")), tuple(path.split("/")))


@functools.lru_cache(maxsize=4096)
def _match_segments(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match_segments(rest, path[k:]) for k in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match_segments(rest, path[1:])


def input_base(pattern: str) -> str:
    """The directory (or file) a pattern can match below: its path before the first segment with a
    wildcard, or the path itself. An output inside it could become an input (JobConfig refuses it)."""
    if not any(c in pattern for c in WILDCARDS):
        return pattern.rstrip("/") or "/"
    if is_uri(pattern):
        scheme, _, rest = pattern.partition("://")
        base, _ = split_glob(rest)
        return f"{scheme}://{base}"
    base, _ = split_glob(pattern)
    return base


def contains(outer: str, inner: str) -> bool:
    """True when path `inner` is `outer` or lies below it (same scheme; local paths made absolute)."""

    def norm(p: str) -> tuple[str, str]:
        if is_uri(p):
            scheme, _, rest = p.partition("://")
            scheme = "s3" if scheme == "s3a" else scheme
            return scheme, posixpath.normpath("/" + rest)
        return "", os.path.abspath(p)

    (s1, a), (s2, b) = norm(outer), norm(inner)
    return s1 == s2 and (b == a or b.startswith(a.rstrip("/") + "/"))
