"""Character offsets derived from a byte-level BPE's ids (raypack.pipeline.offsets) against the ones
`tokenizers` reports, character for character, with and without trim_offsets."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from raypack.config import TokenizerConfig
from raypack.pipeline.backends import choose_backend
from raypack.pipeline.offsets import ByteOffsets
from raypack.pipeline.tokenizer import load_tokenizer

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
    table = ByteOffsets.of(tok.to_str())
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
    tok = load_tokenizer(TokenizerConfig(path=str(path)), framed=False)
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
    table = ByteOffsets.of(tok.to_str())
    assert table is not None
    rng = random.Random(2)
    words = [*PIECES, "don't", "12345", "café", "x\r\ny", "  \n"]
    for _ in range(300):
        text = "".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        assert table.identity(text)
        encoding = tok.encode(text, add_special_tokens=False)
        want = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        assert table.offsets(text, np.asarray(encoding.ids)).tolist() == want.tolist(), text
    changed = ["ﬁne", "x²", "Ｆｕｌｌ"]
    assert [table.identity(t) for t in changed] == [form != "NFKC"] * 3  # NFC leaves them


def test_a_normalizer_that_rewrites_text_is_not_taken() -> None:
    """Lowercase (or any normalizer but the Unicode normal forms) changes the text: no offsets table."""
    from tokenizers import normalizers

    tok = _llama3_shaped(normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()]))
    assert ByteOffsets.of(tok.to_str()) is None
