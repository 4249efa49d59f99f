"""Exact tokenizer backends against `tokenizers`, per tokenizer family, on one core (issue 39).

    make real-tokenizers
    pip install --no-deps kitoken tokie gigatoken splintr-rs   # the candidates (optional)
    python benchmarks/bench_backends.py --mb 10

For each real model tokenizer (tests/real_tokenizers.py: Mistral-7B's 32k SentencePiece BPE in its
published and its transformers-5 shape, tekken's 131k tiktoken-style byte-level BPE, tekken with an
NFKC normalizer) and each backend that is installed, in this one process on one thread
(RAYON_NUM_THREADS=1, FASTOKENS_BPE_THREADS=1, gigatoken's parallel off): the seconds to load the
tokenizer.json, the seconds to encode the corpus in batches of ~1 MiB (what a tokenize task does),
and how many documents' ids differ from `tokenizers`' (encode_batch_fast, add_special_tokens off,
timed the same way: the ×). Each first encodes 2 MB of other texts of the corpus, untimed. A
backend that refuses the file, raises or panics says so. The corpus is bench_job's: distinct
source and documentation files of this machine (C, Python, docs).

`raypack (fastokens)` is what the tokenize stage runs: fastokens behind raypack's rewrites
(backends.fast_json: a Metaspace as two normalizer copies, NFKC left out for the texts it leaves
as they are, the other texts to tokenizers), so a tokenizer fastokens refuses at load still runs.
"""

from __future__ import annotations

import os

# Before any backend is imported: each reads its thread count once.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["FASTOKENS_BPE_THREADS"] = "1"

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import REAL, real_tokenizer, source_texts

Encode = Callable[[list[str]], list[np.ndarray]]


def _tokenizers(path: Path) -> Encode:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path))
    return lambda texts: [
        np.asarray(e.ids, dtype=np.int64) for e in tok.encode_batch_fast(texts, add_special_tokens=False)
    ]


def _split(flat: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    return np.split(np.asarray(flat, dtype=np.int64), np.cumsum(lengths)[:-1])


def _raypack(path: Path) -> Encode:
    from raypack.text.backends import FastokensEncoder

    fast = FastokensEncoder(path.read_text())
    return lambda texts: _split(*fast.encode(texts))


def _fastokens(path: Path) -> Encode:
    import fastokens

    tok = fastokens.Tokenizer.from_json_str(path.read_text())

    def encode(texts: list[str]) -> list[np.ndarray]:
        ids, ends = tok.encode_batch_flat(texts, add_special_tokens=False)
        return _split(np.frombuffer(ids, dtype=np.uint32), np.diff(np.frombuffer(ends, dtype=np.uint64)))

    return encode


def _kitoken(path: Path) -> Encode:
    from kitoken import Kitoken

    tok = Kitoken.from_tokenizers_file(str(path))
    return lambda texts: [np.asarray(tok.encode(t, True), dtype=np.int64) for t in texts]


def _tokie(path: Path) -> Encode:
    import tokie

    tok = tokie.Tokenizer.from_json(str(path))

    def encode(texts: list[str]) -> list[np.ndarray]:
        ids, lengths = tok.encode_batch_flat(texts, add_special_tokens=False)
        return _split(ids, lengths)

    return encode


def _gigatoken(path: Path) -> Encode:
    import gigatoken

    tok = gigatoken.Tokenizer(str(path))
    return lambda texts: [np.asarray(i, dtype=np.int64) for i in tok.encode_batch_list(texts, parallel=False)]


def _splintr(path: Path) -> Encode:
    import splintr

    tok = splintr.from_json(str(path))
    return lambda texts: [np.asarray(tok.encode_raw(t), dtype=np.int64) for t in texts]


BACKENDS: dict[str, Callable[[Path], Encode]] = {
    "tokenizers": _tokenizers,
    "raypack (fastokens)": _raypack,
    "fastokens": _fastokens,
    "kitoken": _kitoken,
    "tokie": _tokie,
    "gigatoken": _gigatoken,
    "splintr-rs": _splintr,
}


def batches(texts: list[str]) -> list[list[str]]:
    """Runs of texts of ~1 MiB, as a tokenize task hands its encoder."""
    out: list[list[str]] = [[]]
    size = 0
    for text in texts:
        if size >= 1 << 20:
            out.append([])
            size = 0
        out[-1].append(text)
        size += len(text)
    return out


def _why(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:90] if text else ''}"


def run(path: Path, texts: list[str], warm: list[str], names: list[str]) -> list[tuple[str, str]]:
    """Each backend's row cells (name, text) for one tokenizer; tokenizers first (the reference)."""
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    groups = batches(texts)
    want: list[np.ndarray] = []
    rows: list[tuple[str, str]] = []
    base = 0.0
    for name in names:
        try:
            t0 = time.perf_counter()
            encode = BACKENDS[name](path)
            load = time.perf_counter() - t0
            # A pass over other texts first: whichever backend ran first after tokenizers was ~2x
            # slower in a cold pass. Not the same texts again: a backend's word cache would hold
            # every word of them (fastokens' second pass over the same 10 MB was 2.3x its first).
            for group in batches(warm):
                encode(group)
            t0 = time.perf_counter()
            got = [ids for group in groups for ids in encode(group)]
            seconds = time.perf_counter() - t0
        except ImportError:
            rows.append((name, "not installed"))
            continue
        except BaseException as e:  # a refusal at load, an exception or a Rust panic
            if isinstance(e, KeyboardInterrupt):
                raise
            rows.append((name, f"fails: {_why(e)}"))
            continue
        if name == "tokenizers":
            want, base = got, seconds
        differ = sum(1 for a, b in zip(want, got, strict=True) if not np.array_equal(a, b))
        exact = "exact" if differ == 0 else f"**{differ} of {len(texts)} differ**"
        rows.append((name, f"{mb / seconds:.2f} MB/s ×{base / seconds:.2f}, load {load:.2f} s, {exact}"))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=10)
    parser.add_argument("--work", default="/tmp/raypack-bench")
    parser.add_argument("--tokenizers", default=",".join(REAL))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    args = parser.parse_args()
    names = ["tokenizers", *[b for b in args.backends.split(",") if b != "tokenizers"]]
    texts: list[str] = []
    warm: list[str] = []
    total = 0
    for text in source_texts():
        (texts if total < args.mb * 1e6 else warm).append(text)
        total += len(text.encode("utf-8", "surrogatepass"))
        if total >= (args.mb + 2) * 1e6:
            break
    total = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
    print(
        f"{len(texts):,} documents, {total / 1e6:.1f} MB, one thread; × = tokenizers' seconds / the backend's"
    )
    work = Path(args.work)
    table: dict[str, dict[str, str]] = {}
    for tokenizer in args.tokenizers.split(","):
        table[tokenizer] = dict(run(real_tokenizer(work, tokenizer), texts, warm, names))
        print(tokenizer, table[tokenizer], flush=True)
    print()
    print("| backend | " + " | ".join(table) + " |")
    print("|---|" + "---|" * len(table))
    for name in names:
        print(f"| {name} | " + " | ".join(table[t].get(name, "") for t in table) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
