"""How the job's cost grows with shards and files (issue 12): equal bytes per shard, 100 → 400 → 1,600
shards with about as many output files, then a realistic shape.

    python benchmarks/bench_scale.py                        # 100, 400, 1600 shards; 300 MB in 64 shards
    python benchmarks/bench_scale.py --shards 100 400 --realistic-mb 0

Tiny shards: 40 documents of ~1 KB of real text each (source files found on this machine, as
bench_job.py finds them, cut at line ends), seq_len 2048, output.shard_rows 8, so there are about as
many files as shards: the shape that made shards × files shuffle blocks before the exchange of
raypack.pipeline.write.exchange. Realistic: gzipped JSONL shards of real source files, one a document,
seq_len 8192, default shard_rows.

Each run is `raypack pack` in a subprocess (local Ray started by it). Printed: every stage's seconds
(metrics.json), the exchange's tasks and objects (its log line: exact, from every task's num_returns),
the driver's peak RSS (sampled every 0.1 s) and the largest Ray worker's peak private memory. Then
the growth: non-tokenize stages at the largest run over 16× (or N×) their time at the smallest, and
tokenization's seconds per shard at each size (flat if its per-shard cost does not grow).
Last, the driver's cost of an owned Ray object (RSS per reference held, small inlined objects),
the per-object figure the 2T-token model in docs/benchmarks.md uses.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import WorkerMemory, source_texts

DOC_BYTES = 1_000
DOCS_PER_SHARD = 40


def tiny_documents(n: int) -> list[str]:
    """n documents of ~DOC_BYTES of real text, cut at line ends from distinct source files."""
    docs: list[str] = []
    for text in source_texts():
        piece: list[str] = []
        size = 0
        for line in text.splitlines(keepends=True):
            piece.append(line)
            size += len(line)
            if size >= DOC_BYTES:
                docs.append("".join(piece))
                piece, size = [], 0
                if len(docs) == n:
                    return docs
    raise SystemExit(f"this machine has text for {len(docs)} documents, not {n}")


def tiny_corpus(work: Path, shards: int, docs: list[str]) -> Path:
    corpus = work / f"tiny-{shards}"
    if not (corpus / "done").exists():
        corpus.mkdir(parents=True, exist_ok=True)
        for s in range(shards):
            lines = docs[s * DOCS_PER_SHARD : (s + 1) * DOCS_PER_SHARD]
            text = "".join(json.dumps({"text": t}) + "\n" for t in lines)
            (corpus / f"part-{s:05d}.jsonl").write_text(text)
        (corpus / "done").write_text("")
    return corpus


def realistic_corpus(work: Path, mb: int, shards: int) -> Path:
    import gzip

    corpus = work / f"real-{mb}mb-{shards}"
    if (corpus / "done").exists():
        return corpus
    corpus.mkdir(parents=True, exist_ok=True)
    per = mb * 10**6 // shards
    shard, size, total, lines = 0, 0, 0, []
    for text in source_texts():
        lines.append(json.dumps({"text": text}) + "\n")
        size += len(text.encode())
        total += len(text.encode())
        if size >= per or total >= mb * 10**6:
            with gzip.open(corpus / f"part-{shard:05d}.jsonl.gz", "wt", compresslevel=1) as out:
                out.writelines(lines)
            shard, size, lines = shard + 1, 0, []
        if total >= mb * 10**6:
            break
    if lines:
        with gzip.open(corpus / f"part-{shard:05d}.jsonl.gz", "wt", compresslevel=1) as out:
            out.writelines(lines)
    (corpus / "done").write_text("")
    return corpus


class DriverMemory:
    def __init__(self, pid: int) -> None:
        self.peak = 0
        self._proc = psutil.Process(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self._proc.memory_info().rss)
            except psutil.NoSuchProcess:
                return
            self._stop.wait(0.1)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


# `raypack pack` with the exchange's sizes set small (16 MiB rounds, 32 MiB a writer: ~25 rounds and
# 13 writers at 300 MB), in one hop or, with the bound on one hop's objects at 0, in two: what the
# second hop costs a byte on this machine.
_SMALL = (
    "import sys; from raypack.pipeline import exchange; exchange.ROUND_BYTES = 16 << 20; "
    "exchange.WRITER_BYTES = 32 << 20; exchange.ONE_HOP_OBJECTS = {bound}; "
    "from raypack.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run(
    work: Path,
    name: str,
    corpus: Path,
    pattern: str,
    tokenizer: Path,
    pack: dict,
    output: dict,
    hops: int = 0,
) -> dict:
    config = {
        "input": {"paths": [str(corpus / pattern)], "max_reject_ratio": 0.05},
        "tokenizer": {"path": str(tokenizer)},
        "pack": pack,
        "output": {"path": str(work / f"out-{name}"), **output},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    raypack = Path(sys.executable).parent / "raypack"
    with WorkerMemory() as workers:
        t0 = time.perf_counter()
        patch = _SMALL.format(bound=0 if hops == 2 else 2**62)
        command = [sys.executable, "-c", patch] if hops else [str(raypack)]
        proc = subprocess.Popen(
            [*command, "pack", str(path), "--overwrite"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        driver = DriverMemory(proc.pid)
        out, err = proc.communicate()
        seconds = time.perf_counter() - t0
        driver_peak = driver.stop()
    if proc.returncode != 0:
        raise SystemExit(f"raypack pack failed:\n{out[-2000:]}\n{err[-2000:]}")
    metrics = json.loads((work / f"out-{name}" / "metrics.json").read_text())
    manifest = json.loads((work / f"out-{name}" / "manifest.json").read_text())
    line = re.search(r"\[raypack\] exchange: (.*)", err)
    uss, _, title = workers.peak()
    return {
        "seconds": seconds,
        "stages": metrics["stage_seconds"],
        "shards": manifest["counts"]["shards"],
        "files": len(manifest["files"]),
        "tokens": manifest["counts"]["tokens"],
        "items": manifest["counts"]["items"],
        "exchange": line.group(1) if line else "-",
        "driver": driver_peak,
        "worker": uss,
        "worker_title": title,
    }


def report(label: str, r: dict) -> None:
    st = r["stages"]
    rest = sum(v for k, v in st.items() if k != "tokenize")
    print(
        f"{label}: {r['shards']:,} shards, {r['files']:,} files, {r['tokens'] / 1e6:.1f}M tokens; "
        f"command {r['seconds']:.1f} s; {', '.join(f'{k} {v:.2f} s' for k, v in st.items())}; "
        f"non-tokenize stages {rest:.2f} s; tokenize {1000 * st['tokenize'] / r['shards']:.1f} ms a shard; "
        f"exchange: {r['exchange']}; driver peak RSS {r['driver'] / 2**20:.0f} MiB; largest worker "
        f"private {r['worker'] / 2**20:.0f} MiB ({r['worker_title']})",
        flush=True,
    )


def owned_object_bytes(n: int = 20_000) -> float:
    """Driver RSS per ObjectRef held of a task's small returns (inlined in the driver's memory store),
    measured in this process on a local Ray."""
    import numpy as np
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")

    def pieces(k: int) -> tuple[np.ndarray, ...]:
        return tuple(np.zeros(16, dtype=np.int64) for _ in range(k))

    task = ray.remote(pieces)
    warm = task.options(num_returns=100).remote(100)
    ray.get(list(warm))
    del warm
    gc.collect()
    proc = psutil.Process()
    before = proc.memory_info().rss
    refs = []
    for _ in range(n // 1000):
        refs.extend(task.options(num_returns=1000).remote(1000))
    ray.wait(refs, num_returns=len(refs), fetch_local=False)
    after = proc.memory_info().rss
    del refs
    ray.shutdown()
    return (after - before) / n


def model(rates: dict[str, float], object_bytes: float) -> None:
    """The 2T-token job of issue 12 (2,000 shards, seq_len 8192, 10,000 packs a file, 64 nodes × 16
    CPUs), laid out by raypack's own exchange.layout, timed with the per-CPU rates measured above."""
    import numpy as np

    from raypack.pipeline.write import exchange

    tokens, shards, seq_len, rows, cpus, nodes = 2e12, 2_000, 8192, 10_000, 1024, 64
    docs = tokens / 1_000  # ~1,000 tokens a document
    packs = int(np.ceil(tokens / seq_len / 0.999))
    files = -(-packs // rows)
    runs = min(shards, cpus)
    run_of_shard = exchange.shard_runs([1] * shards, runs)
    item_bytes = tokens * 4 + docs * exchange.ITEM_BYTES
    shard_bytes = np.full(shards, item_bytes / shards)
    file_bytes = np.full(files, rows * seq_len * 4.0)
    lay = exchange.layout(run_of_shard, runs, shard_bytes, file_bytes, cpus, int(docs), id_check=True)
    n = lay.counts()
    driver = n["objects"] * object_bytes + runs * (seq_len + 1) * 8 + files * 1024 + shards * 200
    # The defaults' per-byte rate, slowed by the second hop as much as the small-size runs measured.
    hop = rates["exchange_0"] * (rates["exchange_2"] / rates["exchange_1"] if lay.hops == 2 else 1.0)
    print(
        f"model, 2T tokens: {shards:,} shards, {files:,} files, {cpus:,} CPUs; item bytes "
        f"{item_bytes / 1e12:.1f} TB; {n['assign_tasks']:,} assign, {n['merge_tasks']:,} merge, "
        f"{n['write_tasks']:,} write tasks, {lay.hops} hop(s), {n['rounds']:,} rounds, {n['objects']:,} "
        f"objects; driver ~{driver / 2**30:.1f} GiB; "
        f"tokenize {tokens / rates['tokenize'] / cpus / 60:.0f} min, "
        f"exchange {item_bytes / hop / cpus / 60:.0f} min; bytes through object stores "
        f"{lay.hops * item_bytes / 1e12:.1f} TB ({(nodes - 1) / nodes:.0%} of it across the network)",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, nargs="*", default=[100, 400, 1600])
    parser.add_argument("--realistic-mb", type=int, default=300, help="0: skip the realistic run")
    parser.add_argument("--realistic-shards", type=int, default=64)
    parser.add_argument(
        "--realistic-hops", type=int, nargs="+", default=[0, 1, 2], help="0: defaults, 1/2: small sizes"
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-scale")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    from raypack.demo import demo_config

    demo_config(args.work / "demo")  # the demo's 8k BPE, trained once
    tokenizer = args.work / "demo" / "tokenizer.json"
    print(f"{os.cpu_count()} cores; tiny shards: {DOCS_PER_SHARD} documents of ~{DOC_BYTES} bytes")
    docs = tiny_documents(max(args.shards) * DOCS_PER_SHARD) if args.shards else []
    results = {}
    for shards in sorted(args.shards):
        corpus = tiny_corpus(args.work, shards, docs)
        results[shards] = run(
            args.work, f"tiny-{shards}", corpus, "*.jsonl", tokenizer, {"seq_len": 2048}, {"shard_rows": 8}
        )
        report(f"tiny {shards}", results[shards])
    if len(results) > 1:
        lo, hi = min(results), max(results)
        grow = hi / lo

        def rest(r: dict) -> float:
            return sum(v for k, v in r["stages"].items() if k != "tokenize")

        ratio = rest(results[hi]) / rest(results[lo])
        per = [1000 * results[s]["stages"]["tokenize"] / s for s in sorted(results)]
        print(
            f"growth {lo} → {hi} shards (×{grow:.0f}): non-tokenize stages ×{ratio:.1f} "
            f"(target <= ×{1.25 * grow:.0f}: {'met' if ratio <= 1.25 * grow else 'NOT met'}); "
            f"driver peak {results[hi]['driver'] / 2**20:.0f} MiB (target <= 1024: "
            f"{'met' if results[hi]['driver'] <= 2**30 else 'NOT met'}); tokenize ms a shard: "
            f"{', '.join(f'{p:.1f}' for p in per)}",
            flush=True,
        )
    object_bytes = owned_object_bytes()
    print(f"driver bytes per owned object (small, inlined): {object_bytes:.0f}", flush=True)
    if args.realistic_mb:
        corpus = realistic_corpus(args.work, args.realistic_mb, args.realistic_shards)
        rates: dict[str, float] = {}
        cpus = os.cpu_count() or 1
        shapes = {0: "defaults", 1: "small sizes, one hop", 2: "small sizes, two hops"}
        for hops in args.realistic_hops:
            output = {"shard_rows": 1000}
            r = run(args.work, "realistic", corpus, "*.jsonl.gz", tokenizer, {"seq_len": 8192}, output, hops)
            report(f"realistic {args.realistic_mb} MB, shard_rows 1000, {shapes[hops]}", r)
            # Per-CPU rates: tokens tokenized, and item bytes (4 a token + 64 an item) assigned,
            # exchanged and written, a second of one CPU.
            moved = r["tokens"] * 4 + r["items"] * 64
            rates[f"exchange_{hops}"] = moved / r["stages"]["assign+write"] / cpus
            rates.setdefault("tokenize", r["tokens"] / r["stages"]["tokenize"] / cpus)
        print(
            "per-CPU rates: "
            + ", ".join(
                f"{k} {v / 1e6:.2f} M{'tok' if k == 'tokenize' else 'B'}/s" for k, v in rates.items()
            ),
            flush=True,
        )
        model(rates, object_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
