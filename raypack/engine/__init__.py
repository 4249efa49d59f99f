"""How a task runs and a blob moves: the Runner protocol (runner.py), Ray (ray.py), and a pool of
this machine's processes (local.py, pool.py, zygote.py), with what every storage task shares
(tasks.py). Which runner a job gets is decided here, and nowhere else:

    start_local()      a pool started before anything else of a command (its zygote's imports then
                       run beside the command's), where the job may run on this machine
    runner_for(...)    the job's runner once its input's size is known: that pool, or Ray
    open_runner(...)   the same choice for work with no tokenizer to share (convert)

run.executor chooses: ray, local, or auto (this machine's processes when no Ray cluster is named
(RAY_ADDRESS) or running in this process and the input is at most run.local_max_bytes).

Nothing here imports the config or numba at import time: start_local runs first in a command.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from raypack.engine.ray import ensure_ray, node_id, ray_running
from raypack.engine.runner import Runner, local_cpus
from raypack.engine.tasks import RETRIES, TransientStorageError, transient

if TYPE_CHECKING:
    from raypack.config import RunConfig

__all__ = [
    "RETRIES",
    "Runner",
    "TransientStorageError",
    "choose",
    "ensure_ray",
    "local_cpus",
    "may_run_locally",
    "node_id",
    "open_runner",
    "runner_for",
    "start_local",
    "transient",
]


def choose(run: RunConfig, input_bytes: int) -> str:
    """ "local" or "ray", for run.executor (auto: local without a cluster for a small input)."""
    if not may_run_locally(run):
        return "ray"
    if run.executor != "auto":
        return run.executor
    return "local" if input_bytes <= run.local_max_bytes else "ray"


def may_run_locally(run: RunConfig) -> bool:
    """Whether choose can say "local" (known before the input is listed): run.executor local, or
    auto without a cluster named (RAY_ADDRESS) or running in this process."""
    if run.executor != "auto":
        return run.executor == "local"
    return _no_ray_named()


def _no_ray_named() -> bool:
    return not os.environ.get("RAY_ADDRESS") and not ray_running()


def start_local() -> Runner | None:
    """A pool of this machine's processes started before anything else of a job, its zygote's
    imports (~0.5 s) then running beside the caller's own (the config's, the job's: ~0.5 s more),
    where a job could run on this machine (no RAY_ADDRESS, no Ray in this process). `raypack pack`
    and raypack.pack() start one first and hand it to the job, which closes it if the job runs on
    Ray after all (run.executor, a large input: ~0.5 s of one core spent). On a 500 MB job with a
    128k BPE, the workers are ready ~0.9 s sooner than with a pool started once the job is
    imported."""
    from raypack.engine.local import LocalRunner

    return LocalRunner(local_cpus()) if _no_ray_named() else None


def local_runner_for(
    run: RunConfig, given: Runner | None, cluster_only: bool, blob_dir: str | None
) -> Runner | None:
    """The pool a job may run on, before its input is listed: `given` (start_local's) or a new one,
    where run.executor allows this machine and nothing needs a cluster (`cluster_only`: a Ray
    Dataset's blocks live in Ray); else None, `given` closed. Its blobs go under `blob_dir` (None:
    the system temp dir)."""
    from raypack.engine.local import LocalRunner

    if cluster_only or not may_run_locally(run):
        if given is not None:
            given.close(release=False, failed=True)
        return None
    local = given if given is not None else LocalRunner(local_cpus())
    assert isinstance(local, LocalRunner)
    local.blobs_in(blob_dir)
    return local


def runner_for(run: RunConfig, input_bytes: int, local: Runner | None, cluster_only: bool = False) -> Runner:
    """The job's runner once its input's size is known: `local` (local_runner_for's) where choose
    keeps the job on this machine, else Ray (started, or connected to), `local` closed."""
    if local is not None and not cluster_only and choose(run, input_bytes) == "local":
        return local
    if local is not None:
        local.close(release=False, failed=True)
    from raypack.engine.ray import RayRunner

    return RayRunner()


def open_runner(run: RunConfig, input_bytes: int, blob_dir: str | None) -> Runner:
    """The runner for work without a tokenizer to share (convert), started."""
    local = local_runner_for(run, None, False, blob_dir) if choose(run, input_bytes) == "local" else None
    runner = runner_for(run, input_bytes, local)
    runner.start()
    return runner
