"""Character offsets derived from ids (raypack.text.offsets) against the ones `tokenizers`
reports, character for character: byte-level BPEs with and without trim_offsets, and a real
SentencePiece BPE (Mistral-7B's) in each shape tokenizers gives one."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from raypack.config import TokenizerConfig
from raypack.text.backends import choose_backend
from raypack.text.files import read_tokenizer
from raypack.text.offsets import ByteOffsets, PieceOffsets, offsets_of, reference_coder

# Characters of 1 to 4 UTF-8 bytes, and the spaces trim_offsets takes out of a token.
PIECES = ["é", "日本", "a", "b", " ", "  ", "x", "🙂", "\n", "ß", "\t"]


def _trained(trim: bool) -> Tokenizer:
    rng = random.Random(0)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=trim)
    trainer = trainers.BpeTrainer(
        vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(["".join(rng.choice(PIECES) for _ in range(50)) for _ in range(300)], trainer)
    return tok


TOKENIZERS = {trim: _trained(trim) for trim in (False, True)}


def _both(trim: bool, text: str) -> tuple[np.ndarray, np.ndarray]:
    tok = TOKENIZERS[trim]
    encoding = tok.encode(text, add_special_tokens=False)
    table = ByteOffsets.of(tok)
    assert table is not None
    want = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
    return want, table.offsets(text, np.asarray(encoding.ids))


@pytest.mark.parametrize("text", ["é ", "ab é ", "日本 ", "🙂 ", "a 🙂  ", "é  x", " é", "ß\t "])
def test_an_empty_token_after_a_wide_character_sits_after_it(text: str) -> None:
    """trim_offsets leaves a token of spaces empty; after 'é' (2 bytes) the space's token is [2, 2]:
    its place counts characters, not bytes (it was [1, 1])."""
    for trim in (False, True):
        want, got = _both(trim, text)
        assert got.tolist() == want.tolist(), (trim, text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=30), st.booleans())
def test_offsets_from_ids_are_the_tokenizers_own(pieces: list[str], trim: bool) -> None:
    want, got = _both(trim, "".join(pieces))
    assert got.tolist() == want.tolist()


def test_the_self_check_accepts_fastokens_for_chat_on_text_with_trimmed_spaces(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The chat self-check compares every offset: with wrong offsets for 'é ' it refused fastokens
    for a whole job (and a rebuild would have remembered fastokens as wrong for the tokenizer)."""
    pytest.importorskip("fastokens")
    path = tmp_path / "tokenizer.json"
    TOKENIZERS[True].save(str(path))
    tok = read_tokenizer(TokenizerConfig(path=str(path)), framed=False)
    sample = ["é ", "Un café au lait, s'il vous plaît ", "日本語 🙂 ", "ß ", "é\n \t "]
    choice = choose_backend("auto", tok, lambda: sample, chat=True)
    assert choice.backend == "fastokens", choice.reason


# Llama-3's pre-tokenizer pattern (also Qwen2's, DeepSeek-V3's first split): a Split, then a ByteLevel
# that only maps bytes.
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _llama3_shaped(normalizer: object) -> Tokenizer:
    from tokenizers import Regex

    rng = random.Random(1)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizer  # type: ignore[assignment]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_LLAMA3), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=500, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    words = [*PIECES, "ﬁne", "x²", "Ｆｕｌｌ", "don't", "12345", "café"]
    tok.train_from_iterator([" ".join(rng.choice(words) for _ in range(40)) for _ in range(300)], trainer)
    return tok


@pytest.mark.parametrize("form", ["empty sequence", "NFKC", "NFC in a sequence"])
def test_offsets_follow_from_ids_for_llama3_shaped_tokenizers(form: str) -> None:
    """A byte-level BPE whose normalizer is an empty Sequence (Llama-3's converted tokenizer.json:
    it was refused, and chat data with it ran on tokenizers), NFKC, or NFC in a Sequence, behind a
    Split + ByteLevel pre-tokenizer: offsets from ids are tokenizers' own for every text the
    normalizer leaves as it is; a text it changes ('ﬁ', '²', full-width letters) is not taken."""
    from tokenizers import normalizers

    normalizer = {
        "empty sequence": normalizers.Sequence([]),
        "NFKC": normalizers.NFKC(),
        "NFC in a sequence": normalizers.Sequence([normalizers.NFC()]),
    }[form]
    tok = _llama3_shaped(normalizer)
    table = ByteOffsets.of(tok)
    assert table is not None
    rng = random.Random(2)
    words = [*PIECES, "don't", "12345", "café", "x\r\ny", "  \n"]
    for _ in range(300):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        assert table.takes(text)
        encoding = tok.encode(text, add_special_tokens=False)
        want = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        assert table.offsets(text, np.asarray(encoding.ids)).tolist() == want.tolist(), text
    changed = ["ﬁne", "x²", "Ｆｕｌｌ"]
    assert [table.takes(t) for t in changed] == [form != "NFKC"] * 3  # NFC leaves them


def test_a_normalizer_that_rewrites_text_is_not_taken() -> None:
    """Lowercase (or any normalizer but the Unicode normal forms) changes the text: no offsets table."""
    from tokenizers import normalizers

    tok = _llama3_shaped(normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]))
    assert ByteOffsets.of(tok) is None


# SentencePiece BPEs (PieceOffsets): Mistral-7B's real 32k model in each shape tokenizers gives one.
SP_PIECES = [
    *PIECES,
    "Hello",
    " world",
    "▁",
    "<s>",
    "</s>",
    "[INST]",
    "<0x0A>",  # the name of a byte token, as text: six characters
    "\u0301",  # a combining accent: no piece of its own, byte fallback
    "ﬁ",  # NFKC makes it 'fi'
    "\x00",
    "\U0010fffd",
]
_PREPEND = {"type": "Prepend", "prepend": "▁"}
_REPLACE = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
SP_SHAPES = {
    "published (Prepend + Replace)": {"type": "Sequence", "normalizers": [_PREPEND, _REPLACE]},
    "Gemma's (Replace alone)": _REPLACE,
    "NFKC, Prepend, Replace": {"type": "Sequence", "normalizers": [{"type": "NFKC"}, _PREPEND, _REPLACE]},
    "transformers 5 (Metaspace)": None,
}


@pytest.fixture(scope="module")
def sentencepiece_shapes(
    mistral_v1: Path, mistral_v1_metaspace: Path
) -> dict[str, tuple[Tokenizer, PieceOffsets | ByteOffsets | None]]:
    """Each shape's tokenizer and its offsets table."""
    shapes = {}
    for name, normalizer in SP_SHAPES.items():
        if normalizer is None:
            text = mistral_v1_metaspace.read_text()
        else:
            spec = json.loads(mistral_v1.read_text())
            spec["normalizer"] = normalizer
            text = json.dumps(spec, ensure_ascii=False)
        tok = Tokenizer.from_str(text)
        shapes[name] = (tok, offsets_of(tok))
    return shapes


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(list(SP_SHAPES)), st.lists(st.sampled_from(SP_PIECES), max_size=25))
def test_a_sentencepiece_bpes_offsets_from_ids_are_the_tokenizers_own(
    sentencepiece_shapes: dict[str, tuple[Tokenizer, PieceOffsets | ByteOffsets | None]],
    shape: str,
    pieces: list[str],
) -> None:
    """Every offset tokenizers reports, for every text the table takes: the `▁` Prepend adds aligned
    with a section's first character, a section after each added token, a character's 1-4 byte
    tokens each holding it. Texts it does not take: NFKC's changes, and with Metaspace a text that
    holds an added token and starts with neither one, a space nor `▁`."""
    text = "".join(pieces)
    tok, table = sentencepiece_shapes[shape]
    assert isinstance(table, PieceOffsets)
    takes = table.takes(text)
    if shape.startswith("NFKC"):
        assert takes == unicodedata.is_normalized("NFKC", text)  # 'ﬁ', an accent after a letter
    elif shape.startswith("transformers 5"):
        # prepend_scheme first: a `▁` before the first section unless it starts with a space, `▁`
        # or an added token; none before the others. A text with sections of both kinds is not taken.
        added = any(t in text for t in ("<s>", "</s>"))
        assert takes == (not added or text.startswith((" ", "▁", "<s>", "</s>")))
    else:
        assert takes
    if takes:
        encoding = tok.encode(text, add_special_tokens=False)
        want = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        got = table.offsets(text, np.asarray(encoding.ids, dtype=np.int32))
        assert got is not None and got.tolist() == want.tolist(), (text, encoding.tokens)


def test_ids_that_do_not_span_the_text_go_to_the_reference(mistral_v1: Path) -> None:
    """Ids that are not the text's encoding (a token missing) give no offsets: the coder takes that
    text's ids and offsets from the reference, and counts it as routed."""
    tok = Tokenizer.from_file(str(mistral_v1))
    table = offsets_of(tok)
    assert table is not None
    texts = ["Hello world", "日本語 🙂 ok"]
    right = [np.asarray(tok.encode(t, add_special_tokens=False).ids, dtype=np.int32) for t in texts]
    assert table.offsets(texts[1], right[1][:-1]) is None

    class Dropping:  # a fast encoder that loses the last id of the second text
        def encode(self, batch: list[str]) -> tuple[np.ndarray, np.ndarray]:
            ids = [right[0], right[1][:-1]]
            return np.concatenate(ids), np.array([len(i) for i in ids])

    routed = [0, 0]
    coded = table.coder(Dropping(), reference_coder(tok), routed)(texts)
    assert [ids.tolist() for ids, _ in coded.split()] == [r.tolist() for r in right]
    assert routed == [1, len(texts[1].encode())]


def test_sentencepiece_shapes_whose_offsets_do_not_follow_are_refused(mistral_v1: Path) -> None:
    """A byte token that is also an added token ('<0x0A>' in the text is the same id as byte 0x0A),
    a normalizer that rewrites (Lowercase), a Metaspace that splits at spaces, no byte fallback,
    ignore_merges (a word of the vocabulary taken whole: '<0x0A>' as text, the byte's token)."""
    base = json.loads(mistral_v1.read_text())

    def variant(change: Any) -> Tokenizer:
        spec = json.loads(json.dumps(base))
        change(spec)
        return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))

    def added_byte(spec: dict[str, Any]) -> None:
        spec["added_tokens"].append(
            {**spec["added_tokens"][0], "id": spec["model"]["vocab"]["<0x0A>"], "content": "<0x0A>"}
        )

    def lowercase(spec: dict[str, Any]) -> None:
        spec["normalizer"]["normalizers"].append({"type": "Lowercase"})

    def splitting(spec: dict[str, Any]) -> None:
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace",
            "replacement": "▁",
            "prepend_scheme": "always",
            "split": True,
        }

    def no_fallback(spec: dict[str, Any]) -> None:
        spec["model"]["byte_fallback"] = False

    def whole_words(spec: dict[str, Any]) -> None:  # "<0x0A>" as text would be the byte's token
        spec["model"]["ignore_merges"] = True

    assert PieceOffsets.of(Tokenizer.from_file(str(mistral_v1))) is not None
    for change in (added_byte, lowercase, splitting, no_fallback, whole_words):
        assert offsets_of(variant(change)) is None, change.__name__


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(list(SP_SHAPES)),
    st.lists(st.lists(st.sampled_from(SP_PIECES), max_size=12).map("".join), max_size=6),
    st.booleans(),
)
def test_a_batch_has_each_texts_offsets(
    sentencepiece_shapes: dict[str, tuple[Tokenizer, PieceOffsets | ByteOffsets | None]],
    shape: str,
    texts: list[str],
    byte_level: bool,
) -> None:
    """Offsets of a batch at once (every text's ids back to back) are each text's own, each in its
    own text, byte-level (trim_offsets, multi-byte characters) and SentencePiece alike; a text whose
    ids are cut short is told apart, the others unharmed."""
    if byte_level:
        tok, table = TOKENIZERS[True], ByteOffsets.of(TOKENIZERS[True])
        texts = [t.replace("▁", " ") for t in texts]
    else:
        tok, table = sentencepiece_shapes[shape]
        texts = [t for t in texts if table is not None and table.takes(t)]
    assert table is not None
    encodings = [tok.encode(t, add_special_tokens=False) for t in texts]
    ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    if ids and len(ids[0]):
        ids[0] = ids[0][:-1]  # not the first text's encoding any more
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int32)
    lengths = np.asarray([len(i) for i in ids], dtype=np.int64)
    offsets, ok = table.batch(texts, flat, lengths)
    ends = np.cumsum(lengths)
    for k, (text, encoding) in enumerate(zip(texts, encodings, strict=True)):
        if k == 0 and len(encoding.ids):
            assert not ok[0]
            continue
        assert ok[k]
        want = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        assert offsets[ends[k] - lengths[k] : ends[k]].tolist() == want.tolist(), text
