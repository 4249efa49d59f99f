"""Long texts are encoded in pieces, and a document's tokens are still `tokenizers`' tokens for its
whole text: with a real SentencePiece BPE (Mistral-7B-v0.1, both of its tokenizer.json shapes), a
byte-level BPE, and a tokenizer that merges across spaces (no cut is proven: encoded whole)."""

from __future__ import annotations

import itertools
import json
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import raypack
from raypack.config import TokenizerConfig
from raypack.text import encode
from raypack.text.cuts import CutRule, cut_text, segment
from raypack.text.files import read_tokenizer
from raypack.text.tokenizer import LoadedTokenizer
from tests.conftest import job_config, packed_documents, write_jsonl


def stdlib_text(chars: int) -> str:
    """`chars` characters of this Python's standard library sources: code, comments, docstrings."""
    parts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        total += len(text)
        if total >= chars:
            break
    return "".join(parts)[:chars]


@contextmanager
def pieces_of(chars: int) -> Iterator[None]:
    """encode.PIECE_CHARS set to `chars` (many cuts in a small text)."""
    original = encode.PIECE_CHARS
    encode.PIECE_CHARS = chars
    try:
        yield
    finally:
        encode.PIECE_CHARS = original


def whole(tok: LoadedTokenizer, text: str) -> list[int]:
    return [*tok.encode_ids([text])[0], *([tok.eos_id] if tok.eos_id is not None else [])]


def loaded(path: Path) -> tuple[LoadedTokenizer, TokenizerConfig]:
    cfg = TokenizerConfig(path=str(path))
    return read_tokenizer(cfg), cfg


@pytest.mark.parametrize("shape", ["mistral_v1", "mistral_v1_metaspace"])
def test_a_sentencepiece_bpes_long_documents_are_their_whole_texts_tokens(
    shape: str, request: pytest.FixtureRequest
) -> None:
    """Documents of 1 and 1.5 MiB (code, and code with its newlines made spaces) in pieces of
    256 KiB give exactly the tokens of their whole texts. With Mistral's published shape the cut drops the
    space (its normalizer prepends `▁` to every piece); cut before it, as raypack did, the pieces
    give `▁▁` where the whole text has `▁`: what this test caught."""
    tok, cfg = loaded(request.getfixturevalue(shape))
    code = stdlib_text(1 << 20)
    flat_code = stdlib_text(3 << 19).replace("\n", " ")
    rule, proof = tok.cut_rule()
    assert rule is not None and "cuts of a" in proof
    assert rule.name == "dropped"  # for the Metaspace too: its pieces then start with no space
    counts = [0, 0, 0, 0]
    with pieces_of(256 << 10):
        flat, lengths = encode.encode_flat(tok, cfg, ["short", code, flat_code], cuts=counts)
    ends = lengths.cumsum().tolist()
    assert flat[ends[0] : ends[1]].tolist() == whole(tok, code)
    assert flat[ends[1] : ends[2]].tolist() == whole(tok, flat_code)
    assert counts[0] >= 7 and counts[2] == 0 and counts[3] == 2  # cut (1 + 1.5 MiB in 256 KiB pieces)
    if shape == "mistral_v1":
        before = CutRule("before", "")
        pieces, made, _ = cut_text(flat_code, 256 << 10, before, lambda texts: [[] for _ in texts])
        assert made >= 4
        assert [t for p in pieces for t in tok.encode_ids([p])[0]] != whole(tok, flat_code)[:-1]


def test_a_tokenizer_that_merges_across_spaces_encodes_long_texts_whole(tmp_path: Path) -> None:
    """A BPE with no pre-tokenizer learns tokens that hold spaces ("the cat"): no cut is proven,
    a long text is encoded whole (and counted so), and its tokens are the whole text's."""
    from tokenizers import Tokenizer, models, trainers

    sentence = "the cat sat on the mat and the dog ate the hat "
    tok = Tokenizer(models.BPE())
    tok.train_from_iterator([sentence * 50], trainers.BpeTrainer(vocab_size=300, show_progress=False))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    assert any(" " in t.strip() for t in tok.get_vocab())  # tokens across spaces
    cfg = TokenizerConfig(path=str(path), add_eos=False)
    loaded_tok = read_tokenizer(cfg)
    rule, why = loaded_tok.cut_rule()
    assert rule is None and "encoded whole" in why
    text = sentence * 200
    counts = [0, 0, 0, 0]
    with pieces_of(1000):
        flat, _ = encode.encode_flat(loaded_tok, cfg, [text], cuts=counts)
    assert flat.tolist() == loaded_tok.encode_ids([text])[0]
    assert counts == [0, 0, 1, 1]


def test_a_cut_the_check_refuses_moves_to_another_space(mistral_v1: Path) -> None:
    """Each cut is checked where it falls: the wrong rule for Mistral's shape (before the space) is
    refused at every candidate, MAX_TRIES in each half piece searched to the text's end, and the
    text is one piece."""
    from raypack.text.cuts import MAX_TRIES, check_cut

    tok, _ = loaded(mistral_v1)
    text = stdlib_text(64 << 10).replace("\n", " ")
    at = text.index(" ", 40_000)
    while not (text[at - 1] != " " and text[at + 1] != " "):
        at = text.index(" ", at + 1)
    assert check_cut(tok.encode_ids, CutRule("dropped", ""), text, at)
    assert not check_cut(tok.encode_ids, CutRule("before", ""), text, at)
    pieces, made, refused = cut_text(text, 16 << 10, CutRule("before", ""), tok.encode_ids)
    # Half pieces of 8 KiB from 8 KiB on: (8K, 16K), (16K, 24K), ..., (56K, 64K).
    assert (len(pieces), made, refused) == (1, 0, MAX_TRIES * 7)


def test_a_stretch_where_no_cut_passes_makes_one_longer_piece_not_the_rest_whole() -> None:
    """Where every candidate near a piece's end is refused, the search moves on half a piece at a
    time: the piece runs on to the first cut that passes, and the pieces after it are cut as
    before (one bad stretch used to leave the rest of the document one piece)."""
    from raypack.text.cuts import MAX_TRIES, WINDOW

    text = " ".join(f"w{i}" for i in range(8000))
    bad = range(6000, 14000, 100)  # a window holding "¤" encodes otherwise whole than in two
    text = "".join("¤" if i in bad and c != " " else c for i, c in enumerate(text))

    def encode(texts: list[str]) -> list[list[int]]:
        return [[0] if "¤" in t else [ord(c) for c in t] for t in texts]

    size = 8192
    pieces, made, refused = cut_text(text, size, CutRule("before", ""), encode)
    assert "".join(pieces) == text
    # Refused in (4K, 8K), (8K, 12K) and (12K, 16K); a cut passes once its window starts past 14K.
    assert 14_000 + WINDOW < len(pieces[0]) < 20_480 and refused == 3 * MAX_TRIES
    assert all(len(p) <= size for p in pieces[1:]) and made == len(pieces) - 1 >= 2


@pytest.mark.parametrize("shape", ["mistral_v1", "mistral_v1_metaspace", "tokenizer_path"])
def test_the_fast_encoder_checks_the_cuts_of_the_pieces_it_encodes(
    shape: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On fastokens, a cut's check encodes its window with fastokens, not `tokenizers` (~3 ms a cut
    there, a fifth of fastokens' encoding of long C files), and a text cut in pieces of 64 KiB is
    still `tokenizers`' tokens for the whole text. Each window checked holds its cut's space."""
    from raypack.text.backends import FastokensEncoder
    from raypack.text.cuts import WINDOW

    tok, cfg = loaded(request.getfixturevalue(shape))
    fast = FastokensEncoder(tok.json)
    seen: list[str] = []

    class Seen:
        name, version = fast.name, fast.version

        def encode(self, texts: list[str]) -> object:
            seen.extend(texts)
            return fast.encode(texts)

    reference_calls: list[list[str]] = []
    original = LoadedTokenizer.encode_ids

    def counted(self: LoadedTokenizer, texts: list[str]) -> list[list[int]]:
        reference_calls.append(texts)
        return original(self, texts)

    text = stdlib_text(512 << 10)
    tok.cut_rule()  # proven by the reference, as a worker does once
    monkeypatch.setattr(LoadedTokenizer, "encode_ids", counted)
    counts = [0, 0, 0, 0]
    with pieces_of(64 << 10):
        flat, _ = encode.encode_flat(tok, cfg, [text], encoder=Seen(), cuts=counts)  # type: ignore[arg-type]
    monkeypatch.undo()
    assert counts[0] >= 7 and counts[2] == 0
    assert reference_calls == []
    windows = [t for t in seen if len(t) <= 2 * WINDOW + 1]
    assert len(windows) >= 3 * counts[0]  # the window whole and its two sides, every cut made
    assert flat.tolist() == whole(tok, text)


_FRAGMENTS = ["word", " ", "  ", "\n", "\t", "é", "日本", "🙂", "x=1;", "don't", "▁", "12", ".", "\u0301"]


@pytest.mark.parametrize("backend", ["tokenizers", "fastokens"])
@pytest.mark.parametrize("name", ["mistral_v1", "mistral_v1_metaspace", "tokenizer_path"])
def test_cut_texts_give_the_whole_texts_tokens_for_any_text(
    name: str, backend: str, request: pytest.FixtureRequest
) -> None:
    """Property: whatever the text (spaces, runs of whitespace, combining marks, `▁` itself, emoji),
    encoded in pieces of 200 characters it gives `tokenizers`' tokens of the whole text, whichever
    encoder encodes the pieces and checks their cuts."""
    from raypack.text.backends import FastokensEncoder

    tok, _ = loaded(request.getfixturevalue(name))
    cfg = TokenizerConfig(path="unused", add_eos=False)
    encoder = FastokensEncoder(tok.json) if backend == "fastokens" else None

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.sampled_from(_FRAGMENTS), min_size=100, max_size=600))
    def check(parts: list[str]) -> None:
        text = "".join(parts)
        with pieces_of(200):
            flat, _ = encode.encode_flat(tok, cfg, [text], encoder)
        assert flat.tolist() == tok.encode_ids([text])[0]

    check()


@pytest.mark.parametrize(
    "shape", ["mistral_v1", pytest.param("mistral_v1_metaspace", marks=pytest.mark.slow)]
)
def test_a_job_with_mistrals_tokenizer_packs_long_documents_exactly(
    tmp_path: Path, shape: str, request: pytest.FixtureRequest
) -> None:
    """The user's path (raypack.pack, the executor the default picks, fastokens chosen): a 3 MiB
    document among short ones is packed in chunks whose tokens add up to its whole text's; the
    manifest says where it was cut and how that was proven, and verify (which re-tokenizes whole)
    passes. Both shapes of the tokenizer.json run on fastokens (the Metaspace one rewritten as the
    published one: backends.fast_json)."""
    mistral_v1 = request.getfixturevalue(shape)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    long_text = stdlib_text(3 << 20)
    write_jsonl(
        corpus / "a.jsonl",
        [{"id": "long", "text": long_text}, *({"id": f"s{i}", "text": f"short text {i}"} for i in range(20))],
    )
    config = job_config(tmp_path, str(corpus / "*.jsonl"), mistral_v1, pack={"seq_len": 4096})
    record = raypack.pack(str(config), log=lambda _: None)
    tok, _ = loaded(mistral_v1)
    packed = packed_documents(tmp_path / "out")
    assert packed["a.jsonl:1"] == whole(tok, long_text)  # ids: file and line
    assert packed["a.jsonl:5"] == whole(tok, "short text 3")
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    long_texts = manifest["tokenizer"]["backend"]["long_texts"]
    assert long_texts["cuts"] >= 2 and long_texts["long_pieces"] == 0 and long_texts["texts"] == 1
    assert long_texts["rule"].startswith("dropped: ")
    assert manifest["tokenizer"]["backend"]["chosen"].startswith("fastokens ")
    assert record is not None
    report = raypack.verify(str(tmp_path / "out"), config=str(config))
    assert report.ok, report.problems


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(_FRAGMENTS), min_size=1, max_size=400), st.integers(2, 300))
def test_segments_cover_a_text_one_after_another_and_start_at_words_where_they_can(
    parts: list[str], size: int
) -> None:
    """Property: a text's ceil(len / size) segments follow one another and cover it, each found
    alone; each but the last holds size/2 to 1.5·size characters; each after the first starts at
    the last space between two words (cuts._candidate) in the size/2 characters before its
    nominal start where there is one, else at that start."""
    from raypack.text.cuts import _candidate

    text = "".join(parts)
    n = -(-len(text) // size)
    spans = [segment(text, k, size) for k in range(n)]
    assert spans[0][0] == 0 and spans[-1][1] == len(text)
    assert all(a_end == b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))
    assert all(size // 2 <= b - a <= size + size // 2 for a, b in spans[:-1])
    for k, (a, _) in enumerate(spans[1:], start=1):
        at = k * size
        found = [i for i in range(at - size // 2 + 1, at + 1) if _candidate(text, i)]
        assert a == (max(found) if found else at)
