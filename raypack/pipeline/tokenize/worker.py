"""What a worker process holds for the job it serves: the job's tokenizer, fastokens' copy of it, and
the tokenize stage's TokenizeShards from one unit of a pass to the next.

A job names itself to its tasks: every task that needs the tokenizer is given the job's JobContext
(a run id made for each job, and the sha256 of the tokenizer the driver read), never a process-wide
default. A worker holds the state of one job at a time, under that run id: a later job, in the same
Ray worker or the same notebook, has another id and loads its own, so it can never pack with an
earlier job's tokenizer (state keyed by the config would: a tokenizer saved again at the same path
would keep its old ids). A worker that loads the tokenizer checks it
is the one the driver read (its sha256): a file replaced while the job runs fails the job, in one
line, instead of mixing two tokenizers' ids.

Where the state is loaded: on Ray, by a preload task a CPU slot as the job starts (Ray reuses the
process for the units that follow) or by the first unit; on local processes, once, in the pool's
zygote before it forks them (raypack.engine.zygote), from the bytes the driver read.
"""

from __future__ import annotations

import ctypes
import gc
import os
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raypack.config import JobConfig
from raypack.engine import Runner
from raypack.errors import JobError
from raypack.pipeline.tokenize.summary import summarize_shard_warm
from raypack.text.backends import FastokensEncoder, TokenizersEncoder
from raypack.text.files import tokenizer_files
from raypack.text.tokenizer import TOKENIZER_FILE, LoadedTokenizer, load_tokenizer

__all__ = [
    "JobContext",
    "JobState",
    "Preload",
    "early_loads",
    "fast_key",
    "forget",
    "job_state",
    "load_fast",
    "preload_job",
    "warm_worker",
]


@dataclass(frozen=True)
class JobContext:
    """What a task is told of the job it works for."""

    cfg: JobConfig
    tokenizer_sha256: str
    fast: bool
    """The tokenize stage may use fastokens (tokenizer.backend auto or fastokens): load its copy."""
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    """This job run's id: a worker's state is this job's only if it was loaded under it."""


@dataclass
class JobState:
    """What one worker process loaded for one job."""

    ctx: JobContext
    tok: LoadedTokenizer
    fast: FastokensEncoder | None = None
    fast_error: str = ""
    """Why fastokens did not load here ("" when it did or was not asked for)."""
    pid: int = field(default_factory=os.getpid)
    """The process that loaded it: another one is a fork of it (a local pool's zygote's worker)."""
    passes: dict[tuple[str, Any, str, bool], Any] = field(default_factory=dict)
    """The tokenize stage's TokenizeShards of each pass (a pass's id, class, backend, and whether it
    runs ahead of the backend's check): a worker keeps one from unit to unit (it holds the failover
    to tokenizers once a check found a difference)."""

    def shards(self, key: tuple[str, Any, str, bool], cfg: JobConfig) -> Any:
        """The pass's TokenizeShards (raypack.pipeline.tokenize.task: the key's class), made on its
        first unit here."""
        if key not in self.passes:
            self.passes.clear()  # a new pass starts afresh
            _, cls, backend, ahead = key
            self.passes[key] = cls(cfg, backend, self, ahead)
        return self.passes[key]


_STATE: dict[str, JobState] = {}
"""This process's state for the job it serves, under the job's run id (one job at a time)."""


def job_state(ctx: JobContext, files: dict[str, bytes] | None = None) -> JobState:
    """This process's state for ctx's job, loaded now if it has none (`files`: the tokenizer's bytes,
    when the caller has them; else they are read from tokenizer.path). 128k BPE: tokenizers 0.4 s,
    fastokens 1.1 s to load; numba's functions of the summary 0.3 s on a first unit otherwise."""
    state = _STATE.get(ctx.run)
    if state is None:
        forget()  # an earlier job's, if any
        cfg = ctx.cfg
        files = files if files is not None else tokenizer_files(cfg.tokenizer, cfg.storage)
        # fastokens loads beside tokenizers' parse, numba's functions and pandas (its load releases the
        # GIL): 1.1 s, and 0.4 + 0.3 + 0.2 s for a 128k BPE, ~1.2 s together instead of 2 s in turn.
        with ThreadPoolExecutor(1, thread_name_prefix="raypack-fastokens") as beside:
            loading = (
                beside.submit(
                    load_fast, files[TOKENIZER_FILE].decode("utf-8", errors="replace"), fast_key(ctx)
                )
                if ctx.fast
                else None
            )
            tok = load_tokenizer(cfg.tokenizer, files, framed=cfg.framed)
            if tok.sha256 != ctx.tokenizer_sha256:
                raise JobError(
                    f"the tokenizer at {cfg.tokenizer.path} changed while the job ran (sha256 "
                    f"{tok.sha256[:12]}, the job started with {ctx.tokenizer_sha256[:12]}): rerun the job"
                )
            if cfg.input.chat:  # here, in a local pool's zygote, not in each worker it forks
                tok.offsets()
            warm_worker(cfg)
            state = JobState(ctx, tok)
            if loading is not None:
                state.fast, state.fast_error = loading.result()
        _STATE[ctx.run] = state
    # Tried until it loads or refuses: a load cut short (a preload cancelled when a job failed)
    # leaves neither, and the next task tries again.
    if ctx.fast and state.fast is None and not state.fast_error:
        state.fast, state.fast_error = load_fast(state.tok.json)
    if state.fast is not None and state.fast.reference is None:
        # The texts a normal form would change are tokenizers' to encode (backends.fast_json).
        state.fast.reference = TokenizersEncoder(state.tok.tokenizer)
    return state


def warm_worker(cfg: JobConfig) -> None:
    """What every unit's summary needs loaded, tokenizer or not: summarize_shard's compiled functions
    (numba reads them from its cache: ~0.25 s) and pyarrow's answer to whether pandas is there (it
    asks on its first array: an import of 0.2-0.4 s, which a local pool's zygote answers no at once,
    raypack.engine.zygote), else paid by each worker's first unit."""
    summarize_shard_warm(cfg)
    pa.array(["x"])


def preload_job(ctx: JobContext, files: dict[str, bytes] | None = None) -> None:
    """A runner's preload (raypack.engine): the job's state."""
    job_state(ctx, files)


class Preload:
    """The job's state loaded into a runner's workers, once, whoever asks (the call): a local pool's
    zygote loads it from the bytes the driver read, then forks the workers; Ray runs a preload task
    a CPU. A job that must tokenize asks as it starts (raypack.pipeline.prepare); one that reads a
    token store asks only once the tokenize stage finds a unit that is not there: a repack whose
    every unit is stored needs no tokenizer (its tasks read token files), and its workers start
    without the 2-3 s of loading a 128k BPE and fastokens' copy on 2 cores. Asked after a local
    pool's workers are forked: nothing (each loads the state on its first unit)."""

    def __init__(self, runner: Runner, ctx: JobContext, files: dict[str, bytes]) -> None:
        self.runner, self.ctx, self.files = runner, ctx, files
        self.sent = False
        self.warmed = False
        self.outcome: Future[None] | None = None
        """A local pool zygote's load of the state, as it ends (checked)."""

    def __call__(self) -> None:
        if self.sent:
            return
        self.sent = True
        runner, ctx = self.runner, self.ctx
        if not runner.takes_preload():
            return
        if runner.inherits_preload:  # loaded once from the bytes read here, then the workers started
            runner.early(early_loads(ctx, self.files[TOKENIZER_FILE].decode("utf-8", errors="replace")))
            self.outcome = runner.preload(preload_job, (ctx, self.files))
            runner.start()
        else:  # each worker slot reads the tokenizer itself
            runner.preload(preload_job, (ctx, None))

    def checked(self) -> bool:
        """Whether the workers loaded the job's state, tokenizers' parse of the tokenizer included,
        waiting for it (asking for it first): True where a local pool's zygote did, the load's
        error raised where it failed there (a file tokenizers refuses: its ConfigError, as the
        driver's own parse would raise it); False where no outcome comes before a task meets it
        (Ray, a pool already forked), and the caller must parse the tokenizer itself to know."""
        self()
        if self.outcome is None:
            return False
        self.outcome.result()
        return True

    def warm(self) -> None:
        """What every unit's summary needs, tokenizer or not (warm_worker), loaded by a local pool's
        zygote before it forks the workers: asked as a job that reads a token store starts
        (prepare), so that it runs beside the driver's own start, not on the tokenize stage's path.
        A later call still sends the preload, if the workers are not forked yet. Warmed here, a
        500 MB repack's 80 stored units take ~0.5 s less from the stage's start to the last than
        when each worker's first unit loads it (2 cores); warmed at the stage's start, the zygote
        would take another 0.6 s before it forks. Ray's workers load it on their first unit."""
        if self.sent or self.warmed:
            return
        self.warmed = True
        if self.runner.inherits_preload and self.runner.takes_preload():
            self.runner.preload(warm_worker, (self.ctx.cfg,))


def fast_key(ctx: JobContext) -> str:
    """The key of fastokens' early build in a local pool's zygote (early_loads)."""
    return f"fastokens:{ctx.tokenizer_sha256}"


def early_loads(ctx: JobContext, tokenizer_json: str) -> dict[str, tuple[str, str, tuple[Any, ...]]]:
    """What a local pool's zygote should start loading as soon as it is asked, beside the job's
    preload (raypack.engine.zygote.early): fastokens' build of the tokenizer, ~1.0 s for a 128k BPE,
    which then runs beside tokenizers' parse and the summary's loads (~0.8 s), not after them."""
    from raypack.text.backends import fast_json, fastokens_version

    if not ctx.fast or fastokens_version() is None:
        return {}
    return {fast_key(ctx): ("fastokens", "Tokenizer.from_json_str", (fast_json(tokenizer_json)[0],))}


def load_fast(tokenizer_json: str, key: str | None = None) -> tuple[FastokensEncoder | None, str]:
    """fastokens' copy of the tokenizer, warmed (FastokensEncoder.warm: in a local pool's zygote,
    once for every worker it forks), or why it refused it (its objects do not pickle: each
    process that encodes builds or inherits its own); `key`: the zygote's early build of it, where
    there is one."""
    from raypack.engine.zygote import early

    try:
        fast = FastokensEncoder(tokenizer_json, (lambda: early(key)) if key else None)
        fast.warm()
        return fast, ""
    except Exception as e:  # FastRefused, FastFailed, or fastokens not installed on this node
        return None, str(e).splitlines()[0] if str(e) else type(e).__name__


def forget() -> None:
    """Drop this process's job state: the assign, write and sharded-group tasks call it, as Ray reuses
    the tokenize stage's processes for them (a 128k vocabulary loaded twice is ~0.2-0.3 GB they would
    otherwise keep), and give the freed memory back to the system: Arrow's pool keeps what the
    units' buffers used, glibc what the tokenizers' Rust allocations did (through malloc).
    Measured: 429 MiB after preloading a 128k BPE with fastokens, 218 MiB after forget."""
    if not _STATE:
        return
    if all(state.pid != os.getpid() for state in _STATE.values()):
        # A fork of a local pool's zygote, which loaded the state: its pages are the zygote's,
        # shared until written. Freeing it here frees nothing (the zygote keeps them) and writes to
        # every page the frees touch: 0.3-0.35 s a worker at the start of assign with a 131k BPE,
        # on the job's critical path.
        return
    _STATE.clear()
    gc.collect()
    pa.default_memory_pool().release_unused()
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
