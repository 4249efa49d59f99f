"""This checkout's `raypack pack` against another revision's, in interleaved runs of the same job, with
`encode_batch_fast` timed in the same run: the only fair way to say what a change did on a shared
machine whose speed drifts through the day (the same baseline took 71-88 s on one day).

    python benchmarks/bench_against.py --rev 20f7abd --mb 500 --tokenizer large --rounds 5
    python benchmarks/bench_against.py --rev HEAD~3 --mb 10 --tokenizer demo --rounds 5 --no-baseline

The other revision is checked out with `git worktree` under --work (once), and run by this
environment's interpreter with that tree ahead of the installed raypack (the same dependencies).
Corpus and tokenizers: bench_job.py's (real source text in gzipped JSONL shards; the demo's 8k BPE, a
128k BPE trained here, or a real model's: bench_job.REAL). Each round runs the revision, then this
checkout, as a CLI process with run.executor auto (the default path), timed from start to exit; the
data files must be identical.
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

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job

from raypack.demo import demo_config

ROOT = Path(__file__).resolve().parents[1]
# Run a checkout's CLI with this interpreter: the editable install's finder would otherwise load
# this checkout's raypack whatever sys.path says.
_RUN = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path.insert(0, {tree!r})
from raypack.cli import run
run()
"""


def checkout(rev: str, work: Path) -> Path:
    tree = work / f"rev-{rev.replace('/', '_').replace('~', '_')}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev], check=True)
    return tree


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rev", required=True, help="the revision to run against (a commit, tag or branch)")
    parser.add_argument("--mb", type=int, default=500, help="corpus size (bench_job.py's corpus)")
    parser.add_argument("--tokenizer", choices=["demo", "large", *bench_job.REAL], default="large")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.tokenizer == "demo":
        demo_config(args.work / "demo")
        tokenizer = args.work / "demo" / "tokenizer.json"
    elif args.tokenizer == "large":
        tokenizer = bench_job.large_tokenizer(args.work)
    else:  # a real model's (bench_job.REAL: `make real-tokenizers` first)
        tokenizer = bench_job.real_tokenizer(args.work, args.tokenizer)
    corpus, texts = bench_job.make_corpus(args.work, args.mb)
    shards = len(list(corpus.glob("*.jsonl.gz")))
    print(f"{args.mb} MB: {len(texts):,} documents, {shards} shards, {args.tokenizer} tokenizer", flush=True)
    limit = None
    if args.baseline:
        procs_s, _ = bench_job.processes_seconds(tokenizer, texts)
        fast_s, _ = bench_job.encode_seconds(tokenizer, texts, fast=True)
        limit = min(fast_s, procs_s)
        print(f"encode_batch_fast {fast_s:.1f} s, in one-thread processes {procs_s:.1f} s", flush=True)
    tree = checkout(args.rev, args.work)
    bench_job.compile_package(tree)
    runner = args.work / f"run-{tree.name}.py"
    runner.write_text(_RUN.format(tree=str(tree)))
    commands = {args.rev: [sys.executable, str(runner)], "this": [sys.executable, "-m", "raypack.cli"]}
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    # The processes the command starts (a local pool's zygote: `python -m raypack.engine.zygote`)
    # import raypack before they hear the driver's sys.path: without the tree on PYTHONPATH they ran
    # this checkout's code under the other revision's driver (before 2026-11-27, so did every
    # comparison made with this script: only the driver's code differed).
    envs = {args.rev: {**env, "PYTHONPATH": str(tree)}, "this": env}
    seconds: dict[str, list[float]] = {name: [] for name in commands}
    digests: dict[str, str] = {}
    for r in range(args.rounds):
        for name, command in commands.items():
            out = args.work / f"against-{args.mb}-{args.tokenizer}-{'rev' if name == args.rev else 'this'}"
            config = {
                "input": {"paths": [str(corpus / "*.jsonl.gz")], "max_reject_ratio": 0.05},
                "tokenizer": {"path": str(tokenizer)},
                "pack": {"seq_len": 8192},
                "output": {"path": str(out)},
            }
            path = args.work / f"against-{'rev' if name == args.rev else 'this'}.yaml"
            path.write_text(yaml.safe_dump(config))
            t0 = time.perf_counter()
            done = subprocess.run(
                [*command, "pack", str(path), "--overwrite", "--quiet"],
                env=envs[name],
                cwd=args.work,  # not this checkout: `python -m` puts the working directory first
                capture_output=True,
                text=True,
            )
            took = time.perf_counter() - t0
            if done.returncode:
                raise SystemExit(f"{name}: raypack pack failed:\n{done.stderr[-2000:]}")
            stages = json.loads((out / "metrics.json").read_text())["stage_seconds"]
            seconds[name].append(took)
            digests[name] = bench_job.data_digest(out)
            print(
                f"round {r + 1} {name}: {took:.2f} s (tokenize {stages['tokenize']:.2f}, assign+write "
                f"{stages['assign+write']:.2f}, the rest {took - sum(stages.values()):.2f})",
                flush=True,
            )
    for name, values in seconds.items():
        median = statistics.median(values)
        ratio = f" = x{limit / median:.2f} encode_batch_fast" if limit else ""
        print(f"{name}: median {median:.2f} s of {', '.join(f'{v:.2f}' for v in values)}{ratio}")
    same = len(set(digests.values())) == 1
    print(f"data files identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
