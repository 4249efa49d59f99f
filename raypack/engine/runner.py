"""Where the job's tasks run: on Ray (a cluster, or a local Ray for a large corpus), or in a pool of
this machine's processes (a small corpus, no cluster). The stages do not know which: they hand their
task functions to a Runner, and every stage's data movement is written once against it. A runner
differs only in how a task runs and how a value moves between tasks (a blob): a Ray object, or a
file of the local pool (raypack.engine.pool). Either way:

- submit(fn, args) runs fn(*args) as a task and gives a handle; first_done(handles) waits for one;
  map and unordered are built on them;
- spread(fn, args, n) runs a generator task whose n yielded values become blobs as they are made;
  put(value) makes one on the driver; a task given a blob as an argument runs once the blob exists
  and gets its value; get(blob) reads one on the driver;
- a task whose worker dies is run again (RETRIES times), and so is one that met a transient storage
  error (raypack.engine.tasks), so each task must be idempotent (they are: a retry writes the same
  bytes at the same names);
- preload(fn, args) has the workers load what every task of the job needs (its tokenizer) before
  their first task: on Ray a task a CPU slot, locally once in the pool's zygote, before it forks.

The bytes written are the same whatever runs them (tested on every output format and mode).

Why a local runner at all: on 2 cores Ray's start took 3-4.5 s (its GCS, raylet, dashboard, agents and
prestarted workers, Python processes importing Ray on the cores the job needs), its shutdown 1.2-1.7 s,
and the workers' tokenizer load waited for both: 6.5 of the 10.7 s `raypack pack` took on 13 MB.
`run.executor` chooses (raypack.config.RunConfig); auto takes the local pool when no Ray cluster is
named (RAY_ADDRESS) or running in this process and the input is at most run.local_max_bytes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any

from raypack.engine.pool import LocalPool
from raypack.engine.tasks import task_options

if TYPE_CHECKING:  # (not imported: early_local runs before the config's imports, numba's among them)
    from raypack.config import RunConfig

__all__ = [
    "LocalRunner",
    "RayRunner",
    "Runner",
    "choose_runner",
    "cluster_cpus",
    "early_local",
    "ensure_ray",
    "local_cpus",
    "may_run_locally",
]

# The modules whose functions the local workers run: imported by the pool's zygote before it forks
# (0.3-0.5 s), so no worker imports them on its first task.
TASK_MODULES = (
    "raypack.pipeline.tokenize.pool",
    "raypack.pipeline.write.exchange",
    "raypack.pipeline.write.sharded",
    "raypack.pipeline.place.select",
    "raypack.pipeline.read",
    "raypack.convert",
)


class Runner:
    """What the stages see of where their tasks run (RayRunner, LocalRunner)."""

    name: str
    width: int
    """CPUs the tasks may use at once."""
    patterns: tuple[str, ...] | None
    """The transient storage errors' patterns the task functions take (tasks.transient)."""
    retried = 0
    """Tasks run again because their worker died (the local pool counts them; Ray does not say)."""
    maps_files = False
    """Every task runs on the driver's machine, so a task can map a local file another wrote (the
    write tasks then read tokens in place from the token files: raypack.pipeline.write.exchange)."""

    def nodes(self) -> dict[str, int]:
        """Task slots by node ({"": width} for one node, or one Ray schedules alone)."""
        return {"": self.width}

    def preload(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[None] | None:
        """fn(*args) in the workers before their tasks; its outcome, where the runner has one to
        give before a task meets it (a local pool's zygote runs it once for every worker)."""
        raise NotImplementedError

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


def choose_runner(run: RunConfig, input_bytes: int) -> str:
    """ "local" or "ray", for run.executor (auto: local without a cluster for a small input)."""
    if not may_run_locally(run):
        return "ray"
    if run.executor != "auto":
        return run.executor
    return "local" if input_bytes <= run.local_max_bytes else "ray"


def may_run_locally(run: RunConfig) -> bool:
    """Whether choose_runner can say "local" (known before the input is listed): run.executor local,
    or auto without a cluster named (RAY_ADDRESS) or running in this process."""
    if run.executor != "auto":
        return run.executor == "local"
    return _no_ray_named()


def _no_ray_named() -> bool:
    if os.environ.get("RAY_ADDRESS"):
        return False
    import sys

    return not ("ray" in sys.modules and sys.modules["ray"].is_initialized())  # a Ray this process runs


def early_local() -> LocalRunner | None:
    """A local runner started before anything else of a job, its zygote's imports (~0.5 s) then
    running beside the caller's own (the config's, the job's: ~0.5 s more), where a job could run
    on this machine (no RAY_ADDRESS, no Ray in this process). `raypack pack` and raypack.pack()
    start one first and hand it to the job, which closes it if the job runs on Ray after all
    (run.executor, a large input: ~0.5 s of one core spent). Measured, 500 MB with a 128k BPE:
    the workers were ready ~0.9 s later when the zygote started only once the job was imported."""
    return LocalRunner(local_cpus()) if _no_ray_named() else None


class RayRunner(Runner):
    name = "ray"

    def __init__(self) -> None:
        import ray

        # Only a Ray this runner started is shut down at the end: one the caller runs (a notebook,
        # a test session, main() called twice in a process) stays theirs.
        self.started = not ray.is_initialized()
        ensure_ray()
        self.width = cluster_cpus()
        self.patterns, self.options = task_options()
        self._remote: dict[Any, Any] = {}
        self._preloads: list[Any] = []
        self._nodes = _cpu_nodes()

    def nodes(self) -> dict[str, int]:
        return self._nodes if len(self._nodes) > 1 else {"": self.width}

    def _task(self, fn: Callable[..., Any]) -> Any:
        if fn not in self._remote:
            import ray

            self._remote[fn] = ray.remote(fn)
        return self._remote[fn]

    def preload(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """A task of fn a CPU slot, placed on each node in proportion (a worker process that ran one
        has what it loaded; Ray reuses it for the tasks that follow). No outcome: one is met by
        the tasks that need the state."""
        for node, slots in self.nodes().items():
            for _ in range(slots):
                self._preloads.append(self.submit(fn, args, node))

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], node: str = "", urgent: bool = False
    ) -> Any:
        return self._task(fn).options(**self.options, **_placed(node)).remote(*args)

    def first_done(self, handles: list[Any]) -> tuple[Any, Any]:
        import ray

        ready, _ = ray.wait(handles, num_returns=1)
        return ready[0], ray.get(ready[0])

    def spread(self, fn: Callable[..., Any], args: tuple[Any, ...], returns: int) -> list[Any]:
        if returns == 1:  # a Ray generator task needs two returns or more
            return [self._task(_single).options(**self.options).remote(fn, *args)]
        return list(self._task(fn).options(num_returns=returns, **self.options).remote(*args))

    def put(self, value: Any) -> Any:
        import ray

        return ray.put(value)

    def get(self, blob: Any) -> Any:
        import ray

        return ray.get(blob)

    def close(self, release: bool, failed: bool = False) -> None:
        import ray

        # A preload still running (a small job ends before every worker has loaded) is left to end:
        # ray.cancel raises KeyboardInterrupt in the worker, wherever it is, and one cut inside an
        # import (pandas, 0.2-0.4 s of a preload) left that module half-made for every later task
        # of the process ("module 'pandas' has no attribute 'core'" in a Ray Data read after it).
        # An error in one (a missing file, say) is the units' to raise.
        self._preloads = []
        if release and self.started:
            ray.shutdown()


def _single(fn: Callable[..., Any], *args: Any) -> Any:
    """Ray task: the one value fn's generator yields."""
    (value,) = fn(*args)
    return value


def _cpu_nodes() -> dict[str, int]:
    """The alive nodes that have CPUs, and how many (a KubeRay head often has none)."""
    import ray

    found = {
        str(n["NodeID"]): int(n.get("Resources", {}).get("CPU", 0)) for n in ray.nodes() if n.get("Alive")
    }
    return {node: cpus for node, cpus in sorted(found.items()) if cpus >= 1}


def _placed(node: str) -> dict[str, Any]:
    """Task options that place a task on `node`, softly (anywhere if it is gone); {} for "": Ray's."""
    if not node:
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node, soft=True)}


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


class LocalRunner(Runner):
    """A pool of `width` processes of this machine (raypack.engine.pool): made at once, so
    its zygote imports the task modules while the driver reads the config, the tokenizer and the
    input listing; its workers are forked at start(), after the job's preload (and its early loads,
    which run beside the preload in the zygote)."""

    name = "local"
    maps_files = True
    # tasks.transient reads Ray Data's list on an error (none imported before).
    patterns: tuple[str, ...] | None = None

    def __init__(self, width: int) -> None:
        self.width = width
        self.pool = LocalPool(width, TASK_MODULES)

    def blobs_in(self, directory: str | None) -> None:
        """Where the blobs go (None: the system temp dir); before the first is made."""
        self.pool.blob_base = directory

    def early(self, loads: dict[str, tuple[str, str, tuple[Any, ...]]]) -> None:
        self.pool.early(loads)

    def flush(self) -> None:
        self.pool.flush()

    @property
    def retried(self) -> int:  # type: ignore[override]
        return self.pool.retried

    def preload(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> Future[None]:
        return self.pool.preload(fn, args)

    @property
    def forked(self) -> bool:
        return self.pool.forked

    def start(self) -> None:
        self.pool.start()

    def submit(
        self, fn: Callable[..., Any], args: tuple[Any, ...], node: str = "", urgent: bool = False
    ) -> Any:
        future, _ = self.pool.submit(fn, args, urgent=urgent)
        return future

    def first_done(self, handles: list[Future[Any]]) -> tuple[Future[Any], Any]:
        finished, _ = wait(handles, return_when=FIRST_COMPLETED)
        done = next(f for f in handles if f in finished)
        return done, done.result()

    def spread(self, fn: Callable[..., Any], args: tuple[Any, ...], returns: int) -> list[Any]:
        _, blobs = self.pool.submit(fn, args, returns=returns)
        return blobs

    def put(self, value: Any) -> Any:
        return self.pool.put(value)

    def get(self, blob: Any) -> Any:
        return self.pool.get(blob)

    def discard_blobs(self) -> None:
        self.pool.discard_blobs()

    def close(self, release: bool, failed: bool = False) -> None:
        self.pool.close(kill=failed)
