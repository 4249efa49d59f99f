"""The job: the one module that wires the job's Ray stages together (raypack.pipeline.tokenize_pool
runs the tokenize tasks; raypack.reader's read_packed reads a finished dataset with Ray Data).

    input files ─work_units (large JSONL: scan tasks count lines)─▶ shards (files, or units of one)
    shards ─TokenizeShards on TokenizePool's tasks─▶ token files + per-shard histograms (tokenize, once)
    per-shard histograms ─folded as they arrive (driver)─▶ one histogram per run of shards ─▶ plan
    runs of shards ─assign tasks─▶ pieces ─(merge tasks)─▶ write tasks, a range of files each ─▶ data/
        (raypack.pipeline.exchange: Ray tasks of bounded fan-out, the duplicate-id check folded in)

then metrics.json, and manifest.json last: a dataset is complete only when its manifest exists.
Token files live in `<output>/_staging/tokens/` (removed at the end), or in a cache directory that a
rebuild keeps (raypack.pipeline.rebuild), one per input shard under a key of its fingerprint and the
tokenization settings, so an unchanged shard is never tokenized twice.
The driver holds the shard list (~200 bytes a shard), one histogram per run of shards (runs <= the
cluster's CPUs: runs × (seq_len + 1) int64), the plan (O(seq_len²)), one WRITTEN row per output file
(~1 KB) and the exchange's object references (~3 KB each, raypack.pipeline.exchange counts them);
documents and tokens never pass through it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import date
from functools import partial
from typing import Any

import numpy as np

from raypack import __version__, schema
from raypack.chat import ChatTemplate
from raypack.config import JobConfig, StorageConfig
from raypack.errors import ConfigError, JobError, StorageError, storage_cause
from raypack.formats import INDEX_DIR, Spec, group_of, make_spec, settings_of, stem_of_file
from raypack.formats.bridge import METADATA as BRIDGE_METADATA
from raypack.formats.megatron import DATA_ARGS
from raypack.formats.olmo import MASK_DIR
from raypack.metrics import (
    FILL_BINS,
    LENGTH_BINS_PER_OCTAVE,
    DocStats,
    PackingMetrics,
    fill_percent_counts,
    finalize_metrics,
)
from raypack.packing import ALGORITHMS, Plan
from raypack.pipeline.assign import Buckets, file_key
from raypack.pipeline.backends import (
    Choice,
    choose_backend,
    failed_over,
    remember_failover,
    remembered_failover,
)
from raypack.pipeline.exchange import (
    ITEM_BYTES,
    check_index_ids,
    layout,
    run_exchange,
    shard_runs,
    task_options,
    transient,
)
from raypack.pipeline.histogram import Totals
from raypack.pipeline.materialize import data_file
from raypack.pipeline.read import input_files, scan_range, work_units
from raypack.pipeline.readers import read_unit
from raypack.pipeline.select import Selection, plan_selection, run_selection, source_table
from raypack.pipeline.sharded import write_sharded
from raypack.pipeline.tokenize import (
    LoadedTokenizer,
    TokenizeShards,
    cached_rejects_file,
    chat_template,
    load_tokenizer,
    token_key,
    token_settings,
)
from raypack.pipeline.tokenize_pool import TokenizePool
from raypack.pipeline.tokenizer import tokenizer_files
from raypack.pipeline.units import WorkUnit
from raypack.report.model import REPORT
from raypack.storage import (
    Shard,
    exists,
    join,
    remove,
    remove_temporaries,
    write_bytes,
    write_bytes_atomic,
)
from raypack.versions import LATEST, MANIFEST

__all__ = [
    "JobError",
    "JobResult",
    "check_output",
    "clear_output",
    "ensure_ray",
    "manifest_files",
    "output_spec",
    "run_job",
    "write_dataset_files",
    "write_report_safely",
]

METRICS = "metrics.json"
# How a mixture keys documents (raypack.mixture.document_keys), for the manifest's readers.
MIXTURE_KEY = (
    "splitmix64(blake2b-64(f'{seed}\\0{relpath}') + row × 0x9E3779B97F4A7C15); subset: key < threshold"
)
# Everything a job writes under its output (formats' own files included), removed before it starts.
_OUTPUT_PARTS = (
    MANIFEST,
    METRICS,
    REPORT,
    "data",
    INDEX_DIR,
    MASK_DIR,
    DATA_ARGS,
    BRIDGE_METADATA,
    "index",
    "rejects",
    "_staging",
)


@dataclass(frozen=True)
class Duplicates:
    """Document ids (input.id_field) that more than one document carries: reported, all packed."""

    ids: int = 0
    documents: int = 0
    """Documents carrying one of those ids."""
    examples: tuple[str, ...] = ()
    """The first _EXAMPLES of them, in id order (every occurrence is in index/)."""


@dataclass
class JobResult:
    output: str
    metrics: PackingMetrics
    documents: int
    rejects: int
    files: list[dict[str, Any]]
    mode: str
    global_efficiency: float
    """Efficiency of one global bfd plan over the same documents (the reference for sharded mode)."""
    stage_seconds: dict[str, float] = field(default_factory=dict)
    shards_reused: int = 0
    """Shards whose token files came from the cache (not tokenized by this run)."""
    shards_tokenized: int = 0
    token_keys: tuple[str, ...] = ()
    """Cache keys of this run's token files, in shard order (a rebuild prunes the others)."""
    reject_reasons: dict[str, int] = field(default_factory=dict)
    """Rejects by kind of reason."""
    rejected_records: int = 0
    """Input records the rejects stand for (a lost file: its rows, or at least 1)."""
    lost_files: int = 0
    """Input files lost whole or in part (each one of the rejects; allowed by input.max_lost_files)."""
    duplicates: Duplicates | None = None
    report: str | None = None
    """The report.html written next to the data; None if it could not be (the job's log says why)."""
    comparison: tuple[PackingMetrics, ...] = ()
    """Metrics of the plans of pack.compare (on the same histogram; not written)."""
    backend: dict[str, Any] = field(default_factory=dict)
    """What encoded (raypack.pipeline.backends): as the manifest's tokenizer.backend records it."""
    sources: list[dict[str, Any]] = field(default_factory=list)
    """A row a source (input.sources): asked, target, what it gave (raypack.pipeline.select)."""
    max_depth_cap: int | None = None
    """pack.max_depth: the cap the packs were made under (None: none)."""
    output_format: dict[str, Any] = field(default_factory=dict)
    chat: dict[str, Any] | None = None
    """Chat data (input.messages_field / prompt_field): the template, the mask, trained tokens in
    and out, conversations truncated or dropped (chat_record)."""
    """The manifest's `format`: name, pad_id, dtype, eos_id, dataset-level files, stray_eos."""


@contextmanager
def _stage(timings: dict[str, float], name: str, log: Callable[[str], None]) -> Iterator[None]:
    log(f"[raypack] {name} ...")
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0


def _cluster_cpus() -> int:
    """The cluster's CPUs: the tokenize tasks' default count and the exchange's width."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def ensure_ray() -> None:
    """Connect to RAY_ADDRESS when set, else start local Ray (once per process). A local Ray lives as
    long as the command, so it starts without its dashboard (a process of its own; ray.init took
    4.2 s without it against 5.2 s with, mean of 4 alternating starts on 2 cores) unless
    RAYPACK_DASHBOARD=1."""
    import ray

    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS") or None
        dashboard = None if address else os.environ.get("RAYPACK_DASHBOARD") == "1"
        # Ray turns token authentication on for a local cluster it starts, and says so in a WARNING
        # on every command (RAY_AUTH_MODE set by the user says nothing): the mode stays, the line goes.
        notice = logging.getLogger("ray._private.authentication.authentication_token_setup")
        level = notice.level
        notice.setLevel(logging.ERROR)
        try:
            ray.init(address=address, logging_level=logging.WARNING, include_dashboard=dashboard)
        finally:
            notice.setLevel(level)


def run_job(
    cfg: JobConfig,
    *,
    overwrite: bool = False,
    cache: str | None = None,
    log: Callable[[str], None] = print,
    release_ray: bool = False,
    memory: str | None = None,
) -> JobResult:
    """Pack the corpus into cfg.output.path. `cache`: a directory of token files to reuse and keep
    (a rebuild's); None: tokenize everything into a staging area that is removed at the end.
    `memory`: a file where a rebuild's root keeps what runs learnt of the backends (a fast one that
    gave other ids is not chosen again there).
    `release_ray`: shut Ray down (or disconnect) once the manifest is written (`raypack pack`).
    A storage failure that outlived every retry is raised as a StorageError (one line), whatever
    wrapper Ray put around it."""
    try:
        return _run_job(cfg, overwrite, cache, log, release_ray, memory)
    except (ConfigError, JobError):
        raise
    except Exception as e:
        cause = storage_cause(e)
        if cause is None or isinstance(e, StorageError):
            raise
        raise StorageError(cause) from e


def _run_job(
    cfg: JobConfig,
    overwrite: bool,
    cache: str | None,
    log: Callable[[str], None],
    release_ray: bool,
    memory: str | None,
) -> JobResult:
    timings: dict[str, float] = {}
    cfg = dataclasses.replace(cfg, storage=cfg.storage.from_environment())
    out, storage = cfg.output.path, cfg.storage
    # Everything that can be wrong with the config or the environment fails here, before any work:
    # the missing tokenizer, inputs or output (the common mistakes) before Ray starts, the rest as
    # the tokenizer is parsed, beside Ray's start (3-4 s, mostly waiting on its processes; a 128k
    # vocabulary takes 0.3-0.5 s to parse).
    tokenizer = tokenizer_files(cfg.tokenizer, storage)
    inputs = input_files(cfg.input, storage)
    check_output(out, storage, overwrite)
    with ThreadPoolExecutor(1, thread_name_prefix="raypack-tokenizer") as loader:
        loading = loader.submit(load_tokenizer, cfg.tokenizer, storage, tokenizer, framed=cfg.framed)
        ensure_ray()
        tok = loading.result()
    cfg = _fix_chat_date(cfg, tok, log)
    # An embedding lookup of pad_id would fail (or read past the table) in the trainer.
    pad_id, pad_source = tok.pad(cfg.output.pad_id)
    if pad_source == "output.pad_id" and pad_id == tok.bos_id:
        log(f"[raypack] note: output.pad_id {pad_id} is the tokenizer's BOS")
    spec = output_spec(cfg, tok, pad_id)
    clear_output(out, storage)
    staging = join(out, "_staging")
    token_dir = cache if cache is not None else join(staging, "tokens")
    # Work units first: a large JSONL file's line-count scan runs on Ray tasks of a CPU each, which
    # would queue behind the preload tasks (with actors holding every CPU, forever: test_s3 hung).
    shards = work_units(inputs, cfg.input.unit_bytes, storage, scan=partial(_scan_ranges, storage=storage))
    # The tokenize workers start loading now, beside the driver's checks below.
    width = _cluster_cpus()
    concurrency = cfg.tokenizer.concurrency or width
    fast = cfg.tokenizer.backend != "tokenizers" and not cfg.input.chat  # chat data: tokenizers
    pool = TokenizePool(cfg, min(concurrency, len(shards)), fast, capped=concurrency < width)
    try:
        return _run_stages(
            cfg,
            tok,
            spec,
            (pad_id, pad_source),
            shards,
            token_dir,
            pool,
            width,
            timings,
            log,
            release_ray,
            memory,
        )
    finally:
        pool.close()


def _run_stages(
    cfg: JobConfig,
    tok: LoadedTokenizer,
    spec: Spec,
    pad: tuple[int, str],
    shards: list[WorkUnit],
    token_dir: str,
    pool: TokenizePool,
    width: int,
    timings: dict[str, float],
    log: Callable[[str], None],
    release_ray: bool,
    memory: str | None,
) -> JobResult:
    out, storage = cfg.output.path, cfg.storage
    staging = join(out, "_staging")
    template = chat_template(cfg, tok)  # conversations only: compiled once, checked, keyed
    chat = _check_chat(cfg, template, shards)
    if chat is not None:
        from raypack.pipeline.backends import TokenizersEncoder

        version = TokenizersEncoder(tok.tokenizer).version
        choice = Choice(
            "tokenizers", version, "chat data: the loss mask needs each token's character offsets"
        )
        log(f"[raypack] chat template: {chat['template']} ({chat['mask']})")
    else:
        remembered = remembered_failover(memory, cfg.tokenizer.backend, tok, storage) if memory else None
        sample = partial(_corpus_sample, shards, cfg)
        choice = remembered or choose_backend(cfg.tokenizer.backend, tok, sample, pool.fast_encoder)
    log(f"[raypack] tokenizer backend: {choice.label} ({choice.reason})")
    runs = max(1, min(len(shards), width))
    weights = _unit_bytes(shards)
    # Largest first: the last units to start are the shortest, so workers finish close together (the
    # summaries are folded in any order; nothing downstream depends on it).
    order = sorted(range(len(shards)), key=lambda i: -weights[i])

    def tokenize(choice: Choice) -> tuple[list[WorkUnit], Totals, list[WorkUnit]]:
        """Every unit keyed for `choice` and tokenized; with fastokens, submitting stops at the
        first unit whose check found a difference. The units, their totals, and the token files
        this pass wrote."""
        settings = {s.source: token_settings(cfg, tok, s.reading, choice, template) for s in shards}
        keyed = [s.with_token_file(token_dir, token_key(s, settings[s.source])) for s in shards]
        totals = Totals(shard_runs(weights, runs), runs, cfg.pack.seq_len, [s.source for s in keyed])
        written: list[WorkUnit] = []

        def add(summary: dict[str, Any]) -> None:
            totals.add(summary)
            if not summary["cached"]:
                written.append(keyed[int(summary["shard"])])

        # Summaries are folded as they arrive: no list of every shard's histogram.
        pool.run(
            [keyed[i] for i in order],
            TokenizeShards,
            choice.backend,
            add,
            stop=lambda: bool(totals.failovers),
        )
        return keyed, totals, written

    with (
        _stage(timings, "tokenize", log),
        ThreadPoolExecutor(1, thread_name_prefix="raypack-plan") as warming,
    ):
        # The planner's compiled functions load from numba's cache (0.3 s on a first call) while the
        # workers tokenize, instead of after them with every core idle but the driver's.
        warming.submit(_warm_planner, cfg)
        shards, totals, written = tokenize(choice)
        failovers = list(totals.failovers)
        if failovers and choice.backend != "tokenizers":
            # A proven difference: nothing the fast backend wrote in this run may reach the output,
            # whichever units the sampled checks happened to catch. Every unit is tokenized again
            # with tokenizers (under tokenizers' keys; its earlier files reused), and a rebuild's
            # root remembers not to choose the fast backend again.
            log(
                f"[raypack] {choice.backend} gave other ids than tokenizers: {failovers[0]}; tokenizing again"
            )
            for unit in written:
                remove(unit.token_file, storage)
                remove(cached_rejects_file(unit.token_file), storage)
            remove(join(out, "rejects"), storage)
            if memory:
                remember_failover(memory, choice, tok, failovers[0], storage)
            choice = failed_over(choice, tok, failovers[0])
            shards, totals, _ = tokenize(choice)
    totals.check_complete()
    keys = tuple(s.key for s in shards)
    reused, documents, rejects, reasons = totals.reused, totals.documents, totals.rejects, totals.reasons
    lost = {"rejected_records": totals.rejected_records, "lost_files": totals.lost_files}
    _check_rejects(cfg, documents, totals.rejected_records, totals.lost_files, reasons, staging)
    selection: Selection | None = None
    sources: list[dict[str, Any]] = []
    if cfg.input.mixture:
        with _stage(timings, "select", log):
            try:
                selection = plan_selection(cfg, shards, totals)
            except ConfigError:
                remove(staging, storage)
                raise
            sources = source_table(selection, run_selection(cfg, shards, totals, selection))
        log("[raypack] sources: " + "; ".join(f"{r['name']} {r['share']:.1%}" for r in sources))

    with _stage(timings, "histogram", log):
        hist, stats = totals.histogram(), totals.stats
    if stats.items == 0 and selection is not None and not any(r["copies"] for r in sources):
        remove(staging, storage)
        raise JobError(
            "nothing to pack: the mixture selected no document (every source's target is 0 tokens)"
        )
    if stats.items == 0:  # only overflow: drop can place nothing (every document gives an item otherwise)
        remove(staging, storage)
        raise JobError(
            f"nothing to pack: all {documents:,} documents are longer than pack.seq_len "
            f"({cfg.pack.seq_len:,}) and pack.overflow is drop; use overflow: split or truncate, or a "
            "larger seq_len"
        )

    with _stage(timings, "plan", log):
        plan = _planner(cfg)(hist)

    comparison = []
    if cfg.pack.compare:
        with _stage(timings, "compare", log):
            comparison = _compare(cfg, hist, stats)

    token_shards = shards
    with _stage(timings, "assign+write", log):
        if cfg.pack.mode == "sharded":
            files = write_sharded(cfg, spec, token_shards, selection)
            duplicates = _sharded_ids(cfg, totals, width) if cfg.input.id_fields else Duplicates()
        else:
            files, duplicates = _write_global(cfg, spec, plan, totals, token_shards, width, log, selection)
    if duplicates.ids:
        log(f"[raypack] note: {duplicates.ids:,} ids are carried by {duplicates.documents:,} documents")
    files = sorted(files, key=lambda f: f["path"])
    planned = (
        _planned_files(cfg, spec, plan) if cfg.pack.mode == "global" else _sharded_files(cfg, spec, files)
    )
    _check_commit(files, planned, stats.items, stats.tokens)
    packs = sum(planned.values())
    fill = np.zeros(FILL_BINS, dtype=np.int64)
    for f in files:
        fill += np.asarray(f["fill_percent"], dtype=np.int64)
    plan_slots = _slots(plan)
    slots = plan_slots if cfg.pack.mode == "global" else packs * cfg.pack.seq_len
    depth = max((int(f["max_items"]) for f in files), default=0)
    metrics = finalize_metrics(stats, cfg.pack.algorithm, cfg.pack.seq_len, packs, slots, depth)
    global_efficiency = stats.tokens / plan_slots if plan.num_packs else 1.0
    chat_record = _chat_record(chat, totals, stats, files) if chat is not None else None
    with _stage(timings, "finalize", log):
        remove(staging, storage)
        write_bytes(
            join(out, METRICS),
            json.dumps(
                {
                    "metrics": metrics.to_dict(),
                    "mode": cfg.pack.mode,
                    "format": spec.name,
                    "sources": sources,
                    "chat": chat_record,
                    "global_bfd_efficiency": global_efficiency,
                    "stage_seconds": timings,
                    "shards": {"reused": reused, "tokenized": len(shards) - reused},
                    "rejects_by_reason": dict(sorted(reasons.items())),
                    **lost,
                    "duplicate_ids": dataclasses.asdict(duplicates),
                    "split_files": _split_files(shards, totals.nodes),
                    "document_lengths": _length_distribution(stats),
                    "pack_fill_percent": fill.tolist(),
                    "comparison": comparison,
                },
                indent=2,
            ).encode(),
            storage,
        )
        backend = _backend_record(choice, totals, failovers)
        output_format = write_dataset_files(files, spec, out, storage)
        manifest = _manifest(
            cfg, shards, tok, pad, packs, files, documents, rejects, stats.items, stats.tokens
        )
        manifest["format"] = output_format
        if chat_record is not None:
            manifest["chat"] = {k: v for k, v in chat_record.items() if k != "trained_percent"}
        if selection is not None:
            manifest["mixture"] = {"seed": selection.seed, "key": MIXTURE_KEY, "sources": sources}
        manifest["tokenizer"]["backend"] = backend
        manifest["counts"]["rejects_by_reason"] = dict(sorted(reasons.items()))
        manifest["counts"].update(lost)
        manifest["counts"]["duplicate_ids"] = duplicates.ids
        manifest["counts"]["documents_with_duplicate_ids"] = duplicates.documents
        write_bytes_atomic(join(out, MANIFEST), json.dumps(manifest, indent=2).encode(), storage)
    if release_ray:
        # The report's drawing (~1.8 s) beside Ray's shutdown (~1.4 s, mostly waiting for its
        # processes to exit): the dataset is committed, Ray has nothing left to do.
        import ray

        with ThreadPoolExecutor(1) as drawing:
            drawn = drawing.submit(write_report_safely, out, storage, log)
            ray.shutdown()
            report = drawn.result()
    else:
        report = write_report_safely(out, storage, log)
    return JobResult(
        out,
        metrics,
        documents,
        rejects,
        files,
        cfg.pack.mode,
        global_efficiency,
        timings,
        shards_reused=reused,
        shards_tokenized=len(shards) - reused,
        token_keys=keys,
        reject_reasons=dict(sorted(reasons.items())),
        rejected_records=totals.rejected_records,
        lost_files=totals.lost_files,
        duplicates=duplicates,
        report=report,
        comparison=tuple(PackingMetrics.from_dict(c["metrics"]) for c in comparison),
        backend=backend,
        sources=sources,
        chat=chat_record,
        max_depth_cap=cfg.pack.max_depth,
        output_format=output_format,
    )


def output_spec(cfg: JobConfig, tok: LoadedTokenizer, pad_id: int) -> Spec:
    """The output format's Spec for this config and tokenizer (a ConfigError, before any work, for a
    config the format's trainer cannot read right)."""
    return make_spec(cfg.output.format, settings_of(cfg, tok.eos_id, tok.max_id, pad_id))


def write_dataset_files(
    files: list[dict[str, Any]], spec: Spec, out: str, storage: StorageConfig | None
) -> dict[str, Any]:
    """The format's files of the whole dataset (written before the manifest, which lists them), and
    the manifest's `format` entry."""
    import hashlib

    extra = []
    for path, data in spec.format.dataset_files(files, spec, out).items():
        write_bytes(join(out, path), data, storage)
        extra.append({"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    return {**spec.to_dict(), "files": extra, "stray_eos": sum(int(f.get("stray_eos", 0)) for f in files)}


# The self-check's corpus sample: the first documents of up to SAMPLE_UNITS work units spread over the
# corpus, SAMPLE_CHARS of text from each (512 KB in all: ~0.3 s of tokenizers on the driver).
SAMPLE_UNITS = 4
SAMPLE_CHARS = 128 << 10


def _sample_units(shards: list[WorkUnit]) -> list[WorkUnit]:
    """Up to SAMPLE_UNITS work units spread evenly over the corpus, first and last included."""
    if not shards:
        return []
    picks = sorted({round(k * (len(shards) - 1) / max(SAMPLE_UNITS - 1, 1)) for k in range(SAMPLE_UNITS)})
    return [shards[i] for i in picks]


def _corpus_sample(shards: list[WorkUnit], cfg: JobConfig) -> list[str]:
    """Texts of the corpus for the backend self-check."""
    texts: list[str] = []
    for shard in _sample_units(shards):
        taken = 0
        for batch in read_unit(shard, 64, cfg.storage):
            for text in batch.texts:
                if taken >= SAMPLE_CHARS:
                    break
                texts.append(text[: SAMPLE_CHARS - taken])
                taken += len(texts[-1])
            if taken >= SAMPLE_CHARS:
                break
    return texts


def _chat_record(
    chat: dict[str, Any], totals: Totals, stats: Any, files: list[dict[str, Any]]
) -> dict[str, Any]:
    """What a chat job reports: its template and mask, conversations truncated or dropped by
    pack.overflow, trained tokens before packing and in the packs (the share lost), and the packs
    by trained tokens in whole percent of their capacity (loss per pack follows it)."""
    trained_out = sum(int(f["trained"]) for f in files)
    per_pack = np.zeros(FILL_BINS, dtype=np.int64)
    for f in files:
        per_pack += np.asarray(f["trained_percent"], dtype=np.int64)
    lost = totals.trained - trained_out
    return chat | {
        "conversations": stats.documents,
        "truncated": stats.truncated,
        "dropped": stats.documents - stats.documents_present,
        "tokens_lost": stats.input_tokens - stats.tokens,
        "trained_tokens": totals.trained,
        "trained_tokens_packed": trained_out,
        "trained_tokens_lost": lost,
        "trained_share_lost": lost / totals.trained if totals.trained else 0.0,
        "trained_percent": per_pack.tolist(),
    }


# Conversations of the corpus the chat self-check renders beside the probes: the first of each of up
# to SAMPLE_UNITS work units.
CHAT_SAMPLE = 32


def _check_chat(
    cfg: JobConfig, template: ChatTemplate | None, shards: list[WorkUnit]
) -> dict[str, Any] | None:
    """Chat data: render the probes and a corpus sample with the template as the job will (a
    ConfigError, before any work, for a template that is not prefix-stable on any of them); what the
    manifest and summary say of it. None for plain text."""
    from raypack.chat import PROBES, check_template

    if cfg.input.chat is None:
        return None
    info: dict[str, Any] = {"kind": cfg.input.chat, "loss": cfg.loss}
    if template is None:  # prompt/completion pairs: no template
        return info | {"template": "none (prompt + completion)", "mask": f"pack.loss {cfg.loss}"}
    sample: list[tuple[list[dict[str, Any]], Any]] = [(list(p), None) for p in PROBES]
    for shard in _sample_units(shards):
        for batch in read_unit(shard, CHAT_SAMPLE, cfg.storage):
            sample += [(list(c.messages), c.tools) for c in batch.texts[:CHAT_SAMPLE]]
            break
    found = check_template(template, sample, cfg.loss)
    if found.failure is not None:
        raise ConfigError(found.failure)
    if cfg.loss == "all":
        mask = "pack.loss all: every token"
    elif template.markers:
        mask = "assistant tokens from its {% generation %} markers"
    else:
        mask = "assistant turns found by rendering growing prefixes (prefix-stable on the probes and sample)"
    date = cfg.tokenizer.chat_date if template.prints_date else None
    return info | {"template": template.origin, "mask": mask, "checked": found.rendered, "date": date}


def _fix_chat_date(cfg: JobConfig, tok: LoadedTokenizer, log: Callable[[str], None]) -> JobConfig:
    """cfg with tokenizer.chat_date set when its chat template prints the date and none was given:
    today's, once, on the driver (every worker renders with it; the manifest records it; a rebuild
    passes its root's on, raypack.pipeline.rebuild)."""
    template = chat_template(cfg, tok)
    if template is None or not template.prints_date or cfg.tokenizer.chat_date is not None:
        return cfg
    today = date.today().isoformat()
    log(f"[raypack] the chat template prints the date: {today} for every conversation (tokenizer.chat_date)")
    return dataclasses.replace(cfg, tokenizer=dataclasses.replace(cfg.tokenizer, chat_date=today))


def _backend_record(choice: Choice, totals: Totals, failovers: list[str]) -> dict[str, Any]:
    """The manifest's and the summary's account of what encoded and what was checked (`choice`: what
    finished the job; after a failover, the fast backend's choice is in `failed_over`)."""
    return {
        "chosen": (choice.failed_over or choice).label,
        "reason": (choice.failed_over or choice).reason,
        "self_check": {"probes": choice.probes, "corpus_texts": choice.sampled},
        "units_by_backend": dict(sorted(totals.encoded_by.items())),
        "checked_in_run": {"texts": totals.checked_texts, "bytes": totals.checked_bytes},
        "failovers": failovers,
        "finished_on": choice.backend,
    }


def _scan_ranges(ranges: list[tuple[Shard, int, int]], storage: StorageConfig) -> list[tuple[int, int]]:
    """read.scan_range over the byte ranges of large JSONL files, a Ray task each (32 for 8 GiB at
    the default unit_bytes), retried as the exchange's storage tasks are."""
    import ray

    patterns, opts = task_options()
    task = ray.remote(_scan).options(**opts)
    return list(ray.get([task.remote(s, a, b, storage, patterns) for s, a, b in ranges]))


def _scan(
    shard: Shard, start: int, stop: int, storage: StorageConfig, patterns: tuple[str, ...] | None
) -> tuple[int, int]:
    with transient(patterns):
        return scan_range(shard, start, stop, storage)


def _unit_bytes(shards: list[WorkUnit]) -> list[int]:
    """Input bytes of each work unit: a byte range's length, a Parquet unit's share of its file (its
    row groups' sizes are not kept), else the file's size."""
    units: Counter[str] = Counter(s.relpath for s in shards)
    return [
        s.shard.unit_stop - s.shard.unit_start
        if s.shard.split and s.reading.format == "jsonl"
        else s.shard.size // units[s.relpath]
        for s in shards
    ]


def _split_files(shards: list[WorkUnit], nodes: list[str]) -> dict[str, dict[str, int]]:
    """Files tokenized as several work units: how many units, on how many Ray nodes."""
    units: dict[str, list[int]] = {}
    for s in shards:
        if s.shard.split:
            units.setdefault(s.relpath, []).append(s.index)
    return {
        path: {"units": len(idx), "nodes": len({nodes[i] for i in idx if nodes[i]})}
        for path, idx in sorted(units.items())
    }


def _compare(cfg: JobConfig, hist: np.ndarray, stats: DocStats) -> list[dict[str, Any]]:
    """Plan every packer of pack.compare on the job's item histogram (plans only: nothing is written),
    for the comparison table. Each costs a plan, seconds at most, and O(packs) driver memory for the
    fill of its packs (8 bytes a pack: ~100 MB for 12M packs), freed before the next."""
    out = []
    for c in cfg.pack.compared():
        planner = ALGORITHMS[c.algorithm].plan
        assert planner is not None  # PackConfig.compared admits histogram packers only
        t0 = time.perf_counter()
        plan = planner(hist, c.seq_len, **c.algorithm_options())
        seconds = time.perf_counter() - t0
        depth = int(plan.pack_depth().max(initial=0))
        metrics = finalize_metrics(stats, c.algorithm, c.seq_len, plan.num_packs, _slots(plan), depth)
        fill = fill_percent_counts(plan.pack_load(), plan.pack_capacity())
        row = {"metrics": metrics.to_dict(), "pack_fill_percent": fill.tolist(), "plan_seconds": seconds}
        out.append(row)
    return out


def _length_distribution(stats: DocStats) -> dict[str, Any]:
    bins = [b for b, n in enumerate(stats.length_bins) if n]
    return {
        "bins_per_octave": LENGTH_BINS_PER_OCTAVE,
        "bins": bins,
        "documents": [stats.length_bins[b] for b in bins],
    }


def _planner(cfg: JobConfig) -> Callable[[np.ndarray], Plan]:
    """The plan stage's planner, histogram → Plan. Sharded mode plans per group, inside its task; the
    global bfd plan is made anyway, to report the efficiency the sharding costs."""
    name = cfg.pack.algorithm if cfg.pack.mode == "global" else "bfd"
    planner = ALGORITHMS[name].plan
    if planner is None:  # JobConfig admits histogram packers only in global mode
        raise ConfigError(f"{name} cannot plan from a histogram")
    options = cfg.pack.algorithm_options() if cfg.pack.mode == "global" else {}
    return partial(planner, seq_len=cfg.pack.seq_len, **options)


def _warm_planner(cfg: JobConfig) -> None:
    """The plan stage's planner run once on a histogram of three items (what loads its functions);
    an error is the real plan's to raise."""
    seq_len = cfg.pack.seq_len
    hist = np.zeros(seq_len + 1, dtype=np.int64)
    hist[[1, seq_len // 2 + 1, seq_len]] = 1
    with suppress(Exception):
        _planner(cfg)(hist)


def write_report_safely(out: str, storage: StorageConfig, log: Callable[[str], None]) -> str | None:
    """report.html, from the committed dataset as `raypack report` makes it. After the manifest: the
    dataset is complete without it, and a failure here must not cost the packed data (the page can be
    made again from manifest.json and metrics.json alone)."""
    from raypack.report import from_dataset, write_report

    try:
        return write_report(from_dataset(out, storage), out, storage)
    except Exception as e:  # any failure: the data is committed; say so and carry on
        log(f"[raypack] warning: report.html not written ({type(e).__name__}: {e}); `raypack report {out}`")
        return None


_EXAMPLES = 20


def _check_rejects(
    cfg: JobConfig, documents: int, rejects: int, lost_files: int, reasons: Counter[str], staging: str
) -> None:
    """Fail when nothing is left to pack, when more input files were lost than input.max_lost_files
    allows, or when more than input.max_reject_ratio of the records is bad; `rejects` counts records
    (a lost file: its rows). rejects/ stays, for the user to look at; staged tokens go."""
    records = documents + rejects
    ratio = rejects / records if records else 0.0
    where = join(cfg.output.path, "rejects")
    top = ", ".join(f"{kind} ({n:,})" for kind, n in reasons.most_common(3))
    if documents == 0:
        remove(staging, cfg.storage)
        raise JobError(f"no documents to pack: {rejects:,} records rejected: {top} (see {where})")
    if lost_files > cfg.input.max_lost_files:
        remove(staging, cfg.storage)
        raise JobError(
            f"{lost_files:,} input files could not be read whole (unreadable, or no readable text "
            f"column), over input.max_lost_files ({cfg.input.max_lost_files:,}): {top}; see {where} "
            "for each file, or allow them with input.max_lost_files"
        )
    if ratio > cfg.input.max_reject_ratio:
        remove(staging, cfg.storage)
        raise JobError(
            f"{rejects:,} of {records:,} records rejected ({ratio:.2%}), over input.max_reject_ratio "
            f"({cfg.input.max_reject_ratio:.2%}): {top}; see {where}, or raise the limit"
        )


def check_output(out: str, storage: StorageConfig, overwrite: bool) -> None:
    """Refuse to write over a complete dataset without --overwrite, or into a rebuild's root; an
    unreachable or unauthorized output fails here, before any work."""
    try:
        holds_dataset = exists(join(out, MANIFEST), storage)
        holds_versions = exists(join(out, LATEST), storage)
    except OSError as e:
        raise ConfigError(f"cannot reach output {out}: {str(e).strip().splitlines()[0]}") from None
    if holds_versions:
        raise ConfigError(f"{out} holds versioned datasets (LATEST): use `raypack rebuild`, or another path")
    if holds_dataset and not overwrite:
        raise ConfigError(f"{out} already holds a dataset (manifest.json); pass --overwrite to replace it")


def clear_output(out: str, storage: StorageConfig) -> None:
    """Remove a previous dataset, manifest first, so a crash mid-way never leaves one that looks
    complete; and the `.tmp-*` files a killed run's atomic writes left (storage.atomic_output)."""
    for part in _OUTPUT_PARTS:
        remove(join(out, part), storage)
    remove_temporaries(out, storage)


def _file_rows(packs: int, shard_rows: int) -> list[int]:
    """Packs in each file of a bucket (or shard group) of `packs`: shard_rows each, the last fewer."""
    return [min(shard_rows, packs - first) for first in range(0, packs, shard_rows)]


def _files(plan: Plan, shard_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Every output file's key, ascending (files 0..ceil(packs / shard_rows) - 1 of each bucket), and
    its token slots."""
    keys, slots = [], []
    buckets = Buckets.of(plan)
    for b, (length, n) in enumerate(zip(buckets.lengths, buckets.sizes, strict=True)):
        rows = np.asarray(_file_rows(n, shard_rows), dtype=np.int64)
        keys.append(file_key(np.full(len(rows), b), np.arange(len(rows))))
        slots.append(rows * length)
    key, slot = np.concatenate(keys), np.concatenate(slots)
    order = np.argsort(key, kind="stable")
    return key[order], slot[order]


def _slots(plan: Plan) -> int:
    ends = np.append(plan.capacity_start[1:], plan.num_packs)
    return int(((ends - plan.capacity_start) * plan.capacity_value).sum())


def _write_global(
    cfg: JobConfig,
    spec: Spec,
    plan: Plan,
    totals: Totals,
    shards: list[WorkUnit],
    width: int,
    log: Callable[[str], None],
    selection: Selection | None = None,
) -> tuple[list[dict[str, Any]], Duplicates]:
    """Assign, exchange and write on Ray tasks of bounded fan-out (raypack.pipeline.exchange)."""
    keys, slots = _files(plan, cfg.output.shard_rows)
    shard_bytes = totals.tokens * 4 + totals.items * ITEM_BYTES
    runs = totals.hists.shape[0]
    id_check = cfg.input.id_fields
    lay = layout(totals.run_of_shard, runs, shard_bytes, slots * 4, width, totals.documents, id_check)
    n = lay.counts()
    log(
        f"[raypack] exchange: {n['assign_tasks']} assign, {n['merge_tasks']} merge, {n['write_tasks']} "
        f"write tasks; {lay.hops} hop(s), {n['objects']:,} objects"
    )
    done = run_exchange(cfg, plan, lay, totals, shards, keys, spec, _EXAMPLES, selection)
    if (done.items, done.tokens) != (totals.stats.items, totals.stats.tokens):
        raise RuntimeError(
            f"assign placed (items, tokens) = {(done.items, done.tokens)}, the histogram holds "
            f"{(totals.stats.items, totals.stats.tokens)}: refusing to commit"
        )
    return done.written, Duplicates(done.duplicate_ids, done.duplicate_documents, done.examples)


def _sharded_ids(cfg: JobConfig, totals: Totals, width: int) -> Duplicates:
    """Sharded mode's id check: each run's index files hashed into parts, counted part by part."""
    found = check_index_ids(cfg, totals.run_of_shard, width, _EXAMPLES)
    return Duplicates(found.duplicate_ids, found.duplicate_documents, found.examples)


def _planned_files(cfg: JobConfig, spec: Spec, plan: Plan) -> dict[str, int]:
    """Every file the global plan makes, with its packs: bucket b's packs in files of shard_rows, the
    last one shorter."""
    rows, buckets = cfg.output.shard_rows, Buckets.of(plan)
    bucketed = cfg.pack.algorithm == "bucket"
    return {
        data_file(spec, length if bucketed else None, part): count
        for length, n in zip(buckets.lengths, buckets.sizes, strict=True)
        for part, count in enumerate(_file_rows(n, rows))
    }


def _sharded_files(cfg: JobConfig, spec: Spec, files: list[dict[str, Any]]) -> dict[str, int]:
    """The files sharded mode must have written, given the packs each group reports: parts
    0..ceil(packs / shard_rows) - 1 of every group that has packs (its packs are numbered alone)."""
    rows = cfg.output.shard_rows
    packs: Counter[int] = Counter()
    for f in files:
        group = group_of(stem_of_file(str(f["path"]), spec.format.suffix))
        if group is None:
            raise RuntimeError(f"{f['path']} is not a sharded mode's file: refusing to commit")
        packs[group] += int(f["rows"])
    return {
        data_file(spec, None, part, group): count
        for group, n in sorted(packs.items())
        for part, count in enumerate(_file_rows(n, rows))
    }


def _check_commit(files: list[dict[str, Any]], planned: dict[str, int], items: int, tokens: int) -> None:
    """The written files must be exactly the planned ones, each once and with its planned packs, and
    hold every item and every token (their fill counts one entry per pack). Totals alone are not
    enough: two blocks of one file would overwrite each other and still add up."""
    paths = Counter(str(f["path"]) for f in files)
    twice = sorted(p for p, n in paths.items() if n > 1)
    if twice:
        raise RuntimeError(f"{twice[0]} was written by {paths[twice[0]]} tasks: refusing to commit")
    written = {str(f["path"]): int(f["rows"]) for f in files}
    if written != planned:
        missing = sorted(set(planned) - set(written))
        extra = sorted(set(written) - set(planned))
        wrong = sorted(p for p in set(planned) & set(written) if planned[p] != written[p])
        raise RuntimeError(
            f"the written files are not the planned ones (missing {missing[:3]}, unplanned {extra[:3]}, "
            f"wrong row counts {wrong[:3]}): refusing to commit"
        )
    packs = sum(planned.values())
    got = (sum(f["items"] for f in files), sum(f["tokens"] for f in files))
    filled = sum(int(np.sum(f["fill_percent"])) for f in files)
    if filled != packs:
        raise RuntimeError(
            f"the files' fill counts cover {filled} packs, planned {packs}: refusing to commit"
        )
    if got != (items, tokens):
        raise RuntimeError(f"written (items, tokens) = {got}, planned {(items, tokens)}: refusing to commit")


def _manifest(
    cfg: JobConfig,
    shards: list[WorkUnit],
    tok: LoadedTokenizer,
    pad: tuple[int, str],
    packs: int,
    files: list[dict[str, Any]],
    documents: int,
    rejects: int,
    items: int,
    tokens: int,
) -> dict[str, Any]:
    buckets: dict[int, int] = {}
    for f in files:
        buckets[int(f["bucket_length"])] = buckets.get(int(f["bucket_length"]), 0) + int(f["rows"])
    return {
        "schema_version": schema.OUTPUT_SCHEMA_VERSION,
        "raypack_version": __version__,
        "config": cfg.to_dict(),
        "inputs": [
            {"path": s.relpath, "size": s.shard.size, "mtime_ns": s.shard.mtime_ns}
            | s.entry()
            | ({"source": s.source} if s.source else {})
            for s in shards
        ],
        "tokenizer": {
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
        "counts": {
            "shards": len(shards),
            "documents": documents,
            "rejects": rejects,
            "items": items,
            "packs": packs,
            "tokens": tokens,
        },
        "buckets": [{"length": k, "packs": v} for k, v in sorted(buckets.items())],
        "files": manifest_files(files),
        "metrics": METRICS,
    }


_FILE_KEYS = ("path", "bucket_length", "rows", "tokens", "items", "bytes", "sha256", "index")
# Kept in the manifest too: what bridge's pack_metadata.json is made from (and verify remakes it).
_FILE_STATS = ("max_items", "longest_item", "fewest_tokens", "trained")


def manifest_files(files: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's `files`, from the write tasks' WRITTEN rows."""
    return [
        {k: f[k] for k in _FILE_KEYS}
        | {k: int(f[k]) for k in _FILE_STATS if k in f}
        | {"row_groups": [int(n) for n in f["row_groups"]], "companions": list(f["companions"])}
        for f in files
    ]
