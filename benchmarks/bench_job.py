"""The whole job against the tokenizer alone, and worker memory as the corpus grows.

    python benchmarks/bench_job.py                  # 200 MB corpus (and 50 MB for the memory check)
    python benchmarks/bench_job.py --mb 400 --small-mb 100

Corpus: this Python's standard library sources, repeated with new ids until the size is reached, in
16 gzipped JSONL shards. Tokenizer: the demo's byte-level BPE (8192 tokens), trained once and cached.
Baseline: `encode_batch` (512 documents a call) over the same texts in this process, on all cores
(tokenizers parallelizes a batch itself), measured in the same run as the job. Job: `raypack pack`'s
run_job on local Ray with all cores, wall time from start to manifest. Memory: the peak resident set
of every Ray worker process, sampled every 0.2 s; the largest is reported for the small and the large
corpus (a job whose per-worker memory grows with the corpus would not scale to one larger than RAM).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
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

SHARDS = 16


def make_corpus(out: Path, mb: int, sources: list[Path]) -> tuple[Path, list[str]]:
    texts = []
    for path in sources:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f]
    corpus = out / f"corpus-{mb}mb"
    corpus.mkdir(parents=True, exist_ok=True)
    target = mb * 10**6
    written, all_texts, copy = 0, [], 0
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(gzip.open(corpus / f"part-{i:02d}.jsonl.gz", "wt", compresslevel=1))
            for i in range(SHARDS)
        ]
        while written < target:
            for i, text in enumerate(texts):
                handles[(copy * len(texts) + i) % SHARDS].write(json.dumps({"text": text}) + "\n")
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
    """Peak RSS per Ray worker process, sampled in a thread, with the process title (the task or actor
    it ran) at the moment of its peak."""

    def __init__(self) -> None:
        self.peaks: dict[int, int] = {}
        self.titles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for p in psutil.process_iter(["pid", "name", "cmdline"]):
                try:
                    cmd = " ".join(p.info["cmdline"] or [])
                    if "ray::" in (p.info["name"] or "") or "default_worker.py" in cmd:
                        rss = p.memory_info().rss
                        if rss > self.peaks.get(p.info["pid"], 0):
                            self.peaks[p.info["pid"]] = rss
                            self.titles[p.info["pid"]] = p.info["name"] or cmd[:60]
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self._stop.wait(0.2)

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run(work: Path, demo_yaml: Path, corpus: Path, name: str) -> tuple[float, int, int, str]:
    """The demo's config (tokenizer, seq_len 2048, bfd) on another corpus: (seconds, tokens, peak)."""
    config = yaml.safe_load(demo_yaml.read_text())
    config["input"] = {"paths": [str(corpus / "*.jsonl.gz")], "format": "jsonl"}
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
    top = max(mem.peaks, key=lambda pid: mem.peaks[pid], default=None)
    title = mem.titles.get(top, "-") if top is not None else "-"
    return seconds, result.metrics.tokens, mem.peaks.get(top, 0) if top is not None else 0, title


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=200, help="corpus size for the throughput ratio")
    parser.add_argument("--small-mb", type=int, default=50, help="the 4x smaller corpus for the memory check")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    demo_yaml = demo_config(args.work / "demo")  # builds the stdlib corpus and the tokenizer once
    sources = sorted((args.work / "demo" / "corpus").glob("*.jsonl.gz"))
    tokenizer = args.work / "demo" / "tokenizer.json"

    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, logging_level="ERROR")
    rows = []
    for mb in (args.small_mb, args.mb):
        corpus, texts = make_corpus(args.work, mb, sources)
        raw, raw_tokens = raw_tokens_per_second(tokenizer, texts)
        del texts
        seconds, tokens, worker_peak, title = run(args.work, demo_yaml, corpus, f"{mb}mb")
        assert tokens >= raw_tokens, "the job packed fewer tokens than the text holds"
        job = tokens / seconds
        rows.append((mb, raw, job, seconds, worker_peak))
        print(
            f"{mb:>5} MB: encode_batch alone {raw / 1e6:.3f} Mtok/s; whole job {job / 1e6:.3f} Mtok/s "
            f"({seconds:.1f} s) = {100 * job / raw:.1f}% of the tokenizer; "
            f"largest worker peak RSS {worker_peak / 2**20:.0f} MiB ({title})",
            flush=True,
        )
    small, large = rows
    print(
        f"worker peak memory, {large[0]} MB vs {small[0]} MB corpus: {large[4] / 2**20:.0f} vs "
        f"{small[4] / 2**20:.0f} MiB (x{large[4] / max(small[4], 1):.2f})"
    )
    print("targets (issue 3): job >= 85% of encode_batch tokens/s; worker peak flat when the corpus grows 4x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
