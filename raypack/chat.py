"""Conversations and prompt/completion pairs → the text a tokenizer encodes, and which of its tokens
are trained (pure: no Ray; the tokenize actors call it).

Conversations (input.messages_field) are rendered with the tokenizer's chat template the way
Hugging Face transformers renders them (`apply_chat_template`): Jinja's immutable sandbox with
trim_blocks and lstrip_blocks, loop controls, `tojson` that leaves non-ASCII alone, `raise_exception`,
`strftime_now`, the special tokens (bos_token, eos_token, ...) as variables, message keys whose value
is None dropped, and reasoning given under any of its names. The rendered text is encoded whole with
add_special_tokens off (the template writes its own special tokens), so the ids are the ones
`apply_chat_template(messages, tokenize=True)` gives.

Which tokens are trained (pack.loss):
- assistant, with a template that marks assistant text with `{% generation %}`: the marked
  characters, mapped to tokens as transformers maps them for `return_assistant_tokens_mask` (the token
  holding a span's first character through the one holding its last);
- assistant, with a template that has no markers (most published ones): derived by rendering growing
  prefixes of the conversation. For each assistant turn i, the text after the prompt for it
  (messages[:i] with the generation prompt) up to the end of messages[:i+1] is that turn: its content
  and the template's end-of-turn tokens, which the model must learn to emit. This holds only for a
  template whose render of a prefix is a prefix of the render of the whole; one that rewrites earlier
  turns (drops past reasoning, say) is refused with the template's name, never given a wrong or
  all-zero mask;
- completion (pairs): the completion's characters (and EOS when tokenizer.add_eos);
- all: every token.
A conversation with no trained token is a reject, like an empty document: it would add tokens to a
pack and nothing to the loss (transformers #34172, trl #4201: an all-zero mask passed silently).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from raypack.config import StorageConfig, TokenizerConfig
from raypack.errors import ConfigError

__all__ = [
    "CHAT_FILE",
    "PROBES",
    "RENDER_VERSION",
    "ChatTemplate",
    "NotPrefixStable",
    "RenderError",
    "chat_rows",
    "check_template",
    "load_template",
    "pair_spans",
    "special_tokens",
    "template_variables",
    "token_mask",
]

CHAT_FILE = "chat_template.jinja"
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# The special tokens a template sees by name (transformers passes its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Names a message's reasoning goes by: templates read reasoning_content (gpt-oss: thinking).
_REASONING = ("reasoning_content", "thinking", "reasoning")
# The rendering and masking code's version, in every chat token file's cache key: a change to what
# the same conversation renders to or which of its tokens are trained must never reuse token files
# the old code wrote. 2: special tokens from the tokenizer's resolved BOS/EOS, a fixed date for
# strftime_now, trained spans whose first or last character no token holds (issue 31).
RENDER_VERSION = 2
# Templates that print the date (Llama 3.1-3.3: strftime_now("%d %b %Y")): the job fixes it.
_PRINTS_DATE = re.compile(r"\bstrftime_now\b")


class RenderError(ValueError):
    """A conversation the template refuses or cannot render (its raise_exception, a type error in
    the data): a recorded reject with the template's message."""


class NotPrefixStable(RenderError):
    """The template renders a prefix of the conversation as something other than a prefix of the
    whole: the assistant turns cannot be found without markers."""


def load_template(
    cfg: TokenizerConfig, configs: dict[str, dict[str, Any]], storage: StorageConfig | None
) -> tuple[str, str]:
    """(template text, where it came from): tokenizer.chat_template, else the model directory's
    chat_template.jinja, else its tokenizer_config.json `chat_template` (a string, or a list of named
    templates: "default"). ConfigError when there is none."""
    from raypack.storage import join, read_bytes, resolve

    def read(path: str) -> str:
        try:
            return read_bytes(path, storage).decode("utf-8")
        except FileNotFoundError:
            raise ConfigError(f"tokenizer.chat_template: file not found: {path}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read chat template {path}: {str(e).splitlines()[0]}") from None

    if cfg.chat_template:
        return read(cfg.chat_template), cfg.chat_template
    import pyarrow.fs as pafs

    fs, inner = resolve(cfg.path, storage)
    if fs.get_file_info(inner).type == pafs.FileType.Directory:
        jinja = join(cfg.path, CHAT_FILE)
        if fs.get_file_info(resolve(jinja, storage)[1]).type == pafs.FileType.File:
            return read(jinja), jinja
    value = configs.get("tokenizer_config.json", {}).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if isinstance(value, str) and value:
        return value, join(cfg.path, "tokenizer_config.json")
    raise ConfigError(
        f"input.messages_field needs a chat template, and tokenizer {cfg.path} has none ({CHAT_FILE} or "
        "tokenizer_config.json chat_template): set tokenizer.chat_template to a template file"
    )


def special_tokens(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The special tokens a template sees by name, from tokenizer_config.json, then
    special_tokens_map.json (a token is a string or {"content": ...})."""
    found: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the later file wins
        for key in SPECIAL_TOKENS:
            value = configs.get(name, {}).get(key)
            content = value.get("content") if isinstance(value, dict) else value
            if isinstance(content, str):
                found[key] = content
    return found


def template_variables(
    configs: dict[str, dict[str, Any]],
    resolved: dict[str, str | None],
    explicit: dict[str, str | None],
) -> dict[str, str]:
    """The special tokens a template sees: `explicit` (tokenizer.bos_id / eos_id, as token text) over
    the model directory's files (what transformers passes), and for a bare tokenizer.json, which has
    no such files, the BOS and EOS the tokenizer resolves (its post-processor template, known names:
    `resolved`). Without this a Llama-3-style `{{ bos_token }}` rendered as nothing."""
    found = special_tokens(configs)
    if not configs:
        found |= {k: v for k, v in resolved.items() if v is not None}
    return found | {k: v for k, v in explicit.items() if v is not None}


def _environment(now: datetime | None) -> Any:
    """A Jinja environment configured as transformers configures its own for chat templates, with a
    `generation` tag that records where each marked block lands in the output."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

        def __init__(self, environment: Any) -> None:
            super().__init__(environment)
            environment.extend(generation_spans=None, rendered_blocks=None)

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_mark"), [], [], body).set_lineno(lineno)

        def _mark(self, caller: Callable[[], str]) -> str:
            text = caller()
            env: Any = self.environment
            if env.generation_spans is not None:  # the output so far is what generate() has yielded
                start = sum(len(b) for b in env.rendered_blocks)
                env.generation_spans.append((start, start + len(text)))
            return text

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    # transformers prints the day it runs; a dataset must not depend on the day it was packed (a
    # rebuild would mix dates): the job fixes `now` (tokenizer.chat_date, recorded in the manifest).
    env.globals["strftime_now"] = lambda fmt: (now or datetime.now()).strftime(fmt)
    return env


def _normalize(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Keys whose value is None dropped (content=None beside tool_calls renders "None" in many
    templates), reasoning under every name templates read."""
    out = []
    for m in messages:
        m = {k: v for k, v in m.items() if v is not None}
        reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


class ChatTemplate:
    """One chat template, compiled once (per tokenize worker). `now`: what strftime_now prints (None:
    the clock, as transformers does; the job always gives one when the template prints the date)."""

    def __init__(
        self, source: str, origin: str, variables: dict[str, str], now: datetime | None = None
    ) -> None:
        import jinja2
        import jinja2.meta

        self.source, self.origin, self.variables = source, origin, dict(variables)
        self.markers = bool(GENERATION.search(source))
        self.prints_date = bool(_PRINTS_DATE.search(source))
        self.now = now if self.prints_date else None
        self._env = _environment(self.now)
        try:
            self._template = self._env.from_string(source)
            used = jinja2.meta.find_undeclared_variables(self._env.parse(source))
        except jinja2.exceptions.TemplateSyntaxError as e:
            raise ConfigError(f"chat template {origin}: line {e.lineno}: {e.message}") from None
        # An undefined variable renders as nothing: a template that writes BOS or EOS the tokenizer
        # does not name would silently lose them from every conversation.
        missing = sorted(v for v in ("bos_token", "eos_token") if v in used and v not in self.variables)
        if missing:
            kind = missing[0].split("_")[0]
            raise ConfigError(
                f"chat template {origin} writes {{{{ {missing[0]} }}}}, and the tokenizer names no "
                f"{kind.upper()} token (no {missing[0]} in tokenizer_config.json or special_tokens_map.json, "
                f"none found in tokenizer.json): set tokenizer.{kind}_id"
            )

    def key(self) -> dict[str, Any]:
        """What decides its renders, for the token cache key: the text, the variables, the date."""
        return {
            "template_sha256": hashlib.sha256(self.source.encode()).hexdigest(),
            "variables": dict(sorted(self.variables.items())),
            "date": self.now.isoformat() if self.now is not None else None,
        }

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        add_generation_prompt: bool = False,
        track: bool = False,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and, with `track`, the character spans of its `{% generation %}` blocks."""
        import jinja2

        args = {**self.variables, "messages": _normalize(messages), "tools": tools, "documents": None}
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        env = self._env
        env.rendered_blocks, env.generation_spans = (blocks, spans) if track else (None, None)
        try:
            for block in self._template.generate(add_generation_prompt=add_generation_prompt, **args):
                blocks.append(block)
        except jinja2.exceptions.TemplateError as e:
            raise RenderError(f"chat template {self.origin}: {e.message or type(e).__name__}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise RenderError(f"chat template {self.origin} failed on this conversation: {e}") from None
        finally:
            env.rendered_blocks = env.generation_spans = None
        return "".join(blocks), spans

    def conversation(
        self, messages: list[dict[str, Any]], tools: Any, loss: str
    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and its trained character spans (module docstring)."""
        if loss == "all":
            text, _ = self.render(messages, tools)
            return text, [(0, len(text))]
        if self.markers:
            return self.render(messages, tools, track=True)
        text, _ = self.render(messages, tools)
        spans = []
        for i, m in enumerate(messages):
            if m.get("role") != "assistant":
                continue
            before, _ = self.render(messages[:i], tools, add_generation_prompt=True)
            through, _ = self.render(messages[: i + 1], tools)
            if not through.startswith(before) or not text.startswith(through):
                raise NotPrefixStable(
                    f"chat template {self.origin} is not prefix-stable: the conversation up to assistant "
                    f"turn {i} renders as something other than the start of the whole conversation (it "
                    "rewrites earlier turns), so the assistant tokens cannot be found; give a template with "
                    "{% generation %} markers (tokenizer.chat_template) or pack.loss: all"
                )
            spans.append((len(before), len(through)))
        return text, spans


def pair_spans(prompt: str, completion: str, loss: str) -> tuple[str, list[tuple[int, int]]]:
    """A prompt/completion pair's text (prompt + completion, as TRL joins plain pairs) and its
    trained span."""
    text = prompt + completion
    return text, [(0 if loss == "all" else len(prompt), len(text))]


def token_mask(offsets: np.ndarray, spans: list[tuple[int, int]], text_len: int) -> np.ndarray:
    """Which tokens the character `spans` train, given each token's (start, end) character offsets:
    from the token holding a span's first character through the one holding its last, as
    transformers' return_assistant_tokens_mask maps them (Encoding.char_to_token: the first token
    whose offsets hold the character).

    Where transformers loses tokens, this does not:
    - a character no token holds (a byte-level BPE with trim_offsets gives the space before a word
      to no token: " Yes" is one token whose offsets hold "Yes") is skipped, so a span starts at the
      first character of it that a token holds and ends at the last. transformers stops masking at
      a span whose first character no token holds (every later turn untrained: a completion " Yes"
      trained only its EOS) and runs one whose last character no token holds to the end;
    - a span ends with the *last* token holding its last character: a character of several bytes
      is several tokens (日 is 3 in a byte-level BPE), and transformers' char_to_token gives the
      first, leaving a completion that ends in "日本語" two tokens short of what TRL trains.
    A span no token holds trains nothing."""
    n = len(offsets)
    mask = np.zeros(n, dtype=bool)
    if n == 0 or not spans:
        return mask
    starts, ends = offsets[:, 0].astype(np.int64), offsets[:, 1].astype(np.int64)
    width = np.maximum(ends - starts, 0)
    chars = np.repeat(starts, width) + (
        np.arange(int(width.sum())) - np.repeat(np.cumsum(width) - width, width)
    )
    token = np.repeat(np.arange(n), width)
    at = np.clip(chars, 0, text_len)
    first = np.full(text_len + 1, n, dtype=np.int64)  # the first token holding each character
    np.minimum.at(first, at, token)
    last = np.full(text_len + 1, -1, dtype=np.int64)  # and the last (a character of several bytes)
    np.maximum.at(last, at, token)
    held = np.flatnonzero(first[:text_len] < n)  # characters some token holds, ascending
    for s, e in spans:
        lo, hi = np.searchsorted(held, [max(s, 0), min(e, text_len)])
        if lo < hi:  # held[lo]: the span's first held character, held[hi - 1] its last
            mask[first[held[lo]] : last[held[hi - 1]] + 1] = True
    return mask


# Conversations the self-check renders before any work (raypack.pipeline.job): what templates
# handle differently (a system prompt, several turns, a tool call and its result, an empty assistant
# turn, multi-byte text). A probe the template refuses (raise_exception: "no system role") is skipped.
PROBES: tuple[tuple[dict[str, Any], ...], ...] = (
    (
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3? Answer in 日本語 🙂"},
        {"role": "assistant", "content": "六 (6)"},
    ),
    (
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}
            ],
        },
        {"role": "tool", "content": '{"temp_c": 18}'},
        {"role": "assistant", "content": "18 °C."},
    ),
    (
        {"role": "user", "content": "Say nothing."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "  spaces\r\n\tand tabs  "},
        {"role": "assistant", "content": "ok"},
    ),
)


@dataclass(frozen=True, slots=True)
class Check:
    """What the self-check found: conversations rendered, and the first that failed (None: all did)."""

    rendered: int
    failure: str | None


def check_template(
    template: ChatTemplate, conversations: list[tuple[list[dict[str, Any]], Any]], loss: str
) -> Check:
    """Render each conversation as a job would (spans included): a template that is not prefix-stable
    on any of them fails; one that refuses a probe (its own raise_exception) does not."""
    rendered = 0
    for messages, tools in conversations:
        try:
            template.conversation(messages, tools, loss)
        except NotPrefixStable as e:
            return Check(rendered, str(e))
        except RenderError:
            continue
        rendered += 1
    return Check(rendered, None)


def chat_rows(chat: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's lines for chat data: its template and mask, trained tokens, what overflow cost."""
    per_pack = np.asarray(chat["trained_percent"], dtype=np.int64)
    packs = int(per_pack.sum())
    median = int(np.searchsorted(np.cumsum(per_pack), (packs + 1) / 2)) if packs else 0
    lost = chat["trained_tokens_lost"]
    return [
        ("chat template", f"{chat['template']}: {chat['mask']}"),
        (
            "trained tokens",
            f"{chat['trained_tokens_packed']:,} of {chat['trained_tokens']:,} (pack.loss {chat['loss']}; "
            f"{lost:,} = {chat['trained_share_lost']:.2%} lost to pack.overflow); a median pack trains "
            f"{median}% of its positions",
        ),
        (
            "conversations",
            f"{chat['conversations']:,}: {chat['truncated']:,} truncated, {chat['dropped']:,} dropped "
            f"({chat['tokens_lost']:,} tokens lost)",
        ),
    ]
