"""Configuration: frozen dataclasses, validated when built, so a bad value fails before any work.

Every section is `@dataclass(frozen=True, kw_only=True, slots=True)` with its checks in __post_init__;
`from_dict` builds one from plain data (a YAML mapping, `--set key=value` overrides), rejecting unknown
keys and wrong types with a message that names the key.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any, TypeVar

from raypack.errors import ConfigError
from raypack.packing import ALGORITHMS, OVERFLOW_POLICIES
from raypack.packing.bucket import DEFAULT_PADDING_THRESHOLD
from raypack.paths import contains, input_base

__all__ = [
    "ConfigError",
    "InputConfig",
    "JobConfig",
    "OutputConfig",
    "PackConfig",
    "Reading",
    "SourceConfig",
    "StorageConfig",
    "TokenizerConfig",
    "apply_overrides",
    "from_dict",
    "load_config",
    "parse_override",
]

INPUT_FORMATS = ("jsonl", "parquet", "text")
TOKENIZER_BACKENDS = ("auto", "tokenizers", "fastokens")  # raypack.pipeline.backends
OUTPUT_FORMATS = ("parquet", "megatron", "olmo", "mds", "trl", "bridge")  # raypack.formats.FORMATS
LOSS_POLICIES = ("assistant", "completion", "all")  # pack.loss (raypack.chat)
# Formats that keep a per-token loss mask: the others refuse conversations (their trainers would train
# every token).
MASKED_FORMATS = ("parquet", "trl", "bridge")
PACK_MODES = ("global", "sharded")
# PackConfig field → the keyword option of the packers that take it.
ALGORITHM_OPTION_FIELDS = {
    "max_depth": "max_depth",
    "bucket_lengths": "bucket_lengths",
    "padding_threshold": "padding_threshold",
    "nnls_bin_width": "bin_width",
}
SHARDED_ALGORITHMS = ("bfd", "ffd", "greedy")
# Token positions in one output file (shard_rows × seq_len): input_ids is an Arrow list<int32> whose
# offsets are int32, so a file cannot hold 2^31 of them. Checked here, not found after tokenization.
# A write task holds ~20 bytes a position (the file's items, the packed rows, a scatter index):
# ~1.6 GB at the default 10,000 × 8192.
MAX_FILE_POSITIONS = 2**31 - 1
BYTES_PER_FILE_POSITION = 20

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class PackConfig:
    seq_len: int = 2048
    """Tokens per pack (the largest bucket for `bucket`)."""
    algorithm: str = "bfd"
    """One of raypack.packing.ALGORITHMS."""
    overflow: str = "split"
    """Documents longer than seq_len: split (chunks + remainder), truncate, or drop."""
    seed: int = 0
    """Seed for the order of packs in the output."""
    shuffle: bool = True
    """Permute pack ids with `seed` (packers that sort by length would otherwise emit a length-sorted
    dataset, which biases training); false keeps plan order."""
    max_depth: int | None = None
    """Most items (documents, or chunks of one) per pack, for attention kernels with a fixed
    segment budget (google/grain #1000; MaxText passes 32). Every packer honours it but concat,
    which cuts one stream every seq_len and refuses it; None: unlimited (nnlshp's strategies then
    hold 3, the paper's setting, and never more than min(max_depth, 3))."""
    bucket_lengths: tuple[int, ...] | None = None
    """Bucket lengths for `bucket`, largest = seq_len (None: seq_len/8, /4, /2, seq_len)."""
    padding_threshold: float = DEFAULT_PADDING_THRESHOLD
    """`bucket`: largest padding share a smaller bucket may have before a larger one is tried."""
    nnls_bin_width: int | None = None
    """`nnlshp`: tokens per length class (None: seq_len / 256, rounded up)."""
    mode: str = "global"
    """global: one plan over the whole corpus (histogram packers). sharded: every group of
    `shards_per_group` input shards is packed on its own by one task (bfd, ffd, greedy): no shuffle of
    tokens, a little less efficiency."""
    shards_per_group: int = 1
    loss: str | None = None
    """Conversations and prompt/completion pairs (input.messages_field, input.prompt_field): which
    tokens are trained. assistant (messages; the default): the assistant turns' tokens; completion
    (pairs; the default): the completion's; all: every token. Plain text trains every token."""
    compare: tuple[str, ...] = ()
    """Histogram packers to plan as well, on the same histogram, for the comparison table of metrics.json
    and the report (plans only: the data holds `algorithm`'s packs); ["all"]: every histogram packer."""

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"pack.seq_len must be >= 1, got {self.seq_len}")
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"pack.algorithm {self.algorithm!r} is unknown; choose from {', '.join(ALGORITHMS)}"
            )
        if self.overflow not in OVERFLOW_POLICIES:
            raise ConfigError(
                f"pack.overflow must be one of {', '.join(OVERFLOW_POLICIES)}, got {self.overflow!r}"
            )
        if self.max_depth is not None and self.max_depth < 1:
            raise ConfigError(f"pack.max_depth must be >= 1 or null, got {self.max_depth}")
        if self.max_depth is not None and "max_depth" not in ALGORITHMS[self.algorithm].options:
            raise ConfigError(
                f"pack.max_depth: {self.algorithm} cannot cap documents per pack (it cuts one stream of "
                "every document every seq_len tokens); use bfd (or any other packer) with max_depth"
            )
        if self.bucket_lengths is not None:
            if not self.bucket_lengths or min(self.bucket_lengths) < 1:
                raise ConfigError(f"pack.bucket_lengths must be positive, got {list(self.bucket_lengths)}")
            if max(self.bucket_lengths) != self.seq_len:
                raise ConfigError(
                    f"pack.bucket_lengths: the largest bucket must equal seq_len={self.seq_len}, "
                    f"got {list(self.bucket_lengths)}"
                )
        if not 0.0 <= self.padding_threshold < 1.0:
            raise ConfigError(f"pack.padding_threshold must be in [0, 1), got {self.padding_threshold}")
        if self.loss is not None and self.loss not in LOSS_POLICIES:
            raise ConfigError(f"pack.loss must be one of {', '.join(LOSS_POLICIES)}, got {self.loss!r}")
        if self.mode not in PACK_MODES:
            raise ConfigError(f"pack.mode must be one of {', '.join(PACK_MODES)}, got {self.mode!r}")
        if self.shards_per_group < 1:
            raise ConfigError(f"pack.shards_per_group must be >= 1, got {self.shards_per_group}")
        if self.nnls_bin_width is not None and not 1 <= self.nnls_bin_width <= self.seq_len:
            raise ConfigError(f"pack.nnls_bin_width must be in 1..seq_len, got {self.nnls_bin_width}")
        self.compared()  # every listed packer known, planned from a histogram, and its settings valid

    def compared(self) -> tuple[PackConfig, ...]:
        """The config of each packer in `compare` other than `algorithm`, in ALGORITHMS order."""
        histogram = [name for name, a in ALGORITHMS.items() if a.is_histogram]
        if "all" in self.compare and len(self.compare) > 1:
            raise ConfigError(f"pack.compare: 'all' stands alone, got {list(self.compare)}")
        for name in self.compare:
            if name != "all" and name not in histogram:
                what = "needs every document in one process" if name in ALGORITHMS else "is unknown"
                raise ConfigError(
                    f"pack.compare: {name!r} {what}; a job compares histogram packers only "
                    f"({', '.join(histogram)}); `raypack plan --lengths OUTPUT` compares all "
                    f"{len(ALGORITHMS)} on a finished dataset's document lengths"
                )
        names = histogram if self.compare == ("all",) else [n for n in histogram if n in self.compare]
        configs = []
        for name in names:
            if name == self.algorithm:
                continue
            try:
                configs.append(dataclasses.replace(self, algorithm=name, compare=()))
            except ConfigError as e:
                raise ConfigError(f"pack.compare includes {name}: {e}") from None
        return tuple(configs)

    def algorithm_options(self) -> dict[str, Any]:
        """Keyword options for the chosen packer, from the fields that apply to it."""
        accepted = ALGORITHMS[self.algorithm].options
        return {
            option: getattr(self, name)
            for name, option in ALGORITHM_OPTION_FIELDS.items()
            if option in accepted and getattr(self, name) is not None
        }


SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceConfig:
    """One source of a mixture (input.sources): its files, how to read them, and its share of the
    output: at most one of weight, repeat, tokens (none: its tokens once). Selection is by whole
    document, seeded (raypack.mixture)."""

    name: str
    """Names the source in its documents' ids (<name>/<path>:<line>), the index, the metrics and
    the report: letters, digits, `_.-`, up to 64."""
    paths: tuple[str, ...]
    format: str | None = None
    """None: input.format (as text_field, id_field and root: a source inherits what it leaves out)."""
    text_field: str | None = None
    id_field: str | None = None
    """None: input.id_field; "" (an empty string): none, ids generated from path and line or row,
    whatever input.id_field says."""
    root: str | None = None
    weight: float | None = None
    """A share of the output's tokens. When every source has a weight they are relative (normalized);
    beside repeat/tokens sources, the shares of the whole, summing below 1."""
    repeat: float | None = None
    """Its tokens this many times, fractional allowed (2.5: every document twice, a seeded half of
    them a third time; 0.3: a seeded 30% of its tokens)."""
    tokens: int | None = None
    """An absolute budget of output tokens."""
    max_repeat: float | None = None
    """The most its tokens may be repeated to meet a weight or a budget (None: 1, no upsampling
    unless asked; for a repeat source, its repeat)."""

    def __post_init__(self) -> None:
        where = f"input.sources[{self.name}]"
        if not SOURCE_NAME.match(self.name):
            raise ConfigError(
                f"input.sources: source name {self.name!r} must be 1-64 letters, digits, '_', '.' or '-' "
                "(it goes into document ids and file names)"
            )
        if not self.paths:
            raise ConfigError(f"{where}.paths is empty: give at least one file or glob pattern")
        if self.format is not None and self.format not in INPUT_FORMATS:
            raise ConfigError(
                f"{where}.format must be one of {', '.join(INPUT_FORMATS)}, got {self.format!r}"
            )
        if self.text_field == "":
            raise ConfigError(f"{where}.text_field must not be empty")
        rules = [k for k in ("weight", "repeat", "tokens") if getattr(self, k) is not None]
        if len(rules) > 1:
            raise ConfigError(f"{where}: give one of weight, repeat, tokens, not {' and '.join(rules)}")
        for key in ("weight", "repeat"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ConfigError(f"{where}.{key} must be > 0, got {value}")
        if self.tokens is not None and self.tokens < 1:
            raise ConfigError(f"{where}.tokens must be >= 1, got {self.tokens}")
        if self.max_repeat is not None and not self.max_repeat >= 1:
            raise ConfigError(f"{where}.max_repeat must be >= 1 (1: no upsampling), got {self.max_repeat:g}")
        if self.repeat is not None and self.max_repeat is not None and self.repeat > self.max_repeat:
            raise ConfigError(f"{where}: repeat {self.repeat:g} is over its max_repeat {self.max_repeat:g}")

    @property
    def cap(self) -> float:
        """The most its tokens may be repeated."""
        if self.max_repeat is not None:
            return self.max_repeat
        return max(self.repeat, 1.0) if self.repeat is not None else 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Reading:
    """How one input file is read, its source's settings resolved (InputConfig.reading): what a
    work unit carries to the task that reads it, so no task looks a source up again."""

    format: str
    text_field: str
    id_field: str | None
    empty: str
    max_document_bytes: int
    messages_field: str | None = None
    prompt_field: str | None = None
    completion_field: str | None = None

    @property
    def chat(self) -> str | None:
        """ "messages" (conversations), "pairs" (prompt/completion) or None (plain text)."""
        if self.messages_field is not None:
            return "messages"
        return "pairs" if self.prompt_field is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class InputConfig:
    paths: tuple[str, ...] = ()
    """Glob patterns of input shards, local or s3://...; compression (.gz, .zst) from the suffix.
    Or input.sources, not both."""
    sources: tuple[SourceConfig, ...] = ()
    """A mixture: named sources, each with its own paths (and format, fields) and share of the
    output (raypack.mixture). Packing is global across them."""
    tokens: int | None = None
    """With sources that all have a weight: the output's tokens (None: the most the sources give at
    their weights without any going over its max_repeat)."""
    format: str = "jsonl"
    """jsonl (one JSON object a line), parquet, or text (each file is one document)."""
    text_field: str = "text"
    """The field (jsonl) or column (parquet) holding the document text."""
    id_field: str | None = None
    """Field holding the document id; None: `<path relative to root>:<line>` (jsonl, 1-based) or
    `<path>:<row>` (parquet, 0-based)."""
    root: str | None = None
    """Directory the ids' paths are relative to; None: the fixed part of the first pattern."""
    empty: str = "reject"
    """Empty and whitespace-only documents: reject (recorded in rejects/) or keep (packed as the
    tokens they give, e.g. just EOS)."""
    messages_field: str | None = None
    """Chat data: the field (jsonl) or column (parquet) holding each conversation, a list of
    {role, content, ...} messages, rendered with the chat template (tokenizer.chat_template) and
    trained as pack.loss says (raypack.chat). Replaces text_field."""
    prompt_field: str | None = None
    """Instruction pairs: the prompt's field, with completion_field; the document is prompt +
    completion (plain strings), trained on the completion (pack.loss)."""
    completion_field: str | None = None
    max_document_bytes: int = 256 << 20
    """A record (jsonl line, text file, Parquet cell) larger than this is rejected unread. Below it,
    a long document is tokenized piece by piece and split into packs: 256 MiB is ~60M tokens."""
    max_reject_ratio: float = 0.01
    """The job fails, with nothing written but rejects/, when rejected records / (documents +
    rejected records) is over this: a corpus that is mostly bad usually means a wrong input.format
    or text_field. A lost file counts as all its records (its rows, from a Parquet footer)."""
    max_lost_files: int = 0
    """Input files that may be lost whole or in part (an unreadable Parquet file, a missing or
    mistyped text column, a truncated compressed stream) before the job fails. Default 0: any lost
    file fails the job, whatever the reject ratio: 400 files of 1,000 with a renamed text column
    must not pass as 0.0007% of records. Raise it only knowingly; rejects/ names each file."""
    unit_bytes: int = 256 << 20
    """A file larger than this is tokenized in work units of about this many bytes, each a task of
    its own, so one large file spreads over every actor and node: a Parquet file as runs of whole
    row groups (a row group larger than this is a unit alone), an uncompressed JSONL file as byte
    ranges cut at line starts. Compressed streams and text files (one document each) stay whole.
    Ids, rejects and the output are the same as for the whole file; each unit has its own token
    file, index and rejects file."""

    def __post_init__(self) -> None:
        if self.unit_bytes < 1:
            raise ConfigError(f"input.unit_bytes must be >= 1, got {self.unit_bytes}")
        if self.empty not in ("reject", "keep"):
            raise ConfigError(f"input.empty must be reject or keep, got {self.empty!r}")
        if self.max_document_bytes < 1:
            raise ConfigError(f"input.max_document_bytes must be >= 1, got {self.max_document_bytes}")
        if self.max_lost_files < 0:
            raise ConfigError(f"input.max_lost_files must be >= 0, got {self.max_lost_files}")
        if not 0.0 <= self.max_reject_ratio <= 1.0:
            raise ConfigError(f"input.max_reject_ratio must be within [0, 1], got {self.max_reject_ratio}")
        if self.paths and self.sources:
            raise ConfigError("give input.paths or input.sources, not both (one source: paths alone)")
        if not self.paths and not self.sources:
            raise ConfigError(
                "input.paths is empty: give at least one file or glob pattern (or input.sources)"
            )
        names = [s.name for s in self.sources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"input.sources: the name {twice[0]!r} is given twice")
        weights = [s.weight for s in self.sources if s.weight is not None]
        if weights and len(weights) < len(self.sources) and sum(weights) >= 1:
            sized = ", ".join(s.name for s in self.sources if s.weight is None)
            raise ConfigError(
                f"input.sources: beside sources sized by repeat or tokens ({sized}), weights are shares "
                f"of the whole and must sum below 1; they sum to {sum(weights):g}"
            )
        if self.tokens is not None:
            fixed = [s.name for s in self.sources if s.weight is None]
            if not self.sources:
                raise ConfigError("input.tokens sizes a mixture: it needs input.sources")
            if fixed:
                raise ConfigError(
                    "input.tokens sets the output's size for sources that all have a weight; "
                    f"{', '.join(fixed)} have none (a repeat or a budget already sizes the output)"
                )
            if self.tokens < 1:
                raise ConfigError(f"input.tokens must be >= 1, got {self.tokens}")
        if self.format not in INPUT_FORMATS:
            raise ConfigError(f"input.format must be one of {', '.join(INPUT_FORMATS)}, got {self.format!r}")
        if not self.text_field:
            raise ConfigError("input.text_field must not be empty")
        if self.messages_field is not None and (self.prompt_field or self.completion_field):
            raise ConfigError("give input.messages_field or input.prompt_field/completion_field, not both")
        if (self.prompt_field is None) != (self.completion_field is None):
            raise ConfigError("input.prompt_field and input.completion_field go together: give both")
        if self.chat and self.format == "text":
            raise ConfigError("input.format text holds plain documents; conversations need jsonl or parquet")
        if self.chat and self.sources:
            raise ConfigError("input.sources mixes plain-text corpora; conversations take input.paths")

    @property
    def chat(self) -> str | None:
        """ "messages" (conversations), "pairs" (prompt/completion) or None (plain text)."""
        if self.messages_field is not None:
            return "messages"
        return "pairs" if self.prompt_field is not None else None

    def of(self, source: str) -> InputConfig:
        """The plain input config (paths, format, fields, root) of one source, with every shared
        setting; of("") is this config, for a job without sources. The one place a source's
        inheritance is worked out: the job resolves each file's Reading from it once, on the driver."""
        if not source:
            return self
        s = next((s for s in self.sources if s.name == source), None)
        if s is None:
            raise KeyError(f"no input source {source!r}")
        return dataclasses.replace(
            self,
            paths=s.paths,
            sources=(),
            tokens=None,
            format=s.format or self.format,
            text_field=s.text_field or self.text_field,
            id_field=(s.id_field or None) if s.id_field is not None else self.id_field,
            root=s.root if s.root is not None else self.root,
        )

    def reading(self, source: str = "") -> Reading:
        """How the files of `source` ("" without sources) are read: its own format and fields."""
        one = self.of(source)
        return Reading(
            format=one.format,
            text_field=one.text_field,
            id_field=one.id_field,
            empty=one.empty,
            max_document_bytes=one.max_document_bytes,
            messages_field=one.messages_field,
            prompt_field=one.prompt_field,
            completion_field=one.completion_field,
        )

    @property
    def all_paths(self) -> tuple[str, ...]:
        """Every input pattern, of every source."""
        return self.paths + tuple(p for s in self.sources for p in s.paths)

    @property
    def mixture(self) -> bool:
        """Sources are given: their documents are selected (raypack.mixture; a source without a
        weight, repeat or budget is taken once, whole) and counted source by source."""
        return bool(self.sources)

    @property
    def id_fields(self) -> bool:
        """Any source's documents carry ids of their own (id_field): the duplicate-id check runs."""
        return any(c.id_field for c in [self.of(s.name) for s in self.sources] or [self])


@dataclass(frozen=True, kw_only=True, slots=True)
class TokenizerConfig:
    path: str
    """A Hugging Face `tokenizers` JSON file, or a model directory holding tokenizer.json (and
    tokenizer_config.json / special_tokens_map.json), local or s3://..."""
    add_bos: bool = False
    add_eos: bool = True
    bos_id: int | None = None
    """BOS token id; None: the model directory's bos_token, else the post-processor template's, else a
    token named <s>, <|begin_of_text|>, ... (raypack.pipeline.tokenizer)."""
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
    backend: str = "auto"
    """What encodes: tokenizers (the reference), fastokens (exact and ×7-66 faster where it loads the
    tokenizer; a ConfigError where it cannot be used), or auto: fastokens when it loads the tokenizer
    and gives the same ids as tokenizers on probes and a corpus sample, else tokenizers (the summary
    says why). Each tokenize task also re-checks a sample with tokenizers and fails over on any
    difference (raypack.pipeline.backends)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("tokenizer.path must not be empty")
        if self.backend not in TOKENIZER_BACKENDS:
            raise ConfigError(
                f"tokenizer.backend must be one of {', '.join(TOKENIZER_BACKENDS)}, got {self.backend!r}"
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


@dataclass(frozen=True, kw_only=True, slots=True)
class OutputConfig:
    path: str
    """Output directory, local or s3://...; complete only once manifest.json exists."""
    format: str = "parquet"
    """How packs are stored (raypack.formats): parquet (raypack's own, a row a pack), megatron
    (.bin/.idx pairs for Megatron-LM), olmo (token files for OLMo-core), mds (MosaicML streaming).
    Checked against the tokenizer and pack settings before any work."""
    shard_rows: int = 10000
    """Packs per output file."""
    pad_id: int | None = None
    """Token id written into padding positions (never attended: doc_offsets ends before them). None:
    the tokenizer's pad token (tokenizer_config.json pad_token, or a token named <|pad|>, <pad>,
    [PAD]), else its EOS (LoadedTokenizer.pad); the manifest records which. megatron writes EOS
    there whatever this says, which its --eod-mask-loss masks."""
    keep_versions: int = 3
    """`raypack rebuild`: complete versions (v=NNNNNN/) kept under output.path, the newest included."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ConfigError("output.path must not be empty")
        if self.format not in OUTPUT_FORMATS:
            choices = ", ".join(OUTPUT_FORMATS)
            raise ConfigError(f"output.format must be one of {choices}, got {self.format!r}")
        if self.shard_rows < 1:
            raise ConfigError(f"output.shard_rows must be >= 1, got {self.shard_rows}")
        if (
            self.pad_id is not None and not 0 <= self.pad_id < 2**31
        ):  # int32 ids; checked against the vocabulary
            raise ConfigError(f"output.pad_id must be in 0..2^31-1, got {self.pad_id}")
        if self.keep_versions < 1:
            raise ConfigError(f"output.keep_versions must be >= 1, got {self.keep_versions}")


@dataclass(frozen=True, kw_only=True, slots=True)
class StorageConfig:
    """Where object storage is and how hard to try. Credentials are not here on purpose: they come from
    the standard places (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, ~/.aws, instance roles) and are never
    printed, logged or written to the manifest."""

    endpoint: str | None = None
    """S3-compatible endpoint URL (http://host:9000 for MinIO/SeaweedFS); None: AWS_ENDPOINT_URL, else AWS."""
    region: str | None = None
    """None: AWS_REGION / AWS_DEFAULT_REGION, else the bucket's own region (looked up once)."""
    max_attempts: int = 6
    """Attempts per S3 request, with exponential backoff between them (AWS standard retry strategy)."""
    connect_timeout: float = 5.0
    """Seconds to open a connection: an unreachable endpoint fails in seconds, not minutes."""

    def __post_init__(self) -> None:
        if self.endpoint is not None and "://" not in self.endpoint:
            raise ConfigError(f"storage.endpoint must be a URL like http://host:port, got {self.endpoint!r}")
        if self.endpoint is not None and "@" in self.endpoint.split("://", 1)[1]:
            raise ConfigError(
                "storage.endpoint must not hold credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            )
        if self.max_attempts < 1:
            raise ConfigError(f"storage.max_attempts must be >= 1, got {self.max_attempts}")
        if self.connect_timeout <= 0:
            raise ConfigError(f"storage.connect_timeout must be > 0, got {self.connect_timeout}")

    def from_environment(self) -> StorageConfig:
        """These settings with the endpoint and region the driver's environment names filled in, so
        that workers (whose environment is the cluster's, not the submitter's) use the same ones.
        Neither is a secret; credentials stay in the environment."""
        import os

        env = os.environ
        return dataclasses.replace(
            self,
            endpoint=self.endpoint or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL"),
            region=self.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION"),
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class JobConfig:
    input: InputConfig
    tokenizer: TokenizerConfig
    output: OutputConfig
    pack: PackConfig = PackConfig()
    storage: StorageConfig = StorageConfig()

    def __post_init__(self) -> None:
        if self.pack.mode == "sharded" and self.pack.algorithm not in SHARDED_ALGORITHMS:
            raise ConfigError(
                f"pack.mode sharded packs each shard group alone with one of "
                f"{', '.join(SHARDED_ALGORITHMS)}, not {self.pack.algorithm!r}"
            )
        if self.pack.mode == "global" and not ALGORITHMS[self.pack.algorithm].is_histogram:
            histogram = ", ".join(name for name, a in ALGORITHMS.items() if a.is_histogram)
            raise ConfigError(
                f"pack.algorithm {self.pack.algorithm!r} needs every document in one process; the "
                f"distributed job packs from the length histogram: use one of {histogram}, or "
                "pack.mode: sharded"
            )
        if self.pack.seq_len < 2:
            raise ConfigError(f"pack.seq_len must be >= 2 for a training sequence, got {self.pack.seq_len}")
        for pattern in self.input.all_paths:
            # The output's data, index and a rebuild's _cache would be read back as inputs next time.
            if contains(input_base(pattern), self.output.path):
                raise ConfigError(
                    f"output.path {self.output.path} lies inside {input_base(pattern)}, where input "
                    f"{pattern} looks for files: a later run would read the output as input; write it "
                    "elsewhere"
                )
        positions = self.output.shard_rows * self.pack.seq_len
        if positions > MAX_FILE_POSITIONS:
            most = MAX_FILE_POSITIONS // self.pack.seq_len
            raise ConfigError(
                f"output.shard_rows × pack.seq_len = {positions:,} token positions a file, over the "
                f"{MAX_FILE_POSITIONS:,} one Parquet list column holds (and ~"
                f"{BYTES_PER_FILE_POSITION * positions / 2**30:.0f} GiB for its write task): "
                f"set output.shard_rows <= {most:,}"
            )

        self._check_chat()

    def _check_chat(self) -> None:
        chat, loss = self.input.chat, self.pack.loss
        if chat is None:
            if loss not in (None, "all"):
                raise ConfigError(
                    f"pack.loss {loss} needs conversations or pairs (input.messages_field, or "
                    "input.prompt_field and completion_field); plain text trains every token"
                )
            return
        if chat == "messages" and loss == "completion":
            raise ConfigError(
                "pack.loss completion is for prompt/completion pairs; conversations take assistant or all"
            )
        if chat == "pairs" and loss == "assistant":
            raise ConfigError(
                "pack.loss assistant is for conversations; prompt/completion pairs take completion or all"
            )
        if self.pack.overflow == "split":
            raise ConfigError(
                "pack.overflow split would cut a conversation across packs (its turns then train without "
                "their context): set pack.overflow: truncate (the end is cut, counted) or drop"
            )
        if self.output.format not in MASKED_FORMATS:
            raise ConfigError(
                f"output.format {self.output.format} keeps no loss mask, so its trainer would train every "
                f"token of a conversation; use one of {', '.join(MASKED_FORMATS)}"
            )

    @property
    def framed(self) -> bool:
        """tokenizer.add_bos / add_eos frame each document: plain text and prompt/completion pairs. A
        conversation is framed by its chat template alone."""
        return self.input.chat != "messages"

    @property
    def loss(self) -> str:
        """pack.loss with its default: assistant (messages), completion (pairs), all (plain text)."""
        if self.pack.loss is not None:
            return self.pack.loss
        return {"messages": "assistant", "pairs": "completion"}.get(self.input.chat or "", "all")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_config(path: str, overrides: list[str] | None = None) -> JobConfig:
    """Read a YAML job config, apply `key.path=value` overrides, validate; ConfigError if anything is off."""
    import yaml

    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read config {path}: {e}".replace("\n", " ")) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {path}: the top level must be a mapping of sections")
    return from_dict(JobConfig, apply_overrides(data, overrides or []))


def from_dict(cls: type[T], data: dict[str, Any] | None, where: str = "") -> T:
    """Build dataclass `cls` from a mapping: unknown keys and wrong types are ConfigErrors."""
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown key {where}{unknown[0]}; valid keys: {', '.join(fields)}")
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in data:
            raise ConfigError(f"missing required key {where}{name}")
    hints = typing.get_type_hints(cls)
    kwargs = {name: _coerce(value, hints[name], f"{where}{name}") for name, value in data.items()}
    return cls(**kwargs)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check `value` against a simple type hint (int, float, bool, str, tuple[int, ...], X | None,
    nested dataclass); ints are accepted for floats, lists for tuples."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key}: bad value {value!r}")
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {type(value).__name__}")
        return from_dict(hint, value, f"{key}.")
    if origin is tuple:
        (elem, *_rest) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return tuple(_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is list:
        (elem,) = typing.get_args(hint)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return [_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value)]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, (date, datetime)):  # YAML reads 2024-07-26 as a date
            return value.isoformat()
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    raise TypeError(f"config field {key} has an unsupported type {hint!r}")  # a bug in raypack


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b=value` → (["a", "b"], value), the value read as YAML (so 3, 0.5, true, [1, 2], null work)."""
    import yaml

    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of nested mapping `data` with each `key.path=value` override set."""
    out = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
            node = child
        node[path[-1]] = value
    return out


def _deepcopy(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy(v) if isinstance(v, dict) else v for k, v in d.items()}
