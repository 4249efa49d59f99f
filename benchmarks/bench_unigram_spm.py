"""The `sentencepiece` library (its C++ encoder) as a fast path for a Unigram tokenizer.json, against
`tokenizers`' encode_batch_fast (add_special_tokens off): where its ids differ and why, and its speed,
on one thread (issue 58, the Unigram part).

    make bench-inputs
    python benchmarks/bench_unigram_spm.py --mb 3 --rounds 5

A Unigram tokenizer.json (as transformers converts an XLM-R or T5 style SentencePiece model: a
Precompiled normalizer, WhitespaceSplit then Metaspace, the Unigram model) carries what a
SentencePiece ModelProto needs: the pieces and their scores, the charsmap, the unk id, the `▁`
prefix. This script builds the ModelProto from tokenizers' file (sentencepiece_model_pb2), loads it
with SentencePieceProcessor(model_proto=...), and encodes j2-unigram (tests/real_tokenizers.py) on
the three corpora of bench_backends.py (prose, C code, Django's multilingual catalogs) and on
raypack's probes (raypack.text.backends.PROBES), in four ways, each adding one adjustment to the one
before, so that each adjustment's effect on the number of documents whose ids differ is seen:

1. `converted`: the ModelProto alone (its charsmap, add_dummy_prefix, whitespace collapsed), each
   text whole: what encoding with the model's own .model file does.
2. `no cross-word pieces`: the pieces holding `▁` past their first character set UNUSED (a
   SentencePiece model trained with split_by_whitespace off has them; `tokenizers` never meets
   them, as WhitespaceSplit cuts its words first).
3. `added tokens apart`: the text cut at the added tokens as `tokenizers` cuts it (leftmost,
   longest, on the raw text), each piece between them normalized by `tokenizers`' own normalizer
   and given to an identity-normalizer ModelProto; Unicode whitespace that survives normalization
   made a space (WhitespaceSplit splits on it). A text holding `▁` itself goes to `tokenizers`
   (Metaspace prepends `▁` only where a word does not start with one; SentencePiece always does).
4. `word by word`: as 3, each whitespace-separated word given to SentencePiece apart (its Viterbi
   then sums a word's scores, not a whole text's, in its float precision).

In each way each differing document is classed by the scores of the two id sequences (the
vocabulary's scores, summed in float64): `tie` where they are equal (two segmentations of the same
score, which the two encoders break differently), `lower` where SentencePiece's is lower, `higher`
where it is higher (only where the two search other segmentations: ways 1 and 2).
Beside the probes, a few words of the tied runs found, alone (TIED): whether the two break a tie
alike depends on the word and on what precedes it in the word.

Speed: `tokenizers`' encode_batch_fast, way 1 (SentencePiece's own speed on whole texts: its
ceiling) and way 4 (the adjusted path, Python included; the share of its seconds spent in
SentencePiece's encode), in `--rounds` interleaved rounds, the order rotated each round; × =
tokenizers' seconds / the way's in the same round: median (spread). And what a check for ties would
cost: SentencePiece's second-best search (nbest_encode of 2) against its Viterbi on the same words.
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers is imported: it reads it once

import argparse
import base64
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_backends import CORPORA, corpus
from bench_job import real_tokenizer

# Rust's char::is_whitespace (Unicode White_Space), what WhitespaceSplit splits on, but the space.
WHITESPACE = re.compile("[\t\n\x0b\x0c\r\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
METASPACE = "▁"

Encode = Callable[[list[str]], list[list[int]]]


def model_proto(spec: dict[str, Any], *, cross_words: bool, charsmap: bool) -> bytes:
    """A SentencePiece ModelProto of a Unigram tokenizer.json: its pieces, scores and unk id; its
    Precompiled charsmap (else no normalization: `identity`); with `cross_words` off, every piece
    holding `▁` past its first character UNUSED (never in a segmentation)."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = spec["model"]
    if model["type"] != "Unigram" or model.get("byte_fallback"):
        raise ValueError("a Unigram model without byte fallback only")
    kinds = pb.ModelProto.SentencePiece
    proto = pb.ModelProto()
    for i, (piece, score) in enumerate(model["vocab"]):
        entry = proto.pieces.add()
        entry.piece, entry.score = piece, score
        if i == model["unk_id"]:
            entry.type = kinds.UNKNOWN
        elif not cross_words and METASPACE in piece[1:]:
            entry.type = kinds.UNUSED
        else:
            entry.type = kinds.NORMAL
    trainer = proto.trainer_spec
    trainer.model_type = pb.TrainerSpec.UNIGRAM
    trainer.vocab_size = len(model["vocab"])
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = model["unk_id"], -1, -1, -1
    normalizer = proto.normalizer_spec
    if charsmap:
        normalizer.name = "user_defined"
        normalizer.precompiled_charsmap = base64.b64decode(spec["normalizer"]["precompiled_charsmap"])
    else:
        normalizer.name = "identity"
    normalizer.add_dummy_prefix = True
    normalizer.remove_extra_whitespaces = True
    normalizer.escape_whitespaces = True
    return bytes(proto.SerializeToString())


def trie_pattern(contents: Iterable[str]) -> re.Pattern[str]:
    """A pattern that finds any of `contents` in a text, the longest where several start at one
    place, written as a trie (one alternation of 26k literals costs a backtracking engine each
    of them at every `(` and `,` of a C file)."""
    trie: dict[str, Any] = {}
    for text in contents:
        node = trie
        for ch in text:
            node = node.setdefault(ch, {})
        node[""] = {}

    def regex(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + regex(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Longer first: a backtracking engine takes the first branch that matches.
        return f"(?:{body})?" if "" in node else body

    return re.compile(regex(trie))


class Sectioned:
    """Ways 3 and 4: the added tokens cut out on the raw text, the rest normalized by `tokenizers`
    and encoded by SentencePiece (per section, or per word)."""

    def __init__(self, spec: dict[str, Any], reference: Any, processor: Any, *, words: bool) -> None:
        self.added = {t["content"]: t["id"] for t in spec["added_tokens"]}
        self.pattern = trie_pattern(self.added)
        self.reference, self.processor, self.words = reference, processor, words
        self.normalize = reference.normalizer.normalize_str
        self.routed = 0
        self.spm_seconds = 0.0
        """Of the latest call's seconds, those in SentencePiece's encode."""

    def _texts(self, text: str) -> list[int | str]:
        """The text's added tokens (their ids) and the normalized runs between them."""
        items: list[int | str] = []
        start = 0
        for found in self.pattern.finditer(text):
            if found.start() > start:
                items.append(self._normalized(text[start : found.start()]))
            items.append(self.added[found.group()])
            start = found.end()
        if start < len(text):
            items.append(self._normalized(text[start:]))
        return items

    def _normalized(self, run: str) -> str:
        out = self.normalize(run)
        return WHITESPACE.sub(" ", out) if WHITESPACE.search(out) else out

    def __call__(self, texts: list[str]) -> list[list[int]]:
        plans = [None if METASPACE in t else self._texts(t) for t in texts]
        self.routed = plans.count(None)
        runs = [item for plan in plans if plan is not None for item in plan if isinstance(item, str)]
        pieces = [w for r in runs for w in r.split(" ") if w] if self.words else runs
        t0 = time.perf_counter()
        encoded = iter(self.processor.encode(pieces, num_threads=1))
        self.spm_seconds = time.perf_counter() - t0
        ids_of_run = [
            [i for w in r.split(" ") if w for i in next(encoded)] if self.words else next(encoded)
            for r in runs
        ]
        runs_ids = iter(ids_of_run)
        out: list[list[int]] = []
        for text, plan in zip(texts, plans, strict=True):
            if plan is None:
                out.append(self.reference.encode(text, add_special_tokens=False).ids)
                continue
            ids: list[int] = []
            for item in plan:
                if isinstance(item, int):
                    ids.append(item)
                else:
                    ids.extend(next(runs_ids))
            out.append(ids)
        return out


def ways(path: Path) -> tuple[Any, dict[str, Encode]]:
    """`tokenizers`' Tokenizer of the file and the four ways (the module's docstring)."""
    import sentencepiece as spm
    from tokenizers import Tokenizer

    spec = json.loads(path.read_text())
    reference = Tokenizer.from_file(str(path))

    def processor(**kw: bool) -> Any:
        return spm.SentencePieceProcessor(model_proto=model_proto(spec, **kw))

    converted = processor(cross_words=True, charsmap=True)
    one_word = processor(cross_words=False, charsmap=True)
    identity = processor(cross_words=False, charsmap=False)
    return reference, {
        "converted": lambda texts: converted.encode(texts, num_threads=1),
        "no cross-word pieces": lambda texts: one_word.encode(texts, num_threads=1),
        "added tokens apart": Sectioned(spec, reference, identity, words=False),
        "word by word": Sectioned(spec, reference, identity, words=True),
    }


def differences(
    reference: Any, scores: list[float], texts: list[str], encode: Encode
) -> tuple[list[int], dict[str, int], str]:
    """The documents whose ids differ from `tokenizers`', their classes (tie, lower, higher) and
    the first difference shown."""
    want = [e.ids for e in reference.encode_batch_fast(texts, add_special_tokens=False)]
    got = encode(texts)
    differ = [i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b]
    classes = {"tie": 0, "lower": 0, "higher": 0}
    shown = ""
    for i in differ:
        a = sum(scores[t] for t in want[i] if t < len(scores))
        b = sum(scores[t] for t in got[i] if t < len(scores))
        classes["tie" if a == b else "lower" if b < a else "higher"] += 1
        if not shown:
            k = next((j for j in range(min(len(want[i]), len(got[i]))) if want[i][j] != got[i][j]), 0)
            a_pieces, b_pieces = (
                [reference.id_to_token(t) for t in ids[max(0, k - 2) : k + 3]] for ids in (want[i], got[i])
            )
            shown = f"doc {i}: tokenizers {a_pieces} against {b_pieces}"
    return differ, classes, shown


TIED = ("___", "uuuuuu", "mm[:uuuuuu]", "ÓÓ:PP[:mm[:uuuuuu]][TZ]", "0000DDDD", "DDDD")
"""Words of the tied runs the corpora showed, alone and in their context."""


def ties_alone(reference: Any, words: Encode) -> str:
    """TIED, each alone, by `tokenizers` and by the word-by-word way: the pieces where they differ."""
    out = []
    mine = words(list(TIED))
    for word, got in zip(TIED, mine, strict=True):
        want = reference.encode(word, add_special_tokens=False).ids
        pieces = [reference.id_to_token(t) for t in got]
        out.append(
            f"{word}: "
            + (
                "same"
                if want == got
                else f"{reference.encode(word, add_special_tokens=False).tokens} against {pieces}"
            )
        )
    return "; ".join(out)


def speed(reference: Any, texts: list[str], encoders: dict[str, Encode], rounds: int) -> str:
    """Interleaved rounds: each way's × against encode_batch_fast in the same round."""
    runs: dict[str, Callable[[], object]] = {
        "tokenizers": lambda: reference.encode_batch_fast(texts, add_special_tokens=False),
        **{name: (lambda e=e: e(texts)) for name, e in encoders.items()},
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    shares: list[float] = []
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            runs[name]()
            seconds[name].append(time.perf_counter() - t0)
            spm = getattr(encoders.get(name), "spm_seconds", None)
            if spm is not None:
                shares.append(spm / seconds[name][-1])
    out = [f"tokenizers {statistics.median(seconds['tokenizers']):.2f} s"]
    for name in encoders:
        ratios = [a / b for a, b in zip(seconds["tokenizers"], seconds[name], strict=True)]
        out.append(
            f"{name} {statistics.median(seconds[name]):.2f} s ×{statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )
    if shares:
        out.append(f"SentencePiece's encode {statistics.median(shares):.0%} of the adjusted path's seconds")
    return ", ".join(out)


def tie_check_cost(texts: list[str], words: Sectioned, rounds: int) -> str:
    """What finding a tie would cost: SentencePiece's second-best search (nbest_encode, 2 paths)
    against its Viterbi (encode) on the same words, in interleaved rounds."""
    runs = [item for t in texts for item in words._texts(t) if isinstance(item, str)]
    split = [w for r in runs for w in r.split(" ") if w]
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        words.processor.encode(split, num_threads=1)
        viterbi = time.perf_counter() - t0
        t0 = time.perf_counter()
        words.processor.nbest_encode(split, nbest_size=2)
        ratios.append((time.perf_counter() - t0) / viterbi)
    return (
        f"second-best search ×{statistics.median(ratios):.1f} ({min(ratios):.1f}-{max(ratios):.1f}) "
        f"the Viterbi's seconds on the same {len(split):,} words"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default="/tmp/raypack-bench")
    parser.add_argument("--corpora", default=",".join(CORPORA))
    args = parser.parse_args()
    from raypack.text.backends import PROBES

    path = real_tokenizer(Path(args.work), "j2-unigram")
    reference, encoders = ways(path)
    scores = [s for _, s in json.loads(path.read_text())["model"]["vocab"]]
    fast = {name: encoders[name] for name in ("converted", "word by word")}
    for name in ["probes", *args.corpora.split(",")]:
        texts = list(PROBES) if name == "probes" else corpus(name, args.mb)
        size = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
        print(f"\n{name}: {len(texts)} documents, {size:.1f} MB", flush=True)
        for way, encode in encoders.items():
            differ, classes, shown = differences(reference, scores, texts, encode)
            routed = getattr(encode, "routed", 0)
            print(
                f"  {way}: {len(differ)} of {len(texts)} differ {classes}"
                + (f", {routed} to tokenizers" if routed else "")
                + (f"; {shown}" if shown else ""),
                flush=True,
            )
        if name == "probes":
            print("  tied runs alone: " + ties_alone(reference, encoders["word by word"]), flush=True)
        else:
            print("  speed, one thread: " + speed(reference, texts, fast, args.rounds), flush=True)
            words = encoders["word by word"]
            assert isinstance(words, Sectioned)
            print("  " + tie_check_cost(texts, words, args.rounds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
