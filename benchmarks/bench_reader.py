"""The trainer-side reader against reading the same Parquet files plainly, on one packed dataset.

    make demo && python benchmarks/bench_reader.py                  # raypack-demo/packed
    python benchmarks/bench_reader.py PATH --batch-size 16 --world-size 8

Baseline: what a trainer does at the least to get `input_ids` out of the files: pyarrow reads each row
group's `input_ids` and flattens it to a (rows, seq_len) int64 array, in file order. raypack: every
batch of `iter_batches` for every rank of `--world-size` (so the whole dataset once), in its seeded
order, with labels, position_ids and cu_seqlens computed. Both read from the page cache after a
first untimed pass; each is timed `--repeat` times, best kept; the ratio is taken in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from raypack.reader import iter_batches


def plain(files: list[Path]) -> int:
    tokens = 0
    for path in files:
        f = pq.ParquetFile(path)
        for g in range(f.num_row_groups):
            column = f.read_row_group(g, columns=["input_ids"]).column("input_ids").combine_chunks()
            rows = len(column)
            ids = column.values.to_numpy().astype(np.int64).reshape(rows, -1)
            tokens += ids.size
    return tokens


def ours(path: str, batch_size: int, world_size: int) -> int:
    tokens = 0
    for rank in range(world_size):
        for batch in iter_batches(
            path, batch_size, rank=rank, world_size=world_size, seed=1, last_batch="short"
        ):
            tokens += batch["input_ids"].size
            assert batch["labels"].shape == batch["position_ids"].shape == batch["input_ids"].shape
    return tokens


def best_of(fn: Callable[[], int], repeat: int) -> tuple[float, int]:
    times, tokens = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - t0)
    return min(times), tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("path", nargs="?", default="raypack-demo/packed")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = Path(args.path) / "data"
    files = sorted(data.rglob("*.parquet"))
    if not files:
        print(f"no packed dataset at {args.path}: run `make demo` first, or name one", file=sys.stderr)
        return 2
    plain(files)  # warm the page cache and imports, untimed
    ours(args.path, args.batch_size, args.world_size)
    t_plain, n_plain = best_of(lambda: plain(files), args.repeat)
    t_ours, n_ours = best_of(lambda: ours(args.path, args.batch_size, args.world_size), args.repeat)
    if n_plain != n_ours:
        print(f"token counts differ: plain {n_plain:,}, iter_batches {n_ours:,}", file=sys.stderr)
        return 1
    result = {
        "dataset": args.path,
        "tokens": n_ours,
        "batch_size": args.batch_size,
        "world_size": args.world_size,
        "plain_seconds": round(t_plain, 4),
        "iter_batches_seconds": round(t_ours, 4),
        "plain_mtok_per_s": round(n_plain / t_plain / 1e6, 1),
        "iter_batches_mtok_per_s": round(n_ours / t_ours / 1e6, 1),
        "iter_batches_over_plain_time": round(t_ours / t_plain, 2),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
