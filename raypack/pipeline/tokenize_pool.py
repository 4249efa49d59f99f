"""The tokenize stage on plain Ray tasks, in worker processes that load the tokenizer once and that
Ray then reuses, unit after unit and for the assign and write tasks after them.

As soon as the work units are known, one preload task a CPU makes a worker process load the
tokenizer and fastokens' copy of it (tokenize.preload), while the driver still checks the chat
template and the backend; the backend's self-check encodes its probes and corpus sample with a
worker's fastokens (RemoteFast), so the driver never loads fastokens itself. Then each unit is one
task (tokenize_unit: TokenizeShards.unit, the TokenizeShards kept in the process from one unit
of the run to the next); the driver keeps IN_FLIGHT units a CPU submitted, largest
first, and folds each summary as it arrives.

Why not Ray Data's actor pool (what this stage was until issue 20): its actors start only when the
dataset executes, so their ~2 s of loading came after the driver's self-check instead of beside
it, and the pool itself took ~4 s to start whatever the work (8 or 80 trivial units: 4.6 s / 3.9 s;
80 plain tasks 1.2 s), with ~20 ms between one unit and the next at each actor. Why not plain actors
(tried): an actor's process ends with it, so the assign and write tasks then waited ~1-1.7 s for
new processes to start on 2 busy cores, and each paid numba's first-call set-up again (~0.45 s). On
500 MB of text, 2 cores, a 128k vocabulary and fastokens, the stage took 12.4-13.3 s on Ray Data,
5.2 s of it before the first unit began (docs/benchmarks.md, run 14, has the figures since).

Ray objects: a preload task a CPU; one task and one summary (~2 KB: a sparse histogram and counts)
a unit, at most IN_FLIGHT × CPUs of them alive. The driver holds the unit rows (~300 bytes each)
and those references. A unit task is retried as the exchange's are (a killed worker, a transient
storage error after a pause: RETRIES times); it is redone from its input, so a retry writes the
same token file.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import suppress
from typing import Any

import numpy as np

from raypack.config import JobConfig
from raypack.pipeline.assign import warm_assign
from raypack.pipeline.backends import Choice
from raypack.pipeline.runners import LocalRunner, Runner
from raypack.pipeline.tasks import task_options, transient
from raypack.pipeline.tokenize_task import TokenizeShards, preload, preloaded_fast, shards_for
from raypack.pipeline.units import WorkUnit

__all__ = ["IN_FLIGHT", "LocalTokenizePool", "RemoteFast", "TokenizePool", "tokenize_pool", "tokenize_unit"]

# Units submitted a CPU: 2, so that a worker starts the next as soon as one is done (the driver's
# reply and the next submission then overlap a unit's work instead of following it).
IN_FLIGHT = 2


def preload_task(cfg: JobConfig, fast: bool) -> None:
    """Ray task: this worker process loads the tokenizer (and fastokens' copy) for the units to come."""
    preload(cfg, fast)


def fast_status(cfg: JobConfig) -> tuple[str, str]:
    """Ray task: fastokens' version on this worker, and why it did not load ("" when it did)."""
    loaded = preload(cfg, fast=True)
    return (loaded.fast.version if loaded.fast is not None else "", loaded.fast_error)


def fast_encode(cfg: JobConfig, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ray task: fastokens' ids of `texts` (the driver's self-check compares them with tokenizers')."""
    loaded = preload(cfg, fast=True)
    if loaded.fast is None:
        raise ValueError(loaded.fast_error)
    return loaded.fast.encode(texts)


def tokenize_unit(
    run: str,
    cfg: JobConfig,
    cls: type[TokenizeShards],
    backend: str,
    patterns: tuple[str, ...] | None,
    unit: WorkUnit,
) -> dict[str, Any]:
    """Ray task: one unit tokenized (tokenize.shards_for's TokenizeShards); its summary row. `run`
    identifies the job run (TokenizePool.run_id)."""
    with transient(patterns):
        return shards_for(run, cls, cfg, backend).unit(unit)


class RemoteFast:
    """A worker's fastokens, as an Encoder for the driver's self-check (backends.choose_backend): the
    driver never loads fastokens itself (1.1 s for a 128k BPE, on CPUs the workers need).
    ValueError, with fastokens' reason, when it refused the tokenizer there."""

    name = "fastokens"

    def __init__(self, cfg: JobConfig) -> None:
        import ray

        self.cfg = cfg
        self.version, error = ray.get(ray.remote(fast_status).options(num_cpus=1).remote(cfg))
        if error:
            raise ValueError(error)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import ray

        flat, lengths = ray.get(ray.remote(fast_encode).options(num_cpus=1).remote(self.cfg, texts))
        return flat, lengths


class TokenizePool:
    """The tokenize stage on Ray tasks of a CPU each, in worker processes that load the tokenizer
    once (preload, from the moment the pool is made) and that Ray reuses from unit to unit and then
    for the assign and write tasks.

    On a cluster of several nodes each task is placed on a node (soft node affinity: it runs
    elsewhere if that node is gone), its slots in proportion to its CPUs, the next unit going to
    the node that just finished one. Left to itself Ray hands a worker it leased the next task of
    the same kind, so small units all ran on one node while the others idled (1 run in 3 put a
    9-unit file's units all on the driver's node; test_multinode). One node: Ray's own scheduling."""

    def __init__(self, cfg: JobConfig, size: int, fast: bool, capped: bool = False) -> None:
        """`size` tasks at once; `capped`: size is below the cluster's CPUs (tokenizer.concurrency),
        so no unit is submitted beyond it (else IN_FLIGHT a CPU, Ray's CPUs being the cap)."""
        import ray

        self.cfg, self.size = cfg, size
        self.patterns, self.options = task_options()
        self.run_id = uuid.uuid4().hex
        self.slots = _slots(_cpu_nodes(), size)
        """The task slots of each node (node id -> slots); {"": size} on one node."""
        self.windows = {node: n if capped else IN_FLIGHT * n for node, n in self.slots.items()}
        preload = ray.remote(preload_task)
        self.preloads = [
            preload.options(num_cpus=1, **_placed(node)).remote(cfg, fast)
            for node, n in self.slots.items()
            for _ in range(n)
        ]

    def fast_ahead(self) -> Choice | None:
        """None: Ray workers load fastokens themselves; the check runs before any unit."""
        return None

    def fast_encoder(self) -> RemoteFast:
        """fastokens on a worker that has loaded it (for backends.choose_backend)."""
        return RemoteFast(self.cfg)

    def run(
        self,
        rows: list[WorkUnit],
        cls: type[TokenizeShards],
        backend: str,
        on_summary: Callable[[dict[str, Any]], None],
        stop: Callable[[], bool] = lambda: False,
        cfg: JobConfig | None = None,
    ) -> None:
        """Tokenize every row's unit, submitted in the given order, each node's window at a time;
        `on_summary` gets each summary as it arrives; once `stop()` says so, nothing more is
        submitted and the units running finish. An error that Ray's retries did not cure is raised
        as Ray raises it. `cfg`: the job's as the self-check left it (tokenizer.chat_spans), else
        the pool's."""
        import ray

        cfg = cfg or self.cfg
        task = ray.remote(tokenize_unit)
        todo = iter(rows)
        running: dict[Any, str] = {}  # a unit's task -> the node it was given to
        busy = dict.fromkeys(self.windows, 0)

        def submit(node: str) -> bool:
            row = next(todo, None)
            if row is not None:
                ref = task.options(**self.options, **_placed(node)).remote(
                    self.run_id, cfg, cls, backend, self.patterns, row
                )
                running[ref] = node
                busy[node] += 1
            return row is not None

        # The first units go round the nodes, a slot at a time, until every window is full.
        filling = True
        while filling:
            filling = False
            for node, window in self.windows.items():
                if busy[node] < window and submit(node):
                    filling = True
        while running:
            [done], _ = ray.wait(list(running), num_returns=1)
            node = running.pop(done)
            busy[node] -= 1
            on_summary(ray.get(done))
            if not stop():
                submit(node)

    def close(self) -> None:
        """Collect the preload tasks, cancelling those still running (a job that failed before it
        tokenized): an error in one, a missing file say, is the units' to raise."""
        import ray

        if not self.preloads or not ray.is_initialized():  # (ray.wait would start a Ray of its own)
            return
        _, pending = ray.wait(self.preloads, num_returns=len(self.preloads), timeout=0)
        for ref in pending:
            ray.cancel(ref)
        for ref in self.preloads:
            with suppress(Exception):  # the units met the same error and raised it
                ray.get(ref)
        self.preloads = []


def _cpu_nodes() -> dict[str, int]:
    """The alive nodes that have CPUs, and how many (a KubeRay head often has none)."""
    import ray

    found = {
        str(n["NodeID"]): int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")
    }
    return {node: cpus for node, cpus in sorted(found.items()) if cpus >= 1}


def _slots(nodes: dict[str, int], size: int) -> dict[str, int]:
    """`size` task slots shared among `nodes` in proportion to their CPUs (largest remainders), none
    over a node's CPUs; {"": size} for one node or none known (Ray schedules)."""
    if len(nodes) < 2:
        return {"": size}
    total = sum(nodes.values())
    size = min(size, total)
    share = {node: size * cpus / total for node, cpus in nodes.items()}
    slots = {node: int(x) for node, x in share.items()}
    for node in sorted(share, key=lambda n: (slots[n] - share[n], n))[: size - sum(slots.values())]:
        slots[node] += 1
    return {node: n for node, n in slots.items() if n}


def _placed(node: str) -> dict[str, Any]:
    """Task options that place a task on `node`, softly (anywhere if it is gone); {} for "": Ray's."""
    if not node:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True)}


class LocalFast:
    """A local worker's fastokens, as an Encoder for the driver's self-check (RemoteFast's twin);
    where the workers were forked from this process after it loaded fastokens, that very copy,
    here (its encodes then wait behind no unit of the workers)."""

    name = "fastokens"

    def __init__(self, runner: LocalRunner, cfg: JobConfig) -> None:
        self.runner, self.cfg = runner, cfg
        self.own = preloaded_fast(cfg) if runner.forked else None
        if self.own is not None:
            self.version = self.own.version
            return
        self.version, error = runner.submit(fast_status, cfg).result()
        if error:
            raise ValueError(error)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if self.own is not None:
            return self.own.encode(texts)
        flat, lengths = self.runner.submit(fast_encode, self.cfg, texts).result()
        return flat, lengths


class LocalTokenizePool:
    """The tokenize stage on a LocalRunner's processes, which loaded the tokenizer when they were
    forked (preload: the runner's initializer); TokenizePool's interface."""

    def __init__(self, runner: LocalRunner, cfg: JobConfig, size: int, capped: bool = False) -> None:
        self.runner, self.cfg, self.size = runner, cfg, size
        self.warmed = False
        self.window = size if capped else IN_FLIGHT * size
        self.run_id = uuid.uuid4().hex

    def fast_encoder(self) -> LocalFast:
        return LocalFast(self.runner, self.cfg)

    def fast_ahead(self) -> Choice | None:
        """The fast backend the workers can start with before the driver's check ends: fastokens,
        where they were forked holding it (prepare loads it before the fork), else None."""
        fast = preloaded_fast(self.cfg) if self.runner.forked else None
        return Choice("fastokens", fast.version, "being checked") if fast is not None else None

    def run(
        self,
        rows: list[WorkUnit],
        cls: type[TokenizeShards],
        backend: str,
        on_summary: Callable[[dict[str, Any]], None],
        stop: Callable[[], bool] = lambda: False,
        cfg: JobConfig | None = None,
    ) -> None:
        """TokenizePool.run, on the local processes."""
        cfg = cfg or self.cfg
        todo = iter(rows)
        running: set[Future[Any]] = set()

        def submit() -> bool:
            row = next(todo, None)
            if row is not None:
                running.add(self.runner.submit(tokenize_unit, self.run_id, cfg, cls, backend, None, row))
            elif not self.warmed:
                # Queued behind the last units: a worker with nothing left to tokenize loads what
                # its assign task will need (0.44 s each, else at that task's start).
                self.warmed = True
                for _ in range(self.size):
                    self.runner.submit(warm_assign, cfg)
            return row is not None

        while len(running) < self.window and submit():
            pass
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for f in done:
                running.discard(f)
                on_summary(f.result())
                if not stop():
                    submit()

    def close(self) -> None:
        """Nothing to collect: the runner's processes stay for the next stages."""


def tokenize_pool(
    runner: Runner, cfg: JobConfig, size: int, fast: bool, capped: bool = False
) -> TokenizePool | LocalTokenizePool:
    """The tokenize stage's pool on `runner` (a local runner's processes preloaded as they forked)."""
    if isinstance(runner, LocalRunner):
        return LocalTokenizePool(runner, cfg, size, capped)
    return TokenizePool(cfg, size, fast, capped)
