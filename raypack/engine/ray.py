"""Tasks on Ray: a cluster (RAY_ADDRESS), or a local Ray started for a job too large for this
machine's pool. A task is a Ray task of one CPU, retried by Ray (raypack.engine.tasks); a blob is a
Ray object; a preload is a task a CPU slot, whose worker process Ray reuses for the tasks after it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from raypack.engine.auth import check_cluster, connect_error
from raypack.engine.runner import Runner
from raypack.engine.tasks import task_options

__all__ = ["RayRunner", "cluster_cpus", "ensure_ray", "node_id", "ray_running"]


class RayRunner(Runner):
    """Tasks on Ray: the cluster RAY_ADDRESS names, or a local Ray started for the job (ensure_ray)."""

    name = "ray"
    where = "Ray CPUs"

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
        # import (pandas, 0.2-0.4 s of a preload) leaves that module half-made for every later task
        # of the process (a Ray Data read after it: "module 'pandas' has no attribute 'core'").
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
    long as the command, so it starts without its dashboard (a process of its own: ray.init takes
    ~1 s longer with it, on 2 cores) unless RAYPACK_DASHBOARD=1."""
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
            if address:
                check_cluster(address)
            ray.init(address=address, logging_level=logging.WARNING, include_dashboard=dashboard)
        except Exception as e:
            mapped = connect_error(address, e) if address else None
            if mapped is None:
                raise
            raise mapped from None
        finally:
            notice.setLevel(level)


def cluster_cpus() -> int:
    """The cluster's CPUs: the tokenize tasks' default count and the exchange's width."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def ray_running() -> bool:
    """Whether this process runs a Ray already (a notebook's, a test session's, a Ray task's)."""
    import sys

    return "ray" in sys.modules and sys.modules["ray"].is_initialized()


def node_id() -> str:
    """The Ray node this process runs on, "" outside Ray (a local pool's workers never import it)."""
    if not ray_running():
        return ""
    import ray

    return str(ray.get_runtime_context().get_node_id())
