"""Token ids and trained-token masks of conversations and pairs, against transformers' apply_chat_template
and offsets."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from raypack.text.chat import Chat, ChatTemplate, token_mask
from tests.chat.conftest import conversations, ours
from tests.chatdata import CHATML, CHATML_MARKED, words

transformers = pytest.importorskip("transformers")


def test_ids_and_masks_equal_transformers_with_generation_markers(model: Path, hf: Any) -> None:
    template = ChatTemplate(
        CHATML_MARKED, "marked", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    )
    convs = conversations(7, 60)
    got = ours(model, template, [Chat(messages=tuple(m)) for m in convs])
    for messages, (ids, mask) in zip(convs, got, strict=True):
        want = hf.apply_chat_template(
            messages,
            chat_template=CHATML_MARKED,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
        )
        assert ids == list(want["input_ids"])
        assert [int(m) for m in mask] == list(want["assistant_masks"])
        assert any(mask)


def test_a_derived_mask_is_exactly_each_assistant_turn(model: Path, hf: Any) -> None:
    """No markers (the model directory's ChatML): the ids are apply_chat_template's, and the trained
    tokens decode to exactly the text each assistant turn adds to the rendering."""
    template = ChatTemplate(CHATML, "chatml", {})
    convs = conversations(8, 60)
    got = ours(model, template, [Chat(messages=tuple(m)) for m in convs])
    for messages, (ids, mask) in zip(convs, got, strict=True):
        assert ids == list(hf.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])
        turns = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
                through = hf.apply_chat_template(messages[: i + 1], tokenize=False)
                turns.append(through[len(before) :])
        runs, run = [], []
        for t, m in zip(ids, mask, strict=True):
            if m:
                run.append(t)
            elif run:
                runs.append(run)
                run = []
        runs += [run] if run else []
        assert [hf.decode(r) for r in runs] == turns


def test_token_mask_follows_char_to_token(hf: Any) -> None:
    """token_mask against the Encoding's own char_to_token on multi-byte text, where byte-level BPE
    gives several tokens one character: from the first token of a span's first character through the
    last token of its last (transformers' own mask stops at the first token of the last character,
    two bytes short of a closing 語)."""
    text = "ab 日本語 🙂 cd <|im_end|> ü"
    enc = hf(text, add_special_tokens=False)
    offsets = np.asarray(
        enc["offset_mapping"]
        if "offset_mapping" in enc
        else hf(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    )
    assert not token_mask(offsets, [(9, 9)], len(text)).any()  # an empty span trains nothing
    for s, e in [(0, 2), (3, 6), (7, 8), (3, len(text)), (0, len(text))]:
        mask = token_mask(offsets, [(s, e)], len(text))
        first = enc.char_to_token(s)
        last = max(
            t
            for t in range(len(offsets))
            if enc.token_to_chars(t) and enc.token_to_chars(t)[0] <= e - 1 < enc.token_to_chars(t)[1]
        )
        want = np.zeros(len(offsets), dtype=bool)
        want[first : last + 1] = True
        assert mask.tolist() == want.tolist(), (s, e)


def test_pairs_train_the_completion_and_eos(model: Path, hf: Any) -> None:
    docs = [
        Chat(prompt="Q: " + words(random.Random(i), 5) + "\nA:", completion=" " + words(random.Random(-i), 9))
        for i in range(20)
    ]
    got = ours(model, None, docs, messages_field=None, prompt_field="prompt", completion_field="completion")
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    for doc, (ids, mask) in zip(docs, got, strict=True):
        assert ids[:-1] == hf(doc.prompt + doc.completion, add_special_tokens=False)["input_ids"]
        assert ids[-1] == eos and mask[-1]
        trained = [t for t, m in zip(ids[:-1], mask[:-1], strict=True) if m]
        assert hf.decode(trained) == doc.completion


def test_a_completion_or_turn_starting_with_a_space_keeps_its_mask_with_trimmed_offsets(
    model: Path, tmp_path: Path
) -> None:
    """With a byte-level BPE whose post-processor trims offsets, the space before a word belongs to no
    token. A completion " Yes ..." trains every completion token and the EOS, as TRL does (its
    completion mask: the ids after the prompt's own), and an assistant turn " ..." under generation
    markers trains its tokens, not nothing."""
    from tokenizers import Tokenizer, processors

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trimmed = tmp_path / "trimmed"
    trimmed.mkdir()
    tok.save(str(trimmed / "tokenizer.json"))
    shutil.copy(model / "tokenizer_config.json", trimmed / "tokenizer_config.json")
    hf = transformers.AutoTokenizer.from_pretrained(str(trimmed))
    rng = random.Random(3)
    docs = [Chat(prompt="Q: " + words(rng, 6) + "?", completion=" " + words(rng, 12)) for _ in range(50)]
    got = ours(trimmed, None, docs, messages_field=None, prompt_field="prompt", completion_field="completion")
    eos = hf.convert_tokens_to_ids("<|im_end|>")
    for doc, (ids, mask) in zip(docs, got, strict=True):
        prompt_ids = hf(doc.prompt, add_special_tokens=False)["input_ids"]
        full = hf(doc.prompt + doc.completion, add_special_tokens=False)["input_ids"]
        assert full[: len(prompt_ids)] == prompt_ids  # TRL's rule applies: the prompt's ids come first
        assert ids == [*full, eos]
        assert mask == [False] * len(prompt_ids) + [True] * (len(full) - len(prompt_ids) + 1)
    template = ChatTemplate(CHATML_MARKED, "marked", {"eos_token": "<|im_end|>"})
    turns = [
        Chat(
            messages=(
                {"role": "user", "content": words(rng, 5)},
                {"role": "assistant", "content": " " + words(rng, 9)},
            )
        )
        for _ in range(20)
    ]
    for chat, (ids, mask) in zip(turns, ours(trimmed, template, turns), strict=True):
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        assert hf.decode(trained) == chat.messages[1]["content"] + "<|im_end|>"
