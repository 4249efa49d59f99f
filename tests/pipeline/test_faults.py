"""Faults injected into real runs, on the path a user's `raypack pack` takes (the default executor: a
small corpus on this machine's processes; Ray where a test says so): a tokenize worker and a write
worker killed (SIGKILL, as the OOM killer would), the S3 server crashing during the write stage, the
driver interrupted. Each run must end in the same bytes as an undisturbed one, or fail cleanly and
leave a rerun to finish the job."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pyarrow.fs as pafs
import pytest

import raypack
from raypack.cli import main
from raypack.config import StorageConfig, load_config
from raypack.dataset import previous
from raypack.errors import storage_cause
from raypack.pipeline.job import run_job
from raypack.storage import write_bytes
from raypack.verifier import verify
from tests import s3server
from tests.conftest import job_config, make_corpus, s3_job_config


def quiet(_: str) -> None:
    pass


def _digest(out: Path) -> dict[str, str]:
    """sha256 of every file of a dataset but metrics.json and report.html (the run's timings) and
    manifest.json (it names the output path; its counts and file checksums follow from the files
    compared here)."""
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in ("metrics.json", "report.html", "manifest.json")
    }


def _running(task: str) -> list[psutil.Process]:
    """The processes running `task` now: a local worker names itself rp-<task> (15 characters, as
    Linux keeps them: raypack.engine.zygote.set_name), a Ray worker ray::<task>."""
    return _ray_processes(f"rp-{task}"[:15]) + _ray_processes(f"ray::{task}")


def _ray_processes(marker: str) -> list[psutil.Process]:
    """This test process's descendants only (a local pool's zygote and workers, the session Ray's
    workers): the suite runs on two pytest-xdist workers, and a kill by name alone took the other
    worker's tasks too."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            title = p.name() or ""
            cmd = " ".join(p.cmdline() or [])
            if marker in title or marker in cmd:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


class Saboteur:
    """Waits in a thread until `ready()` holds, then runs `act()` once; `.done` tells the test that the
    fault really happened while the job ran (a test whose fault came too late would prove nothing)."""

    def __init__(self, ready: Callable[[], bool], act: Callable[[], None], timeout: float = 120) -> None:
        self.done = False
        self._stop = threading.Event()

        def run() -> None:
            deadline = time.monotonic() + timeout
            while not self._stop.is_set() and time.monotonic() < deadline:
                if ready():
                    act()
                    self.done = True
                    return
                self._stop.wait(0.005)

        self._thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> Saboteur:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _kill_first(task: str) -> Callable[[], bool]:
    """A ready() that SIGKILLs the first process running `task` (and says it did)."""

    def ready() -> bool:
        for p in _running(task):
            try:
                p.send_signal(signal.SIGKILL)
                return True
            except psutil.NoSuchProcess:
                pass
        return False

    return ready


SHARD_ROWS = 10


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path) -> tuple[Path, dict[str, str]]:
    """An undisturbed run: 6 shards of 200 documents (~2 s of tokenizing on two cores)."""
    tmp = tmp_path_factory.mktemp("reference")
    corpus = make_corpus(tmp, shards=6, docs_per_shard=200, seed=21)
    # Files of 10 packs: the write tasks run long enough to be seen and killed (a local worker no
    # longer spends ~0.3 s dropping its job state first, and with files of 40 packs the saboteur
    # missed every write_files task in 1 CI run of 3).
    cfg = load_config(str(job_config(tmp, f"{corpus}/*", tokenizer_path, output={"shard_rows": SHARD_ROWS})))
    run_job(cfg, log=quiet)
    return corpus, _digest(tmp / "out")


@pytest.mark.parametrize(
    ("victim", "executor"),
    [
        ("tokenize_unit", "auto"),  # a worker holding a tokenizer, mid-shard
        pytest.param("tokenize_unit", "ray", marks=[pytest.mark.ray, pytest.mark.slow]),  # 32 s
        ("write_files", "auto"),  # a task writing output files
        # 33 s: Ray's own retry of a killed worker is in the light tier as test_multinode's node dying
        pytest.param("write_files", "ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    ],
)
def test_a_killed_worker_is_retried_and_the_output_is_byte_identical(
    tmp_path: Path, tokenizer_path: Path, reference: tuple[Path, dict[str, str]], victim: str, executor: str
) -> None:
    corpus, want = reference
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path, output={"shard_rows": SHARD_ROWS})
    overrides = [f"run.executor={executor}"]
    if victim == "tokenize_unit":
        # On tokenizers, not fastokens: a unit of 200 documents then takes a few hundred ms, not a
        # few tens, long enough for the saboteur's scan of the process table to see one (on
        # fastokens it missed every unit in a CI run on Ray). The bytes must still be the
        # reference's, which ran on the default backend.
        overrides.append("tokenizer.backend=tokenizers")
    with Saboteur(_kill_first(victim), lambda: None) as saboteur:
        result = raypack.pack(str(path), overrides=overrides, log=quiet)
    assert saboteur.done, f"no {victim} process was seen to kill"
    # (Whether the kill landed before the task answered is a race the saboteur cannot see: the task
    # run again is tests/engine/test_runners.py's, deterministically.)
    assert result.runner["name"] == ("local" if executor == "auto" else "ray")
    assert _digest(tmp_path / "out") == want
    assert verify(str(tmp_path / "out")).ok


def test_a_worker_that_always_dies_fails_the_job_in_one_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A unit whose worker is killed every time (a document the machine's memory cannot hold): after
    its retries, `raypack pack` ends with one line naming the task and the signal, exit 1, and leaves
    no staging area and no worker process behind."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=400, seed=5)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, tokenizer={"backend": "tokenizers"})
    with Saboteur(_kill_every("tokenize_unit"), lambda: None, timeout=60):
        code = main(["pack", str(cfg), "--quiet"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith(
        "raypack: job failed: a local worker process was killed by SIGKILL"
    )
    assert re.search(r"running tokenize_unit on part-00\d\.jsonl\S* \(unit \d\) 5 times", err), err
    assert "Traceback" not in err
    assert not (tmp_path / "out" / "_staging").exists() and not (tmp_path / "out" / "manifest.json").exists()
    assert _gone(os.getpid())


def _kill_every(task: str) -> Callable[[], bool]:
    """A ready() that SIGKILLs every process running `task`, and never says it is done."""

    def ready() -> bool:
        for p in _running(task):
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        return False

    return ready


def _gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` has no raypack pool process left (its zygote and workers), in time."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process(pid).children(recursive=True) if p.name().startswith("rp-")]
        if not left:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow  # 30 s; S3 under a fault stays in the light tier: test_multinode's node dying on S3
def test_the_s3_server_crashing_during_the_write_stage(
    tmp_path: Path, tokenizer_path: Path, reference: tuple[Path, dict[str, str]]
) -> None:
    """A server of its own (the session's stays up for the other tests), killed as the first output
    file is being written and back 2 s later: the S3 client's retries (storage.max_attempts) and Ray's
    task retries ride it out, or the job fails with one line and the rerun completes it."""
    corpus, want = reference
    server = s3server.start(tmp_path / "seaweedfs")
    try:
        cfg = load_config(
            str(
                s3_job_config(
                    tmp_path, server, corpus, tokenizer_path, "crash", output={"shard_rows": SHARD_ROWS}
                )
            )
        )
        with Saboteur(lambda: bool(_running("write_files")), lambda: server.restart(down=2.0)) as sab:
            try:
                run_job(cfg, log=quiet)
                first_run = "completed"
            except OSError as e:  # a clean failure: storage errors outlived every retry
                first_run = f"failed: {e}"
                assert (
                    not server.filesystem().get_file_info(f"{s3server.BUCKET}/crash/out/manifest.json").size
                )
                run_job(cfg, overwrite=True, log=quiet)
        assert sab.done, "the server was not restarted during the write stage"
        print(f"S3 crash: first run {first_run}")
        local = tmp_path / "local"
        pafs.copy_files(f"{s3server.BUCKET}/crash/out", str(local), source_filesystem=server.filesystem())
        assert _digest(local) == want, first_run
        assert verify(f"s3://{s3server.BUCKET}/crash/out", cfg).ok
    finally:
        server.stop()


@pytest.mark.ray
def test_a_storage_error_in_a_ray_task_is_found_behind_rays_wrappers() -> None:
    """A task's OSError reaches the driver only as text inside Ray's RayTaskError(UserCodeException):
    storage_cause must still name it, and must not call a bug in a task a storage error."""
    import ray.data

    dead = StorageConfig(endpoint=f"http://127.0.0.1:{s3server.free_ports(1)[0]}", max_attempts=1)

    def upload(batch: dict[str, Any]) -> dict[str, Any]:
        write_bytes("s3://bucket/key", b"x", dead)
        return batch

    def bug(batch: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("a bug, not storage")

    causes = []
    for fn in (upload, bug):
        with pytest.raises(Exception) as caught:
            ray.data.from_items([{"a": 1}]).map_batches(fn).materialize()
        assert not isinstance(caught.value, OSError)  # what made the text path necessary
        causes.append(storage_cause(caught.value))
    assert causes[0] is not None and "AWS Error NETWORK_CONNECTION" in causes[0] and "\n" not in causes[0]
    assert causes[1] is None

    try:
        try:
            raise ConnectionResetError("peer went away\nsecond line")
        except OSError as e:
            raise RuntimeError("while writing") from e
    except RuntimeError as e:
        assert storage_cause(e) == "peer went away"


@pytest.mark.slow  # 90 s: the job's four map retries with their backoff, then a rerun
def test_storage_gone_for_good_fails_with_one_line_and_the_rerun_finishes(
    tmp_path: Path,
    tokenizer_path: Path,
    reference: tuple[Path, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The server killed as the write stage starts and not back until the job has given up: every
    retry fails, and the user gets one line (not Ray's wrapped traceback), exit 1, no manifest."""
    corpus, want = reference
    server = s3server.start(tmp_path / "seaweedfs")
    try:
        # One S3 attempt per request: the job's own retries (4, ~15 s of backoff) are what is tested.
        cfg = s3_job_config(
            tmp_path,
            server,
            corpus,
            tokenizer_path,
            "gone",
            output={"shard_rows": SHARD_ROWS},
            storage={"max_attempts": 1},
        )

        def kill() -> None:
            server.process.kill()
            server.process.wait()

        with Saboteur(lambda: bool(_running("write_files")), kill) as sab:
            code = main(["pack", str(cfg)])
        assert sab.done, "the server was not killed during the write stage"
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and err[-1].startswith("raypack: storage error: ") and "Traceback" not in err[-1]
        server.restart(down=0.0)
        fs = server.filesystem()
        assert fs.get_file_info(f"{s3server.BUCKET}/gone/out/manifest.json").type == pafs.FileType.NotFound
        assert main(["pack", str(cfg)]) == 0
        local = tmp_path / "local"
        pafs.copy_files(f"{s3server.BUCKET}/gone/out", str(local), source_filesystem=fs)
        assert _digest(local) == want
    finally:
        server.stop()


def _ray_address() -> str:
    import ray

    return str(ray.get_runtime_context().gcs_address)


@pytest.mark.parametrize(
    ("sig", "executor"),
    [
        (signal.SIGINT, "auto"),
        pytest.param(signal.SIGTERM, "auto", marks=pytest.mark.slow),  # ends as SIGINT does
        pytest.param(signal.SIGKILL, "auto", marks=pytest.mark.slow),
        # 29 s; the light tier keeps SIGINT on the default executor, and Ray's own retry of a dying
        # worker in test_multinode
        pytest.param(signal.SIGINT, "ray", marks=[pytest.mark.ray, pytest.mark.slow], id="SIGINT-ray"),
    ],
)
def test_an_interrupted_driver_leaves_no_dataset_and_the_rerun_finishes(
    tmp_path: Path,
    tokenizer_path: Path,
    reference: tuple[Path, dict[str, str]],
    sig: signal.Signals,
    executor: str,
) -> None:
    """`raypack pack` in a process of its own, stopped by Ctrl-C, SIGTERM (`kill`, `timeout`,
    Kubernetes) or SIGKILL while it tokenizes: on the default executor (its local pool goes with it:
    no process is left, not even a zombie, and nothing in the temp dir), and on the test session's
    Ray cluster (as `ray job submit` runs it)."""
    corpus, want = reference
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, output={"shard_rows": SHARD_ROWS})
    out, temp = tmp_path / "out", tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"TMPDIR": str(temp)}
    if executor == "ray":
        env["RAY_ADDRESS"] = _ray_address()
    cmd = [sys.executable, "-m", "raypack.cli", "pack", str(cfg)]
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pool = psutil.Process(driver.pid)
    deadline = time.monotonic() + 120
    while (
        not any((out / "index").glob("*.parquet")) and driver.poll() is None and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert driver.poll() is None, "the job ended before it could be interrupted"
    helpers = [p for p in pool.children(recursive=True) if p.name().startswith("rp-")]
    assert bool(helpers) == (executor == "auto")
    driver.send_signal(sig)
    _, err = driver.communicate(timeout=120)
    if sig != signal.SIGKILL:
        assert driver.returncode == 128 + sig
        # Ray forwards its processes' log lines to the driver's stderr, "(pid=...)" or "(name pid=...)"
        # first, colored, and may do so after the driver's last word (seen: the GCS's "Failed to
        # kill actor" as the pool is torn down): raypack's own lines are what the user must see last.
        ours = [line for line in err.strip().splitlines() if not re.match(r"^(\x1b\[\d+m)?\(", line)]
        assert ours[-1].startswith("raypack: interrupted"), err[-2000:]
        assert "Traceback" not in err
        assert sorted(out.iterdir()) == []  # a first run's: its index/ and rejects/ gone too
    else:
        assert driver.returncode == -signal.SIGKILL
    _, alive = psutil.wait_procs(helpers, timeout=10)
    assert not alive, f"left behind: {alive}"
    if executor == "auto":
        deadline = time.monotonic() + 10  # the zygote, orphaned by a SIGKILL, cleans up as it leaves
        while any(temp.iterdir()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sorted(temp.iterdir()) == []
    assert not (out / "manifest.json").exists()
    assert not verify(str(out)).ok  # an incomplete output is never taken for a dataset
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert _digest(out) == want


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGKILL, marks=pytest.mark.slow)])
def test_an_interrupted_overwrite_leaves_the_dataset_it_was_to_replace(
    tmp_path: Path, tokenizer_path: Path, reference: tuple[Path, dict[str, str]], sig: signal.Signals
) -> None:
    """`raypack pack --overwrite` stopped while it tokenizes, its output cleared: Ctrl-C puts the
    dataset it was replacing back as the job ends; after a SIGKILL, which nothing outlives, the next
    job on that output does. Byte for byte the dataset that was there (raypack.dataset.previous)."""
    corpus, _ = reference
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, output={"shard_rows": SHARD_ROWS})
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "raypack.cli", "pack", str(cfg)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    made = subprocess.run([*cmd, "--set", "pack.seq_len=256"], env=env, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    old = _digest(out)
    driver = subprocess.Popen(
        [*cmd, "--overwrite"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while (
        not ((out / previous.PREVIOUS / ".whole").exists() and any((out / "index").glob("*.parquet")))
        and driver.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    assert driver.poll() is None, "the job ended before it could be interrupted"
    driver.send_signal(sig)
    _, err = driver.communicate(timeout=120)
    if sig == signal.SIGKILL:
        assert not (out / "manifest.json").exists()
        again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert again.returncode == 2 and "already holds a dataset" in again.stderr, again.stderr[-2000:]
        assert "put back the dataset" in again.stdout + again.stderr
    else:
        assert driver.returncode == 128 + sig and "holds the dataset it held before this job" in err, err
    assert _digest(out) == old and not (out / previous.PREVIOUS).exists() and verify(str(out)).ok
