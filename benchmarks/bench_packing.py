"""Packing speed, memory and quality on lognormal lengths; raypack against a pure-Python best-fit.

    python benchmarks/bench_packing.py                       # 1M and 10M documents, seq_len 2048 and 8192
    python benchmarks/bench_packing.py --docs 1000000 --seq-len 2048 --algorithms bfd,ffd
    python benchmarks/bench_packing.py --docs 10000000 --algorithms decompose,bfd --reference-docs 0

Lengths: np.random.lognormal(6.0, 1.2), at least 1, seed 0 (median ~400 tokens, ~9% over 2048).
Time: `raypack.packing.pack()`, overflow policy + plan + per-item (pack, slot, offset) for every item,
after a warm-up that compiles the numba loops. Memory: the process's peak resident set during that
call above what it held before (Linux VmHWM, reset through /proc/self/clear_refs), so it counts
numba's allocations too, which tracemalloc would miss; the lengths array itself is not counted.
The reference is what common Python packers do: item by item, longest first, a segment tree over
remaining capacities for best fit, in plain Python. It runs on --reference-docs documents (default 10M,
the target's data: ~4 min of the ~6 min total) and the ratio is taken against bfd on the same documents
in the same run. decompose (dataset decomposition: every document cut into power-of-two chunks, a
pack each) is also timed against bfd in --rounds interleaved rounds on the largest --docs, their
ratio given as median and range: it places ~5 items a document where bfd places ~1.1.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from raypack.metrics import compute_metrics
from raypack.packing import ALGORITHMS, pack

TARGETS = """targets (issue 2, 2-core machine):
  bfd, 10M docs, plan + per-item assignment: <= 1 s at 2048, <= 2 s at 8192; >= 30x pure Python;
      extra memory <= 32 bytes per document
  bfd and lpfhp: efficiency >= 99.99%, packs <= 1.0001 x lower bound; spfhp >= 99.5%
  nnlshp at 8192: <= 60 s, efficiency >= 99%"""


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(6.0, 1.2, n)).astype(np.int64)


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure(fn):  # type: ignore[no-untyped-def]
    """(result, seconds, peak extra bytes) of fn()."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    peak = _status_kb("VmHWM")
    return result, seconds, (peak - before) * 1024


def reference_best_fit(lengths: np.ndarray, seq_len: int) -> int:
    """Pure-Python item-by-item best-fit-decreasing with a segment tree over capacities."""
    items: list[int] = []
    for n in lengths.tolist():
        while n > seq_len:
            items.append(seq_len)
            n -= seq_len
        items.append(n)
    items.sort(reverse=True)
    size = 1
    while size < seq_len + 1:
        size *= 2
    tree = [-1] * (2 * size)
    bins_at: list[list[int]] = [[] for _ in range(seq_len + 1)]
    room: list[int] = []

    def set_leaf(cap: int, present: bool) -> None:
        node = size + cap
        tree[node] = cap if present else -1
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2

    for x in items:
        if tree[1] >= x:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= x else 2 * node + 1
            cap = node - size
            b = bins_at[cap].pop()
            if not bins_at[cap]:
                set_leaf(cap, False)
        else:
            b, cap = len(room), seq_len
            room.append(seq_len)
        room[b] = cap - x
        if room[b] > 0:
            if not bins_at[room[b]]:
                set_leaf(room[b], True)
            bins_at[room[b]].append(b)
    return len(room)


def decompose_rounds(lengths: np.ndarray, seq_lens: list[int], rounds: int) -> list[dict[str, object]]:
    """decompose's time against bfd's on the same lengths, alternating in each round (the machine's
    load then weighs on both alike): per seq_len, each one's median seconds and the ratio's median,
    least and most over the rounds."""
    out = []
    for seq_len in seq_lens:
        times: dict[str, list[float]] = {"decompose": [], "bfd": []}
        items = 0
        for r in range(rounds):
            for name in ("decompose", "bfd") if r % 2 == 0 else ("bfd", "decompose"):
                gc.collect()
                t0 = time.perf_counter()
                a = pack(lengths, seq_len, name)
                times[name].append(time.perf_counter() - t0)
                if name == "decompose":
                    items = a.items.num_items
                del a
        ratio = np.asarray(times["decompose"]) / np.asarray(times["bfd"])
        row = {
            "docs": len(lengths),
            "seq_len": seq_len,
            "rounds": rounds,
            "decompose_seconds": float(np.median(times["decompose"])),
            "bfd_seconds": float(np.median(times["bfd"])),
            "ratio_median": float(np.median(ratio)),
            "ratio_min": float(ratio.min()),
            "ratio_max": float(ratio.max()),
            "decompose_items_per_doc": items / len(lengths),
        }
        out.append(row)
        print(
            f"decompose vs bfd, {len(lengths)} docs, seq_len {seq_len}, {rounds} interleaved rounds: "
            f"{row['decompose_seconds']:.2f} s vs {row['bfd_seconds']:.2f} s (medians), ratio "
            f"{row['ratio_median']:.1f}x [{row['ratio_min']:.1f}-{row['ratio_max']:.1f}]",
            flush=True,
        )
    return out


def main() -> int:
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        # A fixed mmap threshold turns off glibc's adaptive one, which after the first large free()
        # serves later arrays from heap pages that are still resident: the peak of the next run would
        # then read too low (0 bytes per document for greedy at 1M documents, measured).
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--seq-len", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--algorithms", default="all", help="comma-separated, or all")
    parser.add_argument("--reference-docs", type=int, default=10_000_000, help="0 to skip the reference")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved decompose/bfd rounds (0: none)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    algorithms = list(ALGORITHMS) if args.algorithms == "all" else args.algorithms.split(",")

    warm = lognormal_lengths(20_000, seed=1)
    for name in algorithms:
        for seq_len in args.seq_len:
            pack(warm, seq_len, name)  # compile numba loops outside the timings

    rows = []
    header = (
        f"{'docs':>10} {'seq_len':>7} {'algorithm':<9} {'seconds':>8} {'B/doc':>6} {'efficiency':>10} "
        f"{'packs/LB':>9}"
    )
    print(header)
    print("-" * len(header))
    for n in args.docs:
        lengths = lognormal_lengths(n)
        for seq_len in args.seq_len:
            for name in algorithms:
                a, seconds, extra = measure(lambda: pack(lengths, seq_len, name))  # noqa: B023
                m = compute_metrics(a)
                del a
                row = {
                    "docs": n,
                    "seq_len": seq_len,
                    "algorithm": name,
                    "seconds": seconds,
                    "bytes_per_doc": extra / n,
                    "efficiency": m.efficiency,
                    "packs": m.packs,
                    "lower_bound": m.lower_bound,
                    "packs_over_lower_bound": m.packs_over_lower_bound,
                }
                rows.append(row)
                print(
                    f"{n:>10} {seq_len:>7} {name:<9} {seconds:>8.3f} {extra / n:>6.1f} "
                    f"{100 * m.efficiency:>9.4f}% {m.packs_over_lower_bound:>9.6f}",
                    flush=True,
                )

    rounds = (
        decompose_rounds(lognormal_lengths(max(args.docs)), args.seq_len, args.rounds)
        if ("decompose" in algorithms and args.rounds)
        else []
    )
    reference = []
    if args.reference_docs:
        lengths = lognormal_lengths(args.reference_docs)
        for seq_len in args.seq_len:
            (ref_packs, ref_s, _) = measure(lambda: reference_best_fit(lengths, seq_len))  # noqa: B023
            a, ours_s, _ = measure(lambda: pack(lengths, seq_len, "bfd"))  # noqa: B023
            if a.num_packs != ref_packs:
                print(f"MISMATCH: bfd made {a.num_packs} packs, the reference {ref_packs}", file=sys.stderr)
                return 1
            reference.append(
                {
                    "docs": args.reference_docs,
                    "seq_len": seq_len,
                    "python_seconds": ref_s,
                    "bfd_seconds": ours_s,
                    "speedup": ref_s / ours_s,
                    "packs": ref_packs,
                }
            )
            print(
                f"pure-Python segment-tree best fit, {args.reference_docs} docs, seq_len {seq_len}: "
                f"{ref_s:.2f} s vs bfd {ours_s:.3f} s = {ref_s / ours_s:.0f}x (same {ref_packs} packs)",
                flush=True,
            )
    print(TARGETS)
    if args.json:
        args.json.write_text(
            json.dumps({"runs": rows, "reference": reference, "decompose": rounds}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
