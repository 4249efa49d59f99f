"""`raypack verify OUTPUT [--config CONFIG]`: re-read a packed dataset and prove nothing was lost.

Checks, each failure naming the file, pack or document:
- manifest.json exists (else the dataset is incomplete) and every file it lists (data files, their
  companions, the format's dataset files) has its size and sha256;
- every file is read back through its output format (raypack.formats): its own structure checked
  (a Megatron .idx, OLMo's document bounds and label mask, an MDS shard's samples), its tokens
  decoded from the format's bytes and matched with its pack index;
- every pack row is well formed: input_ids exactly its bucket length, doc_offsets from 0 rising to
  num_tokens, one doc id and chunk index per item, padding positions hold pad_id;
- every document of the index is present exactly once: chunks 0..k-1 each once, their tokens adding up
  to what the document placed (its full length under overflow=split);
- totals equal the manifest's counts, and rejects/ holds the rejects, rejected records and lost
  files the manifest counts (a lost file counts as its records: it is reported apart, never as one
  bad record among millions);
- with the job config: a sample of documents is re-read from the input and re-tokenized, and its
  tokens must equal the output's, chunk after chunk.
Reads the output with pyarrow on one machine; memory grows with the number of items.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raypack import schema
from raypack.config import JobConfig, PackConfig, StorageConfig
from raypack.corpus.metadata import KINDS, conform, metadata_array
from raypack.dataset.layout import MANIFEST, overflow_rejects_path, rejects_path, resolve_dataset
from raypack.dataset.manifest import describe_sample, metadata_kinds, packed_settings
from raypack.dataset.previous import aside_note
from raypack.errors import ConfigError
from raypack.formats import Spec, item_spans, packs_of, real_positions, spec_of
from raypack.packing import decompose
from raypack.storage import exists, join, read_bytes, resolve

if TYPE_CHECKING:
    from raypack.corpus.readers.records import Batch
    from raypack.corpus.units import WorkUnit
    from raypack.text.chat import ChatTemplate
    from raypack.text.tokenizer import LoadedTokenizer

__all__ = ["VerifyReport", "recorded_config", "verify"]

MAX_PROBLEMS = 20
# A sampled document up to this many characters is re-tokenized whole, whatever the job cut it at;
# longer ones in pieces cut where tokenizers' own checks allow (raypack.text.cuts). Encoding one whole
# holds 170-230 bytes a token (the Encoding and its ids), and CJK text is ~1 token a character: 8M
# characters of it ≈ 1.9 GB, of English prose ~0.5 GB.
WHOLE_CHARS = 8 << 20


@dataclass
class VerifyReport:
    dataset: str = ""
    """The directory verified: the path given, or the version a rebuild root's LATEST names."""
    format: str = ""
    """Its output format (raypack.formats)."""
    problems: list[str] = field(default_factory=list)
    documents: int = 0
    unpacked: int = 0
    """Of the documents, those none of whose tokens is in the packs: dropped whole (overflow drop,
    decompose's min_seq_len: rejects/ says why) or left out by a mixture."""
    items: int = 0
    packs: int = 0
    tokens: int = 0
    sampled: int = 0
    duplicate_ids: int = 0
    """Ids that more than one input document carries (each occurrence checked; not sampled)."""
    rejected_records: int = 0
    """Input records in rejects/ (a lost file counts as its rows)."""
    lost_files: list[str] = field(default_factory=list)
    """Input files lost whole or in part (allowed by input.max_lost_files when the job ran)."""
    warnings: list[str] = field(default_factory=list)
    """Not failures: e.g. inputs changed since the dataset was made (the sample is then re-read from
    the files as they are now)."""
    trial: str | None = None
    """The dataset is a trial on a sample of its corpus (input.limit_bytes), in words; None: not."""

    @property
    def ok(self) -> bool:
        return not self.problems

    def add(self, problem: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(problem)
        elif len(self.problems) == MAX_PROBLEMS:
            self.problems.append("... (more problems not shown)")


def verify(
    output: str,
    config: JobConfig | None = None,
    sample: int = 64,
    seed: int = 0,
    storage: StorageConfig | None = None,
    datasets: dict[str, Any] | None = None,
) -> VerifyReport:
    """Check the dataset at `output` (or the version its LATEST names). Storage settings come from
    `storage`, else the config's, else the environment. `datasets`: the Ray Datasets the job read
    (input.datasets), by name, for the sample to re-read; without them the sample is of files only."""
    storage = storage or (config.storage if config is not None else None)
    output = resolve_dataset(output, storage)
    report = VerifyReport(dataset=output)
    manifest = _readable_manifest(output, report, storage)
    if manifest is None:
        return report
    spec = spec_of(manifest)
    report.format = spec.name
    report.trial = describe_sample(manifest.get("sample"))
    differs = _settings_differ(config, manifest) if config is not None else []
    for problem in differs:
        report.add(problem)
    docs = _read_index(output, manifest, storage, report)
    per_id, shared = _count_documents(docs, report)
    partial: dict[str, int] = {}  # a mixture's cut documents: their partial copy's tokens
    if "mixture" in manifest:
        partial = _check_mixture(manifest, docs, report)
    # With settings unlike the dataset's, every sampled document would differ: say which, not that.
    picks = _pick_sample(docs, shared, sample, seed, partial) if config is not None and not differs else []
    # The sampled documents' tokens are collected during the one pass over the data files.
    pieces: dict[str, list[tuple[int, list[int]]]] = {
        str(docs.column("doc_id")[i].as_py()): [] for i in picks
    }
    items = _check_files(output, manifest, spec, report, pieces, storage)
    _check_dataset_files(output, manifest, spec, report, storage)
    if items is not None:
        _check_documents(per_id, items, report)
        _check_decompose(manifest, docs, items, report)
    _check_counts(manifest["counts"], report)
    overflow = _check_rejects(output, manifest["counts"], report, storage)
    _check_overflow_rejects(manifest, docs, overflow, report)
    if config is not None and items is not None and report.ok:
        if not picks and report.documents and not differs:
            report.warnings.append(
                "no document was re-tokenized: every id is shared by several documents (an id field "
                "whose values repeat, e.g. across sources), and such documents are not sampled"
            )
        _check_sample(config, manifest, docs, picks, pieces, partial, report, datasets or {})
    return report


def _readable_manifest(
    output: str, report: VerifyReport, storage: StorageConfig | None
) -> dict[str, Any] | None:
    """The dataset's manifest, or None (and a problem) when there is none or verify cannot read
    its schema version."""
    if not exists(join(output, MANIFEST), storage):
        if not exists(output, storage):
            report.add(f"{output} does not exist")
        else:
            report.add(
                "no manifest.json: the dataset is incomplete (or not a raypack output)" + aside_note(output)
            )
        return None
    manifest: dict[str, Any] = json.loads(read_bytes(join(output, MANIFEST), storage))
    if manifest.get("schema_version") not in schema.READABLE_SCHEMA_VERSIONS:
        versions = ", ".join(map(str, schema.READABLE_SCHEMA_VERSIONS))
        report.add(f"schema_version {manifest.get('schema_version')} is not one of {versions}")
        return None
    return manifest


def _count_documents(docs: pa.Table, report: VerifyReport) -> tuple[pa.Table, pa.ChunkedArray]:
    """Counts the index's input documents, and the ids several of them share, into `report`;
    returns the index by id (occurrences, copies included; chunks summed and widest; tokens placed)
    for the document check, and the shared ids, which the re-tokenized sample leaves out."""
    # A row per input document, or per copy of one in a mixture (copy 0, 1, ...; -1 for a document
    # the mixture left out): the documents are the rows of copy 0 or -1.
    originals = docs.filter(pc.less_equal(docs.column("copy"), 0))
    report.documents = originals.num_rows
    report.unpacked = originals.num_rows - pc.sum(pc.greater(originals.column("placed"), 0)).as_py()
    per_id = docs.group_by("doc_id").aggregate(
        [("doc_id", "count"), ("chunks", "sum"), ("chunks", "max"), ("placed", "sum")]
    )
    inputs = originals.group_by("doc_id").aggregate([("doc_id", "count")])
    shared = inputs.filter(pc.greater(inputs.column("doc_id_count"), 1)).column("doc_id")
    report.duplicate_ids = len(shared)
    return per_id, shared


def _check_counts(counts: dict[str, Any], report: VerifyReport) -> None:
    """The manifest's counts of documents, items, packs and tokens against what the output holds."""
    for key, got in (("documents", report.documents), ("items", report.items), ("packs", report.packs)):
        if counts[key] != got:
            report.add(f"manifest counts {counts[key]} {key}, the output holds {got}")
    if counts["tokens"] != report.tokens:
        report.add(f"manifest counts {counts['tokens']} tokens, the packs hold {report.tokens}")


# The sections whose settings make a dataset's bytes, and in each the settings that do not: where the
# corpus and the tokenizer are read from (verify reads them where the config says; the tokenizer's
# content is compared by sha256), the reject thresholds and the size of work units, how many units at
# once and in what batches, which encoder (every backend gives tokenizers' ids), the date a job fixed
# and the render it chose for chat (read from the manifest), the packers only compared beside the
# one that wrote, where the output is and how many versions a rebuild keeps.
_SAME_BYTES = {
    "input": {
        "paths",
        "root",
        "max_reject_ratio",
        "max_lost_files",
        "unit_bytes",
        "group_bytes",
        "datasets",
        "unit_rows",
    },
    "tokenizer": {"path", "concurrency", "batch_size", "backend", "chat_date", "chat_spans"},
    "pack": {"compare"},
    "output": {"path", "keep_versions"},
}
# A mixture source's own settings that do not either (its place, as input's).
_SOURCE_SAME_BYTES = {"paths", "root"}


def datasets_override(output: str, storage: StorageConfig | None = None) -> list[str]:
    """The override naming the sources a dataset at `output` read as Ray Datasets (its manifest's
    input.datasets), for the config given to verify it, as raypack.pack named them, so its sources
    without paths load; [] for files, or where there is no manifest to read."""
    recorded = _recorded(output, storage) or {}
    names = recorded.get("input", {}).get("datasets") or []
    return [f"input.datasets={json.dumps(names)}"] if names else []


def _recorded(output: str, storage: StorageConfig | None) -> dict[str, Any] | None:
    """The job config a dataset's manifest records, as its JSON holds it; None where there is no
    manifest to read (verify itself says why)."""
    try:
        manifest = json.loads(read_bytes(join(resolve_dataset(output, storage), MANIFEST), storage))
    except (OSError, ValueError):
        return None
    recorded = manifest.get("config") if isinstance(manifest, dict) else None
    return recorded if isinstance(recorded, dict) else None


def recorded_config(
    output: str, overrides: Sequence[str] = (), storage: StorageConfig | None = None
) -> tuple[JobConfig | None, str]:
    """The job config the dataset at `output` records (its manifest's), with `overrides`: what
    `raypack verify OUTPUT` re-tokenizes its sample with when no config is given. (None, why) where
    it cannot serve: no readable manifest (verify says why), Ray Datasets as the input, the inputs or
    the tokenizer not where it says (a relative path is the packing directory's)."""
    from raypack.config import load_config
    from raypack.corpus.files import input_files
    from raypack.text.files import tokenizer_files

    recorded = _recorded(output, storage)
    if recorded is None:
        return None, ""
    if recorded.get("input", {}).get("datasets"):
        return None, "its input was Ray Datasets: raypack.verify(..., datasets=...) re-reads them"
    cfg = load_config(recorded, list(overrides))
    if storage is not None:
        cfg = dataclasses.replace(cfg, storage=storage)
    try:
        input_files(cfg.input, cfg.storage)
        tokenizer_files(cfg.tokenizer, cfg.storage)
    except ConfigError as e:
        return None, f"as the manifest records the job, {e}"
    return cfg, ""


def _settings_differ(config: JobConfig, manifest: dict[str, Any]) -> list[str]:
    """Each setting of `config` that makes the dataset's bytes (input, tokenizer, pack, output) unlike
    the one it was packed with, and the tokenizer's files when they are not the ones it was packed
    with (by sha256), named."""
    from raypack.text.files import tokenizer_files
    from raypack.text.tokenizer import tokenizer_sha256

    def plain(value: Any) -> Any:  # tuples as lists, as the manifest's JSON holds them
        return json.loads(json.dumps(value, default=str))

    def placeless(sections: dict[str, Any]) -> dict[str, Any]:
        sources = sections.get("input", {}).get("sources")
        if sources:
            kept = [{k: v for k, v in src.items() if k not in _SOURCE_SAME_BYTES} for src in sources]
            sections = {**sections, "input": {**sections["input"], "sources": kept}}
        return sections

    now, then = placeless(plain(config.to_dict())), placeless(manifest.get("config", {}))
    converted = packed_settings(manifest)  # a converted dataset: as converted, or as packed
    found = []
    for section, skip in _SAME_BYTES.items():
        recorded = then.get(section, {})
        for key in sorted(set(now[section]) & set(recorded)):  # (a key newer than the dataset: no record)
            if key in skip:
                continue
            packed, given = recorded[key], now[section][key]
            either = converted.get(key) if section == "output" else None
            if either is not None and (not either or given in either):
                continue
            if packed != given:
                found.append(
                    f"{section}.{key}: the dataset was packed with {packed!r}, the config says {given!r}"
                )
    packed_sha = manifest.get("tokenizer", {}).get("sha256")
    try:
        given_sha = tokenizer_sha256(tokenizer_files(config.tokenizer, config.storage))
    except ConfigError as e:
        found.append(f"tokenizer.path: {e}")
    else:
        if packed_sha and given_sha != packed_sha:
            found.append(
                f"tokenizer.path: {config.tokenizer.path} is another tokenizer than the dataset's "
                f"(sha256 {given_sha[:12]}, packed with {packed_sha[:12]})"
            )
    return found


def _check_rejects(
    output: str, counts: dict[str, Any], report: VerifyReport, storage: StorageConfig | None
) -> Counter[tuple[int, int]]:
    """rejects/ against the manifest: rows, the records they stand for, and the lost files by name;
    the (unit, row) of every pack.overflow reject, for _check_overflow_rejects."""
    rows = records = 0
    overflow: Counter[tuple[int, int]] = Counter()
    for shard in range(int(counts["shards"])):
        rows, records, _ = _count_rejects(rejects_path(output, shard), rows, records, report, storage)
        rows, records, cut = _count_rejects(
            overflow_rejects_path(output, shard), rows, records, report, storage
        )
        overflow.update((shard, row) for row in cut)
    report.rejected_records = records
    if rows != int(counts["rejects"]):
        report.add(f"manifest counts {counts['rejects']} rejects, rejects/ holds {rows}")
    if "rejected_records" in counts and records != int(counts["rejected_records"]):
        report.add(f"manifest counts {counts['rejected_records']} rejected records, rejects/ holds {records}")
    if "lost_files" in counts and len(report.lost_files) != int(counts["lost_files"]):
        named = len(report.lost_files)
        report.add(f"manifest counts {counts['lost_files']} lost files, rejects/ names {named}")
    return overflow


def _check_overflow_rejects(
    manifest: dict[str, Any], docs: pa.Table, got: Counter[tuple[int, int]], report: VerifyReport
) -> None:
    """pack.overflow's rejects (`got`: their unit and row) name the documents of the index longer
    than seq_len, one each. A dataset whose counts hold no such reject (written before they were,
    or with no document that long) is left to the counts' check."""
    pack = (manifest.get("config") or {}).get("pack") or {}
    kinds = manifest["counts"].get("rejects_by_reason") or {}
    if pack.get("overflow", "split") == "split" or not any(k.startswith("overflow ") for k in kinds):
        return
    seq_len = int(pack["seq_len"])
    originals = docs.filter(pc.less_equal(docs.column("copy"), 0))
    long = originals.filter(pc.greater(originals.column("length"), seq_len))
    want = Counter(zip(long.column("shard").to_pylist(), long.column("row").to_pylist(), strict=True))
    if got != want:
        missing, other = sum((want - got).values()), sum((got - want).values())
        report.add(
            f"pack.overflow {pack['overflow']}: {missing:,} documents longer than seq_len ({seq_len}) "
            f"have no reject, {other:,} overflow rejects name a document that is not longer"
        )


def _count_rejects(
    path: str, rows: int, records: int, report: VerifyReport, storage: StorageConfig | None
) -> tuple[int, int, list[int]]:
    """`rows` and `records` with one rejects file's added (none where it is absent), and its rows'
    `row`; its lost files named in `report`."""
    if not exists(path, storage):
        return rows, records, []
    table = pq.read_table(pa.BufferReader(read_bytes(path, storage)))
    named = table.column("row").to_pylist()
    if "records" not in table.column_names:  # written before rejects counted records
        return rows + table.num_rows, records + table.num_rows, named
    lost = table.filter(table.column("lost_file"))
    sources, reasons = lost["source"].to_pylist(), lost["reason"].to_pylist()
    report.lost_files += [f"{s} ({r})" for s, r in zip(sources, reasons, strict=True)]
    return rows + table.num_rows, records + int(pc.sum(table.column("records")).as_py() or 0), named


def _pick_sample(
    docs: pa.Table, shared: pa.ChunkedArray, sample: int, seed: int, partial: dict[str, int]
) -> list[int]:
    """Rows of documents to re-tokenize (a first copy each), among those whose id is unique (the
    packs tell occurrences of one id apart by nothing): `sample` at random, and every document with
    a mixture's partial copy (`partial`, a few: one a source at most)."""
    first = ~pc.is_in(docs.column("doc_id"), value_set=shared).to_numpy(zero_copy_only=False) & (
        docs.column("copy").to_numpy() == 0
    )
    unique = np.flatnonzero(first)
    picks = set(random.Random(seed).sample(unique.tolist(), min(sample, len(unique))))
    if partial:
        cut = pc.is_in(docs.column("doc_id"), value_set=pa.array(list(partial), pa.string()))
        picks.update(np.flatnonzero(first & cut.to_numpy(zero_copy_only=False)).tolist())
    return sorted(picks)


def _check_files(
    output: str,
    manifest: dict[str, Any],
    spec: Spec,
    report: VerifyReport,
    pieces: dict[str, list[tuple[int, list[int]]]],
    storage: StorageConfig | None,
) -> pa.Table | None:
    """Check every data file, read back through the format; returns the items (doc_id, chunk, length)
    they hold, or None if unreadable. Appends (chunk, tokens) to `pieces` for every item of a
    document that `pieces` has a key for."""
    tables = []
    for f in manifest["files"]:
        files = _read_checked(output, [f, *f.get("companions", [])], report, storage)
        if files is None:
            continue
        index = files[f.get("index") or f["path"]]
        groups = schema.row_group_rows(pq.ParquetFile(pa.BufferReader(index)).metadata)
        if "row_groups" in f and f["row_groups"] != groups:  # readers plan their shares from these
            report.add(
                f"{f['path']}: {len(groups)} row groups of {sum(groups)} packs; the manifest lists "
                f"{len(f['row_groups'])} of {sum(f['row_groups'])} (or other sizes)"
            )  # and the rows are still checked: they say what is missing
        schema_of = pq.read_schema(pa.BufferReader(index))
        if not schema_of.equals(_pack_schema(spec)):
            report.add(f"{f.get('index') or f['path']}: schema differs from the {spec.name} pack schema")
            continue
        try:
            packs = packs_of(files, f, spec)
        except (ValueError, OSError) as e:
            report.add(f"{f['path']}: not readable as {spec.name} ({e})")
            continue
        own = {p: data for p, data in files.items() if p != f.get("index") or p == f["path"]}
        for problem in spec.format.check_file(own, packs, spec):
            report.add(problem)
        table = packs.table()
        capacity = int(f["bucket_length"])
        tables.append(_check_rows(f["path"], table, capacity, spec.pad_id, report))
        if spec.pad_multiple > 1:
            _check_alignment(f["path"], table, capacity, spec, report)
        if pieces:
            _collect(table, pieces, staged="chat" in manifest)
    if not tables:
        return None if manifest["files"] else pa.table({"doc_id": [], "chunk": [], "length": []})
    return pa.concat_tables(tables)


def _pack_schema(spec: Spec) -> pa.Schema:
    """The schema of a file's pack index (parquet: of its packs), as the dataset's Spec says."""
    expected = schema.PACKED if spec.format.holds_index else schema.PACK_INDEX
    if spec.format.holds_index and spec.loss_mask:
        expected = expected.append(schema.LOSS_MASK)
    if spec.pad_multiple > 1:
        expected = expected.append(schema.PADDED_OFFSETS)
    return expected


def _read_checked(
    output: str, listed: list[dict[str, Any]], report: VerifyReport, storage: StorageConfig | None
) -> dict[str, bytes] | None:
    """The bytes of each listed file (path, bytes, sha256), by path; None (and a problem) when one is
    missing or differs from the manifest."""
    found = {}
    for f in listed:
        try:
            data = read_bytes(join(output, f["path"]), storage)
        except FileNotFoundError:
            report.add(f"{f['path']}: listed in the manifest but missing")
            return None
        if len(data) != f["bytes"] or hashlib.sha256(data).hexdigest() != f["sha256"]:
            report.add(f"{f['path']}: size or sha256 differs from the manifest (modified or truncated)")
            return None
        found[f["path"]] = data
    return found


def _check_dataset_files(
    output: str, manifest: dict[str, Any], spec: Spec, report: VerifyReport, storage: StorageConfig | None
) -> None:
    """The format's files of the whole dataset: as the manifest lists them, and as the format would
    make them from the manifest's files now (a moved dataset's Megatron prefixes differ: a warning)."""
    listed = manifest.get("format", {}).get("files", [])
    if _read_checked(output, listed, report, storage) is None:
        return
    now = spec.format.dataset_files(manifest["files"], spec, output)
    if sorted(now) != sorted(f["path"] for f in listed):
        names = sorted(f["path"] for f in listed)
        report.add(f"the {spec.name} dataset's own files are {sorted(now)}, the manifest lists {names}")
        return
    for f in listed:
        if hashlib.sha256(now[f["path"]]).hexdigest() != f["sha256"]:
            report.warnings.append(
                f"{f['path']} differs from what the manifest's files make now (for Megatron's prefixes: "
                "the dataset moved since it was written; `raypack convert` writes it for the new place)"
            )


def _check_rows(name: str, table: pa.Table, capacity: int, pad_id: int, report: VerifyReport) -> pa.Table:
    report.packs += table.num_rows
    ids = table.column("input_ids").combine_chunks()
    offsets = table.column("doc_offsets").combine_chunks()
    doc_ids = table.column("doc_ids").combine_chunks()
    chunks = table.column("chunk_index").combine_chunks()
    num_tokens = table.column("num_tokens").to_numpy()
    id_len = np.diff(ids.offsets.to_numpy())
    for bad in np.flatnonzero(id_len != capacity)[:3]:
        report.add(f"{name} row {bad}: input_ids has {id_len[bad]} tokens, not {capacity}")
    n_off = np.diff(offsets.offsets.to_numpy())
    n_ids = np.diff(doc_ids.offsets.to_numpy())
    n_chunks = np.diff(chunks.offsets.to_numpy())
    for bad in np.flatnonzero((n_off != n_ids + 1) | (n_ids != n_chunks) | (n_ids == 0))[:3]:
        report.add(f"{name} row {bad}: doc_offsets, doc_ids and chunk_index disagree on the number of items")
    values = offsets.flatten().to_numpy().astype(np.int64)
    starts = offsets.offsets.to_numpy()[:-1]
    ends = offsets.offsets.to_numpy()[1:] - 1
    rising = np.diff(values) > 0
    rising[ends[:-1]] = True  # the step from one pack's last offset to the next pack's 0 is not a check
    bad_rows = set(np.flatnonzero(values[starts] != 0).tolist())
    bad_rows |= {int(np.searchsorted(starts, i, side="right") - 1) for i in np.flatnonzero(~rising)[:3]}
    bad_rows |= set(np.flatnonzero((values[ends] != num_tokens) | (num_tokens > capacity)).tolist())
    for bad in sorted(bad_rows)[:3]:
        report.add(f"{name} row {bad}: doc_offsets must rise from 0 to num_tokens <= {capacity}")
    flat = ids.flatten().to_numpy().reshape(-1, capacity) if not np.any(id_len != capacity) else None
    if flat is not None and schema.PADDED_OFFSETS.name not in table.column_names:  # else _check_alignment
        padding = np.arange(capacity)[None, :] >= num_tokens[:, None]
        for bad in np.flatnonzero(np.any(padding & (flat != pad_id), axis=1))[:3]:
            report.add(f"{name} row {bad}: a padding position does not hold pad_id={pad_id}")
    report.tokens += int(num_tokens.sum())
    item_len = np.diff(values)[~np.isin(np.arange(len(values) - 1), ends)] if len(values) else values
    report.items += len(doc_ids.flatten())
    return pa.table(
        {
            "doc_id": doc_ids.flatten(),
            "chunk": chunks.flatten(),
            "length": pa.array(item_len.astype(np.int64)),
        }
    )


def _check_alignment(name: str, table: pa.Table, capacity: int, spec: Spec, report: VerifyReport) -> None:
    """pack.pad_multiple k: padded_offsets has an entry for each of doc_offsets', every item starts
    at a multiple of k and takes its length rounded up to one, back to back within the pack, and
    every position outside the items' real tokens (their padding, the pack's end) holds pad_id."""
    k = spec.pad_multiple
    real = table.column("doc_offsets").combine_chunks()
    padded = table.column(schema.PADDED_OFFSETS.name).combine_chunks()
    if not np.array_equal(real.offsets.to_numpy(), padded.offsets.to_numpy()):
        report.add(f"{name}: padded_offsets and doc_offsets disagree on the number of items")
        return
    starts, lengths, per_row = item_spans(table)
    row = np.repeat(np.arange(table.num_rows), per_row)
    values = padded.flatten().to_numpy().astype(np.int64)
    opens = np.flatnonzero(~np.isin(np.arange(len(values)), np.cumsum(per_row + 1) - 1))
    span = values[opens + 1] - starts  # the entries of a row are its items' padded starts, then its end
    bad = (starts % k != 0) | (span != -(-lengths // k) * k) | (values[opens + 1] > capacity)
    bad |= np.isin(opens, padded.offsets.to_numpy()[:-1]) & (starts != 0)
    for r in sorted(set(row[bad].tolist()))[:3]:
        report.add(
            f"{name} row {r}: items must start at multiples of pack.pad_multiple={k}, each followed by "
            f"its padding to the next multiple, within {capacity} positions"
        )
    ids = table.column("input_ids").combine_chunks().flatten().to_numpy()
    if len(ids) != table.num_rows * capacity:
        return  # _check_rows said so
    base = row.astype(np.int64) * capacity
    outside = ~real_positions(table.num_rows, capacity, starts + base, starts + lengths + base)
    for r in np.flatnonzero(np.any(outside & (ids.reshape(-1, capacity) != spec.pad_id), axis=1))[:3]:
        report.add(f"{name} row {r}: an alignment padding position does not hold pad_id={spec.pad_id}")


def _read_index(
    output: str, manifest: dict[str, Any], storage: StorageConfig | None, report: VerifyReport
) -> pa.Table:
    """Every index file, as schema.DOCUMENTS (an index written before mixtures: source "", copy 0),
    and its `metadata` where the manifest lists some (a problem for a file whose metadata is not of
    the manifest's fields and types)."""
    kinds = metadata_kinds(manifest)
    expected = pa.struct([(name, KINDS[kind]) for name, kind in kinds.items()])
    names = [*schema.DOCUMENTS.names, *([schema.METADATA] if kinds else [])]
    fs, inner = resolve(join(output, "index"), storage)
    parts = []
    for shard in range(int(manifest["counts"]["shards"])):
        path = f"{inner}/shard-{shard:06d}.parquet"
        with fs.open_input_file(path) as f:
            table = pq.read_table(f)
        if "copy" not in table.column_names:
            table = table.append_column("source", pa.array([""] * table.num_rows, pa.string()))
            table = table.append_column("copy", pa.array(np.zeros(table.num_rows, dtype=np.int32)))
        if "file" not in table.column_names:  # written before runs of small files: a file a unit
            table = table.append_column("file", pa.array(np.zeros(table.num_rows, dtype=np.int32)))
        if kinds:
            table = _index_metadata(table, expected, shard, report)
        parts.append(table.select(names))
    empty = schema.DOCUMENTS.append(pa.field(schema.METADATA, expected)) if kinds else schema.DOCUMENTS
    return pa.concat_tables(parts) if parts else empty.empty_table()


def _index_metadata(table: pa.Table, expected: pa.DataType, shard: int, report: VerifyReport) -> pa.Table:
    """An index file's table with its metadata of the manifest's fields and types; a problem, and
    nulls in its place, where it is not."""
    found = table.schema.field(schema.METADATA).type if schema.METADATA in table.column_names else None
    if found == expected:
        return table
    report.add(f"index/shard-{shard:06d}.parquet: metadata is {found}, not the manifest's {expected}")
    if found is not None:
        table = table.drop_columns([schema.METADATA])
    return table.append_column(schema.METADATA, pa.nulls(table.num_rows, expected))


def _check_mixture(manifest: dict[str, Any], docs: pa.Table, report: VerifyReport) -> dict[str, int]:
    """Each document is in the index (and so, by _check_documents, in the packs) the number of
    times its source's rule gives it, recomputed here from the manifest's rules and seed, each copy
    placing what pack.overflow keeps of its tokens (a partial copy: its rule's partial_tokens); and
    each source's copies and kept tokens are the manifest's. Returns the documents (by id) whose
    last copy the rules make partial, with its tokens (raypack.mixture.Cut)."""
    from raypack.dataset.manifest import entry_files
    from raypack.mixture import Rule, copies, copy_tokens, kept, unit_keys

    mixture = manifest["mixture"]
    pack = manifest.get("config", {}).get("pack", {})
    seq_len, overflow = int(pack.get("seq_len", 0)) or 1 << 62, str(pack.get("overflow", "split"))
    rules = {r["name"]: Rule(**r["rule"]) for r in mixture["sources"]}
    shard = docs.column("shard").to_numpy()
    copy = docs.column("copy").to_numpy()
    length = docs.column("length").to_numpy()
    placed = docs.column("placed").to_numpy()
    rows = docs.column("row").to_numpy()
    files = docs.column("file").to_numpy()
    # A document is (its file, its row) within its unit: one int64 each, to match copies to it.
    place = (files.astype(np.int64) << 40) | rows
    tally = {name: [0, 0] for name in rules}
    partial: dict[str, int] = {}
    for s in np.unique(shard).tolist():
        at = np.flatnonzero((shard == s) & (copy <= 0))  # one row a document
        entry = manifest["inputs"][s]
        relpaths = [f["path"] for f in entry_files(entry)]
        source = entry.get("source", "")
        rule = rules.get(source)
        if rule is None:
            report.add(f"shard {s} ({relpaths[0]}): source {source!r} has no rule in the manifest")
            continue
        seed = int(mixture["seed"])
        want = copies(
            rule, unit_keys(seed, relpaths, files[at], rows[at]), kept(length[at], seq_len, overflow)
        )
        have = np.zeros(len(at), dtype=np.int64)
        order = np.argsort(place[at])
        mine = np.flatnonzero((shard == s) & (copy >= 0))  # a row a copy
        np.add.at(have, order[np.searchsorted(place[at][order], place[mine])], 1)
        for bad in np.flatnonzero(have != want)[:3]:
            report.add(
                f"document {docs.column('doc_id')[int(at[bad])].as_py()!r} ({source}): {have[bad]} copies in "
                f"the index, its source's rule gives {want[bad]}"
            )
        # What each copy must place: its kept tokens, a partial copy's first tokens only.
        keys = unit_keys(seed, relpaths, files[mine], rows[mine])
        tokens = kept(length[mine], seq_len, overflow)
        if rule.partial_tokens:
            last = copy[mine] == rule.full
            cut = copy_tokens(rule, keys[last], length[mine][last], rule.full)
            tokens[last] = kept(cut, seq_len, overflow)
            for k in np.flatnonzero(last & (keys == np.uint64(rule.partial_key))).tolist():
                partial[str(docs.column("doc_id")[int(mine[k])].as_py())] = int(tokens[k])
        for bad in np.flatnonzero(placed[mine] != tokens)[:3]:
            report.add(
                f"document {docs.column('doc_id')[int(mine[bad])].as_py()!r} ({source}): copy "
                f"{copy[mine][bad]} places {placed[mine][bad]:,} tokens, its source's rule gives "
                f"{tokens[bad]:,}"
            )
        tally[source][0] += int(want.sum())
        tally[source][1] += int(tokens.sum())
    for row in mixture["sources"]:
        got = tally.get(row["name"], [0, 0])
        if got != [row["copies"], row["selected"]]:
            report.add(
                f"source {row['name']}: the manifest counts {row['copies']:,} copies of {row['selected']:,} "
                f"tokens, its rule gives {got[0]:,} of {got[1]:,}"
            )
    return partial


def _check_documents(per_id: pa.Table, items: pa.Table, report: VerifyReport) -> None:
    """`per_id`: the index aggregated by doc_id. An id may occur more than once (a user's id_field with
    duplicates: the job reports them and packs every occurrence); its items must then add up to all
    its occurrences: as many chunk 0s as occurrences, and so on."""
    got = items.group_by("doc_id").aggregate(
        [
            ("chunk", "count"),
            ("chunk", "count_distinct"),
            ("chunk", "min"),
            ("chunk", "max"),
            ("length", "sum"),
        ]
    )
    joined = per_id.join(got, "doc_id", join_type="full outer")
    expected_chunks = joined.column("chunks_sum").to_numpy(zero_copy_only=False)
    widest = joined.column("chunks_max").to_numpy(zero_copy_only=False)
    placed = joined.column("placed_sum").to_numpy(zero_copy_only=False)
    ids = joined.column("doc_id").to_pylist()
    count = joined.column("chunk_count").to_numpy(zero_copy_only=False)
    distinct = joined.column("chunk_count_distinct").to_numpy(zero_copy_only=False)
    cmin = joined.column("chunk_min").to_numpy(zero_copy_only=False)
    cmax = joined.column("chunk_max").to_numpy(zero_copy_only=False)
    total = joined.column("length_sum").to_numpy(zero_copy_only=False)
    for i in range(joined.num_rows):
        exp = 0 if np.isnan(expected_chunks[i]) else int(expected_chunks[i])
        have = 0 if np.isnan(count[i]) else int(count[i])
        if np.isnan(placed[i]):
            report.add(f"document {ids[i]!r} is in the packs but not in the input index")
        elif have != exp:
            report.add(f"document {ids[i]!r}: {have} chunks in the packs, expected {exp}")
        elif have and (
            int(distinct[i]) != int(widest[i]) or int(cmin[i]) != 0 or int(cmax[i]) != widest[i] - 1
        ):
            report.add(f"document {ids[i]!r}: chunk indexes are not 0..{int(widest[i]) - 1} each once")
        elif have and int(total[i]) != int(placed[i]):
            report.add(f"document {ids[i]!r}: chunks hold {int(total[i])} tokens, expected {int(placed[i])}")


def _check_decompose(manifest: dict[str, Any], docs: pa.Table, items: pa.Table, report: VerifyReport) -> None:
    """A dataset of pack.algorithm decompose: every pack one chunk of one document, its length a
    power of two in [min_seq_len, seq_len] with no padding, and every document's chunks those of
    the rule (raypack.packing.decompose), in order. Nothing for another packer's."""
    pack = (manifest.get("config") or {}).get("pack") or {}
    if pack.get("algorithm") != "decompose":
        return
    seq_len, low = int(pack["seq_len"]), int(pack.get("min_seq_len") or 1)
    lengths = {int(f["bucket_length"]) for f in manifest["files"]}
    allowed = {1 << b for b in range(low.bit_length() - 1, seq_len.bit_length())}
    for length in sorted(lengths - allowed):
        report.add(f"decompose: packs of length {length}, not a power of two in [{low}, {seq_len}]")
    if report.items != report.packs:
        report.add(f"decompose: {report.items:,} chunks in {report.packs:,} packs; a pack holds one chunk")
    if all("row_groups" in f for f in manifest["files"]):
        slots = sum(int(f["bucket_length"]) * sum(f["row_groups"]) for f in manifest["files"])
        if slots != report.tokens:
            report.add(f"decompose: {slots - report.tokens:,} padding positions; a chunk fills its pack")
    _check_chunks(docs, items, seq_len, low, str(pack.get("overflow", "split")), report)


def _check_chunks(
    docs: pa.Table, items: pa.Table, seq_len: int, low: int, overflow: str, report: VerifyReport
) -> None:
    """Each document's chunks (items: doc_id, chunk, length) against decompose's rule for its length
    in the index; ids that several documents share are left out (their chunks are not told apart)."""
    ids = docs.column("doc_id").to_numpy(zero_copy_only=False)
    rule = decompose.make_items(docs.column("length").to_numpy(), seq_len, overflow, min_seq_len=low)
    want = pa.table(
        {
            "doc_id": pa.array(np.repeat(ids, np.diff(rule.doc_start)), pa.string()),
            "chunk": pa.array(rule.chunk_index()),
            "want": pa.array(rule.length.astype(np.int64)),
        }
    )
    got = items.select(["doc_id", "chunk", "length"]).cast(
        pa.schema([("doc_id", pa.string()), ("chunk", pa.int32()), ("length", pa.int64())])
    )
    names, counts = np.unique(ids.astype(str), return_counts=True)
    shared = pa.array(names[counts > 1], pa.string())
    want, got = (t.filter(pc.invert(pc.is_in(t.column("doc_id"), value_set=shared))) for t in (want, got))
    joined = want.join(got, ["doc_id", "chunk"], join_type="full outer")
    same = pc.fill_null(pc.equal(joined.column("want"), joined.column("length")), False)
    for row in joined.filter(pc.invert(same)).slice(0, 3).to_pylist():
        report.add(
            f"document {row['doc_id']!r} chunk {row['chunk']}: {row['length']} tokens in the packs, "
            f"decompose's rule gives {row['want']}"
        )


def _collect(table: pa.Table, pieces: dict[str, list[tuple[int, list[int]]]], staged: bool = False) -> None:
    """Each wanted document's items, as (chunk, tokens); `staged` (chat data): tokens as the tokenize
    stage stages them, untrained ones as -(id + 1), so the re-tokenized sample checks the mask too."""
    doc_ids = table.column("doc_ids").combine_chunks()
    hits = pc.is_in(doc_ids.flatten(), value_set=pa.array(list(pieces), pa.string()))
    positions = np.flatnonzero(hits.to_numpy(zero_copy_only=False))
    if not positions.size:
        return
    ids = table.column("input_ids").combine_chunks()
    item_start = doc_ids.offsets.to_numpy()
    starts, lengths, _ = item_spans(table)  # an aligned item's tokens lie at its padded start
    flat_ids = ids.flatten().to_numpy()
    token_start = ids.offsets.to_numpy()
    chunks = table.column("chunk_index").combine_chunks().flatten().to_numpy()
    names = doc_ids.flatten()
    if staged:
        mask = table.column("loss_mask").combine_chunks().flatten().to_numpy().astype(bool)
        flat_ids = np.where(mask, flat_ids, -flat_ids.astype(np.int64) - 1)
    for pos in positions.tolist():
        row = int(np.searchsorted(item_start, pos, side="right") - 1)
        lo, hi = starts[pos], starts[pos] + lengths[pos]
        tokens = flat_ids[token_start[row] + lo : token_start[row] + hi].tolist()
        pieces[str(names[pos].as_py())].append((int(chunks[pos]), tokens))


def _check_sample(
    config: JobConfig,
    manifest: dict[str, Any],
    docs: pa.Table,
    picks: list[int],
    pieces: dict[str, list[tuple[int, list[int]]]],
    partial: dict[str, int],
    report: VerifyReport,
    datasets: dict[str, Any],
) -> None:
    """Re-read and re-tokenize the picked documents; compare with their tokens in the packs. A Ray
    Dataset's documents are re-read from `datasets`, cut into units as the job cut them."""
    from raypack.corpus.files import input_files

    # The work units as the job cut them (the manifest lists them in order): cutting them again would
    # read every large JSONL file whole to count its lines.
    found = {s.relpath: s for s in input_files(config.input, config.storage)}
    _warn_datasets_not_given(config, datasets, report)
    again = _dataset_units_again(config, manifest, datasets)
    shards, from_datasets = _units_to_reread(manifest, found, again, datasets, report)
    _warn_new_inputs(manifest, found, report)
    expected = _retokenize(config, manifest, docs, picks, shards, from_datasets, report)
    _compare_sample(config, docs, expected, pieces, partial, report)


def _warn_datasets_not_given(config: JobConfig, datasets: dict[str, Any], report: VerifyReport) -> None:
    """A warning naming the Ray Datasets the job read that were not given: their documents are not
    re-tokenized."""
    if config.input.datasets and not datasets:
        report.warnings.append(
            "the input was a Ray Dataset: its documents were not re-tokenized (pass it as "
            "raypack.verify(..., dataset=...) to check a sample of them)"
        )
    missing = sorted(set(config.input.datasets) - set(datasets))
    if datasets and missing:
        report.warnings.append(
            f"no Dataset was given for {', '.join(map(repr, missing))}: its documents were not re-tokenized"
        )


def _dataset_units_again(
    config: JobConfig, manifest: dict[str, Any], datasets: dict[str, Any]
) -> dict[int, WorkUnit]:
    """The work units of the Ray Datasets given, by their index in the manifest: cut as the job cut
    them (its unit_rows, whatever the config's), each source's units numbered from its first entry
    in the manifest."""
    from raypack.corpus.datasets import dataset_units

    rows = manifest.get("config", {}).get("input", {}).get("unit_rows", config.input.unit_rows)
    cut = dataclasses.replace(config.input, unit_rows=rows)
    again: dict[int, WorkUnit] = {}
    for name, ds in datasets.items():
        label = name or "dataset"
        first = next((i for i, e in enumerate(manifest["inputs"]) if e.get("dataset") == label), None)
        if first is not None:
            again |= {u.index: u for u in dataset_units(cut, {name: ds}, first)}
    return again


def _units_to_reread(
    manifest: dict[str, Any],
    found: dict[str, WorkUnit],
    again: dict[int, WorkUnit],
    datasets: dict[str, Any],
    report: VerifyReport,
) -> tuple[dict[int, WorkUnit], set[int]]:
    """The work unit of each manifest entry whose documents can be read again, by index, and the
    indexes that are a Dataset's (a row's id is then checked against the index's). A problem for
    each entry that cannot be read as the job read it; a warning naming the files that changed
    since (their documents are re-read as they are now)."""
    from raypack.corpus.units import unit_from_entry
    from raypack.dataset.manifest import entry_files

    shards: dict[int, WorkUnit] = {}
    drifted: dict[str, None] = {}  # in manifest order, each once (a split file has several units)
    from_datasets: set[int] = set()
    for index, entry in enumerate(manifest["inputs"]):
        if "dataset" in entry:
            unit = _dataset_unit(index, entry, again.get(index), datasets, report)
            if unit is not None:
                shards[index] = unit
                from_datasets.add(index)
            continue
        files = entry_files(entry)
        gone = [f["path"] for f in files if f["path"] not in found]
        if gone:
            report.add(f"input {gone[0]} (shard {index}) is gone: its documents cannot be checked")
            continue
        for f in files:
            now = found[f["path"]].shard
            if (now.size, now.mtime_ns) != (f["size"], f["mtime_ns"]):
                drifted[f["path"]] = None
        shards[index] = unit_from_entry([found[f["path"]] for f in files], index, entry)
    if drifted:
        report.warnings.append(
            f"{len(drifted):,} inputs changed since the dataset was made (size or modification time), "
            f"e.g. {', '.join(list(drifted)[:3])}: the sample re-reads them as they are now, so a difference "
            "there may be the input's, not the dataset's; a rebuild brings the dataset up to date"
        )
    return shards, from_datasets


def _dataset_unit(
    index: int, entry: dict[str, Any], unit: WorkUnit | None, datasets: dict[str, Any], report: VerifyReport
) -> WorkUnit | None:
    """`unit`, the Dataset given's unit at manifest entry `index`, when it holds the rows the job
    read there; else None, with a problem when a Dataset was given for the entry's source."""
    if unit is not None and [unit.shard.unit_start, unit.shard.unit_stop] == entry["rows"]:
        return unit
    if unit is not None or (datasets and entry.get("source", "") in datasets):
        held = f" (that unit's rows now: {unit.shard.unit_start:,}-{unit.shard.unit_stop:,})" if unit else ""
        report.add(
            f"the Dataset given for {entry['dataset']!r} does not hold the rows the job read: "
            f"shard {index} was rows {entry['rows'][0]:,}-{entry['rows'][1]:,}{held}; its "
            "documents cannot be checked"
        )
    return None


def _warn_new_inputs(manifest: dict[str, Any], found: dict[str, WorkUnit], report: VerifyReport) -> None:
    """A warning naming the files input.paths matches now that the dataset does not hold."""
    from raypack.dataset.manifest import entry_files

    new = sorted(set(found) - {f["path"] for e in manifest["inputs"] for f in entry_files(e)})
    if new and "sample" in manifest:  # a trial: the files it did not take are no news
        return
    if new:
        report.warnings.append(
            f"{len(new):,} files match input.paths now that the dataset does not hold, e.g. "
            f"{', '.join(new[:3])}"
        )


def _retokenize(
    config: JobConfig,
    manifest: dict[str, Any],
    docs: pa.Table,
    picks: list[int],
    shards: dict[int, WorkUnit],
    from_datasets: set[int],
    report: VerifyReport,
) -> dict[str, list[int]]:
    """The tokens of each picked document that its unit still holds, by id, encoded as the dataset
    was (chat data: staged, untrained tokens as -(id + 1)). A problem for a Dataset's row that is
    not the document the job read there."""
    from raypack.corpus.readers import read_unit

    wanted: dict[int, set[tuple[int, int]]] = {}  # by unit: (file, row) of each picked document
    picked_id: dict[tuple[int, int, int], str] = {}  # (unit, file, row) -> the index's id there
    picked_at: dict[tuple[int, int, int], int] = {}  # (unit, file, row) -> its row of the index
    for i in picks:
        place = (int(docs.column("file")[i].as_py()), int(docs.column("row")[i].as_py()))
        unit_index = int(docs.column("shard")[i].as_py())
        wanted.setdefault(unit_index, set()).add(place)
        picked_id[(unit_index, *place)] = str(docs.column("doc_id")[i].as_py())
        picked_at[(unit_index, *place)] = i
    config, tok, template = _encoding_as_packed(config, manifest)
    _check_specials(config, manifest, tok, report)
    expected: dict[str, list[int]] = {}
    for shard_index, rows in wanted.items():
        if shard_index not in shards:
            continue
        for batch in read_unit(shards[shard_index], 256, config.storage):
            numbers = batch.files or [0] * len(batch)
            keep = [k for k, row in enumerate(batch.rows) if (numbers[k], row) in rows]
            if shard_index in from_datasets:
                keep = _rows_as_read(batch, keep, numbers, shard_index, picked_id, report)
            if not keep:
                continue
            at = [picked_at[(shard_index, numbers[k], batch.rows[k])] for k in keep]
            _check_metadata(manifest, docs, at, shards[shard_index], [batch.meta[k] for k in keep], report)
            encoded = _encode_sample(tok, config, template, [batch.texts[k] for k in keep])
            for k, tokens in zip(keep, encoded, strict=True):
                expected[batch.ids[k]] = tokens
    return expected


def _check_metadata(
    manifest: dict[str, Any],
    docs: pa.Table,
    at: list[int],
    unit: WorkUnit,
    values: list[tuple[Any, ...]],
    report: VerifyReport,
) -> None:
    """The metadata of documents read again (`values`, as their unit's Reading names them) against
    the index's rows `at` (the first three that differ, a problem each)."""
    kinds = metadata_kinds(manifest)
    if not kinds:
        return
    again = conform(metadata_array(unit.reading.metadata_fields, values), len(values), kinds).to_pylist()
    held = docs.column(schema.METADATA).take(pa.array(at, pa.int64())).to_pylist()
    # As JSON text: a NaN equals itself there.
    differ = [(i, a, h) for i, a, h in zip(at, again, held, strict=True) if json.dumps(a) != json.dumps(h)]
    for i, a, h in differ[:3]:
        doc_id = docs.column("doc_id")[i].as_py()
        report.add(f"document {doc_id!r}: its metadata in the index is {h}, its input's now {a}")


# Sources that are the user's own choice of an id: whatever it is, it is what they asked for.
_CHOSEN = ("tokenizer.bos_id", "tokenizer.eos_id", "output.pad_id")


def _check_specials(
    config: JobConfig, manifest: dict[str, Any], tok: LoadedTokenizer, report: VerifyReport
) -> None:
    """The BOS, EOS and pad the dataset holds, held to the tokenizer's own special tokens, apart
    from how the job chose them: one it guessed from a name must be a special token (a piece of the
    vocabulary named `<s>` is no BOS), one the model's files state should be (a warning), and a
    pad that is none (id 0 of a tokenizer that names no pad or EOS) is said."""
    from raypack.text.tokenizer import guessed

    recorded = manifest.get("tokenizer", {})
    specials = {i: t for t, i in tok.special_tokens().items()}
    for key, name in (("bos", "BOS"), ("eos", "EOS"), ("pad", "pad")):
        token_id, source = recorded.get(f"{key}_id"), str(recorded.get(f"{key}_source", ""))
        if token_id is None or not config.takes(key) or source in _CHOSEN or int(token_id) in specials:
            continue
        said = f"{name} id {token_id} ({tok.token(int(token_id))!r}, from {source or 'an unrecorded source'})"
        if guessed(source) == "name":
            report.add(f"{said} is not a special token of the tokenizer; set tokenizer.{key}_id")
        else:
            report.warnings.append(f"{said} is not a special token of the tokenizer")


def _encoding_as_packed(
    config: JobConfig, manifest: dict[str, Any]
) -> tuple[JobConfig, LoadedTokenizer, ChatTemplate | None]:
    """The config set to render chat data as the dataset was rendered (the manifest's date and
    spans), the tokenizer, and the chat template."""
    from raypack.text.files import chat_template, read_tokenizer

    tok = read_tokenizer(config.tokenizer, config.storage, framed=config.framed)
    date = manifest.get("chat", {}).get("date")
    if config.tokenizer.chat_date is None and date is not None:  # the date the dataset was rendered with
        config = dataclasses.replace(config, tokenizer=dataclasses.replace(config.tokenizer, chat_date=date))
    if manifest.get("chat", {}).get("spans") == "prefixes":  # the job's self-check took prefix renders
        config = dataclasses.replace(
            config, tokenizer=dataclasses.replace(config.tokenizer, chat_spans="prefixes")
        )
    return config, tok, chat_template(config, tok)


def _rows_as_read(
    batch: Batch,
    keep: list[int],
    numbers: list[int],
    shard_index: int,
    picked_id: dict[tuple[int, int, int], str],
    report: VerifyReport,
) -> list[int]:
    """The rows of `keep` (a Dataset's, read again) that hold the document the job read there; a
    problem for each of the first three that do not."""
    # A Dataset read again may give its rows in another order (an unseeded shuffle): a
    # row whose id is not the one the job read there is the Dataset's change, said so.
    other = [k for k in keep if batch.ids[k] != picked_id[(shard_index, numbers[k], batch.rows[k])]]
    for k in other[:3]:
        was = picked_id[(shard_index, numbers[k], batch.rows[k])]
        report.add(
            f"the Dataset given holds {batch.ids[k]!r} at row {batch.rows[k]:,}, where the job "
            f"read {was!r}: it gives other rows than when it was packed (an unseeded "
            "random_shuffle?); its documents cannot be checked"
        )
    return [k for k in keep if k not in other]


def _encode_sample(
    tok: LoadedTokenizer, config: JobConfig, template: ChatTemplate | None, texts: list[Any]
) -> list[list[int]]:
    """Each document's tokens as the tokenize stage stages them: chat data's untrained ones as
    -(id + 1), so the comparison checks the loss mask too."""
    from raypack.text.encode import encode_chat, encode_documents

    if config.input.chat:
        flat, lengths, _ = encode_chat(tok, config, template, texts)
        ends = np.cumsum(lengths)
        return [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]
    # Whole, not cut as the job cut them: the cuts are what this checks too.
    return encode_documents(tok, config.tokenizer, texts, whole=WHOLE_CHARS)


def _compare_sample(
    config: JobConfig,
    docs: pa.Table,
    expected: dict[str, list[int]],
    pieces: dict[str, list[tuple[int, list[int]]]],
    partial: dict[str, int],
    report: VerifyReport,
) -> None:
    """Each re-tokenized document against its pieces in the packs: a problem for each whose pieces
    are missing or differ (or whose loss mask alone differs)."""
    copies = Counter(docs.column("doc_id").filter(pc.greater_equal(docs.column("copy"), 0)).to_pylist())
    seq_len, overflow = config.pack.seq_len, config.pack.overflow
    for doc_id, tokens in expected.items():
        want = _wanted_pieces(tokens, copies[doc_id], partial.get(doc_id), config.pack)
        got = Counter((c, tuple(part)) for c, part in pieces.get(doc_id, []))
        if got != want:
            what = "are missing" if not got else "differ"
            if config.input.chat and _id_pieces(got) == _id_pieces(want):
                what = "are right but their loss mask differs"  # same ids, another sign somewhere
            whole = _kept(tokens, overflow, seq_len)
            report.add(
                f"document {doc_id!r}: its tokens in the packs {what}: re-tokenizing the input gives "
                f"{len(tokens):,} tokens, of which pack.overflow={overflow} keeps {len(whole):,}"
                + (f" ({partial[doc_id]:,} in its mixture's partial copy)" if doc_id in partial else "")
            )
        report.sampled += 1


def _wanted_pieces(
    tokens: list[int], copies: int, partial: int | None, pack: PackConfig
) -> Counter[tuple[int, tuple[int, ...]]]:
    """The pieces (chunk, tokens) the packs must hold of a document with these tokens: each copy
    (a mixture's) its kept tokens once, cut into the packer's items (seq_len chunks; decompose's
    power-of-two ones); with `partial`, its last copy only its first `partial` tokens, whole chunks
    (raypack.mixture.Cut)."""
    cuts = [len(tokens)] * copies
    if partial is not None and cuts:
        cuts[-1] = partial
    want: Counter[tuple[int, tuple[int, ...]]] = Counter()
    for n in cuts:
        part = _kept(tokens[:n], pack.overflow, pack.seq_len)
        sizes = pack.make_items(np.array([len(part)])).length.tolist() if part else []
        ends = np.cumsum([0, *sizes]).tolist()
        want.update((c, tuple(part[ends[c] : ends[c + 1]])) for c in range(len(sizes)))
    return want


def _id_pieces(pieces: Counter[tuple[int, tuple[int, ...]]]) -> Counter[tuple[int, tuple[int, ...]]]:
    """Pieces of staged tokens (untrained as -(id + 1)) as ids."""
    return Counter({(c, tuple(_ids(list(part)))): n for (c, part), n in pieces.items()})


def _ids(staged: list[int]) -> list[int]:
    """Staged tokens (untrained as -(id + 1)) as ids."""
    return [t if t >= 0 else -t - 1 for t in staged]


def _kept(tokens: list[int], overflow: str, seq_len: int) -> list[int]:
    """What of a document's tokens the packs must hold: all (split), the first seq_len (truncate), or
    none when it is longer than seq_len (drop)."""
    if overflow == "truncate":
        return tokens[:seq_len]
    if overflow == "drop" and len(tokens) > seq_len:
        return []
    return tokens
