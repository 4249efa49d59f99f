"""input: the corpus, its sources (a mixture), and how each file is read (Reading)."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from raypack.errors import ConfigError

__all__ = ["EMPTY_POLICIES", "INPUT_FORMATS", "InputConfig", "Reading", "SourceConfig"]

INPUT_FORMATS = ("jsonl", "parquet", "text")  # raypack.corpus.readers.READERS
EMPTY_POLICIES = ("reject", "keep")  # input.empty


SOURCE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True, kw_only=True, slots=True)
class SourceConfig:
    """One source of a mixture (input.sources): its files, how to read them, and its share of the
    output: at most one of weight, repeat, tokens (none: its tokens once). Selection is by whole
    document, seeded (raypack.mixture)."""

    name: str
    """Names the source in its documents' ids (<name>/<path>:<line>), the index, the metrics and
    the report: letters, digits, `_.-`, up to 64."""
    paths: tuple[str, ...] = ()
    """Its files; empty for a source given as a Ray Dataset (input.datasets)."""
    format: str | None = None
    """None: input.format (as text_field, id_field and root: a source inherits what it leaves out)."""
    text_field: str | None = None
    """None: input.text_field (or input.text_fields, where that is set)."""
    text_fields: tuple[str, ...] | None = None
    """None: input.text_fields (a source that gives text_field reads that one field)."""
    text_separator: str | None = None
    """None: input.text_separator."""
    metadata_fields: tuple[str, ...] | None = None
    """None: input.metadata_fields; [] (an empty list): none kept for this source."""
    id_field: str | None = None
    """None: input.id_field; "" (an empty string): none, ids generated from path and line or row,
    whatever input.id_field says."""
    root: str | None = None
    """None: input.root."""
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
        if self.format is not None and self.format not in INPUT_FORMATS:
            raise ConfigError(
                f"{where}.format must be one of {', '.join(INPUT_FORMATS)}, got {self.format!r}"
            )
        if self.text_field == "":
            raise ConfigError(f"{where}.text_field must not be empty")
        if self.text_field is not None and self.text_fields is not None:
            raise ConfigError(f"{where}: give text_field or text_fields, not both")
        _check_names(f"{where}.text_fields", self.text_fields, at_least=1)
        _check_names(f"{where}.metadata_fields", self.metadata_fields, at_least=0)
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


def _check_names(key: str, names: tuple[str, ...] | None, at_least: int) -> None:
    """A list of field names: at least `at_least`, none empty, none twice."""
    if names is None:
        return
    if len(names) < at_least:
        raise ConfigError(f"{key} must name at least {at_least} field")
    if any(not n for n in names):
        raise ConfigError(f"{key} must not hold an empty name")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"{key} names {twice[0]!r} twice")


@dataclass(frozen=True, kw_only=True, slots=True)
class Reading:
    """How one input file is read, its source's settings resolved (InputConfig.reading): what a
    work unit carries to the task that reads it, so no task looks a source up again."""

    format: str
    """An input format (INPUT_FORMATS), or "dataset": a Ray Dataset's rows (input.datasets)."""
    text_field: str
    id_field: str | None
    empty: str
    max_document_bytes: int
    messages_field: str | None = None
    prompt_field: str | None = None
    completion_field: str | None = None
    # Fields added since token files were first keyed: each enters a token file's key only when it
    # differs from its default here (token_files.token_settings, NEW_READING_DEFAULTS).
    text_fields: tuple[str, ...] = ()
    """Several fields joined into the text (input.text_fields); () reads text_field alone."""
    text_separator: str = "\n\n"
    metadata_fields: tuple[str, ...] = ()

    @property
    def chat(self) -> str | None:
        """ "messages" (conversations), "pairs" (prompt/completion) or None (plain text)."""
        if self.messages_field is not None:
            return "messages"
        return "pairs" if self.prompt_field is not None else None


@dataclass(frozen=True, kw_only=True, slots=True)
class InputConfig:
    """The corpus: its files, or its sources (a mixture), or a Ray Dataset, and how each file is read."""

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
    text_fields: tuple[str, ...] = ()
    """Several fields (jsonl) or columns (parquet, a Ray Dataset) joined into the text, in this
    order, with text_separator between them (as Megatron's preprocess takes several JSON keys);
    instead of text_field, not with it. A field that a record lacks, or holds null or "", is left
    out (no separator for it); a record none of whose fields is there (all missing or null) is
    rejected, and so is one where a field holds something other than a string. A Parquet file or
    Dataset without one of the columns reads it as missing in every row (without any of them, the
    file is lost). Not for conversations (messages_field, prompt_field)."""
    text_separator: str = "\n\n"
    """What goes between two of text_fields' values."""
    metadata_fields: tuple[str, ...] = ()
    """Fields (jsonl) or columns (parquet, a Ray Dataset) kept of each document in the output's
    index (index/, a `metadata` struct column: a field a column) and given back beside the packs
    by raypack.reader.document_metadata; the manifest's `metadata` lists them and their types.
    Values are strings, numbers, booleans or null: a field a record lacks is null; a list or an
    object rejects the record (a Parquet column of another type loses the file). A field's type
    is that of its values over the whole dataset: int where all are integers, float where some
    are floats, bool, string; null where none has a value; values of other kinds mixed (an int in
    one record, a string in another) are all kept as strings, the others as their JSON text
    ("1", "true", "0.5") (docs/output-format.md). A text file (format text) has no fields: a
    source of them that inherits the list keeps null."""
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
    trained as pack.loss says (raypack.text.chat). Replaces text_field."""
    prompt_field: str | None = None
    """Instruction pairs: the prompt's field, with completion_field; the document is prompt +
    completion (plain strings), trained on the completion (pack.loss)."""
    completion_field: str | None = None
    """Instruction pairs: the completion's field, with prompt_field."""
    datasets: tuple[str, ...] = ()
    """The sources given as Ray Datasets to raypack.pack(dataset=...), not as files: set by that
    call, not in a config file. ("",): the whole input is one Dataset (input.paths empty); else
    source names, each a source without paths. Their rows are read by Ray tasks from Ray's object
    store (raypack.corpus.datasets)."""
    unit_rows: int = 10_000
    """Rows of a Ray Dataset (input.datasets) a work unit reads: consecutive rows in the dataset's
    order, so the units (and the output) do not depend on its blocks. 10,000 documents of ~4 KB
    are ~40 MB of text, about a second of a core's tokenizing."""
    max_document_bytes: int = 256 << 20
    """A record larger than this many bytes is rejected: a JSONL line or a text file unread, a
    Parquet or Dataset text by its UTF-8 bytes, a conversation there as the JSON of its record
    (UTF-8, no escapes, Parquet's null struct fields included: a JSONL line of it may differ by a
    few bytes). Below it, a long document is tokenized piece by piece and split into packs: 256 MiB
    is ~60M tokens."""
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
    its own, so one large file spreads over every worker and node: a Parquet file as runs of whole
    row groups (a row group larger than this is a unit alone), an uncompressed JSONL file as byte
    ranges cut at line starts. Compressed streams and text files (one document each) stay whole.
    Ids, rejects and the output are the same as for the whole file; each unit has its own token
    file, index and rejects file. More than 100,000 such units is refused, naming a size that fits."""
    limit_bytes: int | None = None
    """A trial on a subset (`raypack pack --limit 200MB`): pack a sample of about this many bytes of
    the input, whole work units (cut to at most an eighth of it where a file splits) taken in an
    order seeded by pack.seed until their bytes reach it. The same inputs and seed give the same
    sample. The dataset is marked a sample (manifest, metrics, summary, report); None: everything."""
    group_bytes: int = 1 << 20
    """Whole files smaller than this are tokenized in runs of consecutive files (of one source) of
    up to this many bytes, a run a work unit, so that a unit's fixed cost (a task, a token file, an
    index file) is paid per MiB, not per file: 10,000 JSONL files of ~6 KB take ~12 s in runs,
    ~85 s as a unit each (docs/benchmarks.md). 0: a file a unit. Ids, rejects and the global
    mode's output are the same whatever the runs (a document keeps its file's path and row);
    pack.mode sharded groups units, so its packs follow the runs. A run holds at most
    input.unit_bytes and 1,024 files."""

    def __post_init__(self) -> None:
        self._check_limits()
        self._check_where_from()
        self._check_sources()
        self._check_fields()

    def _check_limits(self) -> None:
        """The sizes of work units and runs, the empty-document rule and the reject limits."""
        if self.unit_bytes < 1:
            raise ConfigError(f"input.unit_bytes must be >= 1, got {self.unit_bytes}")
        if self.group_bytes < 0:
            raise ConfigError(f"input.group_bytes must be >= 0, got {self.group_bytes}")
        if self.empty not in EMPTY_POLICIES:
            raise ConfigError(f"input.empty must be reject or keep, got {self.empty!r}")
        if self.max_document_bytes < 1:
            raise ConfigError(f"input.max_document_bytes must be >= 1, got {self.max_document_bytes}")
        if self.max_lost_files < 0:
            raise ConfigError(f"input.max_lost_files must be >= 0, got {self.max_lost_files}")
        if not 0.0 <= self.max_reject_ratio <= 1.0:
            raise ConfigError(f"input.max_reject_ratio must be within [0, 1], got {self.max_reject_ratio}")
        if self.unit_rows < 1:
            raise ConfigError(f"input.unit_rows must be >= 1, got {self.unit_rows}")
        if self.limit_bytes is not None and self.limit_bytes < 1:
            raise ConfigError(f"input.limit_bytes must be >= 1, got {self.limit_bytes}")

    def _check_where_from(self) -> None:
        """The input is given one way: paths, sources or a Ray Dataset."""
        if self.paths and self.sources:
            raise ConfigError("give input.paths or input.sources, not both (one source: paths alone)")
        whole = self.datasets == ("",)
        self._check_datasets(whole)
        if self.limit_bytes is not None and self.datasets:
            raise ConfigError(
                "input.limit_bytes samples input files; a Ray Dataset is sampled with its own "
                "methods (ds.random_sample, ds.limit) before raypack.pack(dataset=...)"
            )
        if not self.paths and not self.sources and not whole:
            raise ConfigError(
                "input.paths is empty: give at least one file or glob pattern (or input.sources)"
            )

    def _check_sources(self) -> None:
        """The mixture: each source named once, weights beside sized sources summing below 1, and
        input.tokens only for sources that all have a weight."""
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

    def _check_fields(self) -> None:
        """The format and the fields documents are read from: text, or conversations (messages) or
        pairs (prompt and completion), which need records and take no sources."""
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
        self._check_field_lists()

    def _check_field_lists(self) -> None:
        """text_fields and metadata_fields, the input's and each source's as it resolves them."""
        # text_field's default is "text": one named beside text_fields is the only mix to be seen.
        if self.text_fields and self.text_field != "text":
            raise ConfigError("give input.text_field or input.text_fields, not both")
        _check_names("input.text_fields", self.text_fields, at_least=0)
        _check_names("input.metadata_fields", self.metadata_fields, at_least=0)
        if self.chat and self.text_fields:
            raise ConfigError(
                "input.text_fields joins plain text; conversations (input.messages_field, "
                "prompt_field) take no text_fields"
            )
        # A text file is a document with no fields: a list given where every file is one is a
        # mistake; one a text source inherits reads nothing there (its documents' metadata: null).
        given = [("input", self.format, self.text_fields, self.metadata_fields)] if not self.sources else []
        given += [
            (f"input.sources[{s.name}]", self.of(s.name).format, s.text_fields or (), s.metadata_fields or ())
            for s in self.sources
        ]
        for where, fmt, text_fields, metadata_fields in given:
            if fmt == "text" and (text_fields or metadata_fields):
                key = "text_fields" if text_fields else "metadata_fields"
                raise ConfigError(f"{where}.{key}: format text reads a file a document, which has no fields")

    def _check_datasets(self, whole: bool) -> None:
        """input.datasets against the paths: a source is given as files or as a Dataset, not both
        and not neither."""
        if whole and self.paths:
            raise ConfigError(
                "raypack.pack(dataset=...) reads the Dataset instead of input.paths: leave input.paths out"
            )
        if whole and self.sources:
            raise ConfigError(
                "input.sources are given: pass their Datasets by name, raypack.pack(dataset={name: ds})"
            )
        if "" in self.datasets and not whole:
            raise ConfigError("input.datasets: '' (the whole input) goes alone")
        names = {s.name for s in self.sources}
        unknown = sorted(set(self.datasets) - names - {""})
        if unknown:
            raise ConfigError(
                f"a Dataset was given for {unknown[0]!r}, which is no source of input.sources "
                f"({', '.join(sorted(names)) or 'none'})"
            )
        for s in self.sources:
            if s.name in self.datasets and s.paths:
                raise ConfigError(
                    f"input.sources[{s.name}] has paths and a Dataset was given for it: give one"
                )
            if s.name not in self.datasets and not s.paths:
                raise ConfigError(
                    f"input.sources[{s.name}].paths is empty: give at least one file or glob pattern "
                    "(or its rows as a Ray Dataset: raypack.pack(dataset={name: ds}))"
                )

    @property
    def chat(self) -> str | None:
        """ "messages" (conversations), "pairs" (prompt/completion) or None (plain text)."""
        if self.messages_field is not None:
            return "messages"
        return "pairs" if self.prompt_field is not None else None

    def is_dataset(self, source: str = "") -> bool:
        """Whether `source`'s rows ("" without sources: the input's) come from a Ray Dataset."""
        return source in self.datasets

    def of(self, source: str) -> InputConfig:
        """The plain input config (paths, format, fields, root) of one source, with every shared
        setting; of("") is this config, for a job without sources. The one place a source's
        inheritance is worked out: the job resolves each file's Reading from it once, on the driver."""
        if not source:
            return self
        s = next((s for s in self.sources if s.name == source), None)
        if s is None:
            raise KeyError(f"no input source {source!r}")
        fmt = s.format or self.format
        # A text file has no fields: a text source reads none of the lists it inherits.
        fields = fmt != "text" or source in self.datasets
        text_fields = s.text_fields if s.text_fields is not None else () if s.text_field else self.text_fields
        metadata = s.metadata_fields if s.metadata_fields is not None else self.metadata_fields
        return dataclasses.replace(
            self,
            paths=s.paths,
            sources=(),
            datasets=("",) if source in self.datasets else (),
            tokens=None,
            format=fmt,
            text_field=s.text_field or self.text_field,
            # A source's own text_field reads that field alone, whatever input.text_fields says.
            text_fields=text_fields if fields else (),
            text_separator=s.text_separator if s.text_separator is not None else self.text_separator,
            metadata_fields=metadata if fields else (),
            id_field=(s.id_field or None) if s.id_field is not None else self.id_field,
            root=s.root if s.root is not None else self.root,
        )

    def reading(self, source: str = "") -> Reading:
        """How the files of `source` ("" without sources) are read: its own format and fields."""
        one = self.of(source)
        return Reading(
            format="dataset" if self.is_dataset(source) else one.format,
            text_field=one.text_field,
            id_field=one.id_field,
            empty=one.empty,
            max_document_bytes=one.max_document_bytes,
            messages_field=one.messages_field,
            prompt_field=one.prompt_field,
            completion_field=one.completion_field,
            text_fields=one.text_fields,
            text_separator=one.text_separator,
            metadata_fields=one.metadata_fields,
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
    def metadata_columns(self) -> tuple[str, ...]:
        """Every metadata field any source keeps, in the order the config first names them: the
        index's `metadata` struct has these (a source that keeps some of them: null for the rest)."""
        names = [f for c in [self, *(self.of(s.name) for s in self.sources)] for f in c.metadata_fields]
        return tuple(dict.fromkeys(names))

    @property
    def id_fields(self) -> bool:
        """Any source's documents carry ids of their own (id_field): the duplicate-id check runs."""
        return any(c.id_field for c in [self.of(s.name) for s in self.sources] or [self])
