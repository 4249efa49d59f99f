"""`raypack demo`: pack a real corpus with a real tokenizer, offline, on this machine.

The corpus is this Python's own standard library sources (~1,900 modules, 1 to ~300k tokens: a heavy
tail like web text), written as gzipped JSONL shards. The tokenizer is a byte-level BPE trained on a
slice of that corpus with `tokenizers`' trainer (a few seconds) and cached next to the corpus.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import sysconfig
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["build_corpus", "build_tokenizer", "demo_built", "demo_config", "train_byte_level_bpe"]

SHARDS = 8
VOCAB = 8192
SPECIAL = ["<|endoftext|>", "<|pad|>"]


def stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())


def build_corpus(out: Path, max_files: int | None = None) -> list[Path]:
    """Write the stdlib sources as SHARDS jsonl.gz files (round-robin, sorted: deterministic)."""
    out.mkdir(parents=True, exist_ok=True)
    files = stdlib_files()[:max_files]
    root = Path(sysconfig.get_paths()["stdlib"])
    shards = [out / f"stdlib-{i:02d}.jsonl.gz" for i in range(SHARDS)]
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(gzip.open(p, "wt", encoding="utf-8", compresslevel=1)) for p in shards]
        for i, path in enumerate(files):
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue  # a few test fixtures are deliberately not UTF-8; they are not part of the corpus
            record = {"id": str(path.relative_to(root)), "text": text}
            handles[i % SHARDS].write(json.dumps(record) + "\n")
    return shards


def build_tokenizer(path: Path, corpus: list[Path], train_bytes: int = 8 << 20) -> Path:
    """Train a byte-level BPE on the first `train_bytes` of the corpus; reuse it when already there."""
    if path.exists():
        return path

    def texts() -> Iterator[str]:
        seen = 0
        for shard in corpus:
            with gzip.open(shard, "rt", encoding="utf-8") as f:
                for line in f:
                    text = json.loads(line)["text"]
                    seen += len(text)
                    yield text
                    if seen >= train_bytes:
                        return

    tok = train_byte_level_bpe(texts(), VOCAB, SPECIAL)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int, special_tokens: Sequence[str]) -> Tokenizer:
    """A GPT-2-style byte-level BPE trained on `texts` (no network: nothing is downloaded)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def demo_built(out: Path) -> bool:
    """Whether demo_config finds both the corpus and the tokenizer under `out` (and reuses them)."""
    return any((out / "corpus").glob("*.jsonl.gz")) and (out / "tokenizer.json").exists()


def demo_config(out: Path, seq_len: int = 2048) -> Path:
    """Corpus, tokenizer and a job config under `out`; returns the config's path."""
    corpus_dir = out / "corpus"
    shards = sorted(corpus_dir.glob("*.jsonl.gz")) or build_corpus(corpus_dir)
    tokenizer = build_tokenizer(out / "tokenizer.json", shards)
    config = {
        # The stdlib holds 28 empty __init__.py files among ~1,790 sources (1.6% of the records): they
        # are rejected as empty documents, above the default 1% limit meant for real corpora.
        "input": {
            "paths": [str(corpus_dir / "*.jsonl.gz")],
            "format": "jsonl",
            "id_field": "id",
            "max_reject_ratio": 0.05,
        },
        "tokenizer": {"path": str(tokenizer), "add_eos": True},
        "pack": {"seq_len": seq_len, "algorithm": "bfd"},
        "output": {"path": str(out / "packed"), "shard_rows": 1000, "pad_id": 1},
    }
    path = out / "demo.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path
