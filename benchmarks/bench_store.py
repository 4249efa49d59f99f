"""Tokenize once, pack many: a first pack that fills a token store, against repacks from it.

    python benchmarks/bench_store.py --mb 500 --rounds 3

bench_job.py's corpus (real source text in gzipped JSONL shards) and tokenizer (--tokenizer: its
trained 128k BPE, `large`, or a real model's). Each round, on the default executor, as a user runs
`raypack pack`, timed from the command's start to its exit:
- first: an empty store, pack.seq_len 8192, bfd: every unit tokenized and stored;
- repack: the same store, seq_len 4096 and spfhp (another plan, other files): every unit found;
- copy: the corpus copied to another directory (new paths and times), seq_len 8192: every unit found,
  and its data files must equal the first pack's (checked).
Ratios are first / repack in the same round (this machine's speed drifts through the day).
Beside each round, the floor of assign+write (issue 40): one copy of the first pack's tokens into a
reused buffer a row group at a time and their zstd level 3 in 1 MiB pages (Parquet's data pages), on
every core, with nothing else; assign+write is reported against it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job


def pack(work: Path, name: str, corpus: Path, tokenizer: Path, store: Path, **pack_cfg: object) -> dict:
    sections = {"pack": pack_cfg, "cache": {"path": str(store)}}
    seconds, metrics, _ = bench_job.run_command(
        work, corpus, tokenizer, f"store-{name}", backend="auto", sections=sections
    )
    return {
        "seconds": seconds,
        "stages": metrics["stage_seconds"],
        "units": metrics["shards"],
        "digest": bench_job.data_digest(work / f"out-store-{name}"),
    }


def floor_seconds(out: Path, threads: int) -> float:
    """The copy+compress floor of the data files under `out` (best of 3), on `threads` threads."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    tokens = np.concatenate(
        [
            pq.read_table(p, columns=["input_ids"]).column("input_ids").combine_chunks().flatten().to_numpy()
            for p in sorted((out / "data").rglob("*.parquet"))
        ]
    )
    codec, page, group = pa.Codec("zstd", compression_level=3), 1 << 18, 1024 * 8192

    def run(k: int, buffer: np.ndarray) -> None:
        for lo in range(k * group, tokens.size, threads * group):
            n = min(group, tokens.size - lo)
            buffer[:n] = tokens[lo : lo + n]
            for a in range(0, n, page):
                codec.compress(buffer[a : min(a + page, n)])

    best = float("inf")
    for _ in range(3):
        buffers = [np.empty(group, np.int32) for _ in range(threads)]
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads), buffers))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--tokenizer", choices=["large", *bench_job.REAL], default="large")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = (
        bench_job.large_tokenizer(args.work)
        if args.tokenizer == "large"
        else bench_job.real_tokenizer(args.work, args.tokenizer)
    )
    corpus, texts = bench_job.make_corpus(args.work, args.mb)
    copy = args.work / f"store-copy-{args.mb}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(corpus, copy)
    print(f"{args.mb} MB, {len(texts):,} documents, {args.tokenizer} tokenizer", flush=True)
    ratios = []
    for r in range(args.rounds):
        store = args.work / "store"
        shutil.rmtree(store, ignore_errors=True)
        first = pack(args.work, "first", corpus, tokenizer, store)
        repack = pack(args.work, "repack", corpus, tokenizer, store, seq_len=4096, algorithm="spfhp")
        copied = pack(args.work, "copy", copy, tokenizer, store)
        if copied["digest"] != first["digest"]:
            raise SystemExit("the copied corpus packed from the store differs from the first pack")
        for name, run in (("first", first), ("repack", repack), ("copy", copied)):
            stages = run["stages"]
            print(
                f"round {r + 1} {name}: {run['seconds']:.2f} s (tokenize {stages['tokenize']:.2f}, "
                f"assign+write {stages['assign+write']:.2f}, the rest "
                f"{run['seconds'] - sum(stages.values()):.2f}); units {run['units']}",
                flush=True,
            )
        ratios.append(first["seconds"] / repack["seconds"])
        floor = floor_seconds(args.work / "out-store-first", len(os.sched_getaffinity(0)))
        aw = first["stages"]["assign+write"]
        print(
            f"round {r + 1}: first / repack x{ratios[-1]:.2f}; the first pack's assign+write "
            f"{aw:.2f} s against its copy+zstd floor {floor:.2f} s: x{aw / floor:.2f}",
            flush=True,
        )
    print(f"median first / repack x{statistics.median(ratios):.2f} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
