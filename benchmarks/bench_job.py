"""The whole job against the tokenizer alone, and worker memory as the corpus grows.

    python benchmarks/bench_job.py                  # 200 MB corpus (and 50 MB for the memory check)
    python benchmarks/bench_job.py --mb 400 --small-mb 100

Corpus: this Python's standard library sources, repeated until the size is reached, in gzipped JSONL
shards of a fixed size (6.25 MB of text by default: a 4x larger corpus has 4x more shards, as corpora
grow; and even the small corpus gives each tokenizer actor 4 shards: its memory settles from the 3rd
shard on, so both runs compare actors in their steady state). Tokenizer: the demo's byte-level BPE
(8192 tokens), trained once and cached.
Baseline: `encode_batch` (512 documents a call) over the same texts in this process, on all cores
(tokenizers parallelizes a batch itself), measured in the same run as the job. Job: `raypack pack`'s
run_job on local Ray with all cores, wall time from start to manifest. Memory: every Ray worker
process sampled every 0.2 s for its private memory (resident minus shared pages, from /proc/PID/statm:
the heap and arrays the process itself holds) and its resident set (RSS, which also counts pages of
the shared object store the process has mapped, so it grows with the blocks a task reads even when
they are not copied). statm is read in O(1); psutil's USS (smaps) walks every mapping, and sampling it
this often cost the job 24 s of 162 on two cores. The largest peak of each is reported
for the small and the large corpus (a job whose per-worker memory grows with the corpus would not
scale to one larger than RAM).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from raypack.config import load_config
from raypack.demo import demo_config
from raypack.pipeline.job import run_job


def make_corpus(out: Path, mb: int, shard_mb: float, sources: list[Path]) -> tuple[Path, list[str]]:
    texts = []
    for path in sources:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    corpus = out / f"corpus-{mb}mb"
    shutil.rmtree(corpus, ignore_errors=True)  # an earlier run's shards may be cut differently
    corpus.mkdir(parents=True)
    target = mb * 10**6
    shards = max(1, round(mb / shard_mb))
    written, all_texts, copy = 0, [], 0
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(gzip.open(corpus / f"part-{i:02d}.jsonl.gz", "wt", compresslevel=1))
            for i in range(shards)
        ]
        while written < target:
            for i, text in enumerate(texts):
                handles[(copy * len(texts) + i) % shards].write(json.dumps({"text": text}) + "\n")
                all_texts.append(text)
                written += len(text.encode())
                if written >= target:
                    break
            copy += 1
    return corpus, all_texts


def raw_tokens_per_second(tokenizer_path: Path, texts: list[str]) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 512):
        n += sum(len(e.ids) for e in tok.encode_batch(texts[i : i + 512], add_special_tokens=False))
    return n / (time.perf_counter() - t0), n


class WorkerMemory:
    """Peak private memory and RSS per Ray worker process, sampled in a thread, with the process title
    (the task or actor it ran) at the moment of its private-memory peak."""

    def __init__(self) -> None:
        self.uss: dict[int, int] = {}
        self.rss: dict[int, int] = {}
        self.titles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        # The worker list is refreshed every 2 s (a scan of every process's cmdline); the workers'
        # statm is read every 0.2 s. Sampling costs the job well under 1% of two cores.
        workers: list[psutil.Process] = []
        tick = 0
        while not self._stop.is_set():
            if tick % 10 == 0:
                workers = [
                    p
                    for p in psutil.process_iter(["name", "cmdline"])
                    if "ray::" in (p.info["name"] or "")
                    or "default_worker.py" in " ".join(p.info["cmdline"] or [])
                ]
            tick += 1
            for p in workers:
                try:
                    mem = p.memory_info()
                    self.rss[p.pid] = max(self.rss.get(p.pid, 0), mem.rss)
                    private = mem.rss - mem.shared
                    if private > self.uss.get(p.pid, 0):
                        self.uss[p.pid] = private
                        self.titles[p.pid] = p.name()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self._stop.wait(0.2)

    def peak(self) -> tuple[int, int, str]:
        """(largest private memory, largest RSS, title of the process with the largest private memory)."""
        if not self.uss:
            return 0, 0, "-"
        top = max(self.uss, key=lambda pid: self.uss[pid])
        return self.uss[top], max(self.rss.values()), self.titles[top]

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(
    work: Path, demo_yaml: Path, corpus: Path, name: str
) -> tuple[float, int, WorkerMemory, dict[str, float]]:
    """The demo's config (tokenizer, seq_len 2048, bfd) on another corpus: (seconds, tokens, memory,
    seconds per stage)."""
    config = yaml.safe_load(demo_yaml.read_text())
    # The demo's input settings (its reject ratio: the stdlib's empty __init__.py files), other paths,
    # and generated ids: the copies of a source repeat its id.
    config["input"].update({"paths": [str(corpus / "*.jsonl.gz")], "id_field": None})
    config["output"]["path"] = str(work / f"out-{name}")
    # 2000 packs per file: full files at both corpus sizes, so a task writing one file holds the same
    # amount of data in both runs (with 10000, the 50 MB run makes one partial file).
    config["output"]["shard_rows"] = 2000
    cfg_path = work / f"{name}.yaml"
    cfg_path.write_text(yaml.safe_dump(config))
    cfg = load_config(str(cfg_path))
    with WorkerMemory() as mem:
        t0 = time.perf_counter()
        result = run_job(cfg, overwrite=True, log=lambda m: None)
        seconds = time.perf_counter() - t0
    return seconds, result.metrics.tokens, mem, result.stage_seconds


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=200, help="corpus size for the throughput ratio")
    parser.add_argument("--small-mb", type=int, default=50, help="the 4x smaller corpus for the memory check")
    parser.add_argument("--shard-mb", type=float, default=6.25, help="text per input shard")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    demo_yaml = demo_config(args.work / "demo")  # builds the stdlib corpus and the tokenizer once
    sources = sorted((args.work / "demo" / "corpus").glob("*.jsonl.gz"))
    tokenizer = args.work / "demo" / "tokenizer.json"

    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level=logging.ERROR)
    rows = []
    for mb in (args.small_mb, args.mb):
        corpus, texts = make_corpus(args.work, mb, args.shard_mb, sources)
        raw, raw_tokens = raw_tokens_per_second(tokenizer, texts)
        del texts
        seconds, tokens, mem, stage_seconds = run(args.work, demo_yaml, corpus, f"{mb}mb")
        assert tokens >= raw_tokens, "the job packed fewer tokens than the text holds"
        job = tokens / seconds
        uss, rss, title = mem.peak()
        rows.append((mb, uss, rss))
        stages = ", ".join(f"{k} {v:.1f} s" for k, v in stage_seconds.items())
        shards = len(list(corpus.glob("*.jsonl.gz")))
        print(
            f"{mb:>5} MB ({shards} shards): encode_batch alone {raw / 1e6:.3f} Mtok/s; whole job "
            f"{job / 1e6:.3f} Mtok/s ({seconds:.1f} s) = {100 * job / raw:.1f}% of the tokenizer; "
            f"largest worker peak private {uss / 2**20:.0f} MiB ({title}), RSS {rss / 2**20:.0f} MiB; "
            f"stages: {stages}",
            flush=True,
        )
    (small_mb, small_uss, small_rss), (large_mb, large_uss, large_rss) = rows
    print(
        f"worker peak memory, {large_mb} MB vs {small_mb} MB corpus: private {large_uss / 2**20:.0f} vs "
        f"{small_uss / 2**20:.0f} MiB (x{large_uss / max(small_uss, 1):.2f}); RSS "
        f"{large_rss / 2**20:.0f} vs {small_rss / 2**20:.0f} MiB (x{large_rss / max(small_rss, 1):.2f})"
    )
    print("targets (issue 3): job >= 85% of encode_batch tokens/s; worker peak flat when the corpus grows 4x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
