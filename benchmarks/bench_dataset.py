"""A Ray Dataset as input against the same rows as Parquet files (issue 41).

    python benchmarks/bench_dataset.py                  # 130 MB, the 128k BPE, 2 rounds
    python benchmarks/bench_dataset.py --mb 40 --rounds 3 --tokenizer tekken

Corpus: bench_job.py's real source text (its first --mb MB), a document a source file, written as
32 Parquet files (text and id columns). In one process, on one local Ray (--cpus): each round packs
the files (`raypack.pack`, run.executor ray) and the same rows as `ray.data.read_parquet(...)`
(`raypack.pack(dataset=...)`), and times `read_parquet(...).materialize()` alone (what the Dataset
path adds before tokenizing). Baseline: encode_batch_fast of the same texts in one process. The
data files of the two jobs must be byte-identical (checked). Ratios are within a round; rounds
interleave.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import bench_job

FILES = 32


def write_parquet(work: Path, mb: int, texts: list[str]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = work / f"parquet-{mb}mb"
    if (root / "done").exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    per = -(-len(texts) // FILES)
    for f in range(FILES):
        part = texts[f * per : (f + 1) * per]
        ids = [f"doc-{f * per + i}" for i in range(len(part))]
        pq.write_table(pa.table({"text": part, "id": ids}), root / f"part-{f:03d}.parquet")
    (root / "done").write_text("ok")
    return root


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=130)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--tokenizer", default="bpe-131072", help="bpe-131072 or one of bench_job.REAL")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()

    import ray

    import raypack

    args.work.mkdir(parents=True, exist_ok=True)
    _, texts = bench_job.make_corpus(args.work, args.mb)
    tokenizer = (
        bench_job.large_tokenizer(args.work)
        if args.tokenizer == "bpe-131072"
        else bench_job.real_tokenizer(args.work, args.tokenizer)
    )
    corpus = write_parquet(args.work, args.mb, texts)
    mb = sum(len(t.encode()) for t in texts) / 1e6
    baseline, tokens = bench_job.encode_seconds(tokenizer, texts, fast=True)
    print(f"{len(texts):,} documents, {mb:.0f} MB, {tokens:,} tokens; encode_batch_fast {baseline:.1f} s")
    ray.init(num_cpus=args.cpus, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    out = Path(tempfile.mkdtemp(prefix="bench-dataset-"))

    def config(name: str, **inputs: object) -> dict[str, object]:
        return {
            "input": {"id_field": "id", **inputs},
            "tokenizer": {"path": str(tokenizer)},
            "pack": {"seq_len": 8192},
            "output": {"path": str(out / name)},
            "run": {"executor": "ray"},
        }

    rows: dict[str, list[float]] = {"files": [], "dataset": [], "materialize": [], "tokenize (dataset)": []}
    for r in range(args.rounds):
        t0 = time.perf_counter()
        raypack.pack(
            config("files", paths=[f"{corpus}/*.parquet"], format="parquet"),
            overwrite=True,
            log=lambda _: None,
        )
        rows["files"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ray.data.read_parquet(str(corpus)).materialize()
        rows["materialize"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        record = raypack.pack(
            config("dataset"), dataset=ray.data.read_parquet(str(corpus)), overwrite=True, log=lambda _: None
        )
        rows["dataset"].append(time.perf_counter() - t0)
        rows["tokenize (dataset)"].append(record.stage_seconds["tokenize"])
        same = bench_job.data_digest(out / "files") == bench_job.data_digest(out / "dataset")
        print(
            f"round {r + 1}: files {rows['files'][-1]:.1f} s, dataset {rows['dataset'][-1]:.1f} s "
            f"(x{rows['dataset'][-1] / rows['files'][-1]:.2f}; read_parquet().materialize() alone "
            f"{rows['materialize'][-1]:.1f} s), data {'identical' if same else 'DIFFERENT'}"
        )
        if not same:
            return 1
    print("\n| | median | × encode_batch_fast |\n|---|---:|---:|")
    for name, times in rows.items():
        m = statistics.median(times)
        print(f"| {name} | {m:.1f} s | ×{baseline / m:.2f} |")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
