"""Encoders for the tokenize stage: `tokenizers` (the reference) and fastokens (exact, much faster),
used only behind checks that prove its ids equal the reference's.

fastokens (Rust, Apache-2.0) loads the same tokenizer.json and returns one flat uint32 buffer of ids
and a uint64 buffer of offsets per batch (`encode_batch_flat`): no Python object per token. On one
core it runs ×57-66 `tokenizers`' `encode_batch_fast` on byte-level BPEs (DeepSeek-V3, GPT-2,
trained 32k) and ×7.4 on a SentencePiece-style BPE. It refuses some
tokenizers at load (NFKC or Bert normalizers, the Metaspace pre-tokenizer, vocabularies with gaps).

`tokenizer.backend`:
- `tokenizers`: the reference alone.
- `fastokens`: fastokens or a ConfigError (not installed, refused, or its self-check failed).
- `auto` (default): fastokens when it loads the tokenizer and passes `self_check` (PROBES plus a
  sample of the corpus, every id compared); else `tokenizers`, and the reason is recorded.
During the job each tokenize task re-encodes a sample of its own pieces with `tokenizers`
(raypack.pipeline.tokenize.stage.Checker) and fails over on any difference, so the output never depends on
which backend ran.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from raypack.config import TOKENIZER_BACKENDS as BACKENDS
from raypack.errors import task_raised
from raypack.text.offsets import (
    PLAIN,
    PREPEND,
    ByteOffsets,
    PieceOffsets,
    added_pattern,
    forms_beside,
    metaspace_copy,
    normal_forms,
    reference_coder,
    unchanged,
)

__all__ = [
    "BACKENDS",
    "PROBES",
    "Choice",
    "Encoder",
    "FastFailed",
    "FastRefused",
    "FastokensEncoder",
    "Guarded",
    "Mismatch",
    "Route",
    "TokenizersEncoder",
    "choose_backend",
    "encode_aside",
    "failed_over",
    "fast_json",
    "fastokens_version",
    "first_difference",
    "probes",
    "reference_version",
]


class Encoder(Protocol):
    name: str
    version: str

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids (no special tokens added) as one int32 array, and each text's length."""
        ...


def reference_version() -> str:
    """The reference's version (tokenizers'), which keys and choices name: no tokenizer parsed."""
    import tokenizers

    return str(tokenizers.__version__)


class TokenizersEncoder:
    """`encode_batch_fast`: the ids of `encode_batch` without character offsets (1.4-1.5× faster on
    real C sources with a 128k BPE; tests check the ids equal)."""

    name = "tokenizers"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.version = tokenizer, reference_version()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import itertools

        ids = [e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum()))
        return flat, lengths


_MAIN = ("normalized", "tail")  # the copies (Route.copy) main encodes, given another text
_WARM = "warm-up: prose, code (x = f(1);\n\t}), 日本語, Привет, 🙂"  # FastokensEncoder.warm


@dataclass(frozen=True)
class Route:
    """Which of fastokens' copies of a tokenizer (fast_json) encodes a text as the tokenizer does;
    the texts neither does are the reference's (FastokensEncoder.encode)."""

    forms: tuple[str, ...] = ()
    """Normal forms taken out of the normalizer: a text one of them changes is encoded as they
    write it ("normalized"), or by the reference where it holds an added token."""
    metaspace: str | None = None
    """For a Metaspace rewritten as normalizers, its prepend_scheme: metaspace_copy says per text
    whether the copy with the Prepend ("main") or the one without it ("plain") writes the text
    as the Metaspace does."""
    added: re.Pattern[str] | None = None
    """The added tokens, where a rewrite needs them (a section starts after each one)."""

    def copy(self, text: str) -> str | None:
        """Which copy: "main" (fast_json's), "tail" (main, given the text but its first character),
        "plain" (its Metaspace rewrite without the Prepend), "normalized" (main, given the text as
        the normal forms write it), or None (the reference)."""
        if self.forms and not unchanged(self.forms, text):
            # Holding no added token, the text is one section, normalized whole (tokenizers splits
            # a text at its added tokens, then normalizes each section): main encodes it as
            # tokenizers would, given tokenizers' own normalization of it (FastokensEncoder).
            return "normalized" if self.added is None or not self.added.search(text) else None
        if self.metaspace is None:
            return "main"
        copy = metaspace_copy(self.metaspace, self.added, text)
        if (
            copy == PLAIN
            and len(text) > 1
            and text[0] in " ▁"
            and not (self.added and self.added.search(text))
        ):
            # One section that starts with a space or `▁`: the Replace alone writes it `▁` + R(rest),
            # as main (Prepend + Replace) writes the rest; the plain copy, ~0.35 s a process to make
            # for a 32k vocabulary, is then needed only for a text that also holds an added token.
            return "tail"
        return None if copy is None else "main" if copy == PREPEND else "plain"


def fast_json(tokenizer_json: str, *, prepend: bool = True) -> tuple[str, Route]:
    """What fastokens loads, and which texts it then encodes as the tokenizer does. Each rewrite
    holds for the texts Route.copy places, one way, checked per text; the others go to tokenizers:
    - a normalizer that only applies Unicode normal forms (NFKC, NFC, NFD..., alone or in a
      Sequence) is left out: a text they leave as it is is encoded as it stands, one they change
      as tokenizers' own normalizer writes it where it holds no added token. fastokens refuses
      NFKC and NFD at load (kept in, a byte-level BPE with NFKC would run wholly on tokenizers:
      127 MB in 30.7 s on a core);
    - a SentencePiece BPE as transformers 5 converts it (Llama, Mistral: a Metaspace pre-tokenizer,
      `prepend_scheme: first` or `always`, `split: false`, no normalizer), which fastokens
      refuses, becomes the `Prepend("▁")` + `Replace(" ", "▁")` normalizer of the same model's
      published tokenizer.json (`prepend=False`: the Replace alone, the "plain" copy): one of the
      two writes a text as the Metaspace does wherever metaspace_copy says which (with `first`:
      every text but one that holds an added token and starts with neither it, a space nor `▁`).
    Other normalizers and pre-tokenizers stay, for fastokens to take or refuse. Only their own
    JSON is parsed (a 128k vocabulary's file is 7-10 MB)."""
    normalizer = _part(tokenizer_json, "normalizer")
    if normalizer is None:  # absent: nothing to rewrite in place
        return tokenizer_json, Route()
    spec, start, end = normalizer
    if spec is not None:
        forms = normal_forms(spec)
        if forms is None:
            return tokenizer_json, Route()
        route = Route(forms=forms, added=_added(tokenizer_json))
        return tokenizer_json[:start] + "null" + tokenizer_json[end:], route
    pre = _part(tokenizer_json, "pre_tokenizer")
    # tokenizers writes the normalizer before the pre-tokenizer: one splice after the other.
    if pre is not None and pre[0] is not None and _metaspace_always(pre[0]) and end <= pre[1]:
        replacement = pre[0]["replacement"]
        steps = [{"type": "Replace", "pattern": {"String": " "}, "content": replacement}]
        if prepend:
            steps.insert(0, {"type": "Prepend", "prepend": replacement})
        normalizers = json.dumps({"type": "Sequence", "normalizers": steps}, ensure_ascii=False)
        text = (
            tokenizer_json[:start]
            + normalizers
            + tokenizer_json[end : pre[1]]
            + "null"
            + tokenizer_json[pre[2] :]
        )
        scheme = str(pre[0]["prepend_scheme"])
        return text, Route(metaspace=scheme, added=_added(tokenizer_json))
    return tokenizer_json, Route()


def _part(tokenizer_json: str, key: str) -> tuple[dict[str, Any] | None, int, int] | None:
    """tokenizer.json's `key` (an object, or None for null) and where it stands in the text; None
    when the file has no such key."""
    found = re.search(rf'"{key}":\s*(null|\{{)', tokenizer_json)
    if found is None:
        return None
    start = found.start(1)
    if found.group(1) == "null":
        return None, start, found.end(1)
    spec, end = json.JSONDecoder().raw_decode(tokenizer_json, start)
    return spec, start, end


def _added(tokenizer_json: str) -> re.Pattern[str] | None:
    """A pattern that finds any of the tokenizer's added tokens in a text (None: it has none)."""
    found = re.search(r'"added_tokens":\s*\[', tokenizer_json)
    if found is None:
        return None
    tokens, _ = json.JSONDecoder().raw_decode(tokenizer_json, found.end() - 1)
    return added_pattern(str(t["content"]) for t in tokens if t.get("content"))


def _normalizer_steps(tokenizer_json: str) -> tuple[str, str]:
    """The normalizer's normal forms and its other steps, each kind named once ("NFKC", "Strip and
    Lowercase"; "" for none), for the reasons a refusal gives."""
    normalizer = _part(tokenizer_json, "normalizer")
    forms, others = forms_beside(normalizer[0] if normalizer is not None else None)
    return " and ".join(dict.fromkeys(forms)), " and ".join(dict.fromkeys(others))


def _forms_kept(tokenizer_json: str) -> str:
    """Why fastokens met a normal form raypack leaves out for it (fast_json): the normalizer holds
    other steps too. Without it, NFKC then Strip would read only "unsupported normalizer type:
    NFKC", though NFKC alone runs on fastokens."""
    forms, others = _normalizer_steps(tokenizer_json)
    if not forms or not others:
        return ""
    return (
        f"; raypack leaves {forms} out for fastokens only in a normalizer of Unicode normal forms"
        f" alone, and this one has {others} too"
    )


def _metaspace_always(spec: dict[str, Any]) -> bool:
    return (
        spec.get("type") == "Metaspace"
        and spec.get("prepend_scheme") in ("always", "first")
        and spec.get("split") is False
        and isinstance(spec.get("replacement"), str)
        and len(spec["replacement"]) == 1
    )


class FastokensEncoder:
    name = "fastokens"

    def __init__(self, tokenizer_json: str, built: Callable[[], Any] | None = None) -> None:
        """`built`: gives fastokens' Tokenizer of fast_json(tokenizer_json) where it was made
        already, or its exception (a local pool's zygote builds it as it starts:
        raypack.pipeline.tokenize.worker); None where it was not."""
        import fastokens

        loaded, self.route = fast_json(tokenizer_json)
        self.json = tokenizer_json
        self.routed = [0, 0]
        """Texts (and their UTF-8 bytes) `route` gave the reference (its owner resets it)."""
        self.last_routed: tuple[tuple[int, ...], float] = ((), 0.0)
        """The latest encode's texts the reference encoded (their places), and its seconds on them."""
        self.normalizer: Any = None
        """tokenizers' normalizer of route.forms, made when first needed ("normalized" texts)."""
        self.plain: Any = None
        """fastokens' copy without the Metaspace rewrite's Prepend (Route.copy "plain")."""
        self.reference: Encoder | None = None
        """For the texts `route` does not take: the job's tokenizers encoder, set by whoever holds
        one (else made from the JSON when first needed)."""
        try:
            made = built() if built is not None else None
            self.tokenizer = made if made is not None else fastokens.Tokenizer.from_json_str(loaded)
        except Exception as e:  # fastokens raises ValueError for what it does not support
            raise FastRefused(_first_line(e) + _forms_kept(tokenizer_json)) from e
        self.version = fastokens_version() or "?"
        self.pool_started = False
        """fastokens made its thread pool (at its first encode in a process): see _one_thread."""

    def warm(self) -> None:
        """fastokens' tables for this tokenizer built now: its first encode of a tokenizer builds
        them (0.03-0.07 s of CPU for a 131k byte-level BPE or a 65k NFKC one, none for a 32k
        SentencePiece BPE), which each worker forked from a local pool's zygote would otherwise
        pay on its first unit. One short text through `encode`, which makes no thread (a batch's
        first encode makes the thread pool, which a fork would not keep); FastFailed where it
        raises or panics on it."""
        with _failures_as(FastFailed, "", "a warm-up text"), _one_thread():
            self.tokenizer.encode(_WARM, add_special_tokens=False)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        self.last_routed = ((), 0.0)
        if self.route != Route():
            copies = [self.route.copy(t) for t in texts]
            if any(c != "main" for c in copies):
                return self._routed(texts, copies)
        return self._encode(texts)

    def _normalized(self, texts: list[str], copies: list[str | None]) -> list[str]:
        """`texts` with each "normalized" one as tokenizers' normalizer writes it; one that then
        holds an added token (matched in the normalized text) becomes the reference's."""
        if self.normalizer is None:
            from tokenizers import normalizers

            forms = [getattr(normalizers, form)() for form in self.route.forms]
            self.normalizer = normalizers.Sequence(forms)
        out = list(texts)
        for i, copy in enumerate(copies):
            if copy == "normalized":
                out[i] = self.normalizer.normalize_str(texts[i])
                if self.route.added is not None and self.route.added.search(out[i]):
                    copies[i], out[i] = None, texts[i]
        return out

    def _routed(self, texts: list[str], copies: list[str | None]) -> tuple[np.ndarray, np.ndarray]:
        """Each text encoded by the copy Route.copy named: "main", "tail" (main, on the text but its
        first character), "plain", "normalized" (main, on the normalized text) or (None) the
        reference."""
        if "normalized" in copies:
            texts = self._normalized(texts, copies)
        if "tail" in copies:
            texts = [t[1:] if c == "tail" else t for t, c in zip(texts, copies, strict=True)]
        changed = [i for i, c in enumerate(copies) if c is None]
        if changed and self.reference is None:
            from tokenizers import Tokenizer

            self.reference = TokenizersEncoder(Tokenizer.from_str(self.json))
        self.routed[0] += len(changed)
        self.routed[1] += sum(len(texts[i].encode("utf-8", "surrogatepass")) for i in changed)
        lengths = np.zeros(len(texts), dtype=np.int64)
        pieces = [np.zeros(0, dtype=np.int32)] * len(texts)
        encoders = {"main": self._encode, "plain": self._plain_encode, None: self._reference_encode}
        spent = 0.0
        for copy, encode in encoders.items():
            # A normalized or tail text is main's: one batch for all.
            where = [i for i, c in enumerate(copies) if c == copy or (copy == "main" and c in _MAIN)]
            if not where:
                continue
            t0 = time.perf_counter()
            flat, n = encode([texts[i] for i in where])
            spent += time.perf_counter() - t0 if copy is None else 0.0
            ends = np.cumsum(n)
            for k, i in enumerate(where):
                lengths[i] = n[k]
                pieces[i] = flat[ends[k] - n[k] : ends[k]]
        self.last_routed = (tuple(changed), spent)
        return np.concatenate(pieces).astype(np.int32, copy=False), lengths

    def _reference_encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        assert self.reference is not None
        return self.reference.encode(texts)

    def _plain_encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The Metaspace rewrite without its Prepend (made when first needed: 32k ids, ~0.1 s)."""
        if self.plain is None:
            import fastokens

            self.plain = fastokens.Tokenizer.from_json_str(fast_json(self.json, prepend=False)[0])
        return self._flat(self.plain, texts)

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self._flat(self.tokenizer, texts)

    def _flat(self, tokenizer: Any, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.pool_started:
            ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
        else:
            with _one_thread():
                ids, offsets = tokenizer.encode_batch_flat(texts, add_special_tokens=False)
            self.pool_started = True
        flat = np.frombuffer(ids, dtype=np.uint32)
        ends = np.frombuffer(offsets, dtype=np.uint64).astype(np.int64)
        # Ids fit int32 (a vocabulary has < 2^31 entries): a view, not a copy.
        return flat.view(np.int32), np.diff(ends)


@contextmanager
def _one_thread() -> Iterator[None]:
    """FASTOKENS_BPE_THREADS=1 while fastokens makes its thread pool (at a process's first encode,
    which reads it), unless set already; then the environment as it was: a job's worker holds one
    encoder a CPU, and N workers × N threads on N cores lose ~19% (measured for tokenizers' pool),
    while the process's environment, the user's own where the driver encodes, is left alone."""
    name = "FASTOKENS_BPE_THREADS"
    if name in os.environ:
        yield
        return
    os.environ[name] = "1"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def fastokens_version() -> str | None:
    """The installed fastokens' version, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fastokens")
    except PackageNotFoundError:
        return None


def probes(added: list[str]) -> list[str]:
    """Texts that catch the known ways for two BPE implementations to differ (PROBES), plus each of
    the tokenizer's added tokens (`added`, by id: LoadedTokenizer.added_tokens) inside text, at its
    edges, doubled and next to whitespace."""
    inside = []
    for t in added[:64]:  # a 128k vocabulary may add hundreds; these cover the matching rules
        inside += [f"abc{t}def", f" {t} ", f"{t}{t}", f"\n{t}\n", f"x {t}x", t]
    return [*PROBES, *inside]


_LONG = " ".join(["packing", "sequences", "for", "training", "日本語", "🙂", "don't"] * 4000)
PROBES = (
    "",
    " ",
    "  ",
    "     \t  ",
    "\n",
    "\n\n\n",
    "\r\n",
    "line one\r\nline two\r\n\r\n",
    "a\rb",
    "tabs\t\tand  double  spaces   and    more",
    " leading space",
    "trailing space ",
    "x" + " " * 33 + "y",
    "    def f(x):\n        return x  # indented code\n",
    "don't I'm they're we've you'll she'd it's 'quoted' \"double\"",
    "DON'T I'M THEY'RE",
    "日本語のテキストを分かち書きせずに書く。",
    "中文字符测试，标点符号。",
    "한국어 텍스트 테스트",
    "Привет, мир! Ёжик.",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "e\u0301 a\u0308 n\u0303 o\u0302\u0323",  # combining marks
    "Z\u0351\u0358\u0315a\u0342\u0310l\u0353g\u0316o",
    "👩\u200d👩\u200d👧\u200d👦 🏳️\u200d🌈 👍🏽 🇯🇵 ❤️",
    "\ufeffbyte order mark",
    "zero\u200bwidth\u200cjoiners\u200d",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces",
    "control \x00\x01\x07\x1b\x7f chars",
    "numbers 0 1 12 123 1234 12345 3.14159 1e-9 0x7fff 1,000,000",
    "!!!!!!!!!!!!...........??????------______",
    "https://example.com/path?query=1&b=2#frag user@example.com",
    "CamelCaseWordsAndsnake_case_words",
    "a" * 5000,  # one long word
    _LONG,  # a long document
)


def first_difference(
    reference: Encoder,
    fast: Encoder,
    texts: list[str],
    offsets: ByteOffsets | PieceOffsets | None = None,
) -> str | None:
    """Where the two encoders first give other ids for `texts`, or None when every id is equal; with
    `offsets`, also where the fast ids' character offsets differ from tokenizers' own."""
    if not texts:
        return None
    if offsets is not None:
        # Offsets are asked of the driver's own parse (conversations parse the tokenizer there).
        assert isinstance(reference, TokenizersEncoder)
        want_coded = reference_coder(reference.tokenizer)(texts).split()
        got_coded = offsets.coder(fast, reference_coder(reference.tokenizer))(texts).split()
        for i, (text, (a, oa), (b, ob)) in enumerate(zip(texts, want_coded, got_coded, strict=True)):
            if not np.array_equal(a, b):
                return f"text {i} ({text[:40]!r}, {len(text):,} characters): {len(a)} ids against {len(b)}"
            if not np.array_equal(oa, ob):
                at = int(np.flatnonzero((oa != ob).any(axis=1))[0])
                where = f"token {at}'s offsets {oa[at].tolist()} against {ob[at].tolist()}"
                return f"text {i} ({text[:40]!r}): {where}"
        return None
    want, want_len = reference.encode(texts)
    got, got_len = fast.encode(texts)
    ends_w, ends_g = np.cumsum(want_len), np.cumsum(got_len)
    for i, text in enumerate(texts):
        a = want[ends_w[i] - want_len[i] : ends_w[i]]
        b = got[ends_g[i] - got_len[i] : ends_g[i]]
        if not np.array_equal(a, b):
            return f"text {i} ({text[:40]!r}, {len(text):,} characters): {len(a)} ids against {len(b)}"
    return None


class FastRefused(ValueError):
    """fastokens would not load the tokenizer (what it does not support)."""


class FastFailed(Exception):
    """fastokens loaded the tokenizer but could not encode a text of the check."""


def _compared(
    reference: Encoder, fast: Encoder, texts: list[str], offsets: ByteOffsets | PieceOffsets | None
) -> str | None:
    """first_difference(reference, fast, texts, offsets); FastFailed where fastokens raised on the
    texts or panicked: then it is not usable."""
    with _failures_as(FastFailed, "", "the texts of the check"):
        return first_difference(reference, fast, texts, offsets)


@contextmanager
def _failures_as(kind: type[Exception], who: str, where: str) -> Iterator[None]:
    """An exception the fast encoder raised (FastRefused aside: what it refused at load), or a Rust
    panic of it (pyo3's PanicException is a BaseException), raised again as `kind`, saying which."""
    try:
        yield
    except FastRefused:
        raise
    except Exception as e:
        raise kind(f"{who}raised on {where}: {_first_line(e)}") from e
    except BaseException as e:
        if type(e).__name__ != "PanicException":
            raise
        raise kind(f"{who}panicked on {where}: {_first_line(e)}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


class Mismatch(Exception):
    """The fast backend gave other ids than the reference on a sampled piece (or raised on one)."""


class Guarded:
    """A fast encoder whose failures are differences: an exception (or a Rust panic) it raises on a
    text that tokenizers encodes is a Mismatch, and the unit fails over to tokenizers."""

    def __init__(self, inner: Encoder) -> None:
        self.inner, self.name, self.version = inner, inner.name, inner.version

    @property
    def last_routed(self) -> tuple[tuple[int, ...], float]:
        """The inner encoder's (FastokensEncoder.last_routed), where it has one."""
        routed: tuple[tuple[int, ...], float] = getattr(self.inner, "last_routed", ((), 0.0))
        return routed

    @property
    def routed(self) -> list[int] | None:
        """The inner encoder's tally of texts it gave the reference (FastokensEncoder.routed), if any."""
        tally: list[int] | None = getattr(self.inner, "routed", None)
        return tally

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        with _failures_as(Mismatch, f"{self.name} ", f"{len(texts)} texts"):
            return self.inner.encode(texts)


def encode_aside(encoder: Encoder, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """`encoder`'s ids of texts that are none of a unit's documents (a cut's window, a segment the
    in-run check compares), its tally of the texts it gave the reference (FastokensEncoder.routed,
    which the summary counts as documents) left as it was."""
    tally: list[int] | None = getattr(encoder, "routed", None)
    before = list(tally) if tally is not None else None
    try:
        return encoder.encode(texts)
    finally:
        if tally is not None and before is not None:
            tally[:] = before


@dataclass
class Choice:
    """The tokenize stage's backend and why: what the summary and the manifest report."""

    backend: str
    version: str
    reason: str
    probes: int = 0
    sampled: int = 0
    """Corpus texts the self-check compared."""
    failed_over: Choice | None = None
    """The fast backend this choice replaced after it gave other ids in the run (failed_over)."""

    @property
    def label(self) -> str:
        return f"{self.backend} {self.version}"


def failed_over(choice: Choice, reason: str) -> Choice:
    """tokenizers, in place of `choice`, whose ids differed from tokenizers' in the run."""
    version = reference_version()
    why = f"{choice.label} gave other ids than tokenizers {version} in the run: {reason}"
    return Choice("tokenizers", version, why, choice.probes, choice.sampled, failed_over=choice)


def choose_backend(
    requested: str,
    tok: Any,
    corpus_sample: Callable[[], list[str]],
    fast_encoder: Callable[[], Encoder] | None = None,
    *,
    chat: bool = False,
    probe_texts: list[str] | None = None,
    reference_encoder: Callable[[], Encoder] | None = None,
) -> Choice:
    """The backend to tokenize with, for `tokenizer.backend` = `requested` (BACKENDS). ConfigError
    when `fastokens` was asked for and cannot be used exactly; `auto` falls back with the reason.
    `corpus_sample` is called (it reads the corpus) only once fastokens has loaded and passed the
    probes. `fast_encoder`: fastokens' encoder of tok (an exception when it refuses it); default one
    loaded here (the job's: a tokenize worker's, raypack.pipeline.tokenize.pool). `chat`: the job
    needs character offsets too (a chat mask): only a byte-level or SentencePiece BPE's follow from
    fast ids (raypack.text.offsets.offsets_of), and every offset of the probes and sample is
    compared as well as every id;
    `probe_texts` then adds the template's renders of the chat probes; `reference_encoder`:
    tokenizers' encoder of tok on a worker (the job's driver did not parse it), default the
    driver's."""
    from raypack.errors import ConfigError

    reference = reference_encoder() if reference_encoder is not None else TokenizersEncoder(tok.tokenizer)
    if requested == "tokenizers":
        return Choice("tokenizers", reference.version, "tokenizer.backend: tokenizers")

    def refuse(reason: str) -> Choice:
        if requested == "fastokens":
            raise ConfigError(f"tokenizer.backend fastokens: {reason}; use auto or tokenizers")
        return Choice("tokenizers", reference.version, reason)

    offsets = tok.offsets() if chat else None
    if chat and offsets is None:
        rewrites = _normalizer_steps(tok.json)[1]
        also = f"; this one's normalizer has {rewrites}" if rewrites else ""
        return refuse(
            "chat data's mask needs character offsets, and this tokenizer's do not follow from its ids "
            "(fastokens gives ids only; a byte-level BPE's offsets follow, and a SentencePiece BPE's with "
            f"byte fallback: raypack.text.offsets{also})"
        )
    if fastokens_version() is None:
        return refuse("fastokens is not installed (no wheel for this platform?)")
    checked = [*probes(tok.added_tokens()), *(probe_texts or [])]
    sample: list[str] = []
    try:
        if fast_encoder is not None:
            fast = fast_encoder()
        else:
            fast = FastokensEncoder(tok.json)
            fast.reference = reference
        differs = _compared(reference, fast, checked, offsets)
        if differs is None:
            sample = corpus_sample()
            differs = _compared(reference, fast, sample, offsets)
    except FastRefused as e:  # at load (on a Ray worker: its RayTaskError, whose text is Ray's header)
        return refuse(
            f"fastokens {fastokens_version()} refuses this tokenizer ({_first_line(task_raised(e))})"
        )
    except FastFailed as e:
        return refuse(f"fastokens {fastokens_version()} {task_raised(e)}")
    what = "ids and character offsets" if chat else "ids"
    noun = ("conversation" if chat else "document") + ("s" if len(sample) != 1 else "")
    texts = f"{len(sample):,} corpus {noun}"
    if differs is not None:
        return refuse(f"fastokens {fast.version} gave other {what} than tokenizers on {differs}")
    return Choice(
        "fastokens",
        fast.version,
        f"{what} equal to tokenizers {reference.version} on {len(checked):,} probes and {texts}",
        len(checked),
        len(sample),
    )
