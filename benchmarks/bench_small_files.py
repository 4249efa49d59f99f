"""Many small files against the same bytes in a few files (issue 40): runs of small files.

    python benchmarks/bench_small_files.py                       # 10,000 files, default path and Ray
    python benchmarks/bench_small_files.py --files 2000 --no-ray --alone

Corpus: bench_job.py's real source text (its first --mb MB), cut into documents of up to 2,000
characters, written twice: as --files JSONL files of equal document counts (~6 KB each at 59 MB,
in 100 directories), and as 32 files. Each is packed by `raypack pack` in a subprocess (seq_len
8192, bfd, the default backend), timed from the command's start to its exit, on the default
executor (run.executor auto: local processes at this size) and with run.executor ray (a local Ray
started by the command). `--alone`: the many files also with input.group_bytes 0 (a file a unit,
how raypack read them before runs). The data files of every configuration of one corpus must be
byte-identical (checked; the two corpora's differ: ids name the files). Ratios are many / few on
the same runner, within one round; rounds interleave.
Target: many / few <= 1.5 on both runners.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job

DOC_CHARS = 2_000
FEW = 32


def make_corpora(work: Path, mb: int, files: int) -> tuple[Path, Path, int]:
    """(many, few, documents): the same documents in `files` and in FEW JSONL files."""
    docs: list[str] = []
    total = 0
    for text in bench_job.source_texts():
        for i in range(0, len(text), DOC_CHARS):
            docs.append(text[i : i + DOC_CHARS])
            total += len(docs[-1].encode())
        if total >= mb * 10**6:
            break
    many, few = work / f"small-{mb}mb-{files}", work / f"small-{mb}mb-{FEW}"
    for root, count in ((many, files), (few, FEW)):
        marker = root / "done"
        if marker.exists() and marker.read_text() == str(len(docs)):
            continue
        shutil.rmtree(root, ignore_errors=True)
        per = -(-len(docs) // count)
        for f in range(count):
            part = docs[f * per : (f + 1) * per]
            folder = root / f"d{f * 100 // count:03d}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{f:06d}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in part))
        marker.write_text(str(len(docs)))
    return many, few, len(docs)


def run(work: Path, name: str, corpus: Path, tokenizer: Path, executor: str, **inputs: object) -> dict:
    seconds, metrics, _ = bench_job.run_command(
        work,
        corpus,
        tokenizer,
        f"small-{name}",
        pattern="**/*.jsonl",
        backend="auto",
        sections={"run": {"executor": executor}},
        **inputs,
    )
    return {
        "seconds": seconds,
        "stages": metrics["stage_seconds"],
        "units": sum(metrics["shards"].values()),
        "digest": bench_job.data_digest(work / f"out-small-{name}"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=int, default=59)
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-ray", action="store_true", help="the default executor only")
    parser.add_argument("--alone", action="store_true", help="also a file a unit (input.group_bytes 0)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = bench_job.large_tokenizer(args.work)
    many, few, documents = make_corpora(args.work, args.mb, args.files)
    print(f"{documents:,} documents, {args.mb} MB: {args.files:,} files and {FEW} files", flush=True)
    executors = ["auto"] if args.no_ray else ["auto", "ray"]
    digests: dict[str, set[str]] = {"few": set(), "many": set()}
    ratios: dict[str, list[float]] = {e: [] for e in executors}
    for r in range(args.rounds):
        for executor in executors:
            runs = {
                "few": run(args.work, f"few-{executor}", few, tokenizer, executor),
                "many": run(args.work, f"many-{executor}", many, tokenizer, executor),
            }
            if args.alone and executor == "auto":
                runs["alone"] = run(args.work, "alone", many, tokenizer, executor, group_bytes=0)
            for name, result in runs.items():
                digests["few" if name == "few" else "many"].add(result["digest"])
                stages = ", ".join(f"{k} {v:.2f}" for k, v in result["stages"].items() if v >= 0.05)
                print(
                    f"round {r + 1} {executor:4} {name:5}: {result['seconds']:6.2f} s, "
                    f"{result['units']:,} units ({stages})",
                    flush=True,
                )
            ratios[executor].append(runs["many"]["seconds"] / runs["few"]["seconds"])
            print(f"round {r + 1} {executor}: many / few x{ratios[executor][-1]:.2f}", flush=True)
    for corpus, found in digests.items():
        if len(found) != 1:
            raise SystemExit(f"the {corpus} files were packed as {len(found)} different datasets")
    for executor, values in ratios.items():
        print(f"{executor}: median many / few x{statistics.median(values):.2f} over {args.rounds} rounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
