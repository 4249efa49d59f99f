"""Where the tasks run: the local runner gives the bytes Ray gives, retries what Ray retries, and is
what a `raypack pack` without a cluster takes for a small corpus; progress and the command's time."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from raypack import engine
from raypack.config import load_config
from raypack.engine import choose
from raypack.engine.local import LocalRunner
from raypack.engine.tasks import RETRIES, TransientStorageError
from raypack.errors import JobError
from raypack.pipeline.job import run_job
from raypack.progress import Progress
from raypack.verifier import verify
from tests.conftest import cli, job_config, make_corpus, write_jsonl


def quiet(_: str) -> None:
    pass


def digests(out: Path) -> dict[str, str]:
    """Every file of a dataset but those that hold times (metrics, manifest's stages, report) or
    the output's path (Megatron's data-args line)."""
    skip = {"metrics.json", "report.html", "manifest.json", "megatron_data_args.txt"}  # times, paths
    return {
        str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(out.rglob("*"))
        if p.is_file() and p.name not in skip and "_cache" not in p.parts
    }


@pytest.mark.ray
@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({}, id="global"),
        pytest.param({"pack": {"mode": "sharded", "algorithm": "bfd"}}, id="sharded", marks=pytest.mark.slow),
        pytest.param({"output": {"format": "megatron", "shard_rows": 40}}, id="megatron"),
        pytest.param(
            {"pack": {"algorithm": "lpfhp", "overflow": "split"}}, id="lpfhp", marks=pytest.mark.slow
        ),
    ],
)
def test_local_runner_writes_the_bytes_ray_writes(
    tmp_path: Path, tokenizer_path: Path, sections: dict[str, Any]
) -> None:
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=30, seed=11)
    # A document twice (the duplicate-id check runs on the runner's tasks) and one over seq_len.
    write_jsonl(corpus / "extra.jsonl", [{"id": "long", "text": "token " * 700}])
    found = []
    for executor in ("ray", "local"):
        cfg = load_config(
            str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, **sections)),
            [f"run.executor={executor}", f"output.path={tmp_path}/out-{executor}", "tokenizer.concurrency=2"],
        )
        result = run_job(cfg, log=quiet)
        assert result.runner["name"] == executor
        found.append(digests(tmp_path / f"out-{executor}"))
    assert found[0] == found[1]
    assert any(name.startswith("data/") for name in found[0])


@pytest.mark.ray
def test_local_runner_reports_duplicate_ids_as_ray_does(tmp_path: Path, tokenizer_path: Path) -> None:
    """The id check runs on the runner's tasks (exchange_local's files instead of Ray objects)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"id": "x", "text": "the ray data"}, {"id": "y", "text": "a plan"}])
    write_jsonl(corpus / "b.jsonl", [{"id": "x", "text": "the ray model"}, {"id": "x", "text": "arrow"}])
    found = []
    for executor in ("ray", "local"):
        cfg = load_config(
            str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"id_field": "id"})),
            [f"run.executor={executor}", f"output.path={tmp_path}/out-{executor}"],
        )
        duplicates = run_job(cfg, log=quiet).duplicates
        assert duplicates is not None
        found.append((duplicates.ids, duplicates.documents, duplicates.examples))
    assert found[0] == found[1] == (1, 3, ("x",))


@pytest.mark.ray
def test_auto_takes_the_local_runner_only_without_a_cluster(tmp_path: Path, tokenizer_path: Path) -> None:
    base = str(job_config(tmp_path, f"{tmp_path}/corpus/*", tokenizer_path))
    auto = load_config(base, ["run.local_max_bytes=1000"])
    # This session runs a Ray (the session fixture): auto takes it.
    assert choose(auto.run, 10) == "ray"
    for executor in ("local", "ray"):
        assert choose(load_config(base, [f"run.executor={executor}"]).run, 10**12) == executor


@pytest.mark.ray
def test_a_ray_job_that_ends_leaves_its_preloads_to_finish(tmp_path: Path) -> None:
    """A preload still running when the job ends is not cancelled: ray.cancel interrupts the worker
    wherever it is, and one cut inside an import (pandas) broke that module for every later task of
    the worker (a Ray Data read after a small job: "module 'pandas' has no attribute 'core'")."""
    import time

    from raypack.engine.ray import RayRunner
    from tests.fakes import slow_mark

    runner = RayRunner()
    runner.preload(slow_mark, (str(tmp_path), 1.5))
    runner.close(release=False)
    slots = sum(runner.nodes().values())
    deadline = time.monotonic() + 60
    while len(list(tmp_path.iterdir())) < slots and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(list(tmp_path.iterdir())) == slots  # every preload ran to its end


def test_auto_chooses_by_input_size_and_ray_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_path: Path
) -> None:
    import ray

    cfg = load_config(
        str(job_config(tmp_path, f"{tmp_path}/corpus/*", tokenizer_path)), ["run.local_max_bytes=1000"]
    )
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert choose(cfg.run, 1000) == "local"
    assert choose(cfg.run, 1001) == "ray"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert choose(cfg.run, 10) == "ray"


def test_run_config_values_are_checked(tmp_path: Path, tokenizer_path: Path) -> None:
    from raypack.errors import ConfigError

    base = str(job_config(tmp_path, f"{tmp_path}/corpus/*", tokenizer_path))
    with pytest.raises(ConfigError, match=r"run\.executor must be one of auto, local, ray"):
        load_config(base, ["run.executor=spark"])
    with pytest.raises(ConfigError, match=r"run\.local_max_bytes must be >= 0"):
        load_config(base, ["run.local_max_bytes=-1"])


class _Flaky:
    """Fails with a transient storage error `failures` times (counted in a file: each attempt may run
    in another call of the same worker), then returns."""

    def __init__(self, counter: Path, failures: int) -> None:
        self.counter, self.failures = counter, failures

    def __call__(self, x: int) -> int:
        seen = int(self.counter.read_text()) if self.counter.exists() else 0
        self.counter.write_text(str(seen + 1))
        if seen < self.failures:
            raise TransientStorageError(f"slow down ({seen})")
        return x * 2


def test_local_runner_retries_a_transient_storage_error_as_ray_does(tmp_path: Path) -> None:
    runner = LocalRunner(1)
    try:
        assert runner.map(_Flaky(tmp_path / "a", RETRIES), [(21,)]) == [42]
        assert (tmp_path / "a").read_text() == str(RETRIES + 1)
        with pytest.raises(TransientStorageError, match="slow down"):
            runner.map(_Flaky(tmp_path / "b", RETRIES + 1), [(1,)])
        assert (tmp_path / "b").read_text() == str(RETRIES + 1)
        assert sorted(runner.unordered(pow, [(2, 3), (3, 2), (5, 1)])) == [(0, 8), (1, 9), (2, 5)]
    finally:
        runner.close(release=True)


def test_a_task_whose_local_worker_is_killed_runs_again_on_a_new_one(tmp_path: Path) -> None:
    """A worker killed mid-task (SIGKILL) is replaced by a fork of the zygote and the task runs again
    there, as Ray retries a task whose worker died; the other tasks are untouched; the count says so."""
    import psutil

    from tests.fakes import dies_first, pid

    runner = LocalRunner(2)
    try:
        assert runner.map(dies_first, [(str(tmp_path / "a"), 21), (str(tmp_path / "b"), 5)]) == [42, 10]
        assert runner.retried == 2
        killed = {int((tmp_path / name).read_text()) for name in ("a", "b")}
        assert len(killed) == 2  # two workers died, each once
        after = set(runner.map(pid, [()] * 8))
        assert after and not after & killed  # their replacements serve now
    finally:
        runner.close(release=True)
    # Closed: every worker reaped by the zygote, which the pool reaped: no process left, no zombie.
    assert not [p for p in after | killed if psutil.pid_exists(p)]


def test_tasks_that_always_kill_their_workers_each_fail_after_their_retries(tmp_path: Path) -> None:
    """Four tasks at once whose workers are killed every time (20 deaths, the zygote forking a worker
    for each and reporting each exit while the pool reads the next): each fails with WorkerDied
    naming it and SIGKILL after RETRIES + 1 runs, none waits for ever (a pool that read a message
    its batch had seen ready, already taken, hung), and the pool still runs tasks afterwards."""
    from raypack.engine.pool import WorkerDied
    from tests.fakes import always_dies, pid

    runner = LocalRunner(2)
    try:
        futures = [runner.submit(always_dies, ()) for _ in range(4)]
        for future in futures:
            with pytest.raises(
                WorkerDied, match=rf"killed by SIGKILL.* running always_dies {RETRIES + 1} times"
            ):
                future.result(timeout=120)
        assert runner.retried == 4 * RETRIES
        assert len(set(runner.map(pid, [()] * 6))) >= 1
    finally:
        runner.close(release=True)


def test_a_failed_jobs_pool_leaves_no_zombie_worker(tmp_path: Path) -> None:
    """A failed or interrupted job's pool kills its workers mid-task and closes: the zygote reaps
    them before it goes, so none is left a zombie of init (never reaped under a PID 1 that does not
    wait)."""
    import psutil

    from tests.fakes import pid, slow_mark

    runner = LocalRunner(2)
    try:
        workers = set(runner.map(pid, [()] * 4))
        running = [runner.submit(slow_mark, (str(tmp_path), 60.0)) for _ in range(2)]
        assert not [f for f in running if f.done()]
    finally:
        runner.close(release=True, failed=True)
    left = []
    for p in workers:
        with contextlib.suppress(psutil.NoSuchProcess):
            left.append((p, psutil.Process(p).status()))
    assert not left


def test_a_pool_whose_processes_cannot_run_fails_its_tasks_instead_of_waiting(tmp_path: Path) -> None:
    """A zygote that cannot import the task modules, and a pool whose zygote and workers are all gone:
    every task fails with the reason, none waits for ever."""
    import signal

    import psutil

    from raypack.engine.pool import LocalPool
    from tests.fakes import pid

    broken = LocalPool(1, ("raypack.no_such_module",))
    try:
        future, _ = broken.submit(pid, ())
        with pytest.raises(ModuleNotFoundError, match="no_such_module"):
            future.result(timeout=60)
    finally:
        broken.close()
    runner = LocalRunner(1)
    try:
        worker = runner.map(pid, [()])[0]
        (zygote,) = [p for p in psutil.Process().children() if p.name() == "rp-zygote"]
        zygote.send_signal(signal.SIGKILL)
        zygote.wait(10)
        psutil.Process(worker).send_signal(signal.SIGKILL)
        with pytest.raises(JobError, match="workers died and its zygote is gone"):
            runner.first_done([runner.submit(pid, ())])
    finally:
        runner.close(release=True)


def test_the_zygote_warms_up_without_scipy_pandas_or_cffi_and_its_workers_still_import_them() -> None:
    """numba probes for a BLAS by importing scipy.linalg (0.3 s) and for cffi (its C parser, 0.04 s)
    as it loads its first function, and pyarrow imports pandas (0.2-0.5 s) on its first array: the
    zygote's warm-up answers all three without them, and a worker it forks imports each as any
    process does."""
    from tests.fakes import passing_imports, warm_like_a_zygote

    runner = LocalRunner(1)
    try:
        runner.preload(warm_like_a_zygote, ()).result(timeout=120)  # type: ignore[union-attr]
        runner.start()
        assert runner.map(passing_imports, [()]) == [(True, False, True, True, True)]
    finally:
        runner.close(release=True)


def test_an_early_load_starts_while_a_preload_runs_and_a_later_preload_takes_it(tmp_path: Path) -> None:
    """A job with a token store warms the zygote first and asks for fastokens' build only once a
    unit must be tokenized: the build, asked while the warm-up ran, waited for its end (0.4-0.6 s
    of a 500 MB first pack). The zygote runs a preload in a thread and takes the requests that
    come meanwhile; preloads still run one after another, and the workers fork after the last."""
    from tests.fakes import pid, slow_mark, takes_early

    runner = LocalRunner(1)
    try:
        first = runner.preload(slow_mark, (str(tmp_path), 2.0))
        runner.early({"stamp": ("tests.fakes", "mark_now", (str(tmp_path),))})
        second = runner.preload(takes_early, ("stamp", str(tmp_path)))
        assert first is not None and second is not None
        first.result(timeout=120)
        second.result(timeout=120)
        assert runner.map(pid, [()]) != [os.getpid()]  # forked after both: it still serves
    finally:
        runner.close(release=True)
    (slow,) = [p for p in tmp_path.iterdir() if not p.name.startswith("early-")]
    early_at = float((tmp_path / "early-at").read_text())
    assert early_at < slow.stat().st_mtime - 1.0  # it ran while the 2 s preload slept
    assert float((tmp_path / "early-taken").read_text()) == early_at


def test_local_cpus_follows_the_process_affinity() -> None:
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this system")
    assert engine.local_cpus() == len(os.sched_getaffinity(0))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_on_a_terminal_redraws_one_line_with_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("raypack.progress.time.monotonic", lambda: clock[0])
    stream = _Terminal()
    p = Progress("tokenize", 4, "units", total_bytes=8_000_000, stream=stream)
    clock[0] += 1.0
    p.advance(1, 2_000_000)
    shown = stream.getvalue()
    assert shown.startswith("\r\x1b[2K[raypack] tokenize 1/4 units  [######..................]  25%")
    assert "2.0 MB/s" in shown and "ETA 3s" in shown
    clock[0] += 0.01  # under the redraw interval: nothing new
    p.advance(1, 2_000_000)
    assert stream.getvalue() == shown
    clock[0] += 1.0
    p.advance(2, 4_000_000)
    p.close()
    last = stream.getvalue().rsplit("\r\x1b[2K", 1)[1]
    assert last.startswith(
        "[raypack] tokenize 4/4 units  [########################]  100%"
    ) and last.endswith("in 2s\n")


def test_progress_in_a_log_writes_a_line_every_few_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("raypack.progress.time.monotonic", lambda: clock[0])
    stream = io.StringIO()
    p = Progress("assign+write", 80, "files", stream=stream)
    for _ in range(79):
        clock[0] += 0.125  # exact in binary: the 40th file lands at 5.0 s
        p.advance()
    # 9.875 s: a line at 5 s only, no bar, no carriage return.
    assert stream.getvalue().splitlines() == ["[raypack] assign+write 40/80 files  50%  ETA 5s"]
    clock[0] += 0.125
    p.advance()  # 10 s: the next line is due, and it is the last state
    p.close()  # which the log then does not get twice
    assert stream.getvalue().splitlines()[1:] == ["[raypack] assign+write 80/80 files  100%  in 10s"]
    silent = Progress("tokenize", 3, "units")
    silent.advance(3)
    silent.close()  # no stream: nothing to write to, nothing fails


def test_the_plan_and_its_comparison_run_in_tasks_and_the_driver_never_imports_numba(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """raypack.pack() in a process of its own, on the local pool, with pack.compare: the plan and the
    compared plans are made in the workers, so the driver never loads numba's compiled functions
    (their first load, numba's registry, cost 0.5-0.7 s of a CPU the workers tokenize on), nor
    imports numba at all (0.35 s: the packers' loops are compiled at their first call,
    raypack.packing._jit); the comparison is in the record."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=2)
    config = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"compare": ["spfhp"]})
    code = (
        "import sys, raypack\n"
        f"record = raypack.pack({str(config)!r}, overwrite=True, log=lambda _: None)\n"
        "print(len(record.comparison), record.metrics.packs > 0, 'numba' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["1", "True", "False"]


def test_pack_without_a_cluster_runs_locally_shows_progress_and_its_whole_time(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """The command as users type it, in a process of its own without RAY_ADDRESS: the local runner,
    progress lines on stderr (not a terminal: plain lines), the whole command's time in the summary
    and metrics; --quiet leaves the summary alone."""
    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=20, seed=2)
    config = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "raypack.cli", "pack", str(config), "--overwrite"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[raypack] tasks on" in done.stderr and "local processes (run.executor auto)" in done.stderr
    assert "[raypack] tokenize 3/3 units  100%" in done.stderr
    assert "[raypack] assign+write 1/1 files  100%" in done.stderr
    assert "\r" not in done.stderr
    time_line = next(line for line in done.stdout.splitlines() if line.startswith("time "))
    assert "s the whole command: " in time_line and "local processes" in time_line
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["runner"]["name"] == "local"
    whole, stages = metrics["command_seconds"], sum(metrics["stage_seconds"].values())
    assert whole > stages > 0

    quiet_run = subprocess.run([*command, "--quiet"], capture_output=True, text=True, env=env, timeout=300)
    assert quiet_run.returncode == 0, quiet_run.stderr[-3000:]
    assert "[raypack]" not in quiet_run.stderr
    assert any(line.startswith("time ") for line in quiet_run.stdout.splitlines())


def test_a_temp_dir_too_long_for_a_socket_path_still_packs_locally(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """A Unix socket's path holds ~107 bytes: under a deeper TMPDIR (an HPC job's, pytest-xdist's)
    `raypack pack` failed with a traceback from bind(). The pool's socket now goes to a short
    system directory of its own; the job packs, and leaves nothing in TMPDIR or there."""
    temp = tmp_path / ("t" * 60) / ("u" * 40)
    temp.mkdir(parents=True)
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=20, seed=5)
    path = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    done = cli("pack", str(path), "--quiet", env={"TMPDIR": str(temp)})
    assert "local processes" in done.stdout, done.stdout
    assert len(str(temp)) > 110 and sorted(temp.iterdir()) == []
    report = verify(str(tmp_path / "out"), load_config(str(path)))
    assert report.ok and report.documents == 40, report.problems
    # The driver killed once its pool runs: the zygote, finding it gone, removes the pool's
    # directory in TMPDIR as well as its socket's.
    import time

    import psutil

    cmd = [sys.executable, "-m", "raypack.cli", "pack", str(path), "--quiet", "--overwrite"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"TMPDIR": str(temp)}
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    zygotes: list[psutil.Process] = []
    while not zygotes and driver.poll() is None and time.monotonic() < deadline:
        zygotes = [p for p in psutil.Process(driver.pid).children() if p.name() == "rp-zygote"]
        time.sleep(0.01)
    assert zygotes and any(temp.iterdir()), "the job ended before its pool was seen"
    driver.kill()
    driver.wait()
    psutil.wait_procs(zygotes, timeout=30)
    assert sorted(temp.iterdir()) == []


def test_the_pool_runs_the_drivers_raypack_whatever_the_working_directory(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """The installed command run in a directory that holds another raypack (a user's older clone):
    the driver imports the installed one, and so must the pool's processes. Started as
    `python -m raypack.engine.zygote`, the zygote found the working directory's first (here, one
    that cannot be imported), and the workers ran another version's code under this driver."""
    other = tmp_path / "clone"
    (other / "raypack").mkdir(parents=True)
    (other / "raypack" / "__init__.py").write_text('raise ImportError("the clone\'s raypack was imported")\n')
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=8)
    config = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    command = [str(Path(sys.executable).parent / "raypack"), "pack", str(config), "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, cwd=other)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "local processes" in done.stdout
    assert verify(str(tmp_path / "out"), load_config(str(config))).ok


def test_the_zygotes_path_holds_only_entries_it_can_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry holding the separator would be split in two, its second half a relative path that
    may find a decoy package (a script in /tmp/sc:ripts, say); relative entries are made absolute."""
    from raypack.engine.pool import zygote_env

    monkeypatch.setattr(sys, "path", ["", "src", f"/tmp/sc{os.pathsep}ripts", "/opt/lib"])
    path = zygote_env()["PYTHONPATH"].split(os.pathsep)
    assert path == [os.getcwd(), os.path.join(os.getcwd(), "src"), "/opt/lib"]


def test_a_zygote_whose_driver_went_during_its_preload_leaves_without_a_traceback(tmp_path: Path) -> None:
    """The driver killed (-9) while the zygote ran the job's preload: the zygote's reply meets a
    closed connection and it leaves quietly. It raised the send's BrokenPipeError, whose traceback
    reached the user's terminal twice."""
    import socket
    import time
    from multiprocessing.connection import Connection

    from raypack.engine import zygote

    ours, theirs = socket.socketpair()
    driver, ctrl = Connection(ours.detach()), Connection(theirs.detach())
    driver.send(("run", time.sleep, (0.2,)))
    driver.close()  # gone before the preload ends
    zygote._loop(ctrl, str(tmp_path / "sockets" / "pool.sock"), str(tmp_path / "home"))  # returns


def test_a_pool_whose_closing_is_interrupted_still_leaves_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C again while a pool closes (the command repeats it every second of a slow clean-up):
    its zygote is killed and its directory, socket and blobs go all the same, also where an
    interrupt cuts the wait for the pool's thread short (Ctrl-C a few seconds into a job, while the
    thread sends the busy zygote its preload)."""
    import threading

    from raypack.engine.pool import LocalPool
    from tests.fakes import pid

    pool = LocalPool(1, ())
    future, _ = pool.submit(pid, ())
    assert future.result(timeout=60) > 0
    blob = pool.put(b"x" * 100)
    home, zygote = pool._home, pool._zygote
    assert os.path.isdir(home) and os.path.exists(blob.path)
    join = threading.Thread.join

    def interrupted(thread: threading.Thread, timeout: float | None = None) -> None:
        if thread is pool._thread:
            raise KeyboardInterrupt
        join(thread, timeout)

    monkeypatch.setattr(threading.Thread, "join", interrupted)
    # And again while the clean-up waits for the killed zygote (one slow to die on a loaded machine:
    # a later trial found the directory left 3 times in ~55 runs, the removal after that wait).
    wait, waits = zygote.wait, []

    def slow_to_die(timeout: float | None = None) -> int:
        waits.append(timeout)
        if len(waits) == 1:
            raise KeyboardInterrupt
        return wait(timeout)

    monkeypatch.setattr(zygote, "wait", slow_to_die)
    with pytest.raises(KeyboardInterrupt):
        pool.close()
    monkeypatch.undo()
    assert len(waits) == 2 and zygote.poll() is not None
    assert not os.path.exists(home) and not os.path.exists(blob.path)
    pool._thread.join(30)  # its thread ends on the closed connections
    assert not pool._thread.is_alive()
