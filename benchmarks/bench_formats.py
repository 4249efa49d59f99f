"""Write time and bytes of every output format (output.format), on the same real text.

    python benchmarks/bench_formats.py                    # 130 MB, the demo (8k) and 128k tokenizers
    python benchmarks/bench_formats.py --mb 30 --tokenizers demo

Corpus and tokenizers: bench_job's (real source text in gzipped JSONL shards; the demo's byte-level
BPE of 8,192 tokens and one of 131,072 trained on the corpus), seq_len 8192, bfd, fastokens where it
proves tokenizers' ids. For each tokenizer:
- the job: `raypack rebuild` into one root per tokenizer, once per format (the token cache is keyed
  by the corpus and tokenizer, not the format: the first run tokenizes, the others reuse its token
  files), so each later run's time is the packing and writing of that format alone; its assign+write
  stage seconds come from metrics.json. Every format's pack index and tokens must equal parquet's
  (read back through raypack.formats);
- bytes: each format's data files, their companions (.idx, masks, documents) and the format's own
  files, and the pack index (packs/) apart, against the token slots (4 bytes each);
- one core: encoding one output file's packs into each format's bytes (raypack.formats, no I/O), in
  MB of token slots (4 bytes a slot) per second, the best of 5.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import large_tokenizer, make_corpus

from raypack.dataset.layout import latest_version, version_name
from raypack.demo import demo_config
from raypack.formats import FORMATS, encode_index, read_packs, spec_of

SEQ_LEN = 8192


def rebuild(work: Path, corpus: Path, tokenizer: Path, root: Path, fmt: str) -> tuple[float, dict, Path]:
    config = {
        "input": {"paths": [str(corpus / "*.jsonl.gz")], "max_reject_ratio": 0.05},
        "tokenizer": {"path": str(tokenizer)},
        "pack": {"seq_len": SEQ_LEN},
        "output": {"path": str(root), "format": fmt, "keep_versions": len(FORMATS)},
    }
    path = work / f"formats-{root.name}-{fmt}.yaml"
    path.write_text(yaml.safe_dump(config))
    raypack = Path(sys.executable).parent / "raypack"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.perf_counter()
    done = subprocess.run([str(raypack), "rebuild", str(path)], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"raypack rebuild failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    out = root / version_name(latest_version(str(root)) or 0)
    return seconds, json.loads((out / "metrics.json").read_text()), out


def sizes(out: Path) -> dict[str, int]:
    m = json.loads((out / "manifest.json").read_text())
    index = sum(c["bytes"] for f in m["files"] for c in f["companions"] if c["path"].startswith("packs/"))
    data = sum(f["bytes"] + sum(c["bytes"] for c in f["companions"]) for f in m["files"]) - index
    data += sum(f["bytes"] for f in m["format"]["files"])
    slots = sum(f["rows"] * f["bucket_length"] for f in m["files"])
    return {"data": data, "index": index, "slots": slots}


def same_packs(out: Path, ref: Path) -> bool:
    """The same pack index and the same real tokens as the parquet output."""

    def packs(path: Path) -> list[Any]:
        m = json.loads((path / "manifest.json").read_text())
        files = sorted(m["files"], key=lambda f: f["path"])
        return [read_packs(str(path), f, spec_of(m), None) for f in files]

    for a, b in zip(packs(out), packs(ref), strict=True):
        real = np.arange(a.capacity)[None, :] < a.index.column("num_tokens").to_numpy()[:, None]
        if not (a.index.equals(b.index) and np.array_equal(a.input_ids[real], b.input_ids[real])):
            return False
    return True


def encode_rates(ref: Path) -> dict[str, float]:
    """MB of token slots a second, one core: each format encoding the first output file's packs."""
    m = json.loads((ref / "manifest.json").read_text())
    entry = sorted(m["files"], key=lambda f: f["path"])[0]
    packs = read_packs(str(ref), entry, spec_of(m), None)
    rates = {}
    for name, fmt in FORMATS.items():
        spec = fmt.spec(_settings(m))
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            fmt.encode(packs, spec)
            if not fmt.holds_index:
                encode_index(packs.index)
            best = min(best, time.perf_counter() - t0)
        rates[name] = packs.input_ids.nbytes / best / 1e6
    return rates


def _settings(m: dict[str, Any]) -> Any:
    from raypack.formats import Settings

    return Settings(
        seq_len=SEQ_LEN,
        bucketed=False,
        add_eos=True,
        eos_id=m["tokenizer"]["eos_id"],
        vocab_size=m["tokenizer"]["vocab_size"],
        pad_id=0,
        shard_rows=m["config"]["output"]["shard_rows"],
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=130, help="corpus size")
    parser.add_argument("--tokenizers", default="demo,large", help="demo, large, or both (comma-separated)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    corpus, texts = make_corpus(args.work, args.mb)
    text_mb = sum(len(t.encode()) for t in texts) / 1e6
    tokenizers = {}
    if "demo" in args.tokenizers:
        tokenizers["demo 8k"] = Path(
            yaml.safe_load(demo_config(args.work / "demo").read_text())["tokenizer"]["path"]
        )
    if "large" in args.tokenizers:
        tokenizers["128k"] = large_tokenizer(args.work)
    shards = len(list(corpus.glob("*.jsonl.gz")))
    print(f"corpus: {text_mb:.0f} MB of text in {shards} shards; seq_len {SEQ_LEN}")
    rows = []
    for label, tokenizer in tokenizers.items():
        root = args.work / f"formats-{args.mb}-{tokenizer.stem}"
        subprocess.run(["rm", "-rf", str(root)], check=True)
        outs = {}
        for i, fmt in enumerate(("parquet", *[f for f in FORMATS if f != "parquet"])):
            seconds, metrics, out = rebuild(args.work, corpus, tokenizer, root, fmt)
            outs[fmt] = out
            size = sizes(out)
            stage = metrics["stage_seconds"]["assign+write"]
            rows.append((label, fmt, seconds, stage, size, i == 0))
            print(
                f"{label} {fmt}: rebuild {seconds:.1f} s{' (tokenized)' if i == 0 else ' (token cache)'}, "
                f"assign+write {stage:.1f} s, data {size['data'] / 1e6:.1f} MB "
                f"({size['data'] / size['slots']:.2f} bytes a slot), pack index {size['index'] / 1e6:.2f} MB",
                flush=True,
            )
        for fmt, out in outs.items():
            if not same_packs(out, outs["parquet"]):
                raise SystemExit(f"{fmt}: packs differ from parquet's")
        rates = encode_rates(outs["parquet"])
        print(
            f"{label}: same packs in every format; encode one file, one core: "
            + ", ".join(f"{k} {v:,.0f} MB/s" for k, v in rates.items()),
            flush=True,
        )
    print("\n| tokenizer | format | rebuild s | assign+write s | data MB | bytes / slot | pack index MB |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for label, fmt, seconds, stage, size, first in rows:
        note = " (tokenized)" if first else ""
        print(
            f"| {label} | {fmt} | {seconds:.1f}{note} | {stage:.1f} | {size['data'] / 1e6:.1f} | "
            f"{size['data'] / size['slots']:.2f} | {size['index'] / 1e6:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
