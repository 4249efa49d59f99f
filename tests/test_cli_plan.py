"""`raypack plan`: the dry run a user runs before spending cluster time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raypack.cli import main
from raypack.dryrun import JSON_KEYS, SAMPLE_JSON_KEYS
from raypack.packing import ALGORITHMS
from tests.conftest import job_config, make_corpus, write_jsonl


@pytest.fixture
def lengths_files(tmp_path: Path) -> dict[str, Path]:
    lengths = [20, 5, 3, 6, 7, 1, 30]
    npy = tmp_path / "l.npy"
    np.save(npy, np.array(lengths))
    txt = tmp_path / "l.txt"
    txt.write_text("# lengths\n" + "\n".join(map(str, lengths)) + "\n")
    parquet = tmp_path / "l.parquet"
    pq.write_table(pa.table({"length": lengths, "other": ["x"] * len(lengths)}), parquet)
    directory = tmp_path / "index"  # as a dataset's index/: a file per shard, one of them empty
    directory.mkdir()
    pq.write_table(pa.table({"length": lengths[:3]}), directory / "shard-000000.parquet")
    pq.write_table(pa.table({"length": pa.array([], pa.int64())}), directory / "shard-000001.parquet")
    pq.write_table(pa.table({"length": lengths[3:]}), directory / "shard-000002.parquet")
    return {"npy": npy, "txt": txt, "parquet": parquet, "dir": directory}


@pytest.mark.parametrize("kind", ["npy", "txt", "parquet", "dir"])
def test_json_output_for_each_file_type(
    kind: str, lengths_files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--lengths", str(lengths_files[kind]), "--seq-len", "8", "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    record = json.loads(line)
    assert tuple(record) == JSON_KEYS
    assert record["algorithm"] == "bfd" and record["seq_len"] == 8
    assert record["documents"] == 7
    assert record["items"] == 7 + 2 + 3  # 20 → 3 items, 30 → 4 items
    assert record["lower_bound"] == 9  # ceil(72 / 8)
    assert record["tokens_dropped"] == 0


def test_sweep_prints_one_row_per_algorithm_and_seq_len(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--sample", "2000", "--seq-len", "512", "2048", "--algorithm", "all"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[3:]]
    assert [(r[0], r[1]) for r in rows] == [(a, s) for s in ("512", "2048") for a in ALGORITHMS]
    bfd_512 = next(r for r in rows if r[:2] == ["bfd", "512"])
    assert float(bfd_512[5].rstrip("%")) > 99.0


def test_all_leaves_decompose_out_where_seq_len_is_no_power_of_two(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = [
        "plan",
        "--sample",
        "500",
        "--seq-len",
        "1000",
        "1024",
        "--algorithm",
        "all",
        "--set",
        "min_seq_len=16",
    ]
    assert main(args) == 0
    table = [line.split() for line in capsys.readouterr().out.splitlines()[3:]]
    rows = [cells[:2] for cells in table]
    assert ["decompose", "1024"] in rows and ["decompose", "1000"] not in rows
    assert len(rows) == 2 * len(ALGORITHMS) - 1
    # lower_bound and packs/LB: packs of seq_len, not of several lengths (bucket, decompose).
    bounds = {(cells[0], cells[1]): cells[3:5] for cells in table}
    assert bounds["decompose", "1024"] == ["-", "-"] and "-" not in bounds["bfd", "1024"]
    named = ["plan", "--sample", "50", "--seq-len", "1000", "--algorithm", "decompose"]
    assert main(named) == 2  # named, it is refused
    assert "must be a power of two for decompose" in capsys.readouterr().err


def test_settings_reach_the_packer(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "--sample", "500", "--seq-len", "512", "--json", "--algorithm", "lpfhp,nnlshp"]
    assert main([*args, "--set", "pack.max_depth=2", "--set", "overflow=truncate"]) == 0
    capped, nnls = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert capped["packing_factor"] <= 2.0
    assert capped["tokens_dropped"] > 0 and nnls["tokens_dropped"] == capped["tokens_dropped"]


def test_pad_multiple_reaches_the_packer_and_all_leaves_concat_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--sample", "2000", "--seq-len", "512", "--json", "--algorithm"]
    assert main([*args, "bfd"]) == 0
    (plain,) = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert main([*args, "all", "--set", "pad_multiple=16"]) == 0
    runs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["algorithm"] for r in runs] == [a for a in ALGORITHMS if a not in ("concat", "decompose")]
    aligned = next(r for r in runs if r["algorithm"] == "bfd")
    # The same tokens in more packs: about 7.5 positions of padding an item.
    assert aligned["lower_bound"] == plain["lower_bound"] and aligned["packs"] > plain["packs"]
    assert aligned["efficiency"] < plain["efficiency"] - 0.005


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lengths", "/nonexistent.npy", "--seq-len", "8"], "lengths file not found"),
        (["--sample", "10", "--seq-len", "500", "--set", "pad_multiple=16"], "use seq_len 496 or 512"),
        (
            ["--sample", "10", "--seq-len", "512", "--algorithm", "concat", "--set", "pad_multiple=16"],
            "concat cuts one stream",
        ),
        (["--lengths", "{bad_txt}", "--seq-len", "8"], "line 2: 'abc' is not an integer"),
        (["--lengths", "{neg}", "--seq-len", "8"], "document 1 has length -4"),
        (["--lengths", "{csv}", "--seq-len", "8"], "unsupported lengths file type"),
        (["--lengths", "{noparquet}", "--seq-len", "8"], "not a readable Parquet file"),
        (["--lengths", "{nocol}", "--seq-len", "8"], "no 'length' column"),
        (["--sample", "10", "--seq-len", "0"], "--seq-len must be >= 1"),
        (["--sample", "10", "--seq-len", "8", "--algorithm", "magic"], "unknown algorithm 'magic'"),
        (["--sample", "10", "--seq-len", "8", "--set", "max_depth=0"], "max_depth must be >= 1"),
        (["--sample", "10", "--seq-len", "8", "--set", "depth=3"], "--set depth: no such setting"),
        # Each setting's type is checked as a job's config checks it, whichever packer takes it.
        (["--sample", "10", "--seq-len", "8", "--set", "max_depth=1.5"], "max_depth must be an integer"),
        (["--sample", "10", "--seq-len", "8", "--set", "max_depth=abc"], "max_depth must be an integer"),
        (["--sample", "10", "--seq-len", "8", "--set", "padding_threshold=x"], "must be a number"),
        (["--sample", "10", "--seq-len", "8", "--set", "bucket_lengths=5"], "must be a list"),
        # A job's own settings say nothing of a plan of lengths.
        (["--sample", "10", "--seq-len", "8", "--set", "compare=all"], "--set compare: a job's setting"),
        (["--sample", "10", "--seq-len", "8", "--set", "seed=3"], "--set seed: a job's setting"),
        (["--sample", "10", "--seq-len", "8", "--set", "seq_len=4"], "give it as --seq-len"),
        (["--sample", "10", "--seq-len", "8", "--set", "input.x=4"], "a plan takes pack settings only"),
        (["--sample", "10", "--seq-len", "x"], "invalid int value"),
        (["--seq-len", "8"], "needs lengths: --config CONFIG, --lengths PATH or --sample N"),
        (["--sample", "10"], "needs --seq-len"),
        (["job.yaml", "--seq-len", "8"], "raypack plan takes a job config as --config job.yaml"),
        # What an interrupted job leaves (part of index/, no manifest) is no dataset to plan on.
        (["--lengths", "{partial}", "--seq-len", "8"], "is not a complete dataset: no manifest.json"),
        # One line, no loadtxt warning before it.
        (["--lengths", "{blank_txt}", "--seq-len", "8"], "no lengths in file"),
        # A report that cannot be written is found before the work, not after it.
        (["--sample", "10", "--seq-len", "8", "--report", "{bad_txt}"], "cannot write a report there"),
        (["--lengths", "{empty_dir}", "--seq-len", "8"], "no .parquet files with a 'length' column"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {
        "bad_txt": tmp_path / "bad.txt",
        "neg": tmp_path / "neg.npy",
        "csv": tmp_path / "l.csv",
        "noparquet": tmp_path / "broken.parquet",
        "nocol": tmp_path / "nocol.parquet",
        "empty_dir": tmp_path / "empty",
        "partial": tmp_path / "partial",
        "blank_txt": tmp_path / "blank.txt",
    }
    files["empty_dir"].mkdir()
    (files["partial"] / "index").mkdir(parents=True)
    pq.write_table(pa.table({"length": [5, 7]}), files["partial"] / "index" / "shard-000000.parquet")
    files["blank_txt"].write_text("")
    files["bad_txt"].write_text("3\nabc\n")
    np.save(files["neg"], np.array([3, -4]))
    files["csv"].write_text("3\n")
    files["noparquet"].write_text("not parquet")
    pq.write_table(pa.table({"len": [1, 2]}), files["nocol"])
    args = [a.format(**{k: str(v) for k, v in files.items()}) for a in args]
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raypack: error: ") and message in err
    assert "\n" not in err and "Traceback" not in err


def test_console_script_exits_2_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "raypack.cli",
            "plan",
            "--lengths",
            str(tmp_path / "missing.txt"),
            "--seq-len",
            "8",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"raypack: error: lengths file not found: {tmp_path / 'missing.txt'}"
    assert proc.stdout == ""


def test_console_script_output_and_exit_handlers_survive_its_fast_exit(tmp_path: Path) -> None:
    """The console script ends without the interpreter's teardown (os._exit): what it printed into a
    pipe (block-buffered) is all there, and atexit's handlers (a temporary directory's clean-up
    among them) still run."""
    lengths = tmp_path / "l.txt"
    lengths.write_text("\n".join(str(n) for n in range(1, 3000)) + "\n")
    marker = tmp_path / "atexit-ran"
    script = (
        "import atexit, pathlib, sys, tempfile\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "kept = tempfile.TemporaryDirectory(dir=sys.argv[1])\n"
        "sys.argv[1:] = ['plan', '--lengths', sys.argv[2], '--seq-len', '64', '128', '--json']\n"
        "from raypack.cli import run\n"
        "run()\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path), str(lengths)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["seq_len"] for r in records] == [64, 128] and records[0]["documents"] == 2999
    assert marker.read_text() == "yes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit-ran", "l.txt"]  # the directory went


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads /proc")
def test_ctrl_c_ends_a_long_plan_at_once_and_leaves_no_process() -> None:
    """nnlshp at 512 classes on 200,000 lengths plans for ~45 s, in scipy's NNLS, which holds the
    GIL: a plan in the command's own process heard Ctrl-C only when it returned (24 s measured,
    past the interrupt watchdog's 10 s, which needs the GIL too). The command waits on a child
    that does the work, and kills it."""
    import signal
    import time

    command = [sys.executable, "-m", "raypack.cli", "plan", "--sample", "200000", "--seq-len", "8192"]
    command += ["--algorithm", "nnlshp", "--set", "nnls_bin_width=16"]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(4.0)  # imports, the sample, and well into the plan
        assert proc.poll() is None
        children = _children(proc.pid)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        waited = time.monotonic() - t0
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.strip() == "raypack: interrupted"  # (a plan writes no dataset)
    assert waited < 5.0, f"Ctrl-C took {waited:.1f} s"
    assert children, "no process of the plan's own"
    for child in children:
        assert not Path(f"/proc/{child}").exists(), f"the plan's process {child} is left"


# --- raypack plan --config: a sample of a job's corpus, tokenized as the job would ---------------

quiet = {"log": lambda _: None}


def _bad_records(corpus: Path) -> None:
    """Records the job rejects, each for another reason, in a file of their own."""
    write_jsonl(
        corpus / "part-bad.jsonl",
        [
            {"text": ""},
            {"body": "no text field"},
            b"{not json",
            {"text": "   "},
            {"text": 7},
            {"text": "a plan"},
        ],
    )


@pytest.fixture
def plain_job(tmp_path: Path, tokenizer_path: Path) -> Path:
    """A corpus in jsonl, jsonl.gz and jsonl.zst with records the job rejects, and its job's
    config: BOS and EOS around each document."""
    corpus = make_corpus(tmp_path, shards=6, docs_per_shard=40, seed=3)
    _bad_records(corpus)
    return job_config(
        tmp_path,
        f"{corpus}/*",
        tokenizer_path,
        input={"max_reject_ratio": 0.5},
        tokenizer={"add_bos": True, "bos_id": 1},
    )


@pytest.fixture
def split_job(tmp_path: Path, tokenizer_path: Path) -> Path:
    """Large files, as the job cuts them into units (input.unit_bytes): a JSONL file by byte ranges
    (its documents named by an id field: a unit's line numbers are not known to a sample), a
    Parquet file by runs of row groups."""
    import random

    from tests.conftest import random_text

    rng = random.Random(5)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [random_text(rng, int(rng.lognormvariate(4.0, 1.0)) + 1) for _ in range(300)]
    write_jsonl(corpus / "a.jsonl", [{"id": f"a{i}", "text": t} for i, t in enumerate(texts[:150])])
    table = pa.table({"id": [f"b{i}" for i in range(150)], "text": texts[150:]})
    pq.write_table(table, corpus / "b.parquet", row_group_size=10)
    sources = [
        {"name": "a", "paths": [str(corpus / "a.jsonl")], "format": "jsonl"},
        {"name": "b", "paths": [str(corpus / "b.parquet")], "format": "parquet"},
    ]
    split = {"paths": [], "sources": sources, "id_field": "id", "unit_bytes": 8192}
    return job_config(tmp_path, f"{corpus}/*", tokenizer_path, input=split)


@pytest.fixture
def chat_job(tmp_path: Path) -> Path:
    """Conversations (some of them records the job rejects: not a list, no messages, no role, no
    assistant turn) through a model directory's ChatML template."""
    import random

    from tests.chatdata import chat_model, conversation

    model = chat_model(tmp_path / "model")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rng = random.Random(4)
    bad = [
        {"messages": "not a list"},
        {"text": "no messages field"},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": "a question nobody answers"}]},
    ]
    write_jsonl(corpus / "a.jsonl", [{"messages": conversation(rng, i)} for i in range(70)] + bad)
    write_jsonl(corpus / "b.jsonl.gz", [{"messages": conversation(rng, i)} for i in range(70)], "gzip")
    return job_config(
        tmp_path,
        f"{corpus}/*",
        model,
        input={"messages_field": "messages", "max_reject_ratio": 0.5},
        pack={"seq_len": 256, "overflow": "truncate"},
    )


@pytest.fixture
def long_job(tmp_path: Path, tokenizer_path: Path) -> Path:
    """Texts over 1 MiB of characters among short ones: the job encodes them in pieces, cut where
    its rule proven for the tokenizer allows (raypack.text.cuts), and so must a sample."""
    import random

    from tests.conftest import random_text

    corpus = make_corpus(tmp_path, shards=3, docs_per_shard=30, seed=5)
    rng = random.Random(6)
    write_jsonl(corpus / "long.jsonl", [{"text": random_text(rng, 200_000)} for _ in range(2)])
    return job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"seq_len": 512, "overflow": "split"})


def _packed(config: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Each document's length in the dataset the job writes (its index), and its rejects by kind."""
    import raypack
    from raypack.corpus.readers.records import reason_counts

    raypack.pack(str(config), **quiet)
    out = config.parent / "out"
    index = pq.read_table(out / "index", columns=["doc_id", "length"]).to_pylist()
    rejects = pq.read_table(out / "rejects").to_pylist() if (out / "rejects").is_dir() else []
    # The records rejected: not pack.overflow's rejects, which stand for no record (the packing's).
    reasons = [r["reason"] for r in rejects if r["records"]]
    return {r["doc_id"]: r["length"] for r in index}, reason_counts(reasons)


@pytest.mark.parametrize("kind", ["plain", "split", "chat", "long"])
def test_a_corpus_sample_has_the_lengths_the_job_packs(kind: str, request: pytest.FixtureRequest) -> None:
    """Each sampled document's length is its length in the job's dataset (BOS/EOS, the chat
    template, the backend as the job's); read whole, the sample is the job's documents and rejects."""
    from raypack.config import load_config
    from raypack.plan_sample import corpus_lengths

    config: Path = request.getfixturevalue(f"{kind}_job")
    index, rejects = _packed(config)
    cfg = load_config(config)
    part = corpus_lengths(cfg, documents=50, seed=7)
    assert 0 < len(part.lengths) <= 50 < len(index)
    assert not part.drawn.whole and None not in part.ids
    assert [index[i] for i in part.ids] == part.lengths.tolist()
    assert len(part.drawn.files_read) > 1
    whole = corpus_lengths(cfg, documents=100_000)
    assert whole.drawn.whole and whole.drawn.scale == 1.0
    assert dict(zip(whole.ids, whole.lengths.tolist(), strict=True)) == index
    assert whole.reasons == rejects and whole.rejected == sum(rejects.values())
    assert whole.backend.startswith("fastokens")  # (installed: the job's choice too)


def test_a_sample_is_spread_over_the_corpus_and_seeded(plain_job: Path) -> None:
    from raypack.config import load_config
    from raypack.plan_sample import corpus_lengths

    cfg = load_config(plain_job)
    first, again, other = (corpus_lengths(cfg, documents=96, seed=s) for s in (1, 1, 2))
    assert first.ids == again.ids and first.lengths.tolist() == again.lengths.tolist()
    assert first.ids != other.ids
    files = {i.rsplit(":", 1)[0] for i in first.ids if i is not None}
    assert len(files) == len(first.drawn.files_read) >= 3  # 3 places, in 3 of the 8 files
    # Scaled by the bytes behind what it read (of a compressed file: the bytes that decompress to
    # them), a sample estimates the corpus's documents and tokens: roughly, from 3 runs of 32 of a
    # heavy tail (lognormal sigma 1.2), in files of one zstd block (what it read is placed by
    # interpolation within a block).
    whole = corpus_lengths(cfg, documents=100_000)
    scale = first.drawn.scale
    assert scale is not None and not first.drawn.unknown
    assert 0.5 < len(first.lengths) * scale / len(whole.lengths) < 2.0
    assert 0.4 < first.lengths.sum() * scale / whole.lengths.sum() < 2.5


def test_plan_from_a_config_prints_the_sample_and_the_sweep(
    plain_job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "--config", str(plain_job), "--documents", "10000", "--algorithm", "bfd,lpfhp"]
    assert main(args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"sample of {plain_job}'s input: ")
    assert " from 7 of 7 files " in out[0]
    assert out[1].startswith("tokenized as the job would, by fastokens")
    assert out[2] == (
        "rejected as the job would: 5 records: empty document (1); malformed JSON (1); missing text "
        "field 'text' (1); text field 'text' is int, not a string (1); whitespace-only document (1)"
    )
    assert out[3] == "the whole corpus was read: the counts below are the corpus's"
    rows = [line.split() for line in out[7:]]
    assert [(r[0], r[1]) for r in rows] == [("bfd", "512"), ("lpfhp", "512")]  # pack.seq_len


def test_plan_from_a_config_json_and_report(
    plain_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json: a run a line, the sample's scale and packs so scaled after the usual keys; what the
    sample is goes to stderr. The same seed gives the same runs."""
    args = ["plan", "--config", str(plain_job), "--documents", "40", "--seq-len", "128", "512", "--json"]
    runs = []
    for _ in range(2):
        assert main([*args, "--report", str(tmp_path / "page")]) == 0
        captured = capsys.readouterr()
        assert captured.err.startswith(f"sample of {plain_job}'s input: 40 documents ")
        records = [json.loads(line) for line in captured.out.splitlines()]
        assert [tuple(r) for r in records] == [(*JSON_KEYS, *SAMPLE_JSON_KEYS)] * 2
        runs.append([{k: v for k, v in r.items() if k != "seconds"} for r in records])
    assert runs[0] == runs[1]
    assert [r["seq_len"] for r in runs[0]] == [128, 512] and runs[0][0]["documents"] == 40
    scale = runs[0][0]["scale"]
    assert scale is None or runs[0][0]["corpus_packs"] == round(runs[0][0]["packs"] * scale)
    page = (tmp_path / "page" / "report.html").read_text()
    assert f"a sample of {plain_job}&#x27;s input, seed 0" in page and "tokenized as the job would" in page


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--documents", "0"], "--documents must be >= 1, got 0"),
        (["--documents", "x"], "argument --documents: invalid int value"),
        (
            ["--set", "input.paths=[/nonexistent/*.jsonl]"],
            "input.paths matched no files: /nonexistent/*.jsonl",
        ),
        (
            ["--set", "tokenizer.path=/nonexistent/tok.json"],
            "tokenizer file not found: /nonexistent/tok.json",
        ),
        (["--set", "input.text_field=nothing"], "holds no document to pack: "),
        (["--set", "inpt.paths=[x]"], "unknown key inpt"),
        (["--sample", "10"], "argument --sample: not allowed with argument --config"),
        (["--set", "max_depth=0"], "max_depth must be >= 1"),
    ],
)
def test_bad_config_plans_are_one_line_and_exit_2(
    args: list[str], message: str, plain_job: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--config", str(plain_job), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raypack: error: ") and message in err, err
    assert "\n" not in err and "Traceback" not in err


def test_documents_without_a_config_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--sample", "10", "--seq-len", "8", "--documents", "5"]) == 2
    assert "--documents is the size of a job corpus's sample" in capsys.readouterr().err


def test_a_sample_it_cannot_place_in_a_compressed_file_is_not_scaled(
    plain_job: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the bytes behind a part of a compressed file are not known, the counts are the
    sample's, said so, and --json's scale and corpus_packs are null."""
    from raypack.corpus import sample

    monkeypatch.setattr(sample, "_compressed_bytes", lambda *_: None)
    args = ["plan", "--config", str(plain_job), "--documents", "96", "--seed", "1"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "not scaled to the corpus: 1 compressed file read in part could not be" in out
    assert "corpus_packs" not in out
    assert main([*args, "--json"]) == 0
    (record,) = (json.loads(line) for line in capsys.readouterr().out.splitlines())
    assert record["scale"] is None and record["corpus_packs"] is None


def test_a_sample_on_s3_is_the_sample_on_local_disk(tmp_path: Path, tokenizer_path: Path, s3) -> None:
    """The same documents, lengths and scale from object storage (a compressed file read in part
    decompressed again there too)."""
    from raypack.config import load_config
    from raypack.plan_sample import corpus_lengths
    from tests.conftest import s3_job_config

    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=40, seed=2)
    (tmp_path / "local").mkdir()
    (tmp_path / "remote").mkdir()
    local = load_config(job_config(tmp_path / "local", f"{corpus}/*", tokenizer_path))
    remote = load_config(s3_job_config(tmp_path / "remote", s3, corpus, tokenizer_path, "plan-sample"))
    here, there = (corpus_lengths(cfg, documents=64, seed=3) for cfg in (local, remote))
    assert there.lengths.tolist() == here.lengths.tolist() and there.ids == here.ids
    assert there.drawn.scale == here.drawn.scale and here.drawn.scale is not None
    assert not here.drawn.whole


def test_plan_says_when_the_job_would_fail_on_its_rejects(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A corpus the job would refuse (a Parquet file read as JSONL: most records unreadable) is said
    to fail, not planned as if it would pack."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": "a few words"}] * 3 + [b"{broken"] * 7)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["plan", "--config", str(cfg), "--seq-len", "64"]) == 0
    said = capsys.readouterr().out
    assert (
        "warning: the job would fail: 70.00% of the records rejected, over input.max_reject_ratio (1.00%)"
        in said
    )
    assert main(["pack", str(cfg)]) == 1  # as it does
