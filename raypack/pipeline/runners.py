"""Where the job's tasks run: on Ray (a cluster, or a local Ray for a large corpus), or in a pool of
worker processes of this machine (a small corpus, no cluster). The stages do not know which: they
hand their task functions to the runner (map, unordered) and build their tokenize pool and exchange
from it; the task functions are the same either way, so the bytes written are the same (tested).

Why a local runner at all: on 2 cores Ray's start took 3-4.5 s (its GCS, raylet, dashboard, agents
and prestarted workers, Python processes importing Ray on the cores the job needs), its shutdown
1.2-1.7 s, and the workers' tokenizer load waited for both: 6.5 of the 10.7 s `raypack pack` took on
13 MB. A local pool forks this process once its tokenizer is parsed (workers inherit it: no second
parse, no Ray import), and is gone in milliseconds.

What a local run gives up: a worker killed mid-task (the OOM killer, say) fails the job, where Ray
would retry the task; a transient storage error is retried as on Ray (RETRIES times, after a pause).
`run.executor` chooses (raypack.config.RunConfig); auto takes the local pool when no Ray cluster
is named (RAY_ADDRESS) or running in this process and the input is at most run.local_max_bytes.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, Protocol

from raypack.config import JobConfig
from raypack.pipeline.tasks import RETRIES, TransientStorageError, task_options

__all__ = [
    "LocalRunner",
    "RayRunner",
    "Runner",
    "choose_runner",
    "cluster_cpus",
    "ensure_ray",
    "forks",
    "local_cpus",
    "may_run_locally",
]


class Runner(Protocol):
    name: str
    width: int
    """CPUs the tasks may use at once."""
    patterns: tuple[str, ...] | None
    """The transient storage errors' patterns the task functions take (tasks.transient)."""

    def map(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
        """fn(*call) for every call, each a task (retried on a transient storage error); the results
        in order."""
        ...

    def unordered(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        """(call index, result) of every call, as each task finishes."""
        ...

    def close(self, release: bool) -> None:
        """Give back what the runner holds; `release`: a Ray this process started is shut down."""
        ...


def local_cpus() -> int:
    """The CPUs this process may run on (its affinity: a container's share, not the host's)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def choose_runner(cfg: JobConfig, input_bytes: int) -> str:
    """ "local" or "ray", for run.executor (auto: local without a cluster for a small input)."""
    if not may_run_locally(cfg):
        return "ray"
    if cfg.run.executor != "auto":
        return cfg.run.executor
    return "local" if input_bytes <= cfg.run.local_max_bytes else "ray"


def may_run_locally(cfg: JobConfig) -> bool:
    """Whether choose_runner can say "local" (known before the input is listed): run.executor local,
    or auto without a cluster named (RAY_ADDRESS) or running in this process."""
    if cfg.run.executor != "auto":
        return cfg.run.executor == "local"
    if os.environ.get("RAY_ADDRESS"):
        return False
    import sys

    return not ("ray" in sys.modules and sys.modules["ray"].is_initialized())  # a Ray this process runs


def forks() -> bool:
    """Whether a LocalRunner made now forks its workers: when this process runs no other thread
    (what `raypack pack` is when it gets there), so no lock can be copied held. Else (a process
    connected to Ray, a test session, a rebuild's lease keeper) they are spawned and load alone."""
    return threading.active_count() == 1


class RayRunner:
    name = "ray"

    def __init__(self) -> None:
        import ray

        # Only a Ray this runner started is shut down at the end: one the caller runs (a notebook,
        # a test session, main() called twice in a process) stays theirs.
        self.started = not ray.is_initialized()
        ensure_ray()
        self.width = cluster_cpus()
        self.patterns, self.options = task_options()

    def map(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
        import ray

        task = ray.remote(fn).options(**self.options)
        return list(ray.get([task.remote(*c) for c in calls]))

    def unordered(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        import ray

        task = ray.remote(fn).options(**self.options)
        index = {task.remote(*c): i for i, c in enumerate(calls)}
        pending = list(index)
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            yield index[done], ray.get(done)

    def close(self, release: bool) -> None:
        if release and self.started:
            import ray

            ray.shutdown()


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


def cluster_cpus() -> int:
    """The cluster's CPUs: the tokenize tasks' default count and the exchange's width."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _retried(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) in a worker, again after a TransientStorageError (which waited its pause), as Ray
    retries a task: RETRIES times."""
    for attempt in range(RETRIES + 1):
        try:
            return fn(*args)
        except TransientStorageError:
            if attempt == RETRIES:
                raise
    raise AssertionError("unreachable")


class LocalRunner:
    """A pool of `width` worker processes of this machine, forked from this one (what it has loaded,
    the tokenizer and numba's compiled functions, is theirs without a second load)."""

    name = "local"
    # tasks.transient reads Ray Data's list on an error (none imported before).
    patterns: tuple[str, ...] | None = None

    def __init__(
        self, width: int, initializer: Callable[..., Any] | None = None, initargs: tuple[Any, ...] = ()
    ) -> None:
        self.width = width
        method = "fork" if forks() else "spawn"
        self.forked = method == "fork"
        """The workers have what this process had loaded (preload) when it was built."""
        self.pool = ProcessPoolExecutor(
            width, mp_context=multiprocessing.get_context(method), initializer=initializer, initargs=initargs
        )
        # The workers are forked at the first submission (all of them, with the fork method): now,
        # while this process holds no thread but its own, and they start loading at once.
        self.pool.submit(int)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        return self.pool.submit(_retried, fn, *args)

    def map(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> list[Any]:
        futures = [self.submit(fn, *c) for c in calls]
        return [f.result() for f in futures]

    def unordered(self, fn: Callable[..., Any], calls: list[tuple[Any, ...]]) -> Iterator[tuple[int, Any]]:
        index = {self.submit(fn, *c): i for i, c in enumerate(calls)}
        pending = set(index)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in done:
                yield index[f], f.result()

    def close(self, release: bool) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
