"""A lease on a rebuild's output root: one `raypack rebuild` at a time writes under it.

Without it, two rebuilds of one root damage each other: each takes the next version number from a
listing, each sweeps the other's unfinished version as a crash's leftover and deletes its cache
temporaries, and the slower one moves LATEST back to its older version. So a rebuild holds
`<root>/_lease.json` (its owner id, host, pid, the version it builds, and an expiry) from before it
reads the root until after it prunes; a second rebuild waits for it (`--wait`) or exits 2 naming
the holder.

Taking the lease. pyarrow's filesystems offer no conditional put (S3's If-None-Match is not exposed),
so a lease is taken by write, wait, read back: a contender that found the root free writes its
record, waits SETTLE (at least SETTLE_MIN_S, and 10× what its own write took), and reads the
record again; only the one whose record is there then holds it (S3 reads are strongly consistent,
so of two that wrote, both read the last write). Two contenders can both win only if one took
longer than SETTLE between finding the root free and its write landing. A local root is created
with O_EXCL, which no race can pass.

Keeping it. A daemon thread renews the expiry every TTL_S / 5; a rebuild whose process stops (killed,
or the machine gone) leaves a lease that expires after TTL_S, and the next rebuild takes it over. One
that died on the machine of the next (the same boot and pid namespace, its pid gone or another
process's now) is seen dead at once: a `kill -9` does not hold the root for TTL_S.
Before LATEST moves, the holder checks the lease is still its own (`check`): a rebuild paused past
its expiry, whose root another rebuild took, commits nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

import pyarrow.fs as pafs

from raypack.config import StorageConfig
from raypack.errors import ConfigError, JobError
from raypack.storage import is_uri, join, read_bytes, remove, resolve, write_bytes_atomic

__all__ = ["LEASE", "Lease", "LeaseHeld", "LeaseLost"]

LEASE = "_lease.json"
TTL_S = 300.0
"""A lease not renewed for this long is free. Renewed every TTL_S / 5 = 60 s."""
SETTLE_MIN_S = 2.0
_POLL_S = 2.0
UNREADABLE_S = 10.0
"""A lease record that does not parse (empty, cut, not a lease) and was last written this long ago
is free: a live rebuild writes a whole record in milliseconds (locally an exclusive create then one
write; on S3 an atomic put), so only a dead one leaves it so. Younger, it is held, as a record is."""


class LeaseHeld(ConfigError):
    """Another rebuild holds the root: one line naming it, exit code 2."""


class LeaseLost(JobError):
    """This rebuild's lease expired and another took the root: it commits nothing."""


@dataclass(frozen=True, slots=True)
class Holder:
    owner: str
    host: str
    pid: int
    acquired: float
    expires: float
    version: int | None = None
    machine: str = ""
    """The holder's boot and pid namespace ("" where /proc does not say, and in older records)."""
    pid_start: int = 0
    """When its process started (clock ticks since boot): a pid reused since is another process."""

    def dead(self) -> bool:
        """Its process is gone, as this machine sees it (False where it cannot say: another machine)."""
        if not self.machine or self.machine != _machine():
            return False
        return _started(self.pid) != self.pid_start

    def describe(self, now: float) -> str:
        what = f"v={self.version:06d}" if self.version is not None else "a version"
        return (
            f"{self.host} pid {self.pid} (lease {self.owner[:8]}, building {what}, "
            f"taken {now - self.acquired:.0f} s ago, expires in {self.expires - now:.0f} s)"
        )


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A lease file whose record cannot be read, and when it was last written."""

    written: float

    def expired(self, now: float) -> bool:
        return now - self.written >= UNREADABLE_S

    def describe(self, now: float) -> str:
        return (
            f"an unreadable lease record ({LEASE}, written {now - self.written:.0f} s ago: a rebuild "
            f"that died while taking it, or not a lease; free {UNREADABLE_S:.0f} s after it was written)"
        )


class Lease:
    """`acquire(wait_s)` ... `check()` before committing ... `release()` (in a finally)."""

    def __init__(
        self,
        root: str,
        storage: StorageConfig | None = None,
        *,
        ttl_s: float = TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.root, self.storage, self.ttl_s, self.clock = root, storage, ttl_s, clock
        self.path = join(root, LEASE)
        self.owner = uuid.uuid4().hex
        self.version: int | None = None
        self._acquired = 0.0
        self._held = False
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    # -- reading and writing the record --------------------------------------------------------

    def read(self) -> Holder | Unreadable | None:
        """The lease's current record; None when there is none; Unreadable when the file holds no
        record (empty, cut short, not a lease), with when it was written."""
        fs, inner = resolve(self.path, self.storage)
        info = fs.get_file_info(inner)
        if info.type == pafs.FileType.NotFound:
            return None
        try:
            data = json.loads(read_bytes(self.path, self.storage))
            return Holder(**data)
        except FileNotFoundError:  # gone meanwhile
            return None
        except (ValueError, TypeError):  # empty, cut short, or not a lease record
            written = info.mtime.timestamp() if info.mtime is not None else self.clock()
            return Unreadable(written)

    def _record(self) -> bytes:
        now = self.clock()
        host, pid = socket.gethostname(), os.getpid()
        holder = Holder(
            self.owner,
            host,
            pid,
            self._acquired or now,
            now + self.ttl_s,
            self.version,
            _machine(),
            _started(pid),
        )
        return json.dumps(asdict(holder)).encode()

    def _create_local(self) -> bool:
        """O_EXCL create of a local lease: True when this process made the file."""
        _, inner = resolve(self.path, self.storage)
        os.makedirs(os.path.dirname(inner), exist_ok=True)
        try:
            fd = os.open(inner, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(self._record())
        return True

    # -- taking, keeping, giving back -----------------------------------------------------------

    def acquire(self, wait_s: float = 0.0, say: Callable[[str], None] | None = None) -> float:
        """Take the lease, waiting up to `wait_s` for a holder to finish; LeaseHeld when it does not
        (every time round, free or not, so no record can keep it waiting past its deadline). `say`
        hears once that it waits, and for whom. Returns the seconds it waited."""
        t0 = time.monotonic()
        deadline, told = t0 + wait_s, False
        while True:
            holder = self.read()
            now = self.clock()
            if holder is None or _expired(holder, now):
                if self._take(holder):
                    self._held = True
                    self._start_renewing()
                    return time.monotonic() - t0 if told else 0.0
                holder = self.read()
            if say is not None and not told and wait_s > 0 and holder is not None:
                who = holder.describe(self.clock())
                say(f"waiting up to {wait_s:.0f} s for the rebuild of {self.root} by {who}")
                told = True
            if time.monotonic() >= deadline:
                if isinstance(holder, Unreadable):
                    raise LeaseHeld(
                        f"{self.root} holds {holder.describe(self.clock())}; run again later, or delete "
                        f"{self.path} if no rebuild of it is running"
                    )
                who = holder.describe(self.clock()) if holder is not None else "another rebuild"
                raise LeaseHeld(
                    f"{self.root} is being rebuilt by {who}; wait for it with --wait SECONDS, or run "
                    "again later"
                )
            time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())) or 0.05)

    def _take(self, previous: Holder | Unreadable | None) -> bool:
        self._acquired = self.clock()
        if previous is None and not is_uri(self.root):
            return self._create_local()
        t0 = time.monotonic()
        write_bytes_atomic(self.path, self._record(), self.storage)
        time.sleep(max(SETTLE_MIN_S, 10 * (time.monotonic() - t0)))
        now = self.read()
        return isinstance(now, Holder) and now.owner == self.owner

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._renewer = threading.Thread(target=self._renew_loop, name="raypack-lease", daemon=True)
        self._renewer.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 5):
            try:
                self.renew()
            except LeaseLost:
                return
            except OSError:
                continue  # storage hiccup: try again at the next tick; the expiry leaves room for 4

    def renew(self) -> None:
        """Push the expiry out, if the lease is still this process's; LeaseLost if not."""
        holder = self.read()
        if not isinstance(holder, Holder) or holder.owner != self.owner:
            self._lost = "taken by " + holder.describe(self.clock()) if holder else "deleted"
            raise LeaseLost(f"the lease on {self.root} was {self._lost}")
        write_bytes_atomic(self.path, self._record(), self.storage)

    def check(self) -> None:
        """LeaseLost unless this process holds the lease now, unexpired: called before a commit."""
        if self._lost is not None:
            raise LeaseLost(f"the lease on {self.root} was {self._lost}: nothing committed")
        holder = self.read()
        if not isinstance(holder, Holder) or holder.owner != self.owner or holder.expires <= self.clock():
            why = holder.describe(self.clock()) if holder is not None else "nobody"
            raise LeaseLost(f"the lease on {self.root} is no longer this rebuild's (now {why}): no commit")

    def set_version(self, version: int) -> None:
        """Name the version being built in the record (what a waiting rebuild is told)."""
        self.version = version
        self.renew()

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=5)
        if self._held:
            holder = self.read()
            if isinstance(holder, Holder) and holder.owner == self.owner:
                with contextlib.suppress(OSError):
                    remove(self.path, self.storage)
        self._held = False


def _expired(holder: Holder | Unreadable, now: float) -> bool:
    if isinstance(holder, Unreadable):
        return holder.expired(now)
    return holder.expires <= now or holder.dead()


def _machine() -> str:
    """This boot of this machine and this pid namespace: where a pid names one process ("" off Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def _started(pid: int) -> int:
    """When process `pid` started (clock ticks since boot), or 0: no such process, or a zombie (killed,
    not yet reaped: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command's name, which may hold spaces
    return 0 if fields[0] == "Z" else int(fields[19])
