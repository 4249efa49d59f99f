"""What a mixture (input.sources) costs over a plain job of the same output size, on real text.

    python benchmarks/bench_mixture.py                  # 130 MB, the demo tokenizer, 3 rounds
    python benchmarks/bench_mixture.py --mb 30 --rounds 2
    python benchmarks/bench_mixture.py --mb 30 --rounds 1 --weights 0.5,0.3,0.2   # issue 41's shares

Corpus: bench_job's (real source text, gzipped JSONL shards), its shards dealt into three sources in
turn. Mixture: web repeat 1.5, code whole, books repeat 0.5, so its output is about the corpus's
size (web and books hold about as many tokens); plain: the same shards as input.paths. Each runs as
`raypack rebuild` into a root of its own: the first run of each tokenizes and fills its token cache,
the timed rounds after it (alternating plain, mixture, to share the machine's noise) reuse it, so
they time what differs: selecting (the select stage: boundary and select tasks over the index
files), ranking copies and the larger assign+write. seq_len 8192, bfd. Reported: medians of the
rounds' whole command and stage seconds, output tokens, and each source's realized share against
its target. `--weights a,b,c`: the sources by weight instead (issue 41: 0.5,0.3,0.2), and the
largest document's share of the output beside the shares: a cut between whole documents could miss
a share by half of it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import make_corpus

from raypack.dataset.layout import latest_version, version_name
from raypack.demo import demo_config

SOURCES = {"web": {"repeat": 1.5}, "code": {}, "books": {"repeat": 0.5}}


def write_config(work: Path, name: str, inputs: dict[str, Any], tokenizer: Path) -> Path:
    config = {
        "input": {**inputs, "max_reject_ratio": 0.05},
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": 8192},
        "output": {"path": str(work / f"mix-root-{name}"), "keep_versions": 2},
    }
    path = work / f"mix-{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def rebuild(config: Path) -> tuple[float, dict[str, Any]]:
    raypack = Path(sys.executable).parent / "raypack"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    done = subprocess.run([str(raypack), "rebuild", str(config)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"raypack rebuild failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    root = Path(yaml.safe_load(config.read_text())["output"]["path"])
    out = root / version_name(latest_version(str(root)) or 0)
    return seconds, json.loads((out / "metrics.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=130)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    parser.add_argument("--weights", help="a,b,c: web, code and books by weight (e.g. 0.5,0.3,0.2)")
    args = parser.parse_args()
    rules = dict(SOURCES)
    if args.weights:
        rules = {n: {"weight": float(w)} for n, w in zip(SOURCES, args.weights.split(","), strict=True)}
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, texts = make_corpus(args.work, args.mb)
    tokenizer = Path(yaml.safe_load(demo_config(args.work / "demo").read_text())["tokenizer"]["path"])
    shards = sorted(corpus.glob("*.jsonl.gz"))
    names = list(SOURCES)
    sources = [
        {"name": n, "paths": [str(p) for p in shards[i :: len(names)]], **rules[n]}
        for i, n in enumerate(names)
    ]
    configs = {
        "plain": write_config(args.work, "plain", {"paths": [str(p) for p in shards]}, tokenizer),
        "mixture": write_config(args.work, "mixture", {"sources": sources}, tokenizer),
    }
    for name, config in configs.items():
        subprocess.run(["rm", "-rf", str(args.work / f"mix-root-{name}")], check=True)
        seconds, _ = rebuild(config)
        print(f"{name}: first run (tokenizes, fills the cache) {seconds:.1f} s", flush=True)
    runs: dict[str, list[tuple[float, dict[str, Any]]]] = {n: [] for n in configs}
    for r in range(args.rounds):
        for name, config in configs.items():
            seconds, metrics = rebuild(config)
            runs[name].append((seconds, metrics))
            stages = ", ".join(f"{k} {v:.1f}" for k, v in metrics["stage_seconds"].items())
            print(f"round {r + 1} {name}: {seconds:.1f} s ({stages})", flush=True)
    print("\n| job | command s (median) | select s | assign+write s | output tokens | packs |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, rows in runs.items():
        total = statistics.median(s for s, _ in rows)
        select = statistics.median(m["stage_seconds"].get("select", 0.0) for _, m in rows)
        write = statistics.median(m["stage_seconds"]["assign+write"] for _, m in rows)
        m = rows[-1][1]["metrics"]
        print(f"| {name} | {total:.1f} | {select:.1f} | {write:.1f} | {m['tokens']:,} | {m['packs']:,} |")
    mixed = runs["mixture"][-1][1]
    print(
        "\n| source | asked | tokens in | target | tokens out | off target | share (target) | partial copy |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for s in mixed["sources"]:
        print(
            f"| {s['name']} | {s['asked']} | {s['tokens']:,} | {s['target']:,} | {s['selected']:,} | "
            f"{s['off_target']:+,} | {100 * s['share']:.2f}% ({100 * s['target_share']:.2f}%) | "
            f"{s.get('partial', 0):,} |"
        )
    root = args.work / "mix-root-mixture"
    index = pq.read_table(root / version_name(latest_version(str(root)) or 0) / "index", columns=["length"])
    longest = int(pc.max(index.column("length")).as_py())
    print(
        f"\nlargest document: {longest:,} tokens, "
        f"{100 * longest / mixed['metrics']['tokens']:.2f}% of the output"
    )
    ratio = statistics.median(s for s, _ in runs["mixture"]) / statistics.median(s for s, _ in runs["plain"])
    text_mb = sum(map(len, texts)) / 1e6
    print(f"\nmixture / plain, whole command (token cache warm): x{ratio:.2f}; text {text_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
