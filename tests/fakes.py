"""Test doubles that the job's workers run: at module level, so that a task that is given one finds it
by its name (a local pool's workers import it; Ray's would too), as they find raypack's own classes."""

from __future__ import annotations

from typing import Any

import numpy as np

from raypack.pipeline.tokenize.task import TokenizeShards

__all__ = [
    "DiesWriting",
    "Differs",
    "OneIdOff",
    "Shifted",
    "Unchecked",
    "always_dies",
    "dies_first",
    "mark_now",
    "passing_imports",
    "pid",
    "slow_mark",
    "takes_early",
    "warm_like_a_zygote",
]

# The word the doubles below change the first id of (a word of the generated corpus, no probe's).
WORD = "histogram"


class OneIdOff:
    """fastokens, but the first id of any text holding `word` is changed: what the checks must catch."""

    name = "fastokens"

    def __init__(self, inner: Any, word: str) -> None:
        self.inner, self.word, self.version = inner, word, inner.version

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        flat, lengths = self.inner.encode(texts)
        flat = flat.copy()
        starts = np.cumsum(lengths) - lengths
        for i, text in enumerate(texts):
            if self.word in text and lengths[i]:
                flat[starts[i]] = (flat[starts[i]] + 1) % 100
        return flat, lengths


class Differs(TokenizeShards):
    """A worker whose fast encoder differs on WORD (its sampled check is to find it)."""

    def __init__(self, cfg: Any, backend: str, loaded: Any, ahead: bool = False) -> None:
        super().__init__(cfg, backend, loaded, ahead)
        if self.encoder is not self.reference:
            self.encoder = OneIdOff(self.encoder, WORD)


class Unchecked(Differs):
    """Differs, with the sampled check missing every unit's difference but zz-last.jsonl's."""

    def _tokenize_checked(self, unit: Any) -> Any:
        if unit.relpath != "zz-last.jsonl" and self.encoder is not self.reference:
            self._checker = None  # the sample missed this unit's differences
            return self._tokenize(unit)
        return super()._tokenize_checked(unit)


class Shifted(TokenizeShards):
    """A worker whose fast character offsets are shifted past the third character (a chat mask's
    input): its sampled check is to find it."""

    def __init__(self, cfg: Any, backend: str, loaded: Any, ahead: bool = False) -> None:
        super().__init__(cfg, backend, loaded, ahead)
        if self.coder is not self.reference_coder:
            inner = self.coder

            def shifted(texts: list[str]) -> Any:
                coded = inner(texts)
                return coded._replace(offsets=coded.offsets + (coded.offsets > 3))

            self.coder = shifted


def dies_first(marker: str, value: int) -> int:
    """A task whose worker is killed (SIGKILL, as the OOM killer kills) the first time it runs it:
    `marker` is the file that remembers it was; then `value` doubled."""
    import os
    import signal

    if not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return value * 2


def pid() -> int:
    import os

    return os.getpid()


def warm_like_a_zygote() -> None:
    """A preload: numba loads a compiled function (raypack's summaries' make_items) and pyarrow makes
    an array of a Python list, as a zygote's warm-up does (raypack.pipeline.tokenize.worker.warm_worker)."""
    import numpy as np
    import pyarrow as pa

    from raypack.packing import make_items

    make_items(np.array([3, 9], dtype=np.int64), 4, "split")
    pa.array(["x"])


def passing_imports() -> tuple[bool, bool, bool, bool, bool]:
    """Whether numba's functions were loaded here; whether scipy.linalg, pandas or cffi were
    imported for it; whether scipy's BLAS, pandas and cffi then import (and pyarrow still makes
    arrays)."""
    import importlib.util
    import sys

    import pyarrow as pa

    loaded = "numba.np.arraymath" in sys.modules
    before = any(name in sys.modules for name in ("scipy.linalg", "pandas", "cffi"))
    import pandas
    import scipy.linalg.cython_blas

    pa.array(["y"])
    blas, hashes = scipy.linalg.cython_blas is not None, pandas.util.hash_array is not None
    if importlib.util.find_spec("cffi") is None:  # (a dependency's dependency: installed here)
        return loaded, before, blas, hashes, True
    import cffi

    return loaded, before, blas, hashes, cffi.FFI().sizeof("int") == 4


def always_dies() -> None:
    """A task whose worker is killed every time it runs it."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def slow_mark(directory: str, seconds: float) -> None:
    """A preload that takes `seconds`, then leaves a file of its own (two run by one process leave
    two): one cut short leaves none."""
    import os
    import time
    import uuid

    time.sleep(seconds)
    with open(os.path.join(directory, f"{os.getpid()}-{uuid.uuid4().hex}"), "w") as f:
        f.write("done")


def mark_now(directory: str) -> float:
    """An early load (a local pool's zygote starts it in a thread): when it ran, also written to
    `early-at`."""
    import os
    import time

    now = time.time()
    with open(os.path.join(directory, "early-at"), "w") as f:
        f.write(repr(now))
    return now


def takes_early(key: str, directory: str) -> None:
    """A preload that takes the early load `key`'s value, as the job's takes fastokens' build."""
    import os

    from raypack.engine.zygote import early

    with open(os.path.join(directory, "early-taken"), "w") as f:
        f.write(repr(early(key)))


class DiesWriting(TokenizeShards):
    """A worker killed (SIGKILL, as the OOM killer kills) as it encodes a unit's first batch, every
    time: its token file's temporary is open, and is left as a killed writer leaves it."""

    def _encode(self, *args: Any, **kwargs: Any) -> Any:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")
