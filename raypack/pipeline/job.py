"""The job's executor: runs the stages in order, times them, cleans up when one fails. What each stage
does, and the tasks it runs, is in its own module; this one only wires their typed results.

    prepare   (prepare.py)   config, tokenizer, inputs and output checked before any work; the
                             runner up (a local pool, or Ray: runners.py), the tokenizer preloaded
    read      (read.py)      input files → work units, each with its source's Reading (units.py)
    tokenize  (tokenize.py)  work units → token files + per-run histograms (tokenize_pool.py's tasks)
    select    (select.py)    a mixture's rules and copies (input.sources only)
    histogram (histogram.py) the item histogram the plan is made from
    plan      (plan.py)      the packer on the histogram; pack.compare's plans beside it
    write     (write.py)     assign, exchange, write (exchange.py; sharded.py); the commit check
    finalize  (finalize.py)  the run's record (record.py) as metrics.json, format files, manifest.json
                             last; report.html

Token files live in `<output>/_staging/tokens/` (removed at the end), or in a token store that
outlives the job (cache.path, or a rebuild's own: raypack.dataset.store). The driver holds the
unit list (~300 bytes a unit), one histogram per run of units (runs <= the cluster's CPUs), the
plan (O(seq_len²)), one WRITTEN row per output file (~1 KB), the exchange's object references (~3 KB
each) and, with a store, one content digest a file (~80 bytes); documents and tokens never pass
through it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any, TextIO

from raypack.config import JobConfig
from raypack.corpus.datasets import dataset_units, without_blocks
from raypack.dataset import previous
from raypack.dataset.layout import REJECTS, UNIT_INDEX
from raypack.dataset.output import Clearing, restore_output
from raypack.dataset.store import check_store, remove_run_temporaries, store_record
from raypack.engine import Runner, ensure_ray
from raypack.errors import ConfigError, JobError, StorageError, storage_cause
from raypack.pipeline.finalize import commit
from raypack.pipeline.place.assign import warm_assign
from raypack.pipeline.place.histogram import histogram
from raypack.pipeline.place.plan import compare_in_task, plan_in_task
from raypack.pipeline.place.select import Selection, select
from raypack.pipeline.prepare import Prepared, prepare
from raypack.pipeline.read import read
from raypack.pipeline.record import RunRecord, run_record
from raypack.pipeline.tokenize.digests import content_digests
from raypack.pipeline.tokenize.metadata import unify_metadata
from raypack.pipeline.tokenize.pool import TokenizePool
from raypack.pipeline.tokenize.stage import check_rejects, tokenize
from raypack.pipeline.write.stage import write
from raypack.report import write_report_safely
from raypack.storage import join, remove

__all__ = ["JobError", "JobResult", "ensure_ray", "run_job"]

JobResult = RunRecord
"""What run_job returns: the run's record (raypack.pipeline.record), its report's path filled in."""

# A source's share further than this from its target's is said (a cut lands within half of seq_len
# tokens of its target: 0.1 point of any output of 500 packs or more).
SHARE_TOLERANCE = 0.001


@contextmanager
def _stage(timings: dict[str, float], name: str, log: Callable[[str], None]) -> Iterator[None]:
    log(f"[raypack] {name} ...")
    t0 = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - t0


def run_job(
    cfg: JobConfig,
    *,
    overwrite: bool = False,
    cache: str | None = None,
    log: Callable[[str], None] = print,
    release_ray: bool = False,
    memory: str | None = None,
    progress: TextIO | None = None,
    started: float | None = None,
    local: Runner | None = None,
    datasets: dict[str, Any] | None = None,
) -> JobResult:
    """Pack the corpus into cfg.output.path. `cache`: a token store to reuse and fill (a rebuild's
    own); None: cfg.cache.path's, or without one a staging area that is removed at the end.
    `memory`: a file where a rebuild's root keeps what runs learnt of the backends (a fast one that
    gave other ids is not chosen again there). `release_ray`: shut down (or disconnect from) a Ray
    the job started, once the manifest is written (`raypack pack`; one the caller runs stays);
    `progress`: where the tokenize and assign+write stages show theirs (raypack.progress);
    `started`: when the command began (time.time()), for the time it took to the commit
    (metrics.json, the report); `local`: a local runner the caller started first
    (engine.start_local: the command and raypack.pack() do), the job's to use or close;
    `datasets`: the Ray Datasets input.datasets names, by name (raypack.corpus.datasets). A storage
    failure that outlived every retry is raised as a StorageError (one line), whatever wrapper Ray
    put around it."""
    try:
        return _run(cfg, overwrite, cache, log, release_ray, memory, progress, started, local, datasets)
    except (ConfigError, JobError):
        raise
    except Exception as e:
        cause = storage_cause(e)
        if cause is None or isinstance(e, StorageError):
            raise
        raise StorageError(cause) from e


def _run(
    cfg: JobConfig,
    overwrite: bool,
    cache: str | None,
    log: Callable[[str], None],
    release_ray: bool,
    memory: str | None,
    progress: TextIO | None,
    started: float | None,
    local: Runner | None,
    datasets: dict[str, Any] | None,
) -> JobResult:
    timings: dict[str, float] = {}
    ready = prepare(cfg, overwrite, log, local, datasets, store=(cache or cfg.cache.path) is not None)
    cfg, storage, runner = ready.cfg, ready.cfg.storage, ready.runner
    clear = Clearing(cfg.output.path, storage)
    try:
        # The output is cleared for the new dataset once nothing can refuse the job: here, where the
        # driver parsed the tokenizer; else by the tokenize stage, once a parse has taken the file
        # (a repack from a token store may parse it nowhere), before its first unit.
        if ready.tok.parsed:
            clear()
        record = _stages(ready, clear, cache, memory, timings, log, progress)
        with _stage(timings, "finalize", log):
            if started is not None:
                record = dataclasses.replace(record, command_seconds=time.time() - started)
            commit(record, storage)
            previous.discard(cfg.output.path)  # the dataset this one replaces
    except BaseException as e:
        runner.close(release=False, failed=True)
        # Whatever stopped the job (a worker's error, a Dataset's own pipeline failing, Ctrl-C): its
        # staging area goes, once no worker writes into it. It holds the token files and, for a
        # Dataset, a copy of its columns; a rerun would clear it, but a job that is not rerun would
        # leave it. Best effort: the error that stopped the job is the one to see.
        with suppress(Exception):
            remove(ready.staging, storage)
        store = cache if cache is not None else cfg.cache.path
        if store is not None:  # and what its workers were writing into a token store
            with suppress(Exception):
                remove_run_temporaries(store, ready.ctx.run)
        _unmade(ready, clear, stated=isinstance(e, ConfigError | JobError))
        restore_output(cfg.output.path, log, "job")  # the dataset it was to replace
        raise
    # The report's drawing (~1.8 s) beside the runner's closing (Ray's shutdown: ~1.4 s, mostly
    # waiting for its processes to exit): the dataset is committed, nothing is left to run.
    with ThreadPoolExecutor(1) as drawing:
        drawn = drawing.submit(write_report_safely, cfg.output.path, storage, log)
        runner.close(release=release_ray)
        report = drawn.result()
    return dataclasses.replace(record, stage_seconds=dict(timings), report=report)


def _stages(
    ready: Prepared,
    clear: Callable[[], None],
    cache: str | None,
    memory: str | None,
    timings: dict[str, float],
    log: Callable[[str], None],
    progress: TextIO | None,
) -> RunRecord:
    cfg, storage, runner = ready.cfg, ready.cfg.storage, ready.runner
    store = cache if cache is not None else cfg.cache.path
    token_dir = store if store is not None else join(ready.staging, "tokens")
    units = read(ready.files, cfg.input, storage, runner, cfg.pack.seed)
    if ready.datasets:
        # The Dataset's own pipeline runs here, on the CPUs; then the workers load the tokenizer
        # (a preload before it would hold every CPU while Ray Data waits, warning of a hang).
        with _stage(timings, "read", log):
            units += dataset_units(
                cfg.input, ready.datasets, len(units), join(ready.staging, "datasets"), storage
            )
        ready.preload()
    concurrency = cfg.tokenizer.concurrency or runner.width
    size = min(concurrency, len(units))
    pool = TokenizePool(
        runner, ready.ctx, size, capped=concurrency < runner.width, preload=ready.preload, idle=warm_assign
    )
    try:
        with _stage(timings, "tokenize", log):
            digests = None
            if store is not None:
                check_store(store, storage)
                digests = content_digests(ready.files, storage, runner)
            tokenized = tokenize(
                cfg,
                ready.tok,
                units,
                token_dir,
                pool,
                runner.width,
                memory,
                log,
                progress,
                digests,
                clear,
            )
            if store is not None:
                tokenized.store = store_record(store, storage, tokenized.totals.reused)
            unify_metadata(cfg, tokenized.units, tokenized.totals, runner)  # input.metadata_fields
        if ready.datasets:  # what follows reads token files: Ray may free the Dataset's blocks
            tokenized.units = without_blocks(tokenized.units)
            units = []
        totals = tokenized.totals
        check_rejects(cfg, totals)
        selection: Selection | None = None
        sources: list[dict[str, Any]] = []
        if cfg.input.mixture:
            with _stage(timings, "select", log):
                selection, sources = select(cfg, tokenized.units, totals, runner)
            _say_shares(sources, log)
        with _stage(timings, "histogram", log):
            none = selection is not None and not any(r["copies"] for r in sources)
            hist, stats = histogram(cfg.pack, totals, selected_none=none)
        with _stage(timings, "plan", log):
            packs = plan_in_task(runner, cfg.pack, hist)
        comparison = []
        if cfg.pack.compare:
            with _stage(timings, "compare", log):
                comparison = compare_in_task(runner, cfg.pack, hist, stats)
        with _stage(timings, "assign+write", log):
            written = write(cfg, ready.spec, packs, totals, tokenized.units, runner, selection, log, progress)
    except (ConfigError, JobError):
        remove(ready.staging, storage)  # rejects/ stays, for the user to look at
        raise
    return run_record(ready, tokenized, selection, sources, stats, packs, comparison, written, timings)


def _unmade(ready: Prepared, clear: Clearing, stated: bool) -> None:
    """What a failed or stopped job wrote into its cleared output, gone: its units' index files (no
    dataset holds them) and, unless the job stopped on a refusal that names them (`stated`), its
    rejects; after a refusal, the output directory itself when the job made it and it is empty now
    (a stopped rebuild's version directory stays, so that its number is not taken again). Best
    effort."""
    out, storage = ready.cfg.output.path, ready.cfg.storage
    if clear.done:
        for part in (UNIT_INDEX,) if stated else (UNIT_INDEX, REJECTS):
            with suppress(Exception):
                remove(join(out, part), storage)
    if ready.made_output and stated:
        with suppress(OSError):
            os.rmdir(out)


def _say_shares(sources: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """Each source's share of the output said, and a source further from its target share than
    SHARE_TOLERANCE given a warning, kept with the source (metrics.json, the manifest, the report's
    and the summary's tables), not only said on stderr: whoever reads the dataset later sees it too."""
    log("[raypack] sources: " + "; ".join(f"{r['name']} {r['share']:.1%}" for r in sources))
    for r in sources:
        if abs(r["share"] - r["target_share"]) > SHARE_TOLERANCE:
            # "its target", not "asked": a source of tokens or repeats asks for no share; a source's
            # tokens and share may be off in opposite ways (the others' are off too).
            r["share_warning"] = (
                f"source {r['name']} is {100 * r['share']:.2f}% of the output, its target "
                f"{100 * r['target_share']:.2f}%; its tokens are {r['off_target']:+,} off their "
                f"target of {r['target']:,}, within half a document or of seq_len as a cut can be, "
                "but the output is too small for its share to be within 0.1 point (that needs ~500 "
                "packs or more)"
            )
            log(f"[raypack] warning: {r['share_warning']}")
