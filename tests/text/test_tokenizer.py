"""Where BOS/EOS come from: a Hugging Face model directory's tokenizer_config.json or
special_tokens_map.json, the post-processor template, an explicit id, a known name, or a clear error;
a file path or a directory, local or on S3."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from raypack.config import TokenizerConfig, load_config
from raypack.errors import ConfigError
from raypack.text.files import read_tokenizer
from tests import s3server
from tests.conftest import WORDS, job_config, make_corpus

# DeepSeek-V3's names.
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"


def train(special: list[str]) -> Tokenizer:
    rng = random.Random(1)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([" ".join(rng.choice(WORDS) for _ in range(100)) for _ in range(50)], trainer)
    return tok


@pytest.fixture(scope="module")
def deepseek_like(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory whose tokenizer.json names its specials as DeepSeek-V3 does, with the
    tokenizer_config.json that states them, as Hugging Face model repositories ship it."""
    model = tmp_path_factory.mktemp("model")
    train(["<unk>", BOS, EOS]).save(str(model / "tokenizer.json"))
    config = {"bos_token": {"__type": "AddedToken", "content": BOS, "special": True}, "eos_token": EOS}
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_a_model_directory_states_its_specials_in_tokenizer_config(deepseek_like: Path) -> None:
    tok = read_tokenizer(TokenizerConfig(path=str(deepseek_like), add_bos=True))
    assert (tok.bos_id, tok.eos_id) == (1, 2)
    assert (tok.bos_source, tok.eos_source) == ("tokenizer_config.json", "tokenizer_config.json")
    # The file alone: its special tokens of those names are taken, and said to be a guess.
    bare = read_tokenizer(TokenizerConfig(path=str(deepseek_like / "tokenizer.json")))
    assert (bare.bos_id, bare.eos_id) == (1, 2)
    assert bare.eos_source == f"special token {EOS} (guessed from its name)"


def test_special_tokens_map_and_explicit_ids(tmp_path: Path, deepseek_like: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((deepseek_like / "tokenizer.json").read_bytes())
    (model / "special_tokens_map.json").write_text(json.dumps({"eos_token": {"content": EOS}}))
    tok = read_tokenizer(TokenizerConfig(path=str(model)))
    assert (tok.eos_id, tok.eos_source, tok.bos_id) == (2, "special_tokens_map.json", 1)  # BOS: its name
    # tokenizer_config.json comes first; an explicit id before both.
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": BOS}))
    assert read_tokenizer(TokenizerConfig(path=str(model))).eos_id == 1
    explicit = read_tokenizer(TokenizerConfig(path=str(model), eos_id=0))
    assert (explicit.eos_id, explicit.eos_source) == (0, "tokenizer.eos_id")


@pytest.mark.parametrize("wrapped", [False, True])
def test_the_post_processor_template_gives_bos_and_eos(tmp_path: Path, wrapped: bool) -> None:
    tok = train(["<unk>", BOS, EOS])
    template = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}", special_tokens=[(BOS, tok.token_to_id(BOS)), (EOS, tok.token_to_id(EOS))]
    )
    # Llama 3 style: the template inside a Sequence, after a ByteLevel processor.
    tok.post_processor = (
        processors.Sequence([processors.ByteLevel(trim_offsets=False), template]) if wrapped else template
    )
    tok.save(str(tmp_path / "tok.json"))
    loaded = read_tokenizer(TokenizerConfig(path=str(tmp_path / "tok.json"), add_bos=True))
    assert (loaded.bos_id, loaded.eos_id) == (1, 2)
    assert loaded.eos_source == "post-processor template"


def test_mistakes_in_a_model_directory_are_clear(tmp_path: Path, deepseek_like: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"tokenizer directory .*empty has no tokenizer\.json"):
        read_tokenizer(TokenizerConfig(path=str(empty)))
    with pytest.raises(ConfigError, match=r"tokenizer file not found: .*nowhere"):
        read_tokenizer(TokenizerConfig(path=str(tmp_path / "nowhere")))
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((deepseek_like / "tokenizer.json").read_bytes())
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(
        ConfigError, match=r"names eos_token '<\|im_end\|>', which the tokenizer does not have"
    ):
        read_tokenizer(TokenizerConfig(path=str(model)))
    (model / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer_config\.json is not valid JSON"):
        read_tokenizer(TokenizerConfig(path=str(model)))
    train(["<unk>", "<x>"]).save(str(model / "tokenizer.json"))  # no special token of a known name
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": None}))
    with pytest.raises(
        ConfigError, match=r"no eos_token in tokenizer_config\.json or special_tokens_map\.json"
    ):
        read_tokenizer(TokenizerConfig(path=str(model)))


def test_the_cache_key_covers_the_config_files(tmp_path: Path, deepseek_like: Path) -> None:
    """A changed eos_token changes every token file: the hash covers every file read."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((deepseek_like / "tokenizer.json").read_bytes())
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOS}))
    first = read_tokenizer(TokenizerConfig(path=str(model)))
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": BOS}))
    second = read_tokenizer(TokenizerConfig(path=str(model)))
    assert first.sha256 != second.sha256 and (first.eos_id, second.eos_id) == (2, 1)
    alone = read_tokenizer(TokenizerConfig(path=str(model / "tokenizer.json"), eos_id=2))
    assert alone.sha256 not in (first.sha256, second.sha256)


def test_a_job_on_an_s3_model_directory(
    tmp_path: Path, deepseek_like: Path, s3: s3server.S3Server, tokenizer_path: Path
) -> None:
    """The model directory on S3, as a cluster reads it; every document ends with the EOS that
    tokenizer_config.json names, and the manifest says where it came from."""
    from raypack.pipeline.job import run_job
    from raypack.verifier import verify

    fs = s3.filesystem()
    pafs.copy_files(str(deepseek_like), f"{s3server.BUCKET}/models/ds", destination_filesystem=fs)
    remote = f"s3://{s3server.BUCKET}/models/ds"
    storage = {"endpoint": s3.endpoint}
    tok = read_tokenizer(
        TokenizerConfig(path=remote), load_config(str(_cfg(tmp_path, remote, storage))).storage
    )
    assert (tok.eos_id, tok.eos_source) == (2, "tokenizer_config.json")
    assert tok.sha256 == read_tokenizer(TokenizerConfig(path=str(deepseek_like))).sha256

    cfg = load_config(str(_cfg(tmp_path, remote, storage)))
    run_job(cfg, log=lambda _: None)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert (
        manifest["tokenizer"]["eos_id"] == 2
        and manifest["tokenizer"]["eos_source"] == "tokenizer_config.json"
    )
    report = verify(str(tmp_path / "out"), cfg, sample=10)
    assert report.ok, report.problems
    last: dict[str, tuple[int, int]] = {}  # doc_id -> (chunk, its last token), the last chunk kept
    for row in pq.read_table(tmp_path / "out" / "data").to_pylist():
        for k, doc in enumerate(row["doc_ids"]):
            token = row["input_ids"][row["doc_offsets"][k + 1] - 1]
            last[doc] = max(last.get(doc, (-1, 0)), (row["chunk_index"][k], token))
    assert len(last) == 20 and {token for _, token in last.values()} == {2}


def _cfg(tmp: Path, tokenizer: str, storage: dict[str, str]) -> Path:
    corpus = make_corpus(tmp, shards=2, docs_per_shard=10, seed=31)
    return job_config(tmp, f"{corpus}/*", tokenizer, storage=storage)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('{"hello": "world"}', 'it has no "model" (its keys: hello)'),
        ("[1, 2]", "it holds a JSON list, not a tokenizer's object"),
        ("{not json", "key must be a string"),
    ],
)
def test_a_file_that_is_no_tokenizer_says_why(tmp_path: Path, content: str, said: str) -> None:
    """JSON that is no tokenizer is named as such: tokenizers' own message points at a line and
    column of a file that parses; JSON that does not parse keeps its position."""
    path = tmp_path / "tokenizer.json"
    path.write_text(content)
    with pytest.raises(ConfigError) as caught:
        read_tokenizer(TokenizerConfig(path=str(path)))
    assert f"{path} is not a tokenizers JSON file: " in str(caught.value)
    assert said in str(caught.value)


def _other_models(root: Path) -> dict[str, Path]:
    """A WordPiece, a WordLevel and a Unigram tokenizer (the model types beside BPE), with added
    tokens, one of them numbered past the vocabulary's end."""
    made = {}
    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "the": 3, "##s": 4, "cat": 5, "</s>": 6}
    for name, model in (
        ("wordpiece", models.WordPiece(vocab, unk_token="[UNK]")),
        ("wordlevel", models.WordLevel(vocab, unk_token="[UNK]")),
        (
            "unigram",
            models.Unigram([("<unk>", 0.0), ("<s>", 0.0), ("▁the", -1.0), ("▁cat", -2.0), ("s", -3.0)], 0),
        ),
    ):
        tok = Tokenizer(model)
        tok.add_special_tokens(["<|endoftext|>", "<pad>"])
        tok.add_tokens(["<extra>"])
        made[name] = root / f"{name}.json"
        tok.save(str(made[name]))
    return made


@pytest.mark.parametrize(
    "name", ["tokenizer_path", "mistral_v1", "mistral_v1_metaspace", "tekken", "deepseek_like"]
)
def test_the_ids_read_from_the_json_are_tokenizers_own(
    request: pytest.FixtureRequest, tmp_path: Path, name: str
) -> None:
    """read_tokenizer(lazy=True) reads BOS, EOS, the pad, the vocabulary's size and largest id from
    tokenizer.json without tokenizers' parse (a token store's job: 0.8 s for a 131k BPE): they are
    what the parse gives, and every token's id both ways is tokenizers' own. The parse comes when
    .tokenizer is first asked for, and encodes as an eager one does."""
    paths = {name: request.getfixturevalue(name)}
    if name == "tokenizer_path":
        paths |= _other_models(tmp_path)
    facts = ("bos_id", "eos_id", "bos_source", "eos_source", "vocab_size", "max_id", "sha256")

    def load(cfg: TokenizerConfig, lazy: bool) -> tuple[Any, Any]:
        try:
            tok = read_tokenizer(cfg, lazy=lazy)
        except ConfigError as e:  # no BOS where one is asked for: the same words both ways
            return str(e), None
        return [getattr(tok, f) for f in facts], tok

    loaded = 0
    for label, path in paths.items():
        for add_bos, add_eos in ((False, False), (True, True), (False, True)):
            cfg = TokenizerConfig(path=str(path), add_bos=add_bos, add_eos=add_eos)
            (said, eager), (lazy_said, lazy) = load(cfg, False), load(cfg, True)
            assert lazy_said == said, label
            if eager is None:
                continue
            loaded += 1
            assert eager.parsed and not lazy.parsed, label
            assert lazy.pad(None) == eager.pad(None), label
            assert lazy.pad(eager.max_id) == eager.pad(eager.max_id), label
            with pytest.raises(ConfigError, match="is not a token"):
                lazy.pad(eager.max_id + 1)
            assert not lazy.parsed, label
            vocab, reference = lazy._memo["vocab"], eager.tokenizer
            every = reference.get_vocab(with_added_tokens=True)
            assert vocab.get_vocab(with_added_tokens=True) == every, label
            for token in [*every, "absent token", ""]:
                assert vocab.token_to_id(token) == reference.token_to_id(token), (label, token)
            for token_id in range(eager.max_id + 2):
                assert vocab.id_to_token(token_id) == reference.id_to_token(token_id), (label, token_id)
            # The self-check's probes: the added tokens by id, read as tokenizers' decoder has them.
            decoder = reference.get_added_tokens_decoder()
            assert lazy.added_tokens() == [decoder[i].content for i in sorted(decoder)] and decoder, label
            assert eager.added_tokens() == lazy.added_tokens() and not lazy.parsed, label
            text = "The cats sat. <extra> ünïcödé 12345 </s> the##s"
            assert lazy.encode_ids([text]) == eager.encode_ids([text]) and lazy.parsed, label
    assert loaded >= len(paths)


def test_a_lazily_read_tokenizer_that_tokenizers_refuses_fails_when_parsed(tmp_path: Path) -> None:
    """Valid JSON with a model whose ids read well, but a component tokenizers does not know:
    lazy=True loads its ids, and the parse, when asked, fails with the eager load's ConfigError."""
    tok = train(["<|endoftext|>"])
    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"] = {"type": "NoSuchPreTokenizer"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    cfg = TokenizerConfig(path=str(path))
    with pytest.raises(ConfigError) as eager:
        read_tokenizer(cfg)
    lazy = read_tokenizer(cfg, lazy=True)
    assert lazy.eos_id == 0 and not lazy.parsed
    with pytest.raises(ConfigError) as late:
        _ = lazy.tokenizer
    assert str(late.value) == str(eager.value) and "is not a tokenizers JSON file" in str(late.value)


def test_the_skim_of_a_tokenizer_json_is_json_loads_but_the_merges(tmp_path: Path) -> None:
    """_skim reads tokenizer.json as json.loads does, but for the model's merges (most of a large
    BPE's file), in tokenizers' own layout, pretty or compact; any other layout is left to
    json.loads (None): keys after the model, a vocab after the merges, a model without merges."""
    from raypack.text.tokenizer import _skim

    spec = json.loads(train(["<|endoftext|>"]).to_str())
    assert list(spec)[-1] == "model" and list(spec["model"])[-2:] == ["vocab", "merges"]

    def without_merges(value: dict[str, Any]) -> dict[str, Any]:
        return {**value, "model": {k: v for k, v in value["model"].items() if k != "merges"}}

    for text in (
        json.dumps(spec),
        json.dumps(spec, indent=2, ensure_ascii=False),
        json.dumps(spec, separators=(",", ":")),
        " \n" + json.dumps(spec, indent="\t") + "\n",
    ):
        assert _skim(text) == without_merges(json.loads(text))
    model_first = {"model": spec["model"], **{k: v for k, v in spec.items() if k != "model"}}
    merges_first = {**spec, "model": {"merges": spec["model"]["merges"], **without_merges(spec)["model"]}}
    no_merges = without_merges(spec)
    for other in (model_first, merges_first, no_merges):
        assert _skim(json.dumps(other)) is None
    assert _skim("[1, 2]") is None
    with pytest.raises(ValueError):
        _skim('{"added_tokens": [], "post_processor": null, "model": {"type": "BPE", "vocab": {}, 3')


def test_added_ids_that_tokenizers_would_not_give_leave_the_file_to_its_parse(tmp_path: Path) -> None:
    """tokenizers numbers added tokens itself as it loads a file (a vocabulary token at its id,
    another after the largest so far), whatever ids the file writes beside them. Where an edited
    file's ids are not those, lazy=True parses it: the ids are tokenizers' either way (else an EOS
    written as 99999, which tokenizers gives 1, would have a store's job pad with 99999)."""
    tok = train(["<|endoftext|>", "</s>"])
    tok.add_special_tokens(["<pad>", "<mask>"])
    spec = json.loads(tok.to_str())
    ids = {t["content"]: t["id"] for t in spec["added_tokens"]}
    assert ids["</s>"] == 1 and ids["<pad>"] == len(spec["model"]["vocab"])

    def edited(change: Any) -> dict[str, Any]:
        copy = json.loads(json.dumps(spec))
        change(copy)
        return copy

    def set_id(content: str, value: int) -> Any:
        return lambda s: next(t for t in s["added_tokens"] if t["content"] == content).update(id=value)

    def duplicate_vocab_id(s: dict[str, Any]) -> None:
        s["model"]["vocab"]["a"] = s["model"]["vocab"]["b"]

    variants = {
        "as saved": (lambda s: None, False),
        "eos at another id": (set_id("</s>", 99_999), True),
        "pad past a gap": (set_id("<pad>", 5_000), True),
        "added tokens reversed": (lambda s: s["added_tokens"].reverse(), True),
        "one token added twice": (
            lambda s: s["added_tokens"].append({**s["added_tokens"][-1], "id": 7}),
            True,
        ),
        "two tokens with one id": (duplicate_vocab_id, True),
    }
    facts = ("bos_id", "eos_id", "bos_source", "eos_source", "vocab_size", "max_id")
    for label, (change, parsed) in variants.items():
        path = tmp_path / f"{label}.json"
        path.write_text(json.dumps(edited(change)))
        cfg = TokenizerConfig(path=str(path), add_bos=False)
        eager, lazy = read_tokenizer(cfg), read_tokenizer(cfg, lazy=True)
        assert lazy.parsed is parsed, label
        assert [getattr(lazy, f) for f in facts] == [getattr(eager, f) for f in facts], label
        assert lazy.pad(None) == eager.pad(None), label
        assert lazy.token(eager.eos_id) == eager.tokenizer.id_to_token(eager.eos_id), label
        assert lazy.added_tokens() == eager.added_tokens(), label


def bare_file(tmp_path: Path, special: list[str], pieces: tuple[str, ...] = ()) -> Path:
    """A bare tokenizer.json (no model directory, no post-processor) whose special tokens are
    `special`, in that order from id 0, and whose vocabulary also holds `pieces` as ordinary
    pieces (not added tokens): what a name alone must not be taken from."""
    spec = json.loads(train(special).to_str())
    vocab = spec["model"]["vocab"]
    for piece in pieces:
        vocab[piece] = len(vocab)
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    assert all(Tokenizer.from_file(str(path)).token_to_id(p) is not None for p in pieces)
    return path


def test_a_name_counts_only_as_a_special_token_of_the_tokenizer(tmp_path: Path) -> None:
    """A 262k SentencePiece BPE's way (Gemma's): `<bos>`=2 and `<eos>`=1 are its special tokens,
    and `<s>` / `</s>` ordinary pieces of its vocabulary (the text `<s>` encodes to several
    tokens). BOS and EOS are the special ones, whatever the names' order of preference, and so is
    its pad, for both ways of reading the file (the ids from the JSON, and tokenizers' parse)."""
    path = bare_file(tmp_path, ["<pad>", "<eos>", "<bos>"], pieces=("<s>", "</s>"))
    for lazy in (False, True):
        from raypack.text.files import tokenizer_files
        from raypack.text.tokenizer import load_tokenizer

        cfg = TokenizerConfig(path=str(path), add_bos=True, add_eos=True)
        tok = load_tokenizer(cfg, tokenizer_files(cfg, None), lazy=lazy)
        assert (tok.bos_id, tok.eos_id) == (2, 1), lazy
        assert tok.bos_source == "special token <bos> (guessed from its name)"
        assert tok.pad(None) == (0, "special token <pad> (guessed from its name)")
        assert tok.special_tokens() == {"<pad>": 0, "<eos>": 1, "<bos>": 2}


def test_a_pad_named_by_a_special_token_wins_over_eos_and_zero(tmp_path: Path) -> None:
    """A 128k byte-level BPE's way (DeepSeek-V3's): BOS=0, EOS=1 and `<｜▁pad▁｜>`=2, all special; a
    job without add_eos pads with 2, not with 0 (its BOS)."""
    path = bare_file(tmp_path, [BOS, EOS, "<｜▁pad▁｜>"])
    tok = read_tokenizer(TokenizerConfig(path=str(path)))
    assert (tok.bos_id, tok.eos_id) == (0, 1)
    assert tok.pad(None) == (2, "special token <｜▁pad▁｜> (guessed from its name)")


def test_a_tokenizer_without_a_known_eos_is_refused_naming_its_candidates(tmp_path: Path) -> None:
    path = bare_file(tmp_path, ["<unk>", "<|im_start|>", "<EOT>", "<|im_end|>"], pieces=("</s>",))
    with pytest.raises(ConfigError) as raised:
        read_tokenizer(TokenizerConfig(path=str(path), add_eos=True))
    said = str(raised.value)
    assert "has no EOS token" in said and "no special token named <|endoftext|>" in said
    assert "special tokens that may be it: <EOT>=2, <|im_end|>=3; set tokenizer.eos_id" in said
    plain = bare_file(tmp_path, ["<unk>", "<x>"])
    with pytest.raises(ConfigError, match=r"its special tokens: <unk>=0, <x>=1; set tokenizer.eos_id"):
        read_tokenizer(TokenizerConfig(path=str(plain), add_eos=True))


def test_a_job_frames_with_the_special_tokens_says_it_guessed_and_verify_holds_them_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`raypack pack` with the Gemma-like bare file and add_bos/add_eos: every document starts with
    `<bos>`=2 and ends with `<eos>`=1 (it started with `<s>`, an ordinary piece), the summary says
    the ids were guessed and which setting chooses; verify holds a dataset's guessed BOS to the
    tokenizer's special tokens, not to the job's guess (a dataset framed with the piece `<s>`, as
    the guess made them, fails)."""
    from raypack.cli import main
    from tests.conftest import packed_documents

    path = bare_file(tmp_path, ["<pad>", "<eos>", "<bos>"], pieces=("<s>", "</s>"))
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=5)
    cfg = job_config(tmp_path, f"{corpus}/*", path, tokenizer={"add_bos": True, "add_eos": True})
    assert main(["pack", str(cfg)]) == 0
    said = capsys.readouterr().out
    assert "BOS 2, special token <bos> (guessed from its name); EOS 1, special token <eos>" in said
    assert "tokenizer.bos_id / tokenizer.eos_id / output.pad_id chooses another" in said
    documents = packed_documents(tmp_path / "out")
    assert len(documents) == 20 and all(d[0] == 2 and d[-1] == 1 for d in documents.values())
    assert main(["verify", str(tmp_path / "out"), "--config", str(cfg)]) == 0

    piece = Tokenizer.from_file(str(path)).token_to_id("<s>")
    manifest = tmp_path / "out" / "manifest.json"
    record = json.loads(manifest.read_text())
    record["tokenizer"].update(bos_id=piece, bos_source="token name <s>")  # what the old guess wrote
    manifest.write_text(json.dumps(record))
    capsys.readouterr()
    assert main(["verify", str(tmp_path / "out"), "--config", str(cfg)]) == 1
    assert f"BOS id {piece} ('<s>', from token name <s>) is not a special token" in capsys.readouterr().out
