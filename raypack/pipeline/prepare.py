"""Stage 0, prepare: everything that can be wrong with the config or the environment fails here,
before any work, with one line (a ConfigError): the tokenizer's files, the inputs, the output (the
common mistakes, before Ray starts), then the tokenizer parsed beside Ray's start (3-4 s, mostly
waiting on its processes; a 128k vocabulary takes 0.3-0.5 s to parse), its pad and the output
format's Spec checked against it. Then the output directory is cleared for the new dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import date

import pyarrow as pa

from raypack.config import JobConfig, StorageConfig
from raypack.errors import ConfigError
from raypack.formats import INDEX_DIR, Spec, make_spec, settings_of
from raypack.formats.bridge import METADATA as BRIDGE_METADATA
from raypack.formats.megatron import DATA_ARGS
from raypack.formats.olmo import MASK_DIR
from raypack.pipeline.encode import chat_template
from raypack.pipeline.histogram import summarize_shard_warm
from raypack.pipeline.read import input_files
from raypack.pipeline.runners import (
    LocalRunner,
    RayRunner,
    Runner,
    choose_runner,
    forks,
    local_cpus,
    may_run_locally,
)
from raypack.pipeline.tokenize_task import load_fast, local_worker, preload
from raypack.pipeline.tokenizer import TOKENIZER_FILE, LoadedTokenizer, load_tokenizer, tokenizer_files
from raypack.pipeline.units import WorkUnit
from raypack.report.model import REPORT
from raypack.storage import exists, join, remove, remove_temporaries
from raypack.versions import LATEST, MANIFEST, METRICS

__all__ = ["Prepared", "check_output", "clear_output", "prepare"]

# Everything a job writes under its output (formats' own files included), removed before it starts.
OUTPUT_PARTS = (
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
class Prepared:
    cfg: JobConfig
    """The config as the job runs it: storage settings from the environment, the chat date fixed."""
    tok: LoadedTokenizer
    spec: Spec
    pad: tuple[int, str]
    """What padding holds, and where that came from (LoadedTokenizer.pad)."""
    files: list[WorkUnit]
    """The input files, whole, each with its source's Reading."""
    runner: Runner
    """Where the tasks run: Ray, started beside the tokenizer's parse, or this machine's processes,
    forked once it is parsed (raypack.pipeline.runners)."""

    @property
    def staging(self) -> str:
        return join(self.cfg.output.path, "_staging")


def prepare(cfg: JobConfig, overwrite: bool, log: Callable[[str], None]) -> Prepared:
    cfg = dataclasses.replace(cfg, storage=cfg.storage.from_environment())
    out, storage = cfg.output.path, cfg.storage
    tokenizer = tokenizer_files(cfg.tokenizer, storage)
    fast = cfg.tokenizer.backend != "tokenizers"
    # Where the tasks may run on this machine's processes, fastokens' copy of the tokenizer is built
    # here, beside the listing and tokenizers' parse (it releases the GIL): the workers forked from
    # this process then have it. Each built its own before: 1.1 s for a 128k BPE, both at once on 2
    # cores (1.3-1.5 s each), before any unit could start. The thread is joined before the fork.
    with ThreadPoolExecutor(1, thread_name_prefix="raypack-fastokens") as early:
        fast_loading = (
            early.submit(load_fast, tokenizer[TOKENIZER_FILE].decode("utf-8", errors="replace"))
            if fast and may_run_locally(cfg) and forks()
            else None
        )
        files = input_files(cfg.input, storage)
        check_output(out, storage, overwrite)
        executor = choose_runner(cfg, sum(f.shard.size for f in files))
        ray: RayRunner | None = None
        if executor == "ray":
            with ThreadPoolExecutor(1, thread_name_prefix="raypack-tokenizer") as loader:
                loading = loader.submit(load_tokenizer, cfg.tokenizer, storage, tokenizer, framed=cfg.framed)
                ray = RayRunner()
                tok = loading.result()
        else:
            tok = load_tokenizer(cfg.tokenizer, storage, tokenizer, framed=cfg.framed)
            # While fastokens loads: what every forked worker would load on its first unit otherwise.
            summarize_shard_warm(cfg)  # preload's numba functions (0.3 s)
            pa.array(["x"])  # pyarrow imports pandas on its first Python list (0.4 s)
        fastokens = fast_loading.result() if fast_loading is not None and executor == "local" else None
    cfg = _fix_chat_date(cfg, tok, log)
    pad = tok.pad(cfg.output.pad_id)  # an embedding lookup of a pad that is no token fails in training
    if pad[1] == "output.pad_id" and pad[0] == tok.bos_id:
        log(f"[raypack] note: output.pad_id {pad[0]} is the tokenizer's BOS")
    spec = make_spec(cfg.output.format, settings_of(cfg, tok.eos_id, tok.max_id, pad[0]))
    clear_output(out, storage)
    if ray is not None:
        log(f"[raypack] tasks on Ray: {ray.width} CPUs")
        return Prepared(cfg, tok, spec, pad, files, ray)
    # The tokenizer, fastokens' copy and numba's functions the summaries use, loaded here: the
    # workers forked next have them (spawned ones, in a process that runs threads, load their own).
    preload(cfg, fast, tok, fastokens)
    local = LocalRunner(local_cpus(), local_worker, (cfg, fast))
    log(f"[raypack] tasks on {local.width} local processes (run.executor {cfg.run.executor})")
    return Prepared(cfg, tok, spec, pad, files, local)


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
    for part in OUTPUT_PARTS:
        remove(join(out, part), storage)
    remove_temporaries(out, storage)
