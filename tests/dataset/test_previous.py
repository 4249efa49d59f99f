"""The dataset a `pack --overwrite` replaces is kept until the new one commits (raypack.dataset.previous):
a job that fails puts it back, and one killed at any point leaves it for the next job to put back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from raypack.cli import main
from raypack.dataset import previous
from raypack.dataset.output import OUTPUT_PARTS
from raypack.verifier import verify
from tests.conftest import job_config, make_corpus, write_jsonl


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def a_dataset(out: Path) -> dict[str, bytes]:
    """What a dataset's parts look like to previous (which moves them, whatever they hold)."""
    (out / "data").mkdir(parents=True)
    (out / "data" / "part-00000.parquet").write_bytes(b"old packs")
    (out / "rejects").mkdir()
    (out / "rejects" / "shard-000000.parquet").write_bytes(b"old rejects")
    (out / "metrics.json").write_text("{}")
    (out / "manifest.json").write_text('{"old": true}')
    (out / "notes.txt").write_text("the user's")  # not a part: never moved, never deleted
    return files_of(out)


def the_new_job_writes(out: Path) -> None:
    (out / "data").mkdir()
    (out / "data" / "part-00000.parquet").write_bytes(b"new, half")
    (out / "_staging").mkdir()
    (out / "_staging" / "x").write_bytes(b"tokens")


def test_a_failed_job_gets_the_old_dataset_back_and_its_rejects_beside_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = a_dataset(out)
    assert previous.set_aside(str(out), OUTPUT_PARTS)
    assert not (out / "manifest.json").exists() and not (out / "data").exists()
    assert (out / "notes.txt").exists() and previous.held(str(out))
    the_new_job_writes(out)
    (out / "rejects").mkdir()
    (out / "rejects" / "shard-000000.parquet").write_bytes(b"new rejects")
    assert previous.restore(str(out), OUTPUT_PARTS)
    after = files_of(out)
    assert after.pop("rejects.failed/shard-000000.parquet") == b"new rejects"
    assert after == before and not (out / previous.PREVIOUS).exists()


def test_a_job_killed_after_setting_aside_leaves_it_for_the_next_to_put_back(tmp_path: Path) -> None:
    out = tmp_path / "out"
    before = a_dataset(out)
    previous.set_aside(str(out), OUTPUT_PARTS)
    the_new_job_writes(out)  # then SIGKILL: nothing ran its clean-up
    note = previous.recover(str(out), OUTPUT_PARTS)
    assert note is not None and "put back the dataset" in note
    assert files_of(out) == before


def test_a_job_killed_while_setting_aside_loses_none_of_the_parts_still_in_place(tmp_path: Path) -> None:
    """Killed after the manifest moved, before the data did: the data in place is the old dataset's,
    not a new job's (the set-aside was never whole), and stays."""
    out = tmp_path / "out"
    before = a_dataset(out)
    (out / previous.PREVIOUS).mkdir()
    (out / "manifest.json").rename(out / previous.PREVIOUS / "manifest.json")
    assert previous.recover(str(out), OUTPUT_PARTS) is not None
    assert files_of(out) == before


def test_a_job_killed_after_its_commit_keeps_the_new_dataset(tmp_path: Path) -> None:
    out = tmp_path / "out"
    a_dataset(out)
    previous.set_aside(str(out), OUTPUT_PARTS)
    the_new_job_writes(out)
    (out / "manifest.json").write_text('{"new": true}')  # committed, then killed before the discard
    committed = {k: v for k, v in files_of(out).items() if not k.startswith(previous.PREVIOUS)}
    assert previous.recover(str(out), OUTPUT_PARTS) is None
    assert previous.restore(str(out), OUTPUT_PARTS) is False  # (a failure after the commit: the same)
    assert files_of(out) == committed


def test_pack_overwrite_that_fails_leaves_the_dataset_it_was_to_replace(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the command: a dataset packed, then an `--overwrite` stopped after the output was
    cleared (by its rejects, after the tokenize stage) leaves it whole, byte for byte, and says where
    its own rejects went; the next `--overwrite` that succeeds replaces it and leaves nothing aside."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=4)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    out = tmp_path / "out"
    assert main(["pack", str(cfg), "--quiet"]) == 0
    before = files_of(out)

    write_jsonl(corpus / "bad.jsonl", [b"{oops"] * 30)
    for _ in range(2):  # and again: the first failure's rejects.failed/ in the second's way broke it once
        capsys.readouterr()
        code = main(["pack", str(cfg), "--overwrite", "--quiet", "--set", "input.max_reject_ratio=0.01"])
        err = capsys.readouterr().err
        assert code != 0 and f"See {out / 'rejects.failed'} (the dataset there before is kept)" in err, err
        after = files_of(out)
        failed = {k: v for k, v in after.items() if k.startswith("rejects.failed/")}
        assert failed and {k: v for k, v in after.items() if k not in failed} == before
        assert verify(str(out)).ok and not (out / previous.PREVIOUS).exists()

    (corpus / "bad.jsonl").unlink()
    assert main(["pack", str(cfg), "--overwrite", "--quiet", "--set", "pack.seq_len=256"]) == 0
    names = set(files_of(out))
    assert not any(n.startswith(("rejects.failed", previous.PREVIOUS)) for n in names), names
    assert json.loads((out / "manifest.json").read_text())["config"]["pack"]["seq_len"] == 256
    assert verify(str(out)).ok


def test_the_next_job_puts_back_what_a_killed_overwrite_set_aside(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=5)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    out = tmp_path / "out"
    assert main(["pack", str(cfg), "--quiet"]) == 0
    before = files_of(out)
    previous.set_aside(str(out), OUTPUT_PARTS)  # as a killed `--overwrite` left it
    the_new_job_writes(out)
    # Until then, the commands that find no dataset there say where it is (else it looks lost).
    aside = f"the dataset it held is set aside in {out / previous.PREVIOUS} by a stopped `--overwrite`"
    assert any(aside in p for p in verify(str(out)).problems)
    capsys.readouterr()
    for command in (["verify", str(out)], ["report", str(out)], ["convert", str(out), "--format", "olmo"]):
        assert main([*command, "--out", str(tmp_path / "x")] if command[0] == "convert" else command) != 0
        said = capsys.readouterr()
        assert aside in said.out + said.err, (command, said)
    assert main(["pack", str(cfg)]) == 2  # without --overwrite: the dataset is back, and refused
    said = capsys.readouterr()
    assert "put back the dataset" in said.out + said.err and "already holds a dataset" in said.err
    assert files_of(out) == before and verify(str(out)).ok


def test_convert_overwrite_that_fails_leaves_the_dataset_it_was_to_replace(
    tmp_path: Path, tokenizer_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`convert --overwrite` clears its output as `pack` does, and so gets it back the same way: here
    a source whose data file was damaged in place (same size: its manifest's sizes still match)."""
    corpus = make_corpus(tmp_path, shards=2, docs_per_shard=10, seed=6)
    cfg = job_config(tmp_path, f"{corpus}/*", tokenizer_path)
    source, out = tmp_path / "out", tmp_path / "olmo"
    assert main(["pack", str(cfg), "--quiet"]) == 0
    assert main(["convert", str(source), "--format", "olmo", "--out", str(out)]) == 0
    before = files_of(out)
    data = sorted((source / "data").rglob("*.parquet"))[0]
    data.write_bytes(b"\0" * data.stat().st_size)
    capsys.readouterr()
    assert main(["convert", str(source), "--format", "olmo", "--out", str(out), "--overwrite"]) == 1
    err = capsys.readouterr().err
    assert "holds the dataset it held before this conversion" in err
    assert f"raypack: job failed: {data} does not read as the parquet file its manifest lists" in err, err
    assert "Traceback" not in err
    assert files_of(out) == before and verify(str(out)).ok
    # An olmo file damaged mid-way, its size kept: its .npy still parses, into ids of -1 that the
    # new dataset's own checksums then vouched for. Its manifest's sha256 refuses it first.
    npy = sorted((out / "data").rglob("*.npy"))[0]
    damaged = bytearray(npy.read_bytes())
    middle = len(damaged) // 2
    damaged[middle : middle + 1000] = b"\xff" * 1000
    npy.write_bytes(bytes(damaged))
    assert len(damaged) == npy.stat().st_size
    back = tmp_path / "back"
    assert main(["convert", str(out), "--format", "parquet", "--out", str(back)]) == 1
    err = capsys.readouterr().err
    assert f"{npy} does not read as the olmo file its manifest lists" in err and "sha256" in err, err
    assert not (back / "manifest.json").exists()
