"""The tokenize stage's actors: plain Ray actors, started as soon as the work units are known, fed
units by the driver.

Each actor loads the tokenizer (and fastokens' copy of it) as it starts (tokenize.preload), while the
driver still checks the chat template and the backend; the backend's self-check encodes its probes
and corpus sample with the first actor's fastokens (RemoteFast), so the driver never loads fastokens
itself. Then the actors run TokenizeShards on the units they are given: the driver keeps IN_FLIGHT
units queued at each actor, largest units first, folds each summary as it arrives, and stops each
actor as soon as it has nothing left to do.

Why not Ray Data's actor pool (what this stage was until issue 20): its actors start only when the
dataset executes, so their ~2 s of loading came after the driver's self-check instead of beside
it, and the pool itself took ~4 s to start whatever the work (8 or 80 trivial units: 4.6 s / 3.9 s;
80 plain tasks 1.2 s), with ~20 ms between one unit and the next at each actor. On 500 MB of text,
2 cores, a 128k vocabulary and fastokens, the stage took 12.4-13.3 s with 5.2 s of it before the
first unit began; with these actors 4.5-5.0 s (docs/benchmarks.md, run 14).

Ray objects: one actor per CPU used (tokenizer.concurrency), one actor task and one summary (~2 KB:
a sparse histogram and counts) per unit, at most IN_FLIGHT × actors alive at once. The driver holds
the unit rows (~300 bytes each) and those references. Faults are Ray's to cure: an actor whose
process or node dies is restarted (it loads again) and its queued units are retried (RETRIES
times); a transient storage error is retried after a pause (exchange.transient). A unit is redone
from its input, so a retry writes the same token file.
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

__all__ = ["IN_FLIGHT", "RemoteFast", "TokenizePool", "TokenizeWorker"]

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

    def fast_status(self) -> tuple[str, str]:
        """fastokens' version here, and why it did not load ("" when it did)."""
        loaded = preload(self.cfg, fast=True)
        return (loaded.fast.version if loaded.fast is not None else "", loaded.fast_error)

    def fast_encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        loaded = preload(self.cfg, fast=True)
        if loaded.fast is None:
            raise ValueError(loaded.fast_error)
        return loaded.fast.encode(texts)

    def tokenize(self, cls: type[TokenizeShards], backend: str, row: dict[str, Any]) -> dict[str, Any]:
        with transient(self.patterns):
            if self.shards is None:
                self.shards = cls(self.cfg, backend)
            out = self.shards({k: np.asarray([v]) for k, v in row.items()})
            return {k: v[0] for k, v in out.items()}


class RemoteFast:
    """A tokenize actor's fastokens, as an Encoder for the driver's self-check
    (backends.choose_backend): the driver never loads fastokens itself (1.1 s for a 128k BPE, on
    CPUs the starting actors need). ValueError, with fastokens' reason, when it refused the
    tokenizer on that actor."""

    name = "fastokens"

    def __init__(self, actor: Any) -> None:
        import ray

        self.actor = actor
        self.version, error = ray.get(actor.fast_status.remote())
        if error:
            raise ValueError(error)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        import ray

        flat, lengths = ray.get(self.actor.fast_encode.remote(texts))
        return flat, lengths


class TokenizePool:
    """TokenizeWorker actors of one CPU each, started as they are asked for; run() feeds them units."""

    def __init__(self, cfg: JobConfig, size: int, fast: bool) -> None:
        self.cfg, self.fast = cfg, fast
        self.patterns, _ = task_options()
        self.actors: list[Any] = []
        self.grow(size)

    def grow(self, size: int) -> None:
        """Start actors, up to `size` in all."""
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
        queued = [0] * len(self.actors)

        def submit(a: int) -> None:
            method = self.actors[a].tokenize.options(retry_exceptions=[TransientStorageError])
            running[method.remote(cls, backend, todo.popleft())] = a
            queued[a] += 1

        for _ in range(IN_FLIGHT):
            for a in range(len(self.actors)):
                if todo:
                    submit(a)
        for a in range(len(self.actors)):
            if not queued[a]:  # more actors than units
                self._release(a)
        while running:
            [done], _ = ray.wait(list(running), num_returns=1)
            a = running.pop(done)
            queued[a] -= 1
            on_summary(ray.get(done))
            if todo:
                submit(a)
            elif not queued[a]:
                self._release(a)

    def fast_encoder(self) -> RemoteFast:
        """The first actor's fastokens (it waits for the actor to have loaded)."""
        return RemoteFast(self.actors[0])

    def _release(self, a: int) -> None:
        """An actor with nothing left to do stops at once: its CPU goes to the driver's plan and the
        next stage's worker processes (~1.5 s to start on 2 busy cores) while the others finish."""
        import ray

        ray.kill(self.actors[a])
        self.actors[a] = None

    def close(self) -> None:
        """Stop the actors still up (after run(): none)."""
        import ray

        for actor in self.actors:
            if actor is not None:
                ray.kill(actor)
        self.actors = []
