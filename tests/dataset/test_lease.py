"""The rebuild lease: one holder at a time, expiry and takeover, and LATEST never moving back (no Ray)."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

import raypack.dataset.lease as lease_module
from raypack.dataset.layout import latest_version, set_latest
from raypack.dataset.lease import LEASE, Lease, LeaseHeld, LeaseLost


@pytest.fixture(autouse=True)
def quick_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease_module, "SETTLE_MIN_S", 0.05)


def test_a_second_holder_is_refused_with_who_holds_it(tmp_path: Path) -> None:
    first = Lease(str(tmp_path))
    first.acquire()
    first.set_version(7)
    record = json.loads((tmp_path / LEASE).read_text())
    assert record["owner"] == first.owner and record["version"] == 7
    with pytest.raises(LeaseHeld, match=r"is being rebuilt by .* pid \d+ \(lease \w{8}, building v=000007"):
        Lease(str(tmp_path)).acquire(wait_s=0.2)
    first.check()
    first.release()
    assert not (tmp_path / LEASE).exists()
    second = Lease(str(tmp_path))
    second.acquire()
    second.release()


def test_only_one_of_many_contenders_wins(tmp_path: Path) -> None:
    leases = [Lease(str(tmp_path)) for _ in range(8)]
    results: list[object] = [None] * len(leases)
    barrier = threading.Barrier(len(leases))

    def take(k: int) -> None:
        barrier.wait()
        try:
            leases[k].acquire()
            results[k] = "held"
        except LeaseHeld as e:
            results[k] = e

    threads = [threading.Thread(target=take, args=(k,)) for k in range(len(leases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count("held") == 1
    winner = leases[results.index("held")]
    assert json.loads((tmp_path / LEASE).read_text())["owner"] == winner.owner
    winner.release()


def test_an_expired_lease_is_taken_over_and_its_old_holder_cannot_commit(tmp_path: Path) -> None:
    now = [1000.0]
    old = Lease(str(tmp_path), ttl_s=60, clock=lambda: now[0])
    old.acquire()
    old._stop.set()  # its process is paused: no renewals
    now[0] += 61
    new = Lease(str(tmp_path), ttl_s=60, clock=lambda: now[0])
    new.acquire()
    with pytest.raises(LeaseLost, match="no longer this rebuild's"):
        old.check()
    with pytest.raises(LeaseLost):
        old.renew()
    old.release()  # gives back nothing: the lease is the new holder's
    assert json.loads((tmp_path / LEASE).read_text())["owner"] == new.owner
    new.check()
    new.release()


def test_a_waiting_contender_takes_the_lease_when_it_is_given_back(tmp_path: Path) -> None:
    first = Lease(str(tmp_path))
    first.acquire()
    threading.Timer(0.5, first.release).start()
    second = Lease(str(tmp_path))
    second.acquire(wait_s=30)
    second.check()
    second.release()


def test_latest_never_moves_back(tmp_path: Path) -> None:
    set_latest(str(tmp_path), 3)
    with pytest.raises(RuntimeError, match="already names v=000003; not moving it back to v=000002"):
        set_latest(str(tmp_path), 2)
    with pytest.raises(RuntimeError):
        set_latest(str(tmp_path), 3)
    set_latest(str(tmp_path), 4)
    assert latest_version(str(tmp_path)) == 4


@pytest.mark.parametrize("content", [b"", b'{"owner": "cut', b"not a lease"])
def test_an_unreadable_lease_file_is_held_briefly_then_taken_never_waited_on_forever(
    tmp_path: Path, content: bytes
) -> None:
    """A lease file with no readable record (a rebuild killed between creating and writing it, or
    garbage): a rebuild told not to wait exits at once naming the file, one told to wait gets it
    once the file is UNREADABLE_S old (it hung forever: free to read, impossible to create)."""
    import os
    import time

    path = tmp_path / LEASE
    path.write_bytes(content)
    raised: list[BaseException] = []

    def acquire() -> None:
        try:
            Lease(str(tmp_path)).acquire(wait_s=0.3)
        except BaseException as e:
            raised.append(e)

    waiter = threading.Thread(target=acquire, daemon=True)  # a hang fails the test, not the suite
    t0 = time.monotonic()
    waiter.start()
    waiter.join(timeout=10)
    assert not waiter.is_alive(), "acquire never returned"
    assert time.monotonic() - t0 < 5
    (error,) = raised
    assert isinstance(error, LeaseHeld)
    assert re.search(r"holds an unreadable lease record .* delete .*_lease\.json", str(error))
    old = time.time() - lease_module.UNREADABLE_S - 1
    os.utime(path, (old, old))
    lease = Lease(str(tmp_path))
    lease.acquire(wait_s=0)
    assert json.loads(path.read_text())["owner"] == lease.owner
    lease.check()
    lease.release()
    assert not path.exists()


def _record_of(path: Path, **changes: object) -> None:
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, **changes}))


def test_a_holder_dead_on_this_machine_is_free_at_once_one_elsewhere_waits_for_its_expiry(
    tmp_path: Path,
) -> None:
    """A record whose process is gone from this machine (its pid free, or another process's since:
    another start time) is free before its expiry; one from another machine (or an older record that
    says nothing of its machine) is held until it expires, since no pid check can speak for it."""
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = tmp_path / LEASE
    for changes in ({"pid": dead.pid}, {"pid_start": 1}):
        held = Lease(str(tmp_path))
        held.acquire()
        held._stop.set()  # no renewals: the record stays as written here
        _record_of(path, **changes)
        took = Lease(str(tmp_path))
        assert took.acquire() == 0.0  # no wait, though the record expires in 300 s
        took.release()
    for changes in ({"pid": dead.pid, "machine": "another-boot/1"}, {"pid": dead.pid, "machine": ""}):
        held = Lease(str(tmp_path))
        held.acquire()
        held._stop.set()
        _record_of(path, **changes)
        with pytest.raises(LeaseHeld, match="expires in 30"):
            Lease(str(tmp_path)).acquire(wait_s=0.1)
        path.unlink()


def test_a_waiting_contender_says_once_whom_it_waits_for(tmp_path: Path) -> None:
    first = Lease(str(tmp_path))
    first.acquire()
    first.set_version(3)
    threading.Timer(1.0, first.release).start()
    heard: list[str] = []
    waited = Lease(str(tmp_path)).acquire(wait_s=30, say=heard.append)
    assert len(heard) == 1 and re.search(
        r"waiting up to 30 s for the rebuild of .* pid \d+ .*v=000003", heard[0]
    )
    assert 0.5 < waited < 10
