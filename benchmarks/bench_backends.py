"""Exact tokenizer backends against `tokenizers`, per tokenizer family and corpus, on one core
(issues 39 and 58).

    make real-tokenizers
    pip install --no-deps kitoken tokie gigatoken awkward awkward-cpp   # the candidates (optional)
    python benchmarks/bench_backends.py --mb 3 --rounds 3

For each real model tokenizer (tests/real_tokenizers.py: Mistral-7B's 32k SentencePiece BPE in its
published and its transformers-5 shape, tekken's 131k tiktoken-style byte-level BPE, tekken with an
NFKC normalizer, an XLM-R-style Unigram model with a Precompiled normalizer), each corpus (`prose`:
the documentation of this machine's packages; `code`: C and C++ sources and headers; `multilingual`:
the translations in Django's message catalogs, one document a catalog, 96 languages), and each
backend that is installed, in this one process on one thread (RAYON_NUM_THREADS=1,
FASTOKENS_BPE_THREADS=1, gigatoken's parallel off): the seconds to encode the corpus in batches of
~1 MiB (what a tokenize task does), in `--rounds` interleaved rounds (each round runs every backend
once, in an order rotated round by round), with the median × against `tokenizers`' encode_batch_fast
(add_special_tokens off) in the same round, the spread of the rounds' ×, and the median × against
`raypack (fastokens)` in the same round. Each backend first
encodes 1 MB of other texts of the corpus, untimed. Every document's ids are compared with
`tokenizers`', and each backend is put through raypack's self-check (backends.first_difference on
backends.probes: what `choose_backend` runs before the corpus sample). A backend that refuses the
file, raises or panics says so.

Backends: `raypack (fastokens)` is what the tokenize stage runs (fastokens behind raypack's rewrites,
backends.fast_json: a Metaspace as two normalizer copies, NFKC left out for the texts it leaves as
they are, the other texts to tokenizers). gigatoken is timed on three of its APIs: `encode_batch_list`
(lists, what its as_hf() mode builds on), `encode_batch` (its fast path: one flat uint32 array and
offsets, an awkward Array), and `encode_files` on a JsonlFileSource (its file source in, token
arrays out: the batch's documents as a JSONL file, read and parsed by gigatoken in the time, against
`raypack (fastokens) JSONL` which reads and parses the same file in Python then encodes).
"""

from __future__ import annotations

import os

# Before any backend is imported: each reads its thread count once.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["FASTOKENS_BPE_THREADS"] = "1"

import argparse
import json
import statistics
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import REAL, real_tokenizer, source_texts

CORPORA = ("prose", "code", "multilingual")
SUFFIXES = {"prose": {".md", ".rst", ".txt"}, "code": {".c", ".cc", ".cpp", ".h", ".hpp"}}

Encode = Callable[[list[str]], list[np.ndarray]]


def corpus(name: str, mb: float) -> list[str]:
    """`mb` MB of the named corpus's documents (CORPORA), distinct, in a fixed order."""
    texts: list[str] = []
    total = 0
    for text in _multilingual() if name == "multilingual" else source_texts(SUFFIXES[name]):
        texts.append(text)
        total += len(text.encode("utf-8", "surrogatepass"))
        if total >= mb * 1e6:
            break
    return texts


def _multilingual() -> Iterator[str]:
    """The translated strings (msgstr) of each of Django's message catalogs, one document a catalog,
    in their languages (Arabic, Chinese, Hindi, Japanese, Russian, Thai... 96 of them), interleaved
    language by language so that any prefix holds many scripts."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.real_tokenizers import DJANGO, wheel

    by_language: dict[str, list[str]] = {}
    with zipfile.ZipFile(wheel(DJANGO)) as z:
        for name in sorted(n for n in z.namelist() if n.endswith(".po")):
            lines = z.read(name).decode("utf-8").splitlines()
            text = "\n".join(_msgstr(lines))
            if len(text) >= 1_000:
                by_language.setdefault(name.split("/locale/")[1].split("/")[0], []).append(text)
    queues = list(by_language.values())
    while any(queues):
        for queue in queues:
            if queue:
                yield queue.pop(0)


def _msgstr(lines: list[str]) -> Iterator[str]:
    """The translations in a .po file's lines: each msgstr's string and its continuation lines."""
    inside = False
    for line in lines:
        if line.startswith("msgstr"):
            inside = True
            line = line.partition(" ")[2]
        elif not line.startswith('"'):
            inside = False
        if inside and len(line) > 2:
            yield json.loads(line) if line.startswith('"') else line


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


def _raypack_jsonl(path: Path) -> Encode:
    from raypack.text.backends import FastokensEncoder

    fast = FastokensEncoder(path.read_text())

    def encode(texts: list[str]) -> list[np.ndarray]:
        with open(_as_jsonl(texts), "rb") as f:
            parsed = [json.loads(line)["text"] for line in f]
        return _split(*fast.encode(parsed))

    return encode


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
    return lambda texts: [np.asarray(ids, dtype=np.int64) for ids in tok.encode_all(texts, True)]


def _tokie(path: Path) -> Encode:
    import tokie

    tok = tokie.Tokenizer.from_json(str(path))

    def encode(texts: list[str]) -> list[np.ndarray]:
        ids, lengths = tok.encode_batch_flat(texts, add_special_tokens=False)
        return _split(ids, lengths)

    return encode


def _gigatoken_lists(path: Path) -> Encode:
    import gigatoken

    tok = gigatoken.Tokenizer(str(path))
    return lambda texts: [np.asarray(i, dtype=np.int64) for i in tok.encode_batch_list(texts, parallel=False)]


def _awkward_split(array: Any) -> list[np.ndarray]:
    """An awkward Array of id lists as one array a document (its flat ids and offsets, no copy)."""
    layout = array.layout
    return np.split(np.asarray(layout.content.data, dtype=np.int64), np.asarray(layout.offsets.data)[1:-1])


def _gigatoken_arrays(path: Path) -> Encode:
    import gigatoken

    tok = gigatoken.Tokenizer(str(path))
    return lambda texts: _awkward_split(tok.encode_batch(texts, parallel=False))


def _gigatoken_files(path: Path) -> Encode:
    import gigatoken

    tok = gigatoken.Tokenizer(str(path))

    def encode(texts: list[str]) -> list[np.ndarray]:
        source = gigatoken.JsonlFileSource([str(_as_jsonl(texts))], field="text")
        return _awkward_split(tok.encode_files(source, parallel=False))

    return encode


_JSONL: dict[int, Path] = {}
"""Each batch's documents as a JSONL file (made before the timed rounds, by prepare_jsonl)."""


def _as_jsonl(texts: list[str]) -> Path:
    return _JSONL[id(texts)]


def prepare_jsonl(groups: list[list[str]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i, texts in enumerate(groups):
        path = folder / f"batch-{i}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
        _JSONL[id(texts)] = path


RAYPACK = "raypack (fastokens)"
BACKENDS: dict[str, Callable[[Path], Encode]] = {
    "tokenizers": _tokenizers,
    RAYPACK: _raypack,
    "raypack (fastokens) JSONL": _raypack_jsonl,
    "fastokens": _fastokens,
    "gigatoken encode_batch": _gigatoken_arrays,
    "gigatoken encode_files JSONL": _gigatoken_files,
    "gigatoken encode_batch_list": _gigatoken_lists,
    "kitoken": _kitoken,
    "tokie": _tokie,
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


class _Flat:
    """A bench backend as raypack's Encoder (flat ids, lengths), for backends.first_difference."""

    def __init__(self, name: str, encode: Encode) -> None:
        self.name, self.version, self._encode = name, "", encode

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = self._encode(texts)
        lengths = np.array([len(i) for i in ids], dtype=np.int64)
        flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        return flat.astype(np.int32), lengths


def self_check(path: Path, name: str, encode: Encode) -> str:
    """raypack's self-check of the backend (backends.probes, every id compared): "passes" or where
    it first differs."""
    from tokenizers import Tokenizer

    from raypack.text.backends import TokenizersEncoder, first_difference, probes

    reference = Tokenizer.from_file(str(path))
    added = [t.content for _, t in sorted(reference.get_added_tokens_decoder().items())]
    texts = probes(added)
    if name.endswith("JSONL"):  # its file holds each probe as a document: empty ones too
        prepare_jsonl([texts], Path(tempfile.mkdtemp(prefix="probes-")))
    try:
        differs = first_difference(TokenizersEncoder(reference), _Flat(name, encode), texts)
    except BaseException as e:  # a Rust panic is a BaseException
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"raises on the probes ({_why(e)})"
    return "passes" if differs is None else f"fails: {differs[:70]}"


def run(
    path: Path, texts: list[str], warm: list[str], names: list[str], rounds: int, work: Path
) -> dict[str, str]:
    """Each backend's cell for one tokenizer and corpus; tokenizers first (the reference)."""
    mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
    groups, warm_groups = batches(texts), batches(warm)
    prepare_jsonl(groups + warm_groups, work / "jsonl")
    cells: dict[str, str] = {}
    encoders: dict[str, Encode] = {}
    for name in names:
        try:
            encode = BACKENDS[name](path)
            # A pass over other texts first: whichever backend ran first after tokenizers was ~2x
            # slower in a cold pass. Not the same texts again: a backend's word cache would hold
            # every word of them (fastokens' second pass over the same 10 MB was 2.3x its first).
            for group in warm_groups:
                encode(group)
            encoders[name] = encode
        except ImportError:
            cells[name] = "not installed"
        except BaseException as e:  # a refusal at load, an exception or a Rust panic
            if isinstance(e, KeyboardInterrupt):
                raise
            cells[name] = f"fails: {_why(e)}"
    seconds: dict[str, list[float]] = {name: [] for name in encoders}
    got: dict[str, list[np.ndarray]] = {}
    for r in range(rounds):
        order = list(encoders)
        order = order[r % len(order) :] + order[: r % len(order)]
        for name in order:
            try:
                t0 = time.perf_counter()
                ids = [i for group in groups for i in encoders[name](group)]
                seconds[name].append(time.perf_counter() - t0)
            except BaseException as e:
                if isinstance(e, KeyboardInterrupt):
                    raise
                cells[name] = f"fails: {_why(e)}"
                continue
            got.setdefault(name, ids)
    want = got["tokenizers"]
    base = seconds["tokenizers"]
    ours = seconds.get(RAYPACK) if RAYPACK not in cells else None
    for name, encode in encoders.items():
        if name in cells:
            continue
        ratios = [b / s for b, s in zip(base, seconds[name], strict=True)]
        # Against raypack's own backend in the same rounds: the engines' order, free of tokenizers'
        # own noise (its seconds on a loaded machine spread ×2-3 over rounds).
        versus = (
            f", ×{statistics.median(o / s for o, s in zip(ours, seconds[name], strict=True)):.2f} raypack's"
            if ours and name not in ("tokenizers", RAYPACK)
            else ""
        )
        differ = sum(1 for a, b in zip(want, got[name], strict=True) if not np.array_equal(a, b))
        exact = "exact" if differ == 0 else f"**{differ} of {len(texts)} differ**"
        probe = self_check(path, name, encode) if name != "tokenizers" else "reference"
        cells[name] = (
            f"{mb / statistics.median(seconds[name]):.1f} MB/s ×{statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}){versus}, {exact}, probes {probe}"
        )
    return cells


def unigram_parts(path: Path, texts: list[str], rounds: int) -> None:
    """For a Unigram tokenizer (a Precompiled normalizer, WhitespaceSplit and Metaspace): what a fast
    path that kept `tokenizers`' own normalizer and pre-tokenizer would pay before any model runs
    (normalize_str, then pre_tokenize_str, on one thread, against encode_batch_fast's seconds), and
    whether kitoken's and tokie's Unigram models alone give `tokenizers`' ids on the words
    `tokenizers` makes of backends.PROBES (each word encoded apart, no added token)."""
    from tokenizers import Tokenizer

    from raypack.text.backends import PROBES

    ref = Tokenizer.from_file(str(path))
    normalizer, pre = ref.normalizer, ref.pre_tokenizer
    steps = {
        "encode_batch_fast": lambda: ref.encode_batch_fast(texts, add_special_tokens=False),
        "normalize": lambda: [normalizer.normalize_str(t) for t in texts],
        "normalize + pre-tokenize": lambda: [
            pre.pre_tokenize_str(normalizer.normalize_str(t)) for t in texts
        ],
    }
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - t0)
    whole = statistics.median(seconds["encode_batch_fast"])
    print(
        "tokenizers' steps: "
        + ", ".join(
            f"{n} {statistics.median(v):.2f} s ({statistics.median(v) / whole:.0%})"
            for n, v in seconds.items()
        )
    )
    spec = json.loads(path.read_text())
    bare = dict(spec, normalizer=None, pre_tokenizer=None)
    bare["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < 8]  # <unk> and the specials
    folder = Path(tempfile.mkdtemp(prefix="unigram-"))
    (folder / "tokenizer.json").write_text(json.dumps(bare))
    for name in ("kitoken", "tokie"):
        try:
            encode = BACKENDS[name](folder / "tokenizer.json")
        except ImportError:
            continue
        differ = []
        for i, text in enumerate(PROBES):
            words = [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]
            got = [int(t) for ids in encode(words) for t in ids] if words else []
            if got != ref.encode(text, add_special_tokens=False).ids:
                differ.append(i)
        print(
            f"{name}'s Unigram model alone, on tokenizers' words: {len(differ)} of {len(PROBES)} "
            f"probes differ {differ}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", default="/tmp/raypack-bench")
    parser.add_argument("--tokenizers", default=",".join(REAL))
    parser.add_argument("--corpora", default=",".join(CORPORA))
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--unigram", action="store_true", help="j2-unigram's parts (unigram_parts) only")
    args = parser.parse_args()
    names = ["tokenizers", *[b for b in args.backends.split(",") if b != "tokenizers"]]
    work = Path(args.work)
    for corpus_name in args.corpora.split(","):
        texts = corpus(corpus_name, args.mb + 1)
        sizes = np.cumsum([len(t.encode("utf-8", "surrogatepass")) for t in texts])
        split = int(np.searchsorted(sizes, args.mb * 1e6)) + 1
        texts, warm = texts[:split], texts[split:]
        total = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        print(
            f"\n{corpus_name}: {len(texts):,} documents, {total / 1e6:.1f} MB, one thread, {args.rounds} "
            "rounds; × = tokenizers' seconds / the backend's in a round: median (spread)",
            flush=True,
        )
        if args.unigram:
            unigram_parts(real_tokenizer(work, "j2-unigram"), texts, args.rounds)
            continue
        table: dict[str, dict[str, str]] = {}
        for tokenizer in args.tokenizers.split(","):
            path = real_tokenizer(work, tokenizer)
            table[tokenizer] = run(path, texts, warm, names, args.rounds, work / corpus_name)
            print(tokenizer, table[tokenizer], flush=True)
        print()
        print(f"| {corpus_name} | " + " | ".join(table) + " |")
        print("|---|" + "---|" * len(table))
        for name in names:
            print(f"| {name} | " + " | ".join(table[t].get(name, "") for t in table) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
