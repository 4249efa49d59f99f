"""The tokenizer: a `tokenizers` JSON file or a Hugging Face model directory, and its BOS/EOS ids.

`tokenizer.path` names either a tokenizer.json (any file name) or a directory (local or s3://) that
holds one, as a Hugging Face model repository does. Each special token comes from the first of:
1. `tokenizer.bos_id` / `tokenizer.eos_id` in the job config;
2. `bos_token` / `eos_token` of the directory's tokenizer_config.json, then special_tokens_map.json
   (where every Hugging Face model states them: DeepSeek-V3's EOS is `<｜end▁of▁sentence｜>`);
3. the tokenizer's post-processor template: the special token before the sequence is BOS, the one
   after it EOS (TemplateProcessing, also inside a Sequence; Bert/Roberta processing's cls/sep);
4. a guess: a special (added) token of the tokenizer with a name known to mean it (BOS_NAMES,
   EOS_NAMES). A piece of the vocabulary that merely reads so is never taken (a 262k SentencePiece
   vocabulary has `<s>` as an ordinary piece beside its special `<bos>`);
else, when add_bos / add_eos needs it, a ConfigError that says where it looked and names the
special tokens that might be meant.
`sha256` covers every file read, so a changed tokenizer_config.json changes the token cache key.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from raypack.config import TokenizerConfig
from raypack.errors import ConfigError
from raypack.paths import join
from raypack.text.cuts import CutRule, choose
from raypack.text.offsets import ByteOffsets, PieceOffsets, offsets_of

__all__ = [
    "BOS_NAMES",
    "EOS_NAMES",
    "PAD_NAMES",
    "TOKENIZER_FILE",
    "LoadedTokenizer",
    "guessed",
    "load_tokenizer",
    "special_tokens",
    "tokenizer_sha256",
]

BOS_NAMES = ("<|begin_of_text|>", "<|startoftext|>", "<｜begin▁of▁sentence｜>", "<s>", "<bos>", "[BOS]")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>", "[EOS]")
PAD_NAMES = ("<|pad|>", "<pad>", "[PAD]", "<|finetune_right_pad_id|>", "<｜▁pad▁｜>", "<|padding|>")
# What a special token's name has when it may be a BOS or an EOS: the candidates a refusal names.
_HINTS = {"bos": ("bos", "begin", "start", "<s>", "cls"), "eos": ("eos", "end", "eot", "</s>", "sep")}
TOKENIZER_FILE = "tokenizer.json"
# The model directory's files read beside it (each optional).
CONFIG_FILES = ("tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True, slots=True)
class LoadedTokenizer:
    sha256: str
    """Of every file read (tokenizer.json and, in a model directory, its config files)."""
    bos_id: int | None
    eos_id: int | None
    vocab_size: int
    """Tokens in the vocabulary, added tokens included."""
    max_id: int = -1
    """Its largest id: what a token file's dtype must hold. Above vocab_size - 1 for a vocabulary with
    gaps in its ids (added tokens numbered past a hole: 60,000 tokens, id 70,000)."""
    bos_source: str = ""
    """Where bos_id came from (a file name, "post-processor template", "tokenizer.bos_id", or a
    guess: "special token NAME (guessed from its name)")."""
    eos_source: str = ""
    json: str = ""
    """tokenizer.json's text: what another backend (raypack.text.backends) loads."""
    configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    """A model directory's tokenizer_config.json and special_tokens_map.json, parsed (the chat
    template and the special tokens a template sees come from them)."""
    path: str = ""
    """Where tokenizer.json was read (what a parse's error names)."""
    _memo: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """tokenizers' Tokenizer once parsed, the vocabulary the ids above were found in, and
    cut_rule's and offsets' answers, once made (this tokenizer's, so they go with it)."""

    @property
    def tokenizer(self) -> Tokenizer:
        """tokenizers' Tokenizer: parsed at load, or when first asked where load_tokenizer(lazy=True)
        read the ids from the JSON (a repack from a token store may never need it: 0.8 s of a
        131k BPE's parse, holding the GIL, on the job's path). ConfigError where tokenizers refuses
        the file. The first ask comes from one thread (the tokenize stage's, before its others)."""
        if "tokenizer" not in self._memo:
            self._memo["tokenizer"] = _parse(self.json.encode("utf-8"), self.path)
        tokenizer: Tokenizer = self._memo["tokenizer"]
        return tokenizer

    def token(self, token_id: int) -> str | None:
        """The token of an id, as tokenizers' id_to_token gives it, without a parse where the ids
        were read from the JSON (a chat job's template names its BOS and EOS)."""
        text: str | None = self._memo["vocab"].id_to_token(token_id)
        return text

    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's special (added) tokens, by content: the only tokens a name may be guessed
        from, and what verify holds a dataset's guessed BOS, EOS and pad to."""
        return special_tokens(self._memo["vocab"])

    def added_tokens(self) -> list[str]:
        """The added tokens' contents in the order of their ids, as tokenizers' added-tokens decoder
        holds them (the self-check's probes), without a parse where the ids were read from the JSON."""
        vocab = self._memo["vocab"]
        if isinstance(vocab, JsonVocab):
            return [t for t, _ in sorted(vocab.added.items(), key=lambda item: item[1])]
        decoder = vocab.get_added_tokens_decoder()
        return [decoder[i].content for i in sorted(decoder)]

    @property
    def parsed(self) -> bool:
        """tokenizers has parsed the file (or was never asked to, so far: False)."""
        return "tokenizer" in self._memo

    def encode_ids(self, texts: list[str]) -> list[list[int]]:
        """Each text's ids by `tokenizers` (no special tokens added): the reference."""
        return [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def offsets(self) -> ByteOffsets | PieceOffsets | None:
        """The table giving character offsets from ids (raypack.text.offsets.offsets_of), or
        None; made when first asked (0.15 s for a 131k BPE), then kept."""
        if "offsets" not in self._memo:
            self._memo["offsets"] = offsets_of(self.tokenizer)
        table: ByteOffsets | PieceOffsets | None = self._memo["offsets"]
        return table

    def cut_rule(self) -> tuple[CutRule | None, str]:
        """Where a long text may be cut without changing its tokens, and why (raypack.text.cuts:
        proven on a probe text of 26-40 KB when first asked: 10-25 ms)."""
        if "rule" not in self._memo:
            added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()]
            spec = {key: _part(self.tokenizer, self.json, key) for key in ("normalizer", "pre_tokenizer")}
            self._memo["rule"] = choose(self.encode_ids, spec, added)
        rule: tuple[CutRule | None, str] = self._memo["rule"]
        return rule

    def pad(self, explicit: int | None) -> tuple[int, str]:
        """What padding positions hold, and where it came from: output.pad_id (ConfigError when it is
        not a token), else the model directory's pad_token, else a token named as a pad
        (PAD_NAMES), else EOS, else 0. Never a silent 0: id 0 is BOS in DeepSeek's vocabulary and
        `<unk>` in Llama 2's. Padding is never attended nor trained (doc_offsets end before it)."""
        vocab = self._memo["vocab"]
        if explicit is not None:
            if vocab.id_to_token(explicit) is None:
                raise ConfigError(
                    f"output.pad_id {explicit} is not a token of the tokenizer (ids 0..{self.max_id}, "
                    f"{self.vocab_size:,} tokens); use one of its ids, e.g. its EOS ({self.eos_id}), or "
                    "leave it unset"
                )
            return explicit, "output.pad_id"
        for name in CONFIG_FILES:
            value = self.configs.get(name, {}).get("pad_token")
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str) and (token_id := vocab.token_to_id(content)) is not None:
                return int(token_id), f"{name} pad_token"
        specials = special_tokens(vocab)
        for name in PAD_NAMES:
            if (token_id := specials.get(name)) is not None:
                return int(token_id), _guessed(name)
        if self.eos_id is not None:
            return self.eos_id, _PAD_FALLBACKS[0]
        return 0, _PAD_FALLBACKS[1]


def load_tokenizer(
    cfg: TokenizerConfig,
    files: dict[str, bytes],
    *,
    framed: bool = True,
    lazy: bool = False,
) -> LoadedTokenizer:
    """Load and check the tokenizer from its files (raypack.text.files.tokenizer_files); ConfigError naming
    the problem (missing file, not a tokenizer JSON, no EOS token when add_eos is on...). `framed`:
    add_bos / add_eos frame the documents (JobConfig.framed; not for conversations, which their
    template frames): only then is a missing BOS or EOS an error. `lazy`: the ids (BOS, EOS, the
    largest, the vocabulary's size) read from the JSON (JsonVocab), and tokenizers' parse left
    until .tokenizer is first asked for; a file that tokenizers refuses is then found there."""
    raw = files[TOKENIZER_FILE]
    where = cfg.path if len(files) == 1 else join(cfg.path, TOKENIZER_FILE)
    memo: dict[str, Any] = {}
    vocab: Any = JsonVocab.of(raw) if lazy else None
    if vocab is None:
        tok = memo["tokenizer"] = vocab = _parse(raw, where)
        processor = _part(tok, raw, "post_processor")
    else:
        processor = vocab.post_processor
    memo["vocab"] = vocab
    configs = {name: _json(cfg.path, name, data) for name, data in files.items() if name in CONFIG_FILES}
    template = _template(processor)
    ids = vocab.get_vocab(with_added_tokens=True).values()
    size, max_id = len(ids), max(ids, default=-1)
    found = {}
    for kind, explicit, names, add in (
        ("bos", cfg.bos_id, BOS_NAMES, cfg.add_bos),
        ("eos", cfg.eos_id, EOS_NAMES, cfg.add_eos),
    ):
        token_id, source = _special(kind, explicit, configs, template, names, vocab, cfg.path)
        if add and framed and token_id is None:
            raise _no_special(kind, cfg.path, bool(configs), names, special_tokens(vocab))
        if token_id is not None and vocab.id_to_token(token_id) is None:
            raise ConfigError(
                f"tokenizer.{kind}_id={token_id} is not a token of the tokenizer (ids 0..{max_id}, "
                f"{size:,} tokens)"
            )
        found[kind] = (token_id, source)
    return LoadedTokenizer(
        tokenizer_sha256(files),
        found["bos"][0],
        found["eos"][0],
        size,
        max_id,
        bos_source=found["bos"][1],
        eos_source=found["eos"][1],
        json=raw.decode("utf-8"),
        configs=configs,
        path=where,
        _memo=memo,
    )


def _added_ids(vocab: dict[str, int], tokens: list[Any]) -> dict[str, int] | None:
    """The added tokens' ids as tokenizers gives them when it loads the file, or None where one of
    them is not the id the file writes beside it. tokenizers does not take those ids: it numbers
    the tokens in the file's order, a token of the vocabulary at its id there, another after the
    largest id given so far (from the vocabulary's size). A file tokenizers saved writes its own
    ids; an edited one may not (an EOS written as 99999 may get 1 from tokenizers), and is left to
    tokenizers' parse."""
    size, added = len(vocab), dict[str, int]()
    for token in tokens:
        content, written = token["content"], token["id"]
        if not isinstance(content, str):
            return None
        if content in added:
            given = added[content]
        elif content in vocab:
            given = vocab[content]
        elif not added:
            given = size
        else:
            top = max(added.values())
            given = top + 1 if top >= size or size == 0 else size
        if given != written:
            return None
        added[content] = given
    return added


_DECODE = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _skim(text: str) -> dict[str, Any] | None:
    """tokenizer.json parsed as json.loads would, but for the model's merges, where the file lays
    out its keys as tokenizers writes them (added_tokens and post_processor before the model, the
    model's vocab before its merges): a 131k BPE's 17 MB in 0.18 s, not 0.48 s (its 269,443 merges
    are most of it). None for any other layout (json.loads then reads it whole)."""
    at = _space(text, 0)
    if not text.startswith("{", at):
        return None
    top, at, stopped = _object(text, at, "model")
    if not stopped or "added_tokens" not in top or "post_processor" not in top:
        return None
    if not text.startswith("{", at):
        return None
    model, _, stopped = _object(text, at, "merges")
    if not stopped or "vocab" not in model:
        return None  # no merges (a Unigram, a WordPiece), or its vocab after them: parsed whole
    top["model"] = model
    return top


def _object(text: str, at: int, stop: str) -> tuple[dict[str, Any], int, bool]:
    """The JSON object whose `{` is at `at`, its values parsed until the key `stop`: (its keys and
    values before it, where the value of `stop` starts, True), or (all of them, where the object
    ends, False) where it has no such key. ValueError where it is no object."""
    out: dict[str, Any] = {}
    at = _space(text, at + 1)
    if text.startswith("}", at):
        return out, at + 1, False
    while True:
        key, at = _DECODE.raw_decode(text, at)
        at = _space(text, at)
        if not isinstance(key, str) or not text.startswith(":", at):
            raise ValueError("not a JSON object")
        at = _space(text, at + 1)
        if key == stop:
            return out, at, True
        out[key], at = _DECODE.raw_decode(text, at)
        at = _space(text, at)
        if text.startswith("}", at):
            return out, at + 1, False
        if not text.startswith(",", at):
            raise ValueError("not a JSON object")
        at = _space(text, at + 1)


def _space(text: str, at: int) -> int:
    found = _SPACE.match(text, at)
    return found.end() if found is not None else at


def _parse(raw: bytes, where: str) -> Tokenizer:
    try:
        return Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own Exception type on bad JSON
        raise ConfigError(f"{where} is not a tokenizers JSON file: {_why_not(raw, e)}") from None


class JsonVocab:
    """What load_tokenizer asks of a Tokenizer (token_to_id, id_to_token, get_vocab), read from
    tokenizer.json's own vocabulary and added tokens, as tokenizers answers it (an added token's
    id first): 0.36 s of JSON for a 131k BPE's 17 MB file, against tokenizers' 0.8 s parse that
    holds the GIL (tests compare every answer with tokenizers' own on each model type). None (of)
    for a file this does not read as tokenizers would: the caller parses it."""

    def __init__(
        self, vocab: dict[str, int], added: dict[str, int], post_processor: Any, special: frozenset[str]
    ) -> None:
        self.vocab, self.added, self.post_processor = vocab, added, post_processor
        self.special = special
        self._ids: dict[int, str] | None = None

    @classmethod
    def of(cls, raw: bytes) -> JsonVocab | None:
        try:
            text = raw.decode("utf-8")
            spec = _skim(text) or json.loads(text)
            model = spec["model"]
            kind, entries = model["type"], model["vocab"]
            if kind in ("BPE", "WordPiece", "WordLevel") and isinstance(entries, dict):
                vocab = dict(entries)
            elif kind == "Unigram" and isinstance(entries, list):
                vocab = {piece: i for i, (piece, _score) in enumerate(entries)}
                if len(vocab) != len(entries):  # a piece listed twice: left to tokenizers
                    return None
            else:
                return None
            if not all(type(v) is int and v >= 0 for v in vocab.values()) or len(set(vocab.values())) != len(
                vocab
            ):
                return None  # ids that are no ids, or one id for two tokens: left to tokenizers
            tokens = spec.get("added_tokens") or []
            added = _added_ids(vocab, tokens)
            if added is None or not all(isinstance(k, str) for k in vocab):
                return None
            special = frozenset(t["content"] for t in tokens if t.get("special") is True)
            return cls(vocab, added, spec.get("post_processor"), special)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # not what tokenizers would take either, or not as it stands here: parsed

    def token_to_id(self, token: str) -> int | None:
        found = self.added.get(token)
        return found if found is not None else self.vocab.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        if self._ids is None:
            ids = {i: t for t, i in self.vocab.items()}
            ids.update({i: t for t, i in self.added.items()})
            self._ids = ids
        return self._ids.get(token_id)

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return {**self.vocab, **self.added} if with_added_tokens else dict(self.vocab)


def tokenizer_sha256(files: dict[str, bytes]) -> str:
    """LoadedTokenizer.sha256 of these files (raypack.text.files.tokenizer_files')."""
    digest = hashlib.sha256()
    for name in sorted(files):  # one file: its bytes' plain sha256 (what sha256sum gives)
        digest.update(files[name] if len(files) == 1 else name.encode() + b"\0" + files[name])
    return digest.hexdigest()


def _json(path: str, name: str, data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError as e:
        raise ConfigError(f"{join(path, name)} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{join(path, name)} is not a JSON object")
    return value


def _special(
    kind: str,
    explicit: int | None,
    configs: dict[str, dict[str, Any]],
    template: dict[str, str | None],
    names: tuple[str, ...],
    tok: Any,
    path: str,
) -> tuple[int | None, str]:
    if explicit is not None:
        return explicit, f"tokenizer.{kind}_id"
    for name in CONFIG_FILES:
        value = configs.get(name, {}).get(f"{kind}_token")
        content = value.get("content") if isinstance(value, dict) else value
        if isinstance(content, str) and content:
            token_id = tok.token_to_id(content)
            if token_id is None:
                raise ConfigError(
                    f"{join(path, name)} names {kind}_token {content!r}, which the tokenizer does not have"
                )
            return int(token_id), name
    content = template.get(kind)
    if content is not None and (token_id := tok.token_to_id(content)) is not None:
        return int(token_id), "post-processor template"
    specials = special_tokens(tok)
    for name in names:
        token_id = specials.get(name)
        if token_id is not None:
            return int(token_id), _guessed(name)
    return None, ""


_GUESSED = "(guessed from its name)"
# What pad() falls back to where nothing names a pad.
_PAD_FALLBACKS = ("its EOS (the tokenizer names no pad token)", "0 (the tokenizer names no pad or EOS token)")


def _guessed(name: str) -> str:
    return f"special token {name} {_GUESSED}"


def guessed(source: str) -> str | None:
    """How an id's source (LoadedTokenizer.bos_source, eos_source, pad()'s) is a guess of raypack's,
    not a setting nor the tokenizer's own files: "name" (a special token taken by its name; a
    manifest written before names had to be special tokens says "token name ..."), "fallback" (a
    pad of EOS or 0, nothing naming one), or None."""
    if source.endswith(_GUESSED) or source.startswith("token name "):
        return "name"
    return "fallback" if source in _PAD_FALLBACKS else None


def _no_special(
    kind: str, path: str, configs: bool, names: tuple[str, ...], specials: dict[str, int]
) -> ConfigError:
    """The refusal of a tokenizer without the BOS or EOS a job adds: where it looked, and the
    special tokens that may be the one meant (a name with a hint of it; else the first few)."""
    looked = [f"no {kind}_token in {' or '.join(CONFIG_FILES)}"] if configs else []
    looked += [f"none in its post-processor template, no special token named {', '.join(names)}"]
    hinted = [t for t in specials if any(h in t.lower() for h in _HINTS[kind])]
    shown = (hinted or list(specials))[:8]
    if shown:
        which = "special tokens that may be it" if hinted else "its special tokens"
        listed = ", ".join(f"{t}={specials[t]}" for t in shown)
        more = f" (of {len(specials)})" if not hinted and len(specials) > len(shown) else ""
        offer = f"; {which}: {listed}{more}"
    else:
        offer = "; it has no special tokens"
    return ConfigError(
        f"tokenizer {path} has no {kind.upper()} token ({'; '.join(looked)}){offer}; set tokenizer.{kind}_id"
    )


def special_tokens(vocab: Any) -> dict[str, int]:
    """A tokenizer's special (added) tokens by content, from tokenizers' Tokenizer or a JsonVocab."""
    if isinstance(vocab, JsonVocab):
        return {t: i for t, i in vocab.added.items() if t in vocab.special}
    decoder = vocab.get_added_tokens_decoder()
    return {decoder[i].content: int(i) for i in sorted(decoder) if decoder[i].special}


def _part(tok: Tokenizer, raw: str | bytes, key: str) -> Any:
    """The tokenizer's `key` (normalizer, pre_tokenizer, post_processor) as tokenizer.json writes it:
    its own state (a few hundred bytes), not a parse of the whole file (0.19-0.27 s for a 128k BPE's
    ~10 MB, in the command, in the pool's zygote, in each worker that cuts a long text)."""
    component = getattr(tok, key)
    if component is None:
        return None
    try:
        return json.loads(component.__getstate__())
    except Exception:  # a tokenizers without it: the file's own key
        return json.loads(raw).get(key)


def _why_not(raw: bytes, error: Exception) -> str:
    """Why tokenizers would not load `raw`: JSON that is no tokenizer says so, where tokenizers'
    own message points at a line and column of a file that parses ('{"hello": "world"}': "expected
    `,` or `}` at line 1 column 9")."""
    try:
        spec = json.loads(raw)
    except ValueError:
        if raw[:1] == b"\n" and b"\x12" in raw[:64]:  # a protobuf: what SentencePiece's .model holds
            return (
                "it looks like a SentencePiece model (binary); raypack reads a tokenizers JSON: "
                "transformers' AutoTokenizer.from_pretrained(...).save_pretrained(DIR) writes one"
            )
        return str(error).splitlines()[0]  # not JSON: tokenizers' position is the JSON error's
    if not isinstance(spec, dict):
        return f"it holds a JSON {type(spec).__name__}, not a tokenizer's object"
    if "model" not in spec and {"config", "vocab"} <= set(spec):
        return (
            "it looks like Mistral's tekken.json, not a tokenizers JSON: transformers reads it and "
            "save_pretrained(DIR) writes the tokenizer.json raypack takes"
        )
    if "model" not in spec:
        keys = ", ".join(sorted(spec)[:5]) or "none"
        return f'it has no "model" (its keys: {keys}); a tokenizer.json is what tokenizers\' save writes'
    return str(error).splitlines()[0]


def _template(processor: Any) -> dict[str, str | None]:
    """{"bos": token before the sequence, "eos": token after it} of a post-processor (None: none)."""
    if not isinstance(processor, dict):
        return {}
    kind = processor.get("type")
    if kind == "Sequence":
        for inner in processor.get("processors") or []:
            found = _template(inner)
            if found:
                return found
        return {}
    if kind in ("BertProcessing", "RobertaProcessing"):
        cls, sep = processor.get("cls"), processor.get("sep")
        return {"bos": cls[0] if cls else None, "eos": sep[0] if sep else None}
    if kind != "TemplateProcessing":
        return {}
    single = processor.get("single") or []
    at = next((i for i, piece in enumerate(single) if "Sequence" in piece), None)
    if at is None:
        return {}
    before = [p["SpecialToken"]["id"] for p in single[:at] if "SpecialToken" in p]
    after = [p["SpecialToken"]["id"] for p in single[at + 1 :] if "SpecialToken" in p]
    return {"bos": before[-1] if before else None, "eos": after[0] if after else None}
