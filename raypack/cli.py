"""The `raypack` command. Subcommands parse a few arguments and hand over; user mistakes end in one
line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import _thread
import argparse
import atexit
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn, TextIO, TypeVar

from raypack._version import __version__
from raypack.errors import ConfigError, JobError, storage_cause

if TYPE_CHECKING:
    import numpy as np

    from raypack.config import JobConfig, StorageConfig
    from raypack.dataset.store import StoreUsage
    from raypack.engine import Runner
    from raypack.plan_sample import CorpusSample
    from raypack.report.model import Run
    from raypack.verifier import VerifyReport

    # What add_subparsers returns: each command's _add_* function adds its parser to it.
    Subcommands = argparse._SubParsersAction["_Parser"]

T = TypeVar("T")

__all__ = ["main", "run"]

EXIT_USAGE = 2


def _process_started() -> float:
    """When this process began (wall clock), from /proc: the time a user waits for `raypack pack`
    includes Python's start and the imports (0.5 s of a 4 s small job), which a clock started in
    main() would hide. Elsewhere, the time this module was imported."""
    try:
        with open("/proc/self/stat") as f:
            # Field 22, after the command name in parentheses (which may hold spaces): clock ticks
            # since boot.
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return _IMPORTED


_IMPORTED = time.time()
# Set by run() (the console script) to the process's start; main() called from Python (tests, a
# notebook) counts from its own call.
_started: float | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="raypack", description="Pack tokenized corpora into fixed-length training sequences."
    )
    parser.add_argument("--version", action="version", version=f"raypack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for add in (
        _add_plan,
        _add_pack,
        _add_rebuild,
        _add_verify,
        _add_inspect,
        _add_convert,
        _add_report,
        _add_cache,
        _add_demo,
    ):
        add(sub)
    return parser


def _add_plan(sub: Subcommands) -> None:
    """`raypack plan`: a dry run over document lengths: a file's, a built-in sample's, or a job
    corpus's sample, tokenized as the job would."""
    from raypack.packing import ALGORITHMS

    plan = sub.add_parser(
        "plan",
        help="dry run: pack document lengths (a file's, or a sample of a job's corpus) and compare "
        "algorithms and seq_lens",
        description="Pack document lengths (no data is written) and print packs, efficiency and ratios "
        "per algorithm and seq_len: lengths from a file or a packed dataset, a built-in sample, or a "
        "seeded sample of a job config's corpus read and tokenized as its job would.",
    )
    # Neither a source nor --seq-len is required by argparse, which would name them before the
    # stray CONFIG a user of `raypack pack` gives out of habit: _cmd_plan asks for them after.
    plan.add_argument("stray", nargs="?", help=argparse.SUPPRESS)
    source = plan.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        metavar="CONFIG",
        help="a job config (YAML): a seeded sample of its input's documents, read and tokenized as its "
        "job would (input and tokenizer sections); --seq-len and --algorithm default to its pack section",
    )
    source.add_argument(
        "--lengths",
        metavar="PATH",
        help=".npy, .txt (one length a line), .parquet (length column), or a packed dataset (its index/)",
    )
    source.add_argument(
        "--sample",
        metavar="N",
        type=int,
        help="use N built-in lognormal(6.0, 1.2) lengths (seeded) instead of a file",
    )
    plan.add_argument(
        "--documents",
        metavar="N",
        type=int,
        help="with --config: documents to sample, spread over the corpus (default 10,000)",
    )
    plan.add_argument(
        "--seq-len",
        metavar="N",
        type=int,
        nargs="+",
        help="one or more pack lengths (required, but with --config: its pack.seq_len)",
    )
    plan.add_argument(
        "--algorithm",
        help=f"one of {', '.join(ALGORITHMS)}, a comma-separated list, or 'all' (default: bfd; with "
        "--config its pack.algorithm)",
    )
    plan.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="a pack setting, e.g. overflow=truncate, max_depth=3, bucket_lengths=[1024,2048], "
        "padding_threshold=0.05, nnls_bin_width=16; with --config, any key of the config too, e.g. "
        "input.text_field=content (repeatable)",
    )  # flat keys are pack settings
    plan.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of the built-in sample, or of the documents --config samples (default 0)",
    )
    plan.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    plan.add_argument("--report", metavar="DIR", help="also write DIR/report.html: plots and the comparison")


def _add_pack(sub: Subcommands) -> None:
    """`raypack pack CONFIG`: the packing job."""
    pack = sub.add_parser(
        "pack",
        help="run the packing job: on this machine's processes (a small corpus, no cluster), on local Ray, "
        "or on the cluster named by RAY_ADDRESS (run.executor)",
        description="Read, tokenize, pack and write a corpus as configured in CONFIG (YAML).",
    )
    pack.add_argument("config", metavar="CONFIG", help="job config (YAML): input, tokenizer, pack, output")
    _add_overrides(pack)
    pack.add_argument("--overwrite", action="store_true", help="replace a dataset already at output.path")
    pack.add_argument(
        "--limit",
        metavar="SIZE",
        help="a trial: pack a deterministic sample of about SIZE of the input (e.g. 200MB, 2GiB; "
        "input.limit_bytes), marked as a sample in the manifest, summary and report",
    )
    _add_quiet(pack)


def _add_rebuild(sub: Subcommands) -> None:
    """`raypack rebuild CONFIG`: a new version of a dataset, the unchanged shards' tokens reused."""
    rebuild = sub.add_parser(
        "rebuild",
        help="write a new version of a dataset, tokenizing only new or changed shards",
        description="Scheduled, incremental rebuild: writes output.path/v=NNNNNN/ with the same job as "
        "`pack`, reusing token files from output.path/_cache/ for unchanged shards, then moves "
        "output.path/LATEST to it and keeps output.keep_versions versions.",
    )
    rebuild.add_argument("config", metavar="CONFIG", help="job config (YAML), as for pack")
    rebuild.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="when another rebuild of the same output holds its lease, wait up to this long for it "
        "(default 0: exit 2 at once, naming it)",
    )
    _add_overrides(rebuild)
    _add_quiet(rebuild)


def _add_verify(sub: Subcommands) -> None:
    """`raypack verify OUTPUT`: a finished dataset checked against its manifest and index."""
    verify = sub.add_parser(
        "verify",
        help="check that a packed dataset holds every input document exactly once",
        description="Re-read OUTPUT and check files, packs and documents against its manifest and index.",
    )
    verify.add_argument("output", metavar="OUTPUT", help="a dataset, or a rebuild's root (follows LATEST)")
    verify.add_argument(
        "--config",
        help="the job config to re-tokenize a sample of documents with and compare (default: the "
        "config the dataset's manifest records)",
    )
    verify.add_argument("--sample", type=int, default=64, help="documents to re-tokenize (64; 0: none)")
    _add_sets(
        verify,
        " (of --config, else of the manifest's config: e.g. where the inputs are now; without --config,"
        " storage.* is also where the manifest is read: an S3 endpoint)",
    )


def _add_inspect(sub: Subcommands) -> None:
    """`raypack inspect OUTPUT [PACK]`: a pack decoded back to text."""
    inspect = sub.add_parser(
        "inspect",
        help="show a pack decoded back to text: its documents, their boundaries and ids, the loss mask",
        description="Print an overview of OUTPUT and one pack (the first, or PACK): each item's document "
        "id, chunk and tokens, its text decoded with the dataset's tokenizer (BOS, EOS and pad shown as "
        "⟨bos⟩, ⟨eos⟩, ⟨pad⟩; long texts elided), the padding, and for chat data the untrained tokens "
        "(dimmed on a terminal, else between ⟦ ⟧). Packs are numbered from 0 across the data files in "
        "path order, in every output format.",
    )
    inspect.add_argument("output", metavar="OUTPUT", help="a dataset, or a rebuild's root (follows LATEST)")
    inspect.add_argument("pack", metavar="PACK", nargs="?", type=int, help="the pack's number (default 0)")
    inspect.add_argument(
        "--tokenizer", metavar="PATH", help="decode with this tokenizer (default: the one the manifest names)"
    )
    inspect.add_argument("--full", action="store_true", help="every character of long texts (and every id)")
    inspect.add_argument("--ids", action="store_true", help="each item's token ids under its text")
    inspect.add_argument(
        "--json",
        action="store_true",
        help="one JSON object: the pack's items with ids, text, positions, mask",
    )
    inspect.add_argument("--config", help="the job config, for its storage settings (an S3 endpoint)")
    _add_sets(inspect, "; with --config: storage.*", "storage.endpoint=http://127.0.0.1:8333")


def _add_convert(sub: Subcommands) -> None:
    """`raypack convert DATASET`: a finished dataset written again in another output format."""
    from raypack.config.output import OUTPUT_FORMATS

    convert = sub.add_parser(
        "convert",
        help="write a finished dataset again in another output format, without tokenizing again",
        description="Read every pack of DATASET through its format and write it in FORMAT to --out "
        "(the same files `raypack pack` writes with output.format FORMAT); index/ and rejects/ are "
        "copied, the manifest carries over.",
    )
    convert.add_argument("dataset", metavar="DATASET", help="a dataset, or a rebuild's root (follows LATEST)")
    convert.add_argument("--format", required=True, help=f"one of {', '.join(OUTPUT_FORMATS)}")
    convert.add_argument("--out", required=True, metavar="DIR", help="where the converted dataset goes")
    convert.add_argument("--overwrite", action="store_true", help="replace a dataset already at --out")
    convert.add_argument(
        "--pad-id",
        type=int,
        metavar="ID",
        help="what the new dataset's padding holds (default: the dataset's; olmo needs an id other than EOS)",
    )
    convert.add_argument(
        "--config", help="a job config, for its storage and run settings (an S3 endpoint, run.executor)"
    )
    _add_sets(convert, "; with --config: storage.* and run.*", "storage.endpoint=http://127.0.0.1:8333")


def _add_report(sub: Subcommands) -> None:
    """`raypack report OUTPUT`: a finished dataset's report.html."""
    report = sub.add_parser(
        "report",
        help="write the HTML report of a packed dataset (raypack pack writes it too)",
        description="Render OUTPUT's report.html from its manifest and metrics (no data files are read): "
        "length histogram, pack fill, truncations, metrics, time per stage, rejects.",
    )
    report.add_argument("output", metavar="OUTPUT", help="a dataset, or a rebuild's root (follows LATEST)")
    report.add_argument("--out", metavar="DIR", help="write DIR/report.html (default: OUTPUT/report.html)")
    report.add_argument("--config", help="the job config, for its storage settings (an S3 endpoint)")
    _add_sets(report, "; with --config: storage.*", "storage.endpoint=http://127.0.0.1:8333")


def _add_cache(sub: Subcommands) -> None:
    """`raypack cache info|prune`: a token store looked at or pruned."""
    cache = sub.add_parser(
        "cache",
        help="look at or prune a token store (cache.path)",
        description="A token store keeps tokenized units for every later pack or rebuild that names "
        "it (cache.path). `info` says how big it is; `prune` deletes the entries last used before AGE "
        "(--older-than), then the least recently used until it fits (--max-size), and what killed jobs left.",
    )
    cache.add_argument("action", choices=["info", "prune"])
    cache.add_argument("store", metavar="STORE", nargs="?", help="the store (default: --config's cache.path)")
    cache.add_argument("--older-than", metavar="AGE", help="prune units last used AGE ago: 30d, 12h, 90min")
    cache.add_argument("--max-size", metavar="SIZE", help="then prune the oldest until it holds SIZE: 500GB")
    cache.add_argument("--config", help="a job config: its cache.path and storage settings (an S3 endpoint)")
    _add_sets(cache, "; with --config: storage.* and cache.*", "cache.path=/data/token-store")


def _add_demo(sub: Subcommands) -> None:
    """`raypack demo`: a built-in corpus packed offline."""
    demo = sub.add_parser(
        "demo",
        help="pack a built-in corpus (Python's standard library) with a built-in tokenizer, offline",
        description="Build a corpus from this Python's standard library sources, train a small BPE "
        "tokenizer on it, pack it on this machine (the executor a small job takes), and verify the result.",
    )
    demo.add_argument("out", metavar="OUT", nargs="?", default="raypack-demo", help="work dir (raypack-demo)")
    demo.add_argument("--seq-len", type=int, default=2048)
    _add_quiet(demo)


def _add_sets(
    p: argparse.ArgumentParser,
    what: str = "",
    example: str = "pack.seq_len=8192 or output.path=s3://bucket/out",
) -> None:
    p.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help=f"override a config value, e.g. {example} (repeatable){what}",
    )


def _add_overrides(p: argparse.ArgumentParser) -> None:
    _add_sets(p)
    p.add_argument(
        "--compare",
        metavar="ALGOS",
        help="also plan these histogram packers (comma-separated, or 'all') on the corpus and put them "
        "beside pack.algorithm in metrics.json and the report (same as --set pack.compare=[...])",
    )


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="no progress and no [raypack] lines on stderr (the summary stays)",
    )


def _voice(args: argparse.Namespace) -> tuple[Callable[[str], None], TextIO | None]:
    """The [raypack] lines' printer and the progress stream (stderr), or none of them with --quiet."""
    if args.quiet:
        return (lambda _: None), None
    return partial(print, file=sys.stderr, flush=True), sys.stderr


def _job_overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.overrides)
    if getattr(args, "limit", None) is not None:
        overrides.append(f"input.limit_bytes={_size(args.limit, '--limit')}")
    if args.compare is not None:
        names = [a.strip() for a in args.compare.split(",") if a.strip()]
        overrides.append(f"pack.compare={json.dumps(names)}")
    return overrides


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(i?)b?|b?)\s*$", re.IGNORECASE)


def _size(text: str, what: str) -> int:
    """Bytes of a size as a user writes it: 200MB (10^6), 2GiB (2^30), 5000."""
    match = _SIZE.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ConfigError(f"{what} takes a size such as 200MB, 2GiB or 5000000 (bytes), got {text!r}")
    number, unit, binary = match.groups()
    power = "kmgt".index(unit.lower()) + 1 if unit else 0
    return max(1, int(float(number) * (1024 if binary else 1000) ** power))


def _config_of(
    args: argparse.Namespace, more: list[str] | None = None, reads: tuple[str, ...] = ()
) -> JobConfig | None:
    """--config with its --set overrides (verify, convert, report, cache), then `more`; None
    without --config. `reads`: the only sections the command reads, where it reads only some: an
    override of another is refused, not ignored."""
    from raypack.config import load_config, parse_override

    if not args.config:
        if args.overrides:
            raise ConfigError("--set overrides the job config: give it with --config")
        return None
    for text in args.overrides:
        section = parse_override(text)[0][0]
        if reads and section not in reads:
            raise ConfigError(
                f"--set {text}: raypack {args.command} reads only the config's "
                f"{' and '.join(f'{r}.*' for r in reads)}"
                + (" (a dataset's own settings are its manifest's)" if args.command != "cache" else "")
            )
    return load_config(args.config, [*args.overrides, *(more or [])])


def _cmd_plan(args: argparse.Namespace) -> int:
    from raypack import dryrun

    _check_plan_args(args)
    cfg = _plan_config(args)
    if cfg is not None:
        args.seq_len = args.seq_len or [cfg.pack.seq_len]
    algorithms = _plan_algorithms(args.algorithm or (cfg.pack.algorithm if cfg is not None else "bfd"))
    for n in args.seq_len:
        if n < 1:
            raise ConfigError(f"--seq-len must be >= 1, got {n}")
    # Before the lengths: a file of millions takes seconds.
    settings = dryrun.plan_settings(_plan_overrides(args.overrides) if cfg is None else _pack_settings(cfg))
    if args.report:
        _check_report_dir(args.report)  # before the sweep, which may take minutes
    sample = _plan_sample(args, cfg) if cfg is not None else None
    if sample is not None:
        lengths = sample.lengths
    elif args.sample is not None:
        lengths = dryrun.sample_lengths(args.sample, args.seed)
    else:
        lengths = dryrun.load_lengths(args.lengths)
    results = _in_child(dryrun.run_sweep, lengths, args.seq_len, algorithms, settings)
    scale = sample.drawn.scale if sample is not None else None
    if args.json:
        for r in results:
            print(json.dumps(dryrun.json_record(r, sample is not None, scale)))
    else:
        print(f"{len(lengths):,} documents, {int(lengths.sum()):,} tokens")
        print(dryrun.format_table(results, scale))
    if args.report:
        _write_plan_report(args, lengths, results, settings, sample)
    return 0


def _check_plan_args(args: argparse.Namespace) -> None:
    """A ConfigError, saying what to give, for a plan given a positional job config, no lengths or
    no --seq-len."""
    if args.stray is not None:
        raise ConfigError(
            f"raypack plan takes a job config as --config {args.stray}: it plans on a sample of the "
            "config's corpus, or on document lengths from a file or a packed dataset (--lengths PATH) "
            "or a built-in sample (--sample N), with --seq-len; to pack a corpus: raypack pack CONFIG"
        )
    if args.lengths is None and args.sample is None and args.config is None:
        raise ConfigError("raypack plan needs lengths: --config CONFIG, --lengths PATH or --sample N")
    if args.config is None and args.documents is not None:
        raise ConfigError("--documents is the size of a job corpus's sample: give the job's --config")
    if not args.seq_len and args.config is None:
        raise ConfigError("raypack plan needs --seq-len N [N ...]")


def _plan_config(args: argparse.Namespace) -> JobConfig | None:
    """--config with its --set overrides (a flat key is a pack setting, as without a config); None
    without --config."""
    if args.config is None:
        return None
    from raypack.config import load_config, parse_override

    overrides = [o if len(parse_override(o)[0]) > 1 else f"pack.{o}" for o in args.overrides]
    return load_config(args.config, overrides)


def _pack_settings(cfg: JobConfig) -> dict[str, Any]:
    """The config's pack settings a plan reads (dryrun.PLAN_SETTINGS), those it sets."""
    from raypack.config import PackConfig
    from raypack.dryrun import PLAN_SETTINGS

    default = PackConfig()
    return {k: getattr(cfg.pack, k) for k in PLAN_SETTINGS if getattr(cfg.pack, k) != getattr(default, k)}


def _plan_sample(args: argparse.Namespace, cfg: JobConfig) -> CorpusSample:
    """The lengths of a sample of cfg's corpus (plan_sample), made in a process of its own (what
    Ctrl-C stops at once, and tokenizers' threads are not forked from into the sweep's), and the
    lines that say what it is (on stderr beside --json)."""
    from raypack.corpus.readers.records import reasons_text
    from raypack.plan_sample import DEFAULT_DOCUMENTS, corpus_lengths, describe

    documents = DEFAULT_DOCUMENTS if args.documents is None else args.documents
    if documents < 1:
        raise ConfigError(f"--documents must be >= 1, got {documents}")
    sample = _in_child(corpus_lengths, cfg, documents, args.seed)
    if not len(sample.lengths):
        raise ConfigError(
            f"the sample of {args.config}'s input holds no document to pack: {sample.drawn.records:,} "
            f"records read, {sample.rejected:,} rejected as the job would: {reasons_text(sample.reasons)}"
        )
    for line in describe(sample, args.config, cfg.input.max_reject_ratio):
        print(line, file=sys.stderr if args.json else sys.stdout)
    return sample


def _plan_algorithms(given: str) -> list[str]:
    """The packers --algorithm names (a comma-separated list, or 'all'); ConfigError for an unknown
    one."""
    from raypack.packing import ALGORITHMS

    if given == "all":
        return ["all"]
    algorithms = [a.strip() for a in given.split(",") if a.strip()]
    for name in algorithms:
        if name not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)} or all")
    return algorithms


def _plan_overrides(overrides: list[str]) -> dict[str, Any]:
    """The pack settings --set gives, by their key within pack (max_depth=3, or pack.max_depth=3);
    ConfigError for a setting of another section."""
    from raypack.config import parse_override

    settings = {}
    for text in overrides:
        path, value = parse_override(text)
        if len(path) == 2 and path[0] == "pack":  # as a job's config names it
            path = path[1:]
        if len(path) != 1:
            raise ConfigError(
                f"--set {text!r}: a plan takes pack settings only (max_depth=3, or pack.max_depth=3)"
            )
        settings[path[0]] = value
    return settings


def _write_plan_report(
    args: argparse.Namespace,
    lengths: np.ndarray,
    results: list[Run],
    settings: dict[str, Any],
    sample: CorpusSample | None,
) -> None:
    """--report DIR's report.html of the sweep, and a line on stderr saying where it is."""
    from raypack.report import from_dry_run, write_report

    notes: list[str] = []
    if sample is not None:
        from raypack.plan_sample import describe

        source = f"a sample of {args.config}'s input, seed {args.seed}"
        notes = describe(sample, args.config, None)
    elif args.lengths:
        source = args.lengths
    else:
        source = f"built-in sample: {args.sample:,} lognormal(6.0, 1.2) lengths, seed {args.seed}"
    written = write_report(from_dry_run(lengths, source, results, settings, notes), args.report)
    print(f"report: {written}", file=sys.stderr)


def _check_report_dir(path: str) -> None:
    """A local --report DIR made now, or a ConfigError saying why it cannot be (a file there, no
    permission): not found out once the work is done. Object storage is met when it is written."""
    from raypack.paths import is_uri

    if is_uri(path):
        return
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--report {path}: cannot write a report there ({e.strerror or e})") from None
    if not os.access(path, os.W_OK):
        raise ConfigError(f"--report {path}: cannot write a report there (no permission)")


def _in_child(fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) in a forked child process, its result sent back: what Ctrl-C must be able to stop
    at once. A packer's loop (numba's) or scipy's NNLS holds the main thread, or the GIL, for
    seconds to minutes (nnlshp at 512 classes: 47 s on 200,000 lengths), and neither a signal's
    handler nor the interrupt watchdog runs until it returns. This process only waits;
    interrupted, it kills the child. In-process where fork is not offered."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return fn(*args)
    with multiprocessing.get_context("fork").Pool(1, initializer=_child_signals) as pool:
        return pool.apply_async(fn, args).get()  # the pool's exit kills the child (SIGTERM)


def _child_signals() -> None:
    """A child of _in_child leaves Ctrl-C to this process (the terminal sends it to both), and
    SIGTERM kills it outright: the handler it inherited would wait for the GIL, which the work
    it is killed in the middle of may hold."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for stop in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_DFL)


def _cmd_pack(args: argparse.Namespace) -> int:
    from raypack.config import load_config
    from raypack.pipeline.job import run_job
    from raypack.summary import format_summary

    cfg = load_config(args.config, _job_overrides(args))
    log, progress = _voice(args)
    result = run_job(
        cfg,
        overwrite=args.overwrite,
        log=log,
        release_ray=True,
        progress=progress,
        started=args.started,
        local=args.local,
    )
    print(format_summary(result, time.time() - args.started))
    return 0


def _cmd_rebuild(args: argparse.Namespace) -> int:
    from raypack.config import load_config
    from raypack.pipeline.rebuild import run_rebuild
    from raypack.summary import format_rebuild

    cfg = load_config(args.config, _job_overrides(args))
    if args.wait < 0:
        raise ConfigError(f"--wait must be >= 0, got {args.wait}")
    log, progress = _voice(args)
    result = run_rebuild(
        cfg, wait_s=args.wait, log=log, progress=progress, started=args.started, local=args.local
    )
    print(format_rebuild(result, time.time() - args.started))
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from raypack.verifier import datasets_override, recorded_config, verify

    if args.sample < 0:
        raise ConfigError(f"--sample must be >= 0, got {args.sample}")
    note = ""
    # Without --config, storage.* from --set is how verify reaches the manifest that holds the rest
    # of the config (an S3 endpoint not in the environment).
    storage = None if args.config else _storage_set(args.overrides)
    if args.config:
        # Packed from Ray Datasets: the config names them as raypack.pack did.
        cfg = _config_of(args, datasets_override(args.output))
    elif args.sample:
        cfg, note = recorded_config(args.output, args.overrides, storage)
    elif any(not o.strip().startswith("storage.") for o in args.overrides):
        raise ConfigError("--set overrides the config a sample is re-tokenized with: not with --sample 0")
    else:
        cfg = None
    report = verify(args.output, cfg, sample=args.sample, storage=storage)
    if note and report.ok:
        report.warnings.append(f"no document re-tokenized: {note}; give --config or --set to say where")
    if report.ok:
        sampled = f", {_documents(report.sampled)} re-tokenized and equal" if cfg and args.sample else ""
        unpacked = f" ({report.unpacked:,} with no token packed)" if report.unpacked else ""
        print(
            f"OK: {report.dataset}: {_documents(report.documents)}{unpacked}, {report.items:,} items, "
            f"{report.packs:,} packs, {report.tokens:,} tokens{sampled}"
        )
        if report.trial:
            print(f"note: {report.trial}")
        if report.duplicate_ids:
            print(f"note: {report.duplicate_ids:,} document ids are carried by more than one input document")
        _print_lost_and_warnings(report)
        return 0
    _print_lost_and_warnings(report)
    for problem in report.problems:
        print(f"FAIL: {report.dataset}: {problem}")
    n = len(report.problems)
    print(f"FAIL: {n} problem{'s' if n != 1 else ''} found in {report.dataset}")
    return 1


def _documents(n: int) -> str:
    return f"{n:,} document{'s' if n != 1 else ''}"


def _files(n: int) -> str:
    return f"{n:,} input file{'s were' if n != 1 else ' was'}"


def _storage_set(overrides: list[str]) -> StorageConfig | None:
    """The storage settings `--set storage.*` gives, with the environment's (None without any)."""
    from raypack.config import StorageConfig, from_dict
    from raypack.config.load import apply_overrides

    sets = [o for o in overrides if o.strip().startswith("storage.")]
    if not sets:
        return None
    return from_dict(StorageConfig, apply_overrides({"storage": {}}, sets)["storage"]).from_environment()


def _print_lost_and_warnings(report: VerifyReport) -> None:
    if report.lost_files:
        print(
            f"note: {_files(len(report.lost_files))} lost whole or in part "
            f"({report.rejected_records:,} rejected records in all), e.g. {'; '.join(report.lost_files[:3])}"
        )
    for warning in report.warnings:
        print(f"warning: {warning}")


def _cmd_inspect(args: argparse.Namespace) -> int:
    from raypack.inspector import inspect_pack, json_record, render

    cfg = _config_of(args, reads=("storage",))
    storage = cfg.storage if cfg is not None else None
    view = inspect_pack(args.output, args.pack, tokenizer=args.tokenizer, storage=storage)
    if args.json:
        print(json.dumps(json_record(view), ensure_ascii=False))
        return 0
    color = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    print(render(view, full=args.full, ids=args.ids, color=color))
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from raypack.convert import convert

    cfg = _config_of(args, reads=("storage", "run"))
    storage = cfg.storage if cfg is not None else None
    log = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    run = cfg.run if cfg is not None else None
    result = convert(
        args.dataset,
        args.format,
        args.out,
        overwrite=args.overwrite,
        storage=storage,
        log=log,
        run=run,
        pad_id=args.pad_id,
    )
    files = f"{result.files:,} file{'' if result.files == 1 else 's'}"
    print(
        f"converted {result.source} to {result.format['name']}: {result.output} ({files}, "
        f"{result.bytes / 2**20:.1f} MiB); report {result.report or 'not written'}"
    )
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from raypack.dataset.layout import resolve_dataset
    from raypack.report import from_dataset, write_report

    cfg = _config_of(args, reads=("storage",))
    storage = cfg.storage if cfg is not None else None
    report = from_dataset(args.output, storage)
    out = args.out or resolve_dataset(args.output, storage)
    print(f"report: {write_report(report, out, storage)}")
    return 0


# No bare numbers and no "m" (minutes, or months?): a prune is not undone.
_AGE_UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_SIZE_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def _amount(text: str, units: dict[str, int], what: str, example: str) -> float:
    """`text` as a number times its unit ("30d", "1.5TB"); ConfigError naming `what` otherwise."""
    import re

    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is not None and not unit and float(found.group(1)) == 0:
        return 0.0  # nothing is nothing in any unit: --max-size 0 empties the store
    if found is None or unit not in units:
        raise ConfigError(
            f"{what} takes a number and one of the units {', '.join(units)} ({example}), not {text!r}"
        )
    return float(found.group(1)) * units[unit]


def _cmd_cache(args: argparse.Namespace) -> int:
    from raypack.config import StorageConfig
    from raypack.dataset.store import check_store, prune, size_text, units_text, usage

    cfg = _config_of(args, reads=("storage", "cache"))
    store = args.store or (cfg.cache.path if cfg is not None else None)
    if store is None:
        raise ConfigError("name the store: raypack cache ACTION STORE, or --config with cache.path")
    storage = (cfg.storage if cfg is not None else StorageConfig()).from_environment()
    check_store(store, storage, must_exist=True)
    if args.action == "info":
        if args.older_than or args.max_size:
            raise ConfigError("--older-than and --max-size are for prune")
        found = usage(store, storage)
        print(f"{store}: {units_text(found.entries)}, {size_text(found.bytes)}{_store_notes(found)}")
        return 0
    if not (args.older_than or args.max_size):
        raise ConfigError("say what to prune: --older-than AGE, --max-size SIZE, or both")
    older = None if not args.older_than else _amount(args.older_than, _AGE_UNITS, "--older-than", "30d, 12h")
    most = None if not args.max_size else int(_amount(args.max_size, _SIZE_UNITS, "--max-size", "500GB"))
    done = prune(store, storage, older_than_s=older, max_bytes=most)
    print(
        f"{store}: removed {units_text(done.removed_entries)} ({size_text(done.removed_bytes)}) and "
        f"{done.removed_leftovers:,} file{'' if done.removed_leftovers == 1 else 's'} a killed job left; "
        f"it holds {units_text(done.kept.entries)}, "
        f"{size_text(done.kept.bytes)}{_store_notes(done.kept)}"
    )
    return 0


def _store_notes(found: StoreUsage) -> str:
    """What a store's count leaves unsaid (StoreUsage): its writers' temporaries, which no prune
    removes before they are a day old (so "0 units" may still be some MiB after --max-size 0), and
    what its directory holds that is none of a store's (a directory named by mistake, an output or
    a home, would otherwise read "0 units, 0 B" and nothing more)."""
    from raypack.dataset.store import size_text

    notes = ""
    if found.temporary_bytes:
        notes += (
            f", {size_text(found.temporary_bytes)} of it writers' temporaries (a running job's, or a "
            "killed one's: prune removes those a day old)"
        )
    if found.others:
        what = "file or folder that is" if found.others == 1 else "files or folders that are"
        notes += f"; besides, {found.others:,} {what} none of a store's"
    return notes


def _cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from raypack.config import load_config
    from raypack.demo import demo_built, demo_config
    from raypack.pipeline.job import run_job
    from raypack.summary import format_summary
    from raypack.verifier import verify

    out = Path(args.out).resolve()
    log, progress = _voice(args)
    reused = demo_built(out)
    log(f"[raypack] {'reusing' if reused else 'building'} the demo corpus and tokenizer under {out} ...")
    built = time.time()
    cfg = load_config(str(demo_config(out, seq_len=args.seq_len)))
    # The job's time from here: the corpus and the BPE's training are the demo's, not the job's
    # (counted in, ~7 s of a 12 s demo would read as "the rest (start, imports, the tokenizer, ...)").
    started = time.time()
    print(
        f"demo corpus and tokenizer: {started - args.started:.1f}s with the command's start "
        f"({'reused' if reused else 'built'} in {started - built:.1f}s)"
    )
    result = run_job(cfg, overwrite=True, log=log, progress=progress, started=started, local=args.local)
    print(format_summary(result, time.time() - started, timed="the job"))
    report = verify(cfg.output.path, cfg, sample=32)
    if not report.ok:
        for problem in report.problems:
            print(f"FAIL: {problem}")
        return 1
    present = f"{_documents(report.documents)} present exactly once"
    print(f"verify: OK ({present}, {report.sampled:,} re-tokenized)")
    print(f"config: {out / 'demo.yaml'}  (raypack pack {out / 'demo.yaml'} --overwrite reruns it)")
    return 0


_INTERRUPTED = "raypack: interrupted"
_HALF_WRITTEN = "a dataset is complete once its manifest.json exists: rerun to finish one without"
_WRITERS = ("pack", "rebuild", "demo", "convert")  # the commands that write a dataset


def _interrupted(argv: Sequence[str] | None) -> str:
    """The line an interrupted command ends with (what a dataset left half-written means, where
    the command writes one)."""
    command = list(sys.argv[1:] if argv is None else argv)[:1]
    if command and command[0] in _WRITERS:
        return f"{_INTERRUPTED} ({_HALF_WRITTEN})"
    return _INTERRUPTED


# Ctrl-C raises KeyboardInterrupt in the main thread, but one that lands inside a finalizer or a
# callback of Ray's is printed as "ignored" and lost (a driver interrupted mid-tokenize then runs to
# the end and exits 0). So a watchdog raises it again every second until main() has handled it, and
# after 10 s leaves outright. Nothing is left half-committed either way: a dataset is
# complete only once its manifest is written.
_INTERRUPT_GRACE_S = 10


class _Interrupts:
    def __init__(self, line: str) -> None:
        self.line = line
        self.handled = threading.Event()
        self.watchdog: threading.Thread | None = None

    signum = signal.SIGINT

    def on_signal(self, signum: int, frame: object) -> None:
        if self.watchdog is None:  # the first signal is the exit code's: the watchdog's own
            # interrupt_main() below comes through here as a SIGINT (exit 130 after a SIGTERM
            # whose clean-up takes over a second, as it may on a loaded machine)
            self.signum = signal.Signals(signum)
            self.watchdog = threading.Thread(target=self._watch, daemon=True)
            self.watchdog.start()
        raise KeyboardInterrupt

    def _watch(self) -> None:
        for _ in range(_INTERRUPT_GRACE_S):
            if self.handled.wait(1.0):
                return
            _thread.interrupt_main()
        print(self.line, file=sys.stderr, flush=True)
        os._exit(128 + self.signum)


# Ctrl-C, and what `kill`, `timeout`, `ray job stop` and Kubernetes send a job to end it: each
# ends the command as Ctrl-C does (its workers, staging area and temp files cleaned up, one line),
# with the exit code of that signal (130, 143, 129).
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main(argv: Sequence[str] | None = None) -> int:
    interrupts = _Interrupts(_interrupted(argv))
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, interrupts.on_signal) for s in _STOPS} if in_main_thread else {}
    try:
        code = _main(argv)
        return 128 + interrupts.signum if code == 128 + signal.SIGINT else code
    finally:
        interrupts.handled.set()  # no re-raise or forced exit once main() is done
        for s, handler in previous.items():
            signal.signal(s, handler)


def run() -> NoReturn:
    """The `raypack` console script: main(), then the exit without the interpreter's teardown. What
    a normal exit does for the user still happens (atexit's handlers, temporary files among them;
    stdout and stderr flushed); what is skipped is freeing every module and what the native
    libraries hold, 0.6-1.0 s after a 500 MB pack on 2 cores (0.05 s so). An exception out of
    main() (a bug: it keeps its traceback) exits the usual way."""
    global _started
    _started = _process_started()
    code = main()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with suppress(Exception):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


def _main(argv: Sequence[str] | None) -> int:
    commands = {
        "plan": _cmd_plan,
        "pack": _cmd_pack,
        "rebuild": _cmd_rebuild,
        "verify": _cmd_verify,
        "inspect": _cmd_inspect,
        "convert": _cmd_convert,
        "report": _cmd_report,
        "cache": _cmd_cache,
        "demo": _cmd_demo,
    }
    started = _started if _started is not None else time.time()
    argv = list(sys.argv[1:] if argv is None else argv)
    local: Runner | None = None
    try:
        local = _early_local(argv)
        args = _build_parser().parse_args(argv)
        args.started, args.local = started, local
        return commands[args.command](args)
    except ConfigError as e:
        print(f"raypack: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except JobError as e:
        print(f"raypack: job failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(_interrupted(argv), file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of the output left (`raypack plan --json | head -1`): it has what it wanted.
        # Nothing to say, as any tool killed by SIGPIPE; stdout goes nowhere now, so that the
        # interpreter's last flush does not fail on it again.
        with suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as e:
        # Storage that failed after its retries and Ray's, in any command; anything else is a bug and
        # keeps its traceback.
        cause = storage_cause(e)
        if cause is None:
            raise
        print(f"raypack: storage error: {cause}", file=sys.stderr)
        return 1
    finally:
        if local is not None:  # (the job closes it when it runs; this is for one that did not)
            local.close(release=False, failed=True)


# The commands that run a job: a local runner is started for them before anything else is imported
# (engine.start_local), so that its zygote's imports run beside this process's.
_JOB_COMMANDS = ("pack", "rebuild", "demo")


def _early_local(argv: list[str]) -> Runner | None:
    if not argv or argv[0] not in _JOB_COMMANDS or {"-h", "--help"} & set(argv):
        return None
    from raypack.engine import start_local

    return start_local()


if __name__ == "__main__":
    run()
