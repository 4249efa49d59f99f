"""The job's input files: input.paths' (or each source's), listed once on the driver, each a
whole-file work unit with its source's Reading."""

from __future__ import annotations

import dataclasses

from raypack.config import InputConfig, StorageConfig
from raypack.corpus.units import WorkUnit
from raypack.errors import ConfigError
from raypack.storage import expand_inputs

__all__ = ["input_files"]


def input_files(cfg: InputConfig, storage: StorageConfig | None = None) -> list[WorkUnit]:
    """Every input file as a whole-file work unit, numbered in order, with its source's Reading:
    input.paths' (storage.expand_inputs), or each source's, sources by name, a source's files
    relative to its root under `<name>/` (so ids never collide and listing sources in another order
    changes nothing). A file two sources both match is a ConfigError: its documents would be counted
    twice. Sources given as Ray Datasets (input.datasets) have no files here."""
    if not cfg.sources:
        if cfg.is_dataset():
            return []
        reading = cfg.reading()
        return [WorkUnit(f, reading) for f in expand_inputs(cfg.paths, cfg.root, storage)]
    files: list[WorkUnit] = []
    owner: dict[str, str] = {}
    for source in sorted(cfg.sources, key=lambda s: s.name):
        if cfg.is_dataset(source.name):  # its rows come from a Ray Dataset (raypack.corpus.datasets)
            continue
        one = cfg.of(source.name)
        reading = cfg.reading(source.name)
        try:
            found = expand_inputs(one.paths, one.root, storage)
        except ConfigError as e:
            raise ConfigError(f"input.sources[{source.name}]: {e}") from None
        for f in found:
            if f.path in owner:
                raise ConfigError(
                    f"{f.path} matches the paths of sources {owner[f.path]} and {source.name}: a file "
                    "belongs to one source"
                )
            owner[f.path] = source.name
            relpath = f"{source.name}/{f.relpath}"
            shard = dataclasses.replace(f, index=len(files), relpath=relpath, source=source.name)
            files.append(WorkUnit(shard, reading))
    return files
