"""The packers' compiled loops, declared without importing numba: `@njit` marks a function, and
numba is imported, and every marked function made its compiled form, at the first call of any.

Why: numba's import is ~0.35 s of a CPU (llvmlite, its type registry), and a process that only
names the packers never calls one. The driver of a job checks its config against ALGORITHMS and
builds the command's parser from it, while the plan and every loop run in the workers
(raypack.pipeline.place.plan): with numba imported at `import raypack.packing`, every `raypack` command
would pay the import on the driver, beside the workers' start on 2 cores.

How: `njit(fn)` returns a Compiled, which stands in for the function and is registered. The first
call of any Compiled imports numba, decorates every registered function with numba.njit(nogil=True),
its code cached under the content-keyed root (_cache.cached), and puts each dispatcher where its
Compiled stood in every raypack module (a compiled function calls another through its module's
globals, which numba types when it compiles: they must be dispatchers by then). A Compiled kept
elsewhere (a dict's value, an attribute) still calls its dispatcher, one Python call further away.
Numba's cache keys a function by its file, line and name, which this does not change: entries
compiled before are found. What this changes in a process is raypack's own (its modules' globals,
its functions' caches): numba's settings and every other numba function are left as they are.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

__all__ = ["Compiled", "load", "njit"]

F = TypeVar("F", bound=Callable[..., Any])

_PENDING: list[Compiled] = []
_LOCK = threading.Lock()


class Compiled:
    """A function numba compiles at its first call (or any other's): calls go to `dispatcher`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.py_func = fn
        self.dispatcher: Any = None
        functools.update_wrapper(self, fn)  # its name, docstring and signature (inspect follows it)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.dispatcher or load(self))(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<raypack compiled function {self.py_func.__module__}.{self.py_func.__qualname__}>"


def njit(fn: F) -> F:
    """`fn` compiled by numba (cache=True, nogil=True) once any such function is first called."""
    compiled = Compiled(fn)
    with _LOCK:
        _PENDING.append(compiled)
    return cast(F, compiled)


def load(wanted: Compiled | None = None) -> Any:
    """Every registered function's dispatcher made and put in place (see the module's docstring);
    `wanted`'s dispatcher. Idempotent; thread-safe."""
    with _LOCK:
        if _PENDING:
            import numba

            from raypack.packing import _cache

            for compiled in _PENDING:
                compiled.dispatcher = _cache.cached(numba.njit(nogil=True)(compiled.py_func))
            _PENDING.clear()
            for name, module in list(sys.modules.items()):
                if not name.startswith("raypack.") or module is None:
                    continue
                for key, value in list(vars(module).items()):
                    if isinstance(value, Compiled) and value.dispatcher is not None:
                        setattr(module, key, value.dispatcher)
    return None if wanted is None else wanted.dispatcher
