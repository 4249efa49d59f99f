"""Conversations and prompt/completion pairs → the text a tokenizer encodes, and which of its tokens
are trained (pure: no Ray; the tokenize tasks call it).

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
  all-zero mask. Prefix renders cost O(turns²) a conversation (two renders of up to the whole per
  assistant turn); with ONE_RENDER_TURNS or more assistant turns (tokenizer.chat_spans auto) the
  turns come from one render instead (one_render_spans): where each message's output begins, seen
  by which message the template reads as it writes, taken only when the first and last assistant
  turns, derived by prefix renders, agree with it and every turn between has their form (the
  template's text around the content, the same); else that conversation takes prefix renders;
- completion (pairs): the completion's characters (and EOS when tokenizer.add_eos);
- all: every token.
A conversation with no trained token is a reject, like an empty document: it would add tokens to a
pack and nothing to the loss (transformers #34172, trl #4201: there an all-zero mask passes silently).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from raypack.config import JobConfig
from raypack.errors import ConfigError

__all__ = [
    "CHAT_FILE",
    "ONE_RENDER_TURNS",
    "PROBES",
    "RENDER_VERSION",
    "Chat",
    "ChatTemplate",
    "NotPrefixStable",
    "RenderError",
    "chat_rows",
    "check_chat",
    "check_template",
    "one_render_spans",
    "pair_spans",
    "render_texts",
    "special_tokens",
    "template_variables",
    "token_mask",
    "token_masks",
]

CHAT_FILE = "chat_template.jinja"
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
# The special tokens a template sees by name (transformers passes its special_tokens_map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# Names a message's reasoning goes by: templates read reasoning_content (gpt-oss: thinking).
_REASONING = ("reasoning_content", "thinking", "reasoning")
# The rendering and masking code's version, in every chat token file's cache key: a change to what
# the same conversation renders to or which of its tokens are trained must never reuse token files
# the old code wrote (`git log -G'RENDER_VERSION ='` says what each bump covered).
RENDER_VERSION = 3
# From this many assistant turns a conversation's spans come from one render (tokenizer.chat_spans
# auto): with its checks (the first turn's two prefix renders, the last's one: the whole text is
# its other) 4 renders, what prefix renders of two turns cost; of ten turns, 20 (O(turns²)).
ONE_RENDER_TURNS = 3
# Templates that print the date (Llama 3.1-3.3: strftime_now("%d %b %Y")): the job fixes it.
_PRINTS_DATE = re.compile(r"\bstrftime_now\b")


@dataclass(frozen=True, slots=True)
class Chat:
    """One record of chat data: a conversation (messages, and the tools it may call) or a
    prompt/completion pair."""

    messages: tuple[dict[str, Any], ...] = ()
    tools: Any = None
    prompt: str = ""
    completion: str = ""

    def __len__(self) -> int:  # characters, for batch sizing
        if self.messages:
            return sum(len(str(m.get("content") or "")) for m in self.messages)
        return len(self.prompt) + len(self.completion)

    def __str__(self) -> str:
        """The record as JSON: a reject's raw text (not the dataclass's repr, Chat(messages=...),
        for a conversation rejected when rendered)."""
        if self.messages:
            record = {"messages": list(self.messages), **({"tools": self.tools} if self.tools else {})}
        else:
            record = {"prompt": self.prompt, "completion": self.completion}
        return json.dumps(record, ensure_ascii=False, default=str)


class RenderError(ValueError):
    """A conversation the template refuses or cannot render (its raise_exception, a type error in
    the data): a recorded reject with the template's message."""


class NotPrefixStable(RenderError):
    """The template renders a prefix of the conversation as something other than a prefix of the
    whole: the assistant turns cannot be found without markers."""


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
    `resolved`). Without this a Llama-3-style `{{ bos_token }}` would render as nothing."""
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
        self,
        source: str,
        origin: str,
        variables: dict[str, str],
        now: datetime | None = None,
        spans: str = "auto",
    ) -> None:
        import jinja2
        import jinja2.meta

        self.source, self.origin, self.variables = source, origin, dict(variables)
        self.spans = spans
        """tokenizer.chat_spans: auto (one render for many turns, checked) or prefixes."""
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
        """What decides its renders, for the token cache key: the text, the variables, the date, how
        unmarked turns are found."""
        return {
            "template_sha256": hashlib.sha256(self.source.encode()).hexdigest(),
            "variables": dict(sorted(self.variables.items())),
            "date": self.now.isoformat() if self.now is not None else None,
            "spans": self.spans,
        }

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: Any = None,
        add_generation_prompt: bool = False,
        track: bool = False,
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered text and, with `track`, the character spans of its `{% generation %}` blocks."""
        text, spans, _ = self._render(messages, tools, add_generation_prompt, track, watch=False)
        return text, spans

    def _render(
        self,
        messages: list[dict[str, Any]],
        tools: Any,
        add_generation_prompt: bool,
        track: bool,
        watch: bool,
    ) -> tuple[str, list[tuple[int, int]], list[tuple[int, int]]]:
        """render(), and with `watch` the template's reads of the messages: (message index, output
        length then), in the order it made them."""
        import jinja2

        normalized = _normalize(messages)
        args = {**self.variables, "messages": normalized, "tools": tools, "documents": None}
        blocks: list[str] = []
        spans: list[tuple[int, int]] = []
        reads: list[tuple[int, int]] = []
        env = self._env
        env.rendered_blocks, env.generation_spans = (blocks, spans) if track else (None, None)
        emitted = [0]
        if watch:
            _watch(env, {id(m): i for i, m in enumerate(normalized)}, reads, emitted)
        try:
            for block in self._template.generate(add_generation_prompt=add_generation_prompt, **args):
                blocks.append(block)
                if watch:
                    emitted[0] += len(block)
        except jinja2.exceptions.TemplateError as e:
            raise RenderError(f"chat template {self.origin}: {e.message or type(e).__name__}") from None
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            raise RenderError(f"chat template {self.origin} failed on this conversation: {e}") from None
        finally:
            env.rendered_blocks = env.generation_spans = None
            if watch:
                del env.getitem, env.getattr  # the class's again: no cost to renders not watched
        return "".join(blocks), spans, reads

    def conversation(
        self, messages: list[dict[str, Any]], tools: Any, loss: str, spans: str | None = None
    ) -> tuple[str, list[tuple[int, int]]]:
        """The conversation's text and its trained character spans (module docstring); `spans`:
        tokenizer.chat_spans for this call (self.spans when None)."""
        if loss == "all":
            text, _ = self.render(messages, tools)
            return text, [(0, len(text))]
        if self.markers:
            return self.render(messages, tools, track=True)
        turns = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        one = (spans or self.spans) == "auto" and len(turns) >= ONE_RENDER_TURNS
        text, _, reads = self._render(messages, tools, False, False, watch=one)
        if one:
            first = self._turn(messages, tools, text, turns[0])
            try:
                last = self._turn(messages, tools, text, turns[-1])
            except NotPrefixStable:  # refused below, naming the first turn that is, as prefixes do
                last = None
            found = last and one_render_spans(text, reads, messages, turns, first, last)
            if found:
                return text, found
        return text, [self._turn(messages, tools, text, i) for i in turns]

    def _turn(self, messages: list[dict[str, Any]], tools: Any, text: str, i: int) -> tuple[int, int]:
        """Assistant turn i's span in `text` (the whole conversation's render), by prefix renders."""
        before, _ = self.render(messages[:i], tools, add_generation_prompt=True)
        # The last message's: the whole text (a template renders the same messages the same way).
        through = text if i + 1 == len(messages) else self.render(messages[: i + 1], tools)[0]
        if not through.startswith(before) or not text.startswith(through):
            raise NotPrefixStable(
                f"chat template {self.origin} is not prefix-stable: the conversation up to assistant "
                f"turn {i} renders as something other than the start of the whole conversation (it "
                "rewrites earlier turns), so the assistant tokens cannot be found; give a template with "
                "{% generation %} markers (tokenizer.chat_template) or pack.loss: all"
            )
        return len(before), len(through)


def _watch(env: Any, watched: dict[int, int], reads: list[tuple[int, int]], emitted: list[int]) -> None:
    """Make `env` record, until its instance attributes are deleted, each read of a watched message
    (id → index) with the output's length then (emitted[0], which the render loop keeps): the
    compiled template reads every item and attribute through environment.getitem / getattr."""
    getitem, getattr_ = env.getitem, env.getattr

    def watched_getitem(obj: Any, argument: Any) -> Any:
        if (i := watched.get(id(obj))) is not None:
            reads.append((i, emitted[0]))
        return getitem(obj, argument)

    def watched_getattr(obj: Any, attribute: str) -> Any:
        if (i := watched.get(id(obj))) is not None:
            reads.append((i, emitted[0]))
        return getattr_(obj, attribute)

    env.getitem, env.getattr = watched_getitem, watched_getattr


def message_starts(reads: list[tuple[int, int]], n: int) -> list[int] | None:
    """Where each of n messages' output begins, from the template's reads of them while rendering
    (message index, output length then): walking back from the last read, the pass that wrote the
    messages in order (the template's loop over them) reads message j, then j - 1 before it; j's
    output begins at the earliest read of j in that pass. Looks back inside it (at messages[0], at
    the previous tool turn) are passed over, and so is what came before the pass (a template that
    first scans the messages, reversed, for the last query); a look ahead at the next message is
    taken for its start, which one_render_spans' checks catch. None when some message was not read
    in such a pass."""
    if n == 0:
        return None
    starts: list[int | None] = [None] * n
    at = n - 1
    for i, emitted in reversed(reads):
        if i == at:
            starts[at] = emitted
        elif i == at - 1:
            at -= 1
            starts[at] = emitted
        elif at == 0:
            break
    if at != 0 or any(x is None for x in starts):
        return None
    return [int(x) for x in starts if x is not None]


def _form(body: str, content: Any) -> tuple[str, str] | None:
    """(text before, text after) the content in an assistant turn's span `body`: the content as given
    or stripped (Llama 3 trims it), where it stands first in `body`; None when it is not a non-empty
    string found there."""
    if not isinstance(content, str):
        return None
    for c in (content, content.strip()):
        if c and (k := body.find(c)) >= 0:
            return body[:k], body[k + len(c) :]
    return None


def _has_form(body: str, content: Any, form: tuple[str, str]) -> bool:
    """Whether `body` is the form's text around the content (as given or stripped)."""
    head, tail = form
    if not isinstance(content, str) or len(body) < len(head) + len(tail):
        return False
    if not (body.startswith(head) and body.endswith(tail)):
        return False
    inner = body[len(head) : len(body) - len(tail)]
    return inner in (content, content.strip())


def _keys(message: dict[str, Any]) -> set[str]:
    """What a message gives (keys with a true value, as a template's `{% if %}` sees them): what a
    template may render differently. An empty reasoning_content beside a filled one is another shape
    (a template may show only the last turn's reasoning: "" and "<" both have the key, and render
    otherwise)."""
    return {k for k, v in message.items() if v}


def one_render_spans(
    text: str,
    reads: list[tuple[int, int]],
    messages: list[dict[str, Any]],
    turns: list[int],
    first: tuple[int, int],
    last: tuple[int, int],
) -> list[tuple[int, int]] | None:
    """Every assistant turn's span in `text`, the conversation rendered once with its reads
    (message_starts), given the first and last turns' spans from prefix renders; None where the one
    render cannot be trusted for this conversation (the caller renders prefixes instead).

    A turn i spans from where message i begins plus the generation prompt's length, to where
    message i + 1 begins (the end of the text after the last message). Taken only when the starts
    give the first and last turns exactly the spans their prefix renders give (the generation
    prompt's length measured on the first), and every turn between gives what the first or the
    last gives (the same keys: a template renders reasoning or tool calls otherwise, and may drop
    them from all but the last turn, which prefix renders would refuse) and is the template's text
    around its content in the form the first and last turns show (the same text before and after
    it). A start misplaced by a read the walk misjudged, a turn rendered otherwise, content that is
    not a string: the whole conversation goes to prefix renders."""
    starts = message_starts(reads, len(messages))
    if starts is None:
        return None
    bounds = [*starts, len(text)]
    if any(a > b for a, b in itertools.pairwise(bounds)):
        return None
    a, z = turns[0], turns[-1]
    prompt = first[0] - bounds[a]
    if prompt < 0 or first[1] != bounds[a + 1] or last != (bounds[z] + prompt, bounds[z + 1]):
        return None
    bodies = {a: text[first[0] : first[1]], z: text[last[0] : last[1]]}
    form = _form(bodies[a], messages[a].get("content")) or _form(bodies[z], messages[z].get("content"))
    if form is None or not all(_has_form(bodies[i], messages[i].get("content"), form) for i in (a, z)):
        return None
    shapes = (_keys(messages[a]), _keys(messages[z]))
    spans = [first]
    for i in turns[1:-1]:
        if _keys(messages[i]) not in shapes:
            return None
        span = (bounds[i] + prompt, bounds[i + 1])
        if not _has_form(text[span[0] : span[1]], messages[i].get("content"), form):
            return None
        spans.append(span)
    return [*spans, last]


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
    A span no token holds trains nothing.

    Offsets in order (every start and every end at least the one before: what a byte-level BPE, or
    any tokenizer over one text, gives) are searched per span, O(spans log tokens): the first held
    token (end > start) ending after the span's start holds its first held character, and the last
    starting before its end holds its last; otherwise (_mask_by_characters) each character's first
    and last token is found, O(characters). tests/test_chat_turns.py draws offsets both ways."""
    n = len(offsets)
    mask = np.zeros(n, dtype=bool)
    if n == 0 or not spans:
        return mask
    starts, ends = offsets[:, 0].astype(np.int64), offsets[:, 1].astype(np.int64)
    ordered = (
        starts[0] >= 0
        and ends[-1] <= text_len
        and bool(np.all(starts[1:] >= starts[:-1]))
        and bool(np.all(ends[1:] >= ends[:-1]))
    )
    if not ordered:
        return _mask_by_characters(starts, ends, spans, text_len)
    held = np.flatnonzero(ends > starts)
    held_starts, held_ends = starts[held], ends[held]
    for s, e in spans:
        s, e = max(s, 0), min(e, text_len)
        lo = int(np.searchsorted(held_ends, s, side="right"))
        hi = int(np.searchsorted(held_starts, e, side="left")) - 1
        if s < e and lo <= hi:
            mask[held[lo] : held[hi] + 1] = True
    return mask


def token_masks(
    offsets: np.ndarray, lengths: np.ndarray, spans: list[list[tuple[int, int]]], text_lens: list[int]
) -> np.ndarray:
    """token_mask of a batch of texts at once: `offsets` every text's tokens back to back, each in
    its own text, `lengths` their counts; the masks back to back. Each text's characters are placed
    after the ones before it, so one search over the batch finds every span's tokens (per text,
    numpy's calls cost ~25 µs a conversation). A text whose offsets are out of order is masked on
    its own (token_mask)."""
    n, texts = len(offsets), len(lengths)
    mask = np.zeros(n, dtype=bool)
    if n == 0:
        return mask
    lengths = np.asarray(lengths, dtype=np.int64)
    size = np.asarray(text_lens, dtype=np.int64)
    doc = np.repeat(np.arange(texts), lengths)
    first = np.cumsum(lengths) - lengths
    starts, ends = offsets[:, 0].astype(np.int64), offsets[:, 1].astype(np.int64)
    # token_mask's condition for its search, per text: starts and ends in order, within the text.
    disorder = np.zeros(texts, dtype=bool)
    back = (doc[1:] == doc[:-1]) & ((starts[1:] < starts[:-1]) | (ends[1:] < ends[:-1]))
    disorder[doc[1:][back]] = True
    some = lengths > 0
    last = first + lengths - 1
    disorder[some] |= (starts[first[some]] < 0) | (ends[last[some]] > size[some])
    base = np.cumsum(size) - size
    held = np.flatnonzero((ends > starts) & ~disorder[doc])
    held_starts, held_ends = starts[held] + base[doc[held]], ends[held] + base[doc[held]]
    count = np.fromiter(map(len, spans), dtype=np.int64, count=texts)
    if count.sum():
        span_doc = np.repeat(np.arange(texts), count)
        pairs = np.asarray([pair for own in spans for pair in own], dtype=np.int64).reshape(-1, 2)
        s, e = np.maximum(pairs[:, 0], 0), np.minimum(pairs[:, 1], size[span_doc])
        # As token_mask: the first held token ending after the span's start, the last starting
        # before its end. Neither can be another text's: a text's tokens lie within its characters.
        lo = np.searchsorted(held_ends, s + base[span_doc], side="right")
        hi = np.searchsorted(held_starts, e + base[span_doc], side="left") - 1
        use = (s < e) & (lo <= hi) & ~disorder[span_doc]
        edges = np.zeros(n + 1, dtype=np.int64)
        np.add.at(edges, held[lo[use]], 1)
        np.add.at(edges, held[hi[use]] + 1, -1)
        mask = np.cumsum(edges[:-1]) > 0
    for d in np.flatnonzero(disorder).tolist():
        a, b = int(first[d]), int(first[d] + lengths[d])
        mask[a:b] = token_mask(offsets[a:b], spans[d], int(size[d]))
    return mask


def _mask_by_characters(
    starts: np.ndarray, ends: np.ndarray, spans: list[tuple[int, int]], text_len: int
) -> np.ndarray:
    """token_mask for offsets in any order, character by character."""
    n = len(starts)
    mask = np.zeros(n, dtype=bool)
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
    """What the self-check found: conversations rendered, the first that failed (None: all did), and
    the first whose turns one render found otherwise than prefix renders (None: none did)."""

    rendered: int
    failure: str | None
    spans_differ: str | None = None


def check_template(
    template: ChatTemplate, conversations: list[tuple[list[dict[str, Any]], Any]], loss: str
) -> Check:
    """Render each conversation as a job would (spans included): a template that is not prefix-stable
    on any of them fails; one that refuses a probe (its own raise_exception) does not. With
    tokenizer.chat_spans auto, each conversation's spans are found both ways and compared."""
    rendered = 0
    differ: str | None = None
    for messages, tools in conversations:
        try:
            text, spans = template.conversation(messages, tools, loss)
            if differ is None and template.spans == "auto":
                _, exact = template.conversation(messages, tools, loss, spans="prefixes")
                if spans != exact:
                    turns = sum(m.get("role") == "assistant" for m in messages)
                    differ = (
                        f"a conversation of {turns} assistant turns ({text[:40]!r}): one render gave "
                        f"spans {spans}, prefix renders {exact}"
                    )
        except NotPrefixStable as e:
            return Check(rendered, str(e), differ)
        except RenderError:
            continue
        rendered += 1
    return Check(rendered, None, differ)


def check_chat(cfg: JobConfig, template: ChatTemplate | None, records: list[Chat]) -> dict[str, Any] | None:
    """Chat data: render the probes and `records` (a corpus sample) with the template as the job
    will (a ConfigError, before any work, for a template that is not prefix-stable on any of them);
    what the manifest and summary say of it. None for plain text."""
    if cfg.input.chat is None:
        return None
    info: dict[str, Any] = {"kind": cfg.input.chat, "loss": cfg.loss}
    if template is None:  # prompt/completion pairs: no template
        return info | {
            "template": "none (prompt + completion)",
            "mask": f"pack.loss {cfg.loss}",
            "date": None,
        }
    sample = [(list(p), None) for p in PROBES] + [(list(c.messages), c.tools) for c in records]
    found = check_template(template, sample, cfg.loss)
    if found.failure is not None:
        raise ConfigError(found.failure)
    spans: str | None = None
    if cfg.loss == "all":
        mask = "pack.loss all: every token"
    elif template.markers:
        mask = "assistant tokens from its {% generation %} markers"
    else:
        spans = "prefixes" if found.spans_differ else template.spans
        how = {
            "auto": f"one render for {ONE_RENDER_TURNS}+ assistant turns, checked, else growing prefixes",
            "prefixes": "rendering growing prefixes",
        }[spans]
        mask = f"assistant turns found by {how} (prefix-stable on the probes and sample)"
    date = cfg.tokenizer.chat_date if template.prints_date else None
    return info | {
        "template": template.origin,
        "mask": mask,
        "checked": found.rendered,
        "date": date,
        "spans": spans,
        "spans_differ": found.spans_differ,
    }


def render_texts(template: ChatTemplate | None, records: list[Chat]) -> list[str]:
    """The texts the job encodes for `records`: conversations rendered (those the template refuses
    left out), pairs joined."""
    texts = []
    for r in records:
        try:
            texts.append(
                template.render(list(r.messages), r.tools)[0] if template else r.prompt + r.completion
            )
        except RenderError:
            continue
    return texts


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
