"""Stage 0, prepare: everything that can be wrong with the config or the environment fails here,
before any work, with one line (a ConfigError): the tokenizer's files, the inputs, the output (the
common mistakes, before any worker starts), then the tokenizer read beside the runner's start, its
pad and the output format's Spec checked against it. The output is cleared for the new dataset by
the executor once nothing can refuse the job (raypack.pipeline.job).

Where the job may run on this machine's processes, their pool starts first (its zygote imports the
task modules, ~0.7 s, while this process reads the tokenizer and lists the input), and loads the
tokenizer once from the bytes read here, before it forks the workers (raypack.engine.zygote).
This process reads only the ids it needs from the JSON (raypack.text.tokenizer.JsonVocab) and
leaves tokenizers' parse to that load, conversations aside (their template and offsets are
asked of this process's parse): a 131k BPE's parse is 0.8 s of CPU holding the GIL, and a job on
2 cores is CPU-bound (the parse left to that load: ~10% less time for 130 MB with tekken). On
Ray, Ray starts beside the tokenizer's parse (3-4 s, mostly waiting on its processes; a 128k
vocabulary takes 0.3-0.5 s to parse) and a preload task a CPU loads it in Ray's workers.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date
from typing import Any

from raypack import engine
from raypack.config import JobConfig
from raypack.corpus.datasets import check_dataset
from raypack.corpus.files import input_files
from raypack.corpus.units import WorkUnit
from raypack.dataset.output import check_output, recover_output
from raypack.engine import Runner
from raypack.errors import ConfigError
from raypack.formats import Spec, make_spec, settings_of
from raypack.packing import compiled_code_cached
from raypack.paths import is_uri
from raypack.pipeline.tokenize.worker import JobContext, Preload
from raypack.storage import join
from raypack.text.files import chat_template, tokenizer_files
from raypack.text.tokenizer import LoadedTokenizer, load_tokenizer, tokenizer_sha256

__all__ = ["Prepared", "prepare", "staging_blobs"]


@dataclass(frozen=True)
class Prepared:
    cfg: JobConfig
    """The config as the job runs it: storage settings from the environment, the chat date fixed."""
    tok: LoadedTokenizer
    spec: Spec
    pad: tuple[int, str]
    """What padding holds, and where that came from (LoadedTokenizer.pad)."""
    files: list[WorkUnit]
    """The input files, whole, each with its source's Reading."""
    datasets: dict[str, Any]
    """The sources given as Ray Datasets, by name ("": the whole input; raypack.corpus.datasets)."""
    runner: Runner
    """Where the tasks run: Ray, started beside the tokenizer's parse, or this machine's processes
    (raypack.engine)."""
    ctx: JobContext
    """What the job's tasks are told of it (its run id, its tokenizer's sha256): the runner's
    workers were given its tokenizer under it."""
    preload: Preload
    """Has the runner's workers load the job's tokenizer, once: sent here already, unless a token
    store may hold every unit (then the tokenize stage calls it if a unit must be tokenized)."""
    made_output: bool = False
    """output.path is a local directory this job made (it was not there): a job stopped by the
    user's config or input removes it where it is left empty, never a directory the user made (an
    empty mount point is theirs)."""

    @property
    def staging(self) -> str:
        return join(self.cfg.output.path, "_staging")


def staging_blobs(out: str) -> str | None:
    """Where a local run keeps the blobs its tasks pass on (the exchange's pieces: about the job's
    tokens × 4 bytes): the output's staging area on a local output, else (object storage) a
    directory of the system temp dir."""
    return None if is_uri(out) else join(out, "_staging")


def prepare(
    cfg: JobConfig,
    overwrite: bool,
    log: Callable[[str], None],
    local: Runner | None = None,
    datasets: dict[str, Any] | None = None,
    store: bool = False,
) -> Prepared:
    """`local`: a pool the caller started first (engine.start_local), the job's to use or
    close; `datasets`: the Ray Datasets of input.datasets, by name (raypack.pack(dataset=...));
    `store`: the job reads a token store, which may hold every unit (Preload: the workers then load
    the tokenizer only if the tokenize stage asks)."""
    datasets = datasets or {}
    runner: Runner | None = None
    try:
        # Local paths absolute here, in the driver: a Ray node's task resolves a relative one
        # against its own working directory (the output would be written in two places).
        cfg = dataclasses.replace(cfg, storage=cfg.storage.from_environment()).anchored()
        out, storage = cfg.output.path, cfg.storage
        made_output = not is_uri(out) and not os.path.lexists(out)
        _check_datasets(cfg, datasets)
        local = engine.local_runner_for(cfg.run, local, bool(datasets), staging_blobs(out))
        runner = local
        fast = cfg.tokenizer.backend != "tokenizers"
        tokenizer = tokenizer_files(cfg.tokenizer, storage)
        ctx = JobContext(cfg, tokenizer_sha256(tokenizer), fast)
        preload = _preload_early(local, ctx, tokenizer, store) if local is not None else None
        files = input_files(cfg.input, storage)
        recover_output(out, log)
        check_output(out, storage, overwrite)
        input_bytes = sum(f.shard.size for f in files)
        if local is None or engine.choose(cfg.run, input_bytes) != "local" or datasets:
            runner = None
            with ThreadPoolExecutor(1, thread_name_prefix="raypack-tokenizer") as loader:
                # Ray starts beside the tokenizer's parse; its workers load the tokenizer themselves.
                loading = loader.submit(load_tokenizer, cfg.tokenizer, tokenizer, framed=cfg.framed)
                runner = engine.runner_for(cfg.run, input_bytes, local, cluster_only=bool(datasets))
                preload = Preload(runner, ctx, tokenizer)
                if not datasets and not store:  # (a Dataset's: once it is materialized, which needs the CPUs)
                    preload()
                tok = loading.result()
        else:
            # The ids the driver needs are read from the JSON, and tokenizers' parse (0.8-1.1 s of a
            # 131k BPE's, holding the GIL) is left to the workers' load, which checks the file before
            # the output is cleared (tokenize): a repack from a token store may parse it nowhere.
            # Conversations parse it here, unless they may come from a store: their template and
            # offsets are the driver's.
            lazy = store or not cfg.input.chat
            tok = load_tokenizer(cfg.tokenizer, tokenizer, framed=cfg.framed, lazy=lazy)
        cfg = _fix_chat_date(cfg, tok, log)
        pad, spec = _pad_and_spec(cfg, tok, log)
    except BaseException:
        for held in {id(r): r for r in (runner, local) if r is not None}.values():
            held.close(release=False, failed=True)
        raise
    assert runner is not None and preload is not None
    _say_where(runner, cfg, log)
    return Prepared(cfg, tok, spec, pad, files, datasets, runner, ctx, preload, made_output)


def _preload_early(local: Runner, ctx: JobContext, tokenizer: dict[str, bytes], store: bool) -> Preload:
    """The job's state loaded by this machine's pool from the tokenizer's bytes read here, before its
    workers start: at once, or, for a job that reads a token store (which may hold every unit), only
    what every unit's summary needs (the tokenize stage asks for the rest if a unit must be
    tokenized)."""
    preload = Preload(local, ctx, tokenizer)
    if not store:
        preload()
    else:
        preload.warm()
    return preload


def _pad_and_spec(
    cfg: JobConfig, tok: LoadedTokenizer, log: Callable[[str], None]
) -> tuple[tuple[int, str], Spec]:
    """What padding holds and why (LoadedTokenizer.pad), and the output format's Spec, checked
    against the tokenizer (its ConfigError)."""
    pad = tok.pad(cfg.output.pad_id)  # an embedding lookup of a pad that is no token fails in training
    if pad[1] == "output.pad_id" and pad[0] == tok.bos_id:
        log(f"[raypack] note: output.pad_id {pad[0]} is the tokenizer's BOS")
    return pad, make_spec(cfg.output.format, settings_of(cfg, tok.eos_id, tok.max_id, pad[0]))


def _say_where(runner: Runner, cfg: JobConfig, log: Callable[[str], None]) -> None:
    log(f"[raypack] tasks on {runner.width} {runner.where} (run.executor {cfg.run.executor})")
    if runner.shares_disk and not compiled_code_cached():  # (other machines' workers: their own caches)
        log(
            "[raypack] note: the packers' compiled code is not cached on this machine yet: this "
            "job compiles what it runs first (~7-20 s, once); python -m raypack.packing.warmup "
            "does it ahead"
        )


def _check_datasets(cfg: JobConfig, datasets: dict[str, Any]) -> None:
    """The Ray Datasets given against the config, before any work: each is one input.datasets
    names, their columns are there (datasets.check_dataset), and what cannot read them is not
    asked for (the local executor, a token store)."""
    if sorted(datasets) != sorted(cfg.input.datasets):
        if not datasets:
            raise ConfigError(
                "input.datasets names Ray Datasets, which only raypack.pack(config, dataset=...) can pass"
            )
        raise ConfigError(
            f"Datasets were given for {', '.join(map(repr, sorted(datasets)))}, but input.datasets names "
            f"{', '.join(map(repr, sorted(cfg.input.datasets)))}"
        )
    if not datasets:
        return
    if cfg.run.executor == "local":
        raise ConfigError(
            "a Ray Dataset is read by Ray tasks from Ray's object store: run.executor local cannot read "
            "it (use auto or ray)"
        )
    if cfg.cache.path is not None:
        raise ConfigError(
            "cache.path: a token store keys work units by their files' content, which a Ray Dataset's "
            "rows do not have: leave cache.path out for a Dataset input"
        )
    for name, ds in datasets.items():
        check_dataset(cfg.input, name, ds)


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
