"""The tokenize stage's backends: fastokens gives `tokenizers`' ids wherever raypack lets it run (the
self-check before the job, a sampled check in every task), a backend made to differ is caught and
the job fails over with byte-identical output, and a tokenizer fastokens refuses runs on tokenizers
and says so."""

from __future__ import annotations

import io
import json
import random
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

import raypack
from raypack.cli import main
from raypack.config import TokenizerConfig, load_config
from raypack.demo import train_byte_level_bpe
from raypack.errors import ConfigError
from raypack.pipeline.job import run_job
from raypack.pipeline.tokenize import stage as tokenize_stage
from raypack.text import backends
from raypack.text.backends import (
    FastokensEncoder,
    Mismatch,
    TokenizersEncoder,
    choose_backend,
    first_difference,
)
from raypack.text.files import read_tokenizer
from raypack.verifier import verify
from tests.conftest import WORDS, job_config, make_corpus, write_jsonl
from tests.fakes import Differs, OneIdOff, Unchecked

pytest.importorskip("fastokens")  # installed wherever it has a wheel (pyproject); CI's x86_64 has one


def _texts(n: int = 200) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choice(WORDS) for _ in range(150)) + " café 日本 🙂" for _ in range(n)]


def _sentencepiece_style() -> Tokenizer:
    """A Llama/Mistral-style BPE: ▁ for spaces by normalizer (Prepend/Replace), byte fallback."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    trainer = trainers.BpeTrainer(
        vocab_size=700,
        special_tokens=["<unk>", "<s>", "</s>", *[f"<0x{i:02X}>" for i in range(256)]],
        show_progress=False,
    )
    tok.train_from_iterator(_texts(), trainer=trainer)
    return tok


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[UNK]", "[CLS]", "[SEP]"], show_progress=False
    )
    tok.train_from_iterator(_texts(), trainer=trainer)
    return tok


def _metaspace() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False
    )
    tok.train_from_iterator(_texts(), trainer=trainer)
    return tok


def _nfkc(base: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(base))
    tok.normalizer = normalizers.NFKC()
    return tok


def _stripping(base: Path) -> Tokenizer:
    """A normalizer fastokens 0.3 refuses that is no normal form (it rewrites text)."""
    tok = Tokenizer.from_file(str(base))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Strip()])
    return tok


@pytest.fixture(scope="module")
def fast_tokenizers(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> dict[str, Path]:
    """Tokenizers fastokens loads: the tests' byte-level BPE, the demo's (a 2k GPT-2-style BPE with
    the demo's specials), a model directory (DeepSeek-style specials in tokenizer_config.json), a
    SentencePiece-style BPE with byte fallback, the tests' BPE with an NFKC normalizer (fastokens
    loads it without: a text NFKC changes is tokenizers' to encode, backends.fast_json)."""
    root = tmp_path_factory.mktemp("backends")
    demo = root / "demo.json"
    train_byte_level_bpe(_texts(), 2000, ["<|endoftext|>", "<|pad|>", "<think>", "</think>"]).save(str(demo))
    model = root / "model"
    model.mkdir()
    special = ["<unk>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"]
    train_byte_level_bpe(_texts(), 600, special).save(str(model / "tokenizer.json"))
    (model / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": special[2], "bos_token": special[1]})
    )
    sp = root / "sp.json"
    _sentencepiece_style().save(str(sp))
    nfkc = root / "nfkc.json"
    _nfkc(tokenizer_path).save(str(nfkc))
    return {
        "tests": tokenizer_path,
        "demo": demo,
        "model_directory": model,
        "sentencepiece": sp,
        "nfkc": nfkc,
    }


def _encoders(path: Path) -> tuple[Any, TokenizersEncoder, FastokensEncoder]:
    tok = read_tokenizer(TokenizerConfig(path=str(path)))
    return tok, TokenizersEncoder(tok.tokenizer), FastokensEncoder(tok.json)


SPECIALS = ["<|endoftext|>", "<s>", "</s>", "<think>", "<｜end▁of▁sentence｜>", "<unk>", "<0x41>"]


@pytest.mark.parametrize(
    "name",
    [
        "tests",
        "demo",
        "model_directory",
        "sentencepiece",
        "nfkc",
        "mistral_v1",
        "mistral_v1_metaspace",
        "tekken",
    ],
)
def test_fastokens_gives_the_ids_of_tokenizers_on_adversarial_text(
    fast_tokenizers: dict[str, Path], name: str, request: pytest.FixtureRequest
) -> None:
    """Ids equal on the probes and on generated text, for trained tokenizers and real ones
    (Mistral-7B-v0.1's SentencePiece BPE in its published shape, and as transformers 5 converts
    it: a Metaspace fastokens refuses, loaded as the published shape, a text that starts with a
    space going to tokenizers; tekken, a 131k tiktoken-style BPE)."""
    path = fast_tokenizers.get(name) or request.getfixturevalue(name)
    tok, reference, fast = _encoders(path)
    choice = choose_backend("auto", tok, lambda: _texts(20))
    assert choice.backend == "fastokens", choice.reason
    assert first_difference(reference, fast, backends.probes(tok.added_tokens())) is None

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        st.lists(
            st.one_of(
                st.text(st.characters(exclude_categories=["Cs"]), max_size=60),
                st.sampled_from(SPECIALS),
                st.text(" \t\r\n\u00a0\u3000", max_size=12),
                st.sampled_from(WORDS),
            ),
            max_size=12,
        )
    )
    def same(parts: list[str]) -> None:
        text = "".join(parts)
        assert first_difference(reference, fast, [text, " " + text, text + text]) is None, repr(text)

    same()


@pytest.mark.parametrize("kind", ["wordpiece", "metaspace", "strip"])
def test_a_tokenizer_fastokens_refuses_runs_on_tokenizers_and_says_so(
    tmp_path: Path, tokenizer_path: Path, kind: str
) -> None:
    tok = {"wordpiece": _wordpiece, "metaspace": _metaspace, "strip": lambda: _stripping(tokenizer_path)}[
        kind
    ]()
    path = tmp_path / f"{kind}.json"
    tok.save(str(path))
    loaded = read_tokenizer(TokenizerConfig(path=str(path), add_eos=False))
    choice = choose_backend("auto", loaded, lambda: _texts(5))
    assert choice.backend == "tokenizers" and "fastokens 0.3" in choice.reason and "refuses" in choice.reason
    with pytest.raises(
        ConfigError, match=r"tokenizer.backend fastokens: fastokens .* refuses this tokenizer"
    ):
        choose_backend("fastokens", loaded, list)


def test_chat_with_a_byte_level_bpe_whose_normalizer_rewrites_text_says_which_step(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Conversations with a byte-level BPE whose normalizer strips: its offsets do not follow from
    its ids, and the reason names the step (a reason that names only "a byte-level BPE" would not
    tell why)."""
    path = tmp_path / "strip.json"
    _stripping(tokenizer_path).save(str(path))
    loaded = read_tokenizer(TokenizerConfig(path=str(path), add_eos=False))
    assert loaded.offsets() is None
    choice = choose_backend("auto", loaded, list, chat=True)
    assert choice.backend == "tokenizers" and "this one's normalizer has Strip)" in choice.reason


def test_a_refusal_on_a_ray_worker_gives_fastokens_reason_not_rays_header(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """On Ray the check's fastokens runs in a task, and its refusal reaches the driver as a
    RayTaskError(FastRefused), whose text is Ray's header: told as is, the reason would say
    "ray::fast_encode() (pid=..., ...)", the manifest would differ between runs by the pid, and
    fastokens' own reason would be lost. It is the task's exception that is told."""
    from ray.exceptions import RayTaskError

    path = tmp_path / "strip.json"
    _stripping(tokenizer_path).save(str(path))
    loaded = read_tokenizer(TokenizerConfig(path=str(path), add_eos=False))
    try:
        FastokensEncoder(loaded.json)
    except backends.FastRefused as refused:
        on_worker = RayTaskError("fast_encode", "Traceback ...", refused).as_instanceof_cause()
    assert isinstance(on_worker, backends.FastRefused) and "pid=" in str(on_worker)

    def worker() -> Any:
        raise on_worker

    choice = choose_backend("auto", loaded, list, worker)
    assert choice.backend == "tokenizers" and "Strip" in choice.reason and "pid=" not in choice.reason


def test_tokenizer_backend_fastokens_that_it_refuses_leaves_the_dataset_it_would_replace(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tokenizer.backend: fastokens` asks for it by name, so its refusal is an error: one line,
    and with `--overwrite` the previous dataset still in place (the check ends before the output
    is cleared; with `auto` the workers start beside it, as `auto` never fails on it). A trial found
    the output emptied."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=12)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out" / "data").iterdir()}
    refused = tmp_path / "strip.json"
    _stripping(tokenizer_path).save(str(refused))
    capsys.readouterr()
    sets = ["--set", f"tokenizer.path={refused}", "--set", "tokenizer.backend=fastokens"]
    assert main(["pack", str(cfg), "--quiet", "--overwrite", *sets]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer.backend fastokens: fastokens" in err[0] and "refuses" in err[0], err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "data").iterdir()} == before
    assert (tmp_path / "out" / "manifest.json").exists()


class _Spy(TokenizersEncoder):
    """tokenizers, noting the texts it is given."""

    def __init__(self, inner: TokenizersEncoder) -> None:
        super().__init__(inner.tokenizer)
        self.seen: list[list[str]] = []

    def encode(self, texts: list[str]) -> tuple[Any, Any]:
        self.seen.append(texts)
        return super().encode(texts)


def test_an_nfkc_byte_level_bpe_runs_on_fastokens_and_texts_nfkc_changes_on_tokenizers(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """fastokens refuses NFKC at load: it loads the tokenizer without it; a text NFKC leaves as it
    is goes to it as it stands, one NFKC changes ('ﬁ', '²', full-width letters) as tokenizers'
    NFKC writes it, and only one that also holds an added token (a text of several sections, each
    normalized apart) to tokenizers; the ids of a batch mixing them are tokenizers' in order; a
    job on the default path picks fastokens and writes the bytes tokenizers writes."""
    nfkc = tmp_path / "nfkc.json"
    _nfkc(tokenizer_path).save(str(nfkc))
    _, reference, fast = _encoders(nfkc)
    assert fast.route.forms == ("NFKC",)
    texts = [
        "plain words",
        "ﬁne x² Ｆｕｌｌ",
        "café 日本語",
        "",
        "Ｘ<s>",
        " ".join(WORDS[:50]),
        "e\u0301<s>x",
    ]
    assert [fast.route.copy(t) for t in texts] == ["main", "normalized", "main", "main", None, "main", None]
    assert first_difference(reference, fast, texts) is None
    spy = _Spy(reference)
    fast.reference = spy
    fast.encode(texts)
    assert spy.seen == [["Ｘ<s>", "e\u0301<s>x"]]
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=20, seed=3)
    compat = [{"text": f"ﬁle {i}² Ｆｕｌｌ width"} for i in range(10)]
    compat += [{"text": f"ﬁle {i}² <s> Ｆｕｌｌ width"} for i in range(3)]  # an added token too
    write_jsonl(corpus / "compat.jsonl", compat)
    path = job_config(tmp_path, f"{corpus}/*", nfkc)
    outs = {}
    for backend in ("auto", "tokenizers"):
        cfg = load_config(str(path), [f"output.path={tmp_path / backend}", f"tokenizer.backend={backend}"])
        result = run_job(cfg, log=lambda _: None)
        assert verify(str(tmp_path / backend), cfg, sample=40).ok
        outs[backend] = (result.backend, _data(tmp_path / backend))
    fast, reference = outs["auto"][0], outs["tokenizers"][0]
    assert fast["chosen"].startswith("fastokens ") and reference["chosen"].startswith("tokenizers ")
    assert outs["auto"][1] == outs["tokenizers"][1]
    # The texts NFKC changes that hold an added token went to tokenizers, and the run says how many
    # (the 3 of compat.jsonl); the 10 others went to fastokens normalized.
    assert fast["routed_to_tokenizers"]["texts"] == 3 and fast["routed_to_tokenizers"]["bytes"] > 0
    assert reference["routed_to_tokenizers"] == {"texts": 0, "bytes": 0}


def test_a_metaspace_sentencepiece_bpe_runs_on_two_fastokens_copies(mistral_v1_metaspace: Path) -> None:
    """transformers 5's Metaspace (prepend_scheme first), which fastokens refuses, runs on two copies:
    with Prepend + Replace where the Metaspace prepends `▁` to the text, with the Replace alone
    where it prepends none (the text starts with a space, `▁` or an added token, as every chat
    render that begins with `<s>` does); only a text with sections of both kinds is tokenizers'."""
    _, reference, fast = _encoders(mistral_v1_metaspace)
    assert fast.route.metaspace == "first"
    texts = {
        "Hello world": "main",
        " Hello world": "tail",
        "▁Hello": "tail",
        "  two spaces": "tail",
        "▁ ▁": "tail",
        " ": "plain",
        "<s>[INST] Hello [/INST] world</s>": "plain",
        " a</s> b": "plain",
        "Hello</s> world": None,
        "": "main",
    }
    assert {t: fast.route.copy(t) for t in texts} == texts
    assert first_difference(reference, fast, list(texts)) is None
    spy = _Spy(reference)
    fast.reference = spy
    fast.encode(list(texts))
    assert spy.seen == [["Hello</s> world"]]


def test_a_metaspace_text_that_starts_with_a_space_needs_no_second_copy(mistral_v1_metaspace: Path) -> None:
    """A text of one section that starts with a space or `▁` is main's, given the text but that
    character (the Replace alone writes `▁` + the rest as Prepend + Replace writes the rest): ids
    equal, and the copy without the Prepend (~0.35 s to make) is never made for it."""
    _, reference, fast = _encoders(mistral_v1_metaspace)
    texts = [
        " Hello world",
        "▁Hello",
        "  two spaces",
        " \n\tint main(void) { return 0; }",
        "▁▁x",
        " 日本語 🙂",
    ]
    for text in texts:
        assert fast.route.copy(text) == "tail", text
    assert first_difference(reference, fast, texts) is None
    assert fast.plain is None

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(st.characters(exclude_categories=["Cs"]), max_size=80), st.sampled_from([" ", "▁", "  "]))
    def same(text: str, lead: str) -> None:
        assert first_difference(reference, fast, [lead + text]) is None, repr(lead + text)

    same()


def test_a_backend_made_to_differ_is_caught_by_the_self_check(
    tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = read_tokenizer(TokenizerConfig(path=str(tokenizer_path)))
    real = backends.FastokensEncoder
    monkeypatch.setattr(backends, "FastokensEncoder", lambda j: OneIdOff(real(j), "日本語"))  # a probe
    choice = choose_backend("auto", tok, list)
    assert choice.backend == "tokenizers" and "gave other ids than tokenizers on text" in choice.reason
    monkeypatch.setattr(backends, "FastokensEncoder", lambda j: OneIdOff(real(j), "histogram"))  # corpus
    assert choose_backend("auto", tok, lambda: ["the histogram"]).backend == "tokenizers"
    with pytest.raises(ConfigError, match="gave other ids"):
        choose_backend("fastokens", tok, lambda: ["the histogram"])


def _data(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "data").rglob("*")) if p.is_file()}


def test_jobs_on_either_backend_write_the_same_bytes_and_a_difference_in_the_run_fails_over(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """auto picks fastokens and writes tokenizers' bytes. Then a fastokens that differs on one word
    the self-check does not meet: the tasks' sampled check finds it, the units are tokenized again
    with tokenizers, the job finishes on tokenizers and says so, and the bytes are the same again."""
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=9)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, tokenizer={"concurrency": 2})

    def pack(name: str, *overrides: str) -> tuple[Any, dict[str, bytes]]:
        cfg = load_config(str(path), [f"output.path={tmp_path / name}", *overrides])
        result = run_job(cfg, log=lambda _: None)
        assert verify(str(tmp_path / name), cfg, sample=20).ok
        return result, _data(tmp_path / name)

    reference, want = pack("reference", "tokenizer.backend=tokenizers")
    assert reference.backend["chosen"].startswith("tokenizers ") and reference.backend["failovers"] == []
    fast, got = pack("fast")
    assert fast.backend["chosen"].startswith("fastokens ") and fast.backend["finished_on"] == "fastokens"
    assert fast.backend["units_by_backend"] == {"fastokens": 4}
    assert fast.backend["checked_in_run"]["texts"] > 0 and fast.backend["checked_in_run"]["bytes"] > 0
    assert got == want
    manifest = json.loads((tmp_path / "fast" / "manifest.json").read_text())
    assert manifest["tokenizer"]["backend"] == fast.backend

    # The self-check passes (patched here in the driver); the workers' encoder differs on "histogram"
    # (the driver passes the class to the tasks: they import it from tests.fakes).
    chosen = backends.Choice("fastokens", fast.backend["chosen"].split()[1], "patched: no self-check")
    monkeypatch.setattr(tokenize_stage, "choose_backend", lambda *a, **k: chosen)
    monkeypatch.setattr(tokenize_stage, "TokenizeShards", Differs)
    failed, again = pack("failed_over")
    assert failed.backend["finished_on"] == "tokenizers" and failed.backend["failovers"]
    assert all(f.startswith(("unit ", "another actor found")) for f in failed.backend["failovers"])
    assert any(" ids, tokenizers " in f for f in failed.backend["failovers"])
    assert again == want


def test_the_summary_says_which_backend_ran_and_why(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=10, seed=10)
    stripping = tmp_path / "strip.json"
    _stripping(tokenizer_path).save(str(stripping))
    cfg = job_config(tmp_path, f"{corpus}/*", stripping)
    assert main(["pack", str(cfg)]) == 0
    out = capsys.readouterr()
    line = next(x for x in out.out.splitlines() if x.startswith("tokenizer "))
    assert "tokenizers 0." in line and "fastokens 0.3" in line and "refuses this tokenizer" in line
    assert "[raypack] tokenizer backend: tokenizers" in out.err
    assert main(["pack", str(cfg), "--overwrite", "--set", "tokenizer.backend=fastokens"]) == 2
    assert "tokenizer.backend fastokens: fastokens 0.3" in capsys.readouterr().err


def test_after_a_difference_nothing_the_fast_backend_wrote_reaches_the_output_and_the_root_remembers(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fastokens that differs in every unit, where the sampled checks catch it only in the last
    one (the smallest, tokenized last): the units it wrote before are tokenized again too, so the
    output is tokenizers' byte for byte, the cache keeps no file it wrote, and the next rebuild of
    the root picks tokenizers (reusing every file) without being told; asked for fastokens by name
    there, it refuses, saying why."""
    from raypack.pipeline.rebuild import cache_dir, run_rebuild

    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=9)
    write_jsonl(corpus / "zz-last.jsonl", [{"text": "histogram plan"}, {"text": "a histogram"}])
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, tokenizer={"concurrency": 1})
    reference = load_config(
        str(path), [f"output.path={tmp_path / 'reference'}", "tokenizer.backend=tokenizers"]
    )
    run_job(reference, log=lambda _: None)
    want = _data(tmp_path / "reference")

    cfg = load_config(str(path), [f"output.path={tmp_path / 'root'}"])
    monkeypatch.setattr(tokenize_stage, "TokenizeShards", Unchecked)
    first = run_rebuild(cfg, log=lambda _: None)
    monkeypatch.undo()
    backend = first.job.backend
    assert backend["chosen"].startswith("fastokens ") and backend["finished_on"] == "tokenizers"
    assert backend["failovers"] and backend["units_by_backend"] == {"tokenizers": 5}
    assert _data(tmp_path / "root" / first.version) == want
    cached = sorted(p.name for p in Path(cache_dir(str(tmp_path / "root"))).glob("*.arrow"))
    assert cached == sorted(f"{k}.arrow" for k in first.job.token_keys)  # none of fastokens' files
    second = run_rebuild(cfg, log=lambda _: None)
    assert second.job.backend["chosen"].startswith("tokenizers ")
    assert (
        "gave other ids than tokenizers for this tokenizer in an earlier run here"
        in second.job.backend["reason"]
    )
    assert (second.job.shards_reused, second.job.shards_tokenized) == (5, 0)
    assert _data(tmp_path / "root" / second.version) == want
    refused = r"tokenizer\.backend fastokens: fastokens .* in an earlier run here"
    with pytest.raises(ConfigError, match=refused):
        run_rebuild(
            load_config(str(path), [f"output.path={tmp_path / 'root'}", "tokenizer.backend=fastokens"]),
            log=lambda _: None,
        )


def test_units_the_workers_began_before_the_check_refused_fastokens_are_all_tokenized_again(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers start on the units with fastokens while the driver checks it. Accepted: its bytes
    are tokenizers'. Refused by the check (a fastokens that differs on a word of the corpus, not of
    the probes; the driver's corpus sample slowed, so that units are done before the check ends):
    every unit the workers began is tokenized again by tokenizers, and the bytes are tokenizers'
    again, with nothing of the refused run left in the output."""
    from raypack.pipeline.tokenize.pool import PoolFast, TokenizePool

    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=9)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    reference = load_config(
        str(path), [f"output.path={tmp_path / 'reference'}", "tokenizer.backend=tokenizers"]
    )
    run_job(reference, log=lambda _: None)
    want = _data(tmp_path / "reference")
    sample = tokenize_stage._corpus_sample
    monkeypatch.setattr(tokenize_stage, "_corpus_sample", lambda *a: (time.sleep(1.5), sample(*a))[1])

    for name, word in (("accepted", ""), ("refused", "histogram")):
        if word:
            monkeypatch.setattr(
                TokenizePool,
                "fast_encoder",
                lambda self, w=word: OneIdOff(PoolFast(self.runner, self.ctx, self.preload), w),
            )
        lines: list[str] = []
        result = raypack.pack(str(path), overrides=[f"output.path={tmp_path / name}"], log=lines.append)
        assert result.runner["name"] == "local"
        backend = result.backend
        began = next(
            (x for x in lines if re.search(r"\d+ units tokenized by fastokens \S+ before its check", x)), None
        )
        if word:
            assert began is not None and int(began.split()[1]) > 0, lines
            assert backend["chosen"].startswith("tokenizers ") and "histogram" in backend["reason"]
            assert backend["units_by_backend"] == {"tokenizers": 4} and backend["failovers"] == []
        else:
            assert began is None and backend["chosen"].startswith("fastokens "), lines
            assert backend["units_by_backend"] == {"fastokens": 4}
        assert _data(tmp_path / name) == want
        assert not (tmp_path / name / "_staging").exists()


def test_a_fastokens_that_did_not_load_refuses_the_units_before_its_check_ends(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tokenizer whose normalizer fastokens cannot load (NFKC, then Strip), backend auto, the
    driver's check slowed: the workers, started ahead of the check, tokenize nothing with
    tokenizers under fastokens' key (each such unit was tokenized twice: 33.8 against 21.3 s on 50
    MB). The bytes are those of tokenizers named."""
    stripped = tmp_path / "strip" / "tokenizer.json"
    stripped.parent.mkdir()
    _stripping(tokenizer_path).save(str(stripped))
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=9)
    path = job_config(tmp_path, f"{corpus}/*", stripped)
    run_job(load_config(str(path), [f"output.path={tmp_path / 'named'}", "tokenizer.backend=tokenizers"]))
    sample = tokenize_stage._corpus_sample
    monkeypatch.setattr(tokenize_stage, "_corpus_sample", lambda *a: (time.sleep(1.5), sample(*a))[1])
    lines: list[str] = []
    shown = io.StringIO()
    out = f"output.path={tmp_path / 'auto'}"
    result = raypack.pack(str(path), overrides=[out], log=lines.append, progress=shown)
    assert result.runner["name"] == "local"
    assert not any("before its check" in x for x in lines), lines
    # One tokenize pass shown, the one that tokenized: none of 0 units before it.
    assert re.findall(r"tokenize (\d+)/4 units", shown.getvalue()) == ["4"], shown.getvalue()
    # fastokens names NFKC, which raypack takes out for it when alone: the reason says what is not.
    assert result.backend["chosen"].startswith("tokenizers ") and "has Strip too" in result.backend["reason"]
    assert result.backend["units_by_backend"] == {"tokenizers": 4}
    assert _data(tmp_path / "auto") == _data(tmp_path / "named")


@pytest.mark.slow  # 11 s; its auto twin stays
def test_fastokens_asked_for_by_name_and_refused_after_the_workers_began_leaves_nothing(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tokenizer.backend fastokens, refused by the check after the workers tokenized units with it:
    a one-line ConfigError, and the output holds none of what they wrote (index files, rejects,
    staging); a rerun with auto finishes on tokenizers."""
    from raypack.pipeline.tokenize.pool import PoolFast, TokenizePool

    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=9)
    write_jsonl(corpus / "bad.jsonl", [b"{not json", {"text": "the plan"}])
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, tokenizer={"backend": "fastokens"})
    sample = tokenize_stage._corpus_sample
    monkeypatch.setattr(tokenize_stage, "_corpus_sample", lambda *a: (time.sleep(1.5), sample(*a))[1])
    monkeypatch.setattr(
        TokenizePool,
        "fast_encoder",
        lambda self: OneIdOff(PoolFast(self.runner, self.ctx, self.preload), "histogram"),
    )
    lines: list[str] = []
    with pytest.raises(ConfigError, match=r"tokenizer\.backend fastokens: fastokens .* other ids"):
        raypack.pack(str(path), log=lines.append)
    out = tmp_path / "out"
    assert any("tokenize" in x for x in lines)
    assert not out.exists() or not any(out.iterdir()), sorted(map(str, out.rglob("*")))
    result = raypack.pack(str(path), overrides=["tokenizer.backend=auto"], log=lines.append)
    assert result.backend["chosen"].startswith("tokenizers ") and verify(str(out)).ok


class _Raising:
    """A fast encoder that loads but raises on every text (as fastokens may on what it cannot do)."""

    name, version = "fastokens", "0.3.5"

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        raise self.error


class PanicException(BaseException):
    """The name pyo3 gives a Rust panic that reaches Python (a BaseException)."""


def test_a_fast_encoder_that_raises_or_panics_on_a_text_is_not_used_and_crashes_nothing(
    tokenizer_path: Path,
) -> None:
    """auto falls back to tokenizers saying why, fastokens by name is a one-line ConfigError, and in
    the run such an encoder's failure is a difference (the unit fails over); Ctrl-C still passes."""
    from raypack.text.backends import Guarded, Mismatch

    tok = read_tokenizer(TokenizerConfig(path=str(tokenizer_path)))
    for error, how in (
        (ValueError("cannot encode this"), "raised"),
        (PanicException("index out of bounds"), "panicked"),
    ):
        choice = choose_backend("auto", tok, list, lambda e=error: _Raising(e))
        assert choice.backend == "tokenizers", choice
        assert f"{how} on the texts of the check" in choice.reason and str(error) in choice.reason
        with pytest.raises(ConfigError, match=f"tokenizer.backend fastokens: fastokens .* {how} on"):
            choose_backend("fastokens", tok, list, lambda e=error: _Raising(e))
        with pytest.raises(Mismatch, match=f"fastokens {how} on 2 texts: {error}"):
            Guarded(_Raising(error)).encode(["a", "b"])
    with pytest.raises(KeyboardInterrupt):
        Guarded(_Raising(KeyboardInterrupt())).encode(["a"])


def test_the_in_run_check_leaves_out_what_tokenizers_encoded(tokenizer_path: Path) -> None:
    """Texts a fast encoder gave tokenizers (a normal form changed them, say) are tokenizers' ids
    already: the in-run check samples only the others, and the time tokenizers took on them is not
    counted as the fast encoder's (20% of it would go to the check's budget: a run that routes most
    texts would re-check ~8× as much)."""
    from raypack.text.encode import Checker

    _, reference, _ = _encoders(tokenizer_path)
    texts = [f"text {i}: " + " ".join(WORDS[i % 7 : i % 7 + 20]) for i in range(60)]
    flat, lengths = reference.encode(texts)
    checker = Checker(reference, "seed")
    spy = _Spy(reference)
    checker.reference = spy
    routed = tuple(range(0, 60, 2))
    checker.check(texts, flat, lengths, 10.0, routed)  # a budget for every text
    seen = [t for batch in spy.seen for t in batch]
    assert len(seen) == 30 and all(int(t.split()[1].rstrip(":")) % 2 for t in seen)


def test_the_in_run_check_keeps_its_share_over_a_workers_units_and_draws_by_length(
    tokenizer_path: Path,
) -> None:
    """A worker's units share one CheckBudget: 200 units of a fast encoder's 1 ms each re-check
    about CHECK_SHARE of the 200 ms, where a budget a unit (its floor each time) re-checks ~200
    floors' worth: 25× the share, as a 300 MB/s encoder on 2 MB units made it. And every
    character is as likely to be checked: of texts of 1 and of 64 characters, as many characters
    of each, about as many characters of each are checked (drawing only what fits the account
    checked the short ones alone), at no more than twice the share at any time."""
    from raypack.text.encode import CHECK_SHARE, CheckBudget, Checker

    _, reference, _ = _encoders(tokenizer_path)
    rate = 1024.0  # characters a second: a character costs 1/1024 s
    texts = ["x"] * 64 + ["y" * 64]

    def checked(budget_of: Callable[[], CheckBudget], units: int, fast_s: float) -> tuple[int, int]:
        short = long = 0
        for unit in range(units):
            checker = Checker(reference, f"unit {unit}", budget_of())
            checker.budget.rate = rate
            picked = checker._pick(texts, fast_s)
            checker.budget.check_s += sum(len(texts[i]) for i in picked) / rate  # as _spent adds it
            short += sum(len(texts[i]) for i in picked if i < 64)
            long += sum(len(texts[i]) for i in picked if i == 64)
        return short, long

    shared = CheckBudget()
    allowed = CHECK_SHARE * 200 * 0.001 * rate  # characters: 41
    assert sum(checked(lambda: shared, 200, 0.001)) <= allowed + 128  # a draw: one unit's texts at most
    assert shared.check_s <= CHECK_SHARE * shared.fast_s + 128 / rate
    assert sum(checked(CheckBudget, 200, 0.001)) >= 10 * allowed

    shared = CheckBudget()
    short, long = checked(lambda: shared, 400, 0.05)  # 4,096 characters' worth in all
    assert 0.25 <= long / (short + long) <= 0.75, (short, long)
    assert shared.check_s <= 2 * CHECK_SHARE * shared.fast_s  # a debt of one text at most
    assert abs(short + long - CHECK_SHARE * 400 * 0.05 * rate) <= 128 + 0.25 * CHECK_SHARE * 400 * 0.05 * rate


def test_the_in_run_check_reaches_inside_a_text_too_long_to_check_whole(tokenizer_path: Path) -> None:
    """A fast encoder that differs only on a word deep inside a 200,000-character text: a draw
    holds ~15,000 characters (0.05 s of fast encoding at the reference's 1 MB/s), so the text is
    never drawn whole; drawn in segments (text.cuts.segment) as any text is, some seeds' draws
    meet the difference, and their Mismatch names where. Without the encoder to encode segments
    (as before), none does. A segment is checked as a text of its own, so that a fast encoder
    with tokenizers' ids passes every draw."""
    from raypack.text.encode import Checker

    _, reference, fast = _encoders(tokenizer_path)
    words = [" ".join(WORDS[(i * 3) % 40 : (i * 3) % 40 + 12]) for i in range(4000)]
    long = "\n".join(words)[:200_000]
    at = 150_000 + long[150_000:].index(" ")
    long = long[:at] + " zqzqx" + long[at:]  # the one word the fake differs on
    texts = [" ".join(WORDS[i : i + 30]) for i in range(8)] + [long]
    differs = OneIdOff(fast, "zqzqx")
    flat, lengths = differs.encode(texts)

    def found(encoder: Any) -> list[str]:
        seen = []
        for seed in range(200):
            checker = Checker(reference, f"seed {seed}")
            try:
                checker.check(texts, flat, lengths, 0.05, (), encoder)
            except Mismatch as e:
                seen.append(str(e))
        return seen

    caught = found(differs)
    assert caught and all(m.startswith("characters ") and "-character text" in m for m in caught)
    assert found(None) == []
    fast_flat, fast_lengths = fast.encode(texts)
    checked = 0
    for seed in range(40):
        checker = Checker(reference, f"seed {seed}")
        checker.check(texts, fast_flat, fast_lengths, 0.05, (), fast)
        checked += checker.texts
    assert checked > 0


def test_texts_encoded_aside_leave_the_tally_of_routed_texts_alone(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A cut's window and a check's segment are encoded aside (encode_aside): a text the fast
    encoder gives tokenizers then is not counted among the unit's documents that went there."""
    from raypack.text.backends import Guarded, encode_aside

    nfkc = tmp_path / "nfkc.json"
    _nfkc(tokenizer_path).save(str(nfkc))
    _, reference, fast = _encoders(nfkc)
    fast.reference = reference
    guarded = Guarded(fast)
    texts = ["plain words", "Ｘ<s>", "e\u0301<s>x"]
    guarded.encode(texts)
    assert fast.routed[0] == 2
    flat, lengths = encode_aside(guarded, texts)
    assert fast.routed[0] == 2
    assert flat.tolist() == reference.encode(texts)[0].tolist() and lengths.tolist() == [
        int(n) for n in reference.encode(texts)[1]
    ]


def test_a_fast_encoder_is_loaded_warm_so_a_forked_worker_starts_with_its_tables_built(tekken: Path) -> None:
    """load_fast warms fastokens' copy (FastokensEncoder.warm) where a local pool's zygote loads it,
    without making a thread a fork would lose: a worker forked from it then encodes its first batch
    at the speed of its next (tekken's tables: ~0.1 s of CPU at a first encode, before the warm-up),
    with tokenizers' ids."""
    import os

    from raypack.pipeline.tokenize.worker import load_fast

    threads = len(os.listdir("/proc/self/task"))
    fast, why = load_fast(tekken.read_text())
    assert fast is not None, why
    assert len(os.listdir("/proc/self/task")) == threads  # no thread of fastokens' was made
    rng = random.Random(1)
    first, second = ([" ".join(rng.choice(WORDS) for _ in range(2000)) for _ in range(20)] for _ in range(2))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker as the zygote forks it: its first batch, then another of the same size
        try:
            costs = []
            for texts in (first, second):
                t0 = time.process_time()
                fast.encode(texts)
                costs.append(time.process_time() - t0)
            os.write(write, json.dumps([costs, fast.encode(first)[0].tolist()]).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        (cold, warm), ids = json.loads(pipe.read())
    os.waitpid(pid, 0)
    assert ids == TokenizersEncoder(Tokenizer.from_file(str(tekken))).encode(first)[0].tolist()
    assert cold <= 3 * warm + 0.01, (cold, warm)
