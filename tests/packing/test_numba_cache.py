"""The packers' numba code is cached by source content: a second copy of raypack at another path
(what every `ray job submit --working-dir .` makes) loads it instead of compiling (~7 s)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import raypack

PACKAGE = Path(raypack.__file__).resolve().parent


def warm(where: Path, cache: Path) -> tuple[int, int]:
    code = (
        f"import sys; sys.path.insert(0, {str(where)!r}); import raypack; "
        f"assert raypack.__file__.startswith({str(where)!r}), raypack.__file__; "
        "import numpy as np; from raypack.packing import pack; "
        "from raypack.packing.warmup import dispatchers; "
        "pack(np.arange(1, 200), 64, 'bfd', seed=0); "  # bfd's path only: the test pays three compiles
        "print(sum(sum(d.stats.cache_misses.values()) for d in dispatchers()), "
        "sum(sum(d.stats.cache_hits.values()) for d in dispatchers()))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "RAYPACK_NUMBA_CACHE": str(cache)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    compiled, loaded = map(int, done.stdout.split())
    return compiled, loaded


@pytest.mark.slow  # 31 s of compiling in fresh interpreters
def test_a_copy_at_another_path_loads_the_compiled_code(tmp_path: Path) -> None:
    for name in ("first", "second"):
        shutil.copytree(PACKAGE, tmp_path / name / "raypack", ignore=shutil.ignore_patterns("__pycache__"))
    cache = tmp_path / "cache"
    compiled, loaded = warm(tmp_path / "first", cache)
    assert compiled >= 5 and loaded == 0  # bfd's functions, compiled once
    compiled_again, loaded_again = warm(tmp_path / "second", cache)
    # Nothing compiled; what the packers call from Python loaded (their callees live inside them).
    assert compiled_again == 0 and loaded_again >= 2
    # A change to any packing source compiles everything again: numba links _segtree's functions into
    # _groups' entries but would check only _groups.py, and stale machine code must never be loaded.
    segtree = tmp_path / "second" / "raypack" / "packing" / "_segtree.py"
    segtree.write_text(segtree.read_text() + "\n# changed\n")
    assert warm(tmp_path / "second", cache) == (compiled, 0)


def test_a_job_says_when_it_must_compile_the_packers_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tokenizer_path: Path
) -> None:
    """An empty cache (a new machine, RAYPACK_NUMBA_CACHE elsewhere) makes a job's first packer
    compile, 7-20 s that it would otherwise spend without a word: the cache is found empty, and
    the job says so and what fills it ahead."""
    from raypack.config import load_config
    from raypack.packing import compiled_code_cached
    from raypack.packing._cache import _digest
    from raypack.pipeline import prepare
    from raypack.pipeline.job import run_job
    from tests.conftest import job_config, make_corpus

    monkeypatch.setenv("RAYPACK_NUMBA_CACHE", str(tmp_path / "cache"))
    assert not compiled_code_cached()
    entries = tmp_path / "cache" / _digest(PACKAGE / "packing")
    entries.mkdir(parents=True)
    assert not compiled_code_cached()
    (entries / "items.make_items-131.py311.nbi").write_bytes(b"")  # one function's index
    assert compiled_code_cached()

    monkeypatch.delenv("RAYPACK_NUMBA_CACHE")
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=10, seed=1)
    cfg = load_config(job_config(tmp_path, f"{corpus}/*", tokenizer_path))
    said: list[str] = []
    cached = compiled_code_cached()  # (make's warm-up fills it; an edited packer empties it)
    run_job(cfg, overwrite=True, log=said.append)
    assert any("not cached on this machine" in line for line in said) == (not cached)
    said.clear()
    monkeypatch.setattr(prepare, "compiled_code_cached", lambda: False)
    run_job(cfg, overwrite=True, log=said.append)
    assert any("compiled code is not cached on this machine yet" in line for line in said)


def test_compiling_the_packers_leaves_numbas_own_settings_alone(tmp_path: Path) -> None:
    """The content-keyed cache is raypack's functions' own (each dispatcher's cache), not a locator
    put into numba's list that every numba function of the process (the user's) would meet."""
    code = (
        "from numba.core import caching; import numpy as np; "
        "before = list(caching.CacheImpl._locator_classes); "
        "from raypack.packing import pack; pack(np.arange(1, 50), 64, 'bfd', seed=0); "
        "from raypack.packing.warmup import dispatchers; "
        "assert list(caching.CacheImpl._locator_classes) == before, caching.CacheImpl._locator_classes; "
        "kinds = {type(d._cache).__name__ for d in dispatchers()}; "
        "assert kinds == {'ContentCache'}, kinds; print('ok')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "RAYPACK_NUMBA_CACHE": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
