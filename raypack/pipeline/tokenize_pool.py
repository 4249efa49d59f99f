"""The tokenize stage's actors: plain Ray actors, started as soon as Ray is up, fed units by the driver.

Each actor loads the tokenizer (and fastokens' copy of it) as it starts (tokenize.preload), while the
driver still lists the work units and checks the backend, then runs TokenizeShards on the units it
is given. The driver keeps IN_FLIGHT units queued at each actor, largest units first, and folds
each summary as it arrives; nothing else passes through it.

Why not Ray Data's actor pool (what this stage was until issue 20): its actors start only when the
dataset executes, so their ~2 s of loading came after the driver's self-check instead of beside it,
and the pool itself took ~4 s to start whatever the work (8 or 80 trivial units: 4.6 s / 3.9 s;
80 plain tasks 1.2 s), with ~20 ms between one unit and the next at each actor. On 500 MB of text,
2 cores, a 128k vocabulary and fastokens: the stage took 12.4-13.3 s, 5.2 s of them before the
first unit began (benchmarks/bench_job.py, docs/benchmarks.md run 14 has the new figures).

Ray objects: one actor per CPU used (tokenizer.concurrency), one task and one summary (~2 KB: a
sparse histogram and counts) per unit, at most IN_FLIGHT × actors alive. The driver holds the unit
rows (~300 bytes each) and those references. Fault tolerance is Ray's: an actor whose process or
node dies is restarted (it loads again) and its queued units are retried (RETRIES times), a
transient storage error is retried after a pause (exchange.transient); a unit is redone from its
input, so a retry writes the same token file.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from raypack.config import JobConfig
from raypack.pipeline.exchange import RETRIES, TransientStorageError, task_options, transient
from raypack.pipeline.tokenize import TokenizeShards, preload

__all__ = ["IN_FLIGHT", "TokenizePool", "TokenizeWorker"]

# Units queued at an actor: 2, so that it starts the next as soon as one is done (the driver's
# reply and the next submission then overlap a unit's work instead of following it).
IN_FLIGHT = 2


class TokenizeWorker:
    """The actor: loads as it starts; tokenize() runs one unit with a TokenizeShards of `cls` made
    on first use (the backend is the driver's choice, known only after the actor started)."""

    def __init__(self, cfg: JobConfig, fast: bool, patterns: tuple[str, ...]) -> None:
        # As TokenizeShards does, before anything loads: one encoder thread an actor.
        os.environ.setdefault("RAYON_NUM_THREADS", "1")
        os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
        self.cfg, self.patterns = cfg, patterns
        self.shards: TokenizeShards | None = None
        preload(cfg, fast)

    def tokenize(self, cls: type[TokenizeShards], backend: str, row: dict[str, Any]) -> dict[str, Any]:
        with transient(self.patterns):
            if self.shards is None:
                self.shards = cls(self.cfg, backend)
            out = self.shards({k: np.asarray([v]) for k, v in row.items()})
            return {k: v[0] for k, v in out.items()}


class TokenizePool:
    """TokenizeWorker actors of one CPU each, started as they are asked for; run() feeds them units."""

    def __init__(self, cfg: JobConfig, size: int, fast: bool) -> None:
        self.cfg, self.fast = cfg, fast
        self.patterns, _ = task_options()
        self.actors: list[Any] = []
        self.grow(size)

    def grow(self, size: int) -> None:
        """Start more actors, up to `size` in all (the units turned out more than the files)."""
        import ray

        options = {"num_cpus": 1, "max_restarts": RETRIES, "max_task_retries": RETRIES}
        remote = ray.remote(TokenizeWorker).options(**options)
        while len(self.actors) < size:
            self.actors.append(remote.remote(self.cfg, self.fast, self.patterns))

    def run(
        self,
        rows: list[dict[str, Any]],
        cls: type[TokenizeShards],
        backend: str,
        on_summary: Callable[[dict[str, Any]], None],
    ) -> None:
        """Tokenize every row's unit, in the given order, IN_FLIGHT at a time at each actor (an actor
        that finishes one takes the next unit); `on_summary` gets each summary as it arrives. An
        error that Ray's retries did not cure is raised as Ray raises it."""
        import ray

        todo = deque(rows)
        running: dict[Any, int] = {}  # result reference -> its actor

        def submit(a: int) -> None:
            method = self.actors[a].tokenize.options(retry_exceptions=[TransientStorageError])
            running[method.remote(cls, backend, todo.popleft())] = a

        for _ in range(IN_FLIGHT):
            for a in range(len(self.actors)):
                if todo:
                    submit(a)
        while running:
            [done], _ = ray.wait(list(running), num_returns=1)
            a = running.pop(done)
            on_summary(ray.get(done))
            if todo:
                submit(a)

    def close(self) -> None:
        """Stop the actors (their CPUs go to the assign and write tasks)."""
        import ray

        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
