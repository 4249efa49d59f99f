"""The tokenize stage's tasks, on any runner (raypack.engine): each work unit is one task
(tokenize_unit) in a worker process that holds the job's tokenizer (raypack.pipeline.tokenize.worker: the
runner's preload loaded it as the job started); the driver keeps IN_FLIGHT units a CPU submitted,
largest first, and folds each summary as it arrives. fast_encode is the backend's self-check's
fastokens, on a worker (the driver never loads fastokens: 1.1 s for a 128k BPE, on CPUs the
workers need).

Why plain tasks, not Ray Data's actor pool: its actors start only when the dataset executes, so
their ~2 s of loading would come after the driver's self-check instead of beside it, and the pool
itself takes ~4 s to start whatever the work (80 plain tasks: ~1.2 s), with ~20 ms between one unit
and the next at each actor. Why not plain actors: an actor's process ends with it, so the assign and
write tasks would wait ~1-1.7 s for new processes to start on 2 busy cores, and each would pay
numba's first-call set-up again (~0.45 s). docs/benchmarks.md has the stage's figures.

On a cluster of several nodes each task is placed on a node (soft node affinity: it runs elsewhere if
that node is gone), its slots in proportion to its CPUs, the next unit going to the node that just
finished one. Left to itself Ray hands a worker it leased the next task of the same kind, so small
units may all run on one node while the others idle (test_multinode checks they spread). One node:
the runner's own scheduling.

Tasks and objects: one task and one summary (~2 KB: a sparse histogram and counts) a unit, at most
IN_FLIGHT × CPUs of them alive; then an `idle` task a slot (the assign stage's warm-up). The driver
holds the unit rows (~300 bytes each) and those handles. A unit task is retried as every task is
(a killed worker, a transient storage error after a pause: RETRIES times); it is redone from its
input, so a retry writes the same token file.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import numpy as np

from raypack.config import JobConfig
from raypack.corpus.units import WorkUnit
from raypack.engine import Runner, transient
from raypack.pipeline.tokenize.task import TokenizeShards, stored_unit
from raypack.pipeline.tokenize.worker import JobContext, Preload, job_state
from raypack.text.backends import FastRefused, TokenizersEncoder, fastokens_version, reference_version

__all__ = ["IN_FLIGHT", "PoolFast", "TokenizePool", "fast_encode", "tokenize_unit"]

# Units submitted a CPU: 2, so that a worker starts the next as soon as one is done (the driver's
# reply and the next submission then overlap a unit's work instead of following it).
IN_FLIGHT = 2


def fast_encode(ctx: JobContext, texts: list[str]) -> tuple[str, np.ndarray, np.ndarray]:
    """Task: fastokens' version on this worker and its ids of `texts` (the driver's self-check
    compares them with tokenizers'); FastRefused, with fastokens' reason, where it refused the
    tokenizer."""
    state = job_state(ctx)
    if state.fast is None:
        raise FastRefused(state.fast_error or "fastokens was not loaded")
    flat, lengths = state.fast.encode(texts)
    return state.fast.version, np.array(flat), np.asarray(lengths)


def reference_encode(ctx: JobContext, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Task: tokenizers' ids of `texts` on this worker (the self-check's reference side, where the
    driver has not parsed the tokenizer: PoolReference)."""
    return TokenizersEncoder(job_state(ctx).tok.tokenizer).encode(texts)


def tokenize_unit(
    ctx: JobContext,
    key: tuple[str, type[TokenizeShards], str, bool],
    cfg: JobConfig,
    patterns: tuple[str, ...] | None,
    unit: WorkUnit,
) -> dict[str, Any]:
    """Task: one unit's summary row: its finished token file's (stored_unit: no tokenizer needed,
    none loaded), else the unit tokenized by this worker's TokenizeShards of the pass `key` (a
    pass's id, the class, the backend, whether the pass runs ahead of the backend's check). `cfg`:
    the job's as the self-check left it."""
    with transient(patterns):
        stored = stored_unit(cfg, unit)
        return stored if stored is not None else job_state(ctx).shards(key, cfg).unit(unit)


class PoolFast:
    """fastokens on one of the runner's workers, as an Encoder for the driver's self-check
    (backends.choose_backend); its tasks go ahead of the units waiting. FastRefused, with
    fastokens' reason, where it refused the tokenizer there."""

    name = "fastokens"

    def __init__(self, runner: Runner, ctx: JobContext, preload: Preload | None = None) -> None:
        self.runner, self.ctx, self.preload = runner, ctx, preload
        self.version = fastokens_version() or "?"

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.preload is not None:
            self.preload()
        handle = self.runner.submit(fast_encode, (self.ctx, texts), urgent=True)
        _, (self.version, flat, lengths) = self.runner.first_done([handle])
        return flat, lengths


class PoolReference:
    """tokenizers on one of the runner's workers, as the self-check's reference Encoder
    (backends.choose_backend), for a job whose driver reads the tokenizer's ids from its JSON and
    never parses it (raypack.text.tokenizer.JsonVocab): the workers parse it anyway, and the
    driver's own parse of a 131k BPE is 0.8 s of CPU holding the GIL. Its tasks go ahead of the
    units waiting."""

    name = "tokenizers"

    def __init__(self, runner: Runner, ctx: JobContext, preload: Preload | None = None) -> None:
        self.runner, self.ctx, self.preload = runner, ctx, preload
        self.version = reference_version()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.preload is not None:
            self.preload()
        handle = self.runner.submit(reference_encode, (self.ctx, texts), urgent=True)
        _, (flat, lengths) = self.runner.first_done([handle])
        return flat, lengths


class TokenizePool:
    """The tokenize stage's `size` task slots on `runner`, shared among its nodes in proportion to
    their CPUs; `capped`: size is below the runner's CPUs (tokenizer.concurrency), so no unit is
    submitted beyond it (else IN_FLIGHT a slot); `preload`: has the workers load the job's
    tokenizer before anything is tokenized (None: they loaded it, or load it on a first unit);
    `idle`: a task each slot runs once the last units are given out, with the job's config (the
    executor gives the assign stage's warm-up: what the next stage's tasks load, loaded while
    the last units finish)."""

    def __init__(
        self,
        runner: Runner,
        ctx: JobContext,
        size: int,
        capped: bool = False,
        preload: Preload | None = None,
        idle: Callable[[JobConfig], None] | None = None,
    ) -> None:
        self.runner, self.ctx, self.size, self.preload, self.idle = runner, ctx, size, preload, idle
        self.slots = _slots(runner.nodes(), size)
        """The task slots of each node (node id -> slots); {"": size} on one node."""
        self.windows = {node: n if capped else IN_FLIGHT * n for node, n in self.slots.items()}
        self.warmed = False

    def fast_encoder(self) -> PoolFast:
        """fastokens on a worker that has loaded it (for backends.choose_backend)."""
        return PoolFast(self.runner, self.ctx, self.preload)

    def reference_encoder(self) -> PoolReference:
        """tokenizers on a worker (for backends.choose_backend, where the driver did not parse it)."""
        return PoolReference(self.runner, self.ctx, self.preload)

    def run(
        self,
        rows: list[WorkUnit],
        cls: type[TokenizeShards],
        backend: str,
        on_summary: Callable[[dict[str, Any]], None],
        stop: Callable[[], bool] = lambda: False,
        cfg: JobConfig | None = None,
        loaded: bool = True,
        ahead: bool = False,
    ) -> None:
        """Tokenize every row's unit, submitted in the given order, each node's window at a time;
        `on_summary` gets each summary as it arrives; once `stop()` says so, nothing more is
        submitted and the units running finish. An error that the runner's retries did not cure
        is raised. `cfg`: the job's as the self-check left it (tokenizer.chat_spans), else the
        context's; `loaded`: the workers load the tokenizer first (False: every unit's token file
        is there: they load only what a summary needs, and a unit that is not there after all has
        its worker load the tokenizer); `ahead`: the pass runs ahead of the driver's check of its
        fast backend (a worker where that backend did not load refuses its units, untokenized)."""
        if self.preload is not None:
            self.preload() if loaded else self.preload.warm()
        cfg = cfg or self.ctx.cfg
        key = (uuid.uuid4().hex, cls, backend, ahead)  # this pass's: its workers start afresh
        runner = self.runner
        todo = iter(rows)
        running: dict[Any, str] = {}  # a unit's task -> the node it was given to
        busy = dict.fromkeys(self.windows, 0)

        def submit(node: str) -> bool:
            row = next(todo, None)
            if row is not None:
                handle = runner.submit(tokenize_unit, (self.ctx, key, cfg, runner.patterns, row), node)
                running[handle] = node
                busy[node] += 1
            elif not self.warmed and self.idle is not None:
                # Behind the last units: a worker with nothing left to tokenize loads what its assign
                # task will need (0.44 s each, else at that task's start).
                self.warmed = True
                for slot_node, slots in self.slots.items():
                    for _ in range(slots):
                        runner.submit(self.idle, (cfg,), slot_node)
            return row is not None

        # The first units go round the nodes, a slot at a time, until every window is full.
        filling = True
        while filling:
            filling = False
            for node, window in self.windows.items():
                if busy[node] < window and submit(node):
                    filling = True
        while running:
            done, summary = runner.first_done(list(running))
            node = running.pop(done)
            busy[node] -= 1
            on_summary(summary)
            if not stop():
                submit(node)


def _slots(nodes: dict[str, int], size: int) -> dict[str, int]:
    """`size` task slots shared among `nodes` in proportion to their CPUs (largest remainders), none
    over a node's CPUs; {"": size} for one node or none known (the runner schedules)."""
    if len(nodes) < 2:
        return {"": size}
    total = sum(nodes.values())
    size = min(size, total)
    share = {node: size * cpus / total for node, cpus in nodes.items()}
    slots = {node: int(x) for node, x in share.items()}
    for node in sorted(share, key=lambda n: (slots[n] - share[n], n))[: size - sum(slots.values())]:
        slots[node] += 1
    return {node: n for node, n in slots.items() if n}
