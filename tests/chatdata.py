"""Chat test data: a model directory whose tokenizer has ChatML's special tokens (transformers loads
it), chat templates with and without {% generation %} markers and one that is not prefix-stable,
and conversations of every shape the issue names (system prompts, tool calls, empty assistant turns,
multi-byte text)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from raypack.demo import train_byte_level_bpe
from tests.conftest import WORDS

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML without markers (the model directory's own template, in tokenizer_config.json).
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message.content %}{{ message['content'] }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{{ '<tool_call>' + (call.function | tojson) + '</tool_call>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# The same with {% generation %} around what the assistant writes and its end-of-turn token.
CHATML_MARKED = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}"
    "{% if message.content %}{{ message['content'] }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{{ '<tool_call>' + (call.function | tojson) + '</tool_call>' }}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Drops the reasoning of every assistant turn but the last (as Qwen3's template does): a prefix
# ending at an earlier turn renders its reasoning, the whole conversation does not.
DROPS_REASONING = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' and loop.last and message.reasoning_content %}"
    "{{ '<think>' + message.reasoning_content + '</think>' }}{% endif %}"
    "{{ message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def chat_model(root: Path) -> Path:
    """A model directory: a byte-level BPE (600 tokens) with ChatML's specials, tokenizer_config.json
    naming them and holding CHATML."""
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(200)]
    tok = train_byte_level_bpe(texts, 600, SPECIALS)
    root.mkdir(parents=True, exist_ok=True)
    tok.save(str(root / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": CHATML,
    }
    (root / "tokenizer_config.json").write_text(json.dumps(config))
    return root


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def conversation(rng: random.Random, i: int) -> list[dict[str, Any]]:
    """Conversations of the shapes the issue names, by i: plain turns, a system prompt, a tool call
    and its result, an empty assistant turn, multi-byte text."""
    kind = i % 5
    msgs: list[dict[str, Any]] = []
    if kind == 1:
        msgs.append({"role": "system", "content": "You answer in " + words(rng, 3)})
    turns = 1 + rng.randrange(3)
    for t in range(turns):
        msgs.append({"role": "user", "content": words(rng, 1 + rng.randrange(40))})
        if kind == 2 and t == 0:
            call = {"type": "function", "function": {"name": "lookup", "arguments": {"q": words(rng, 2)}}}
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            msgs.append({"role": "tool", "content": json.dumps({"result": words(rng, 3)})})
        if kind == 3 and t == 0:
            msgs.append({"role": "assistant", "content": ""})
            msgs.append({"role": "user", "content": words(rng, 2)})
        content = words(rng, 1 + rng.randrange(120))
        if kind == 4:
            content += " 日本語 — ü 🙂"
        msgs.append({"role": "assistant", "content": content})
    return msgs
