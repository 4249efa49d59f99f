"""`raypack plan`: pack a list of document lengths without any data, to choose seq_len and algorithm.

A sweep over algorithms × seq_lens runs in seconds on millions of lengths, against hours of cluster time
for a real packing job, and tells a user what each choice costs in padding, cut documents and packs.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raypack.config import ALGORITHM_OPTION_FIELDS, PackConfig, typed_fields
from raypack.errors import ConfigError
from raypack.packing import ALGORITHMS, decompose, pack
from raypack.packing.items import check_lengths
from raypack.report.model import Run, run_of

__all__ = [
    "JSON_KEYS",
    "PLAN_SETTINGS",
    "SAMPLE_JSON_KEYS",
    "format_table",
    "json_record",
    "load_lengths",
    "plan_settings",
    "run_sweep",
    "sample_lengths",
]

# The pack settings a plan of lengths reads (--set); the others (seed, shuffle, mode, compare, loss,
# ...) place, order or compare a job's packs and change nothing a plan measures.
PLAN_SETTINGS = ("overflow", "pad_multiple", *ALGORITHM_OPTION_FIELDS)

JSON_KEYS = (
    "algorithm",
    "seq_len",
    "documents",
    "items",
    "packs",
    "lower_bound",
    "efficiency",
    "padding_ratio",
    "truncation_ratio",
    "concatenation_ratio",
    "packing_factor",
    "max_depth",
    "tokens_dropped",
    "seconds",
)
# With a corpus sample (raypack.plan_sample), after JSON_KEYS: what a count of the sample is multiplied
# by to estimate the corpus's (1: the sample is the corpus; null: not known), and the packs so estimated.
SAMPLE_JSON_KEYS = ("scale", "corpus_packs")


def sample_lengths(n: int, seed: int = 0) -> np.ndarray:
    """The built-in sample: lognormal(6.0, 1.2) token lengths, at least 1 (median ~400, mean ~830,
    ~9% over 2048): a heavy tail like web text, and the distribution the benchmarks use."""
    if n < 1:
        raise ConfigError(f"--sample must be >= 1, got {n}")
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(6.0, 1.2, n)).astype(np.int64)


def load_lengths(path: str | Path) -> np.ndarray:
    """Lengths from .npy, .txt (one per line), .parquet (a `length` column), a directory of such
    Parquet files, or a raypack dataset (its index/: every document's tokens, BOS/EOS included; a
    rebuild's root: its LATEST version). ConfigError if bad."""
    p = Path(path)
    if p.is_dir():
        return _load_directory(p)
    if not p.is_file():
        raise ConfigError(f"lengths file not found: {p}")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            raw = np.load(p, allow_pickle=False)  # never unpickle user files
        elif suffix == ".txt":
            raw = _load_txt(p)
        elif suffix == ".parquet":
            raw = _load_parquet(p)
        else:
            raise ConfigError(f"{p}: unsupported lengths file type {suffix!r} (use .npy, .txt or .parquet)")
        lengths = check_lengths(raw)
    except ConfigError:
        raise
    except (ValueError, OSError) as e:
        raise ConfigError(f"{p}: {e}") from None
    if not len(lengths):
        raise ConfigError(f"{p}: no lengths in file")
    return lengths


def _load_directory(p: Path) -> np.ndarray:
    from raypack.dataset.layout import resolve_dataset

    dataset = Path(resolve_dataset(str(p)))
    if (dataset / "index").is_dir() and not (dataset / "manifest.json").is_file():
        raise ConfigError(
            f"{p} is not a complete dataset: no manifest.json (a job stopped before its commit "
            "leaves part of its index/); rerun the job, or give a finished one"
        )
    where = dataset / "index" if (dataset / "index").is_dir() else dataset
    files = sorted(where.glob("*.parquet"))
    if not files:
        raise ConfigError(f"{p}: no .parquet files with a 'length' column (nor a raypack dataset's index/)")
    try:  # one file per input shard: a shard whose records were all rejected has an empty one
        lengths = check_lengths(np.concatenate([_load_parquet(f) for f in files]))
    except (ValueError, OSError) as e:
        raise ConfigError(f"{p}: {e}") from None
    if not len(lengths):
        raise ConfigError(f"{p}: no lengths in its Parquet files")
    return lengths


def _load_txt(p: Path) -> np.ndarray:
    try:
        with warnings.catch_warnings():  # an empty file: "no lengths in file" says it, once
            warnings.simplefilter("ignore", UserWarning)
            return np.loadtxt(p, dtype=np.int64, ndmin=1, comments="#")
    except ValueError:
        pass
    # Slow path only to name the first bad line.
    with p.open() as f:
        for lineno, line in enumerate(f, 1):
            text = line.split("#", 1)[0].strip()
            if not text:
                continue
            try:
                int(text)
            except ValueError:
                raise ConfigError(f"{p}, line {lineno}: {text[:40]!r} is not an integer length") from None
    raise ConfigError(f"{p}: could not read lengths")


def _load_parquet(p: Path) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(p)
    except pa.ArrowInvalid as e:
        raise ConfigError(f"{p}: not a readable Parquet file ({e})") from None
    if "length" not in schema.names:
        raise ConfigError(f"{p}: no 'length' column (columns: {', '.join(schema.names)})")
    table = pq.read_table(p, columns=["length", "copy"] if "copy" in schema.names else ["length"])
    if "copy" in table.column_names:  # a mixture's index: the documents packed, each copy once
        table = table.filter(pa.compute.greater_equal(table.column("copy"), 0))
    column = table.column("length")
    if column.null_count:
        raise ConfigError(f"{p}: the 'length' column has {column.null_count} null values")
    if not (pa.types.is_integer(column.type) or pa.types.is_floating(column.type)):
        raise ConfigError(f"{p}: the 'length' column is {column.type}, not a number")
    return column.to_numpy()


WARM_SEQ_LEN = 64


def run_sweep(
    lengths: np.ndarray,
    seq_lens: Sequence[int],
    algorithms: Iterable[str],
    settings: dict[str, Any] | None = None,
) -> list[Run]:
    """Pack with every (algorithm, seq_len); returns metrics, pack fill and seconds spent packing.
    ["all"]: every packer of ALGORITHMS that plans at the seq_len (decompose at a power of two) with
    these settings (with a pad_multiple, those that align: not concat or decompose)."""
    settings = plan_settings(settings or {})
    results = []
    for seq_len in seq_lens:
        for name in _every(algorithms, seq_len, settings.get("pad_multiple", 1)):
            cfg = _config_for(name, seq_len, settings)
            options = cfg.algorithm_options()
            # Load the numba loops on a few lengths first, so `seconds` is packing time alone; at a
            # small seq_len and each packer's own bucket lengths and bin width: nnlshp's NNLS costs
            # what its classes cost, whatever the lengths (47 s of it at 512 classes, paid twice).
            warm = {k: v for k, v in options.items() if k not in ("bucket_lengths", "bin_width")}
            pack(lengths[:64], WARM_SEQ_LEN, name, overflow=cfg.overflow, **warm)
            t0 = time.perf_counter()
            assignment = pack(
                lengths, seq_len, name, overflow=cfg.overflow, pad_multiple=cfg.pad_multiple, **options
            )
            seconds = time.perf_counter() - t0
            results.append(run_of(assignment, seconds))
    return results


def _every(algorithms: Iterable[str], seq_len: int, pad_multiple: int) -> list[str]:
    """The packers a sweep runs at `seq_len`: as named, or for ["all"] each that plans there and
    aligns its items where `pad_multiple` asks it to."""
    names = list(algorithms)
    if names != ["all"]:
        return names
    return [
        n
        for n in ALGORITHMS
        if (n != "decompose" or decompose.is_power_of_two(seq_len))
        and (pad_multiple == 1 or ALGORITHMS[n].aligns)
    ]


def plan_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` (pack settings by their names in PackConfig, without `pack.`) checked as a job's
    config checks them, each against its type whichever packer takes it (a bad value given for
    nnlshp is an error in a plan of bfd too); ConfigError naming the setting."""
    other = sorted(set(settings) - set(PLAN_SETTINGS))
    if other:
        if other[0] in ("algorithm", "seq_len"):
            what = f"give it as --{other[0].replace('_', '-')}"
        elif other[0] in {f.name for f in dataclasses.fields(PackConfig)}:
            what = "a job's setting (it places, orders or compares the packs a job writes)"
        else:
            what = "no such setting"
        raise ConfigError(f"--set {other[0]}: {what}; a plan takes {', '.join(PLAN_SETTINGS)}")
    return typed_fields(PackConfig, settings, "--set ")


def _config_for(algorithm: str, seq_len: int, settings: dict[str, Any]) -> PackConfig:
    """The pack config for one cell of a sweep: settings that do not apply to a packer are left out
    (a depth cap given for lpfhp does not break the nnlshp column of `--algorithm all`)."""
    values = dict(settings, algorithm=algorithm, seq_len=seq_len)
    accepted = ALGORITHMS[algorithm].options
    for key, option in ALGORITHM_OPTION_FIELDS.items():
        if key in values and option not in accepted:
            values.pop(key)
    return PackConfig(**values)


def format_table(results: Sequence[Run], scale: float | None = None) -> str:
    """A row a run; with `scale` (a sample's, not 1), a last column of its packs so scaled."""
    header: tuple[str, ...] = (
        "algorithm",
        "seq_len",
        "packs",
        "lower_bound",
        "packs/LB",
        "efficiency",
        "padding",
        "truncation",
        "concat",
        "pack_factor",
        "max_depth",
        "dropped_tok",
        "seconds",
    )
    scaled = scale is not None and scale != 1.0
    if scaled:
        header += ("corpus_packs",)
    rows: list[tuple[str, ...]] = [header]
    for r in results:
        m = r.metrics
        rows.append(
            (
                m.algorithm,
                str(m.seq_len),
                str(m.packs),
                # Packs of several lengths (bucket, decompose): a bound in packs of seq_len says nothing.
                "-" if m.lengths_vary else str(m.lower_bound),
                "-" if m.lengths_vary else f"{m.packs_over_lower_bound:.5f}",
                f"{100 * m.efficiency:.4f}%",
                f"{m.padding_ratio:.5f}",
                f"{m.truncation_ratio:.4f}",
                f"{m.concatenation_ratio:.2f}",
                f"{m.packing_factor:.2f}",
                str(m.max_depth),
                str(m.tokens_dropped),
                f"{r.seconds or 0.0:.3f}",
            )
            + ((f"~{_rounded(m.packs * (scale or 1.0))}",) if scaled else ())
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        # Algorithm name left-aligned, numbers right-aligned.
        pairs = list(zip(cells, widths, strict=True))
        return "  ".join([pairs[0][0].ljust(pairs[0][1])] + [c.rjust(w) for c, w in pairs[1:]])

    lines = [line(r) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def json_record(r: Run, sample: bool = False, scale: float | None = None) -> dict[str, Any]:
    """The run's JSON_KEYS; of a corpus sample's lengths (`sample`), SAMPLE_JSON_KEYS too."""
    d = r.metrics.to_dict()
    d["seconds"] = round(r.seconds or 0.0, 6)
    record = {k: d[k] for k in JSON_KEYS}
    if sample:
        record["scale"] = scale
        record["corpus_packs"] = None if scale is None else round(r.metrics.packs * scale)
    return record


def _rounded(n: float) -> str:
    """An estimate to three significant figures: 41,200 rather than 41,187."""
    digits = max(0, len(str(round(n))) - 3)
    return f"{round(n, -digits):,.0f}"
