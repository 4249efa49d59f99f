"""Numba's compiled code cached by the content of raypack's source files, not by their path.

The packing loops are numba functions with cache=True; compiling them all takes ~7 s on a fresh
install (bfd's path 5.3 s, nnlshp 0.8 s, bucket 1.1 s, measured on this 2-core machine). Numba's own
cache lives next to the source (or in a user directory keyed by the source's directory path), so
every `ray job submit --working-dir .` would compile again: each job's copy of raypack sits at a new path
(/tmp/ray/session_*/runtime_resources/working_dir_files/_ray_pkg_<hash>/...). This locator keys the
cache directory by the content of raypack/packing/'s sources (numba stamps entries by a hash of their file),
under a per-user directory that outlives jobs and cluster sessions: the same raypack code compiles
once per machine (and CPU model), whatever directory it runs from. `python -m raypack.packing.warmup`
fills it ahead of time (the Dockerfile and `make` run it).

Root: $RAYPACK_NUMBA_CACHE, else $XDG_CACHE_HOME/raypack/numba, else ~/.cache/raypack/numba. An
unwritable root falls back to numba's own locators.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Any, ClassVar

__all__ = ["cache_root", "cached", "has_entries"]

_PACKAGE = Path(__file__).resolve().parent.parent  # this copy of raypack/


def cache_root() -> Path:
    if root := os.environ.get("RAYPACK_NUMBA_CACHE"):
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "raypack" / "numba"


@functools.cache
def _digest(package: Path) -> str:
    """Of every source file of raypack/packing/ together: numba links a called function's code into
    its caller's cache entry but checks only the caller's own file, so a change to _segtree.py must
    invalidate _groups.py's entries too."""
    digest = hashlib.sha256()
    for path in sorted(package.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _cache_dir(package: Path) -> Path:
    """Where the compiled code of the functions in `package` (a directory) is kept."""
    return cache_root() / _digest(package)


def has_entries() -> bool:
    """Whether this machine's cache holds compiled code of this raypack's packers (any): without
    any, a process's first packer compiles (~7 s for a bfd job's, ~20 s for every packer's, on 2
    cores), and a job says so (`python -m raypack.packing.warmup` does it ahead)."""
    directory = _cache_dir(_PACKAGE / "packing")
    try:
        return any(p.suffix == ".nbi" for p in directory.iterdir())
    except OSError:
        return False


@functools.cache
def _cache_class() -> type:
    """numba's FunctionCache with the content-keyed locator first (defined at the first call, not at
    import: raypack.packing._jit imports numba only for a first call). A subclass: numba's own list
    of locators, which every numba function in the process uses, is left as it is."""
    from numba.core import caching

    class ContentCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        def __init__(self, py_func: Any, py_file: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self._cache_path = str(_cache_dir(Path(py_file).resolve().parent))

        def get_cache_path(self) -> str:
            return self._cache_path

        def get_disambiguator(self) -> str:
            return str(self._lineno)

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> ContentCacheLocator | None:
            path = Path(py_file).resolve()
            if not path.is_file() or _PACKAGE not in path.parents:
                return None  # not raypack's: numba's own locators decide
            locator = cls(py_func, py_file)
            try:
                locator.ensure_cache_path()
            except OSError:
                return None  # an unwritable root: numba's own locators decide
            return locator

    base = caching.FunctionCache._impl_class

    class ContentImpl(base):  # type: ignore[misc, valid-type]
        _locator_classes: ClassVar[list[type]] = [ContentCacheLocator, *base._locator_classes]

    class ContentCache(caching.FunctionCache):
        _impl_class = ContentImpl

    return ContentCache


def cached(dispatcher: Any) -> Any:
    """`dispatcher` (numba.njit's, made without cache=True) caching its compiled code under the
    content-keyed root, as numba's cache=True would under its own locators (Dispatcher.enable_caching
    sets the same attribute). Where this numba has another layout, its own cache (keyed by path)."""
    try:
        dispatcher._cache = _cache_class()(dispatcher.py_func)
    except AttributeError:
        dispatcher.enable_caching()
    return dispatcher
