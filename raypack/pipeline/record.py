"""One record of a run: built once from the stages' results (run_record), and everything a run says
of itself is a view of it: manifest.json (manifest), metrics.json (metrics_document), the summary
`raypack pack` prints (raypack.summary), the report (drawn from those two files), and what run_job
returns (JobResult is this record). A new fact about a run is a field here and a key in the views
that show it, never a key patched into one of them afterwards.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from raypack import schema
from raypack._version import __version__
from raypack.config import JobConfig
from raypack.corpus.metadata import KINDS
from raypack.dataset.layout import METRICS
from raypack.dataset.manifest import dataset_files, format_entry, manifest_files
from raypack.metrics import FILL_BINS, LENGTH_BINS_PER_OCTAVE, DocStats, PackingMetrics, finalize_metrics
from raypack.packing import Plan
from raypack.pipeline.place.plan import plan_slots
from raypack.pipeline.place.select import Selection
from raypack.pipeline.prepare import Prepared
from raypack.pipeline.tokenize.stage import Tokenized
from raypack.pipeline.tokenize.summary import Totals
from raypack.pipeline.write.stage import Duplicates, Written

__all__ = [
    "MIXTURE_KEY",
    "RunRecord",
    "manifest",
    "metrics_document",
    "run_record",
]

# How a mixture keys documents (raypack.mixture.document_keys), for the manifest's readers.
MIXTURE_KEY = (
    "splitmix64(blake2b-64(f'{seed}\\0{relpath}') + row × 0x9E3779B97F4A7C15); subset: key < threshold"
)


@dataclass(frozen=True)
class RunRecord:
    """What a run read, how it tokenized, selected and packed, what it wrote, and what that took."""

    output: str
    config: JobConfig
    inputs: tuple[dict[str, Any], ...]
    """The manifest's `inputs`: a row a work unit (its file, size, mtime, range, source)."""
    tokenizer: dict[str, Any]
    """The manifest's `tokenizer`: path, sha256, BOS/EOS and where they came from, vocabulary, pad."""
    backend: dict[str, Any]
    """What encoded and what was checked (tokenize.Tokenized.backend_record)."""
    documents: int
    rejects: int
    """Rows of rejects/ (a lost file is one)."""
    rejected_records: int
    """Input records the rejects stand for (a lost file: its rows, or at least 1)."""
    lost_files: int
    reject_reasons: dict[str, int]
    shards_reused: int
    """Work units whose token files came from the cache (not tokenized by this run)."""
    token_keys: tuple[str, ...]
    """Cache keys of this run's token files, in unit order (a rebuild prunes the others)."""
    split_files: dict[str, dict[str, int]]
    """Files tokenized as several work units: how many units, on how many Ray nodes."""
    grouped_files: dict[str, int]
    """Runs of small files (input.group_bytes): {"units": runs, "files": files they hold}."""
    sources: list[dict[str, Any]]
    """A row a source (input.sources): asked, target, what it gave (raypack.pipeline.place.select)."""
    mixture: dict[str, Any] | None
    metadata: dict[str, Any] | None
    """input.metadata_fields: the fields the index keeps of each document and the type of each
    over the dataset (raypack.pipeline.tokenize.metadata); None where none is kept."""
    chat: dict[str, Any] | None
    """Chat data: the template, the mask, trained tokens in and out, conversations cut or dropped."""
    metrics: PackingMetrics
    global_efficiency: float
    """Efficiency of one global bfd plan over the same documents (the reference for sharded mode)."""
    comparison_rows: tuple[dict[str, Any], ...]
    """Plans of pack.compare on the same histogram (not written): metrics, fill, seconds."""
    document_lengths: dict[str, Any]
    pack_fill_percent: tuple[int, ...]
    files: list[dict[str, Any]]
    """The write tasks' WRITTEN rows, by path."""
    packs: int
    duplicates: Duplicates
    output_format: dict[str, Any]
    """The manifest's `format`: name, pad_id, dtype, eos_id, loss_mask, dataset files, stray_eos."""
    runner: dict[str, Any]
    """Where the tasks ran: {"name": "ray" or "local", "cpus": the CPUs they could use, "retried":
    tasks run again because their worker died (a local run counts them; Ray's are not counted)}."""
    format_files: dict[str, bytes]
    """The format's files of the whole dataset, by path (Megatron's data-args list, Bridge's pack
    metadata: bytes of the manifest's files, a few KB), written before the manifest."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    token_store: dict[str, Any] | None = None
    """The token store the run used (tokenize.Tokenized.store); None: its own staging area."""
    command_seconds: float | None = None
    """From the command's start (its process's, for `raypack pack`) to the commit; None for a job
    run by the API without a start time."""
    report: str | None = None
    """The report.html written next to the data; None if it could not be (the job's log says why)."""
    sample: dict[str, Any] | None = None
    """A trial on a subset (input.limit_bytes): what it took of the input (units, files, bytes) and
    of how much; None: the whole input."""

    @property
    def mode(self) -> str:
        return self.config.pack.mode

    @property
    def max_depth_cap(self) -> int | None:
        """pack.max_depth: the cap the packs were made under (None: none)."""
        return self.config.pack.max_depth

    @property
    def shards_tokenized(self) -> int:
        return len(self.inputs) - self.shards_reused

    @property
    def comparison(self) -> tuple[PackingMetrics, ...]:
        return tuple(PackingMetrics.from_dict(c["metrics"]) for c in self.comparison_rows)


def run_record(
    ready: Prepared,
    tokenized: Tokenized,
    selection: Selection | None,
    sources: list[dict[str, Any]],
    stats: DocStats,
    plan: Plan,
    comparison: list[dict[str, Any]],
    written: Written,
    stage_seconds: dict[str, float],
) -> RunRecord:
    """The record of a run, from its stages' results."""
    cfg, tok, pad, spec = ready.cfg, ready.tok, ready.pad, ready.spec
    totals, units, files = tokenized.totals, tokenized.units, written.files
    made = dataset_files(files, spec, cfg.output.path)
    fill = np.zeros(FILL_BINS, dtype=np.int64)
    for f in files:
        fill += np.asarray(f["fill_percent"], dtype=np.int64)
    global_slots = plan_slots(plan)
    slots = global_slots if cfg.pack.mode == "global" else written.packs * cfg.pack.seq_len
    depth = max((int(f["max_items"]) for f in files), default=0)
    split: dict[str, list[int]] = {}
    for u in units:
        if u.shard.split:
            split.setdefault(u.relpath, []).append(u.index)
    return RunRecord(
        output=cfg.output.path,
        config=cfg,
        inputs=tuple(u.manifest_entry() for u in units),
        tokenizer={
            "path": cfg.tokenizer.path,
            "sha256": tok.sha256,
            "bos_id": tok.bos_id,
            "eos_id": tok.eos_id,
            "bos_source": tok.bos_source,
            "eos_source": tok.eos_source,
            "vocab_size": tok.vocab_size,
            "max_id": tok.max_id,
            "pad_id": pad[0],
            "pad_source": pad[1],
        },
        backend=tokenized.backend_record(),
        documents=totals.documents,
        rejects=totals.rejects,
        rejected_records=totals.rejected_records,
        lost_files=totals.lost_files,
        reject_reasons=dict(sorted(totals.reasons.items())),
        shards_reused=totals.reused,
        token_keys=tuple(u.key for u in units),
        split_files={
            path: {"units": len(idx), "nodes": len({totals.nodes[i] for i in idx if totals.nodes[i]})}
            for path, idx in sorted(split.items())
        },
        grouped_files={
            "units": sum(1 for u in units if u.more),
            "files": sum(len(u.files) for u in units if u.more),
        },
        sources=sources,
        mixture=None
        if selection is None
        else {"seed": selection.seed, "key": MIXTURE_KEY, "sources": sources},
        metadata=_metadata_record(cfg, totals),
        chat=None if tokenized.chat is None else _chat_record(tokenized.chat, totals.trained, stats, files),
        metrics=finalize_metrics(stats, cfg.pack.algorithm, cfg.pack.seq_len, written.packs, slots, depth),
        global_efficiency=stats.tokens / global_slots if plan.num_packs else 1.0,
        comparison_rows=tuple(comparison),
        document_lengths=_length_distribution(stats),
        pack_fill_percent=tuple(fill.tolist()),
        files=files,
        packs=written.packs,
        duplicates=written.duplicates,
        output_format=format_entry(files, spec, made),
        format_files=made,
        runner={"name": ready.runner.name, "cpus": ready.runner.width, "retried": ready.runner.retried},
        stage_seconds=stage_seconds,
        token_store=tokenized.store,
        sample=_sample_record(cfg.input.limit_bytes, units, ready.files),
    )


def _sample_record(limit: int | None, units: Sequence[Any], files: Sequence[Any]) -> dict[str, Any] | None:
    """What a trial took of the input: its units, files and bytes against the whole input's."""
    if limit is None:
        return None
    return {
        "limit_bytes": limit,
        "units": len(units),
        "files": len({path for u in units for path in u.relpaths}),
        "bytes": sum(u.size for u in units),
        "of_files": len(files),
        "of_bytes": sum(f.size for f in files),
    }


def manifest(record: RunRecord) -> dict[str, Any]:
    """manifest.json: what the dataset is (verify, the reader, convert and a rebuild read it)."""
    buckets: dict[int, int] = {}
    for f in record.files:
        buckets[int(f["bucket_length"])] = buckets.get(int(f["bucket_length"]), 0) + int(f["rows"])
    m = record.metrics
    out: dict[str, Any] = {
        "schema_version": schema.OUTPUT_SCHEMA_VERSION,
        "raypack_version": __version__,
        "config": record.config.to_dict(),
        "inputs": list(record.inputs),
        "tokenizer": record.tokenizer | {"backend": record.backend},
        # Where the token files came from, and how many units were found there (None: tokenized
        # into the job's own staging area).
        "token_store": record.token_store,
        "counts": {
            "shards": len(record.inputs),
            "documents": record.documents,
            "rejects": record.rejects,
            "items": m.items,
            "packs": record.packs,
            "tokens": m.tokens,
            "rejects_by_reason": record.reject_reasons,
            "rejected_records": record.rejected_records,
            "lost_files": record.lost_files,
            "duplicate_ids": record.duplicates.ids,
            "documents_with_duplicate_ids": record.duplicates.documents,
        },
        "buckets": [{"length": k, "packs": v} for k, v in sorted(buckets.items())],
        "files": manifest_files(record.files),
        "metrics": METRICS,
        "format": record.output_format,
    }
    if record.chat is not None:
        out["chat"] = {k: v for k, v in record.chat.items() if k != "trained_percent"}
    if record.mixture is not None:
        out["mixture"] = record.mixture
    if record.sample is not None:  # a trial: not the whole corpus
        out["sample"] = record.sample
    if record.metadata is not None:
        out["metadata"] = record.metadata
    return out


def _metadata_record(cfg: JobConfig, totals: Totals) -> dict[str, Any] | None:
    """The manifest's `metadata`: the index's metadata fields in order and each one's Arrow type."""
    fields = cfg.input.metadata_columns
    if not fields:
        return None
    kinds = totals.metadata(fields)
    return {
        "column": schema.METADATA,
        "fields": list(fields),
        "types": {f: str(KINDS[kinds[f]]) for f in fields},
    }


def metrics_document(record: RunRecord) -> dict[str, Any]:
    """metrics.json: how the packing went (the report draws it)."""
    return {
        "metrics": record.metrics.to_dict(),
        "mode": record.mode,
        "format": record.output_format["name"],
        "sources": record.sources,
        "sample": record.sample,
        "chat": record.chat,
        "global_bfd_efficiency": record.global_efficiency,
        "stage_seconds": record.stage_seconds,
        "command_seconds": record.command_seconds,
        "runner": record.runner,
        "shards": {"reused": record.shards_reused, "tokenized": record.shards_tokenized},
        "token_store": record.token_store,
        "rejects_by_reason": record.reject_reasons,
        "rejected_records": record.rejected_records,
        "lost_files": record.lost_files,
        "duplicate_ids": dataclasses.asdict(record.duplicates),
        "split_files": record.split_files,
        "grouped_files": record.grouped_files,
        "document_lengths": record.document_lengths,
        "pack_fill_percent": list(record.pack_fill_percent),
        "comparison": list(record.comparison_rows),
    }


def _length_distribution(stats: DocStats) -> dict[str, Any]:
    bins = [b for b, n in enumerate(stats.length_bins) if n]
    return {
        "bins_per_octave": LENGTH_BINS_PER_OCTAVE,
        "bins": bins,
        "documents": [stats.length_bins[b] for b in bins],
    }


def _chat_record(
    chat: dict[str, Any], trained: int, stats: DocStats, files: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a chat job reports: its template and mask, conversations truncated or dropped by
    pack.overflow, trained tokens before packing and in the packs (the share lost), and the packs
    by trained tokens in whole percent of their capacity (loss per pack follows it)."""
    trained_out = sum(int(f["trained"]) for f in files)
    per_pack = np.zeros(FILL_BINS, dtype=np.int64)
    for f in files:
        per_pack += np.asarray(f["trained_percent"], dtype=np.int64)
    lost = trained - trained_out
    return chat | {
        "conversations": stats.documents,
        "truncated": stats.truncated,
        "dropped": stats.documents - stats.documents_present,
        "tokens_lost": stats.input_tokens - stats.tokens,
        "trained_tokens": trained,
        "trained_tokens_packed": trained_out,
        "trained_tokens_lost": lost,
        "trained_share_lost": lost / trained if trained else 0.0,
        "trained_percent": per_pack.tolist(),
    }
