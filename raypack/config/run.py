"""run: where the job's tasks run (raypack.engine)."""

from __future__ import annotations

from dataclasses import dataclass

from raypack.errors import ConfigError

__all__ = ["EXECUTORS", "RunConfig"]

EXECUTORS = ("auto", "local", "ray")


@dataclass(frozen=True, kw_only=True, slots=True)
class RunConfig:
    """Where the job's tasks run: this machine's processes or Ray."""

    executor: str = "auto"
    """ray: Ray tasks (RAY_ADDRESS's cluster, or a local Ray started for the job); local: a pool of
    this machine's processes, the job's own (raypack.engine.pool: no Ray start or shutdown,
    ~5 s less on 2 cores; a killed worker's task runs again, as on Ray); auto: local when no Ray
    cluster is named (RAY_ADDRESS) or running in this process and the input is at most
    local_max_bytes, else ray. The output's bytes are the same either way."""
    local_max_bytes: int = 1 << 30
    """auto: the most input bytes (as stored, compressed or not) a local run takes."""

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise ConfigError(f"run.executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.local_max_bytes < 0:
            raise ConfigError(f"run.local_max_bytes must be >= 0, got {self.local_max_bytes}")
