"""Real model tokenizers for the tests: the SentencePiece models Mistral ships inside its
mistral-common wheel (`make real-tokenizers` downloads it to .cache/wheels; the package is not
installed), converted to tokenizer.json by transformers as a Hugging Face user converts them.

- `mistral_v1`: Mistral-7B-v0.1's 32k SentencePiece BPE with byte fallback, in the shape its
  published tokenizer.json has (a `Prepend("▁")` + `Replace(" ", "▁")` normalizer, no
  pre-tokenizer), which prepends `▁` to any text, even one that starts with a space.
- `mistral_v1_metaspace`: the same model as transformers 5 converts it (a Metaspace pre-tokenizer,
  `prepend_scheme: always`, which prepends only where the text does not start with `▁`).
- `j2_unigram`: a Unigram model with a Precompiled (charsmap) normalizer, as transformers converts an
  XLM-R style SentencePiece model: AI21's Jurassic-2 model of 262,144 pieces, which the
  ai21-tokenizer wheel ships (`make bench-inputs` downloads it).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

__all__ = ["j2_unigram", "mistral_v1", "mistral_v1_metaspace", "tekken", "wheel"]

WHEEL = "mistral_common-1.13.1-py3-none-any.whl"
AI21 = "ai21_tokenizer-1.1.0-py3-none-any.whl"
DJANGO = "django-5.2.8-py3-none-any.whl"  # its message catalogs: the benchmarks' multilingual text


def wheel(name: str = WHEEL) -> Path:
    """A downloaded package (the mistral-common wheel by default); an error that says how to fetch
    it when it is missing."""
    root = Path(os.environ.get("RAYPACK_WHEELS", Path(__file__).resolve().parents[1] / ".cache/wheels"))
    path = root / name
    if not path.is_file():
        target = "real-tokenizers" if name == WHEEL else "bench-inputs"
        raise FileNotFoundError(f"{path} is missing: run `make {target}` (it downloads it)")
    return path


def _converted(model: str, out: Path) -> Path:
    """tokenizer.json of the wheel's `model` (mistral_common/data/...), as transformers converts it."""
    from transformers import LlamaTokenizer

    source = out / "source"
    source.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel()) as z:
        (source / "tokenizer.model").write_bytes(z.read(f"mistral_common/data/{model}"))
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer"}))
    LlamaTokenizer.from_pretrained(str(source)).save_pretrained(str(out / "converted"))
    return out / "converted" / "tokenizer.json"


def mistral_v1_metaspace(out: Path) -> Path:
    return _converted("tokenizer.model.v1", out)


def mistral_v1(out: Path) -> Path:
    spec = json.loads(mistral_v1_metaspace(out).read_text())
    assert spec["pre_tokenizer"]["type"] == "Metaspace", spec["pre_tokenizer"]
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return path


def tekken(out: Path) -> Path:
    """Mistral's tekken (Mistral-NeMo, 2024-09-11): a tiktoken-style byte-level BPE of 131,072 ids,
    its 1,000 special ids first (<unk>, <s>, </s>; the others named <SPECIAL_n> here: tekken's file
    leaves their names to mistral-common), converted by transformers' TikTokenConverter as Hugging
    Face converts tiktoken encodings (a Split of tekken's pattern, then ByteLevel)."""
    import base64

    from tokenizers import AddedToken
    from transformers.convert_slow_tokenizer import TikTokenConverter

    with zipfile.ZipFile(wheel()) as z:
        spec = json.loads(z.read("mistral_common/data/tekken_240911.json"))
    config = spec["config"]
    specials = config["default_num_special_tokens"]
    regular = config["default_vocab_size"] - specials
    ranks = {base64.b64decode(t["token_bytes"]): t["rank"] for t in spec["vocab"][:regular]}

    class Ranks(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_: str) -> dict[bytes, int]:
            return ranks

    converter = Ranks(vocab_file="tekken", pattern=config["pattern"])
    vocab, merges = converter.extract_vocab_merges_from_model("tekken")
    names = ["<unk>", "<s>", "</s>", *(f"<SPECIAL_{i}>" for i in range(3, specials))]
    shifted = {**{name: i for i, name in enumerate(names)}, **{t: i + specials for t, i in vocab.items()}}
    converter.extract_vocab_merges_from_model = lambda _: (shifted, merges)  # type: ignore[method-assign]
    tok = converter.converted()
    tok.add_special_tokens([AddedToken(name, normalized=False, special=True) for name in names])
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tokenizer.json"
    tok.save(str(path))
    return path


def j2_unigram(out: Path) -> Path:
    """tokenizer.json of AI21's Jurassic-2 SentencePiece model (the ai21-tokenizer 1.1.0 wheel's
    j2-tokenizer.model: a Unigram model of 262,144 pieces and the nmt_nfkc charsmap), converted by
    transformers' XLMRobertaTokenizer: a Precompiled normalizer, WhitespaceSplit then Metaspace, and
    no byte fallback (the converter leaves the model's out), 262,146 ids."""
    from transformers import XLMRobertaTokenizer

    source = out / "source"
    source.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel(AI21)) as z:
        model = z.read("ai21_tokenizer/resources/j2-tokenizer/j2-tokenizer.model")
    (source / "sentencepiece.bpe.model").write_bytes(model)
    XLMRobertaTokenizer.from_pretrained(str(source)).save_pretrained(str(out / "converted"))
    return out / "converted" / "tokenizer.json"
