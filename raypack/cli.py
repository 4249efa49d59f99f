"""The `raypack` command. Subcommands parse a few arguments and hand over; user mistakes end in one
line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import NoReturn

from raypack import __version__
from raypack.config import ConfigError, parse_override
from raypack.packing import ALGORITHMS

__all__ = ["main"]

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="raypack", description="Pack tokenized corpora into fixed-length training sequences."
    )
    parser.add_argument("--version", action="version", version=f"raypack {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    plan = sub.add_parser(
        "plan",
        help="dry run: pack a list of document lengths and compare algorithms and seq_lens",
        description="Pack document lengths (no data) and print packs, efficiency and ratios per "
        "algorithm and seq_len.",
    )
    source = plan.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths", metavar="FILE", help=".npy, .txt (one length a line) or .parquet (length column)"
    )
    source.add_argument(
        "--sample",
        metavar="N",
        type=int,
        help="use N built-in lognormal(6.0, 1.2) lengths (seeded) instead of a file",
    )
    plan.add_argument(
        "--seq-len", metavar="N", type=int, nargs="+", required=True, help="one or more pack lengths"
    )
    plan.add_argument(
        "--algorithm",
        default="bfd",
        help=f"one of {', '.join(ALGORITHMS)}, a comma-separated list, or 'all' (default: bfd)",
    )
    plan.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        dest="overrides",
        help="a pack setting, e.g. overflow=truncate, max_depth=3, bucket_lengths=[1024,2048], "
        "padding_threshold=0.05, nnls_bin_width=16 (repeatable)",
    )
    plan.add_argument("--seed", type=int, default=0, help="seed of the built-in sample (default 0)")
    plan.add_argument("--json", action="store_true", help="one JSON object per run instead of a table")
    return parser


def _cmd_plan(args: argparse.Namespace) -> int:
    from raypack import dryrun

    if args.algorithm == "all":
        algorithms = list(ALGORITHMS)
    else:
        algorithms = [a.strip() for a in args.algorithm.split(",") if a.strip()]
        for name in algorithms:
            if name not in ALGORITHMS:
                raise ConfigError(f"unknown algorithm {name!r}; choose from {', '.join(ALGORITHMS)} or all")
    for n in args.seq_len:
        if n < 1:
            raise ConfigError(f"--seq-len must be >= 1, got {n}")
    settings = {}
    for text in args.overrides:
        path, value = parse_override(text)
        if len(path) != 1:
            raise ConfigError(f"--set {text!r}: plan settings are flat keys (pack.* without the prefix)")
        settings[path[0]] = value
    lengths = (
        dryrun.sample_lengths(args.sample, args.seed)
        if args.sample is not None
        else dryrun.load_lengths(args.lengths)
    )
    results = dryrun.run_sweep(lengths, args.seq_len, algorithms, settings)
    if args.json:
        for metrics, seconds in results:
            print(json.dumps(dryrun.json_record(metrics, seconds)))
    else:
        print(f"{len(lengths)} documents, {int(lengths.sum())} tokens")
        print(dryrun.format_table(results))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        return {"plan": _cmd_plan}[args.command](args)
    except ConfigError as e:
        print(f"raypack: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("raypack: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
