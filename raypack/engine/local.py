"""Tasks on this machine's processes: a pool of one worker a CPU for one job (raypack.engine.pool),
forked from a zygote of the job's own (raypack.engine.zygote), with no Ray to start or stop.

Why a local runner at all: on 2 cores Ray's start (its GCS, raylet, dashboard, agents and
prestarted workers, Python processes importing Ray on the cores the job needs) and its shutdown take
4-6 s, and the workers' tokenizer load waits for both: more than half of a 13 MB `raypack pack` on
Ray. run.executor chooses (raypack.engine.choose).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from raypack.engine.pool import LocalPool
from raypack.engine.runner import Runner

__all__ = ["TASK_MODULES", "LocalRunner"]

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


class LocalRunner(Runner):
    """A pool of `width` processes of this machine (raypack.engine.pool): made at once, so its
    zygote imports the task modules while the driver reads the config, the tokenizer and the input
    listing; its workers are forked at start(), after the job's preload (and its early loads, which
    run beside the preload in the zygote)."""

    name = "local"
    where = "local processes"
    shares_disk = True
    inherits_preload = True
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

    def takes_preload(self) -> bool:
        return not self.pool.forked

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
