"""What the stages see of where their tasks run: the Runner protocol. A runner differs from another
only in how a task runs and how a value moves between tasks (a blob), and in the capabilities it
declares; the stages never ask which runner runs them. Either way:

- submit(fn, args) runs fn(*args) as a task and gives a handle; first_done(handles) waits for one;
  map and unordered are built on them;
- spread(fn, args, n) runs a generator task whose n yielded values become blobs as they are made;
  put(value) makes one on the driver; a task given a blob as an argument runs once the blob exists
  and gets its value; get(blob) reads one on the driver;
- a task whose worker dies is run again (tasks.RETRIES times), and so is one that met a transient
  storage error (raypack.engine.tasks), so each task must be idempotent (they are: a retry writes
  the same bytes at the same names);
- preload(fn, args) has the workers load what every task of the job needs (its tokenizer) before
  their first task.

The bytes written are the same whatever runs them (tested on every output format and mode).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

__all__ = ["Runner", "local_cpus"]


class Runner:
    """A way to run the job's tasks: raypack.engine.ray's RayRunner or raypack.engine.local's
    LocalRunner, opened by raypack.engine (open_runner, runner_for)."""

    name: str
    """What the manifest records of where the tasks ran: "ray" or "local"."""
    where: str
    """Where the tasks run, in a message: "Ray CPUs", "local processes"."""
    width: int
    """CPUs the tasks may use at once."""
    patterns: tuple[str, ...] | None
    """The transient storage errors' patterns the task functions take (tasks.transient)."""
    retried = 0
    """Tasks run again because their worker died (the local pool counts them; Ray does not say)."""
    shares_disk = False
    """Every task runs on the driver's machine: a task can map a local file another wrote (the write
    tasks then read tokens in place from the token files: raypack.pipeline.write.exchange), and the
    driver may read the input as well as a task can."""
    inherits_preload = False
    """A preload runs once, in the process the workers are forked from, before they are: the driver
    hands it the bytes it read (the workers read no storage for it), and its outcome comes back
    (preload's Future) before a task meets it. Elsewhere a preload runs in every worker slot, each
    reading what it needs."""

    def nodes(self) -> dict[str, int]:
        """Task slots by node ({"": width} for one node, or one Ray schedules alone)."""
        return {"": self.width}

    def preload(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[None] | None:
        """fn(*args) in the workers before their tasks; its outcome, where the runner has one to
        give before a task meets it (inherits_preload)."""
        raise NotImplementedError

    def takes_preload(self) -> bool:
        """Whether a preload asked now reaches the workers (a local pool's, once forked, would not:
        each then loads what it needs on its first task)."""
        return True

    def early(self, loads: dict[str, tuple[str, str, tuple[Any, ...]]]) -> None:
        """Loads by key, (module, callable's dotted name, plain arguments), started at once where a
        preload will be inherited, for the preload to take (raypack.engine.zygote.early); nothing
        elsewhere."""

    def start(self) -> None:
        """The workers started, after any preload (submitting starts them too); nothing where they
        are running already."""

    def flush(self) -> None:
        """Wait until what was asked of the runner is on its way (a local pool's zygote has its
        messages: LocalPool.flush); nothing to wait for elsewhere."""

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], node: str = "", urgent: bool = False
    ) -> Any:
        """fn(*args) as a task (on `node` where it can; `urgent`: ahead of tasks still waiting, where
        the runner can tell); its handle."""
        raise NotImplementedError

    def first_done(self, handles: list[Any]) -> tuple[Any, Any]:
        """The first of `handles` to finish (the earliest in the list if several have), and its
        result; the task's exception if it failed."""
        raise NotImplementedError

    def spread(self, fn: Callable[..., Any], args: tuple[Any, ...], returns: int) -> list[Any]:
        """fn(*args) as a task, its generator's `returns` values stored as blobs as it yields them."""
        raise NotImplementedError

    def put(self, value: Any) -> Any:
        raise NotImplementedError

    def get(self, blob: Any) -> Any:
        raise NotImplementedError

    def discard_blobs(self) -> None:
        """The blobs made so far are done with (Ray frees each once nothing refers to it)."""

    def close(self, release: bool, failed: bool = False) -> None:
        """Give back what the runner holds; `release`: a Ray this process started is shut down;
        `failed`: the job failed, tasks still running are stopped."""
        raise NotImplementedError

    def unordered(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        """(call index, result) of every call, as each task finishes."""
        index = {self.submit(fn, c): i for i, c in enumerate(calls)}
        pending = list(index)
        while pending:
            done, value = self.first_done(pending)
            pending.remove(done)
            yield index[done], value

    def map(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
        """fn(*call) for every call, each a task; the results in order."""
        out: list[Any] = [None] * len(calls)
        for i, value in self.unordered(fn, calls):
            out[i] = value
        return out


def local_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)
