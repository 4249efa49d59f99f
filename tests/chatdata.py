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


def chat_model(root: Path, tokenizer: Path | None = None) -> Path:
    """A model directory: a byte-level BPE (600 tokens) with ChatML's specials, or the real
    `tokenizer` (tests/real_tokenizers.py) with them added, as a fine-tune adds them;
    tokenizer_config.json naming them and holding CHATML."""
    if tokenizer is None:
        rng = random.Random(1)
        texts = [" ".join(rng.choice(WORDS) for _ in range(200)) for _ in range(200)]
        tok = train_byte_level_bpe(texts, 600, SPECIALS)
    else:
        from tokenizers import AddedToken, Tokenizer

        tok = Tokenizer.from_file(str(tokenizer))
        tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIALS])
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


# Templates written after published ones' ways of rendering a turn, for the one-render spans'
# tests: Llama 3's (content trimmed inside a {% set %}, BOS on the first message), Gemma's
# (alternation checked against loop.index0, a role renamed), Zephyr's (a generation prompt shorter
# than the turn's header), Mistral's (no generation prompt; [INST] around user turns), and Qwen3's
# (a reversed scan of every message before any output; reasoning rendered only after the last
# user query; an empty system prompt default).
LLAMA3_LIKE = (
    "{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA_LIKE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate') }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}"
    "{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
ZEPHYR_LIKE = (
    "{% for message in messages %}\n{% if message['role'] == 'user' %}\n"
    "{{ '<|user|>\\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n"
    "{{ '<|system|>\\n' + message['content'] + "
    "eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\\n' + message['content'] + "
    "eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n"
    "{% endif %}\n{% endfor %}"
)
MISTRAL_LIKE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% else %}{{ message['content'] }}{% endif %}{% endfor %}"
)
QWEN3_LIKE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}{%- endif %}{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}"
    "{%- else %}{%- set content = '' %}"
    "{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or message.role == 'tool' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- if loop.index0 > ns.last_query_index and message.reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' + content }}"
    "{%- else %}{{- '<|im_start|>assistant\\n' + content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{- '\\n<tool_call>' + (call.function | tojson) + '</tool_call>' }}{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
