"""Real model tokenizers for the tests: the SentencePiece models Mistral ships inside its
mistral-common wheel (`make real-tokenizers` downloads it to .cache/wheels; the package is not
installed), converted to tokenizer.json by transformers as a Hugging Face user converts them.

- `mistral_v1`: Mistral-7B-v0.1's 32k SentencePiece BPE with byte fallback, in the shape its
  published tokenizer.json has (a `Prepend("▁")` + `Replace(" ", "▁")` normalizer, no
  pre-tokenizer), which prepends `▁` to any text, even one that starts with a space.
- `mistral_v1_metaspace`: the same model as transformers 5 converts it (a Metaspace pre-tokenizer,
  `prepend_scheme: always`, which prepends only where the text does not start with `▁`).
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path

__all__ = ["mistral_v1", "mistral_v1_metaspace", "wheel"]

WHEEL = "mistral_common-1.13.1-py3-none-any.whl"


def wheel() -> Path:
    """The mistral-common wheel; an error that says how to fetch it when it is missing."""
    root = Path(os.environ.get("RAYPACK_WHEELS", Path(__file__).resolve().parents[1] / ".cache/wheels"))
    path = root / WHEEL
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `make real-tokenizers` (it downloads the wheel)")
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
    path = out / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False))
    return path
