"""`python -m raypack.packing.warmup`: compile every packer's numba functions once, into the content-keyed
cache (raypack.packing._cache), so that no job pays for it: `make` runs it after installing, and the
cluster image's Dockerfile at build time. Prints what was compiled and what came from the cache."""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from raypack.packing import ALGORITHMS, PackPermutation, copy_runs, pack
from raypack.packing._cache import cache_root
from raypack.packing._jit import load

__all__ = ["dispatchers", "warmup"]


def dispatchers() -> list[Any]:
    """Every packing function's numba dispatcher (made now where none is yet)."""
    from numba.core.registry import CPUDispatcher

    import raypack.packing as package

    load()

    found = {}
    for name, module in sorted(sys.modules.items()):
        if name.startswith(package.__name__ + ".") and module is not None:
            for value in vars(module).values():
                if isinstance(value, CPUDispatcher):
                    found[id(value)] = value
    return list(found.values())


def warmup() -> tuple[int, int]:
    """Run every packer on a small input, every overflow policy, with and without a seed and a depth
    cap, and the writer's run copy; returns (compiled, loaded from the cache) signatures."""
    lengths = np.random.default_rng(0).integers(1, 300, 200)
    for name, algorithm in ALGORITHMS.items():
        for overflow in ("split", "truncate", "drop"):
            pack(lengths, 128, name, overflow=overflow, seed=0)
        if "max_depth" in algorithm.options:
            pack(lengths, 128, name, max_depth=2)
    # The writer's copy of items into packs (pipeline.materialize): int32 tokens, int64 offsets.
    starts = np.arange(3, dtype=np.int64)
    copy_runs(np.zeros(3, np.int32), starts, np.ones(3, np.int32), starts, np.ones(3, np.int64))
    PackPermutation(5, 0)(np.arange(5))  # assign's pack shuffle
    misses = hits = 0
    for dispatcher in dispatchers():
        misses += sum(dispatcher.stats.cache_misses.values())
        hits += sum(dispatcher.stats.cache_hits.values())
    return misses, hits


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(
        prog="python -m raypack.packing.warmup",
        description="Compile every packer's numba functions into raypack's cache (RAYPACK_NUMBA_CACHE, "
        "else $XDG_CACHE_HOME/raypack/numba, else ~/.cache/raypack/numba), so that no job pays for it "
        "(~7-17 s on 2 cores); a second run loads them from there.",
    ).parse_args(argv)
    t0 = time.perf_counter()
    compiled, loaded = warmup()
    print(
        f"raypack: numba warm-up in {time.perf_counter() - t0:.1f} s: {compiled} signatures compiled, "
        f"{loaded} loaded from the cache ({cache_root()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
