"""What pack.pad_multiple costs: efficiency and packs by k, and the packer's time against k = 1.

    python benchmarks/bench_pad_multiple.py                   # 1M documents, seq_len 2048 and 8192
    python benchmarks/bench_pad_multiple.py --docs 200000 --seq-len 8192 --multiples 1,8,16 --rounds 3

Lengths: np.random.lognormal(6.0, 1.2), at least 1, seed 0 (bench_packing's corpus). For each k:
`raypack.packing.pack(..., "bfd", pad_multiple=k)`, its packs, its efficiency (real tokens over
pack positions), and its positions split into real tokens, alignment padding and end padding.
Time: the machine is shared and noisy, so every round times every k once, in turn (k = 1 first
in one round, last in the next), after a warm-up that compiles the numba loops; the ratio of each
k's time to k = 1's is taken within a round, and the median and the range over rounds are given.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from raypack.metrics import compute_metrics
from raypack.packing import pack


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(6.0, 1.2, n)).astype(np.int64)


def timed(lengths: np.ndarray, seq_len: int, k: int) -> float:
    t0 = time.perf_counter()
    pack(lengths, seq_len, "bfd", pad_multiple=k)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=str, default="2048,8192")
    ap.add_argument("--multiples", type=str, default="1,2,4,8,16,32")
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    lengths = lognormal_lengths(args.docs)
    ks = [int(k) for k in args.multiples.split(",")]
    if ks[0] != 1:
        ks = [1, *ks]
    for seq_len in (int(s) for s in args.seq_len.split(",")):
        pack(lengths[:1000], seq_len, "bfd", pad_multiple=2)  # compile before timing
        print(f"\n{args.docs:,} documents, seq_len {seq_len}, bfd")
        head = [("k", 4), ("packs", 10), ("x packs(k=1)", 13), ("efficiency", 11)]
        head += [("align pad", 10), ("end pad", 9)]
        print(" ".join(f"{name:>{width}}" for name, width in head))
        for k in ks:
            m = compute_metrics(pack(lengths, seq_len, "bfd", pad_multiple=k))
            base = compute_metrics(pack(lengths, seq_len, "bfd")) if k != 1 else m
            print(
                f"{k:>4} {m.packs:>10,} {m.packs / base.packs:>13.4f} {100 * m.efficiency:>10.3f}% "
                f"{100 * m.alignment_padding / m.slots:>9.3f}% {100 * m.end_padding / m.slots:>8.3f}%"
            )
        ratios: dict[int, list[float]] = {k: [] for k in ks}
        for r in range(args.rounds):
            order = ks if r % 2 == 0 else ks[::-1]
            seconds = {k: timed(lengths, seq_len, k) for k in order}
            for k in ks:
                ratios[k].append(seconds[k] / seconds[1])
        print(f"time / time(k=1), {args.rounds} interleaved rounds: median [min, max]")
        for k in ks[1:]:
            rs = ratios[k]
            print(f"{k:>4} {statistics.median(rs):.3f} [{min(rs):.3f}, {max(rs):.3f}]")


if __name__ == "__main__":
    main()
