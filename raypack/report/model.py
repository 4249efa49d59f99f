"""What a report shows, as plain numbers: gathered from a finished dataset (manifest.json, metrics.json
and a few rows of rejects/, never its data files, so `raypack report` takes a second on any corpus) or
from a dry run's assignments. No plotting here (raypack.report.plots), no HTML (raypack.report.page).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from raypack.config import StorageConfig
from raypack.dataset.layout import MANIFEST, METRICS, resolve_dataset
from raypack.dataset.manifest import describe_sample, entry_files
from raypack.dataset.previous import aside_note
from raypack.dataset.store import store_line
from raypack.errors import ConfigError
from raypack.formats import total_bytes
from raypack.metrics import (
    FILL_BINS,
    LENGTH_BINS_PER_OCTAVE,
    PackingMetrics,
    compute_metrics,
    fill_percent_counts,
    length_bins,
    slots_line,
)
from raypack.packing.assignment import Assignment
from raypack.storage import exists, join, list_dir, read_bytes, resolve
from raypack.text.account import backend_line

__all__ = ["Report", "Run", "from_dataset", "from_dry_run", "length_distribution", "run_of"]

_EXAMPLES = 10  # reject examples shown; the rejects/ files hold them all


@dataclass(frozen=True, slots=True)
class Run:
    """One packing result: its metrics and how full its packs are."""

    metrics: PackingMetrics
    fill_percent: tuple[int, ...]
    """Packs by whole percent of their capacity filled (FILL_BINS entries; the last: full packs)."""
    seconds: float | None = None
    """Packing time, for a dry run (a job's times are per stage)."""
    compared: bool = False
    """Planned by a job for comparison only (pack.compare): not the packs in its data."""

    @property
    def _mark(self) -> str:
        return " (compared)" if self.compared else ""

    @property
    def name(self) -> str:
        """The metrics table's algorithm cell."""
        return self.metrics.algorithm + self._mark

    @property
    def label(self) -> str:
        """A plot legend's entry."""
        return f"{self.metrics.algorithm} @ {self.metrics.seq_len}{self._mark}"


@dataclass(frozen=True, slots=True)
class Report:
    title: str
    facts: tuple[tuple[str, str], ...]
    """What was packed, how and where: (name, value) rows at the top of the page."""
    length_bins: dict[int, int]
    """Documents by metrics.length_bins (input lengths, before any cut)."""
    runs: tuple[Run, ...]
    """One for a job; one per (algorithm, seq_len) for a dry run's sweep."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    documents: int = 0
    rejects: int = 0
    """Rejected input records (a lost file counts as its rows)."""
    lost_files: int = 0
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    reject_examples: tuple[dict[str, Any], ...] = ()
    """source, row, reason and the first characters of the record, for the first few rejects."""
    notes: tuple[str, ...] = ()
    dry_run: bool = False
    sources: tuple[dict[str, Any], ...] = ()
    """The mixture (input.sources), a row a source (raypack.pipeline.place.select.source_table)."""
    chat: dict[str, Any] | None = None
    """Chat data: metrics.json's `chat` (template, mask, trained tokens, truncated conversations)."""


def length_distribution(lengths: np.ndarray) -> dict[int, int]:
    bins, counts = np.unique(length_bins(lengths), return_counts=True)
    return dict(zip(bins.tolist(), counts.tolist(), strict=True))


def run_of(a: Assignment, seconds: float | None = None) -> Run:
    """A packing result reduced to what a report shows (the assignment itself can then go)."""
    return Run(
        compute_metrics(a), tuple(fill_percent_counts(a.pack_fill(), a.capacities()).tolist()), seconds
    )


def from_dry_run(
    lengths: np.ndarray,
    source: str,
    runs: Sequence[Run],
    settings: dict[str, Any],
    notes: Sequence[str] = (),
) -> Report:
    """The page for `raypack plan`: the lengths it packed and every (algorithm, seq_len) it tried;
    `notes`: what they are (a corpus sample's: what it read, and what its counts stand for)."""
    facts = [
        ("lengths", source),
        ("documents", f"{len(lengths):,}"),
        ("tokens", f"{int(lengths.sum()):,}"),
        ("algorithms", ", ".join(dict.fromkeys(r.metrics.algorithm for r in runs))),
        ("seq_len", ", ".join(str(s) for s in dict.fromkeys(r.metrics.seq_len for r in runs))),
    ]
    if settings:
        facts.append(("settings", ", ".join(f"{k}={v}" for k, v in sorted(settings.items()))))
    return Report(
        title="raypack plan (dry run)",
        facts=tuple(facts),
        length_bins=length_distribution(lengths),
        runs=tuple(runs),
        documents=len(lengths),
        notes=tuple(notes),
        dry_run=True,
    )


def from_dataset(path: str, storage: StorageConfig | None = None) -> Report:
    """The page for a finished dataset (or a rebuild root: its LATEST version). ConfigError, one line,
    for a path that holds no complete dataset or one written before reports existed."""
    dataset = resolve_dataset(path, storage)
    if not exists(join(dataset, MANIFEST), storage):
        raise ConfigError(
            f"{path}: no manifest.json, so no complete raypack dataset to report on{aside_note(dataset)}"
        )
    manifest = json.loads(read_bytes(join(dataset, MANIFEST), storage))
    doc = json.loads(read_bytes(join(dataset, manifest.get("metrics", METRICS)), storage))
    if "pack_fill_percent" not in doc or "document_lengths" not in doc:
        raise ConfigError(
            f"{dataset}: metrics.json has no length or fill distribution (written by raypack "
            f"{manifest.get('raypack_version', '?')}, before reports): rerun the job to get a report"
        )
    lengths = doc["document_lengths"]
    if int(lengths["bins_per_octave"]) != LENGTH_BINS_PER_OCTAVE:
        raise ConfigError(f"{dataset}: metrics.json bins lengths differently ({lengths['bins_per_octave']})")
    metrics = PackingMetrics.from_dict(doc["metrics"])
    # No time per compared plan in the table: in a job, each is one first call, mostly loading compiled
    # code (0.5 s for a 1 ms plan); `raypack plan` times packers properly, after a warm-up.
    compared = tuple(
        Run(PackingMetrics.from_dict(c["metrics"]), _fill(dataset, c), compared=True)
        for c in doc.get("comparison", [])
    )
    counts = manifest["counts"]
    reasons = {str(k): int(v) for k, v in doc.get("rejects_by_reason", {}).items()}
    return Report(
        title=f"raypack: {dataset}",
        facts=_facts(dataset, manifest, doc),
        length_bins=dict(zip(lengths["bins"], lengths["documents"], strict=True)),
        runs=(Run(metrics, _fill(dataset, doc)), *compared),
        stage_seconds={str(k): float(v) for k, v in doc.get("stage_seconds", {}).items()},
        documents=int(counts["documents"]),
        rejects=int(counts.get("rejected_records", counts["rejects"])),
        lost_files=int(counts.get("lost_files", 0)),
        rejects_by_reason=reasons,
        reject_examples=_reject_examples(dataset, storage, int(counts.get("rejected_records", 0)))
        if counts["rejects"]
        else (),
        notes=_notes(doc, metrics, manifest),
        sources=tuple(doc.get("sources", [])),
        chat=doc.get("chat"),
    )


def _fill(dataset: str, doc: dict[str, Any]) -> tuple[int, ...]:
    fill = tuple(int(x) for x in doc["pack_fill_percent"])
    if len(fill) != FILL_BINS:
        raise ConfigError(f"{dataset}: metrics.json has {len(fill)} fill bins, not {FILL_BINS}")
    return fill


def _facts(dataset: str, manifest: dict[str, Any], doc: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    cfg, counts, tok = manifest["config"], manifest["counts"], manifest["tokenizer"]
    pack = cfg["pack"]
    files = manifest["files"]
    fmt = manifest.get("format") or {"name": "parquet"}
    size = total_bytes(files, fmt.get("files", []))
    algorithm = pack["algorithm"]
    if algorithm in ("bucket", "decompose"):
        algorithm += f" (buckets {', '.join(str(b['length']) for b in manifest.get('buckets', []))})"
    return (
        ("output", dataset),
        ("input", _inputs(cfg["input"], counts["shards"], manifest["inputs"])),
        *_sample(manifest),
        ("tokenizer", f"{tok['path']} (vocab {tok['vocab_size']:,}, sha256 {tok['sha256'][:12]})"),
        *([("encoded by", backend_line(tok["backend"]))] if tok.get("backend") else []),
        (
            "packing",
            f"{algorithm}, seq_len {pack['seq_len']}, overflow {pack['overflow']}, {doc['mode']} mode"
            + (f", items aligned to {pack['pad_multiple']}" if pack.get("pad_multiple", 1) > 1 else ""),
        ),
        *_positions(pack, doc),
        (
            "counts",
            f"{counts['documents']:,} documents, {counts['items']:,} items, {counts['packs']:,} packs, "
            f"{counts['tokens']:,} tokens",
        ),
        ("files", _files_fact(len(files), fmt["name"], size)),
        *_store(manifest, counts["shards"]),
        *_time(doc),
        ("raypack", str(manifest.get("raypack_version", "?"))),
    )


def _positions(pack: dict[str, Any], doc: dict[str, Any]) -> list[tuple[str, str]]:
    """Where items are aligned (pack.pad_multiple): the pack positions as real tokens, alignment
    padding and end padding."""
    if pack.get("pad_multiple", 1) == 1:
        return []
    return [("positions", slots_line(PackingMetrics.from_dict(doc["metrics"])))]


def _sample(manifest: dict[str, Any]) -> list[tuple[str, str]]:
    """A trial on a subset of the input (input.limit_bytes), said as such."""
    trial = describe_sample(manifest.get("sample"))
    return [] if trial is None else [("sample", trial)]


def _files_fact(n: int, name: str, size: int) -> str:
    return f"{n:,} {name} file{'' if n == 1 else 's'}, {size / 2**20:,.1f} MiB"


def _store(manifest: dict[str, Any], units: int) -> list[tuple[str, str]]:
    """The token store the run read and filled (runs that used one)."""
    store = manifest.get("token_store")
    if not store:
        return []
    return [("token store", store_line(store, units))]


def _time(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """The command's time to the commit, and where its tasks ran (runs that recorded them)."""
    stages = sum(float(v) for v in doc.get("stage_seconds", {}).values())
    runner = doc.get("runner") or {}
    where = (
        f" on {runner['cpus']} {'local processes' if runner['name'] == 'local' else 'Ray CPUs'}"
        if runner
        else ""
    )
    if doc.get("command_seconds") is None:
        return [("time", f"{stages:.1f} s in the stages{where}")] if stages else []
    rest = doc["command_seconds"] - stages
    return [
        (
            "time",
            f"{doc['command_seconds']:.1f} s from the command's start to the commit{where} "
            f"({stages:.1f} s in the stages, {rest:.1f} s starting up and checking)",
        )
    ]


def _inputs(inputs: dict[str, Any], shards: int, entries: list[dict[str, Any]]) -> str:
    """The input line: its paths and format, or its sources (input.sources); its files and work
    units (a large file is several, a run of small files one), and the rows of Ray Datasets."""
    files = len({f["path"] for e in entries if "dataset" not in e for f in entry_files(e)})
    rows: dict[str, int] = {}
    for e in entries:
        if "dataset" in e:
            rows[e["dataset"]] = max(rows.get(e["dataset"], 0), e["rows"][1])
    parts = [f"{files:,} files"] if files else []
    parts += [
        f"a Ray Dataset of {n:,} rows" + (f" ({name})" if inputs.get("sources") else "")
        for name, n in rows.items()
    ]
    plural = "s" if shards != 1 else ""
    what = " and ".join(parts)
    units = what if files == shards and not rows else f"{what} in {shards:,} work unit{plural}"
    sources = inputs.get("sources") or []
    if sources:
        names = ", ".join(s["name"] for s in sources)
        return f"{len(sources)} sources: {names} ({units}; the mixture is below)"
    if rows:
        return units
    return ", ".join(inputs["paths"]) + f" ({inputs['format']}, {units})"


def _notes(doc: dict[str, Any], metrics: PackingMetrics, manifest: dict[str, Any]) -> tuple[str, ...]:
    notes = []
    fmt = manifest.get("format") or {}
    if fmt.get("stray_eos"):
        notes.append(
            f"{fmt['stray_eos']:,} EOS tokens lie inside documents, not at their ends: {fmt['name']}'s "
            "trainer, which finds documents by EOS, cuts a document at each."
        )
    source = manifest.get("converted_from")
    if source:
        notes.append(f"Converted from the {source['format']} dataset {source['path']} (raypack convert).")
    if doc.get("mode") == "sharded":
        notes.append(
            f"Sharded mode: {100 * metrics.efficiency:.4f}% efficiency, against "
            f"{100 * float(doc['global_bfd_efficiency']):.4f}% for one bfd plan over all shards."
        )
    if doc.get("comparison"):
        names = ", ".join(c["metrics"]["algorithm"] for c in doc["comparison"])
        notes.append(
            f"Compared (pack.compare): {names}, each planned on this corpus's item histogram at the same "
            f"seq_len and settings; plans only, the data holds the {metrics.algorithm} packs."
        )
    dup = doc.get("duplicate_ids") or {}
    if dup.get("ids"):
        examples = ", ".join(str(x) for x in dup.get("examples", [])[:5])
        notes.append(
            f"{dup['ids']:,} document ids are carried by {dup['documents']:,} documents (all packed), "
            f"e.g. {examples}."
        )
    return tuple(notes)


def _reject_examples(dataset: str, storage: StorageConfig | None, records: int) -> tuple[dict[str, Any], ...]:
    """The first rejects in shard order, rejected records first (what a user can mend), then those
    of documents packed in part or not at all (records 0: pack.overflow's, decompose's tails),
    reading only as many files as it takes: the record rejects' files alone until `records` (the
    manifest's rejected records) are found or _EXAMPLES shown."""
    found: list[dict[str, Any]] = []
    cut: list[dict[str, Any]] = []
    seen = 0
    names = sorted(i.base_name for i in list_dir(join(dataset, "rejects"), storage))
    # A unit's overflow rejects (its .overflow.parquet) are all of documents: after the others.
    ordered = [n for n in names if not n.endswith(".overflow.parquet")]
    ordered += [n for n in names if n.endswith(".overflow.parquet")]
    for name in ordered:
        if not name.endswith(".parquet"):
            continue
        if len(found) >= _EXAMPLES or (seen >= records and len(found) + len(cut) >= _EXAMPLES):
            break
        fs, inner = resolve(join(dataset, "rejects", name), storage)
        with fs.open_input_file(inner) as f:
            rows = pq.read_table(f).to_pylist()
        for row in rows:
            stands = int(row.get("records", 1))
            seen += stands
            (found if stands or row.get("lost_file") else cut).append(row)
    return tuple((found[:_EXAMPLES] + cut)[:_EXAMPLES])
