"""Row groups decoded once per DataLoader and shared by its workers (torch_data.PackedDataset).

Why: batches must reach the training loop in step order whatever num_workers is, and torch's
DataLoader takes batches from its workers in turn, so worker w of W yields steps w, w + W, ....
Consecutive steps share row groups (1,024 packs each; a step takes batch_size of them), so each
worker on its own would read and decode every row group of its rank: W× the I/O and the CPU.

Instead the first worker that needs a row group decodes it (holding `<key>.lock`, made with O_EXCL) and
writes it as an Arrow IPC file into a directory shared by the loader's workers; the others wait for
that file and memory-map it (no copy). A worker that has built its last batch touching a group
marks it done; when every worker that needs it has, the file goes. The directory lives in /dev/shm
when it has room (RAYPACK_LOADER_CACHE names another), one per DataLoader iterator, removed by the
last worker to finish; a directory left by a dead process is swept by the next loader.

Nothing here can change what a batch holds: a group whose file is gone (a crash, a full disk, an
estimate below) is decoded again by whoever needs it. Workers count who needs a group from their own
resume point: after a StatefulDataLoader resume they may overcount by the steps around it (a file
then stays until the epoch's end) or undercount (a second decode); on a fresh epoch the count is
exact. Memory: the groups in flight, about W + 2 of them (~32 MiB each for 1,024 packs of 8,192
int32 tokens).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

__all__ = ["SharedGroups", "cache_base"]

Key = tuple[int, int]
_PREFIX = "raypack-loader-"
_MIN_SHM_FREE = 1 << 30


def cache_base() -> Path:
    """Where loaders put their directories: RAYPACK_LOADER_CACHE, else /dev/shm when it has 1 GiB
    free (containers often give it 64 MiB), else the temporary directory."""
    named = os.environ.get("RAYPACK_LOADER_CACHE")
    if named:
        return Path(named)
    shm = Path("/dev/shm")
    with contextlib.suppress(OSError):
        st = os.statvfs(shm)
        if st.f_bavail * st.f_frsize >= _MIN_SHM_FREE and os.access(shm, os.W_OK):
            return shm
    return Path(tempfile.gettempdir())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mapped(path: Path) -> pa.Table:
    """A shared group's table, memory-mapped (FileNotFoundError when nobody has shared it)."""
    return pa.ipc.open_file(pa.memory_map(str(path))).read_all()


def sweep_dead(base: Path) -> None:
    """Remove loader directories whose process (the pid in their name) is gone."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            if not entry.name.startswith(_PREFIX):
                continue
            pid = entry.name[len(_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry, ignore_errors=True)


class SharedGroups:
    """One worker's view of the shared directory for one epoch of one loader."""

    def __init__(
        self,
        token: str,
        worker: int,
        workers: int,
        start: int,
        first: int,
        touches: list[list[Key]],
        read: Callable[[int, int], pa.Table],
    ) -> None:
        """`token`: the same in every worker of one loader iterator (and nowhere else); `start`: this
        worker's first step; `first`: the loader's first step; `touches[i]`: the groups step
        first + i reads (reader.Plan.touches)."""
        base = cache_base()
        parent = os.getppid()  # the DataLoader's process: the directory's life is bounded by it
        sweep_dead(base)
        digest = hashlib.blake2b(token.encode(), digest_size=8).hexdigest()
        self.dir = base / f"{_PREFIX}{parent}-{digest}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.worker, self.workers, self.read_group = worker, workers, read
        self.needers: dict[Key, set[int]] = {}
        last_use: dict[Key, int] = {}  # this worker's last step reading each group
        for i, keys in enumerate(touches):
            step = first + i
            owner = step % workers
            for key in keys:
                self.needers.setdefault(key, set()).add(owner)
                if owner == worker and step >= start:
                    last_use[key] = step
        self.retire_at: dict[int, list[Key]] = {}
        for key, step in last_use.items():
            self.retire_at.setdefault(step, []).append(key)

    def _path(self, key: Key, suffix: str) -> Path:
        return self.dir / f"g{key[0]}-{key[1]}{suffix}"

    def load(self, bucket: int, group: int) -> pa.Table:
        """The group's table: mapped from the shared file, or decoded here (and shared) when nobody
        has; waits while another worker decodes it."""
        key = (bucket, group)
        data, lock = self._path(key, ".arrow"), self._path(key, ".lock")
        pause = 0.001
        while True:
            with contextlib.suppress(FileNotFoundError):
                return _mapped(data)
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                self._clear_if_dead(lock)
                time.sleep(pause)
                pause = min(pause * 2, 0.02)
                continue
            except OSError:  # the directory is gone or unwritable: decode alone
                return self.read_group(*key)
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            try:
                # Looked for again under the lock: the worker that held it may have shared the file
                # between our look and our lock (else the group is decoded twice).
                with contextlib.suppress(FileNotFoundError):
                    return _mapped(data)
                return self._decode_and_share(key, data)
            finally:
                with contextlib.suppress(OSError):
                    lock.unlink()

    def _decode_and_share(self, key: Key, data: Path) -> pa.Table:
        table = self.read_group(*key)
        if self.needers.get(key, set()) <= {self.worker}:
            return table  # nobody else reads it
        tmp = data.with_suffix(f".tmp{os.getpid()}")
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, data)
        except OSError:  # no room: the others decode it themselves
            with contextlib.suppress(OSError):
                tmp.unlink()
        return table

    @staticmethod
    def _clear_if_dead(lock: Path) -> None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(lock.read_text() or "0")
            if pid and not _alive(pid):
                lock.unlink()

    def done(self, step: int) -> None:
        """This worker has built step `step`'s batch: give up the groups it read for the last time."""
        for key in self.retire_at.pop(step, []):
            marker = self._path(key, f".done{self.worker}")
            with contextlib.suppress(OSError):
                marker.touch()
            needers = self.needers.get(key, set())
            if all(self._path(key, f".done{u}").exists() for u in needers):
                for path in [self._path(key, ".arrow"), *(self._path(key, f".done{u}") for u in needers)]:
                    with contextlib.suppress(OSError):
                        path.unlink()

    def close(self) -> None:
        """This worker is finished (or abandoned) with the epoch; the last one out removes the directory."""
        with contextlib.suppress(OSError):
            (self.dir / f"exit{self.worker}").touch()
            if all((self.dir / f"exit{u}").exists() for u in range(self.workers)):
                shutil.rmtree(self.dir, ignore_errors=True)
