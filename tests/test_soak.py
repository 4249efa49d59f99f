"""Soak tier (`make soak`, marked slow: not in the default CI run): pack corpora larger than the Ray
object store, so that blocks spill, and one document of tens of millions of tokens; verify both and
report peak memory per process and total time.

Each job runs `raypack pack` in a process of its own that starts local Ray with a small object store
(OBJECT_STORE_MB), the way a user's driver would, so the test session's Ray is not involved.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow.parquet as pq
import pytest

from raypack.verifier import verify
from tests.conftest import WORDS, job_config

pytestmark = pytest.mark.slow

OBJECT_STORE_MB = 100  # Ray's floor is 75 MB

# Spilled objects go to a directory the test watches (the default is inside Ray's session dir).
_DRIVER = """
import json, sys, ray
spill = {{"type": "filesystem", "params": {{"directory_path": sys.argv[2]}}}}
ray.init(num_cpus=2, object_store_memory={store} << 20, include_dashboard=False, logging_level="ERROR",
         _system_config={{"object_spilling_config": json.dumps(spill)}})
from raypack.cli import main
sys.exit(main(["pack", sys.argv[1]]))
"""


def _write_corpus(root: Path, shards: int, docs_per_shard: int, words_per_doc: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    vocab = np.array(WORDS)
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for s in range(shards):
        lengths = rng.integers(1, 2 * words_per_doc, size=docs_per_shard)
        with (corpus / f"part-{s:04d}.jsonl").open("w") as f:
            for n in lengths:
                f.write(json.dumps({"text": " ".join(vocab[rng.integers(0, len(vocab), n)])}) + "\n")
    return corpus


class ProcessTreeMemory:
    """Peak private memory (rss - shared) of every process under `root`, and the most bytes found in
    the spill directory at once, sampled every 0.2 s (the process list every 2 s: walking every
    process that often would take a core from the job)."""

    def __init__(self, root: int, spill_dir: Path) -> None:
        self.root = psutil.Process(root)
        self.spill_dir = spill_dir
        self.peaks: dict[str, int] = {}
        self.spilled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        procs: list[psutil.Process] = []
        tick = 0
        while not self._stop.is_set():
            if tick % 10 == 0:
                try:
                    procs = [self.root, *self.root.children(recursive=True)]
                except psutil.NoSuchProcess:
                    return
            tick += 1
            for p in procs:
                try:
                    m = p.memory_info()
                    key = f"{p.pid} {p.name()}"
                    self.peaks[key] = max(self.peaks.get(key, 0), m.rss - m.shared)
                except psutil.Error:
                    pass
            spilled = 0
            for f in self.spill_dir.rglob("*"):
                with contextlib.suppress(OSError):  # a spilled file deleted while we looked
                    spilled += f.stat().st_size if f.is_file() else 0
            self.spilled = max(self.spilled, spilled)
            self._stop.wait(0.2)

    def stop(self) -> list[tuple[str, int]]:
        self._stop.set()
        self._thread.join()
        return sorted(self.peaks.items(), key=lambda kv: -kv[1])


def _run_pack(config: Path, spill_dir: Path) -> tuple[float, int, list[tuple[str, int]]]:
    spill_dir.mkdir()
    t0 = time.perf_counter()
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER.format(store=OBJECT_STORE_MB), str(config), str(spill_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    memory = ProcessTreeMemory(driver.pid, spill_dir)
    _, err = driver.communicate(timeout=3600)
    seconds = time.perf_counter() - t0
    peaks = memory.stop()
    assert driver.returncode == 0, err[-3000:]
    return seconds, memory.spilled, peaks


def _report(name: str, seconds: float, spilled: int, peaks: list[tuple[str, int]]) -> None:
    print(f"\n[soak] {name}: {seconds:.0f} s; at most {spilled / 2**20:.0f} MiB spilled at once")
    for key, peak in peaks[:6]:
        print(f"[soak]   peak private {peak / 2**20:7.0f} MiB  {key}")


def test_a_corpus_four_times_the_object_store_spills_and_verifies(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    # 48 shards x 1,000 documents x ~2,300 tokens: ~110M tokens, ~440 MB of int32 tokens that the
    # pack shuffle moves through a 100 MB object store.
    corpus = _write_corpus(tmp_path, shards=48, docs_per_shard=1000, words_per_doc=2300, seed=1)
    config = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": 4096}, output={"shard_rows": 2000}
    )
    seconds, spilled, peaks = _run_pack(config, tmp_path / "spill")
    _report("4x object store", seconds, spilled, peaks)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["tokens"] * 4 > 4 * (OBJECT_STORE_MB << 20)
    assert spilled > 0, "nothing spilled: the corpus did not exceed the object store"
    report = verify(str(tmp_path / "out"))
    assert report.ok, report.problems
    assert report.documents == 48_000 and report.tokens == manifest["counts"]["tokens"]


def test_a_document_of_thirty_million_tokens(tmp_path: Path, tokenizer_path: Path) -> None:
    """One JSON line of ~165 MB: read as one record, encoded in 1 MiB pieces, cut into 4096-token
    chunks; no process may hold it as Python ints or Encodings (that would be ~4 GB)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = np.random.default_rng(2)
    vocab = np.array(WORDS)
    with (corpus / "huge.jsonl").open("w") as f:
        f.write(json.dumps({"text": "a small one"}) + "\n")
        words = [" ".join(vocab[rng.integers(0, len(vocab), 1_000_000)]) for _ in range(30)]
        f.write(json.dumps({"text": " ".join(words)}) + "\n")
        del words
    config = job_config(
        tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": 4096}, output={"shard_rows": 1000}
    )
    seconds, spilled, peaks = _run_pack(config, tmp_path / "spill")
    _report("30M-token document", seconds, spilled, peaks)
    index = {r["doc_id"]: r for r in pq.read_table(tmp_path / "out" / "index").to_pylist()}
    assert index["huge.jsonl:2"]["length"] >= 30_000_000
    assert index["huge.jsonl:2"]["chunks"] == -(-index["huge.jsonl:2"]["length"] // 4096)
    # Encoded whole, the document would take ~4 GB of Encodings and Python ints in one actor.
    assert peaks[0][1] < 2 << 30, f"a process peaked at {peaks[0][1] >> 20} MiB"
    report = verify(str(tmp_path / "out"))
    assert report.ok, report.problems
