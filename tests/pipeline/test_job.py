"""The job end to end on real local Ray, real tokenizers and files on disk."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from raypack.cli import main
from raypack.config import load_config
from raypack.dryrun import load_lengths
from raypack.errors import ConfigError
from raypack.metrics import fill_percent_counts
from raypack.packing import pack
from raypack.pipeline.job import run_job
from raypack.report.model import length_distribution
from raypack.summary import format_summary
from raypack.verifier import verify
from tests.conftest import independent_tokens, job_config, make_corpus, train_tokenizer, write_jsonl


def quiet(_: str) -> None:
    pass


def read_packs(out: Path) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted((out / "data").rglob("*.parquet")))


def test_every_token_of_every_document_arrives_once(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=40)
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"compare": ["all"]})))
    result = run_job(cfg, log=quiet)
    assert result.documents == 160 and result.rejects == 0

    # Independently of raypack: tokenize the corpus here and rebuild every document from the packs.
    expected = independent_tokens(corpus, tokenizer_path)
    pieces: dict[str, list[tuple[int, list[int]]]] = {}
    packs = read_packs(tmp_path / "out")
    # output.pad_id unset: the tokenizer's own pad token (<|pad|>), never a silent 0.
    pad = Tokenizer.from_file(str(tokenizer_path)).token_to_id("<|pad|>")
    tokenizer = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]
    assert (tokenizer["pad_id"], tokenizer["pad_source"]) == (
        pad,
        "special token <|pad|> (guessed from its name)",
    ) and pad != 0
    for row in packs.to_pylist():
        assert len(row["input_ids"]) == 512
        ends = row["doc_offsets"]
        assert ends[0] == 0 and ends[-1] == row["num_tokens"]
        assert all(t == pad for t in row["input_ids"][row["num_tokens"] :])
        for k, doc_id in enumerate(row["doc_ids"]):
            pieces.setdefault(doc_id, []).append(
                (row["chunk_index"][k], row["input_ids"][ends[k] : ends[k + 1]])
            )
    assert set(pieces) == set(expected)
    for doc_id, parts in pieces.items():
        chunks = sorted(parts)
        assert [c for c, _ in chunks] == list(range(len(chunks)))
        assert [t for _, p in chunks for t in p] == expected[doc_id]
        assert all(len(p) == 512 for _, p in chunks[:-1])  # only documents over seq_len are cut
    assert result.metrics.tokens == sum(len(v) for v in expected.values())
    assert result.metrics.packs == packs.num_rows
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["counts"]["documents"] == 160 and manifest["counts"]["packs"] == packs.num_rows
    assert not (tmp_path / "out" / "_staging").exists()
    report = verify(str(tmp_path / "out"), cfg, sample=20)
    assert report.ok, report.problems
    assert report.sampled == 20

    # The report's distributions, against the packs and the independent tokenization above.
    out = tmp_path / "out"
    doc = json.loads((out / "metrics.json").read_text())
    fill = fill_percent_counts(packs.column("num_tokens").to_numpy(), 512)
    assert doc["pack_fill_percent"] == fill.tolist()
    lengths = doc["document_lengths"]
    got = dict(zip(lengths["bins"], lengths["documents"], strict=True))
    assert got == length_distribution(np.array([len(v) for v in expected.values()]))
    # report.html: written by the job after the manifest; `raypack report` makes the same page.
    assert result.report == str(out / "report.html")
    page = (out / "report.html").read_text()
    assert f"{result.metrics.packs:,}" in page and "No rejects: all 160 input records" in page
    assert main(["report", str(out), "--out", str(tmp_path / "again")]) == 0
    assert (tmp_path / "again" / "report.html").read_text() == page

    # pack.compare: every other histogram packer planned on the job's histogram, as packing the
    # independently tokenized lengths here gives; rows in the report beside the written bfd.
    doc_lengths = np.array([len(v) for v in expected.values()])
    compared = [c["metrics"]["algorithm"] for c in doc["comparison"]]
    assert compared == ["lpfhp", "spfhp", "nnlshp", "bucket"]
    assert [m.algorithm for m in result.comparison] == compared
    assert f"lpfhp {result.comparison[0].packs:,} packs" in format_summary(result)
    for c in doc["comparison"]:
        a = pack(doc_lengths, 512, c["metrics"]["algorithm"])
        assert c["metrics"]["packs"] == a.num_packs and c["metrics"]["tokens"] == result.metrics.tokens
        assert c["pack_fill_percent"] == fill_percent_counts(a.pack_fill(), a.capacities()).tolist()
        assert f"{c['metrics']['algorithm']} (compared)" in page
    # The finished dataset's index feeds a dry run of all eight packers on the same lengths.
    assert np.array_equal(np.sort(load_lengths(out)), np.sort(doc_lengths))


def test_output_is_byte_identical_whatever_the_workers_and_batches(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = make_corpus(tmp_path, shards=5, docs_per_shard=30, seed=3)
    digests = []
    for run, (workers, batch) in enumerate([(1, 512), (2, 7)]):
        cfg = load_config(
            str(job_config(tmp_path, f"{corpus}/*", tokenizer_path)),
            [
                f"tokenizer.concurrency={workers}",
                f"tokenizer.batch_size={batch}",
                f"output.path={tmp_path}/out{run}",
            ],
        )
        run_job(cfg, log=quiet)
        files = sorted((tmp_path / f"out{run}" / "data").rglob("*.parquet"))
        assert len(files) > 1
        digests.append({f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in files})
    assert digests[0] == digests[1]


def test_bucket_writes_one_directory_per_bucket_length(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=50, seed=5)
    cfg = load_config(
        str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"algorithm": "bucket", "seq_len": 512}))
    )
    result = run_job(cfg, log=quiet)
    dirs = sorted(p.name for p in (tmp_path / "out" / "data").iterdir())
    assert dirs and all(d.startswith("bucket=") for d in dirs)
    for d in dirs:
        length = int(d.split("=")[1])
        assert length in (64, 128, 256, 512)
        table = pa.concat_tables(pq.read_table(p) for p in (tmp_path / "out" / "data" / d).iterdir())
        assert {len(x) for x in table.column("input_ids").to_pylist()} == {length}
    assert verify(str(tmp_path / "out")).ok
    assert result.metrics.slots < result.metrics.packs * 512  # smaller buckets were used
    # Fill is a share of each pack's own bucket length.
    fill = sum(
        fill_percent_counts(
            pq.read_table(p).column("num_tokens").to_numpy(), int(p.parent.name[len("bucket=") :])
        )
        for p in (tmp_path / "out" / "data").rglob("*.parquet")
    )
    assert json.loads((tmp_path / "out" / "metrics.json").read_text())["pack_fill_percent"] == fill.tolist()


def test_rejects_are_recorded_and_an_existing_dataset_needs_overwrite(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", [{"text": "fit best"}, b"{oops", {"text": ""}, {"text": "plan bucket"}])
    cfg = load_config(
        str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, input={"max_reject_ratio": 0.5}))
    )
    result = run_job(cfg, log=quiet)
    assert (result.documents, result.rejects) == (2, 2)
    rejects = pq.read_table(tmp_path / "out" / "rejects" / "shard-000000.parquet").to_pylist()
    assert [(r["source"], r["row"]) for r in rejects] == [("a.jsonl", 2), ("a.jsonl", 3)]
    assert rejects[0]["raw"] == "{oops"
    page = (tmp_path / "out" / "report.html").read_text()
    assert "2 of 4 input records (50.000%) were rejected" in page
    for kind in ("malformed JSON", "empty document"):  # counts by kind, then each reject in full
        assert f'<tr><td>{kind}</td><td class="num">1</td></tr>' in page
    for r in rejects:
        assert f"<td>a.jsonl</td><td class='num'>{r['row']}</td><td>{r['reason']}</td>" in page
    with pytest.raises(ConfigError, match="already holds a dataset"):
        run_job(cfg, log=quiet)
    stale = tmp_path / "out" / ".tmp-0123abcd-manifest.json"  # what a run killed mid-commit leaves
    stale.write_text("{}")
    assert run_job(cfg, overwrite=True, log=quiet).documents == 2
    assert not stale.exists()


def test_verify_names_what_is_wrong(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=30, seed=9)
    out = tmp_path / "out"
    run_job(load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path))), log=quiet)
    assert verify(str(out)).ok
    assert verify(str(tmp_path / "nowhere")).problems == [f"{tmp_path / 'nowhere'} does not exist"]
    # Drop one item from a file and fix up the manifest's checksum, as a buggy writer would.
    victim = sorted((out / "data").glob("*.parquet"))[0]
    table = pq.read_table(victim)
    row = table.slice(0, 1).to_pylist()[0]
    lost = row["doc_ids"][-1]
    pq.write_table(table.slice(1), victim)
    manifest = json.loads((out / "manifest.json").read_text())
    for f in manifest["files"]:
        if f["path"].endswith(victim.name):
            data = victim.read_bytes()
            f["bytes"], f["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest))
    report = verify(str(out))
    assert not report.ok
    assert any(repr(lost) in p for p in report.problems), report.problems
    # Tampering without fixing the manifest is caught by the checksum.
    victim.write_bytes(victim.read_bytes()[:-10])
    assert any("sha256" in p for p in verify(str(out)).problems)
    (out / "manifest.json").unlink()
    assert "incomplete" in verify(str(out)).problems[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pack", "/no/such.yaml"], "config file not found"),
        (["pack", "{cfg}", "--set", "pack.seq_len=1"], "pack.seq_len must be >= 2"),
        (["pack", "{cfg}", "--set", "pack.algorithm=greedy"], "needs every document in one process"),
        (["pack", "{cfg}", "--set", "tokenizer.path=/no/tok.json"], "tokenizer file not found"),
        (["pack", "{cfg}", "--set", "input.paths=[/no/where/*.jsonl]"], "matched no files"),
        (["pack", "{cfg}", "--set", "input.colour=red"], "unknown key input.colour"),
        (["pack", "{cfg}", "--set", "output.path={cfg}"], "is a file: name a directory"),
        (["pack", "{cfg}", "--set", "pack.algorithm=best"], "algorithm 'best' is unknown"),
        (["pack", "{cfg}", "--set", "output.shard_rows=many"], "shard_rows must be an integer"),
        (["pack", "{cfg}", "--set", "input.empty=drop"], "input.empty must be reject or keep"),
        (["pack", "{cfg}", "--set", "input.max_reject_ratio=2"], "max_reject_ratio must be within [0, 1]"),
        (["pack", "{cfg}", "--set", "tokenizer.path={cfg}"], "is not a tokenizers JSON file"),
        (["pack", "{cfg}", "--compare", "spfhp,ffd"], "pack.compare: 'ffd' needs every document in one"),
        (["rebuild", "{cfg}", "--compare", "all,bfd"], "pack.compare: 'all' stands alone"),
        (
            ["pack", "{cfg}", "--set", "output.pad_id=512"],
            "output.pad_id 512 is not a token of the tokenizer",
        ),
        (["pack", "{cfg}", "--set", "output.pad_id=2147483648"], "output.pad_id must be in 0..2^31-1"),
        (["pack", "{cfg}", "--set", "input.max_lost_files=-1"], "input.max_lost_files must be >= 0"),
        (["rebuild", "{cfg}", "--wait", "-1"], "--wait must be >= 0"),
        (["pack", "{cfg}", "--set", "output.path={corpus}/out"], "lies inside"),
        (
            ["pack", "{cfg}", "--set", "pack.pad_multiple=8", "--set", "output.format=mds"],
            "output.format mds cannot keep items aligned to pack.pad_multiple",
        ),
    ],
)
def test_pack_mistakes_are_one_line_and_exit_2(
    args: list[str], message: str, tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=2)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main([a.format(cfg=cfg, corpus=corpus) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raypack: error: ") and message in err and "\n" not in err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="/proc and /sys are Linux's")
def test_an_output_that_cannot_be_written_is_one_line_and_exit_2_before_any_work(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found before the workers load the tokenizer, as other config mistakes are: it was a storage
    error (exit 1) from the first write task, after the tokenize stage."""
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=2)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    cases = {
        "/proc/raypack-out": "cannot be written",
        "/sys/kernel/raypack-out": "cannot be written",
        f"{cfg}/out": "is a file, so no directory can be made under it",
        str(tmp_path / "dangling"): "is a symbolic link to nothing",
        f"{tmp_path / 'dangling'}/out": "is a symbolic link to nothing",
    }
    for out, message in cases.items():
        assert main(["pack", str(cfg), "--set", f"output.path={out}"]) == 2, out
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"raypack: error: output {out}") and message in err and "\n" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_dashboard_address_as_ray_address_is_one_line(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell of a `ray job submit` user holds RAY_ADDRESS=http://head:8265; `raypack pack` there
    says what address it takes (it was Ray's ValueError with a traceback, exit 1)."""
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=2)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:8265")
    assert main(["pack", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("raypack: error: RAY_ADDRESS=http://127.0.0.1:8265 is a dashboard's address")
    assert "\n" not in err and "host:6379" in err


def test_relative_paths_are_the_drivers_whatever_the_workers_directory(
    tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job's relative paths (inputs, tokenizer, output) are made absolute where the command runs
    and recorded so: a Ray node's task, whose working directory is its own, wrote data/ and index/
    under that directory while the driver wrote the manifest here."""
    import shutil

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=5)
    shutil.copy(tokenizer_path, tmp_path / "tok.json")
    cfg = job_config(tmp_path, "corpus/*", "tok.json", output={"path": "out"})
    monkeypatch.chdir(tmp_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    recorded = json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]
    assert recorded["output"]["path"] == str(tmp_path / "out")
    assert recorded["tokenizer"]["path"] == str(tmp_path / "tok.json")
    assert recorded["input"]["paths"] == [f"{corpus}/*"]
    monkeypatch.chdir(tmp_path.parent)  # elsewhere: verify takes the recorded, absolute paths
    assert main(["verify", str(tmp_path / "out")]) == 0


@pytest.mark.parametrize("algorithm", ["bfd", "greedy"])
def test_sharded_mode_packs_each_group_alone(tmp_path: Path, tokenizer_path: Path, algorithm: str) -> None:
    corpus = make_corpus(tmp_path, shards=4, docs_per_shard=40, seed=13)
    pack = {"mode": "sharded", "algorithm": algorithm, "shards_per_group": 2}
    cfg = load_config(str(job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack=pack)))
    result = run_job(cfg, log=quiet)
    names = sorted(p.name for p in (tmp_path / "out" / "data").iterdir())
    assert {n.split("-")[1] for n in names} == {"00000", "00001"}  # two groups, numbered on their own
    report = verify(str(tmp_path / "out"), cfg, sample=10)
    assert report.ok, report.problems
    # No pack mixes documents of different groups; global packing is at least as tight.
    group_of = {f"part-{s:03d}": s // 2 for s in range(4)}
    for row in read_packs(tmp_path / "out").to_pylist():
        assert len({group_of[d.split(".")[0]] for d in row["doc_ids"]}) == 1
    assert result.global_efficiency >= result.metrics.efficiency
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["mode"] == "sharded" and metrics["global_bfd_efficiency"] == result.global_efficiency


def test_the_driver_leaves_the_tokenizers_parse_to_the_workers_whose_load_checks_it_first(
    tmp_path: Path, tokenizer_path: Path, driver_parses: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """On the local executor the driver reads the ids it needs from tokenizer.json and never parses
    it: the workers' load does (0.8 s of a 131k BPE's, holding the GIL, was the driver's too), and
    the self-check's reference side runs there. The packs are still tokenizers' tokens, after the
    check. A file tokenizers refuses fails with the one line the driver's parse gave, before the
    output is cleared: `--overwrite` leaves the dataset in place."""
    from raypack.config import TokenizerConfig
    from raypack.text.backends import probes
    from raypack.text.files import read_tokenizer
    from tests.conftest import packed_documents

    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=15, seed=8)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    assert main(["pack", str(cfg), "--quiet"]) == 0
    assert driver_parses == [] and packed_documents(tmp_path / "out") == independent_tokens(
        corpus, tokenizer_path
    )
    backend = json.loads((tmp_path / "out" / "manifest.json").read_text())["tokenizer"]["backend"]
    # The probes of the driver's parse, every added token's among them, from the JSON's read.
    eager = probes(read_tokenizer(TokenizerConfig(path=str(tokenizer_path))).added_tokens())
    assert backend["chosen"].startswith("fastokens") and backend["self_check"]["probes"] == len(eager)
    before = {p.name: p.read_bytes() for p in (tmp_path / "out" / "data").iterdir()}

    spec = json.loads(tokenizer_path.read_text())
    spec["pre_tokenizer"] = {"type": "NoSuchPreTokenizer"}
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(spec))
    capsys.readouterr()
    code = main(["pack", str(cfg), "--overwrite", "--quiet", "--set", f"tokenizer.path={broken}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"{broken} is not a tokenizers JSON file" in err[0], err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / "data").iterdir()} == before
    assert (tmp_path / "out" / "manifest.json").exists()


def test_sharded_mode_refuses_histogram_only_packers(tmp_path: Path, tokenizer_path: Path) -> None:
    corpus = make_corpus(tmp_path, shards=1, docs_per_shard=2)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path, pack={"mode": "sharded", "algorithm": "nnlshp"})
    with pytest.raises(ConfigError, match=r"pack\.mode sharded packs each shard group alone"):
        load_config(str(cfg))


def test_commit_check_refuses_files_that_add_up_but_are_not_the_plan() -> None:
    """Totals are not enough: two blocks of one file (the second overwriting the first) or a file
    under the wrong name still add up to the planned packs, items and tokens."""
    from raypack.pipeline.write.stage import check_commit

    def written(path: str, rows: int, items: int, tokens: int) -> dict[str, object]:
        fill = np.zeros(101, dtype=np.int64)
        fill[100] = rows
        return {"path": path, "rows": rows, "items": items, "tokens": tokens, "fill_percent": fill}

    planned = {"data/part-00000.parquet": 50, "data/part-00001.parquet": 20}
    good = [
        written("data/part-00000.parquet", 50, 90, 25_600),
        written("data/part-00001.parquet", 20, 30, 10_240),
    ]
    check_commit(good, planned, 120, 35_840)
    split = [
        good[0],
        written("data/part-00001.parquet", 10, 15, 5_120),
        written("data/part-00001.parquet", 10, 15, 5_120),
    ]
    with pytest.raises(RuntimeError, match=r"part-00001\.parquet was written by 2 tasks"):
        check_commit(split, planned, 120, 35_840)
    renamed = [good[0], written("data/part-00002.parquet", 20, 30, 10_240)]
    with pytest.raises(RuntimeError, match=r"not the planned ones \(missing \['data/part-00001\.parquet'\]"):
        check_commit(renamed, planned, 120, 35_840)
    short = [
        written("data/part-00000.parquet", 40, 80, 20_000),
        written("data/part-00001.parquet", 30, 40, 15_840),
    ]
    with pytest.raises(RuntimeError, match=r"wrong row counts \['data/part-00000\.parquet'"):
        check_commit(short, planned, 120, 35_840)
    with pytest.raises(
        RuntimeError, match=r"written \(items, tokens\) = \(120, 35840\), planned \(121, 35840\)"
    ):
        check_commit(good, planned, 121, 35_840)


def test_verify_takes_the_overrides_the_dataset_was_packed_with(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`raypack pack job.yaml --set ...` verifies against its own YAML with the same --set. Without
    them, or with settings or a tokenizer unlike the dataset's, verify names each key that differs
    (not a "tokens differ" line a sampled document) and ends with the count; --set without --config
    applies to the config the manifest records."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=5)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    out = str(tmp_path / "out")
    assert main(["pack", str(cfg), "--set", "tokenizer.add_eos=false"]) == 0
    assert main(["verify", out, "--config", str(cfg), "--set", "tokenizer.add_eos=false"]) == 0
    assert "OK:" in capsys.readouterr().out
    assert main(["verify", out, "--config", str(cfg)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        f"FAIL: {out}: tokenizer.add_eos: the dataset was packed with False, the config says True",
        f"FAIL: 1 problem found in {out}",
    ]
    other = train_tokenizer(tmp_path / "other" / "tokenizer.json", 400, 9)
    changed = {
        "pack.seq_len": "1024",
        "pack.algorithm": "lpfhp",
        "tokenizer.path": str(other),
        "input.text_field": "body",
        "output.shard_rows": "7",
        "input.unit_bytes": "4096",  # (the work units: the same bytes)
        "tokenizer.backend": "tokenizers",  # (the same ids)
    }
    sets = [arg for key, value in changed.items() for arg in ("--set", f"{key}={value}")]
    assert main(["verify", out, "--config", str(cfg), "--set", "tokenizer.add_eos=false", *sets]) == 1
    lines = capsys.readouterr().out.splitlines()
    named = [line.split(": ")[2] for line in lines[:-1]]
    expected = ["input.text_field", "pack.algorithm", "pack.seq_len", "output.shard_rows", "tokenizer.path"]
    assert named == expected
    assert "is another tokenizer than the dataset's" in lines[4] and lines[-1].startswith("FAIL: 5 problems")
    assert main(["verify", out, "--set", "tokenizer.add_eos=true"]) == 1
    assert (
        "tokenizer.add_eos: the dataset was packed with False, the config says True"
        in capsys.readouterr().out
    )


def test_verify_without_a_config_re_tokenizes_with_the_settings_the_manifest_records(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`raypack verify OUT` after `raypack pack job.yaml --set ...`: the sample is re-tokenized with
    the settings the dataset was packed with (no --config, no --set again); inputs moved since are a
    warning, and --set says where they are; another tokenizer is named."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=6)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    out = str(tmp_path / "out")
    assert main(["pack", str(cfg), "--set", "tokenizer.add_bos=true", "--set", "pack.seq_len=256"]) == 0
    capsys.readouterr()
    assert main(["verify", out]) == 0
    assert "20 documents re-tokenized and equal" in capsys.readouterr().out
    moved = tmp_path / "moved"
    corpus.rename(moved)
    assert main(["verify", out]) == 0
    said = capsys.readouterr().out
    assert "warning: no document re-tokenized: as the manifest records the job, input.paths" in said
    assert main(["verify", out, "--set", f'input.paths=["{moved}/*"]']) == 0
    assert "20 documents re-tokenized and equal" in capsys.readouterr().out
    saved = tmp_path / "tokenizer.json"
    train_tokenizer(saved, 400, 9)
    assert (
        main(["verify", out, "--set", f'input.paths=["{moved}/*"]', "--set", f"tokenizer.path={saved}"]) == 1
    )
    assert "is another tokenizer than the dataset's" in capsys.readouterr().out


def test_a_reader_that_leaves_early_ends_the_command_quietly(tmp_path: Path) -> None:
    """`raypack plan ... --json | head -1`: the first line, then no error (it said "storage error:
    [Errno 32] Broken pipe" and exited 1)."""
    import os
    import subprocess

    command = [sys.executable, "-m", "raypack.cli", "plan", "--sample", "200000", "--seq-len", "2048", "8192"]
    command += ["--algorithm", "all", "--json"]
    # A reader gone before the first write: every write fails, whatever the timing (with `head -1`
    # the few KB of output may all fit in the pipe before head leaves, and the command ends 0).
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(command, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert done.stderr == "" and done.returncode == 141  # as a tool SIGPIPE ends
    # And as a user runs it: the first line, nothing on stderr, 0 or SIGPIPE's 141 as the race goes.
    shell = " ".join(command) + " | head -1"
    piped = ["bash", "-o", "pipefail", "-c", shell]
    done = subprocess.run(piped, capture_output=True, text=True, timeout=120)
    assert json.loads(done.stdout)["algorithm"] == "bfd"
    assert done.stderr == "" and done.returncode in (0, 141), (done.returncode, done.stderr)


@pytest.mark.slow  # 10 s of starting Ray
def test_starting_local_ray_says_nothing_of_token_authentication(tmp_path: Path) -> None:
    """A command that starts its own local Ray (no RAY_ADDRESS) keeps Ray's token authentication but
    not the WARNING Ray prints about it on every start."""
    import os
    import subprocess
    import sys

    code = "from raypack.engine import ensure_ray; import ray; ensure_ray(); ray.shutdown()"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Token authentication" not in done.stderr, done.stderr
