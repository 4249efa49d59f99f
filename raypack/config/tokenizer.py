"""tokenizer: which tokenizer, how documents are framed, what encodes (raypack.text.backends)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from raypack.errors import ConfigError

__all__ = ["CHAT_SPANS", "TOKENIZER_BACKENDS", "TokenizerConfig"]

TOKENIZER_BACKENDS = ("auto", "tokenizers", "fastokens")  # raypack.text.backends
CHAT_SPANS = ("auto", "prefixes")  # raypack.text.chat


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerConfig:
    """Which tokenizer, how each document is framed (BOS, EOS), what encodes, and the chat template."""

    path: str
    """A Hugging Face `tokenizers` JSON file, or a model directory holding tokenizer.json (and
    tokenizer_config.json / special_tokens_map.json), local or s3://..."""
    add_bos: bool = False
    """Put BOS before each document (plain text and prompt/completion pairs; a conversation is framed
    by its chat template alone). Which token: bos_id."""
    add_eos: bool = True
    """Put EOS after each document, framed as add_bos says. output.format megatron and olmo find
    documents by EOS and need it. Which token: eos_id."""
    bos_id: int | None = None
    """BOS token id; None: the model directory's bos_token, else the post-processor template's, else a
    token named <s>, <|begin_of_text|>, ... (raypack.text.tokenizer)."""
    eos_id: int | None = None
    """EOS token id; None: found as bos_id is (eos_token, the template, </s>, <|endoftext|>, ...)."""
    concurrency: int | None = None
    """Units tokenized at once (a Ray task of one CPU each); None: one per CPU of the cluster."""
    batch_size: int = 512
    """Documents per encode_batch call."""
    chat_template: str | None = None
    """A Jinja chat template file (local or s3://) for input.messages_field; None: the model
    directory's chat_template.jinja, else its tokenizer_config.json `chat_template`."""
    chat_date: str | None = None
    """What a template that prints the date (strftime_now: Llama 3.1-3.3's "Today Date") prints, an
    ISO date or date-time (2024-07-26). None: the day the dataset is packed, or for a rebuild the
    date its root's versions were packed with, so that a dataset never mixes dates; the manifest
    records it (chat.date) and verify renders with it."""
    chat_spans: str = "auto"
    """How a template without {% generation %} markers shows the assistant turns (pack.loss
    assistant). prefixes: rendering growing prefixes of each conversation, two renders a turn
    (O(turns²)); auto: a conversation of 3 or more assistant turns rendered once, where the template
    is seen writing each message, taken where its first and last turns agree with their prefix
    renders and every turn between has their form, else prefixes (raypack.text.chat). The job's
    self-check compares both on its probes and corpus sample and takes prefixes for the whole job
    on a difference (the manifest's chat.spans says which ran)."""
    backend: str = "auto"
    """What encodes: tokenizers (the reference), fastokens (exact and ×7-66 faster where it loads the
    tokenizer; a ConfigError where it cannot be used), or auto: fastokens when it loads the tokenizer
    and gives the same ids as tokenizers on probes and a corpus sample, else tokenizers (the summary
    says why). Each tokenize task also re-checks a sample with tokenizers and fails over on any
    difference (raypack.text.backends). fastokens takes byte-level BPEs (NFKC ones too: a plain
    text NFKC changes is given as tokenizers' NFKC writes it) and SentencePiece BPEs (Mistral/Llama
    tokenizer.json, Prepend+Replace or transformers 5's Metaspace), chat data included: offsets
    follow from either's ids. Texts it cannot take go to tokenizers, counted in the summary: a
    conversation NFKC changes; with the Metaspace, one holding an added token not at its start."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("tokenizer.path must not be empty")
        if self.backend not in TOKENIZER_BACKENDS:
            raise ConfigError(
                f"tokenizer.backend must be one of {', '.join(TOKENIZER_BACKENDS)}, got {self.backend!r}"
            )
        if self.chat_spans not in CHAT_SPANS:
            raise ConfigError(
                f"tokenizer.chat_spans must be one of {', '.join(CHAT_SPANS)}, got {self.chat_spans!r}"
            )
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"tokenizer.concurrency must be >= 1 or null, got {self.concurrency}")
        if self.batch_size < 1:
            raise ConfigError(f"tokenizer.batch_size must be >= 1, got {self.batch_size}")
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"tokenizer.{name} must be >= 0, got {value}")
        if self.chat_date is not None:
            try:
                datetime.fromisoformat(self.chat_date)
            except ValueError:
                raise ConfigError(
                    "tokenizer.chat_date must be an ISO date or date-time (2024-07-26), got "
                    f"{self.chat_date!r}"
                ) from None
