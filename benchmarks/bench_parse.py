"""The input's decode, the tokenize stage's floor besides its encoder: ISA-L's inflate and raypack's
JSONL reader (orjson, then json for the lines orjson refuses) against the other JSON parsers on the
registries, on bench_tokenize's corpora, one thread.

    pip install --no-deps msgspec pysimdjson     # the candidates (not raypack's dependencies)
    python benchmarks/bench_parse.py --mb 32 --rounds 5

Per corpus (bench_tokenize's, built into --work as it builds them), in --rounds interleaved rounds
(each round runs every way once, its order rotated), medians of seconds and MB/s of text:
- inflate: ISA-L's inflate of every shard (isal_zlib.decompress, as the reader's chunks do);
- raypack: raypack.corpus.readers.jsonl.read on every shard (its reading, inflating and parsing,
  documents into batches), less the inflate: what the stage's parse costs;
- each parser alone on the inflated lines, the text field taken from each record: orjson.loads
  (what raypack's reader calls first), msgspec.json.decode, and simdjson's Parser (pysimdjson,
  simdjson 3's on-demand API: one parser reused, a line's text taken before the next is parsed).
Every parser's texts are compared with raypack's reader's documents; one that differs is shown so.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_tokenize


def parsers() -> dict[str, Callable[[bytes], Any]]:
    """Each parser that is installed: a line in, its "text" out."""
    import orjson

    found: dict[str, Callable[[bytes], Any]] = {"orjson": lambda line: orjson.loads(line)["text"]}
    try:
        import msgspec

        decode = msgspec.json.decode
        found["msgspec"] = lambda line: decode(line)["text"]
    except ImportError:
        pass
    try:
        import simdjson

        parser = simdjson.Parser()
        found["simdjson"] = lambda line: parser.parse(line)["text"]
    except ImportError:
        pass
    return found


def raypack_texts(corpus: Path) -> list[str]:
    """Every document's text as raypack's reader reads the corpus's shards."""
    from raypack.config import JobConfig
    from raypack.config.load import from_dict
    from raypack.corpus.readers import jsonl
    from raypack.storage import Shard, resolve

    cfg = from_dict(
        JobConfig,
        {
            "input": {"paths": [str(corpus / "*.jsonl.gz")]},
            "tokenizer": {"path": "unused.json"},
            "output": {"path": str(corpus.parent / "parse-out")},
        },
    )
    reading = cfg.input.reading()
    texts: list[str] = []
    for k, path in enumerate(sorted(corpus.glob("part-*.jsonl.gz"))):
        fs, inner = resolve(str(path), None)
        shard = Shard(k, str(path), path.name, path.stat().st_size, 0)
        for batch in jsonl.read(fs, inner, shard, reading, cfg.tokenizer.batch_size):
            texts += [str(t) for t in batch.texts]
    return texts


def measure(corpus: Path, rounds: int) -> dict[str, Any]:
    from isal import isal_zlib

    shards = [p.read_bytes() for p in sorted(corpus.glob("part-*.jsonl.gz"))]
    lines = [line for s in shards for line in isal_zlib.decompress(s, wbits=31).splitlines() if line]
    want = raypack_texts(corpus)
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in want) / 1e6
    ways: dict[str, Callable[[], Any]] = {
        "inflate": lambda: [isal_zlib.decompress(s, wbits=31) for s in shards],
        "raypack": lambda: raypack_texts(corpus),
    }
    exact: dict[str, bool] = {}
    for name, parse in parsers().items():
        ways[name] = lambda parse=parse: [parse(line) for line in lines]
        exact[name] = ways[name]() == want
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            ways[name]()
            seconds[name].append(time.perf_counter() - t0)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    median["raypack"] = max(median["raypack"] - median["inflate"], 1e-9)  # its parse alone
    return {"mb": mb, "documents": len(want), "seconds": median, "exact": exact}


def _differs(row: dict[str, Any], name: str, said: str) -> str:
    return "" if row["exact"].get(name, True) else said


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=32)
    parser.add_argument("--corpora", default=",".join(bench_tokenize.CORPORA))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/raypack-bench-tokenize"))
    args = parser.parse_args()
    rows = []
    for corpus in args.corpora.split(","):
        folder, _ = bench_tokenize.write_corpus(args.work, corpus, args.mb)
        row = measure(folder, args.rounds)
        rows.append((corpus, row))
        cells = ", ".join(
            f"{name} {s:.3f} s ({row['mb'] / s:.0f} MB/s{_differs(row, name, ', DIFFERS')})"
            for name, s in row["seconds"].items()
        )
        print(f"{corpus} ({row['mb']:.1f} MB, {row['documents']:,} documents): {cells}", flush=True)
    names = list(rows[0][1]["seconds"])
    print("\n| corpus | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for corpus, row in rows:
        cells = [
            f"{row['mb'] / s:.0f} MB/s{_differs(row, n, ' (differs)')}" for n, s in row["seconds"].items()
        ]
        print(f"| {corpus} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
