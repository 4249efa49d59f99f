"""Chat data: `raypack pack` (render, tokenize with masks, pack, write TRL rows) against TRL's own
preparation of the same conversations (SFTTrainer: apply_chat_template with assistant masks, labels,
bfd packing), on the same cores, in one run.

    python benchmarks/bench_chat.py                  # 40 MB of conversations, 2 processes each, 3 rounds
    python benchmarks/bench_chat.py --mb 10
    python benchmarks/bench_chat.py --mb 500 --rounds 1
    python benchmarks/bench_chat.py --turns 8-16     # long conversations: one render against prefixes

Conversations: real source text (bench_job's corpus) cut into turns of 200-1,500 characters, 1-3
user/assistant turns each (--turns), a system prompt in one of four; JSONL shards of ~6 MB.
Tokenizer: a byte-level BPE (8,192) trained on that text (--tokenizer: a real model's,
bench_job.REAL), with ChatML's special tokens, in a model directory whose template marks assistant
text with {% generation %} (TRL's assistant_only_loss needs the markers). Both prepare packs of
4,096 tokens, a conversation never split (raypack: overflow truncate; TRL: bfd, which truncates
too). raypack runs three ways: with the markers; with the same template without them
(tokenizer.chat_spans auto: one render for 3+ assistant turns, else growing prefixes); and without
them rendering every turn's prefixes (chat_spans prefixes). TRL runs in a process of its own with
dataset_num_proc = the cores; its time is SFTTrainer's constructor (the dataset preparation; the
tiny model takes milliseconds). Each round runs every preparation once, in turn; the table gives
each one's median over the rounds (the machines are shared and noisy: a ratio of medians of
interleaved runs). Trained tokens are compared: the masks must agree.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_job import REAL, real_tokenizer, source_texts

from raypack.demo import train_byte_level_bpe

SEQ = 4096
SHARD_BYTES = 6_000_000
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MARKED = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
PLAIN = MARKED.replace("{% generation %}", "").replace("{% endgeneration %}", "")

TRL_SCRIPT = """
import json, sys, time, glob
import datasets, transformers, trl
model_dir, corpus, seq, procs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
files = sorted(glob.glob(corpus + "/*.jsonl"))
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
cfg = transformers.LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=seq)
model = transformers.LlamaForCausalLM(cfg)
t0 = time.perf_counter()
ds = datasets.load_dataset("json", data_files=files, split="train")
args = trl.SFTConfig(output_dir=model_dir + "/trl-out", max_length=seq, packing=True,
    packing_strategy="bfd", assistant_only_loss=True, dataset_num_proc=procs, report_to=[],
    use_cpu=True)
trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
seconds = time.perf_counter() - t0
packed = trainer.train_dataset
trained = sum(sum(1 for x in labels if x != -100) for labels in packed["labels"])
print(json.dumps({"seconds": seconds, "packs": len(packed), "trained": trained}))
"""


def conversations(mb: int, seed: int = 0, turns: tuple[int, int] = (1, 3)) -> list[dict[str, object]]:
    rng = random.Random(seed)
    turns_hi = turns[1]
    out, total, pieces = [], 0, []
    for text in source_texts():
        at = 0
        while at < len(text):
            n = rng.randint(200, 1500)
            pieces.append(text[at : at + n])
            at += n
        while len(pieces) >= 2 * turns_hi:
            messages = (
                [{"role": "system", "content": "Answer as the code's author."}] if rng.random() < 0.25 else []
            )
            for _ in range(rng.randint(*turns)):
                messages += [
                    {"role": "user", "content": pieces.pop()},
                    {"role": "assistant", "content": pieces.pop()},
                ]
            out.append({"messages": messages})
            total += sum(len(m["content"].encode()) for m in messages)
        if total >= mb * 10**6:
            break
    return out


def write_shards(records: list[dict[str, object]], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shard, size, index = [], 0, 0
    for record in records:
        line = json.dumps(record) + "\n"
        shard.append(line)
        size += len(line)
        if size >= SHARD_BYTES:
            (folder / f"part-{index:04d}.jsonl").write_text("".join(shard))
            shard, size, index = [], 0, index + 1
    if shard:
        (folder / f"part-{index:04d}.jsonl").write_text("".join(shard))


def model_dir(folder: Path, records: list[dict[str, object]], tokenizer: str = "trained") -> Path:
    """A model directory: the tokenizer (trained here, or a real one with ChatML's tokens added:
    bench_job.REAL) and the ChatML template."""
    if tokenizer == "trained":
        texts = (m["content"] for r in records[:3000] for m in r["messages"])  # type: ignore[attr-defined]
        tok = train_byte_level_bpe(texts, 8192, SPECIALS)
    else:
        from tokenizers import AddedToken, Tokenizer

        tok = Tokenizer.from_file(str(real_tokenizer(folder.parent, tokenizer)))
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": MARKED,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "plain.jinja").write_text(PLAIN)
    return folder


def raypack(
    work: Path, corpus: Path, model: Path, name: str, template: str | None, spans: str = "auto"
) -> tuple[float, dict]:
    cfg = {
        "input": {"paths": [f"{corpus}/*.jsonl"], "messages_field": "messages"},
        "tokenizer": {
            "path": str(model),
            "chat_spans": spans,
            **({"chat_template": template} if template else {}),
        },
        "pack": {"seq_len": SEQ, "overflow": "truncate"},
        "output": {"path": str(work / name), "format": "trl", "shard_rows": 2000},
    }
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "raypack.cli", "pack", str(path), "--overwrite", "--quiet"],
        check=True,
        capture_output=True,
    )
    seconds = time.perf_counter() - t0
    run = json.loads((work / name / "metrics.json").read_text())
    return seconds, {"packs": run["metrics"]["packs"], "trained": run["chat"]["trained_tokens_packed"]}


def trl(model: Path, corpus: Path, cores: int) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as cache:  # a fresh datasets cache: its map results are cached
        done = subprocess.run(
            [sys.executable, "-c", TRL_SCRIPT, str(model), str(corpus), str(SEQ), str(cores)],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "HF_DATASETS_CACHE": cache},
        )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    return theirs["seconds"], theirs


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3, help="each preparation's runs (median taken)")
    parser.add_argument("--turns", default="1-3", help="user/assistant turns a conversation: LO-HI")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-chat")
    parser.add_argument(
        "--tokenizer",
        default="trained",
        choices=["trained", *REAL],
        help="trained: a byte-level BPE of 8,192 trained here; else a real model's (ChatML's tokens added)",
    )
    args = parser.parse_args()
    lo, hi = (int(x) for x in args.turns.split("-"))
    cores = os.cpu_count() or 1
    records = conversations(args.mb, turns=(lo, hi))
    corpus = args.work / f"chat-{args.mb}mb-{lo}-{hi}turns"
    if not corpus.exists():
        write_shards(records, corpus)
    model = model_dir(args.work / f"model-{args.tokenizer}", records, args.tokenizer)
    mb = sum(f.stat().st_size for f in corpus.glob("*.jsonl")) / 1e6
    print(
        f"{len(records):,} conversations of {lo}-{hi} turns, {mb:.1f} MB of JSONL, {cores} cores, "
        f"seq_len {SEQ}, {args.rounds} round(s), tokenizer {args.tokenizer}"
    )
    plain = str(model / "plain.jinja")
    runs: dict[str, Any] = {
        "raypack, {% generation %} markers": lambda: raypack(args.work, corpus, model, "marked", None),
        "raypack, no markers (chat_spans auto)": lambda: raypack(args.work, corpus, model, "auto", plain),
        "raypack, no markers, every turn's prefixes (chat_spans prefixes)": lambda: raypack(
            args.work, corpus, model, "prefixes", plain, "prefixes"
        ),
        "TRL SFTTrainer (assistant_only_loss, bfd)": lambda: trl(model, corpus, cores),
    }
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    last: dict[str, Any] = {}
    for _ in range(args.rounds):
        for name, run in runs.items():
            s, last[name] = run()
            seconds[name].append(s)
    theirs = statistics.median(seconds["TRL SFTTrainer (assistant_only_loss, bfd)"])
    print("| preparation | seconds (median) | runs | MB/s | packs | trained tokens | vs TRL |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for name in runs:
        packs, trained = last[name]["packs"], last[name]["trained"]
        median = statistics.median(seconds[name])
        each = " ".join(f"{x:.1f}" for x in seconds[name])
        print(
            f"| {name} | {median:.1f} | {each} | {mb / median:.2f} | {packs:,} | {trained:,} | "
            f"×{theirs / median:.2f} |"
        )


if __name__ == "__main__":
    main()
