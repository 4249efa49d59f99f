"""A pool of this machine's processes for one job (the local runner's: raypack.engine.runner),
with Ray's semantics where the job relies on them:

- a task whose argument is a blob (a BlobRef another task makes) runs once that task has finished,
  and gets the value, as a Ray task gets its ObjectRef arguments;
- a worker killed mid-task (the OOM killer, a segfault) is replaced and its task run again, up to
  RETRIES times, as Ray retries a task whose worker died; the next death fails the task with a
  WorkerDied (a JobError: one line, naming the task and the signal);
- a task that raises fails its future with that exception (a transient storage error first retried
  in the worker, raypack.engine.zygote).

The workers are forked by a zygote of the job's own (raypack.engine.zygote), not by this process.
One thread here owns every connection and every task's state; `submit` may be called from any
thread (the backend's self-check runs beside the main thread's submissions).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from raypack.engine.tasks import RETRIES, worker_env
from raypack.engine.zygote import BlobRef, Failure, load_blob, write_blob
from raypack.errors import JobError

__all__ = ["LocalPool", "RemoteTraceback", "WorkerDied"]

# How long a closing pool waits for its processes to leave before it kills them.
EXIT_WAIT_S = 5.0
# A killed pool's zygote, told to exit, reaps its killed workers first (ms): waited for this long
# before it is killed too, else the workers are left as zombies of init (after every interrupted or
# failed job, for ever under a PID 1 that does not wait).
KILL_WAIT_S = 1.0


class WorkerDied(JobError):
    """A task's worker process died under it RETRIES + 1 times."""


class RemoteTraceback(Exception):
    """The worker's traceback, as the __cause__ of the exception a task raised there."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _despite_interrupts(*steps: Any) -> None:
    """Every step run to its end, each again where an interrupt (KeyboardInterrupt) cut it short
    (each may run twice: they are idempotent); the first interrupt raised once all are done."""
    interrupted: BaseException | None = None
    for step in steps:
        while True:
            try:
                step()
                break
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
    if interrupted is not None:
        raise interrupted


@dataclass
class _Task:
    id: int
    kind: str
    """"call": fn(*args) is the result; "spread": fn(*args) yields len(paths) values, into those files."""
    fn: Any
    args: tuple[Any, ...]
    paths: list[str]
    future: Future[Any]
    needs: set[int] = field(default_factory=set)
    """Tasks that write the blobs among args, not yet finished."""
    attempts: int = 0

    @property
    def label(self) -> str:
        """The task's function, and the work unit it was given if any (what a user can act on)."""
        name = getattr(self.fn, "__name__", "task")
        unit = next((a for a in self.args if hasattr(a, "relpath") and hasattr(a, "index")), None)
        return (
            name if unit is None else f"{name} on {getattr(unit, 'label', unit.relpath)} (unit {unit.index})"
        )


@dataclass
class _Worker:
    conn: Connection
    pid: int
    task: _Task | None = None


# A Unix socket's path holds at most 107 bytes on Linux (108 with its NUL; 103 on macOS): the pool
# keeps a few bytes' margin. Under a long TMPDIR (an HPC scheduler's per-job one, a test's) bind()
# would fail with a traceback.
_SOCKET_PATH_MAX = 100
_SHORT_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


def _socket_home(home: str) -> str:
    """Where the pool's socket goes: `home` (the pool's own directory in the system temp dir), or,
    where a socket path there would be too long, a directory of its own (0700) in the first short
    system directory this user may write; JobError when there is none."""
    if len(os.path.join(home, "pool.sock").encode()) <= _SOCKET_PATH_MAX:
        return home
    for short in _SHORT_DIRS:
        if os.path.isdir(short) and os.access(short, os.W_OK | os.X_OK):
            with contextlib.suppress(OSError):
                return tempfile.mkdtemp(prefix="raypack-pool-", dir=short)
    shutil.rmtree(home, ignore_errors=True)
    raise JobError(
        f"the local runner's socket cannot go under the temp directory {os.path.dirname(home)} "
        f"(a Unix socket's path holds ~107 bytes) and none of {', '.join(_SHORT_DIRS)} "
        "is writable: set TMPDIR to a shorter directory, or run on Ray (run.executor ray)"
    )


def zygote_env() -> dict[str, str]:
    """The zygote's environment: this one, with this process's sys.path as its PYTHONPATH, so that
    it imports the driver's raypack (with -P: not its working directory first). A plain
    `python -m` would import raypack from its working directory or the installed one before the
    hello names the driver's path: the installed command run inside another checkout would run
    that checkout's workers."""
    # Absolute, as the zygote may resolve a relative entry elsewhere; an entry holding the separator
    # cannot be said in PYTHONPATH (split in two, its second half read as a relative path): left
    # out, it is the zygote's once the hello sets sys.path, before any task runs.
    path = [os.path.abspath(p) for p in sys.path if os.pathsep not in p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


class LocalPool:
    """`width` worker processes, forked (by start()) from a zygote that the pool spawns at once, so
    the zygote's imports (~0.5 s) overlap whatever the driver does before start()."""

    def __init__(self, width: int, imports: tuple[str, ...] = ()) -> None:
        """`imports`: the task modules, the zygote's first request (before any job's)."""
        self.width = width
        self.closed = False
        self.retried = 0
        """Tasks run again because their worker died."""
        self._home = tempfile.mkdtemp(prefix="raypack-pool-")  # 0700: only this user may connect
        self._sockets = _socket_home(self._home)
        self.blob_base: str | None = None
        """Where the blobs go (set before the first is made): None, the pool's directory in the
        system temp dir."""
        self._blobs: str | None = None
        self._blob_paths: list[str] = []
        self._address = os.path.join(self._sockets, "pool.sock")
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self._address)
        self._listener.listen(64)
        self._listener.setblocking(False)
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self._submitted: list[tuple[_Task, bool]] = []  # (task, urgent), from any thread
        self._requests: list[tuple[Any, ...]] = [("import", imports)]  # to the zygote, in order
        self._queued, self._sent = 1, 0  # requests asked for, and sent (or failed to send): flush()
        self._sending = threading.Condition()
        self._wake_r, self._wake_w = os.pipe()
        self._closing = False
        self._killing = False
        self._tasks: dict[int, _Task] = {}
        self._done: dict[int, BaseException | None] = {}  # finished tasks: None, or what failed them
        self._queue: deque[_Task] = deque()
        self._workers: dict[Connection, _Worker] = {}
        self._exits: dict[int, int] = {}  # worker pid -> wait status, as the zygote reaped it
        self._ctrl: Connection | None = None
        self._forked = 0
        self._fatal: BaseException | None = None
        self._ran: deque[Future[None]] = deque()  # the preloads' outcomes not yet heard, in order
        hello = {
            "address": self._address,
            "home": self._home,
            "sys_path": list(sys.path),
            "env": worker_env(),
        }
        self._zygote = subprocess.Popen(
            [sys.executable, "-P", "-m", "raypack.engine.zygote"],
            env=zygote_env(),
            stdin=subprocess.PIPE,
            start_new_session=True,  # no Ctrl-C of its own: the driver ends the run
        )
        assert self._zygote.stdin is not None
        self._zygote.stdin.write(pickle.dumps(hello))
        self._zygote.stdin.close()
        self._thread = threading.Thread(target=self._manage, name="raypack-pool", daemon=True)
        self._thread.start()

    # ---- the driver's side: any thread

    def early(self, loads: dict[str, tuple[str, str, tuple[Any, ...]]]) -> None:
        """Loads by key, (module, callable's dotted name, plain arguments), each started in a thread
        of the zygote as it takes the request (after its imports), for the preload to take
        (zygote.early) while it does the rest."""
        if loads:
            self._request(("early", loads))

    def preload(self, fn: Any, args: tuple[Any, ...]) -> Future[None]:
        """fn(*args) once in the zygote, before it forks: every worker has what it loaded. Its
        outcome: the exception fn raised there (a tokenizer tokenizers refuses: a ConfigError), or
        the pool's if the zygote is gone first; a task that needs the state meets it again."""
        outcome: Future[None] = Future()
        with self._lock:
            self._ran.append(outcome)
        self._request(("run", fn, args))
        return outcome

    @property
    def forked(self) -> bool:
        """The workers were forked (or asked to be): a preload now would reach none of them."""
        with self._lock:
            return bool(self._forked)

    def start(self) -> None:
        """Fork the workers (after any preload). Submitting also starts them."""
        with self._lock:
            if self._forked:
                return
            self._forked = self.width
        self._request(("fork", self.width))

    def submit(
        self, fn: Any, args: tuple[Any, ...], *, urgent: bool = False, returns: int | None = None
    ) -> tuple[Future[Any], list[BlobRef]]:
        """A task: fn(*args), its future and, with `returns`, the blobs fn's generator fills (the
        future then gives None). `urgent`: ahead of every task not yet running."""
        self.start()
        task_id = next(self._ids)
        paths = [self._blob_path(f"t{task_id}-{k}") for k in range(returns or 0)]
        task = _Task(task_id, "call" if returns is None else "spread", fn, args, paths, Future())
        task.needs = {a.task for a in args if isinstance(a, BlobRef) and a.task >= 0}
        with self._lock:
            if self._fatal is not None:
                raise self._fatal
            self._submitted.append((task, urgent))
        self._wake()
        return task.future, [BlobRef(p, task_id) for p in paths]

    def put(self, value: Any) -> BlobRef:
        path = self._blob_path(f"put{next(self._ids)}")
        write_blob(path, value)
        return BlobRef(path, -1)

    def get(self, blob: BlobRef) -> Any:
        """The blob's value, once its task has finished (its error, if it failed)."""
        if blob.task >= 0:
            while True:
                with self._lock:
                    if blob.task in self._done:
                        error = self._done[blob.task]
                        break
                time.sleep(0.002)
            if error is not None:
                raise error
        return load_blob(blob.path)

    def discard_blobs(self) -> None:
        """Delete every blob made so far (each consumer has finished with them)."""
        with self._lock:
            paths, self._blob_paths = self._blob_paths, []
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def close(self, kill: bool = False) -> None:
        """Let the workers and the zygote go (`kill`: at once, tasks running or not: a failed job)
        and delete the pool's files; tasks not yet finished fail with CancelledError. Again: nothing."""
        if self.closed:
            return
        self.closed = True
        with self._lock:
            self._closing = True
            self._killing = kill
        self._wake()
        try:
            self._thread.join()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._zygote.wait(timeout=KILL_WAIT_S if kill else EXIT_WAIT_S)
        finally:
            # Also where an interrupt cut the waits short: the command repeats Ctrl-C every second
            # while it cleans up (cli._Interrupts), and a pool whose thread is still sending the
            # zygote its preload (a zygote busy loading does not read: Ctrl-C a few seconds into a
            # job) must not leave its directory, socket and all, in TMPDIR. Its thread, if still
            # there, meets closed connections and ends. Each step runs to its end whatever
            # interrupts come meanwhile, the files removed before the zygote is waited for: an
            # interrupt during that wait (a zygote slow to die on a loaded machine) must not skip
            # the removal.
            _despite_interrupts(self._kill_zygote, self._close_files, self._remove_files, self._zygote.wait)

    def _kill_zygote(self) -> None:
        if self._zygote.poll() is None:
            self._zygote.kill()

    def _close_files(self) -> None:
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._listener.close()

    def _remove_files(self) -> None:
        for directory in {self._home, self._sockets}:
            shutil.rmtree(directory, ignore_errors=True)
        if self._blobs is not None:
            shutil.rmtree(self._blobs, ignore_errors=True)

    # ---- helpers

    def _blob_path(self, name: str) -> str:
        with self._lock:
            if self._blobs is None:
                base = self.blob_base or self._home  # (the pool's own directory goes with the pool)
                os.makedirs(base, exist_ok=True)
                self._blobs = tempfile.mkdtemp(prefix="raypack-blobs-", dir=base)
            path = os.path.join(self._blobs, name)
            self._blob_paths.append(path)
        return path

    def _request(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._requests.append(message)
            self._queued += 1
        self._wake()

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until the requests made so far are in the zygote's hands (its socket's, or sending
        them failed), at most `timeout` s: before a call that holds the GIL long. tokenizers' parse
        of a 131k BPE holds it 0.8 s, and this pool's thread, which pickles and sends the preload
        (the tokenizer's 17 MB, twice), would wait that long before the zygote could start loading."""
        with self._lock:
            target = self._queued
        with self._sending:
            self._sending.wait_for(lambda: self._sent >= target or self._closing, timeout)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # ---- the pool's thread: owns the connections, the queue and every task's state

    def _manage(self) -> None:
        try:
            self._serve()
        except BaseException as e:  # a bug here must not leave futures waiting for ever
            if self.closed and isinstance(e, (OSError, ValueError)):
                # Its files closed under it by a close() that an interrupt cut short: nothing is
                # left to serve.
                return
            self._fail_everything(RuntimeError(f"the local pool stopped: {type(e).__name__}: {e}"))
            raise
        finally:
            self._shut()

    def _serve(self) -> None:
        while True:
            with self._lock:
                submitted, self._submitted = self._submitted, []
                requests = self._requests if self._ctrl is not None else []
                if self._ctrl is not None:
                    self._requests = []
                closing, killing = self._closing, self._killing
            self._enqueue(submitted)
            self._send(requests)
            if closing and (killing or not any(w.task for w in self._workers.values())):
                return
            self._dispatch()
            watched: list[Any] = [self._listener, self._wake_r, *self._workers]
            if self._ctrl is not None:
                watched.append(self._ctrl)
            ready_ones = wait(watched, timeout=1.0)
            if not ready_ones and self._ctrl is None and self._zygote.poll() is not None:
                # It died before it ever connected (an interpreter that cannot import raypack...).
                self._fail_everything(
                    JobError(f"the local runner's zygote process exited with code {self._zygote.returncode}")
                )
            for ready in ready_ones:
                # Each read below is polled first: an earlier one of this batch may have consumed
                # what made a connection ready (_death reads the zygote's messages), or closed it.
                if ready is self._wake_r:
                    os.read(self._wake_r, 4096)
                elif ready is self._listener:
                    self._accept()
                elif ready is self._ctrl:
                    self._from_zygote()
                elif ready in self._workers:
                    self._from_worker(self._workers[ready])

    def _enqueue(self, submitted: list[tuple[_Task, bool]]) -> None:
        """Tasks submitted since the last turn into the queue (an urgent one first)."""
        for task, urgent in submitted:
            self._tasks[task.id] = task
            task.needs = {t for t in task.needs if t not in self._done}
            if urgent:
                self._queue.appendleft(task)
            else:
                self._queue.append(task)

    def _send(self, requests: list[tuple[Any, ...]]) -> None:
        """The requests in the zygote's hands, in order; flush() hears that they are."""
        for message in requests:
            self._to_zygote(message)
        if requests:
            with self._sending:
                self._sent += len(requests)
                self._sending.notify_all()

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(True)
        conn = Connection(sock.detach())
        try:
            kind, pid = conn.recv()
        except (EOFError, OSError):
            conn.close()
            return
        if kind == "zygote":
            self._ctrl = conn
        else:
            self._workers[conn] = _Worker(conn, pid)

    def _to_zygote(self, message: tuple[Any, ...]) -> None:
        assert self._ctrl is not None
        try:
            self._ctrl.send(message)
        except (OSError, ValueError, pickle.PicklingError) as e:
            self._lost_zygote(f"could not send it {message[0]!r}: {e}")

    def _from_zygote(self) -> None:
        assert self._ctrl is not None
        try:
            if not self._ctrl.poll(0):
                return
            message = self._ctrl.recv()
        except (EOFError, OSError):
            self._lost_zygote("it exited")
            return
        self._heard(message)

    def _heard(self, message: tuple[Any, ...]) -> bool:
        """Take a message of the zygote's; whether it said it cannot run anything."""
        if message[0] == "exited":
            self._exits[int(message[1])] = int(message[2])
        elif message[0] == "failed":  # it could not import the task modules: nothing can run
            failure = message[1]
            failure.error.__cause__ = RemoteTraceback(failure.trace)
            self._fail_everything(failure.error)
            return True
        elif message[0] == "ran":  # a preload's outcome, in the order they were asked for
            with self._lock:
                outcome = self._ran.popleft() if self._ran else None
            if outcome is not None and message[1] is not None:
                failure = message[1]
                failure.error.__cause__ = RemoteTraceback(failure.trace)
                outcome.set_exception(failure.error)
            elif outcome is not None:
                outcome.set_result(None)
        return False

    def _lost_zygote(self, why: str) -> None:
        ctrl, self._ctrl = self._ctrl, None
        with self._sending:  # nothing more reaches it: flush() waits no longer
            self._sent = sys.maxsize
            self._sending.notify_all()
        # What it said before it went is the reason (an import it failed, then exited: a request
        # sent after that met a broken pipe), not how its going was noticed.
        with contextlib.suppress(EOFError, OSError):
            while ctrl is not None and ctrl.poll(0):
                if self._heard(ctrl.recv()):
                    return
        if not self._workers and not self._closing:
            self._fail_everything(JobError(f"the local runner's zygote process is gone ({why})"))

    def _dispatch(self) -> None:
        idle = [w for w in self._workers.values() if w.task is None]
        if not idle or not self._queue:
            return
        waiting: deque[_Task] = deque()
        while idle and self._queue:
            task = self._queue.popleft()
            failed = next((self._done[t] for t in task.needs if self._done.get(t) is not None), None)
            if failed is not None:
                self._finish(task, failed)
                continue
            task.needs = {t for t in task.needs if t not in self._done}
            if task.needs:
                waiting.append(task)
                continue
            worker = idle.pop()
            payload = self._payload(task)
            if payload is None:
                continue
            worker.task = task
            # A worker gone: its EOF is read next, and the task goes back in the queue.
            with contextlib.suppress(OSError):
                worker.conn.send((task.id, payload))
        self._queue.extendleft(reversed(waiting))

    def _payload(self, task: _Task) -> bytes | None:
        try:
            return pickle.dumps((task.kind, task.fn, task.args, task.paths), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            self._finish(task, e)
            return None

    def _from_worker(self, worker: _Worker) -> None:
        try:
            if not worker.conn.poll(0):
                return
            task_id, ok, value = worker.conn.recv()
        except (EOFError, OSError):
            self._died(worker)
            return
        task = worker.task
        worker.task = None
        if task is None or task.id != task_id:
            return
        if ok:
            self._finish(task, None, value)
        else:
            assert isinstance(value, Failure)
            error = value.error
            error.__cause__ = RemoteTraceback(value.trace)
            self._finish(task, error)

    def _died(self, worker: _Worker) -> None:
        del self._workers[worker.conn]
        worker.conn.close()
        if not self._closing and self._ctrl is not None:
            self._to_zygote(("fork", 1))
        task = worker.task
        if task is not None:
            task.attempts += 1
            if task.attempts <= RETRIES and not self._closing:
                self.retried += 1
                self._queue.appendleft(task)
            else:
                self._finish(task, WorkerDied(self._death(worker.pid, task)))
        if not self._workers and self._ctrl is None and not self._closing:  # none left, none to come
            self._fail_everything(JobError("the local runner's workers died and its zygote is gone"))

    def _death(self, pid: int, task: _Task) -> str:
        deadline = time.monotonic() + 2.0  # the zygote reaps it within ~0.05 s (a final failure only)
        while pid not in self._exits and self._ctrl is not None and time.monotonic() < deadline:
            if wait([self._ctrl], timeout=0.05):
                self._from_zygote()
        status = self._exits.get(pid)
        how = "died"
        if status is not None and os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            how = f"was killed by {signal.Signals(sig).name}" + (
                " (the OOM killer, or out of memory?)" if sig == signal.SIGKILL else ""
            )
        elif status is not None:
            how = f"exited with code {os.WEXITSTATUS(status)}"
        return (
            f"a local worker process {how} running {task.label} {task.attempts} times "
            f"(retried {RETRIES} times): give the job more memory, smaller work units "
            "(input.unit_bytes), or run it on Ray (run.executor ray)"
        )

    def _finish(self, task: _Task, error: BaseException | None, value: Any = None) -> None:
        self._tasks.pop(task.id, None)
        with self._lock:  # get() reads it from other threads
            self._done[task.id] = error
        if task.future.done():
            return
        if error is None:
            task.future.set_result(value)
        else:
            task.future.set_exception(error)

    def _fail_everything(self, error: BaseException) -> None:
        with self._lock:
            self._fatal = error
            submitted, self._submitted = self._submitted, []
            ran, self._ran = self._ran, deque()
        for outcome in ran:
            outcome.set_exception(error)
        for task in [*self._tasks.values(), *(t for t, _ in submitted)]:
            self._finish(task, error)
        self._queue.clear()

    def _shut(self) -> None:
        """Close every connection (a worker leaves when its end closes), tell the zygote to go, and
        cancel what never ran."""
        for task in list(self._tasks.values()):
            self._done[task.id] = None
            task.future.cancel()
        with self._lock:
            for task, _ in self._submitted:
                task.future.cancel()
            self._submitted = []
            for outcome in self._ran:
                outcome.cancel()
            self._ran.clear()
        self._queue.clear()
        if self._killing:
            for worker in self._workers.values():
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGKILL)
        for worker in self._workers.values():
            worker.conn.close()
        self._workers.clear()
        if self._ctrl is not None:
            with contextlib.suppress(OSError):
                self._ctrl.send(("exit",))
            # The zygote kills its children as it leaves; those that were closed have left already.
            self._ctrl.close()
            self._ctrl = None
