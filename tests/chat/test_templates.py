"""Chat templates: prefix stability, config mistakes, BOS from a bare tokenizer.json, the date a template
prints, and where a template is looked for."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from raypack.cli import main
from raypack.config import JobConfig, from_dict
from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.verifier import verify
from tests.chat.conftest import SEQ, job, packed_conversations, quiet
from tests.chatdata import CHATML, DROPS_REASONING, words
from tests.conftest import write_jsonl

transformers = pytest.importorskip("transformers")


def test_a_template_that_is_not_prefix_stable_is_refused(model: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "reasoning"
    corpus.mkdir()
    convs = [
        [
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1", "reasoning_content": "thought one"},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": "a2", "reasoning_content": "thought two"},
        ]
    ] * 4
    write_jsonl(corpus / "r.jsonl", [{"messages": m} for m in convs])
    template = tmp_path / "qwen-like.jinja"
    template.write_text(DROPS_REASONING)
    cfg = job(tmp_path, corpus, model, "refused", tokenizer={"chat_template": str(template)})
    with pytest.raises(ConfigError, match=r"qwen-like\.jinja is not prefix-stable"):
        run_job(cfg, **quiet)
    assert main(["pack", str(tmp_path / "refused.yaml")]) == 2
    # pack.loss all needs no turn boundaries: the same template packs
    cfg = job(
        tmp_path, corpus, model, "all", tokenizer={"chat_template": str(template)}, pack={"loss": "all"}
    )
    assert run_job(cfg, **quiet).chat["trained_tokens_packed"] > 0


def test_chat_config_mistakes_are_clear(model: Path) -> None:
    base = {"paths": ["/x/*"], "messages_field": "messages"}
    for inputs, pack, output, match in [
        (base, {"overflow": "split"}, {}, "overflow split would cut a conversation"),
        (base, {"overflow": "truncate"}, {"format": "megatron"}, "keeps no loss mask"),
        (base, {"overflow": "truncate", "loss": "completion"}, {}, "completion is for prompt/completion"),
        ({"paths": ["/x/*"], "prompt_field": "p"}, {"overflow": "truncate"}, {}, "go together"),
        ({"paths": ["/x/*"]}, {"loss": "assistant"}, {}, "needs conversations or pairs"),
    ]:
        with pytest.raises(ConfigError, match=match):
            from_dict(
                JobConfig,
                {
                    "input": inputs,
                    "tokenizer": {"path": str(model)},
                    "pack": pack,
                    "output": {"path": "/tmp/o", **output},
                },
            )


# A Llama-3-style template: BOS from the `bos_token` variable and the date it prints (strftime_now).
LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y') %}{%- else %}{%- set date_string = '26 Jul 2024' %}"
    "{%- endif %}{%- endif %}"
    "{{- '<|im_start|>system\\nToday Date: ' + date_string + '<|im_end|>\\n' }}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bare tokenizer.json (no tokenizer_config.json) whose vocabulary names a BOS but no EOS, and
    a Llama-3-style template file beside it."""
    from raypack.demo import train_byte_level_bpe

    root = tmp_path_factory.mktemp("bare")
    rng = random.Random(5)
    texts = [words(rng, 200) for _ in range(200)]
    tok = train_byte_level_bpe(texts, 600, ["<|begin_of_text|>", "<|im_start|>", "<|im_end|>"])
    tok.save(str(root / "tokenizer.json"))
    (root / "llama3.jinja").write_text(LLAMA3_STYLE)
    return root


def _plain_conversations(seed: int, n: int) -> list[list[dict[str, Any]]]:
    rng = random.Random(seed)
    return [
        [
            {"role": r, "content": words(rng, 1 + rng.randrange(30))}
            for r in ("user", "assistant") * (1 + i % 2)
        ]
        for i in range(n)
    ]


def test_a_bare_tokenizer_json_gives_the_template_its_bos_and_needs_no_eos(
    bare: Path, tmp_path: Path
) -> None:
    """`{{ bos_token }}` renders the BOS the tokenizer resolves (here by its name) as transformers
    renders it given that bos_token, every conversation; a bare tokenizer.json with no EOS packs
    conversations (add_eos frames pairs only). A template that writes a BOS the tokenizer does not
    name is refused before any work, never rendered without it."""
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bare / "tokenizer.json"), bos_token="<|begin_of_text|>"
    )
    convs = _plain_conversations(11, 30)
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "c.jsonl", [{"messages": m} for m in convs])
    cfg = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "out",
        tokenizer={"chat_template": str(bare / "llama3.jinja")},
        input={"max_reject_ratio": 0.0},
    )
    result = run_job(cfg, **quiet)
    assert result.documents == 30
    got = packed_conversations(tmp_path / "out")
    for line, messages in enumerate(convs, start=1):
        want = hf.apply_chat_template(messages, chat_template=LLAMA3_STYLE, tokenize=True, return_dict=True)
        ids = list(want["input_ids"])
        assert ids[0] == hf.bos_token_id
        assert got[f"c.jsonl:{line}"][0] == ids[:SEQ]
    assert verify(str(tmp_path / "out"), cfg, sample=30).ok
    # A template writing {{ eos_token }} with a tokenizer that names none: refused, with the key to set.
    (tmp_path / "eos.jinja").write_text(CHATML + "{{ eos_token }}")
    refused = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "refused",
        tokenizer={"chat_template": str(tmp_path / "eos.jinja")},
    )
    with pytest.raises(ConfigError, match=r"writes \{\{ eos_token \}\}.*set tokenizer\.eos_id"):
        run_job(refused, **quiet)


@pytest.mark.slow  # 12 s
def test_a_template_that_prints_the_date_renders_one_date_per_dataset(
    bare: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """strftime_now prints tokenizer.chat_date; unset, the day of the first build, recorded in the
    manifest: a rebuild on a later day renders with it and reuses every token file, and verify on
    any day re-renders with the manifest's date."""
    import datetime as dt

    from raypack.pipeline import prepare as job_module
    from raypack.pipeline.rebuild import run_rebuild

    convs = _plain_conversations(12, 12)
    (tmp_path / "corpus").mkdir()
    write_jsonl(tmp_path / "corpus" / "c.jsonl", [{"messages": m} for m in convs])

    def on(day: dt.date) -> None:
        class Today(dt.date):
            @classmethod
            def today(cls) -> dt.date:
                return day

        monkeypatch.setattr(job_module, "date", Today)

    cfg = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "root",
        tokenizer={"chat_template": str(bare / "llama3.jinja"), "bos_id": 0},
    )
    on(dt.date(2025, 3, 4))
    first = run_rebuild(cfg, **quiet)
    on(dt.date(2026, 7, 8))
    second = run_rebuild(cfg, **quiet)
    assert (second.job.shards_reused, second.job.shards_tokenized) == (1, 0)
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(bare / "tokenizer.json"), bos_token="<|begin_of_text|>"
    )
    for version in (first.version, second.version):
        out = tmp_path / "root" / version
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["chat"]["date"] == "2025-03-04"
        packed = packed_conversations(out)
        for line, messages in enumerate(convs, start=1):
            text = hf.apply_chat_template(messages, chat_template=LLAMA3_STYLE, tokenize=False)
            decoded = hf.decode(packed[f"c.jsonl:{line}"][0])  # transformers printed today's date
            assert text.replace(dt.date.today().strftime("%d %b %Y"), "04 Mar 2025").startswith(decoded)
            assert "Today Date: 04 Mar 2025" in decoded
        assert verify(str(out), cfg, sample=12).ok  # renders with the manifest's date, not today's
    pinned = job(
        tmp_path,
        tmp_path / "corpus",
        bare / "tokenizer.json",
        "pinned",
        tokenizer={"chat_template": str(bare / "llama3.jinja"), "bos_id": 0, "chat_date": "2024-07-26"},
    )
    run_job(pinned, **quiet)
    assert json.loads((tmp_path / "pinned" / "manifest.json").read_text())["chat"]["date"] == "2024-07-26"
    assert all(
        "Today Date: 26 Jul 2024" in hf.decode(ids)
        for ids, _ in packed_conversations(tmp_path / "pinned").values()
    )


def test_a_tokenizer_json_given_alone_says_where_its_directorys_template_is(
    corpus: Path, model: Path, tmp_path: Path
) -> None:
    """tokenizer.path naming the tokenizer.json of a model directory reads that file alone (as
    transformers' tokenizer_file= does); a chat job then finds no template, and the error says the
    directory beside it has one and which key to change, before any work."""
    cfg = job(tmp_path, corpus, model / "tokenizer.json", "out")
    with pytest.raises(
        ConfigError, match=r"beside it has .*tokenizer_config\.json: set tokenizer\.path to that directory"
    ):
        run_job(cfg, **quiet)
    assert not (tmp_path / "out").exists()
