"""The processes of a local run (raypack.engine.pool's driver side): one zygote a job, and the
workers it forks.

    driver ─spawns─▶ zygote (`python -P -m raypack.engine.zygote` on the driver's sys.path: a
                     fresh interpreter, never a fork of the driver) ─imports, then runs the
                     job's preload once (its tokenizer)─▶
                     forks the workers ─each connects back to the driver, takes a task at a time─▶

Why a zygote: forking the driver would hand each worker what the driver holds: its S3 filesystem
with its open connection (a worker then reads the driver's replies: `exists()` is True for a file
never written, and most `raypack pack` runs on S3 fail), the native threads of the AWS SDK and
Arrow, and the module caches of an earlier job in the same process (a notebook's second job would
pack with the first job's tokenizer). A zygote holds none of that: it touches no storage (the
driver hands it the tokenizer's bytes), runs no job but this one, and is gone with it. What forking
still buys is kept: the tokenizer and fastokens' copy are loaded once, in the zygote, and every
worker has them at its fork (fastokens takes 1.1 s to load a 128k BPE: once, not once a worker),
and a worker that dies is replaced by a fork that has them too, at once.

The workers' connections are plain Unix sockets in a directory of the system temp dir that only this
user can enter (mode 0700); a worker ignores SIGINT (the driver ends the run) and exits when the
driver's end of its connection closes, as the zygote does when the driver is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import os
import pickle
import shutil
import signal
import socket
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["BlobRef", "Failure", "connect", "early", "load_blob", "serve", "set_name", "write_blob"]

_ARROW_MAGIC = b"ARROW1"


@dataclass(frozen=True, slots=True)
class BlobRef:
    """A value one local task made for others (raypack.engine.runner: what a Ray object is on
    Ray): the file that holds it, written by task `task`. A task given one as an argument gets the
    value, read from the file (a table memory-mapped, so the page cache holds it, not the heap)."""

    path: str
    task: int
    """The task that writes it (-1: the driver wrote it)."""


def write_blob(path: str, value: Any) -> None:
    """`value` into `path`, whole or not at all (a killed writer leaves a temporary name): an Arrow
    table as an IPC file, anything else pickled."""
    import pyarrow as pa

    tmp = f"{path}.tmp-{os.getpid()}"
    if isinstance(value, pa.Table):
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, value.schema) as writer:
            writer.write_table(value)
    else:
        with open(tmp, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_blob(path: str) -> Any:
    with open(path, "rb") as f:
        arrow = f.read(len(_ARROW_MAGIC)) == _ARROW_MAGIC
        if not arrow:
            f.seek(0)
            return pickle.load(f)
    import pyarrow as pa

    return pa.ipc.open_file(pa.memory_map(path)).read_all()


@dataclass(frozen=True)
class Failure:
    """A task's exception as it travels back to the driver: the exception itself where it pickles
    (a ConfigError stays one), else a RuntimeError with its text; and the worker's traceback."""

    error: BaseException
    trace: str

    @classmethod
    def of(cls, e: BaseException) -> Failure:
        trace = "".join(traceback.format_exception(e))
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:
            e = RuntimeError(f"{type(e).__name__}: {e}")
        return cls(e, trace)


class _Early(threading.Thread):
    """A load the driver asked for ("early"), in a thread from the moment the zygote takes the request
    (after its imports: requests are taken in order): it runs beside the job's preload, which holds
    the GIL (tokenizers' parse, the summary's compiled functions), where fastokens' build of a 128k
    BPE (~1.0 s) mostly does not."""

    def __init__(self, module: str, name: str, args: tuple[Any, ...]) -> None:
        super().__init__(name=f"raypack-early-{module}", daemon=True)
        self.spec, self.args = (module, name), args
        self.value: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        import importlib

        try:
            target: Any = importlib.import_module(self.spec[0])
            for part in self.spec[1].split("."):
                target = getattr(target, part)
            self.value = target(*self.args)
        except Exception as e:
            self.error = e


_EARLY: dict[str, _Early] = {}
"""The zygote's early loads by the key the driver gave them (empty in any other process)."""


def early(key: str) -> Any:
    """The value of the early load `key` (waiting for it; its exception raised), once: None in a
    process that was asked for none (a Ray worker, or a key never given)."""
    load = _EARLY.pop(key, None)
    if load is None:
        return None
    load.join()
    if load.error is not None:
        raise load.error
    return load.value


def set_name(name: str) -> None:
    """This process's name as `ps`, `top` and psutil show it (Linux: 15 characters): what a worker is
    running, as Ray's `ray::<task>` titles say."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME


def connect(address: str) -> Connection:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    return Connection(sock.detach())


def _resolved(args: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(load_blob(a.path) if isinstance(a, BlobRef) else a for a in args)


def _run(kind: str, fn: Any, args: tuple[Any, ...], paths: list[str]) -> Any:
    from raypack.engine.tasks import RETRIES, TransientStorageError

    for attempt in range(RETRIES + 1):  # a transient storage error is retried, as Ray retries it
        try:
            if kind == "call":
                return fn(*_resolved(args))
            made = 0
            for made, value in enumerate(fn(*_resolved(args)), start=1):
                if made > len(paths):
                    raise RuntimeError(f"{fn.__name__} yielded more than its {len(paths)} values")
                write_blob(paths[made - 1], value)
            if made != len(paths):
                raise RuntimeError(f"{fn.__name__} yielded {made} values, not {len(paths)}")
            return None
        except TransientStorageError:
            if attempt == RETRIES:
                raise
    raise AssertionError("unreachable")


def _work(address: str) -> None:
    """A worker: tasks one at a time from the driver until its end of the connection closes."""
    conn = connect(address)
    conn.send(("worker", os.getpid()))
    set_name("rp-idle")
    while True:
        try:
            task, payload = conn.recv()
        except (EOFError, OSError):
            return
        try:
            kind, fn, args, paths = pickle.loads(payload)
            set_name(f"rp-{getattr(fn, '__name__', 'task')}")
            reply: tuple[Any, ...] = (task, True, _run(kind, fn, args, paths))
        except BaseException as e:
            reply = (task, False, Failure.of(e))
        set_name("rp-idle")  # before the reply: a worker named for a task has not answered it yet
        try:
            conn.send(reply)
        except Exception as e:  # a result that does not pickle
            conn.send((task, False, Failure.of(e)))


def _reap(children: set[int], ctrl: Connection) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            children.clear()
            return
        if pid == 0:
            return
        children.discard(pid)
        with contextlib.suppress(OSError):
            ctrl.send(("exited", pid, status))


class _Run(threading.Thread):
    """A preload (the driver's "run": fn(*args)) in a thread of the zygote, so that its loop goes
    on taking the driver's requests while it runs: an early load asked meanwhile starts at once.
    A job with a token store warms the zygote first (worker.Preload.warm, 0.6-0.8 s), and asks
    for fastokens' build of its tokenizer only once its tokenize stage finds a unit to tokenize;
    the build (2-2.5 s of a 131k BPE) would otherwise wait for the warm-up to end."""

    def __init__(self, fn: Any, args: tuple[Any, ...], wake: socket.socket) -> None:
        super().__init__(name="raypack-preload", daemon=True)
        self.fn, self.args, self.wake = fn, args, wake
        self.outcome: Failure | None = None
        self.start()

    def run(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException as e:
            self.outcome = Failure.of(e)
        finally:
            with contextlib.suppress(OSError):
                self.wake.send(b"!")  # the loop hears it now, not at its next timeout


def _loop(ctrl: Connection, address: str, home: str) -> None:
    """The zygote's loop: the driver's requests in order (preloads one at a time, in a thread;
    the fork after the last), its children reaped between them."""

    children: set[int] = set()
    runs: deque[tuple[Any, tuple[Any, ...]]] = deque()  # preloads after the one running
    running: _Run | None = None
    wake, woken = socket.socketpair()

    def finished() -> bool:
        """The running preload's outcome told the driver, and the next one started; False where
        the driver is gone."""
        nonlocal running
        assert running is not None
        running.join()
        try:
            ctrl.send(("ran", running.outcome))
        except OSError:
            # The driver went while it ran (killed, -9): so do we, without the traceback of a
            # broken pipe (twice, on the user's terminal) that the send raises here.
            return False
        running = _Run(*runs.popleft(), woken) if runs else None
        return True

    try:
        while True:
            _reap(children, ctrl)
            ready = wait([ctrl, wake], timeout=0.05)
            if wake in ready:
                wake.recv(64)
            if running is not None and not running.is_alive() and not finished():
                return
            if ctrl not in ready:
                continue
            try:
                op, *rest = ctrl.recv()
            except (EOFError, OSError):
                return  # the driver is gone: so are we
            if op == "import":  # the task modules, first
                if not _imported(rest[0], ctrl):
                    return
            elif op == "early":  # loads in threads, for the preload to take
                for key, (module, name, args) in rest[0].items():
                    _EARLY[key] = _Early(module, name, args)
            elif op == "run":  # a preload of the job, before the forks
                runs.append((rest[0], rest[1]))
                if running is None:
                    running = _Run(*runs.popleft(), woken)
            elif op == "fork":
                while running is not None:  # every preload ends first
                    if not finished():
                        return
                # No thread of the preload may outlive it into the fork: a lock one held would stay
                # held in every worker. (numpy's OpenBLAS and pyarrow's jemalloc threads, there from
                # their import, are native and both libraries reset them at fork.)
                if threading.active_count() > 1:
                    names = [t.name for t in threading.enumerate()]
                    ctrl.send(("failed", Failure.of(RuntimeError(f"threads alive at the fork: {names}"))))
                    return
                children |= _forked(rest[0], address, (ctrl, wake, woken))
            elif op == "exit":
                return
    finally:
        _leave(children, (home, os.path.dirname(address)))


def _imported(modules: list[str], ctrl: Connection) -> bool:
    """The task modules imported; False, the error told the driver, where one cannot be (nothing
    can run: the driver fails every task with it)."""
    import importlib

    try:
        for module in modules:
            importlib.import_module(module)
    except BaseException as e:
        ctrl.send(("failed", Failure.of(e)))
        return False
    return True


def _forked(count: int, address: str, closed: tuple[Any, ...]) -> set[int]:
    """`count` workers forked, each closing the zygote's connections (`closed`) and serving tasks
    until the driver is gone; their pids."""
    pids = set()
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            for conn in closed:
                conn.close()
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(_ABSENT)
            code = 0
            try:
                _work(address)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)  # never the zygote's own clean-up
        pids.add(pid)
    return pids


def _leave(children: set[int], directories: tuple[str, ...]) -> None:
    """Workers still here killed and reaped: one left unreaped would be a zombie of whatever adopts
    it (never reaped under a PID 1 or subreaper that does not wait). The pool's directories go too
    (its own in TMPDIR, and its socket's where that is elsewhere: a long TMPDIR's,
    raypack.engine.pool): the driver, if it was killed, cannot remove them."""
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    for directory in set(directories):
        shutil.rmtree(directory, ignore_errors=True)


class _Absent(importlib.abc.MetaPathFinder):
    """Modules that libraries import in passing, only to ask a question whose answer is no here:
    the zygote finds none of them, so each answers at once; each worker it forks finds them again
    (the finder is gone at the fork), should a task import one.
    - numba, as it loads its first compiled function, asks whether a BLAS is there by importing
      scipy.linalg (0.3 s). No raypack function uses one (no np.dot, no linalg): numba has none.
    - numba, then, asks whether cffi is there, and builds a cffi.FFI() (its C parser: 0.03-0.05
      s) to type cffi functions called from compiled code. raypack's call none.
    - pyarrow imports pandas (0.2-0.5 s) on its first array, to ask whether the object is pandas';
      raypack hands it none, and pyarrow keeps the answer (a worker can still import pandas, as the
      exchange does for its hash).
    Leaving out scipy's import alone halves the warm-up the workers wait for (worker.warm_worker:
    0.25-0.48 s on 2 cores)."""

    NAMES = ("scipy.linalg", "pandas", "cffi")

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name in self.NAMES:
            raise ModuleNotFoundError(f"{name} is left out of raypack's zygote", name=name)


_ABSENT = _Absent()


def serve(hello: dict[str, Any]) -> None:
    """The zygote's life: connect to the driver, import what every worker needs, then serve."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    sys.meta_path.insert(0, _ABSENT)
    sys.path[:] = hello["sys_path"]
    os.environ.update(hello["env"])
    ctrl = connect(hello["address"])
    ctrl.send(("zygote", os.getpid()))
    set_name("rp-zygote")
    _loop(ctrl, hello["address"], hello["home"])


if __name__ == "__main__":
    # Run as `python -m`, this file is __main__: its classes (BlobRef, Failure) must come from the
    # module by its name, as the driver unpickles them.
    from raypack.engine import zygote

    zygote.serve(pickle.load(sys.stdin.buffer))
    # Its work done and its children reaped, no interpreter teardown: freeing a 128k vocabulary's
    # tokenizers, fastokens' copy and numba's modules takes ~0.3 s that the driver would wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
