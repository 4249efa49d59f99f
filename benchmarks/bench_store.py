"""Tokenize once, pack many: a first pack that fills a token store, against repacks from it.

    python benchmarks/bench_store.py --mb 500 --rounds 3 --tokenizer tekken

bench_job.py's corpus (real source text in gzipped JSONL shards) and tokenizer (--tokenizer: its
trained 128k BPE, `large`, or a real model's). Each round, on the default executor, as a user runs
`raypack pack`, timed from the command's start to its exit:
- first: an empty store, pack.seq_len 8192, bfd: every unit tokenized and stored;
- repack: the same store, seq_len 4096 and spfhp (another plan, other files): every unit found;
- copy: the corpus copied to another directory (new paths and times), seq_len 8192: every unit found,
  and its data files must equal the first pack's (checked);
- tiny first, tiny repack: one 2 kB document into an empty store, then packed again from it (seq_len
  4096, spfhp): what a first pack and a repack cost whatever their data (the command's start, the
  pool, the backend's self-check where a unit is tokenized, plan, commit).
Ratios are first / repack in the same round (this machine's speed drifts through the day).
Beside each round, the floor of assign+write (issue 40): one copy of a pack's tokens into a reused
buffer a row group at a time and their zstd level 3 in 1 MiB pages (Parquet's data pages), on every
core, with nothing else (its seconds and its CPU seconds); each pack's assign+write is reported
against the floor of its own output.

Every command's CPU seconds are its process tree's (getrusage of the waited children: the command,
its pool's zygote and workers). Unlike wall time they hold on a machine shared with other jobs
(a command that got half a core takes twice as long, on the same CPU seconds). The model: a pack on
n cores takes its tiny twin's wall time (its fixed part, the quietest round's) plus its CPU seconds
beyond the tiny twin's, spread over n cores (an upper bound of the speed: no part serial, no core
idle); checked against the measured wall time on this machine's cores, and given for --model-cores.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job

PARTS = ("tokenize", "plan", "assign+write", "the rest")


def pack(work: Path, name: str, corpus: Path, tokenizer: Path, store: Path, **pack_cfg: object) -> dict:
    """One `raypack pack`: its seconds, CPU seconds, parts (the stages; the rest: start and commit)."""
    sections = {"pack": pack_cfg, "cache": {"path": str(store)}}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds, metrics, _ = bench_job.run_command(
        work, corpus, tokenizer, f"store-{name}", backend="auto", sections=sections
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    stages = metrics["stage_seconds"]
    parts = {part: stages.get(part, 0.0) for part in PARTS[:-1]}
    parts["the rest"] = seconds - sum(stages.values())
    return {
        "seconds": seconds,
        "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "parts": parts,
        "units": metrics["shards"],
        "digest": bench_job.data_digest(work / f"out-store-{name}"),
    }


def tiny_corpus(work: Path) -> Path:
    """One JSONL shard of one 2 kB document."""
    folder = work / "store-tiny-corpus"
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "part-00000.jsonl.gz", "wt") as out:
        out.write(json.dumps({"text": "packing sequences for training, " * 64}) + "\n")
    return folder


def tiny_pair(work: Path, tiny: Path, tokenizer: Path) -> dict[str, dict]:
    """The tiny first pack into an empty store, and the tiny repack from it."""
    store = work / "store-tiny"
    shutil.rmtree(store, ignore_errors=True)
    return {
        "tiny first": pack(work, "tiny", tiny, tokenizer, store),
        "tiny repack": pack(work, "tiny", tiny, tokenizer, store, seq_len=4096, algorithm="spfhp"),
    }


def tiny_rounds(work: Path, tiny: Path, tokenizer: Path, rounds: int) -> int:
    """--tiny-only: the fixed parts alone, `rounds` times (short commands: on a machine other jobs
    load, the least of many is near what a quiet machine gives)."""
    runs: dict[str, list[dict]] = {}
    for _ in range(rounds):
        for name, run in tiny_pair(work, tiny, tokenizer).items():
            runs.setdefault(name, []).append(run)
    for name, done in runs.items():
        seconds = [d["seconds"] for d in done]
        print(
            f"{name}: {_spread(seconds)} s, least {min(seconds):.2f} s; "
            f"{_spread([d['cpu'] for d in done], 1)} CPU-s"
        )
    return 0


def _spread(values: list[float], digits: int = 2) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def model(runs: dict[str, list[dict]], cpus: int, cores: int) -> None:
    """The first pack and the repack as their tiny twin's wall time plus their CPU seconds beyond
    the twin's over n cores: on this machine's `cpus` (against the measured medians) and on `cores`."""
    at: dict[int, dict[str, float]] = {cpus: {}, cores: {}}
    works = {}
    for kind in ("first", "repack"):
        # The quietest round's: the fixed part is mostly one process's (the command's start, the
        # backend's self-check), which other jobs on this machine only slow down.
        fixed = min(r["seconds"] for r in runs[f"tiny {kind}"])
        work = works[kind] = statistics.median(r["cpu"] for r in runs[kind]) - statistics.median(
            r["cpu"] for r in runs[f"tiny {kind}"]
        )
        for n in at:
            at[n][kind] = fixed + work / n
        measured = statistics.median(r["seconds"] for r in runs[kind])
        print(
            f"model {kind}: {fixed:.2f} s fixed + {work:.1f} CPU-s / n: {at[cpus][kind]:.2f} s on {cpus} "
            f"cores (measured {measured:.2f} s), {at[cores][kind]:.2f} s on {cores}"
        )
    for n, wall in at.items():
        print(f"model on {n} cores: first / repack x{wall['first'] / wall['repack']:.2f}")
    ratio = works["first"] / works["repack"]
    print(f"model, data without bound (the fixed parts nothing): x{ratio:.2f}, the ratio of CPU seconds")


def floor_seconds(out: Path, threads: int) -> tuple[float, float]:
    """The copy+compress floor of the data files under `out` on `threads` threads: its seconds and
    its CPU seconds (this process's, every thread's), each the least of 3 tries."""
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

    best, cpu = float("inf"), float("inf")
    for _ in range(3):
        buffers = [np.empty(group, np.int32) for _ in range(threads)]
        t0, c0 = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, range(threads), buffers))
        best, cpu = min(best, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return best, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=500)
    parser.add_argument("--tokenizer", choices=["large", *bench_job.REAL], default="large")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model-cores", type=int, default=16)
    parser.add_argument("--tiny-only", action="store_true", help="the tiny first pack and repack alone")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = (
        bench_job.large_tokenizer(args.work)
        if args.tokenizer == "large"
        else bench_job.real_tokenizer(args.work, args.tokenizer)
    )
    tiny = tiny_corpus(args.work)
    if args.tiny_only:
        return tiny_rounds(args.work, tiny, tokenizer, args.rounds)
    corpus, texts = bench_job.make_corpus(args.work, args.mb)
    copy = args.work / f"store-copy-{args.mb}"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(corpus, copy)
    print(f"{args.mb} MB, {len(texts):,} documents, {args.tokenizer} tokenizer", flush=True)
    cpus = len(os.sched_getaffinity(0))
    runs: dict[str, list[dict]] = {}
    floors: dict[str, list[float]] = {}
    for r in range(args.rounds):
        store = args.work / "store"
        shutil.rmtree(store, ignore_errors=True)
        got = {"first": pack(args.work, "first", corpus, tokenizer, store)}
        got["repack"] = pack(args.work, "repack", corpus, tokenizer, store, seq_len=4096, algorithm="spfhp")
        got["copy"] = pack(args.work, "copy", copy, tokenizer, store)
        if got["copy"]["digest"] != got["first"]["digest"]:
            raise SystemExit("the copied corpus packed from the store differs from the first pack")
        got.update(tiny_pair(args.work, tiny, tokenizer))
        for name, run in got.items():
            runs.setdefault(name, []).append(run)
            parts = ", ".join(f"{k} {v:.2f}" for k, v in run["parts"].items())
            print(
                f"round {r + 1} {name}: {run['seconds']:.2f} s, {run['cpu']:.1f} CPU-s ({parts}); "
                f"units {run['units']}",
                flush=True,
            )
        for kind in ("first", "repack"):
            wall, cpu = floor_seconds(args.work / f"out-store-{kind}", cpus)
            floors.setdefault(kind, []).append(wall)
            floors.setdefault(f"{kind} CPU", []).append(cpu)
        aw = {kind: got[kind]["parts"]["assign+write"] for kind in ("first", "repack")}
        print(
            f"round {r + 1}: first / repack x{got['first']['seconds'] / got['repack']['seconds']:.2f}; "
            f"assign+write against its copy+zstd floor: first's {aw['first']:.2f} s / "
            f"{floors['first'][-1]:.2f} s, the repack's {aw['repack']:.2f} s / "
            f"{floors['repack'][-1]:.2f} s",
            flush=True,
        )
    ratios = [f["seconds"] / p["seconds"] for f, p in zip(runs["first"], runs["repack"], strict=True)]
    print(f"\n{args.rounds} rounds, medians (spread):")
    print(f"first / repack x{_spread(ratios)}")
    cpu_ratios = [f["cpu"] / p["cpu"] for f, p in zip(runs["first"], runs["repack"], strict=True)]
    print(f"first / repack in CPU seconds x{_spread(cpu_ratios)}")
    for name, done in runs.items():
        parts = ", ".join(f"{k} {_spread([d['parts'][k] for d in done])}" for k in PARTS)
        print(
            f"{name}: {_spread([d['seconds'] for d in done])} s, "
            f"{_spread([d['cpu'] for d in done], 1)} CPU-s; {parts}"
        )
    for kind in ("first", "repack"):
        aw = [d["parts"]["assign+write"] / f for d, f in zip(runs[kind], floors[kind], strict=True)]
        print(
            f"{kind}'s assign+write / its floor x{_spread(aw)}; the floor {_spread(floors[kind])} s on "
            f"{cpus} threads, {_spread(floors[f'{kind} CPU'])} CPU-s"
        )
    model(runs, cpus, args.model_cores)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
