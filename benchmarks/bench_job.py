"""The whole `raypack pack` command against the tokenizer's fastest path, on real text.

    python benchmarks/bench_job.py                          # 130 and 500 MB, demo and 128k tokenizers
    python benchmarks/bench_job.py --mb 130 --tokenizers large --no-one-file

Corpus: real source text found on this machine, not one source repeated: Python, C and C++ sources,
headers, stubs and docs (.py .pyi .c .cc .cpp .h .hpp .md .rst .txt, 1 KB to 2 MB each) under this
environment's site-packages, the interpreter's standard library, /usr/include, /usr/share/doc and
/usr/lib/python3, in sorted path order, each distinct file once (by content hash), one document
per file, in gzipped JSONL shards of 6.25 MB of text (a 4x larger corpus has 4x more shards).
Tokenizers: the demo's byte-level BPE (8,192 tokens) and a byte-level BPE of 131,072 tokens trained
here on the first 40 MB of the corpus (production vocabularies are 100k-200k: their merges and
lookups are what encode_batch spends its time on). Both are cached in --work.

Baselines, in this process, on all cores (tokenizers parallelizes a batch itself), measured in the
same run as the job: `encode_batch_fast` (no offsets: the fastest path, the job's physical limit)
over every text of the corpus, and `encode_batch` (what raypack called before) over the first 65 MB.
Job: `raypack pack CONFIG --overwrite` as a subprocess, timed from its start to its exit, so Ray's
start, imports and every stage count; its stage times come from metrics.json. Memory: every Ray
worker's peak private memory (rss - shared, from /proc statm, every 0.2 s) and RSS.
The fast path is also timed as the job's actors run it, without Ray: one single-threaded process a
core, each over a share of the texts (encode_batch parallelizes a batch by document, so a batch that
holds one 2 MB text keeps the other cores idle until it is done; the processes do not wait on each
other). Ratios are the faster baseline's seconds over the job's (or its tokenize stage's) on the same
texts: 1.0 would be the job as fast as the tokenizer alone (the job also adds one EOS a document).
Targets (issue 13): whole command >= 0.75 at ~130 MB and >= 0.85 at ~500 MB; tokenize stage >= 0.9.
Backends (issue 20): the job runs once per tokenizer.backend (--backends), each against the same
baseline; the data files of every backend must be byte-identical (checked). Per stage: MB of corpus
text per second per core (text MB / (stage seconds × cores)). Target: with fastokens, the whole
command >= 5x encode_batch_fast at 500 MB with the 128k vocabulary.
One file: the smallest corpus also as a single uncompressed JSONL file, packed whole (one work unit,
so one actor) and in byte-range work units of UNIT_MB (input.unit_bytes), with the first tokenizer.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import yaml

from raypack.demo import demo_config, train_byte_level_bpe


def compile_package(tree: Path) -> None:
    """Byte-compile the raypack package under `tree`, as pip does at a regular install. An editable
    checkout run with PYTHONDONTWRITEBYTECODE set (this machine's environment) compiles raypack's
    sources again in every process instead: the driver, the pool's zygote and each worker, for
    their lazy imports. That cost 0.7 s of 7.0 on the 130 MB tekken job (1.2 of 12.6 CPU-s, 5
    interleaved rounds), which no user of an installed raypack pays."""
    import compileall

    compileall.compile_dir(str(tree / "raypack"), quiet=1)


compile_package(Path(__file__).resolve().parents[1])

SUFFIXES = {".py", ".pyi", ".c", ".cc", ".cpp", ".h", ".hpp", ".md", ".rst", ".txt"}
ROOTS = [
    Path(sysconfig.get_paths()["purelib"]),
    Path(sysconfig.get_paths()["stdlib"]),
    Path("/usr/include"),
    Path("/usr/share/doc"),
    Path("/usr/lib/python3"),
]
SHARD_BYTES = 6_250_000
UNIT_MB = 16  # work units of the one-file comparison: ~8 a core on 2 cores at 130 MB
LARGE_VOCAB = 131_072


def deal(texts: list[str], cores: int) -> list[list[str]]:
    """`texts` dealt to `cores` shares, largest first to the share with the fewest characters so far
    (so the shares' sizes differ by less than one text)."""
    shares: list[list[str]] = [[] for _ in range(cores)]
    loads = [0] * cores
    for text in sorted(texts, key=len, reverse=True):
        k = loads.index(min(loads))
        shares[k].append(text)
        loads[k] += len(text)
    return shares


def source_texts(suffixes: set[str] = SUFFIXES) -> Iterator[str]:
    """The UTF-8 files of 1 kB-2 MB with one of `suffixes` under ROOTS, each distinct file once, in
    a fixed order."""
    seen: set[bytes] = set()
    for root in ROOTS:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = Path(dirpath, name)
                if path.suffix not in suffixes or path.is_symlink():
                    continue
                try:
                    size = path.stat().st_size
                    if not 1_000 <= size <= 2_000_000:
                        continue
                    data = path.read_bytes()
                    text = data.decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue
                digest = hashlib.sha1(data).digest()
                if digest not in seen:
                    seen.add(digest)
                    yield text


def make_corpus(work: Path, mb: int) -> tuple[Path, list[str]]:
    corpus = work / f"corpus-{mb}mb"
    texts: list[str] = []
    total = 0
    for text in source_texts():
        texts.append(text)
        total += len(text.encode())
        if total >= mb * 10**6:
            break
    if total < mb * 10**6:
        print(f"note: this machine has {total / 1e6:.0f} MB of distinct source text, not {mb} MB")
    # The texts' digest marks a finished corpus: site-packages change between runs (a package
    # installed), and a corpus of other texts than the baselines encode would compare nothing.
    digest = hashlib.sha256("\0".join(texts).encode("utf-8", "surrogatepass")).hexdigest()
    done = corpus / "done"
    if not done.exists() or done.read_text() != digest:
        for old in corpus.glob("part-*.jsonl.gz"):
            old.unlink()
        corpus.mkdir(parents=True, exist_ok=True)
        shards: list[list[str]] = [[]]
        size = 0
        for text in texts:
            if size >= SHARD_BYTES:
                shards.append([])
                size = 0
            shards[-1].append(json.dumps({"text": text}) + "\n")
            size += len(text.encode())
        for i, lines in enumerate(shards):
            with gzip.open(corpus / f"part-{i:05d}.jsonl.gz", "wt", compresslevel=1) as out:
                out.writelines(lines)
        done.write_text(digest)
    return corpus, texts


def one_file(work: Path, mb: int, texts: list[str]) -> Path:
    """The corpus as a single uncompressed JSONL file, for the work-unit comparison."""
    folder = work / f"one-{mb}mb"
    if not (folder / "done").exists():
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "corpus.jsonl").open("w") as out:
            out.writelines(json.dumps({"text": text}) + "\n" for text in texts)
        (folder / "done").write_text("")
    return folder


def split_comparison(work: Path, mb: int, texts: list[str], tokenizer: Path) -> None:
    """One large file, whole (one work unit: one actor tokenizes it) and cut into byte ranges of
    UNIT_MB (input.unit_bytes): what work units below file size buy on this machine's cores."""
    folder = one_file(work, mb, texts)
    size = (folder / "corpus.jsonl").stat().st_size
    runs = {}
    for label, unit in (("whole", size + 1), ("split", UNIT_MB << 20)):
        seconds, metrics, _ = run_command(
            work, folder, tokenizer, f"one-{mb}-{label}", "corpus.jsonl", unit_bytes=unit
        )
        units = metrics["split_files"].get("corpus.jsonl", {}).get("units", 1)
        runs[label] = seconds
        print(
            f"one {size / 1e6:.0f} MB JSONL file, {label} ({units} work units): "
            f"raypack pack {seconds:.1f} s, tokenize stage {metrics['stage_seconds']['tokenize']:.1f} s",
            flush=True,
        )
    print(f"one file: split / whole time x{runs['split'] / runs['whole']:.2f}", flush=True)


def large_tokenizer(work: Path) -> Path:
    path = work / f"bpe-{LARGE_VOCAB}.json"
    if path.exists():
        return path
    sample, total = [], 0
    for text in source_texts():
        sample.append(text)
        total += len(text)
        if total >= 40 * 10**6:
            break
    t0 = time.perf_counter()
    train_byte_level_bpe(sample, LARGE_VOCAB, ["<|endoftext|>"]).save(str(path))
    print(f"trained a {LARGE_VOCAB:,}-token BPE on {total / 1e6:.0f} MB in {time.perf_counter() - t0:.0f} s")
    return path


# Real model tokenizers (tests/real_tokenizers.py: from the mistral-common wheel that
# `make real-tokenizers` downloads): SentencePiece BPE 32k in its published shape and as
# transformers 5 converts it, tekken (a 131k tiktoken-style byte-level BPE), and tekken with an NFKC
# normalizer (a byte-level BPE that normalizes: fastokens takes the texts NFKC leaves as they are).
REAL = ("mistral-v1", "mistral-v1-metaspace", "tekken", "tekken-nfkc", "j2-unigram")


def real_tokenizer(work: Path, name: str) -> Path:
    """A REAL tokenizer's tokenizer.json, made once into `work`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import real_tokenizers

    out = work / "real" / name
    path = out / "tokenizer.json"
    if path.exists():
        return path
    out.mkdir(parents=True, exist_ok=True)
    if name == "tekken-nfkc":
        spec = json.loads(real_tokenizer(work, "tekken").read_text())
        spec["normalizer"] = {"type": "NFKC"}
        path.write_text(json.dumps(spec, ensure_ascii=False))
        return path
    make = {
        "mistral-v1": real_tokenizers.mistral_v1,
        "mistral-v1-metaspace": real_tokenizers.mistral_v1_metaspace,
        "tekken": real_tokenizers.tekken,
        "j2-unigram": real_tokenizers.j2_unigram,
    }[name]
    made = make(out)
    if made != path:
        path.write_text(made.read_text())
    return path


def encode_seconds(tokenizer: Path, texts: list[str], fast: bool) -> tuple[float, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    encode = tok.encode_batch_fast if fast else tok.encode_batch
    t0 = time.perf_counter()
    n = 0
    for i in range(0, len(texts), 512):
        n += sum(len(e.ids) for e in encode(texts[i : i + 512], add_special_tokens=False))
    return time.perf_counter() - t0, n


def _encode_part(tokenizer: str, texts: list[str], conn: Any) -> None:
    """In a forked child: encode `texts` on one thread, in 1 MiB groups (as the job's actors do)."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer)
    t0, n, i = time.perf_counter(), 0, 0
    while i < len(texts):
        j, chars = i, 0
        while j < len(texts) and (j == i or chars + len(texts[j]) <= 1 << 20):
            chars += len(texts[j])
            j += 1
        n += sum(len(e.ids) for e in tok.encode_batch_fast(texts[i:j], add_special_tokens=False))
        i = j
    conn.send((time.perf_counter() - t0, n))


def processes_seconds(tokenizer: Path, texts: list[str]) -> tuple[float, int]:
    """encode_batch_fast in one single-threaded process a core, each over a share of the texts dealt
    largest first (so the shares' sizes differ by less than one text): what the job's actors do,
    without Ray, reading, framing or writing. Forked before this process has encoded anything (a
    fork after tokenizers' thread pool started would disable it). (wall seconds, tokens)."""
    import multiprocessing

    cores = os.cpu_count() or 1
    shares = deal(texts, cores)
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(cores)]
    t0 = time.perf_counter()
    procs = [
        ctx.Process(target=_encode_part, args=(str(tokenizer), share, send))
        for share, (_, send) in zip(shares, pipes, strict=True)
    ]
    for proc in procs:
        proc.start()
    results = [recv.recv() for recv, _ in pipes]
    seconds = time.perf_counter() - t0
    for proc in procs:
        proc.join()
    return seconds, sum(n for _, n in results)


def _is_worker(p: psutil.Process) -> bool:
    """A Ray worker, or a local runner's worker: a process forked from `raypack pack` (the same
    command line as its parent's; the driver itself is not counted, as on Ray)."""
    if "ray::" in (p.info["name"] or "") or "default_worker.py" in " ".join(p.info["cmdline"] or []):
        return True
    cmdline = p.info["cmdline"] or []
    if not any("raypack" in part for part in cmdline):
        return False
    try:
        parent = p.parent()
        return parent is not None and parent.cmdline() == cmdline
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


class WorkerMemory:
    """Peak private memory and RSS over worker processes (Ray's, or a local runner's), sampled in a
    thread, with the process title at the private peak. statm is O(1) to read (psutil's USS walks
    every mapping)."""

    def __init__(self) -> None:
        self.uss: dict[int, int] = {}
        self.rss: dict[int, int] = {}
        self.titles: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        workers: list[psutil.Process] = []
        tick = 0
        while not self._stop.is_set():
            if tick % 5 == 0:  # rescan the process list every second (local workers fork late)
                workers = [p for p in psutil.process_iter(["name", "cmdline"]) if _is_worker(p)]
            tick += 1
            for p in workers:
                try:
                    mem = p.memory_info()
                    self.rss[p.pid] = max(self.rss.get(p.pid, 0), mem.rss)
                    if mem.rss - mem.shared > self.uss.get(p.pid, 0):
                        self.uss[p.pid] = mem.rss - mem.shared
                        self.titles[p.pid] = p.name()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self._stop.wait(0.2)

    def peak(self) -> tuple[int, int, str]:
        if not self.uss:
            return 0, 0, "-"
        top = max(self.uss, key=lambda pid: self.uss[pid])
        return self.uss[top], max(self.rss.values()), self.titles[top]

    def __enter__(self) -> WorkerMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def run_command(
    work: Path,
    corpus: Path,
    tokenizer: Path,
    name: str,
    pattern: str = "*.jsonl.gz",
    backend: str = "tokenizers",
    sections: dict[str, dict[str, object]] | None = None,
    **inputs: object,
) -> tuple[float, dict, WorkerMemory]:
    """`raypack pack` on the corpus (seq_len 8192, bfd, generated ids; `sections`: more settings,
    section by section): (seconds, metrics.json, memory)."""
    config: dict[str, dict[str, object]] = {
        "input": {"paths": [str(corpus / pattern)], "max_reject_ratio": 0.05, **inputs},
        "tokenizer": {"path": str(tokenizer), "backend": backend},
        "pack": {"seq_len": 8192},
        "output": {"path": str(work / f"out-{name}")},
    }
    for section, values in (sections or {}).items():
        config[section] = {**config.get(section, {}), **values}
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    raypack = Path(sys.executable).parent / "raypack"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    with WorkerMemory() as mem:
        t0 = time.perf_counter()
        done = subprocess.run(
            [str(raypack), "pack", str(path), "--overwrite"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"raypack pack failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    metrics = json.loads((work / f"out-{name}" / "metrics.json").read_text())
    return seconds, metrics, mem


def data_digest(out: Path) -> str:
    """One sha256 over every data file's name and bytes."""
    digest = hashlib.sha256()
    for path in sorted((out / "data").rglob("*.parquet")):
        digest.update(str(path.relative_to(out)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=int, nargs="+", default=[130, 500], help="corpus sizes")
    parser.add_argument(
        "--tokenizers",
        default="demo,large",
        help=f"comma-separated: demo, large, {', '.join(REAL)} (real model tokenizers)",
    )
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raypack-bench-job")
    parser.add_argument(
        "--backends", default="tokenizers,fastokens", help="tokenizer.backend values to run the job with"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="runs of the job per backend (the median is shown)"
    )
    parser.add_argument(
        "--one-file",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also pack the smallest corpus as one uncompressed JSONL file, whole and in work units",
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    tokenizers = {}
    for name in args.tokenizers.split(","):
        if name == "demo":
            demo_config(args.work / "demo")  # trains the demo's BPE once
            tokenizers["demo 8k"] = args.work / "demo" / "tokenizer.json"
        elif name == "large":
            tokenizers["bpe 128k"] = large_tokenizer(args.work)
        elif name in REAL:
            tokenizers[name] = real_tokenizer(args.work, name)
        else:
            raise SystemExit(f"unknown tokenizer {name!r}: demo, large or one of {', '.join(REAL)}")
    print(f"{os.cpu_count()} cores; ratios: encode_batch_fast seconds / job seconds, same texts, same run")
    for mb in args.mb:
        corpus, texts = make_corpus(args.work, mb)
        shards = len(list(corpus.glob("*.jsonl.gz")))
        head, total = [], 0
        for text in texts:
            if total >= 65 * 10**6:
                break
            head.append(text)
            total += len(text.encode())
        for label, tokenizer in tokenizers.items():
            procs_s, procs_n = processes_seconds(tokenizer, texts)
            fast_s, fast_n = encode_seconds(tokenizer, texts, fast=True)
            assert procs_n == fast_n, "the shares encoded to other tokens than the whole"
            limit_s = min(fast_s, procs_s)
            slow_s, slow_n = encode_seconds(tokenizer, head, fast=False)
            head_fast_s, _ = encode_seconds(tokenizer, head, fast=True)
            fast_rate = fast_n / fast_s
            print(
                f"{mb} MB, {len(texts):,} documents, {shards} shards, {label}: "
                f"encode_batch_fast {fast_rate / 1e6:.3f} Mtok/s ({fast_s:.1f} s), in {os.cpu_count()} "
                f"one-thread processes {fast_n / procs_s / 1e6:.3f} Mtok/s ({procs_s:.1f} s); encode_batch "
                f"{slow_n / slow_s / 1e6:.3f} Mtok/s on the first 65 MB "
                f"(fast/slow x{slow_s / head_fast_s:.2f})",
                flush=True,
            )
            text_mb = sum(len(t.encode()) for t in texts) / 1e6
            digests = {}
            for backend in args.backends.split(","):
                name = f"{mb}-{label.split()[-1]}-{backend}"
                # --runs of the job, the median's figures shown (this machine's noise: ±10-40%).
                runs = sorted(
                    (
                        run_command(args.work, corpus, tokenizer, name, backend=backend)
                        for _ in range(args.runs)
                    ),
                    key=lambda run: run[0],
                )
                seconds, metrics, mem = runs[len(runs) // 2]
                stages = metrics["stage_seconds"]
                assert metrics["metrics"]["tokens"] >= fast_n, (
                    "the job packed fewer tokens than the text holds"
                )
                digests[backend] = data_digest(args.work / f"out-{name}")
                uss, rss, title = mem.peak()
                chosen = json.loads((args.work / f"out-{name}" / "manifest.json").read_text())["tokenizer"]
                per_core = ", ".join(
                    f"{k} {v:.1f} s ({text_mb / max(v, 1e-9) / (os.cpu_count() or 1):.1f} MB/s/core)"
                    for k, v in stages.items()
                )
                print(
                    f"  backend {backend} ({chosen.get('backend', {}).get('chosen', '?')}): raypack pack "
                    f"{seconds:.1f} s = x{limit_s / seconds:.3f} the faster encode_batch_fast baseline, "
                    f"tokenize stage {stages['tokenize']:.1f} s = x{limit_s / stages['tokenize']:.3f}; "
                    f"stages: {per_core}; startup and the rest {seconds - sum(stages.values()):.1f} s; "
                    f"largest worker private {uss / 2**20:.0f} MiB ({title}), RSS {rss / 2**20:.0f} MiB"
                    + (
                        f"; median of {len(runs)} runs: " + ", ".join(f"{r[0]:.1f}" for r in runs) + " s"
                        if len(runs) > 1
                        else ""
                    ),
                    flush=True,
                )
            same = len(set(digests.values())) == 1
            print(f"  data files identical across backends: {same}", flush=True)
            assert same, f"backends wrote different data: {digests}"
        if args.one_file and mb == min(args.mb):
            split_comparison(args.work, mb, texts, next(iter(tokenizers.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
