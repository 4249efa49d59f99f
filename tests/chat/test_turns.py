"""A template without {% generation %} markers: the assistant turns from one render (tokenizer.chat_spans
auto) are the ones prefix renders find, on templates written after published ones and on every
conversation shape hypothesis draws; the one render is taken where it should be, and a job whose
self-check finds a difference renders prefixes for every conversation."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raypack.config import load_config
from raypack.pipeline.job import run_job
from raypack.text import chat
from raypack.text.chat import ONE_RENDER_TURNS, ChatTemplate, RenderError, message_starts
from raypack.verifier import verify
from tests.chatdata import (
    CHATML,
    DROPS_REASONING,
    GEMMA_LIKE,
    LLAMA3_LIKE,
    MISTRAL_LIKE,
    QWEN3_LIKE,
    ZEPHYR_LIKE,
    chat_model,
    words,
)
from tests.conftest import write_jsonl

VARIABLES = {"bos_token": "<s>", "eos_token": "</s>"}
TEMPLATES = {
    "chatml": CHATML,
    "llama3": LLAMA3_LIKE,
    "gemma": GEMMA_LIKE,
    "zephyr": ZEPHYR_LIKE,
    "mistral": MISTRAL_LIKE,
    "qwen3": QWEN3_LIKE,
    "drops_reasoning": DROPS_REASONING,
}

texts = st.text(alphabet=st.sampled_from(list("ab cd\n\t日本🙂<|>")), max_size=12)


@st.composite
def conversations(draw: Any) -> list[dict[str, Any]]:
    """1-10 assistant turns: a system prompt or not, content padded with spaces, empty or None, tool
    calls and their results, reasoning on some turns, a user turn after the last assistant's."""
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(texts)})
    for _ in range(draw(st.integers(1, 10))):
        messages.append({"role": "user", "content": draw(texts)})
        turn: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(texts, st.none()))}
        if draw(st.integers(0, 5)) == 0:
            turn["reasoning_content"] = draw(texts)
        if draw(st.integers(0, 5)) == 0:
            turn["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]
            messages.append(turn)
            turn = {"role": "tool", "content": draw(texts)}
        elif turn["content"] is None:
            turn["content"] = ""
        messages.append(turn)
    if draw(st.booleans()):
        messages.append({"role": "user", "content": draw(texts)})
    return messages


def outcome(template: ChatTemplate, messages: list[dict[str, Any]], spans: str) -> Any:
    try:
        return template.conversation(messages, None, "assistant", spans=spans)
    except RenderError as e:  # refused (gemma's system role) or not prefix-stable: the same either way
        return type(e).__name__, str(e)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations())
def test_one_render_finds_the_turns_prefix_renders_find(name: str, messages: list[dict[str, Any]]) -> None:
    template = ChatTemplate(TEMPLATES[name], name, VARIABLES)
    assert outcome(template, messages, "auto") == outcome(template, messages, "prefixes")


def plain(rng: random.Random, turns: int, system: bool = True) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "be brief"}] if system else []
    for t in range(turns):
        messages.append({"role": "user", "content": words(rng, 1 + rng.randrange(20))})
        content = words(rng, rng.randrange(30))
        messages.append({"role": "assistant", "content": f"  {content}\n" if t % 3 == 1 else content})
    return messages


class Counted(ChatTemplate):
    """Counts renders."""

    renders = 0

    def _render(self, *args: Any, **kwargs: Any) -> Any:
        self.renders += 1
        return super()._render(*args, **kwargs)


@pytest.mark.parametrize("name", ["chatml", "llama3", "gemma", "zephyr", "mistral", "qwen3"])
def test_a_conversation_of_many_plain_turns_is_rendered_four_times_not_twice_a_turn(name: str) -> None:
    """Ten assistant turns: one render, the first turn's two prefixes and the last's one (the whole
    text is its other): 4, against one and two a turn less that one (20); fewer than
    ONE_RENDER_TURNS turns: prefixes, which cost no more."""
    rng = random.Random(4)
    system = name not in ("gemma", "mistral")
    for turns, auto, prefixes in [(10, 4, 20), (ONE_RENDER_TURNS - 1, 2 * (ONE_RENDER_TURNS - 1), None)]:
        messages = plain(rng, turns, system)
        template = Counted(TEMPLATES[name], name, VARIABLES)
        found = template.conversation(messages, None, "assistant")
        assert template.renders == auto
        template.renders = 0
        assert template.conversation(messages, None, "assistant", spans="prefixes") == found
        assert template.renders == (prefixes or auto)


def test_a_turn_unlike_the_first_and_last_sends_the_conversation_to_prefix_renders() -> None:
    """A middle turn with reasoning (the first and last have none): Qwen3-like templates drop it
    from the whole render, which prefix renders refuse; one render must not take it."""
    rng = random.Random(5)
    messages = plain(rng, 5)
    messages[6]["reasoning_content"] = "a thought"
    template = Counted(QWEN3_LIKE, "qwen3", VARIABLES)
    with pytest.raises(chat.NotPrefixStable, match="up to assistant turn 6 renders as something other"):
        template.conversation(messages, None, "assistant")
    # The one render and its checks (4), then prefixes up to the turn that is refused (3 turns).
    assert template.renders == 4 + 2 * 3
    del messages[6]["reasoning_content"]
    messages[6]["name"] = "a field the first and last turns do not have"
    template.renders = 0
    found = template.conversation(messages, None, "assistant")
    assert template.renders == 4 + 2 * 5 - 1  # taken by prefixes, which find what one render would
    assert found == template.conversation(messages[:], None, "assistant", spans="prefixes")


def test_message_starts_follow_the_pass_that_writes_the_messages() -> None:
    # A loop over three messages, each read twice as it is written.
    assert message_starts([(0, 0), (0, 0), (1, 10), (1, 12), (2, 30)], 3) == [0, 10, 30]
    # A reversed scan before any output (Qwen3's last query), then the loop.
    assert message_starts([(2, 5), (1, 5), (0, 5), (0, 5), (1, 20), (2, 40)], 3) == [5, 20, 40]
    # Looks back at messages[0] inside the loop: passed over.
    assert message_starts([(0, 0), (1, 7), (0, 9), (2, 15), (3, 22), (0, 25)], 4) == [0, 7, 15, 22]
    # A look ahead at the next message (Qwen2.5's tool turns) moves that message's start early:
    # one_render_spans' checks then send the conversation to prefix renders.
    assert message_starts([(0, 0), (1, 7), (2, 15), (3, 18), (3, 22)], 4) == [0, 7, 15, 18]
    # A message never read in the pass (the template skipped it): no starts.
    assert message_starts([(0, 0), (2, 10)], 3) is None
    assert message_starts([], 0) is None


def test_one_render_keeps_a_template_that_rewrites_earlier_turns_refused() -> None:
    messages = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "a1", "reasoning_content": "t1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2", "reasoning_content": "t2"},
        {"role": "user", "content": "q3"},
        {"role": "assistant", "content": "a3", "reasoning_content": "t3"},
    ]
    with pytest.raises(chat.NotPrefixStable):
        ChatTemplate(DROPS_REASONING, "drops", VARIABLES).conversation(messages, None, "assistant")


def test_transformers_finds_the_same_turns_on_many_turn_conversations(tmp_path: Path) -> None:
    """The spans one render gives decode to what each assistant turn adds to transformers'
    apply_chat_template renders of growing prefixes (the real client, not our prefix code)."""
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(chat_model(tmp_path / "model")))
    template = Counted(CHATML, "chatml", {})
    rng = random.Random(6)
    for turns in (3, 6, 12):
        messages = plain(rng, turns)
        template.renders = 0
        text, spans = template.conversation(messages, None, "assistant")
        assert template.renders == 4 and text == hf.apply_chat_template(messages, tokenize=False)
        want = []
        for i, m in enumerate(messages):
            if m["role"] == "assistant":
                before = hf.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True)
                through = hf.apply_chat_template(messages[: i + 1], tokenize=False)
                want.append((len(before), len(through)))
        assert spans == want


def test_a_job_whose_self_check_finds_a_difference_renders_prefixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many-turn conversations pack to the same bytes with chat_spans auto and prefixes; where the
    driver's self-check sees one render differ (made to here), the job says so, every worker
    renders prefixes, the manifest says which ran, and verify renders as the job did."""
    model = chat_model(tmp_path / "model")
    rng = random.Random(7)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"messages": plain(rng, 3 + i % 6)} for i in range(40)])
    data = {
        "input": {"paths": [f"{corpus}/*.jsonl"], "messages_field": "messages"},
        "tokenizer": {"path": str(model), "concurrency": 1},
        "pack": {"seq_len": 1024, "overflow": "truncate"},
        "output": {"path": str(tmp_path / "out")},
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(data))

    def packed(name: str, *overrides: str) -> tuple[dict[str, Any], bytes, list[str]]:
        cfg = load_config(str(tmp_path / "job.yaml"), [f"output.path={tmp_path / name}", *overrides])
        logs: list[str] = []
        run_job(cfg, log=logs.append)
        report = verify(str(tmp_path / name), load_config(str(tmp_path / "job.yaml")), sample=40)
        assert report.ok, report.problems
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        data = b"".join(p.read_bytes() for p in sorted((tmp_path / name / "data").rglob("*.parquet")))
        return manifest["chat"], data, logs

    auto, auto_data, _ = packed("auto")
    exact, exact_data, _ = packed("prefixes", "tokenizer.chat_spans=prefixes")
    assert (auto["spans"], exact["spans"]) == ("auto", "prefixes") and auto_data == exact_data

    real = chat.one_render_spans

    def shifted(*args: Any) -> Any:
        found = real(*args)
        return None if found is None else [(s + 1, e) for s, e in found]

    monkeypatch.setattr(chat, "one_render_spans", shifted)
    told, told_data, logs = packed("told")
    assert told["spans"] == "prefixes" and "one render gave spans" in told["spans_differ"]
    assert any("one render found other assistant turns than prefix renders" in line for line in logs)
    assert told_data == exact_data


@st.composite
def offsets_and_spans(draw: Any) -> tuple[Any, list[tuple[int, int]], int]:
    """Token offsets in order as tokenizers gives them (gaps a trimmed space leaves, zero-width
    tokens, a character of several bytes held by several tokens alike), or shuffled, and spans."""
    import numpy as np

    rows, at = [], 0
    for _ in range(draw(st.integers(0, 25))):
        at += draw(st.integers(0, 2))  # characters no token holds
        width = draw(st.integers(0, 3))
        rows += [(at, at + width)] * draw(st.integers(1, 3))
        at += width
    text_len = at + draw(st.integers(0, 3))
    offsets = np.asarray(rows, dtype=np.int64).reshape(-1, 2)
    if draw(st.booleans()) and len(offsets) > 1:
        offsets = offsets[draw(st.permutations(range(len(offsets))))]
    bound = st.integers(-1, text_len + 2)
    spans = draw(st.lists(st.tuples(bound, bound), max_size=4))
    return offsets, spans, text_len


@settings(max_examples=400, deadline=None)
@given(drawn=offsets_and_spans())
def test_the_mask_searched_in_ordered_offsets_is_the_mask_character_by_character(drawn: Any) -> None:
    offsets, spans, text_len = drawn
    want = chat._mask_by_characters(offsets[:, 0], offsets[:, 1], spans, text_len)
    assert chat.token_mask(offsets, spans, text_len).tolist() == want.tolist()


@settings(max_examples=300, deadline=None)
@given(batch=st.lists(offsets_and_spans(), max_size=6))
def test_a_batchs_masks_at_once_are_each_texts_mask(batch: list[Any]) -> None:
    """token_masks (a batch's offsets back to back, one search for all its spans) gives each text
    the mask token_mask gives it alone: texts in order or not, empty ones, spans out of range."""
    import numpy as np

    offsets = np.concatenate([o for o, _, _ in batch]) if batch else np.zeros((0, 2), dtype=np.int64)
    lengths = np.asarray([len(o) for o, _, _ in batch], dtype=np.int64)
    got = chat.token_masks(
        offsets.reshape(-1, 2), lengths, [s for _, s, _ in batch], [n for _, _, n in batch]
    )
    want = [chat.token_mask(o, s, n) for o, s, n in batch]
    assert got.tolist() == (np.concatenate(want).tolist() if want else [])
