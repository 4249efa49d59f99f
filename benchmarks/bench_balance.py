"""Attention-balanced batches (reader balance="attention"): how even a step's ranks' costs are,
balanced against unbalanced, and what balancing costs when a reader opens a large dataset.

    python benchmarks/bench_balance.py                       # both parts
    python benchmarks/bench_balance.py --skip-open           # the imbalance figures alone
    python benchmarks/bench_balance.py --skip-imbalance --skip-reading --baseline /tmp/old  # the open
    python benchmarks/bench_balance.py --dataset out/ --world 8 --batch 2   # and a dataset's

Corpus: a long-document corpus drawn with a documented heavy tail (real long-context corpora are
not on this machine): a lognormal body (median 1,024 tokens, σ 1.5, web-like) and 3% of documents
from a Pareto tail (from 8,192 tokens, α 1.1: books, code repositories), clipped to 16..262,144
tokens; `--docs` documents a draw, packed by raypack's bfd at 32k and 64k (documents past seq_len cut
into chunks), packs in bfd's seeded order, as a dataset's sequence is. Each of `--seeds` draws is a
corpus of its own; `--large-docs` adds one draw that large, whose ranks' shares pass 1,024 packs
(4 ranks a neighbourhood, as at any larger scale).

Imbalance: the mean over steps of max / mean rank cost, a rank's cost Σ l² + per_token · Σ l of its
documents; unbalanced as the reader splits whole rounds (rank r the r-th world-th of the order,
batch packs a step), balanced by raypack.balance.balanced_steps given those shares (its
"neighbourhood": the ranks a pack may move among); per_token 0 (attention alone, the
128k-context regime) and the default (raypack.balance.ATTENTION_PER_TOKEN, a 7-8B model). The
shuffle check: Spearman's ρ of a step's mean cost against its index, balanced and unbalanced
(4/√steps: four standard errors of ρ where steps are independent; a window's steps share its mean,
so with few windows ρ strays further, as the unbalanced order's does).
Figures: the median over draws, and the lowest and highest.

Open: a dataset of `--open-packs` packs whose pack index is real raypack pack index files (1,024
packs a row group, zstd, as raypack writes them; doc_offsets tiled from the first draw's bfd packs
at 32k), listed by a megatron-format manifest (the open reads no token, so its .bin files are not
written). Each round opens rank 0's Plan at 8 and at 64 ranks × 2, each in a fresh process (its
wall time and peak RSS, pandas imported first as a reader's first batch imports it): unbalanced,
balanced, an elastic resume of a balanced run (64 ranks stopped half-way, resumed balanced at
this world size) and, with `--baseline DIR` (a raypack checkout of another commit, e.g.
`git archive <commit> raypack | tar -x -C DIR`), that raypack's balanced open and resume; in interleaved
rounds, their order rotating; medians and the spread, and each one's extra seconds over the
unbalanced open of its round.

Reading: on that dataset, the row groups a rank decodes over its epoch at 8 and 64 ranks × 2,
unbalanced and balanced, counted through the reader's own streams and cache (a decode gives a table
of the group's row count: nothing is read, so the .bin files need not exist).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack.balance import ATTENTION_PER_TOKEN, Balance, balanced_steps, imbalance, neighbourhood, step_costs
from raypack.formats import PARQUET_SETTINGS, ROW_GROUP_ROWS
from raypack.packing import pack
from raypack.reader import Plan, attention_imbalance, iter_batches, pin
from raypack.schema import OUTPUT_SCHEMA_VERSION

CONFIGS = ((8, 2), (64, 2), (64, 1), (64, 4))


def corpus(docs: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    body = rng.lognormal(np.log(1024), 1.5, docs)
    tail = 8192 * (1 + rng.pareto(1.1, docs))
    return np.clip(np.where(rng.random(docs) < 0.03, tail, body), 16, 262_144).astype(np.int64)


def packed(lengths: np.ndarray, seq_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(pack id, length) of every item, packs in bfd's seeded order."""
    a = pack(lengths, seq_len, "bfd", seed=seed)
    return a.pack.astype(np.int64), a.items.length.astype(np.float64)


def unbalanced(costs: np.ndarray, world: int, batch: int) -> np.ndarray:
    steps = len(costs) // (world * batch)
    return costs[: steps * world * batch].reshape(world, steps, batch).sum(axis=2).T


def spearman(values: np.ndarray) -> float:
    ranks = np.argsort(np.argsort(values))
    return float(np.corrcoef(np.arange(len(values)), ranks)[0, 1])


def imbalance_figures(docs: int, seeds: int) -> list[dict[str, object]]:
    rows: dict[tuple[int, float, int, int], dict[str, list[float]]] = {}
    for seed in range(seeds):
        lengths = corpus(docs, seed)
        for seq_len in (32_768, 65_536):
            pack_of, item = packed(lengths, seq_len, seed)
            squares = np.bincount(pack_of, weights=item * item)
            tokens = np.bincount(pack_of, weights=item)
            for per_token in (0.0, ATTENTION_PER_TOKEN):
                costs = squares + per_token * tokens
                for world, batch in CONFIGS:
                    n = len(costs) // (world * batch) * world * batch
                    t0 = time.perf_counter()
                    shares = np.full(world, n // world)
                    step, rank = balanced_steps(costs[:n], shares, batch, key=seed)
                    seconds = time.perf_counter() - t0
                    per_rank = step_costs(costs[:n], step, rank, world)
                    row = rows.setdefault((seq_len, per_token, world, batch), {})
                    for name, value in (
                        ("packs", float(n)),
                        ("neighbourhood", float(neighbourhood(world, batch, n // world // batch))),
                        ("unbalanced", imbalance(unbalanced(costs, world, batch))),
                        ("balanced", imbalance(per_rank)),
                        ("rho", spearman(per_rank.mean(axis=1))),
                        ("rho_unbalanced", spearman(unbalanced(costs, world, batch).mean(axis=1))),
                        ("rho_bound", 4 / np.sqrt(len(per_rank))),
                        ("seconds", seconds),
                    ):
                        row.setdefault(name, []).append(value)
    out = []
    for (seq_len, per_token, world, batch), row in rows.items():
        figure: dict[str, object] = {
            "seq_len": seq_len,
            "per_token": per_token,
            "world": world,
            "batch": batch,
        }
        for name, values in row.items():
            figure[name] = [round(float(np.median(values)), 4), round(min(values), 4), round(max(values), 4)]
        out.append(figure)
    return out


def write_index_dataset(root: Path, packs: int, seq_len: int = 32_768) -> Path:
    """A megatron-format manifest over real pack index files of `packs` packs (module docstring)."""
    done = root / "manifest.json"
    if done.exists():
        return root
    (root / "packs").mkdir(parents=True, exist_ok=True)
    pack_of, item = packed(corpus(400_000, 0), seq_len, 0)
    order = np.argsort(pack_of, kind="stable")
    counts = np.bincount(pack_of)
    ends = np.cumsum(item[order]).astype(np.int64)
    starts = np.r_[0, np.cumsum(counts)[:-1]]
    base = np.r_[0, ends][starts]
    offsets = [
        np.r_[0, ends[s : s + c] - b].astype(np.int32) for s, c, b in zip(starts, counts, base, strict=True)
    ]
    per_file, files = 16 * ROW_GROUP_ROWS, []
    for part, first in enumerate(range(0, packs, per_file)):
        rows = min(per_file, packs - first)
        chosen = [offsets[(first + i) % len(offsets)] for i in range(rows)]
        lists = pa.array(chosen, type=pa.list_(pa.int32()))
        items = np.array([len(o) - 1 for o in chosen])
        ids = pc.cast(pa.array(np.arange(items.sum()) + first * 64), pa.string())
        table = pa.table(
            {
                "doc_offsets": lists,
                "doc_ids": pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(items)], pa.int32()), ids),
                "chunk_index": pa.ListArray.from_arrays(
                    pa.array(np.r_[0, np.cumsum(items)], pa.int32()),
                    pa.array(np.zeros(items.sum(), np.int32)),
                ),
                "num_tokens": pa.array([int(o[-1]) for o in chosen], pa.int32()),
            }
        )
        stem = f"part-{part:05d}"
        pq.write_table(table, root / "packs" / f"{stem}.parquet", **PARQUET_SETTINGS)
        groups = [min(ROW_GROUP_ROWS, rows - g) for g in range(0, rows, ROW_GROUP_ROWS)]
        files.append(
            {
                "path": f"data/{stem}.bin",
                "index": f"packs/{stem}.parquet",
                "bucket_length": seq_len,
                "rows": rows,
                "row_groups": groups,
            }
        )
    manifest = {
        "schema_version": OUTPUT_SCHEMA_VERSION,
        "counts": {"packs": packs},
        "files": files,
        "format": {"name": "megatron", "pad_id": 0, "dtype": "int32", "eos_id": 0, "loss_mask": False},
    }
    done.write_text(json.dumps(manifest))
    return root


OPEN = """
import json, sys, time
# pyarrow's first to_numpy imports pandas (~0.5 s, ~45 MB): a reader's first batch does, balanced or
# not; imported first so that each figure is the plan's own.
import pandas
from raypack.balance import Balance
from raypack.reader import Plan, Resume, pin
path, kind, world = sys.argv[1], sys.argv[2], int(sys.argv[3])
resume = None
if kind == "resume":  # a balanced run of 64 ranks x 2 stopped half-way through the epoch
    # its steps from the manifest (a Plan made here would warm what the timed open loads first)
    packs = sum(f["rows"] for f in json.load(open(path + "/manifest.json"))["files"])
    steps = -(-(-(-packs // 64)) // 2)
    state = {"batch_size": 2, "world_size": 64, "seed": 1, "last_batch": "short", "next_step": steps // 2,
             "balance": Balance().to_state(), "resumed_from": None}
    resume = Resume.of(state)[0]
t0 = time.perf_counter()
balance = None if kind == "unbalanced" else Balance()
plan = Plan.of(pin(path), 2, 0, world, 1, "short", None, resume, balance)
seconds = time.perf_counter() - t0
# VmHWM: this process's own peak (ru_maxrss would carry the parent's across fork and exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "steps": len(plan.schedule), "peak_rss_mb": hwm / 1024}))
"""


def _open(root: Path, kind: str, world: int, code: Path) -> dict[str, float]:
    """One rank's open in a fresh process, importing raypack from `code` (its directory the
    process's first path entry)."""
    out = subprocess.run(
        [sys.executable, "-c", OPEN, str(root), kind, str(world)],
        check=True,
        capture_output=True,
        text=True,
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
    )
    return json.loads(out.stdout)


def _spread(xs: list[float]) -> list[float]:
    return [round(float(np.median(xs)), 2), round(min(xs), 2), round(max(xs), 2)]


def open_figures(
    root: Path, rounds: int, worlds: tuple[int, ...], baseline: Path | None
) -> list[dict[str, object]]:
    """Rank 0's open at each world size × 2 packs, unbalanced, balanced, balanced by the `baseline`
    raypack (a checkout of another commit, if given) and an elastic resume of a balanced run (64
    ranks stopped half-way) at this world size, in interleaved rounds (their order rotating):
    medians and the spread of seconds and peak RSS, and balanced's extra seconds paired."""
    code = Path(__file__).resolve().parents[1]
    kinds = [("unbalanced", "unbalanced", code), ("balanced", "balanced", code), ("resume", "resume", code)]
    if baseline is not None:
        kinds += [("baseline_balanced", "balanced", baseline), ("baseline_resume", "resume", baseline)]
    out = []
    for world in worlds:
        runs: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in kinds}
        for k in range(rounds):
            for name, kind, where in kinds[k % len(kinds) :] + kinds[: k % len(kinds)]:
                runs[name].append(_open(root, kind, world, where))
        figures: dict[str, object] = {"world": world, "batch": 2}
        for name, values in runs.items():
            for key in ("seconds", "peak_rss_mb"):
                figures[f"{name}_{key}"] = _spread([v[key] for v in values])
        for name in (n for n, _, _ in kinds[1:]):
            extra = [b["seconds"] - u["seconds"] for u, b in zip(runs["unbalanced"], runs[name], strict=True)]
            figures[f"{name}_extra_seconds"] = _spread(extra)
        out.append(figures)
    return out


def decoded_groups(plan: Plan) -> int:
    """The row groups the plan's rank decodes over its epoch: its streams as the reader runs them
    (the same cache), each group's decode a table of its row count (nothing read)."""
    count = 0

    def load(bucket: int, group: int) -> pa.Table:
        nonlocal count
        count += 1
        return pa.table({"row": np.arange(plan.buckets[bucket].groups[group].rows)})

    streams = plan._streams(0, load)
    for b in plan.schedule.tolist():
        streams[b].take(plan.batch_size)
    return count


def reading_figures(root: Path, worlds: tuple[int, ...], batch: int) -> list[dict[str, object]]:
    """Row groups a rank decodes over its epoch, unbalanced and balanced, for ranks 0, the middle
    one and the last (ranks alike), and the dataset's groups / world."""
    pinned = pin(str(root))
    groups = sum(len(f["row_groups"]) for f in pinned.manifest["files"])
    out = []
    for world in worlds:
        ranks = sorted({0, world // 2, world - 1})
        row: dict[str, object] = {"world": world, "batch": batch, "groups": groups, "ranks": ranks}
        for name, balance in (("unbalanced", None), ("balanced", Balance())):
            row[name] = [
                decoded_groups(Plan.of(pinned, batch, r, world, 1, "short", None, None, balance))
                for r in ranks
            ]
        row["groups_per_world"] = round(groups / world, 2)
        row["ratio"] = round(max(row["balanced"]) / max(row["unbalanced"]), 2)  # type: ignore[arg-type]
        out.append(row)
    return out


def read_figures(path: str, world: int, batch: int, rounds: int) -> dict[str, object]:
    """Every rank's epoch read in one process, unbalanced and balanced in interleaved rounds (their
    order alternating), after an untimed pass of each: seconds, and balanced over unbalanced."""

    def epoch(balance: str | None) -> float:
        t0 = time.perf_counter()
        for rank in range(world):
            for _ in iter_batches(path, batch, rank, world, seed=1, last_batch="short", balance=balance):
                pass
        return time.perf_counter() - t0

    epoch(None), epoch("attention")
    times: dict[str | None, list[float]] = {None: [], "attention": []}
    for k in range(rounds):
        for balance in (None, "attention") if k % 2 == 0 else ("attention", None):
            times[balance].append(epoch(balance))
    ratios = [b / u for u, b in zip(times[None], times["attention"], strict=True)]
    spread = {
        name: [round(float(np.median(v)), 3), round(min(v), 3), round(max(v), 3)]
        for name, v in (
            ("unbalanced_seconds", times[None]),
            ("balanced_seconds", times["attention"]),
            ("ratio", ratios),
        )
    }
    return {"dataset": path, "world": world, "batch": batch, "rounds": rounds, **spread}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--docs", type=int, default=400_000)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--large-docs", type=int, default=3_000_000, help="one draw this large too (0: none)")
    parser.add_argument("--open-packs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="/tmp/raypack-bench-balance")
    parser.add_argument("--skip-open", action="store_true")
    parser.add_argument(
        "--baseline", type=Path, help="a raypack checkout (of another commit) whose balanced open to time too"
    )
    parser.add_argument("--skip-imbalance", action="store_true", help="leave out the corpus draws' figures")
    parser.add_argument("--skip-reading", action="store_true")
    parser.add_argument(
        "--dataset", help="also a packed dataset's figure (raypack.reader.attention_imbalance)"
    )
    parser.add_argument("--world", type=int, default=8)
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args()
    if args.dataset:
        for per_token in (0.0, ATTENTION_PER_TOKEN):
            got = attention_imbalance(args.dataset, args.batch, args.world, balance_per_token=per_token)
            print(
                json.dumps(
                    {
                        "dataset": args.dataset,
                        "world": args.world,
                        "batch": args.batch,
                        "per_token": per_token,
                        **got,
                    }
                )
            )
        print(json.dumps(read_figures(args.dataset, args.world, args.batch, args.rounds)))
    if not args.skip_open:
        root = write_index_dataset(Path(args.work) / f"index-{args.open_packs}", args.open_packs)
        for figure in open_figures(root, args.rounds, (8, 64), args.baseline):
            print(json.dumps({"open": args.open_packs, **figure}))
    if not args.skip_reading:
        root = write_index_dataset(Path(args.work) / f"index-{args.open_packs}", args.open_packs)
        for figure in reading_figures(root, (8, 64), 2):
            print(json.dumps({"reading": figure}))
    if not args.skip_imbalance:
        for figure in imbalance_figures(args.docs, args.seeds):
            print(json.dumps({"docs": args.docs, "seeds": args.seeds, **figure}))
        if args.large_docs:
            for figure in imbalance_figures(args.large_docs, 1):
                print(json.dumps({"large": args.large_docs, **figure}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
